// End-to-end figures of delayq::redis against a local redis-server that this program starts
// itself (no persistence, like a cache-style deployment; `--port P` uses a running server), and
// BullMQ's beside them when it is installed. (The SQLite queue beside the Redis one, and the
// reopening of a large SQLite queue: bench/sqlite/bench_sqlite.cpp.)
//
//   bench_redis [--jobs N] [--batch-jobs N] [--paced-seconds S] [--idle-seconds S] [--repeat R]
//               [--port P] [--bullmq-concurrency C] [--objects shared|per-thread|both]
//               [--only put|e2e|delayq|worker|bullmq|bullmq-batch|scripts|paced|idle|memory|
//                       sharded]
//
// 1. put-only rate: 4 producers, one shared queue object, delays far in the future;
// 2. end to end, side by side with BullMQ (bullmq/bench.mjs) against the same server, R rounds of
//    four runs, one after the other so that both see the same machine:
//    - delayq single calls: 4 producers put_after N jobs due U[0, 2 s], 4 consumers run the plain
//      loop `while (auto j = q.take(..)) q.ack(*j);` until every job is acked; in two shapes, each
//      its own run (--objects, default both): the 8 threads share one queue object, and each
//      thread has a queue object of its own (on the same queue);
//    - delayq's worker beside each: the same run with the 4 consumers replaced by delayq::worker
//      (one worker of 4 threads on the shared object; one worker of 1 thread on each consumer's
//      object), its handler counting the job, with the ratios worker / plain loop;
//    - BullMQ single calls: 4 producers awaiting each add, in two layouts, each its own run: 4
//      workers of concurrency 1, and one worker of concurrency 4 (which is faster depends on the
//      machine: the table compares with the faster, by median jobs/s); and as Node programs run
//      it, 4 producers keeping 32 adds in flight each (Promise.all windows), one worker of
//      concurrency 4, compared with in a second table;
//    - delayq batched: the same with put_many/take_many/ack_many of 100 (--batch-jobs jobs);
//    - BullMQ at its best: 4 producers calling addBulk with 100 jobs, one worker of concurrency C
//      (--bullmq-concurrency, default 100), --batch-jobs jobs;
//    each with jobs/s, redis-server CPU per job (INFO cpu, user + sys, over the run), client CPU
//    per job (this process's getrusage for delayq, the server being another process; the node
//    process's own process.cpuUsage() for BullMQ) and the client's context switches per job
//    (voluntary and involuntary: getrusage, process.resourceUsage()), the medians in a table with
//    the ratios delayq / BullMQ; then delayq's INFO commandstats per command, for the last run of
//    each mode (the worker's too). BullMQ is skipped with a message without `node` or `npm install`
//    in bullmq/;
// 3. the scripts one by one (also part of 2.): one more delayq run of each mode with SLOWLOG
//    logging every command, to split EVALSHA, one line in commandstats, by script and call shape;
// 4. lateness (take returned - due time) with producers paced at 2 000 jobs/s in all and two of
//    the four consumers busy 5 ms with every job they take (an idle consumer must get the job);
// 5. commands per second sent by one idle consumer (INFO commandstats);
// 6. bytes of Redis memory per waiting job (INFO memory, 100 000 jobs, 10-byte ids, 16-byte
//    payloads);
// 7. the sharded queue (8 shards) end to end on this one server and on a local Redis Cluster of 3
//    masters + 3 replicas that this program starts (needs ports whose port + 10000 is free).
// --only e2e runs 2. and 3. (every series, the table, commandstats, the scripts); --only delayq
// delayq's series alone, --only worker delayq's single-call series and the worker's, --only bullmq
// and --only bullmq-batch one BullMQ series each, --only scripts 3. alone. Lateness uses the system
// clock of this machine, which the local servers share. The end-to-end run itself, and the series'
// medians as printed: bench/job_queue_bench.hpp.
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <delayq/redis/delay_queue.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../job_queue_bench.hpp"
#include "redis_cluster.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using namespace delayq_bench;

