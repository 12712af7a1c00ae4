// delayq_chaos: the job queues as production runs them, checked from the processes' own logs.
//
// For each backend (chaos_backends.hpp) and each round: a fresh store (a new SQLite file that no
// one has created yet, a new redis-server), then 2 producers, 4 consumers (the last of them runs
// a delayq::worker), a canceller and 2 openers started at the same moment (each a process of its
// own, released together by one pipe), so that they race to create the queue. For the round's
// seconds a monkey picks a random process every 0.15-1 s and kills it with SIGKILL (or, one time in
// three, stops it with SIGTERM: it closes its queue and exits) and starts it again, at once or up
// to 1.5 s later; poison jobs end their consumers, which are started again too. Then every process
// is killed, a drainer empties the queue (poison jobs go on until they are dead), the store's state
// is read (jobs left, dead letters, the file's integrity), and chaos_check.hpp judges the logs
// (chaos_worker.hpp says what each process does and logs). The queues run with lease 500 ms and
// max_attempts 3.
//
//   delayq_chaos run [--backend NAME|all] [--seconds S] [--round R] [--seed N] [--dir D] [--keep]
//                    [--server-kills] [--server-stalls] [--connection-kills] [--timeout MS]
//       S seconds of chaos per backend (default 20), in rounds of R seconds (default 10), each on
//       a new store. --server-kills: once a round, the store's server (Redis, PostgreSQL; SQLite
//       has none) is killed with SIGKILL and started again on the same data. --server-stalls:
//       once a round the store stalls for 1-4 s (PostgreSQL: its tables locked; Redis: the server
//       stopped; SQLite: the file's write lock held). --connection-kills: twice a round every
//       client connection is killed (Redis, PostgreSQL). --timeout: the queues' io_timeout /
//       busy_timeout (default 10000 ms, 2000 ms with stalls or connection kills). Exit status 0:
//       no violation; 1: violations (printed with their events, the logs kept under D); 2: the
//       harness itself failed.
//   delayq_chaos check ROUND_DIR      judge a kept round again
//   delayq_chaos worker ...           one process of a round (started by run)
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "chaos_backends.hpp"
#include "chaos_check.hpp"
#include "chaos_log.hpp"
#include "chaos_worker.hpp"

extern char** environ;

namespace delayq_chaos {
namespace {

namespace fs = std::filesystem;

// ---- judging a round's directory ---------------------------------------------------------------

// What the timing rule allows a call beyond its timeout and one connect: a loaded 2-core machine
// (the scheduler, the log's fdatasync) can hold a process up for a while.
constexpr long long slack_ms = 2'000;

// settings.txt of a round: what the checker must know of how it ran.
void save_settings(const std::string& dir, const queue_settings& qs) {
    std::ofstream out(dir + "/settings.txt");
    // A call may make one connect within its time, and the queues connect within io_timeout.
    out << "max_attempts " << qs.max_attempts << "\ncall_timeout_ms " << qs.call_timeout.count()
        << "\nconnect_ms " << qs.call_timeout.count() << "\nslack_ms " << slack_ms << "\nlease_ms "
        << qs.lease.count() << "\nmax_leased " << qs.max_leased << '\n';
}

check_settings load_settings(const std::string& dir) {
    check_settings cs;
    bool connect = false;
    std::ifstream in(dir + "/settings.txt");
    for (std::string k; in >> k;) {
        long long v = 0;
        in >> v;
        if (k == "max_attempts") cs.max_attempts = static_cast<unsigned>(v);
        if (k == "call_timeout_ms") cs.call_timeout_ms = v;
        if (k == "connect_ms") cs.connect_ms = v, connect = true;
        if (k == "slack_ms") cs.slack_ms = v;
        if (k == "max_leased") cs.max_leased = v;
        if (k == "lease_ms") cs.lease_ms = v;
    }
    if (!connect) cs.connect_ms = cs.call_timeout_ms;
    return cs;
}

// Judges the round in `dir` and prints the result; returns the number of violations.
std::size_t judge(const std::string& dir, std::FILE* out) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir + "/logs"))
        if (e.path().extension() == ".log") names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::vector<std::vector<event>> logs;
    for (std::size_t i = 0; i < names.size(); ++i)
        logs.push_back(read_log(dir + "/logs/" + names[i], static_cast<int>(i)));
    const final_state end = final_state::load(dir + "/final.txt");
    const report r = check(logs, end, load_settings(dir));
    for (const auto& n : end.notes) std::fprintf(out, "  store: %s\n", n.c_str());
    print(out, r, names);
    return r.violations.size();
}

