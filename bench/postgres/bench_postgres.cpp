// End-to-end figures of delayq::postgres against a private PostgreSQL server that this program
// starts itself (initdb in a temporary directory, the distribution's default settings: fsync and
// synchronous_commit on), side by side with pg-boss and graphile-worker, each end-to-end run on a
// fresh server of the same kind, when they are installed (npm install in node/; optional).
//
//   bench_postgres [--jobs N] [--batch-jobs N] [--repeat R] [--idle-seconds S] [--wakes N]
//                  [--only e2e|delayq|worker|idle|wake|tx]
//
// 1. end to end, R rounds; each round runs, one after the other so that all see the same
//    machine: delayq single calls (4 producer threads put_after N jobs due U[0, 2 s], 4 consumer
//    threads run `while (auto j = q.take(..)) q.ack(*j);`, one shared queue object), pg-boss and
//    graphile-worker single calls (node/bench.mjs --mode single), delayq's worker (the same
//    single-call run with the 4 consumer threads replaced by one delayq::worker of 4 threads on
//    the shared object, its handler counting the job; with the ratios worker / plain loop; `--only
//    worker` runs delayq's single calls and the worker alone), then delayq batched
//    (put_many / take_many / ack_many of 100, --batch-jobs jobs) and both Node libraries batched.
//    Each with jobs/s, server CPU per job (the postmaster and every backend, from /proc, over the
//    run) and client CPU per job (this process's getrusage for delayq; the node process's own
//    process.cpuUsage()); medians in one table, with delayq's ratios to the faster library;
// 2. idle: statements one idle consumer sends in S seconds (take(1h) on an empty queue, the
//    server logging every statement with the client's application_name);
// 3. wake-up: a take waiting on an empty queue, and a put of a due job from another object: the
//    time from the put's call and from its return to the take's return, N rounds, p50/p99/max,
//    and where it goes: the put itself, its NOTIFY's way to a plain listening connection, and a
//    claim of a due job (take(0));
// 4. the transactional put: the time of put_after_in_transaction inside a transaction beside an
//    INSERT of the same row into a table of the application's (one round trip each), and the
//    commits a second of 4 connections doing either.
#include <libpq-fe.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/postgres/delay_queue.hpp>
#include <delayq/worker.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pg_server.hpp"

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

struct config {
    int jobs = 20'000;
    int batch_jobs = 100'000;
    int repeat = 3;
    int idle_seconds = 20;
    int wakes = 500;
    std::string only;
};

const std::string payload16 = "0123456789abcdef";