namespace {

struct config {
    int jobs = 100'000;        // for the single-call runs: the 2 s delay window is a small part
    int batch_jobs = 200'000;  // for the batched runs
    int paced_seconds = 10;
    int idle_seconds = 20;
    int repeat = 3;
    int port = 0;
    int bullmq_concurrency = 100;  // the batched BullMQ worker's
    std::string objects = "both";  // delayq's single calls: shared, per-thread or both
    std::string only;
};

using delayq_test::queue_options;

long long info_number(const delayq_test::redis_server& srv, const std::string& section,
                      const std::string& field) {
    const auto v = srv.info_field(section, field);
    return v.empty() ? 0 : std::stoll(v);
}

// 4 producer threads sharing one queue object; `batch` > 1 uses put_many with that many jobs a
// call.
void put_only(int port, int jobs, int batch) {
    delayq::redis::delay_queue q(queue_options(port, "bench-put-" + std::to_string(batch)));
    const int per = jobs / 4;
    const auto start = clk::now();
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            std::vector<std::string> ids;
            std::vector<delayq::redis::delay_queue::put_request> reqs;
            for (int i = 0; i < per; ++i) {
                if (batch <= 1) {
                    q.put_after(id_of(p, i), payload16, 1h);
                    continue;
                }
                ids.push_back(id_of(p, i));
                if (static_cast<int>(ids.size()) == batch || i + 1 == per) {
                    reqs.clear();
                    for (const auto& id : ids) reqs.push_back({id, payload16, 1h});
                    q.put_many(reqs);
                    ids.clear();
                }
            }
        });
    for (auto& t : ts) t.join();
    const double s = seconds(clk::now() - start);
    std::printf("put-only (%s): %d puts in %.2f s = %.0f puts/s (4 producers)\n",
                batch <= 1 ? "put_after" : ("put_many of " + std::to_string(batch)).c_str(),
                4 * per, s, 4 * per / s);
}

// end_to_end `repeat` times, each on a fresh queue; prints every rate and the median.
template <class Make>
double repeated(const config& cfg, const run_shape& shape, const std::string& what, Make make) {
    std::vector<double> rates;
    std::string last;
    for (int i = 0; i < cfg.repeat; ++i) {
        auto q = make(i);
        lateness late;
        rates.push_back(end_to_end(*q, shape, late));
        last = late.report();
    }
    std::printf("%s: %d jobs, median %.0f jobs/s (runs: %s); last run's %s\n", what.c_str(),
                shape.jobs, median(rates), list(rates).c_str(), last.c_str());
    return median(rates);
}

// Why BullMQ cannot run here, or "" when it can (bullmq/bench.mjs needs node and the npm package).
std::string bullmq_missing() {
    const std::string dir = DELAYQ_BULLMQ_DIR;
    if (std::system("command -v node >/dev/null 2>&1") != 0) return "no `node` on PATH";
    if (::access((dir + "/node_modules/bullmq/package.json").c_str(), R_OK) != 0)
        return "not installed: run `npm install` in " + dir;
    return "";
}

// One run of bullmq/bench.mjs in `mode` (single or batch) with `workers` workers of
// `concurrency`; its figures come from the JSON line it prints (its own process.cpuUsage() and
// INFO cpu, both over the run). `version` gets BullMQ's.
std::optional<figures> bullmq_run(int port, int jobs, const std::string& mode, int workers,
                                  int concurrency, std::string& version, int window = 1) {
    const std::string cmd = "node " + std::string(DELAYQ_BULLMQ_DIR) + "/bench.mjs --port " +
                            std::to_string(port) + " --jobs " + std::to_string(jobs) + " --mode " +
                            mode + " --workers " + std::to_string(workers) + " --concurrency " +
                            std::to_string(concurrency) + " --window " + std::to_string(window);
    std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
    std::string out;
    char buf[512];
    while (p && std::fgets(buf, sizeof buf, p.get()) != nullptr) out += buf;
    const auto rate = number_after(out, "\"jobs_per_s\":");
    const auto client = number_after(out, "\"client_cpu_s\":");
    const auto server = number_after(out, "\"server_cpu_s\":");
    if (!rate || !client || !server) {
        std::printf("bullmq (%s): failed: %s\n", mode.c_str(), out.c_str());
        return std::nullopt;
    }
    if (std::getenv("BENCH_VERBOSE")) std::printf("%s", out.c_str());
    const auto v = out.find("\"bullmq\":\"");
    if (v != std::string::npos) version = out.substr(v + 10, out.find('"', v + 10) - v - 10);
    figures f;
    f.jobs_per_s = *rate;
    f.client_us = *client * 1e6 / jobs;
    f.server_us = *server * 1e6 / jobs;
    if (const auto sw = number_after(out, "\"client_switches\":")) f.switches = *sw / jobs;
    const auto late = [&](const char* key) { return number_after(out, key).value_or(-1); };
    char b[128];
    std::snprintf(b, sizeof b, "lateness p50 %.0f ms, p99 %.0f ms, max %.0f ms", late("\"p50\":"),
                  late("\"p99\":"), late("\"max\":"));
    f.lateness = b;
    return f;
}

