// End-to-end figures of delayq::sqlite's queue, beside delayq::redis's on a local redis-server
// that this program starts itself (no persistence; `--port P` uses a running server) where the
// program is built with hiredis, and the reopening of a large SQLite queue.
//
//   bench_sqlite [--jobs N] [--batch-jobs N] [--repeat R] [--port P] [--reopen-jobs N]
//                [--only e2e|worker|reopen]
//
// 1. e2e: the SQLite queue beside the Redis one (a queue file in a fresh temporary directory,
//    every put fsynced): R rounds of the Redis queue's two end-to-end runs (bench_redis's 2.:
//    single calls, N jobs; batches of 100, --batch-jobs jobs), each followed by the same run on a
//    sqlite::delay_queue in the same process, jobs/s and client CPU per job (the SQLite queue's
//    whole cost: it has no server) side by side with the ratios sqlite / redis. Built without
//    hiredis, the SQLite queue's runs alone. Each round's SQLite single-call run is followed by
//    the same run with the 4 consumers replaced by one delayq::worker of 4 threads on the shared
//    object (its handler counting the job, on a fresh queue file), with the ratios worker / plain
//    loop; `--only worker` runs those two alone;
// 2. reopen: reopening an SQLite queue of 1M pending jobs (--reopen-jobs; put_many of 500, delays
//    U[0, 2 s]): the time to open it in a fresh object and take the first due job, and the
//    resident memory that added (/proc/self/statm) per pending job.
// Without --only, both. (`--only sqlite` and `--only sqlite-reopen`, the names these runs had in
// bench_redis, are e2e and reopen.) The end-to-end run itself, and the series' medians as
// printed: bench/job_queue_bench.hpp.
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/sqlite/delay_queue.hpp>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../job_queue_bench.hpp"

#if DELAYQ_BENCH_REDIS
#include <delayq/redis/delay_queue.hpp>

#include "redis_server.hpp"
#endif

using namespace std::chrono_literals;
using namespace delayq_bench;

