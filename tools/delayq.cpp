// delayq: look at and operate a job queue from a shell, whatever holds it.
//
//   delayq URL COMMAND [ARGS] [--json] [--timeout D]
//
// URL names the queue: redis://[USER:PASSWORD@]HOST[:PORT]/NAME (one server), sqlite:PATH (the
// file must exist), postgresql://...?queue=NAME (any libpq URI; `queue` is taken out of it, and
// `schema` too when given, default delayq). COMMAND is one of
//   stats                          waiting, due now, leased, dead, lag
//   get ID                         one job: its state, time, attempts, payload, last error
//   dead [--max N] [--after ID]    a page of the dead letters, oldest first (N: 100)
//   list [--state S] [--max N] [--after ID]
//                                  a page of the jobs in state S: waiting (the default) by due
//                                  time, leased by lease end, or dead (as dead)
//   requeue ID [--in D]            a dead letter back as waiting, due D from now (0)
//   purge --older-than D           removes the dead letters that died more than D ago
//   pause | resume                 stops and restarts the takes of every process
//   put ID PAYLOAD [--in D]        queues a job due D from now (0)
//   put ID PAYLOAD --every D       queues a series: a run every D, the first D from now
//   put ID PAYLOAD --cron EXPR     queues a series: a run each time EXPR (5 fields, UTC) matches
//   cancel ID                      removes a waiting or leased job
// A duration D is a number with a unit: ms, s, m, h, d ("30s", "15m"). Output is for people;
// --json prints one JSON object (dead and list: an array) for scripts. --timeout bounds each call
// to the store (5s). Exit status: 0 done; 1 the store said no (no such job, not dead, already
// queued); 2 a bad command line or URL; 3 the store failed or could not be reached (one line on
// stderr).
//
// The command is built with each backend whose library was found; a URL of another backend says
// so (status 2).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <ctime>
#include <delayq/job.hpp>
#include <delayq/job_queue.hpp>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#ifdef DELAYQ_COMMAND_REDIS
#include <delayq/redis/delay_queue.hpp>
#endif
#ifdef DELAYQ_COMMAND_SQLITE
#include <delayq/sqlite/delay_queue.hpp>
#endif
#ifdef DELAYQ_COMMAND_POSTGRES
#include <delayq/postgres/delay_queue.hpp>
#endif

namespace {

using std::chrono::milliseconds;

constexpr int done = 0, said_no = 1, bad_usage = 2, store_failed = 3;

/// A bad command line or URL: status 2.
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const char* const usage_text =
    "usage: delayq URL COMMAND [ARGS] [--json] [--timeout D]\n"
    "  URL: redis://[USER:PASSWORD@]HOST[:PORT]/NAME | sqlite:PATH |\n"
    "       postgresql://...?queue=NAME[&schema=S]\n"
    "  COMMAND: stats | get ID | dead [--max N] [--after ID] |\n"
    "           list [--state waiting|leased|dead] [--max N] [--after ID] |\n"
    "           requeue ID [--in D] | purge --older-than D | pause | resume | cancel ID |\n"
    "           put ID PAYLOAD [--in D | --every D | --cron 'M H DOM MON DOW']\n"
    "  D: a duration such as 500ms, 30s, 15m, 2h, 1d\n";

milliseconds parse_duration(std::string_view s) {
    long long n = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    const std::string_view unit(end, static_cast<std::size_t>(s.data() + s.size() - end));
    static const std::map<std::string_view, long long> units{
        {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
    const auto u = units.find(unit);
    if (ec != std::errc() || n < 0 || u == units.end() || n > LLONG_MAX / u->second)
        throw usage_error("not a duration: '" + std::string(s) +
                          "' (a number and ms, s, m, h or d: 30s)");
    return milliseconds(n * u->second);
}

/// The command line past the URL: the command, its words, and its options.
struct command_line {
    std::string command;
    std::vector<std::string> words;
    std::map<std::string, std::string> options;  // --in, --max, ... -> value
    bool json = false;
    milliseconds timeout{5000};

    std::optional<std::string> option(const std::string& name) const {
        const auto it = options.find(name);
        if (it == options.end()) return std::nullopt;
        return it->second;
    }
    milliseconds duration(const std::string& name) const {
        const auto v = option(name);
        return v ? parse_duration(*v) : milliseconds::zero();
    }
    void expect(std::size_t words_needed, std::initializer_list<std::string_view> allowed) const {
        if (words.size() != words_needed)
            throw usage_error(command + " takes " + std::to_string(words_needed) +
                              (words_needed == 1 ? " argument" : " arguments"));
        for (const auto& option : options)
            if (std::find(allowed.begin(), allowed.end(), std::string_view(option.first)) ==
                allowed.end())
                throw usage_error(command + " has no option " + option.first);
    }
};

command_line parse_command(int argc, char** argv) {
    command_line c;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--json") {
            c.json = true;
        } else if (a.rfind("--", 0) == 0 && a.size() > 2) {
            if (i + 1 >= argc) throw usage_error(a + " needs a value");
            c.options[a] = argv[++i];
        } else if (c.command.empty()) {
            c.command = a;
        } else {
            c.words.push_back(a);
        }
    }
    if (c.command.empty()) throw usage_error("no command");
    if (const auto t = c.option("--timeout")) {
        c.timeout = parse_duration(*t);
        if (c.timeout <= milliseconds::zero()) throw usage_error("--timeout must be > 0");
        c.options.erase("--timeout");
    }
    return c;
}

// ---- output ------------------------------------------------------------------------------------

std::string iso_time(std::chrono::system_clock::time_point t) {
    const auto ms = std::chrono::time_point_cast<milliseconds>(t).time_since_epoch().count();
    const std::time_t secs = static_cast<std::time_t>(ms / 1000 - (ms % 1000 < 0 ? 1 : 0));
    std::tm tm{};
    ::gmtime_r(&secs, &tm);
    char buf[96];  // room for any int in each field, so that no output is cut
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(((ms % 1000) + 1000) % 1000));
    return buf;
}