// INFO commandstats of one run, per command: calls, calls a job, µs a call, µs a job, heaviest
// first. The commands the scripts run inside the server are counted too (their time is also
// inside EVALSHA's).
void print_commandstats(const std::string& stats, int jobs, const std::string& what) {
    struct row {
        std::string name;
        double calls, usec;
    };
    std::vector<row> rows;
    std::size_t at = 0;
    while ((at = stats.find("cmdstat_", at)) != std::string::npos) {
        const auto colon = stats.find(':', at);
        const auto end = stats.find_first_of("\r\n", colon);
        const std::string line = stats.substr(colon, end - colon);
        rows.push_back({stats.substr(at + 8, colon - at - 8),
                        number_after(line, "calls=").value_or(0),
                        number_after(line, ",usec=").value_or(0)});
        at = end;
    }
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.usec > b.usec; });
    std::printf(
        "INFO commandstats, %s (%d jobs; commands the scripts run are counted too, their time is "
        "inside EVALSHA's):\n"
        "| command | calls | calls a job | µs a call | µs a job |\n|---|---|---|---|---|\n",
        what.c_str(), jobs);
    for (const auto& r : rows)
        std::printf("| %s | %.0f | %.3f | %.2f | %.2f |\n", r.name.c_str(), r.calls, r.calls / jobs,
                    r.calls > 0 ? r.usec / r.calls : 0.0, r.usec / jobs);
}

// The median figures of the series side by side, with the ratios delayq / BullMQ: delayq's single
// calls with one shared object (ds) and with one object per thread (dp), against BullMQ's single
// calls (bs), and both batched (db, bb).
void print_table(const series& ds, const series& dp, const series& bs, const char* bs_label,
                 const series& db, const series& bb) {
    const auto cell = [](const series& s, double (series::*f)() const, const char* fmt) {
        if (s.runs.empty()) return std::string("–");
        char b[64];
        std::snprintf(b, sizeof b, fmt, (s.*f)());
        return std::string(b);
    };
    const auto ratio = [](const series& a, const series& b, double (series::*f)() const) {
        if (a.runs.empty() || b.runs.empty()) return std::string("–");
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f×", (a.*f)() / (b.*f)());
        return std::string(buf);
    };
    std::printf(
        "\nper job, medians | delayq single, one shared object | delayq single, one object per "
        "thread | BullMQ single, %s | shared / BullMQ | per thread / BullMQ | delayq batched | "
        "BullMQ batched | delayq / BullMQ\n|---|---|---|---|---|---|---|---|---|\n",
        bs_label);
    const struct {
        const char* what;
        double (series::*f)() const;
        const char* fmt;
    } rows[] = {{"redis-server CPU", &series::server_us, "%.1f µs"},
                {"client CPU", &series::client_us, "%.1f µs"},
                {"client context switches", &series::switches, "%.2f"},
                {"end-to-end jobs/s", &series::jobs_per_s, "%.0f"}};
    for (const auto& r : rows)
        std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.what,
                    cell(ds, r.f, r.fmt).c_str(), cell(dp, r.f, r.fmt).c_str(),
                    cell(bs, r.f, r.fmt).c_str(), ratio(ds, bs, r.f).c_str(),
                    ratio(dp, bs, r.f).c_str(), cell(db, r.f, r.fmt).c_str(),
                    cell(bb, r.f, r.fmt).c_str(), ratio(db, bb, r.f).c_str());
    std::printf("\n");
}

// EVALSHA's µs a call in INFO commandstats text, 0 if none.
double evalsha_per_call(const std::string& stats) {
    const auto at = stats.find("cmdstat_evalsha:");
    if (at == std::string::npos) return 0;
    return number_after(stats.substr(at), "usec_per_call=").value_or(0);
}

// EVALSHA's µs a job in INFO commandstats text of a run of `jobs` jobs, 0 if none.
double evalsha_per_job(const std::string& stats, int jobs) {
    const auto at = stats.find("cmdstat_evalsha:");
    if (at == std::string::npos) return 0;
    return number_after(stats.substr(at), ",usec=").value_or(0) / jobs;
}

// Splits the server's time in scripts by script and call shape, which INFO commandstats cannot
// (every EVALSHA is one line there): with slowlog-log-slower-than 0 the server logs every command
// with its arguments and µs, the commands a script runs just before the script itself (client
// "?:0"), so each script call's own commands are known too. A thread moves the log out every 20 ms
// (SLOWLOG GET -1 and RESET in one MULTI, so no entry is lost between them). Logging costs the
// server time inside the scripts (each command a script runs is logged while the script runs), so
// this is a run of its own, not one of the timed ones; see print() for how much it adds.
class script_tap {
  public:
    explicit script_tap(int port) : port_(port) {
        using delayq::redis::detail::script_names;
        using delayq::redis::detail::scripts;
        for (std::size_t i = 0; i < scripts.size(); ++i)
            names_[text(port, {"SCRIPT", "LOAD", std::string(scripts[i])})] = script_names[i];
        for (const char* k : {"slowlog-log-slower-than", "slowlog-max-len"}) {
            auto r = command_at(port, {"CONFIG", "GET", k});
            if (r->elements == 2) saved_.emplace_back(k, r->element[1]->str);
        }
        command_at(port, {"CONFIG", "SET", "slowlog-max-len", "1000000"});
        per_command_ = log_cost(port);
        command_at(port, {"SLOWLOG", "RESET"});
        ctx_ = redisConnect("127.0.0.1", port);
        if (ctx_ == nullptr || ctx_->err != 0)
            throw std::runtime_error("script_tap: no connection");
        command_at(port, {"CONFIG", "SET", "slowlog-log-slower-than", "0"});
        thread_ = std::thread([this] {
            while (!stop_.load()) {
                poll();
                std::this_thread::sleep_for(20ms);
            }
        });
    }
    script_tap(const script_tap&) = delete;
    script_tap& operator=(const script_tap&) = delete;
    ~script_tap() {
        finish();
        redisFree(ctx_);
    }