// ---- the orchestrator --------------------------------------------------------------------------

struct run_options {
    std::string backend = "all";
    double seconds = 20;
    double round = 10;
    unsigned long long seed = 0;
    std::string dir;
    bool keep = false;
    bool server_kills = false;      // kill -9 the server once a round, and start it again
    bool server_stalls = false;     // stall the store for 1-4 s once a round
    bool connection_kills = false;  // kill every client connection twice a round
    queue_settings qs;
    std::size_t max_leased = 3;  // every other round's limit of jobs leased at once
};

// What the orchestrator does to the store besides killing processes; an empty function: the
// store has no such thing, or the option is off.
struct faults {
    std::function<void()> kill_server;                     // --server-kills
    std::function<void(std::chrono::milliseconds)> stall;  // --server-stalls
    std::string stall_how;
    std::function<long long()> kill_connections;  // --connection-kills
};

struct child {
    std::string role;
    int index = 0;
    int incarnation = 0;
    pid_t pid = -1;
    bool killed = false;                               // by the monkey (or the end of the chaos)
    std::chrono::steady_clock::time_point stopping{};  // sent SIGTERM then; {}: not
    std::chrono::steady_clock::time_point restart{};   // start again then (pid -1 meanwhile)
};

class orchestrator {
  public:
    // f: what it does to the store: a server kill (once a round, at a random moment of its
    // middle half), a stall (once a round, 1-4 s, begun in its middle three quarters) and
    // connection kills (twice a round, in its middle three quarters). They never overlap: one
    // whose moment comes during another, or less than 0.3-1 s after its end, waits (the round goes
    // on until all are done).
    orchestrator(std::string self, const run_options& o, std::string backend, std::string locator,
                 std::string dir, faults f)
        : self_(std::move(self)),
          o_(o),
          backend_(std::move(backend)),
          locator_(std::move(locator)),
          dir_(std::move(dir)),
          log_(dir_ + "/logs/orchestrator.log"),
          rng_(o.seed ^ std::hash<std::string>{}(dir_)),
          f_(std::move(f)) {}