double seconds(clk::duration d) {
    return std::chrono::duration<double>(d).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

// The server's CPU seconds so far: the postmaster (with the children it reaped) and its live
// children, from /proc.
double server_cpu(pid_t postmaster) {
    const auto stat_of = [](const std::string& pid, long long& ppid, long long& own,
                            long long& reaped) {
        std::ifstream in("/proc/" + pid + "/stat");
        std::string line;
        if (!std::getline(in, line)) return false;
        std::istringstream rest(line.substr(line.rfind(')') + 2));
        std::string f[15];
        for (auto& x : f) rest >> x;
        ppid = std::atoll(f[1].c_str());
        own = std::atoll(f[11].c_str()) + std::atoll(f[12].c_str());
        reaped = std::atoll(f[13].c_str()) + std::atoll(f[14].c_str());
        return true;
    };
    long long ppid = 0, own = 0, reaped = 0, total = 0;
    if (stat_of(std::to_string(postmaster), ppid, own, reaped)) total = own + reaped;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
        const std::string name = e.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        if (stat_of(name, ppid, own, reaped) && ppid == postmaster) total += own;
    }
    return static_cast<double>(total) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double client_cpu() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct figures {
    double jobs_per_s = 0, server_us = 0, client_us = 0;  // CPU per job, µs
};

// --durable-leases 0: leases, acks and nacks do not wait for the disk (the default, 1, waits, as
// every commit of pg-boss and graphile-worker does; docs/postgres.md, "Durability").
bool durable_leases = delayq::postgres::options{}.durable_leases;

delayq::postgres::options queue_options(const delayq_pg_test::pg_server& srv,
                                        const std::string& name) {
    delayq::postgres::options o;
    o.conninfo = srv.conninfo();
    o.name = name;
    o.connections = 8;  // 4 producers and 4 consumers share the object
    o.durable_leases = durable_leases;
    return o;
}

// 4 producers and 4 consumers on one queue object; batch 1: single calls. `worker`: the consumers
// are one delayq::worker of 4 threads (single calls), its handler counting the job.
figures delayq_e2e(const delayq_pg_test::pg_server& srv, int jobs, int batch, int round,
                   bool worker = false) {
    delayq::postgres::delay_queue q(
        queue_options(srv, "e2e-" + std::to_string(batch) + "-" + std::to_string(round)));
    const int per = jobs / 4;
    const int total = per * 4;
    std::atomic<int> acked{0};
    const double s0 = server_cpu(srv.pid()), c0 = client_cpu();
    const auto start = clk::now();
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            std::mt19937 rng(static_cast<unsigned>(p + 1));
            std::uniform_int_distribution<int> delay(0, 2000);
            std::vector<std::string> ids;
            std::vector<delayq::put_request> reqs;
            for (int i = 0; i < per; ++i) {
                std::string id = std::to_string(p) + ":" + std::to_string(i);
                if (batch <= 1) {
                    q.put_after(id, payload16, std::chrono::milliseconds(delay(rng)));
                    continue;
                }
                ids.push_back(std::move(id));
                if (static_cast<int>(ids.size()) == batch || i + 1 == per) {
                    reqs.clear();
                    for (const auto& x : ids)
                        reqs.push_back({x, payload16, std::chrono::milliseconds(delay(rng))});
                    q.put_many(reqs);
                    ids.clear();
                }
            }
        });
    std::optional<delayq::worker<delayq::postgres::delay_queue>> w;
    if (worker)
        w.emplace(
            q,
            [&](const delayq::job&) {
                if (acked.fetch_add(1) + 1 == total) acked.notify_all();
            },
            delayq::worker_options{.threads = 4});
    for (int c = 0; c < 4 && !worker; ++c)
        ts.emplace_back([&] {
            while (acked < total) {
                if (batch <= 1) {
                    if (auto j = q.take(200ms); j && q.ack(*j)) ++acked;
                    continue;
                }
                auto js = q.take_many(static_cast<std::size_t>(batch), 200ms);
                if (js.empty()) continue;
                const auto ok = q.ack_many(js);
                acked += static_cast<int>(std::count(ok.begin(), ok.end(), true));
            }
        });
    for (auto& t : ts) t.join();
    for (int n; w && (n = acked.load()) < total;) acked.wait(n);
    if (w) w->stop();  // waits for the last acks
    const double s = seconds(clk::now() - start);
    if (w && w->counters().done != static_cast<std::uint64_t>(total))
        std::printf("  worker: %llu of %d jobs acked\n",
                    static_cast<unsigned long long>(w->counters().done), total);
    figures f;
    f.jobs_per_s = total / s;
    f.server_us = (server_cpu(srv.pid()) - s0) / total * 1e6;
    f.client_us = (client_cpu() - c0) / total * 1e6;
    return f;
}

// A number from node's one line of JSON.
double json_number(const std::string& json, const std::string& key) {
    const auto at = json.find("\"" + key + "\":");
    return at == std::string::npos ? 0 : std::atof(json.c_str() + at + key.size() + 3);
}
std::string json_string(const std::string& json, const std::string& key) {
    const auto at = json.find("\"" + key + "\":\"");
    if (at == std::string::npos) return "?";
    const auto from = at + key.size() + 4;
    return json.substr(from, json.find('"', from) - from);
}

std::string node_dir() {
    return DELAYQ_BENCH_NODE_DIR;
}

bool node_ready() {
    return std::system("command -v node >/dev/null 2>&1") == 0 &&
           std::filesystem::exists(node_dir() + "/node_modules/pg-boss") &&
           std::filesystem::exists(node_dir() + "/node_modules/graphile-worker");
}