    // Stops logging, takes in the rest, and puts the server's settings back.
    void finish() {
        if (!thread_.joinable()) return;
        stop_ = true;
        thread_.join();
        command_at(port_, {"CONFIG", "SET", "slowlog-log-slower-than", "-1"});
        poll();
        for (const auto& [k, v] : saved_) command_at(port_, {"CONFIG", "SET", k, v});
    }

    // `timed_per_job`: EVALSHA's µs a job in a timed run of the same shape (commandstats), to
    // check the estimates against; 0 if unknown.
    void print(int jobs, const std::string& what, double timed_per_job) const {
        const double per_command = per_command_;
        std::printf(
            "scripts one by one, %s (%d jobs; one more run, every command logged: %.0f log "
            "entries, %lld lost)\n"
            "(logging the commands a script runs slows the script by %.2f µs a command, measured "
            "with a script of 200 ZRANGEs; 'est. µs a call' takes that out)\n",
            what.c_str(), jobs, entries_, lost_, per_command);
        std::printf(
            "| script: call shape | calls | calls a job | µs a call (logged) | est. µs a call | "
            "of which its commands | the rest (Lua, redis.call, setup) | est. µs a job | commands "
            "a call "
            "|\n|---|---|---|---|---|---|---|---|---|\n");
        std::vector<std::pair<std::string, const klass*>> order;
        for (const auto& [label, c] : classes_) order.emplace_back(label, &c);
        std::sort(order.begin(), order.end(),
                  [](auto& a, auto& b) { return a.second->usec > b.second->usec; });
        double total_est = 0, total_inner = 0;
        for (const auto& [label, c] : order) {
            const double n = c->calls;
            const double est = c->usec / n - per_command * c->inner_calls / n;
            std::string cmds;
            std::vector<std::pair<std::string, double>> by(c->inner.begin(), c->inner.end());
            std::sort(by.begin(), by.end(), [](auto& a, auto& b) { return a.second > b.second; });
            for (const auto& [name, k] : by) {
                char b[64];
                std::snprintf(b, sizeof b, "%s%s %.2f", cmds.empty() ? "" : ", ", name.c_str(),
                              k / n);
                cmds += b;
            }
            total_est += est * n;
            total_inner += c->inner_usec;
            std::printf("| %s | %.0f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n",
                        label.c_str(), n, n / jobs, c->usec / n, est, c->inner_usec / n,
                        est - c->inner_usec / n, est * n / jobs, cmds.c_str());
        }
        char timed[96] = "";
        if (timed_per_job > 0)
            std::snprintf(timed, sizeof timed, "; EVALSHA in the timed run's commandstats: %.2f",
                          timed_per_job);
        std::printf(
            "in all: %.2f µs of scripts a job (est.%s), of which %.2f µs in the commands they "
            "run, %.2f µs the rest\n\n",
            total_est / jobs, timed, total_inner / jobs, (total_est - total_inner) / jobs);
    }

  private:
    // The µs the log adds to a script for each command the script runs: EVALSHA of a script of
    // 200 ZRANGEs (4 arguments, like most of the queue's commands) with and without the log,
    // commandstats' µs a call, the best of 5 rounds of 10 calls each.
    static double log_cost(int port) {
        const std::string lua =
            "for i = 1, 200 do redis.call('ZRANGE', KEYS[1], 0, 0) end return 0";
        const std::string sha = text(port, {"SCRIPT", "LOAD", lua});
        const auto best = [&](const char* slower_than) {
            command_at(port, {"CONFIG", "SET", "slowlog-log-slower-than", slower_than});
            double b = 1e300;
            for (int round = 0; round < 5; ++round) {
                command_at(port, {"CONFIG", "RESETSTAT"});
                for (int i = 0; i < 10; ++i)
                    command_at(port, {"EVALSHA", sha, "1", "bench-log-cost"});
                b = std::min(b, evalsha_per_call(text(port, {"INFO", "commandstats"})));
            }
            return b;
        };
        const double off = best("-1");
        const double on = best("0");
        command_at(port, {"CONFIG", "SET", "slowlog-log-slower-than", "-1"});
        return std::max(0.0, (on - off) / 200);
    }

    struct klass {
        double calls = 0, usec = 0, inner_calls = 0, inner_usec = 0;
        std::map<std::string, double> inner;  // command -> calls
    };
    struct logged {
        std::string name;
        long long usec;
    };