    // The round: everyone at once, chaos for `seconds`, everyone killed, the drain.
    void run(double seconds) {
        int go[2];
        if (::pipe2(go, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
        const std::vector<std::pair<std::string, int>> roles{
            {"producer", 2}, {"consumer", 4}, {"canceller", 1}, {"opener", 2}};
        for (const auto& [role, n] : roles)
            for (int i = 0; i < n; ++i) {
                child c{role, i, 0};
                c.pid = start(c, go[0]);
                children_.push_back(c);
            }
        ::close(go[0]);
        ::close(go[1]);  // EOF: every process goes at once
        const auto end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
        auto next_kill = std::chrono::steady_clock::now() + std::chrono::milliseconds(pause());
        const long long ms = static_cast<long long>(seconds * 1000);
        const auto began = std::chrono::steady_clock::now();
        const auto at = [&](long long lo, long long hi) {
            return began + std::chrono::milliseconds(
                               std::uniform_int_distribution<long long>(lo, hi)(rng_));
        };
        using time_point = std::chrono::steady_clock::time_point;
        std::vector<time_point> server_kills, stalls, connection_kills;  // still to come
        if (f_.kill_server) server_kills.push_back(at(ms / 4, ms * 3 / 4));
        if (f_.stall) stalls.push_back(at(ms / 8, ms * 7 / 8));
        if (f_.kill_connections)
            for (int i = 0; i < 2; ++i) connection_kills.push_back(at(ms / 8, ms * 7 / 8));
        std::jthread stall;  // the stall in progress (joined at the latest when run() ends)
        std::atomic<bool> stalling{false};
        // No fault begins before then: each finds the processes back at work after the last.
        time_point quiet{};
        const auto gap = [&] {
            return std::chrono::milliseconds(
                std::uniform_int_distribution<long long>(300, 1000)(rng_));
        };
        const auto due = [](std::vector<time_point>& v, time_point t) {
            const auto it = std::find_if(v.begin(), v.end(), [&](auto x) { return x <= t; });
            if (it == v.end()) return false;
            v.erase(it);
            return true;
        };
        while (std::chrono::steady_clock::now() < end || stalling || !server_kills.empty() ||
               !stalls.empty() || !connection_kills.empty()) {
            const auto t = std::chrono::steady_clock::now();
            if (!stalling && stall.joinable()) {
                stall.join();
                quiet = std::chrono::steady_clock::now() + gap();
            }
            // The judge excuses the calls that fail meanwhile (chaos_check.hpp).
            if (!stalling && t >= quiet && due(server_kills, t)) {
                log_.write(line("server-kill"));
                f_.kill_server();
                log_.write(line("server-up"));
                quiet = std::chrono::steady_clock::now() + gap();
            }
            if (!stalling && t >= quiet && due(connection_kills, t)) {
                log_.write(line("connection-kill"));
                try {
                    log_.write(line("connection-kill-end") << f_.kill_connections());
                } catch (const std::exception& e) {
                    log_.write(line("connection-kill-error") << e.what());
                }
                quiet = std::chrono::steady_clock::now() + gap();
            }
            if (!stalling && t >= quiet && due(stalls, t)) {
                const auto d = std::chrono::milliseconds(
                    std::uniform_int_distribution<long long>(1'000, 4'000)(rng_));
                log_.write(line("stall-begin")
                           << f_.stall_how << static_cast<long long>(d.count()));
                stalling = true;
                stall = std::jthread([this, d, &stalling] {
                    try {
                        f_.stall(d);
                        log_.write(line("stall-end"));
                    } catch (const std::exception& e) {
                        log_.write(line("stall-error") << e.what());
                    }
                    stalling = false;
                });
            }
            reap(true);
            for (auto& c : children_) {
                if (c.pid < 0 && t >= c.restart) c.pid = start(c, -1);
                // A process asked to stop has a call and a pause to finish: 30 s is a hang.
                if (c.pid > 0 && c.stopping != decltype(c.stopping){} &&
                    t - c.stopping > std::chrono::seconds(30)) {
                    log_.write(line("crash") << name(c) << "did not stop within 30 s of SIGTERM");
                    c.killed = true;
                    ::kill(c.pid, SIGKILL);
                }
            }
            if (t >= next_kill) {
                child& c =
                    children_[static_cast<std::size_t>(std::uniform_int_distribution<long long>(
                        0, static_cast<long long>(children_.size()) - 1)(rng_))];
                if (c.pid > 0 && c.stopping == decltype(c.stopping){}) {
                    // Mostly kill -9; else a stop as for a deploy (SIGTERM: the process closes
                    // its queue and exits).
                    if (std::uniform_int_distribution<int>(0, 99)(rng_) < 70) {
                        log_.write(line("kill") << name(c) << c.pid);
                        c.killed = true;
                        ::kill(c.pid, SIGKILL);
                    } else {
                        log_.write(line("stop") << name(c) << c.pid);
                        c.stopping = t;
                        ::kill(c.pid, SIGTERM);
                    }
                }
                next_kill = t + std::chrono::milliseconds(pause());
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        if (stall.joinable()) stall.join();
        for (auto& c : children_)
            if (c.pid > 0) {
                c.killed = true;
                ::kill(c.pid, SIGKILL);
            }
        while (std::any_of(children_.begin(), children_.end(), [](auto& c) { return c.pid > 0; }))
            reap(false);
        drain();
        scan_stderr();
    }

  private:
    long long pause() { return std::uniform_int_distribution<long long>(150, 1000)(rng_); }

    static std::string name(const child& c) {
        return c.role + "-" + std::to_string(c.index) + "." + std::to_string(c.incarnation);
    }

    // Starts `c` as a process of its own; with go_fd >= 0 it waits for that pipe's EOF first.
    pid_t start(const child& c, int go_fd) {
        const std::string seed = std::to_string(o_.seed ^ std::hash<std::string>{}(dir_ + name(c)) ^
                                                static_cast<unsigned long long>(c.incarnation));
        std::vector<std::string> args{
            self_, "worker", "--backend", backend_, "--role", c.role, "--index",
            std::to_string(c.index), "--incarnation", std::to_string(c.incarnation), "--at",
            locator_, "--logs", dir_ + "/logs", "--seed", seed, "--lease",
            std::to_string(o_.qs.lease.count()), "--max-attempts",
            std::to_string(o_.qs.max_attempts), "--max-leased", std::to_string(o_.qs.max_leased),
            "--timeout", std::to_string(o_.qs.call_timeout.count()), "--threads",
            // Two consumers run two threads over one queue object; the last runs a
            // delayq::worker with two handler threads.
            c.role == "consumer" && (c.index < 2 || c.index == 3) ? "2" : "1", "--worker",
            c.role == "consumer" && c.index == 3 ? "1" : "0", "--go-fd", std::to_string(go_fd)};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        const std::string err = dir_ + "/logs/" + name(c) + ".stderr";
        const pid_t parent = ::getpid();
        // The child starts with SIGTERM blocked (the mask survives fork and exec) until the worker
        // has its handler: a stop sent while the process is still starting is a stop, not a death.
        sigset_t term, old_mask;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        ::sigprocmask(SIG_BLOCK, &term, &old_mask);
        const pid_t pid = ::fork();
        if (pid != 0) ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
        if (pid < 0) throw std::runtime_error("fork failed");
        if (pid == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) ::_exit(127);
            const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                ::dup2(fd, 1);
                ::dup2(fd, 2);
                ::close(fd);
            }
            if (go_fd >= 0) ::fcntl(go_fd, F_SETFD, 0);
            ::execve(argv[0], argv.data(), environ);
            ::_exit(127);
        }
        return pid;
    }

    // Collects the processes that ended; with `restart`, starts each again as a new incarnation.
    // A process ended by the monkey, by a poison job (status 77, or SIGKILL it sent itself) or by a
    // failed open (status 3, logged by the process) is expected; anything else is a crash.
    void reap(bool restart) {
        int status = 0;
        pid_t pid;
        while ((pid = ::waitpid(-1, &status, restart ? WNOHANG : 0)) > 0) {
            for (auto& c : children_) {
                if (c.pid != pid) continue;
                const bool stopped = c.stopping != decltype(c.stopping){} && WIFEXITED(status) &&
                                     WEXITSTATUS(status) == 0;
                const bool expected =
                    c.killed || stopped || (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
                    (WIFEXITED(status) &&
                     (WEXITSTATUS(status) == poison_exit || WEXITSTATUS(status) == open_failed));
                if (!expected) log_.write(line("crash") << name(c) << describe(status) << tail(c));
                c.pid = -1;
                if (restart) {
                    // Started again at once, or after a while: the number of processes that
                    // hold the store goes up and down, as in production.
                    ++c.incarnation;
                    c.killed = false;
                    c.stopping = {};
                    const bool now = std::uniform_int_distribution<int>(0, 1)(rng_) == 0;
                    c.restart = std::chrono::steady_clock::now() +
                                std::chrono::milliseconds(
                                    now ? 0 : std::uniform_int_distribution<int>(100, 1500)(rng_));
                }
            }
            if (!restart) return;
        }
    }

    static std::string describe(int status) {
        if (WIFEXITED(status)) return "exit-status-" + std::to_string(WEXITSTATUS(status));
        if (WIFSIGNALED(status)) return std::string("signal-") + strsignal(WTERMSIG(status));
        return "status-" + std::to_string(status);
    }

    // The last lines a process wrote to stderr.
    std::string tail(const child& c) const {
        std::ifstream in(dir_ + "/logs/" + name(c) + ".stderr");
        std::vector<std::string> lines;
        for (std::string l; std::getline(in, l);) lines.push_back(l);
        std::string out;
        for (std::size_t i = lines.size() > 5 ? lines.size() - 5 : 0; i < lines.size(); ++i)
            out += " | " + lines[i];
        return out;
    }

    // The drainer: alone on the queue, until it is empty (or 30 s more than the drain's limit).
    void drain() {
        child d{"drainer", 0, 0};
        d.pid = start(d, -1);
        children_.assign(1, d);
        const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(90);
        while (children_[0].pid > 0 && std::chrono::steady_clock::now() < limit) {
            int status = 0;
            if (::waitpid(children_[0].pid, &status, WNOHANG) == children_[0].pid) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    log_.write(line("crash")
                               << name(children_[0]) << describe(status) << tail(children_[0]));
                children_[0].pid = -1;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (children_[0].pid > 0) {
            log_.write(line("crash") << name(children_[0]) << "hung: killed after 90 s");
            ::kill(children_[0].pid, SIGKILL);
            ::waitpid(children_[0].pid, nullptr, 0);
        }
    }

    // A sanitizer's report in any process's stderr is a crash, whatever its exit status was.
    void scan_stderr() {
        for (const auto& e : fs::directory_iterator(dir_ + "/logs")) {
            if (e.path().extension() != ".stderr") continue;
            std::ifstream in(e.path());
            for (std::string l; std::getline(in, l);)
                if (l.find("ERROR: AddressSanitizer") != l.npos ||
                    l.find("ERROR: LeakSanitizer") != l.npos ||
                    l.find("WARNING: ThreadSanitizer") != l.npos ||
                    l.find("runtime error:") != l.npos) {
                    log_.write(line("crash") << e.path().stem().string() << "sanitizer" << l);
                    break;
                }
        }
    }

    std::string self_;
    run_options o_;
    std::string backend_, locator_, dir_;
    log_writer log_;
    std::mt19937_64 rng_;
    faults f_;
    std::vector<child> children_;
};

template <class B>
std::size_t run_backend(const std::string& self, const run_options& o, const std::string& base,
                        bool& harness_failed) {
    const int rounds = std::max(1, static_cast<int>(o.seconds / o.round + 0.5));
    std::size_t total = 0;
    for (int r = 0; r < rounds; ++r) {
        const std::string dir = base + "/" + B::name + "/round-" + std::to_string(r);
        fs::create_directories(dir + "/logs");
        // Every other round, every process (the drainer too) opens its queue with a limit of
        // o.max_leased leased at once, fewer than the 7 threads that take: it binds.
        run_options ro = o;
        if (r % 2 == 1) ro.qs.max_leased = o.max_leased;
        save_settings(dir, ro.qs);
        const auto began = std::chrono::steady_clock::now();
        std::size_t found = 0;
        try {
            typename B::store st(dir, o.server_kills);
            faults f;
            if constexpr (requires { st.kill_server(); })
                if (o.server_kills) f.kill_server = [&st] { st.kill_server(); };
            if constexpr (requires { st.stall(std::chrono::milliseconds{}); })
                if (o.server_stalls) {
                    f.stall = [&st](std::chrono::milliseconds d) { st.stall(d); };
                    f.stall_how = B::store::stall_how;
                }
            if constexpr (requires { st.kill_connections(); })
                if (o.connection_kills)
                    f.kill_connections = [&st] { return st.kill_connections(); };
            {
                orchestrator orch(self, ro, B::name, st.locator(), dir, std::move(f));
                orch.run(o.seconds / rounds);
            }
            st.inspect().save(dir + "/final.txt");
            std::printf("%s round %d (%s):\n", B::name, r, dir.c_str());
            found = judge(dir, stdout);
        } catch (const std::exception& e) {
            std::printf("%s round %d: the harness failed: %s\n", B::name, r, e.what());
            harness_failed = true;
        }
        std::printf(
            "%s round %d: %zu violations, %.1f s\n", B::name, r, found,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
        std::fflush(stdout);
        total += found;
        if (found == 0 && !o.keep) fs::remove_all(dir);
    }
    return total;
}

int run(const std::string& self, const run_options& o) {
    std::string base = o.dir;
    if (!base.empty() && fs::exists(base) && !fs::is_empty(base)) {
        // Old logs would be judged with the new ones.
        std::fprintf(stderr, "delayq_chaos: %s is not empty: name a new --dir\n", base.c_str());
        return 2;
    }
    if (base.empty()) {
        std::string pattern = (fs::temp_directory_path() / "delayq-chaos-XXXXXX").string();
        if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
        base = pattern;
    }
    std::printf(
        "delayq_chaos: seed %llu, %.0f s per backend in rounds of %.0f s, timeout %lld ms"
        "%s%s%s, logs under %s\n",
        o.seed, o.seconds, o.round, static_cast<long long>(o.qs.call_timeout.count()),
        o.server_kills ? ", server kills" : "", o.server_stalls ? ", stalls" : "",
        o.connection_kills ? ", connection kills" : "", base.c_str());
    std::fflush(stdout);
    std::size_t total = 0;
    bool matched = false, harness_failed = false;
    std::apply(
        [&]<class... B>(B...) {
            (
                [&] {
                    if (o.backend != "all" && o.backend != B::name) return;
                    matched = true;
                    total += run_backend<B>(self, o, base, harness_failed);
                }(),
                ...);
        },
        backends{});
    if (!matched) {
        std::fprintf(stderr, "delayq_chaos: no backend '%s' in this build\n", o.backend.c_str());
        return 2;
    }
    std::printf("delayq_chaos: %zu violations in all%s\n", total,
                harness_failed ? "; the harness failed" : "");
    if (total == 0 && !harness_failed && !o.keep) {
        std::error_code ec;
        fs::remove_all(base, ec);
    } else {
        std::printf("delayq_chaos: logs kept under %s\n", base.c_str());
    }
    return harness_failed ? 2 : total == 0 ? 0 : 1;
}

// ---- a worker process --------------------------------------------------------------------------

int work(const std::string& backend, worker_args a, int go_fd) {
    // The orchestrator started this process with SIGTERM blocked: a stop asked for meanwhile is
    // pending, and arrives now, at the handler.
    struct sigaction sa {};
    sa.sa_handler = [](int) { stop_requested = 1; };
    ::sigaction(SIGTERM, &sa, nullptr);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ::sigprocmask(SIG_UNBLOCK, &term, nullptr);
    if (go_fd >= 0) {  // wait for the others: the orchestrator's EOF releases all at once
        char c;
        while (::read(go_fd, &c, 1) < 0 && errno == EINTR) {
        }
        ::close(go_fd);
    }
    int status = 2;
    bool matched = false;
    std::apply(
        [&]<class... B>(B...) {
            (
                [&] {
                    if (backend != B::name) return;
                    matched = true;
                    worker<B> w(a);
                    status = w.run();
                }(),
                ...);
        },
        backends{});
    return matched ? status : 2;
}

int usage() {
    std::fprintf(stderr,
                 "usage: delayq_chaos run [--backend NAME|all] [--seconds S] [--round R] "
                 "[--seed N] [--dir D] [--keep] [--server-kills] [--server-stalls]\n"
                 "                        [--connection-kills] [--timeout MS]\n"
                 "       delayq_chaos check ROUND_DIR\n");
    return 2;
}

}  // namespace
}  // namespace delayq_chaos

int main(int argc, char** argv) {
    using namespace delayq_chaos;
    if (argc < 2) return usage();
    const std::string mode = argv[1];
    std::map<std::string, std::string> opt;
    std::vector<std::string> rest;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--keep" || a == "--server-kills" || a == "--server-stalls" ||
            a == "--connection-kills") {
            opt[a] = "1";
        } else if (a.rfind("--", 0) == 0 && i + 1 < argc) {
            opt[a] = argv[++i];
        } else {
            rest.push_back(a);
        }
    }
    const auto get = [&](const char* k, const std::string& d) {
        auto it = opt.find(k);
        return it == opt.end() ? d : it->second;
    };
    try {
        const std::string self = fs::canonical("/proc/self/exe").string();
        if (mode == "run") {
            run_options o;
            o.backend = get("--backend", "all");
            o.seconds = std::stod(get("--seconds", "20"));
            o.round = std::stod(get("--round", "10"));
            o.seed = std::stoull(get("--seed", std::to_string(std::random_device{}())));
            o.dir = get("--dir", "");
            o.keep = opt.count("--keep") != 0;
            o.server_kills = opt.count("--server-kills") != 0;
            o.server_stalls = opt.count("--server-stalls") != 0;
            o.connection_kills = opt.count("--connection-kills") != 0;
            // Timeouts shorter than most stalls, so that calls fail in them (and must fail in
            // time); not 1 s: 9 processes opening a new queue at once on a loaded 2-core machine
            // can take that long.
            o.qs.call_timeout = std::chrono::milliseconds(std::stoll(
                get("--timeout", o.server_stalls || o.connection_kills ? "2000" : "10000")));
            if (o.qs.call_timeout.count() <= 0) return usage();
            if (o.seconds <= 0 || o.round <= 0) return usage();
            return run(self, o);
        }
        if (mode == "check" && rest.size() == 1) return judge(rest[0], stdout) == 0 ? 0 : 1;
        if (mode == "worker") {
            worker_args a;
            a.role = get("--role", "");
            a.index = std::stoi(get("--index", "0"));
            a.incarnation = std::stoi(get("--incarnation", "0"));
            a.locator = get("--at", "");
            a.log_dir = get("--logs", ".");
            a.seed = std::stoull(get("--seed", "1"));
            a.qs.lease = std::chrono::milliseconds(std::stoll(get("--lease", "500")));
            a.qs.max_attempts = static_cast<unsigned>(std::stoul(get("--max-attempts", "3")));
            a.qs.max_leased = std::stoul(get("--max-leased", "0"));
            a.qs.call_timeout = std::chrono::milliseconds(std::stoll(get("--timeout", "10000")));
            a.threads = std::max(1, std::stoi(get("--threads", "1")));
            a.run_worker = get("--worker", "0") == "1";
            return work(get("--backend", ""), a, std::stoi(get("--go-fd", "-1")));
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "delayq_chaos %s: %s\n", mode.c_str(), e.what());
        return 2;
    }
    return usage();
}