std::optional<figures> node_e2e(const delayq_pg_test::pg_server& srv, const char* lib, int jobs,
                                const char* mode, std::string& version) {
    const std::string cmd = "cd '" + node_dir() + "' && node bench.mjs --lib " + lib +
                            " --conn postgres://postgres@127.0.0.1:" + std::to_string(srv.port()) +
                            "/postgres --postmaster " + std::to_string(srv.pid()) + " --jobs " +
                            std::to_string(jobs) + " --mode " + mode + " 2>&1";
    FILE* f = ::popen(cmd.c_str(), "r");
    std::string out, line;
    char buf[4096];
    while (f && std::fgets(buf, sizeof buf, f)) out += buf;
    if (f) ::pclose(f);
    const auto at = out.rfind("{\"lib\"");
    if (at == std::string::npos) {
        std::printf("  %s %s failed:\n%s\n", lib, mode, out.c_str());
        return std::nullopt;
    }
    const std::string json = out.substr(at);
    version = json_string(json, "version");
    const double n = json_number(json, "jobs");
    figures r;
    r.jobs_per_s = json_number(json, "jobs_per_s");
    r.server_us = json_number(json, "server_cpu_s") / n * 1e6;
    r.client_us = json_number(json, "client_cpu_s") / n * 1e6;
    return r;
}