    static std::string str(const redisReply* r) {
        return r->str != nullptr ? std::string(r->str, r->len) : std::to_string(r->integer);
    }

    // A call's shape: the script, and for put and consume what the call asks for.
    std::string label(const std::vector<std::string>& args, std::size_t argc) const {
        const std::string cmd = upper(args[0]);
        if (cmd == "FCALL" || cmd == "FCALL_RO") return "FCALL " + args[1];
        std::string name = "EVAL";
        if (cmd == "EVALSHA") {
            const auto it = names_.find(args[1]);
            name = it != names_.end() ? it->second : "sha " + args[1].substr(0, 8);
        }
        // EVALSHA sha numkeys KEYS... channel shard, then the script's own.
        const std::size_t base = 5 + std::strtoull(args[2].c_str(), nullptr, 10);
        const auto bucket = [](std::size_t n) {
            return n <= 1 ? std::to_string(n) : n < 100 ? std::string("2-99") : std::string("100+");
        };
        if (name == "put" && argc >= base) return "put of " + bucket((argc - base) / 4);
        if (name != "consume" || argc < base + 4) return name;
        // lease_ms max_attempts reclaim_batch take (how id token)*
        const std::size_t settles = (argc - base - 4) / 3;
        const std::size_t take = std::strtoull(args[base + 3].c_str(), nullptr, 10);
        std::string kinds;
        for (std::size_t i = base + 4; i < args.size() && i + 2 < argc; i += 3) {
            const char k = args[i].empty() ? '?' : args[i][0];
            const std::string kind = k == 'a' ? "ack" : k == 'n' ? "nack" : "?";
            if (kinds.empty())
                kinds = kind;
            else if (kinds != kind)
                kinds = "mixed";
        }
        std::string s = "consume:";
        if (settles > 0) s += " " + kinds + " " + bucket(settles);
        if (take > 0) s += std::string(settles > 0 ? " +" : "") + " take " + bucket(take);
        if (settles == 0 && take == 0) s += " nothing";
        return s;
    }

    static std::string upper(std::string s) {
        for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return s;
    }

    void add(const redisReply* e, bool first) {
        // Between two polls one entry is always missing: the SLOWLOG GET that the RESET after it
        // clears. Any other gap is a lost entry.
        const long long id = e->element[0]->integer;
        if (last_id_ >= 0 && id - last_id_ - (first ? 2 : 1) != 0) {
            lost_ += id - last_id_ - (first ? 2 : 1);
            if (std::getenv("BENCH_VERBOSE"))
                std::printf("slowlog gap: %lld after %lld (first of a poll: %d)\n", id, last_id_,
                            first ? 1 : 0);
        }
        last_id_ = id;
        ++entries_;
        const long long usec = e->element[2]->integer;
        const redisReply* a = e->element[3];
        std::vector<std::string> args;
        for (std::size_t i = 0; i < a->elements; ++i) args.push_back(str(a->element[i]));
        if (args.empty()) return;
        if (str(e->element[4]) == "?:0") {  // run by a script: its call comes next
            inner_.push_back({upper(args[0]), usec});
            return;
        }
        const std::string cmd = upper(args[0]);
        if (cmd != "EVALSHA" && cmd != "EVAL" && cmd != "FCALL" && cmd != "FCALL_RO") {
            inner_.clear();
            return;
        }
        // The log keeps 32 arguments at most: the last then says "... (N more arguments)".
        std::size_t argc = args.size();
        if (argc == 32 && args.back().rfind("... (", 0) == 0)
            argc = 31 + std::strtoull(args.back().c_str() + 5, nullptr, 10);
        klass& k = classes_[label(args, argc)];
        ++k.calls;
        k.usec += static_cast<double>(usec);
        for (const auto& i : inner_) {
            ++k.inner[i.name];
            ++k.inner_calls;
            k.inner_usec += static_cast<double>(i.usec);
        }
        inner_.clear();
    }

    void poll() {
        for (const char* c : {"MULTI", "SLOWLOG GET -1", "SLOWLOG RESET", "EXEC"})
            redisAppendCommand(ctx_, c);
        redisReply* last = nullptr;
        for (int i = 0; i < 4; ++i) {
            void* r = nullptr;
            if (redisGetReply(ctx_, &r) != REDIS_OK) throw std::runtime_error("script_tap: lost");
            if (last != nullptr) freeReplyObject(last);
            last = static_cast<redisReply*>(r);
        }
        const delayq_test::reply exec(last);
        if (exec->type != REDIS_REPLY_ARRAY || exec->elements < 1) return;
        const redisReply* log = exec->element[0];
        for (std::size_t i = log->elements; i-- > 0;)  // oldest first
            add(log->element[i], i + 1 == log->elements);
    }

