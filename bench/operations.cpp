// operations: what an operator's calls cost as a queue grows. For each backend built in
// (SQLite, Redis, PostgreSQL), a fresh store at each size (--sizes, 10 000 and 1 000 000 jobs by
// default): the jobs put in batches of 500, 1 % of them due now and the rest due in 1 to 25 hours
// (a queue of timeouts), and 1 000 dead letters; then the median of --calls calls of stats(),
// get() of a random queued id, dead(100) (the first page), jobs(waiting, 100) (the first page, and
// the page after a random queued id), and of 5 runs of the `delayq`
// command's `stats` (a process of its own: its start, connect and one stats()), with the ratio of
// the largest size to the smallest beside each; and, on an empty queue of the same store, the
// median of 5 `stop()`s of a delayq::worker whose 4 threads wait in their takes.
//
//   operations [--backend sqlite|redis|postgres|all] [--sizes N,M,...] [--calls C]
//
// Redis and PostgreSQL run on servers this program starts (tests/redis/redis_server.hpp,
// tests/postgres/pg_server.hpp), one per size.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/worker.hpp>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#ifdef DELAYQ_BENCH_SQLITE
#include <delayq/sqlite/delay_queue.hpp>
#include <filesystem>
#endif
#ifdef DELAYQ_BENCH_REDIS
#include "redis_server.hpp"
#endif
#ifdef DELAYQ_BENCH_POSTGRES
#include <delayq/postgres/delay_queue.hpp>

#include "pg_server.hpp"
#endif

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct row {
    std::string backend;
    std::size_t jobs = 0;
    double fill_s = 0, stats_us = 0, get_us = 0, dead_us = 0, page_us = 0, page_after_us = 0,
           command_ms = 0, stop_ms = 0;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <class F>
double median_us(int calls, F f) {
    std::vector<double> v;
    for (int i = 0; i < calls; ++i) {
        const auto t = clock_type::now();
        f();
        v.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t).count());
    }
    return median(std::move(v));
}

// Fills `q` with 1 000 dead letters, then `jobs` jobs; returns the seconds it took.
template <class Q>
double fill(Q& q, std::size_t jobs) {
    const auto t = clock_type::now();
    for (int i = 0; i < 1000; ++i)
        q.put_after("dead-" + std::to_string(i), "payload", milliseconds(0));
    for (int buried = 0; buried < 1000;)
        for (const auto& j : q.take_many(500, std::chrono::seconds(5)))
            buried += q.bury(j, "failed") ? 1 : 0;
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<long long> later(3'600'000, 25 * 3'600'000LL);
    std::vector<std::string> ids;
    std::vector<delayq::put_request> batch;
    for (std::size_t i = 0; i < jobs;) {
        ids.clear();
        batch.clear();
        const std::size_t first = i;
        for (std::size_t k = 0; k < 500 && i < jobs; ++k, ++i)
            ids.push_back("job-" + std::to_string(i));
        for (std::size_t k = 0; k < ids.size(); ++k)
            batch.push_back(
                {ids[k], "payload", milliseconds((first + k) % 100 == 0 ? 0 : later(rng))});
        q.put_many(batch);
    }
    return std::chrono::duration<double>(clock_type::now() - t).count();
}

double command_ms(const std::string& url) {
    std::vector<double> v;
    for (int i = 0; i < 5; ++i) {
        const auto t = clock_type::now();
        const std::string cmd = std::string(DELAYQ_COMMAND) + " '" + url + "' stats >/dev/null";
        if (std::system(cmd.c_str()) != 0) return -1;
        v.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t).count());
    }
    return median(std::move(v));
}

// How long stop() of a worker takes when its 4 threads wait in their takes on the empty queue
// `q`: the median of 5.
template <class Q>
double worker_stop_ms(Q& q) {
    std::vector<double> v;
    for (int i = 0; i < 5; ++i) {
        delayq::worker w(q, [](const delayq::job&) {}, {.threads = 4});
        std::this_thread::sleep_for(milliseconds(300));  // every thread in its take by then
        const auto t = clock_type::now();
        w.stop();
        v.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t).count());
    }
    return median(std::move(v));
}