// The statements a server ran, most costly first (pg_stat_statements, when the settings load it).
void print_profile(const delayq_pg_test::pg_server& srv) {
    PGconn* c = PQconnectdb(srv.conninfo().c_str());
    PGresult* r = PQexec(c,
                         "SELECT calls, round(total_exec_time::numeric / calls * 1000), "
                         "rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 60) FROM "
                         "pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8");
    std::printf("  %8s %10s %8s  %s\n", "calls", "us/call", "rows", "statement");
    for (int i = 0; i < PQntuples(r); ++i)
        std::printf("  %8s %10s %8s  %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                    PQgetvalue(r, i, 2), PQgetvalue(r, i, 3));
    PQclear(r);
    PQfinish(c);
}

// A fresh server for one run, so that no run pays for what an earlier one left (autovacuum of
// its tables, a checkpoint of its writes).
std::unique_ptr<delayq_pg_test::pg_server> fresh_server(const std::vector<std::string>& settings) {
    auto srv = std::make_unique<delayq_pg_test::pg_server>(settings);
    if (!settings.empty()) srv->exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    return srv;
}

void e2e(const std::vector<std::string>& settings, const config& cfg) {
    const bool node = cfg.only != "delayq" && cfg.only != "worker" && node_ready();
    if (cfg.only != "delayq" && cfg.only != "worker" && !node)
        std::printf("pg-boss / graphile-worker skipped: no node, or no `npm install` in %s\n",
                    node_dir().c_str());
    std::map<std::string, std::vector<figures>> runs;
    std::string boss_version = "?", graphile_version = "?";
    for (int r = 0; r < cfg.repeat; ++r) {
        // The plain loop and the worker, in turn first.
        for (const char* mode :
             {r % 2 ? "worker" : "single", r % 2 ? "single" : "worker", "batch"}) {
            const bool worker = std::string(mode) == "worker";
            const bool single = std::string(mode) == "single" || worker;
            if (!single && cfg.only == "worker") continue;
            const int jobs = single ? cfg.jobs : cfg.batch_jobs;
            const auto server = fresh_server(settings);
            auto d = delayq_e2e(*server, jobs, single ? 1 : 100, r, worker);
            runs[std::string("delayq ") + mode].push_back(d);
            std::printf("round %d delayq %s: %.0f jobs/s, server %.0f us/job, client %.0f us/job\n",
                        r + 1, mode, d.jobs_per_s, d.server_us, d.client_us);
            if (!settings.empty()) print_profile(*server);
            if (!node || worker) continue;
            for (const char* lib : {"pgboss", "graphile"}) {
                std::string& v = std::string(lib) == "pgboss" ? boss_version : graphile_version;
                // The Node libraries are slower: fewer jobs keep a round's time in bounds.
                if (auto f = node_e2e(*fresh_server(settings), lib,
                                      single ? cfg.jobs / 4 : cfg.batch_jobs / 4, mode, v)) {
                    runs[std::string(lib) + " " + mode].push_back(*f);
                    std::printf(
                        "round %d %s %s: %.0f jobs/s, server %.0f us/job, client %.0f "
                        "us/job\n",
                        r + 1, lib, mode, f->jobs_per_s, f->server_us, f->client_us);
                }
            }
            std::fflush(stdout);
        }
    }
    std::printf("\nmedians of %d rounds (pg-boss %s, graphile-worker %s):\n", cfg.repeat,
                boss_version.c_str(), graphile_version.c_str());
    std::printf("%-18s %12s %16s %16s\n", "", "jobs/s", "server us/job", "client us/job");
    std::map<std::string, figures> med;
    for (const auto& [name, v] : runs) {
        figures m;
        std::vector<double> a, b, c;
        for (const auto& f : v) {
            a.push_back(f.jobs_per_s);
            b.push_back(f.server_us);
            c.push_back(f.client_us);
        }
        m.jobs_per_s = median(a);
        m.server_us = median(b);
        m.client_us = median(c);
        med[name] = m;
        std::printf("%-18s %12.0f %16.0f %16.0f\n", name.c_str(), m.jobs_per_s, m.server_us,
                    m.client_us);
    }
    if (runs.count("delayq worker")) {  // round by round: the median of the rounds' ratios
        const auto& p = runs["delayq single"];
        const auto& w = runs["delayq worker"];
        std::vector<double> rate, server, client;
        for (std::size_t i = 0; i < p.size() && i < w.size(); ++i) {
            rate.push_back(w[i].jobs_per_s / p[i].jobs_per_s);
            server.push_back(w[i].server_us / p[i].server_us);
            client.push_back(w[i].client_us / p[i].client_us);
        }
        std::printf(
            "worker / plain loop (single calls, one shared object, one worker of 4 threads; the "
            "median of the rounds' ratios): jobs/s %.2fx, server CPU/job %.2fx, client CPU/job "
            "%.2fx\n",
            median(rate), median(server), median(client));
    }
    for (const char* mode : {"single", "batch"}) {
        const std::string m = mode;
        if (!med.count("pgboss " + m) || !med.count("graphile " + m)) continue;
        const auto& d = med["delayq " + m];
        const auto& a = med["pgboss " + m];
        const auto& g = med["graphile " + m];
        const auto& fast = a.jobs_per_s >= g.jobs_per_s ? a : g;
        std::printf(
            "%s: delayq / the faster library (%s): jobs/s %.2fx, server CPU/job %.2fx, "
            "client CPU/job %.2fx\n",
            mode, &fast == &a ? "pg-boss" : "graphile-worker", d.jobs_per_s / fast.jobs_per_s,
            d.server_us / fast.server_us, d.client_us / fast.client_us);
    }
}

// Statements an idle consumer sends, from a server of its own that logs every statement.
void idle(int secs) {
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|"});
    auto o = queue_options(srv, "idle");
    o.conninfo += " application_name=idle-consumer";
    delayq::postgres::delay_queue q(o);
    const auto count = [&] {
        std::ifstream in(srv.log());
        long n = 0;
        for (std::string line; std::getline(in, line);)
            if (line.rfind("idle-consumer|", 0) == 0 &&
                line.find("statement:") != std::string::npos)
                ++n;
        return n;
    };
    std::thread t([&] { q.take(std::chrono::hours(1)); });
    std::this_thread::sleep_for(1s);  // past the take's first claim
    const long before = count();
    std::this_thread::sleep_for(std::chrono::seconds(secs));
    const long during = count() - before;
    std::printf(
        "idle consumer: %ld statements in %d s = %.2f statements/s (take(1h) on an empty "
        "queue)\n",
        during, secs, static_cast<double>(during) / secs);
    delayq::postgres::delay_queue(queue_options(srv, "idle")).put_after("stop", "", 0ms);
    t.join();
}

// p50, p99 and max of `v` (sorted here), in the units of `v`.
std::string percentiles(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const auto at = [&](double p) {
        return v[std::min(v.size() - 1,
                          static_cast<std::size_t>(p * static_cast<double>(v.size())))];
    };
    char out[96];
    std::snprintf(out, sizeof out, "p50 %.0f us, p99 %.0f us, max %.0f us", at(0.5), at(0.99),
                  v.back());
    return out;
}

// How soon a put wakes a waiting take in another object, and where the time goes: the put itself
// (its commit waits for the disk, then the wake-up sends NOTIFY), the notification's way to a
// listening connection (a plain libpq one beside the queue's), and the take's claim.
void wake(const delayq_pg_test::pg_server& srv, int rounds) {
    delayq::postgres::delay_queue consumer(queue_options(srv, "wake"));
    delayq::postgres::delay_queue producer(queue_options(srv, "wake"));
    PGconn* raw = PQconnectdb(srv.conninfo().c_str());
    PQclear(PQexec(raw, ("LISTEN " + consumer.channel()).c_str()));
    using us_t = std::chrono::duration<double, std::micro>;
    // From the put's call and from its return to the take's return; the put's call to its return;
    // its return to the notification at the plain listener.
    std::vector<double> from_call, from_return, put_us, notified_us;
    for (int i = 0; i < rounds; ++i) {
        std::atomic<bool> waiting{false};
        clk::time_point got, heard;
        std::thread t([&] {
            waiting = true;
            auto j = consumer.take(10s);
            got = clk::now();
            if (j) consumer.ack(*j);
        });
        std::thread listener([&] {
            for (;;) {
                pollfd fd{PQsocket(raw), POLLIN, 0};
                ::poll(&fd, 1, 10000);
                PQconsumeInput(raw);
                if (PGnotify* n = PQnotifies(raw)) {
                    heard = clk::now();
                    PQfreemem(n);
                    return;
                }
            }
        });
        while (!waiting) std::this_thread::yield();
        std::this_thread::sleep_for(20ms);  // asleep, listening
        const auto put = clk::now();
        std::string id = "w";
        id += std::to_string(i);
        producer.put_after(id, "", 0ms);
        const auto returned = clk::now();
        t.join();
        listener.join();
        from_call.push_back(us_t(got - put).count());
        from_return.push_back(us_t(got - returned).count());
        put_us.push_back(us_t(returned - put).count());
        notified_us.push_back(us_t(heard - returned).count());
    }
    PQfinish(raw);
    // The claim alone: take(0) of a job that is due.
    std::vector<double> claim_us;
    for (int i = 0; i < rounds; ++i) {
        std::string id = "c";
        id += std::to_string(i);
        producer.put_after(id, "", 0ms);
        const auto t0 = clk::now();
        auto j = consumer.take(0ms);
        claim_us.push_back(us_t(clk::now() - t0).count());
        if (j) consumer.ack(*j);
    }
    std::printf("wake-up, %d rounds (a take waiting in another object):\n", rounds);
    std::printf("  put called -> take returned:    %s\n", percentiles(from_call).c_str());
    std::printf("  put returned -> take returned:  %s\n", percentiles(from_return).c_str());
    std::printf("  the put (commit on disk, NOTIFY): %s\n", percentiles(put_us).c_str());
    std::printf("  put returned -> NOTIFY at a plain listener: %s\n",
                percentiles(notified_us).c_str());
    std::printf("  a claim of a due job (take(0)):  %s\n", percentiles(claim_us).c_str());
}

// The transactional put beside an INSERT of the application's, inside one transaction each.
void tx(const delayq_pg_test::pg_server& srv) {
    delayq::postgres::delay_queue q(queue_options(srv, "tx"));
    PGconn* c = PQconnectdb(srv.conninfo().c_str());
    const auto exec = [&](const std::string& sql) { PQclear(PQexec(c, sql.c_str())); };
    exec("CREATE TABLE IF NOT EXISTS orders(id text PRIMARY KEY, note text)");
    constexpr int n = 2000;
    double put_us = 0, insert_us = 0;
    for (int i = 0; i < n; ++i) {
        std::string id = "o";  // appended: g++ 12 warns wrongly of -Wrestrict in "o" + to_string
        id += std::to_string(i);
        exec("BEGIN");
        auto t0 = clk::now();
        q.put_after_in_transaction(c, id, payload16, 30min);
        auto t1 = clk::now();
        exec("INSERT INTO orders VALUES ('" + id + "', 'x')");
        auto t2 = clk::now();
        exec("COMMIT");
        put_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
        insert_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
    }
    std::printf(
        "in a transaction: put_after_in_transaction %.0f us, an INSERT of the "
        "application's %.0f us (means of %d; one round trip each)\n",
        put_us / n, insert_us / n, n);
    PQfinish(c);

    // Commits a second of 4 connections, each looping BEGIN; one statement; COMMIT for 3 s: an
    // INSERT of the application's, then put_after_in_transaction (whose NOTIFY makes the commits
    // take turns: PostgreSQL holds its notification lock through each commit's flush).
    for (const bool put : {false, true}) {
        std::atomic<long> commits{0};
        std::atomic<bool> stop{false};
        std::vector<std::thread> ts;
        for (int t = 0; t < 4; ++t)
            ts.emplace_back([&, t] {
                PGconn* own = PQconnectdb(srv.conninfo().c_str());
                for (long i = 0; !stop; ++i) {
                    std::string id = put ? "p" : "i";
                    id += std::to_string(t) + "-" + std::to_string(i);
                    PQclear(PQexec(own, "BEGIN"));
                    if (put)
                        q.put_after_in_transaction(own, id, payload16, 30min);
                    else
                        PQclear(
                            PQexec(own, ("INSERT INTO orders VALUES ('" + id + "', 'x')").c_str()));
                    PQclear(PQexec(own, "COMMIT"));
                    ++commits;
                }
                PQfinish(own);
            });
        std::this_thread::sleep_for(3s);
        stop = true;
        for (auto& t : ts) t.join();
        std::printf("4 connections committing %s: %.0f commits/s\n",
                    put ? "put_after_in_transaction" : "an INSERT of the application's",
                    static_cast<double>(commits) / 3.0);
    }
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const std::string v = argv[i + 1];
        if (a == "--jobs")
            cfg.jobs = std::stoi(v);
        else if (a == "--batch-jobs")
            cfg.batch_jobs = std::stoi(v);
        else if (a == "--repeat")
            cfg.repeat = std::stoi(v);
        else if (a == "--idle-seconds")
            cfg.idle_seconds = std::stoi(v);
        else if (a == "--wakes")
            cfg.wakes = std::stoi(v);
        else if (a == "--only")
            cfg.only = v;
        else if (a == "--durable-leases")
            durable_leases = v == "1";
        else {
            std::fprintf(stderr,
                         "usage: bench_postgres [--jobs N] [--batch-jobs N] [--repeat R] "
                         "[--idle-seconds S] [--wakes N] [--only e2e|delayq|worker|idle|wake|tx] "
                         "[--durable-leases 0|1]\n");
            return 2;
        }
    }
    const auto want = [&](const char* what) {
        return cfg.only.empty() || cfg.only == what ||
               ((cfg.only == "delayq" || cfg.only == "worker") && std::string(what) == "e2e");
    };
    // Extra server settings for a profile, e.g. "shared_preload_libraries=pg_stat_statements".
    std::vector<std::string> settings;
    if (const char* env = std::getenv("DELAYQ_BENCH_PG_SETTINGS"); env != nullptr && *env != '\0') {
        std::istringstream words(env);
        for (std::string w; words >> w;) settings.push_back(w);
    }
    delayq_pg_test::pg_server srv(settings);
    if (!settings.empty()) srv.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    std::printf("PostgreSQL %s (private server, default settings)\n",
                srv.query("SHOW server_version").c_str());
    if (want("e2e")) e2e(settings, cfg);
    if (want("wake")) wake(srv, cfg.wakes);
    if (want("tx")) tx(srv);
    if (want("idle")) idle(cfg.idle_seconds);
    if (!settings.empty()) print_profile(srv);
    return 0;
}