    int port_;
    std::map<std::string, std::string> names_;  // SHA1 -> script name
    std::vector<std::pair<std::string, std::string>> saved_;
    redisContext* ctx_ = nullptr;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::vector<logged> inner_;
    std::map<std::string, klass> classes_;
    long long last_id_ = -1;
    long long lost_ = 0;
    double entries_ = 0;
    double per_command_ = 0;
};

// One consumer waiting in take(1 h) on an empty queue; counts the commands it sends
// (commandstats also counts the commands its scripts run inside the server: those are left out).
void idle(const delayq_test::redis_server& srv, int seconds_) {
    delayq::redis::delay_queue q(queue_options(srv.port(), "bench-idle"));
    (void)q.take(0ms);  // connect and load the scripts first
    std::atomic<bool> stop{false};
    std::thread consumer([&] {
        while (!stop.load())
            if (auto j = q.take(1h)) q.ack(*j);
    });
    std::this_thread::sleep_for(100ms);
    srv.command({"CONFIG", "RESETSTAT"});
    const auto start = clk::now();
    std::this_thread::sleep_for(std::chrono::seconds(seconds_));
    const std::string stats = srv.text({"INFO", "commandstats"});
    const double s = seconds(clk::now() - start);
    stop = true;
    delayq::redis::delay_queue(queue_options(srv.port(), "bench-idle")).put_after("stop", "", 0ms);
    consumer.join();
    long long calls = 0;
    for (const char* cmd : {"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_subscribe:",
                            "cmdstat_script|load:", "cmdstat_cluster|slots:"}) {
        const auto at = stats.find(cmd);
        if (at != std::string::npos)
            calls += std::stoll(stats.substr(stats.find("calls=", at) + 6));
    }
    if (std::getenv("BENCH_VERBOSE")) std::printf("%s\n", stats.c_str());
    std::printf("idle consumer: %lld commands in %.1f s = %.2f commands/s (max_block 5 s)\n", calls,
                s, calls / s);
}