namespace {

struct config {
    int jobs = 100'000;        // for the single-call runs: the 2 s delay window is a small part
    int batch_jobs = 200'000;  // for the batched runs
    int repeat = 3;
    int port = 0;
    int reopen_jobs = 1'000'000;
    std::string only;
};

// A fresh directory under the system's temporary one (the same disk: the fsyncs are real),
// removed with everything in it at the end.
class temp_dir {
  public:
    temp_dir() {
        std::string pattern = std::filesystem::temp_directory_path() / "delayq-bench-XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = pattern;
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    std::string file(const std::string& name) const { return (path_ / name).string(); }

  private:
    std::filesystem::path path_;
};

std::unique_ptr<delayq::sqlite::delay_queue> sqlite_queue(const std::string& path) {
    delayq::sqlite::options o;
    o.path = path;  // the defaults otherwise: every put fsynced
    return std::make_unique<delayq::sqlite::delay_queue>(o);
}

// One end-to-end run on an SQLite queue: jobs/s, and this process's CPU per job, which is the
// queue's whole cost (no server; the redis-server is idle meanwhile).
figures measured_locally(delayq::sqlite::delay_queue& q, const run_shape& shape) {
    (void)q.size();
    const double client0 = own_cpu();
    const double switches0 = own_switches();
    lateness late;
    figures f;
    f.jobs_per_s = end_to_end(q, shape, late);
    f.client_us = (own_cpu() - client0) * 1e6 / (shape.jobs / 4 * 4);
    f.switches = (own_switches() - switches0) / (shape.jobs / 4 * 4);
    f.lateness = late.report();
    return f;
}

// The medians of the Redis and SQLite series side by side, with the ratios sqlite / redis.
void print_sqlite_table(const series& rs, const series& ss, const series& rb, const series& sb) {
    const auto ratio = [](double a, double b) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f×", a / b);
        return std::string(buf);
    };
    std::printf(
        "\nper job, medians | delayq-redis single | delayq-sqlite single | sqlite / redis | "
        "delayq-redis batched | delayq-sqlite batched | sqlite / redis\n"
        "|---|---|---|---|---|---|---|\n");
    std::printf("| end-to-end jobs/s | %.0f | %.0f | %s | %.0f | %.0f | %s |\n", rs.jobs_per_s(),
                ss.jobs_per_s(), ratio(ss.jobs_per_s(), rs.jobs_per_s()).c_str(), rb.jobs_per_s(),
                sb.jobs_per_s(), ratio(sb.jobs_per_s(), rb.jobs_per_s()).c_str());
    std::printf("| client CPU | %.1f µs | %.1f µs | %s | %.1f µs | %.1f µs | %s |\n",
                rs.client_us(), ss.client_us(), ratio(ss.client_us(), rs.client_us()).c_str(),
                rb.client_us(), sb.client_us(), ratio(sb.client_us(), rb.client_us()).c_str());
    std::printf(
        "| client + redis-server CPU | %.1f µs | %.1f µs | %s | %.1f µs | %.1f µs | %s |\n\n",
        rs.client_us() + rs.server_us(), ss.client_us(),
        ratio(ss.client_us(), rs.client_us() + rs.server_us()).c_str(),
        rb.client_us() + rb.server_us(), sb.client_us(),
        ratio(sb.client_us(), rb.client_us() + rb.server_us()).c_str());
}

// The Redis queue's two end-to-end runs and the SQLite queue's, round by round, so that a machine
// that gets busier or quieter weighs on both. Built without hiredis: the SQLite queue's alone.
// `--only worker`: the SQLite queue's single calls and its worker alone.
void sqlite_beside_redis(const config& cfg) {
    temp_dir dir;
    const bool all = cfg.only != "worker";
    series rs{"delayq-redis end to end (single calls: put_after, take, ack)", cfg.jobs, {}};
    series ss{"delayq-sqlite end to end (single calls: put_after, take, ack; durable puts)",
              cfg.jobs,
              {}};
    series sw{
        "delayq::worker on delayq-sqlite end to end (4 threads, on the object shared by the 8 "
        "threads; durable puts)",
        cfg.jobs,
        {}};
    series rb{"delayq-redis end to end (batches of 100)", cfg.batch_jobs, {}};
    series sb{"delayq-sqlite end to end (batches of 100; durable puts)", cfg.batch_jobs, {}};
    const auto add = [](series& to, const char* what, int round, const figures& f) {
        to.runs.push_back(f);
        char server[64] = "";
        if (f.server_us > 0)
            std::snprintf(server, sizeof server, ", redis-server CPU %.1f µs", f.server_us);
        std::printf("  round %d, %s: %.0f jobs/s, per job client CPU %.1f µs%s\n", round + 1, what,
                    f.jobs_per_s, f.client_us, server);
    };
    for (int i = 0; i < cfg.repeat; ++i) {
        const std::string n = std::to_string(i);
#if DELAYQ_BENCH_REDIS
        if (all) {
            delayq::redis::delay_queue q(
                delayq_test::queue_options(cfg.port, "bench-sq-redis-1-" + n));
            add(rs, "delayq-redis single", i, measured(cfg.port, q, {cfg.jobs, 0, 1, 0}));
        }
#endif
        for (const bool w :
             {i % 2 != 0, i % 2 == 0})  // the plain loop and the worker, in turn first
            add(w ? sw : ss, w ? "delayq::worker on delayq-sqlite" : "delayq-sqlite single", i,
                measured_locally(*sqlite_queue(dir.file((w ? "worker-" : "single-") + n + ".db")),
                                 {cfg.jobs, 0, 1, 0, w}));
        if (!all) continue;
#if DELAYQ_BENCH_REDIS
        {
            delayq::redis::delay_queue q(
                delayq_test::queue_options(cfg.port, "bench-sq-redis-100-" + n));
            add(rb, "delayq-redis batched", i, measured(cfg.port, q, {cfg.batch_jobs, 0, 100, 0}));
        }
#endif
        add(sb, "delayq-sqlite batched", i,
            measured_locally(*sqlite_queue(dir.file("batched-" + n + ".db")),
                             {cfg.batch_jobs, 0, 100, 0}));
    }
    for (const series* s : {&rs, &ss, &sw, &rb, &sb}) s->print();
    if (!rs.runs.empty()) print_sqlite_table(rs, ss, rb, sb);
    print_worker_beside(ss, sw, "the SQLite queue, one shared object, one worker of 4 threads");
}

// This process's resident memory in bytes (/proc/self/statm, resident pages).
long long resident_bytes() {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    long long size = 0, resident = 0;
    if (f != nullptr) {
        if (std::fscanf(f, "%lld %lld", &size, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return resident * ::sysconf(_SC_PAGESIZE);
}

// Fills a queue file with `n` pending jobs (put_many of 500, 10-byte ids, 16-byte payloads,
// delays U[0, 2 s]), closes it, opens it in a fresh object and takes the first due job.
void sqlite_reopen(int n) {
    temp_dir dir;
    const std::string path = dir.file("reopen.db");
    const auto fill_start = clk::now();
    {
        auto q = sqlite_queue(path);
        std::mt19937 rng(1);
        std::uniform_int_distribution<int> delay(0, 2000);
        std::vector<std::string> ids;
        std::vector<delayq::sqlite::delay_queue::put_request> reqs;
        for (int i = 0; i < n; i += 500) {
            ids.clear();
            reqs.clear();
            for (int k = i; k < std::min(n, i + 500); ++k) {
                char id[16];
                std::snprintf(id, sizeof id, "j%09d", k);
                ids.emplace_back(id);
            }
            for (const auto& id : ids)
                reqs.push_back({id, payload16, std::chrono::milliseconds(delay(rng))});
            q->put_many(reqs);
        }
    }
    const double fill_s = seconds(clk::now() - fill_start);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    ::malloc_trim(0);  // what the filler freed must not count as resident before the reopen
    const long long before = resident_bytes();
    const auto open_start = clk::now();
    auto q = sqlite_queue(path);
    const auto opened = clk::now();
    const auto j = q->take(10s);
    const auto took = clk::now();
    const long long after = resident_bytes();
    std::printf(
        "sqlite reopen: filled %d jobs in %.2f s (%.0f puts/s, put_many of 500), file %.1f MB "
        "(%.0f B a job)\n"
        "  reopen: open %.2f ms, first take of a due job %.2f ms (%s), in all %.2f ms; resident "
        "memory +%.2f MB = %.2f B per pending job\n",
        n, fill_s, n / fill_s, static_cast<double>(bytes) / 1e6, static_cast<double>(bytes) / n,
        std::chrono::duration<double, std::milli>(opened - open_start).count(),
        std::chrono::duration<double, std::milli>(took - opened).count(), j ? "got one" : "none",
        std::chrono::duration<double, std::milli>(took - open_start).count(),
        static_cast<double>(after - before) / 1e6, static_cast<double>(after - before) / n);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF,
                 0);  // progress shows as it comes, in a pipe or a file too
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const std::string value = argv[i + 1];
        const int v = std::atoi(argv[i + 1]);
        if (a == "--only" && (value == "e2e" || value == "sqlite"))
            cfg.only = "e2e";
        else if (a == "--only" && value == "worker")
            cfg.only = "worker";
        else if (a == "--only" && (value == "reopen" || value == "sqlite-reopen"))
            cfg.only = "reopen";
        else if (a == "--jobs")
            cfg.jobs = v;
        else if (a == "--batch-jobs")
            cfg.batch_jobs = v;
        else if (a == "--repeat")
            cfg.repeat = std::max(1, v);
        else if (a == "--port")
            cfg.port = v;
        else if (a == "--reopen-jobs")
            cfg.reopen_jobs = std::max(1, v);
        else {
            std::fprintf(stderr,
                         "usage: %s [--jobs N] [--batch-jobs N] [--repeat R] [--port P] "
                         "[--reopen-jobs N] [--only e2e|worker|reopen]\n",
                         argv[0]);
            return 2;
        }
    }
    const auto want = [&](const char* part) { return cfg.only.empty() || cfg.only == part; };
    if (want("e2e") || cfg.only == "worker") {
#if DELAYQ_BENCH_REDIS
        std::unique_ptr<delayq_test::redis_server> own;
        if (cfg.port == 0) {
            own = std::make_unique<delayq_test::redis_server>(
                std::vector<std::string>{"--appendonly", "no"});
            cfg.port = own->port();
        }
        std::printf("redis-server on 127.0.0.1:%d; %u hardware threads\n", cfg.port,
                    std::thread::hardware_concurrency());
#else
        std::printf("built without hiredis: the SQLite queue's runs alone; %u hardware threads\n",
                    std::thread::hardware_concurrency());
#endif
        sqlite_beside_redis(cfg);
    }
    if (want("reopen")) sqlite_reopen(cfg.reopen_jobs);
}