/// A JSON string: each byte outside printable ASCII as \u00XX (a payload is bytes, not text).
std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += ch;
        } else if (c < 0x20 || c >= 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += ch;
        }
    }
    return out + "\"";
}

/// For a terminal: printable ASCII as it is, other bytes as \xXX.
std::string printable(std::string_view s) {
    std::string out;
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += ch;
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

const char* state_name(delayq::job_state s) {
    switch (s) {
        case delayq::job_state::waiting:
            return "waiting";
        case delayq::job_state::leased:
            return "leased";
        case delayq::job_state::dead:
            return "dead";
    }
    return "?";
}

const char* time_name(delayq::job_state s) {
    switch (s) {
        case delayq::job_state::waiting:
            return "due";
        case delayq::job_state::leased:
            return "lease ends";
        case delayq::job_state::dead:
            return "died";
    }
    return "time";
}

/// The state that `list --state NAME` names (waiting when none is given).
delayq::job_state state_named(const std::optional<std::string>& name) {
    if (!name || *name == "waiting") return delayq::job_state::waiting;
    if (*name == "leased") return delayq::job_state::leased;
    if (*name == "dead") return delayq::job_state::dead;
    throw usage_error("--state must be waiting, leased or dead");
}

std::string json_job(const delayq::job_info& j) {
    return "{\"id\":" + json_string(j.id) + ",\"state\":\"" + state_name(j.state) +
           "\",\"time\":\"" + iso_time(j.time) + "\",\"attempts\":" + std::to_string(j.attempts) +
           ",\"payload\":" + json_string(j.payload) +
           ",\"last_error\":" + json_string(j.last_error) + "}";
}

void print_job(const delayq::job_info& j) {
    std::printf("id          %s\nstate       %s\n%-11s %s\nattempts    %u\npayload     %s\n",
                printable(j.id).c_str(), state_name(j.state), time_name(j.state),
                iso_time(j.time).c_str(), j.attempts, printable(j.payload).c_str());
    if (!j.last_error.empty()) std::printf("last error  %s\n", printable(j.last_error).c_str());
}

/// "yes"/"no" answers: a line for people, {"ok":true} for scripts, status 0 or 1.
int answer(const command_line& c, bool ok, const std::string& yes, const std::string& no) {
    if (c.json)
        std::printf("{\"ok\":%s}\n", ok ? "true" : "false");
    else
        std::printf("%s\n", ok ? yes.c_str() : no.c_str());
    return ok ? done : said_no;
}

// ---- the commands, the same for every backend --------------------------------------------------

template <delayq::job_queue Q>
int run(Q& q, const command_line& c) {
    const std::string& cmd = c.command;
    if (cmd == "stats") {
        c.expect(0, {});
        const delayq::queue_stats s = q.stats();
        if (c.json)
            std::printf(
                "{\"waiting\":%zu,\"due_now\":%zu,\"leased\":%zu,\"dead\":%zu,\"lag_ms\":%lld}\n",
                s.waiting, s.due_now, s.leased, s.dead, static_cast<long long>(s.lag.count()));
        else
            std::printf("waiting  %zu\ndue now  %zu\nleased   %zu\ndead     %zu\nlag      %.3f s\n",
                        s.waiting, s.due_now, s.leased, s.dead,
                        static_cast<double>(s.lag.count()) / 1000.0);
        return done;
    }
    if (cmd == "get") {
        c.expect(1, {});
        const auto j = q.get(c.words[0]);
        if (!j) {
            if (c.json) std::printf("null\n");
            std::fprintf(stderr, "delayq: no job %s\n", printable(c.words[0]).c_str());
            return said_no;
        }
        if (c.json)
            std::printf("%s\n", json_job(*j).c_str());
        else
            print_job(*j);
        return done;
    }
    if (cmd == "dead" || cmd == "list") {
        if (cmd == "dead")
            c.expect(0, {"--max", "--after"});
        else
            c.expect(0, {"--max", "--after", "--state"});
        const delayq::job_state state =
            cmd == "dead" ? delayq::job_state::dead : state_named(c.option("--state"));
        std::size_t max = 100;
        if (const auto m = c.option("--max")) {
            const auto [end, ec] = std::from_chars(m->data(), m->data() + m->size(), max);
            if (ec != std::errc() || end != m->data() + m->size() || max == 0)
                throw usage_error("--max must be a number > 0");
        }
        const auto page = q.jobs(state, max, c.option("--after").value_or(""));
        if (c.json) {
            std::string out = "[";
            for (const auto& j : page) out += (out.size() > 1 ? "," : "") + json_job(j);
            std::printf("%s]\n", out.c_str());
        } else {
            // The time a line starts with is the state's: due, lease end, or died.
            for (const auto& j : page)
                std::printf("%s  %s  attempts %u  %s\n", iso_time(j.time).c_str(),
                            printable(j.id).c_str(), j.attempts, printable(j.last_error).c_str());
            if (page.size() == max)
                std::printf("(more: --after %s)\n", printable(page.back().id).c_str());
        }
        return done;
    }
    if (cmd == "requeue") {
        c.expect(1, {"--in"});
        return answer(c, q.requeue_dead(c.words[0], c.duration("--in")), "requeued",
                      "not a dead letter: " + printable(c.words[0]));
    }
    if (cmd == "purge") {
        c.expect(0, {"--older-than"});
        if (!c.option("--older-than")) throw usage_error("purge needs --older-than D");
        const std::size_t n = q.purge_dead(c.duration("--older-than"));
        if (c.json)
            std::printf("{\"purged\":%zu}\n", n);
        else
            std::printf("purged %zu dead letters\n", n);
        return done;
    }
    if (cmd == "pause" || cmd == "resume") {
        c.expect(0, {});
        if (cmd == "pause")
            q.pause();
        else
            q.resume();
        return answer(c, true, cmd == "pause" ? "paused" : "resumed", "");
    }
    if (cmd == "put") {
        c.expect(2, {"--in", "--every", "--cron"});
        if (c.options.size() > 1) throw usage_error("put takes one of --in, --every and --cron");
        bool ok = false;
        if (const auto e = c.option("--every")) {
            ok = q.put_every(c.words[0], c.words[1], parse_duration(*e));
        } else if (const auto cron = c.option("--cron")) {
            ok = q.put_cron(c.words[0], c.words[1], *cron);
        } else {
            ok = q.put_after(c.words[0], c.words[1], c.duration("--in"));
        }
        return answer(c, ok, "queued", "already queued: " + printable(c.words[0]));
    }
    if (cmd == "cancel") {
        c.expect(1, {});
        return answer(c, q.cancel(c.words[0]), "cancelled", "not queued: " + printable(c.words[0]));
    }
    throw usage_error("no command " + cmd);
}

// ---- URLs --------------------------------------------------------------------------------------

/// `query`'s parameter `key` taken out of `url` (with its `&` or the `?` left bare); "" if none.
std::string take_parameter(std::string& url, std::string_view key) {
    const auto q = url.find('?');
    if (q == std::string::npos) return "";
    std::size_t at = q + 1;
    while (at < url.size()) {
        std::size_t end = url.find('&', at);
        if (end == std::string::npos) end = url.size();
        const std::string_view p(url.data() + at, end - at);
        if (p.substr(0, key.size()) == key && p.size() > key.size() && p[key.size()] == '=') {
            std::string value(p.substr(key.size() + 1));
            url.erase(at, end - at + (end < url.size() ? 1 : 0));
            if (url.back() == '&' || url.back() == '?') url.pop_back();
            return value;
        }
        at = end + 1;
    }
    return "";
}

int open_and_run(const std::string& url, const command_line& c) {
    if (url.rfind("sqlite:", 0) == 0) {
#ifdef DELAYQ_COMMAND_SQLITE
        delayq::sqlite::options o;
        o.path = url.substr(7);
        if (o.path.rfind("//", 0) == 0) o.path.erase(0, 2);  // sqlite://PATH reads the same
        if (o.path.empty()) throw usage_error("sqlite: needs a path: sqlite:/var/lib/app/jobs.db");
        // An operator's typo must not create a queue file.
        if (!std::filesystem::exists(o.path)) throw std::runtime_error(o.path + ": no such file");
        o.busy_timeout = c.timeout;
        // A queue file of its own, or a queue inside the application's database (its tables
        // named delayq_*): the first is tried first, and refuses a file with other tables.
        std::optional<delayq::sqlite::delay_queue> q;
        try {
            q.emplace(o);
        } catch (const delayq::sqlite::not_a_queue_error&) {
            o.allow_other_tables = true;
            q.emplace(o);
        }
        return run(*q, c);
#else
        throw usage_error("this delayq was built without SQLite");
#endif
    }
    if (url.rfind("redis://", 0) == 0) {
#ifdef DELAYQ_COMMAND_REDIS
        delayq::redis::options o;
        std::string rest = url.substr(8);
        const auto slash = rest.find('/');
        if (slash == std::string::npos || slash + 1 == rest.size())
            throw usage_error("a Redis URL names the queue: redis://HOST:PORT/NAME");
        o.name = rest.substr(slash + 1);
        std::string authority = rest.substr(0, slash);
        if (const auto at = authority.rfind('@'); at != std::string::npos) {
            const std::string who = authority.substr(0, at);
            authority.erase(0, at + 1);
            const auto colon = who.find(':');
            o.user = who.substr(0, colon);
            if (colon != std::string::npos) o.password = who.substr(colon + 1);
        }
        if (const auto colon = authority.rfind(':'); colon != std::string::npos) {
            const std::string port = authority.substr(colon + 1);
            const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), o.port);
            if (ec != std::errc() || end != port.data() + port.size() || o.port <= 0 ||
                o.port > 65535)
                throw usage_error("not a port: " + port);
            authority.erase(colon);
        }
        if (!authority.empty()) o.host = authority;
        o.io_timeout = c.timeout;
        delayq::redis::delay_queue q(o);
        return run(q, c);
#else
        throw usage_error("this delayq was built without Redis");
#endif
    }
    if (url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0) {
#ifdef DELAYQ_COMMAND_POSTGRES
        delayq::postgres::options o;
        std::string conninfo = url;
        o.name = take_parameter(conninfo, "queue");
        if (o.name.empty())
            throw usage_error("a PostgreSQL URL names the queue: postgresql://...?queue=NAME");
        if (std::string schema = take_parameter(conninfo, "schema"); !schema.empty())
            o.schema = schema;
        o.conninfo = conninfo;
        o.io_timeout = c.timeout;
        delayq::postgres::delay_queue q(o);
        return run(q, c);
#else
        throw usage_error("this delayq was built without PostgreSQL");
#endif
    }
    throw usage_error("not a queue URL: " + url +
                      " (redis://HOST:PORT/NAME, sqlite:PATH, postgresql://...?queue=NAME)");
}