void memory(const delayq_test::redis_server& srv, int n) {
    delayq::redis::delay_queue q(queue_options(srv.port(), "bench-mem"));
    (void)q.size();
    const long long before = info_number(srv, "memory", "used_memory:");
    const int per = n / 4;
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            for (int i = 0; i < per; ++i) {
                char id[16];
                std::snprintf(id, sizeof id, "j%d%08d", p, i);  // 10 bytes
                q.put_after(id, payload16, 1h);
            }
        });
    for (auto& t : ts) t.join();
    const long long after = info_number(srv, "memory", "used_memory:");
    std::printf("memory: %.0f bytes per waiting job (%d jobs, 10-byte id, 16-byte payload)\n",
                static_cast<double>(after - before) / (per * 4), per * 4);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF,
                 0);  // progress shows as it comes, in a pipe or a file too
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const int v = std::atoi(argv[i + 1]);
        if (a == "--only")
            cfg.only = argv[i + 1];
        else if (a == "--jobs")
            cfg.jobs = v;
        else if (a == "--batch-jobs")
            cfg.batch_jobs = v;
        else if (a == "--paced-seconds")
            cfg.paced_seconds = v;
        else if (a == "--idle-seconds")
            cfg.idle_seconds = v;
        else if (a == "--repeat")
            cfg.repeat = std::max(1, v);
        else if (a == "--port")
            cfg.port = v;
        else if (a == "--bullmq-concurrency")
            cfg.bullmq_concurrency = std::max(1, v);
        else if (a == "--objects" &&
                 (std::string(argv[i + 1]) == "shared" ||
                  std::string(argv[i + 1]) == "per-thread" || std::string(argv[i + 1]) == "both"))
            cfg.objects = argv[i + 1];
        else {
            std::fprintf(stderr,
                         "usage: %s [--jobs N] [--batch-jobs N] [--paced-seconds S] "
                         "[--idle-seconds S] [--repeat R] "
                         "[--port P] [--bullmq-concurrency C] [--objects shared|per-thread|both] "
                         "[--only "
                         "put|e2e|delayq|worker|bullmq|bullmq-batch|scripts|paced|idle|memory|"
                         "sharded]\n",
                         argv[0]);
            return 2;
        }
    }
    if (cfg.only == "sqlite" || cfg.only == "sqlite-reopen") {
        std::fprintf(stderr, "%s: the SQLite queue's runs are bench_sqlite's now (bench/sqlite/)\n",
                     argv[0]);
        return 2;
    }
    std::unique_ptr<delayq_test::redis_server> own;
    if (cfg.port == 0) {
        own = std::make_unique<delayq_test::redis_server>(
            std::vector<std::string>{"--appendonly", "no"});
        cfg.port = own->port();
    }
    std::printf("redis-server on 127.0.0.1:%d; %u hardware threads\n", cfg.port,
                std::thread::hardware_concurrency());
    const auto want = [&](const char* part) { return cfg.only.empty() || cfg.only == part; };
    const auto single = [&](const std::string& name) {
        return [&cfg, name](int i) {
            return std::make_unique<delayq::redis::delay_queue>(
                queue_options(cfg.port, name + std::to_string(i)));
        };
    };
    if (want("put")) {
        put_only(cfg.port, cfg.jobs, 1);
        put_only(cfg.port, cfg.batch_jobs, 100);
    }
    const bool e2e = want("e2e");
    const bool ours = e2e || want("delayq");    // delayq's end-to-end series
    const bool plain = ours || want("worker");  // its single calls, and the worker beside them
    const bool bull_single = e2e || want("bullmq");
    const bool bull_batch = e2e || want("bullmq-batch");
    // delayq's commandstats, the last run of each mode
    std::string stats_single, stats_per_thread, stats_batch, stats_worker, stats_worker_per_thread;
    if (plain || bull_single || bull_batch) {
        const std::string missing = bull_single || bull_batch ? bullmq_missing() : "";
        if (!missing.empty()) std::printf("bullmq: skipped (%s)\n", missing.c_str());
        const bool bull = missing.empty();
        const std::string conc = std::to_string(cfg.bullmq_concurrency);
        series ds{
            "delayq end to end (single calls: put_after, take, ack; one object shared by "
            "the 8 threads)",
            cfg.jobs,
            {}};
        series dp{"delayq end to end (single calls: put_after, take, ack; one object per thread)",
                  cfg.jobs,
                  {}};
        const bool shared = cfg.objects != "per-thread", per_thread = cfg.objects != "shared";
        series dw{"delayq::worker end to end (4 threads, on the object shared by the 8 threads)",
                  cfg.jobs,
                  {}};
        series dpw{
            "delayq::worker end to end (one of 1 thread on each consumer's object)", cfg.jobs, {}};
        series bs{"", cfg.jobs, {}};   // 4 workers of concurrency 1
        series bs1{"", cfg.jobs, {}};  // 1 worker of concurrency 4
        series bw{"", cfg.jobs, {}};   // windowed producers, 1 worker of concurrency 4
        series db{"delayq end to end (batches of 100)", cfg.batch_jobs, {}};
        series bb{"", cfg.batch_jobs, {}};
        std::string version;
        // Round by round, so that a machine that gets busier or quieter weighs on both sides.
        const auto add = [](series& to, const char* what, int round, const figures& f) {
            to.runs.push_back(f);
            std::printf(
                "  round %d, %s: %.0f jobs/s, per job redis-server CPU %.1f µs, client CPU "
                "%.1f µs\n",
                round + 1, what, f.jobs_per_s, f.server_us, f.client_us);
        };
        for (int i = 0; i < cfg.repeat; ++i) {
            for (const bool w : {i % 2 != 0, i % 2 == 0}) {  // plain loop and worker, in turn first
                if (plain && shared) {
                    auto q = single(w ? "bench-e2e-w-" : "bench-e2e-1-")(i);
                    add(w ? dw : ds,
                        w ? "worker, one shared object" : "delayq single, one shared object", i,
                        measured(cfg.port, *q, {cfg.jobs, 0, 1, 0, w},
                                 w ? &stats_worker : &stats_single));
                }
                if (plain && per_thread) {  // the same queue, an object of its own for each thread
                    std::vector<std::unique_ptr<delayq::redis::delay_queue>> own;
                    objects<delayq::redis::delay_queue> qs{};
                    for (auto& q : qs)
                        q = own.emplace_back(single(w ? "bench-e2e-wt-" : "bench-e2e-1t-")(i))
                                .get();
                    add(w ? dpw : dp,
                        w ? "worker, one object per thread"
                          : "delayq single, one object per thread",
                        i,
                        measured_each(cfg.port, qs, {cfg.jobs, 0, 1, 0, w},
                                      w ? &stats_worker_per_thread : &stats_per_thread));
                }
            }
            if (bull_single && bull) {
                if (auto f = bullmq_run(cfg.port, cfg.jobs, "single", 4, 1, version))
                    add(bs, "BullMQ single, 4 workers x 1", i, *f);
                if (auto f = bullmq_run(cfg.port, cfg.jobs, "single", 1, 4, version))
                    add(bs1, "BullMQ single, 1 worker x 4", i, *f);
                if (auto f = bullmq_run(cfg.port, cfg.jobs, "single", 1, 4, version, 32))
                    add(bw, "BullMQ single, 32 adds in flight a producer, 1 worker x 4", i, *f);
            }
            if (ours) {
                auto q = single("bench-e2e-100-")(i);
                add(db, "delayq batched", i,
                    measured(cfg.port, *q, {cfg.batch_jobs, 0, 100, 0}, &stats_batch));
            }
            if (bull_batch && bull)
                if (auto f = bullmq_run(cfg.port, cfg.batch_jobs, "batch", 1,
                                        cfg.bullmq_concurrency, version))
                    add(bb, "BullMQ batched", i, *f);
        }
        bs.name = "bullmq " + version +
                  " end to end (single calls: 4 producers awaiting each add, 4 workers of "
                  "concurrency 1)";
        bs1.name = "bullmq " + version +
                   " end to end (single calls: 4 producers awaiting each add, 1 worker of "
                   "concurrency 4)";
        bw.name = "bullmq " + version +
                  " end to end (single calls: 4 producers keeping 32 adds in flight each, 1 "
                  "worker of concurrency 4)";
        bb.name = "bullmq " + version + " end to end (addBulk of 100, one worker of concurrency " +
                  conc + ")";
        for (const series* s : {&ds, &dw, &dp, &dpw, &bs, &bs1, &bw, &db, &bb}) s->print();
        print_worker_beside(ds, dw, "one shared object, one worker of 4 threads");
        print_worker_beside(dp, dpw, "one object per thread, 4 workers of 1 thread");
        // BullMQ's faster single-call layout is the one to beat.
        const series& bfast =
            bs1.runs.empty() || (!bs.runs.empty() && bs.jobs_per_s() >= bs1.jobs_per_s()) ? bs
                                                                                          : bs1;
        if (e2e && !bfast.runs.empty())
            std::printf("BullMQ's faster single-call layout here: %s\n",
                        &bfast == &bs ? "4 workers of concurrency 1" : "1 worker of concurrency 4");
        // Against BullMQ as its users run it too: producers that keep adds in flight.
        if (e2e) print_table(ds, dp, bfast, "producers awaiting each add", db, bb);
        if (e2e && !bw.runs.empty())
            print_table(ds, dp, bw, "producers keeping 32 adds in flight", db, bb);
        if (plain) {
            const struct {
                bool run;
                const std::string& stats;
                int jobs;
                const char* what;
            } tables[] = {
                {shared, stats_single, cfg.jobs, "delayq single calls, one shared object"},
                {shared, stats_worker, cfg.jobs, "delayq::worker, one shared object"},
                {per_thread, stats_per_thread, cfg.jobs,
                 "delayq single calls, one object per thread"},
                {per_thread, stats_worker_per_thread, cfg.jobs,
                 "delayq::worker, one object per thread"},
                {ours, stats_batch, cfg.batch_jobs, "delayq batches of 100"}};
            for (const auto& t : tables)
                if (t.run) print_commandstats(t.stats, t.jobs, std::string(t.what) + ", last run");
            std::printf("\n");
        }
    }
    if (e2e || want("scripts")) {
        const struct {
            run_shape shape;
            const char* what;
            const std::string& timed;
        } runs[] = {{{cfg.jobs, 0, 1, 0}, "single calls", stats_single},
                    {{cfg.batch_jobs, 0, 100, 0}, "batches of 100", stats_batch}};
        for (const auto& r : runs) {
            delayq::redis::delay_queue q(
                queue_options(cfg.port, "bench-scripts-" + std::to_string(r.shape.batch)));
            (void)q.size();
            script_tap tap(cfg.port);
            lateness late;
            end_to_end(q, r.shape, late);
            tap.finish();
            tap.print(r.shape.jobs / 4 * 4, r.what, evalsha_per_job(r.timed, r.shape.jobs / 4 * 4));
        }
    }
    if (want("paced")) {
        lateness late;
        delayq::redis::delay_queue q(queue_options(cfg.port, "bench-paced"));
        end_to_end(q, {2000 * cfg.paced_seconds, 2000, 1, 2}, late);
        std::printf("paced at 2000 jobs/s for %d s, 2 of 4 consumers busy 5 ms per job: %s\n",
                    cfg.paced_seconds, late.report().c_str());
    }
    if (want("sharded")) {
        const auto sharded = [](int port, std::string name) {
            return [port, name](int i) {
                return std::make_unique<delayq::redis::sharded_delay_queue>(
                    queue_options(port, name + std::to_string(i)), 8);
            };
        };
        const double one = repeated(cfg, {cfg.jobs, 0, 1, 0}, "sharded (8 shards), one node",
                                    sharded(cfg.port, "bench-sh-"));
        delayq_test::redis_cluster cluster({"--appendonly", "no"});
        const double three =
            repeated(cfg, {cfg.jobs, 0, 1, 0}, "sharded (8 shards), 3-master cluster",
                     sharded(cluster.masters().front(), "bench-shc-"));
        std::printf("sharded: cluster / one node = %.2f\n", three / one);
    }
    if (!own) {
        std::printf(
            "(idle and memory figures need the program's own server: run without --port)\n");
        return 0;
    }
    if (want("idle")) {
        own->command({"FLUSHALL"});
        idle(*own, cfg.idle_seconds);
    }
    if (want("memory")) {
        own->command({"FLUSHALL"});
        memory(*own, 100'000);
    }
}