template <class Q>
row measure(const char* backend, Q& q, Q& empty, std::size_t jobs, int calls,
            const std::string& url) {
    row r;
    r.backend = backend;
    r.jobs = jobs;
    r.fill_s = fill(q, jobs);
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<std::size_t> pick(0, jobs - 1);
    r.stats_us = median_us(calls, [&] { (void)q.stats(); });
    r.get_us = median_us(calls, [&] {
        if (!q.get("job-" + std::to_string(pick(rng)))) std::abort();
    });
    r.dead_us = median_us(calls, [&] {
        if (q.dead(100, "").size() != 100) std::abort();
    });
    r.page_us = median_us(calls, [&] {
        if (q.jobs(delayq::job_state::waiting, 100).size() != 100) std::abort();
    });
    r.page_after_us = median_us(calls, [&] {
        (void)q.jobs(delayq::job_state::waiting, 100, "job-" + std::to_string(pick(rng)));
    });
    r.command_ms = command_ms(url);
    r.stop_ms = worker_stop_ms(empty);
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    std::string backend = "all";
    std::vector<std::size_t> sizes{10'000, 1'000'000};
    int calls = 50;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--backend") {
            backend = v;
        } else if (a == "--calls") {
            calls = std::max(1, std::atoi(v.c_str()));
        } else if (a == "--sizes") {
            sizes.clear();
            std::stringstream in(v);
            for (std::string s; std::getline(in, s, ',');) sizes.push_back(std::stoull(s));
        } else {
            std::fprintf(stderr,
                         "usage: %s [--backend sqlite|redis|postgres|all] [--sizes N,M] "
                         "[--calls C]\n",
                         argv[0]);
            return 2;
        }
    }
    std::vector<row> rows;
    for (const std::size_t n : sizes) {
#ifdef DELAYQ_BENCH_SQLITE
        if (backend == "all" || backend == "sqlite") {
            const auto dir = std::filesystem::temp_directory_path() /
                             ("delayq-bench-ops-" + std::to_string(::getpid()));
            std::filesystem::create_directories(dir);
            delayq::sqlite::options o;
            o.path = (dir / "q.db").string();
            o.durable_puts = false;
            delayq::sqlite::options e = o;
            e.path = (dir / "empty.db").string();
            {
                delayq::sqlite::delay_queue q(o), empty(e);
                rows.push_back(measure("sqlite", q, empty, n, calls, "sqlite:" + o.path));
            }
            std::filesystem::remove_all(dir);
        }
#endif
#ifdef DELAYQ_BENCH_REDIS
        if (backend == "all" || backend == "redis") {
            delayq_test::redis_server srv;
            auto o = delayq_test::queue_options(srv.port(), "ops");
            delayq::redis::delay_queue q(o);
            delayq::redis::delay_queue empty(delayq_test::queue_options(srv.port(), "empty"));
            rows.push_back(measure("redis", q, empty, n, calls,
                                   "redis://127.0.0.1:" + std::to_string(srv.port()) + "/ops"));
        }
#endif
#ifdef DELAYQ_BENCH_POSTGRES
        if (backend == "all" || backend == "postgres") {
            delayq_pg_test::pg_server srv;
            delayq::postgres::options o;
            o.conninfo = srv.conninfo();
            o.name = "ops";
            delayq::postgres::delay_queue q(o);
            o.name = "empty";
            delayq::postgres::delay_queue empty(o);
            rows.push_back(measure("postgres", q, empty, n, calls,
                                   "postgresql://postgres@127.0.0.1:" + std::to_string(srv.port()) +
                                       "/postgres?queue=ops"));
        }
#endif
    }
    std::printf(
        "| backend | jobs | fill, s | stats() | get() | dead(100) | jobs(waiting, 100) | the "
        "same after an id | `delayq URL stats` | worker stop(), empty queue |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& r : rows)
        std::printf(
            "| %s | %zu | %.1f | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %.0f ms | %.1f "
            "ms |\n",
            r.backend.c_str(), r.jobs, r.fill_s, r.stats_us, r.get_us, r.dead_us, r.page_us,
            r.page_after_us, r.command_ms, r.stop_ms);
    // The largest size over the smallest, per backend.
    for (const auto& big : rows)
        for (const auto& small : rows)
            if (big.backend == small.backend && big.jobs == sizes.back() &&
                small.jobs == sizes.front() && big.jobs != small.jobs)
                std::printf(
                    "%s, %zu / %zu jobs: stats %.2fx, get %.2fx, dead(100) %.2fx, jobs(100) "
                    "%.2fx, after an id %.2fx, command %.2fx\n",
                    big.backend.c_str(), big.jobs, small.jobs, big.stats_us / small.stats_us,
                    big.get_us / small.get_us, big.dead_us / small.dead_us,
                    big.page_us / small.page_us, big.page_after_us / small.page_after_us,
                    big.command_ms / small.command_ms);
    return 0;
}