/// `what` on one line (libpq's messages have several): each run of line breaks and tabs, one space.
std::string one_line(std::string_view what) {
    std::string out;
    for (const char c : what) {
        const bool space = c == '\n' || c == '\r' || c == '\t';
        if (!space)
            out += c;
        else if (!out.empty() && out.back() != ' ')
            out += ' ';
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
}

/// `url` without its password, for a message.
std::string redacted(std::string url) {
    const auto scheme = url.find("://");
    const auto at = url.find('@');
    if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
    const auto colon = url.find(':', scheme + 3);
    if (colon != std::string::npos && colon < at) url.replace(colon + 1, at - colon - 1, "***");
    return url;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fputs(usage_text, stderr);
        return bad_usage;
    }
    try {
        return open_and_run(argv[1], parse_command(argc, argv));
    } catch (const usage_error& e) {
        std::fprintf(stderr, "delayq: %s\n%s", e.what(), usage_text);
        return bad_usage;
    } catch (const std::invalid_argument& e) {  // an id or option the queue refused
        std::fprintf(stderr, "delayq: %s\n", one_line(e.what()).c_str());
        return bad_usage;
    } catch (const std::exception& e) {  // the store: unreachable, failed, not a queue
        std::fprintf(stderr, "delayq: %s: %s\n", redacted(argv[1]).c_str(),
                     one_line(e.what()).c_str());
        return store_failed;
    }
}
