// What bench/redis/bench_redis.cpp and bench/sqlite/bench_sqlite.cpp share: the end-to-end run of
// a job queue (4 producers put jobs due U[0, 2 s], 4 consumers take and ack until every job is
// acked; single calls or batches; or the consumers replaced by delayq::worker), its lateness, the
// client's CPU, and the series of runs with their medians as both programs print them. With
// DELAYQ_BENCH_REDIS (the program is built with delayq::redis and tests/redis on its include path)
// also the Redis server's side: a command on a fresh connection, redis-server's CPU, and a run
// measured with both.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/worker.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if DELAYQ_BENCH_REDIS
#include "redis_server.hpp"
#endif

namespace delayq_bench {

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using sys = std::chrono::system_clock;

inline std::string id_of(int run, int i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%d:%07d", run, i);
    return buf;
}

inline const std::string payload16 = "0123456789abcdef";

inline double seconds(clk::duration d) {
    return std::chrono::duration<double>(d).count();
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

inline std::string list(const std::vector<double>& v) {
    std::string s;
    for (double x : v) s += (s.empty() ? "" : ", ") + std::to_string(static_cast<long>(x));
    return s;
}

// The number after `key` in `s` (an INFO field "name:", a JSON key "\"name\":"), if there.
inline std::optional<double> number_after(const std::string& s, const std::string& key) {
    const auto at = s.find(key);
    if (at == std::string::npos) return std::nullopt;
    return std::strtod(s.c_str() + at + key.size(), nullptr);
}

// This process's CPU time so far, every thread, user + system, in seconds. The redis-server it
// started is another process, and counts only in server_cpu().
inline double own_cpu() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
    return s(u.ru_utime) + s(u.ru_stime);
}

// This process's context switches so far, every thread, voluntary (a thread blocked: waiting for a
// reply, a lock, a wake) and involuntary (preempted).
inline double own_switches() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_nvcsw) + static_cast<double>(u.ru_nivcsw);
}

struct lateness {
    std::mutex m;
    std::vector<double> ms;
    void add(sys::time_point deadline) {
        const double late =
            std::chrono::duration<double, std::milli>(sys::now() - deadline).count();
        std::lock_guard lk(m);
        ms.push_back(late);
    }
    std::string report() {
        std::sort(ms.begin(), ms.end());
        auto at = [&](double q) {
            return ms[std::min(ms.size() - 1,
                               static_cast<std::size_t>(q * static_cast<double>(ms.size())))];
        };
        char buf[128];
        std::snprintf(buf, sizeof buf, "lateness p50 %.2f ms, p99 %.2f ms, max %.2f ms", at(0.5),
                      at(0.99), ms.back());
        return buf;
    }
};

struct run_shape {
    int jobs = 0;
    double rate = 0;         // > 0: producers paced to this many jobs/s in all
    int batch = 1;           // > 1: put_many / take_many / ack_many of this many
    int busy_consumers = 0;  // that many consumers work 5 ms on every job they take
    // The consumers are delayq::worker (single calls only): one worker for each consumers' object,
    // with a thread for each consumer on it; the handler does what the plain loop does between
    // take and ack.
    bool worker = false;
};

// The queue object of each of the 8 threads of a run: producers 0-3, then consumers 0-3. One
// object shared by all, or one object each.
template <class Queue>
using objects = std::array<Queue*, 8>;

template <class Queue>
objects<Queue> everyone(Queue& q) {
    objects<Queue> all;
    all.fill(&q);
    return all;
}

// Producers put the jobs due U[0, 2 s]; consumers take and ack until every job is acked (with
// shape.worker: the workers' handlers have seen every job, and the workers have stopped, which
// waits for the last acks). Returns jobs/s; `late` gets every job's lateness.
template <class Queue>
double end_to_end_each(const objects<Queue>& qs, const run_shape& shape, lateness& late) {
    std::atomic<int> acked{0};
    const int per = shape.jobs / 4;
    const int total = per * 4;
    static std::atomic<int> run{0};
    const int r = ++run;
    const auto start = clk::now();
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            Queue& q = *qs[static_cast<std::size_t>(p)];
            std::mt19937 rng(static_cast<unsigned>(p + 1));
            std::uniform_int_distribution<int> delay(0, 2000);
            std::vector<std::string> ids;
            std::vector<typename Queue::put_request> reqs;
            for (int i = 0; i < per; ++i) {
                if (shape.rate > 0)
                    std::this_thread::sleep_until(
                        start + std::chrono::duration_cast<clk::duration>(
                                    std::chrono::duration<double>(i * 4.0 / shape.rate)));
                const std::string id = id_of(r * 10 + p, i);
                if (shape.batch <= 1) {
                    q.put_after(id, payload16, std::chrono::milliseconds(delay(rng)));
                    continue;
                }
                ids.push_back(id);
                if (static_cast<int>(ids.size()) == shape.batch || i + 1 == per) {
                    reqs.clear();
                    for (const auto& x : ids)
                        reqs.push_back({x, payload16, std::chrono::milliseconds(delay(rng))});
                    q.put_many(reqs);
                    ids.clear();
                }
            }
        });
    std::atomic<int> handled{0};
    std::vector<std::unique_ptr<delayq::worker<Queue>>> workers;
    for (std::size_t c = 4; shape.worker && c < 8;) {
        Queue* q = qs[c];
        delayq::worker_options o;
        for (o.threads = 0; c < 8 && qs[c] == q; ++c) ++o.threads;
        workers.push_back(std::make_unique<delayq::worker<Queue>>(
            *q,
            [&](const delayq::job& j) {
                late.add(j.deadline);
                if (handled.fetch_add(1, std::memory_order_relaxed) + 1 == total)
                    handled.notify_all();
            },
            o));
    }
    for (int c = 0; c < 4 && !shape.worker; ++c)
        ts.emplace_back([&, c] {
            Queue& q = *qs[static_cast<std::size_t>(4 + c)];
            const bool busy = c < shape.busy_consumers;
            while (acked.load(std::memory_order_relaxed) < total) {
                if (shape.batch <= 1) {
                    auto j = q.take(200ms);  // the plain loop: take, work, ack
                    if (!j) continue;
                    late.add(j->deadline);
                    if (busy) std::this_thread::sleep_for(5ms);
                    if (q.ack(*j)) acked.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                auto js = q.take_many(static_cast<std::size_t>(shape.batch), 200ms);
                for (const auto& j : js) late.add(j.deadline);
                for (bool ok : q.ack_many(js))
                    acked.fetch_add(ok ? 1 : 0, std::memory_order_relaxed);
            }
        });
    for (auto& t : ts) t.join();
    ts.clear();
    for (int n; shape.worker && (n = handled.load()) < total;) handled.wait(n);
    for (auto& w : workers) ts.emplace_back([&w] { w->stop(); });  // the last acks, at once
    for (auto& t : ts) t.join();
    const double rate = total / seconds(clk::now() - start);
    std::uint64_t done = 0;
    for (auto& w : workers) done += w->counters().done;
    if (shape.worker && done != static_cast<std::uint64_t>(total))
        std::printf("  worker: %llu of %d jobs acked\n", static_cast<unsigned long long>(done),
                    total);
    return rate;
}

template <class Queue>
double end_to_end(Queue& q, const run_shape& shape, lateness& late) {
    return end_to_end_each(everyone(q), shape, late);
}

// One end-to-end run's figures.
struct figures {
    double jobs_per_s = 0;
    double server_us = 0;  // redis-server CPU per job, µs
    double client_us = 0;  // the client's CPU per job, µs (all its threads)
    double switches = -1;  // the client's context switches per job (all its threads); -1: unknown
    std::string lateness;
};

// The runs of one of the four end-to-end series, and their medians.
struct series {
    std::string name;
    int jobs = 0;
    std::vector<figures> runs;

    template <class F>
    std::vector<double> each(F f) const {
        std::vector<double> v;
        for (const auto& r : runs) v.push_back(f(r));
        return v;
    }
    double jobs_per_s() const {
        return median(each([](auto& r) { return r.jobs_per_s; }));
    }
    double server_us() const {
        return median(each([](auto& r) { return r.server_us; }));
    }
    double client_us() const {
        return median(each([](auto& r) { return r.client_us; }));
    }
    double switches() const {
        return median(each([](auto& r) { return r.switches; }));
    }
    void print() const {
        if (runs.empty()) return;
        const auto one = [](const std::vector<double>& v) {
            std::string s;
            for (double x : v) {
                char b[32];
                std::snprintf(b, sizeof b, "%s%.1f", s.empty() ? "" : ", ", x);
                s += b;
            }
            return s;
        };
        std::printf(
            "%s: %d jobs, median %.0f jobs/s (runs: %s); per job: redis-server CPU %.1f µs "
            "(runs: %s), client CPU %.1f µs (runs: %s), client context switches %.2f; last run's "
            "%s\n",
            name.c_str(), jobs, jobs_per_s(),
            list(each([](auto& r) { return r.jobs_per_s; })).c_str(), server_us(),
            one(each([](auto& r) { return r.server_us; })).c_str(), client_us(),
            one(each([](auto& r) { return r.client_us; })).c_str(), switches(),
            runs.back().lateness.c_str());
    }
};

// The worker's series beside the plain loop's, run round by round: the medians, and the median
// of each round's ratio worker / plain (both saw the same machine).
inline void print_worker_beside(const series& plain, const series& worker, const char* what) {
    if (plain.runs.empty() || worker.runs.size() != plain.runs.size()) return;
    const auto ratio = [&](double (*f)(const figures&)) {
        std::vector<double> v;
        for (std::size_t i = 0; i < plain.runs.size(); ++i)
            v.push_back(f(worker.runs[i]) / f(plain.runs[i]));
        return median(v);
    };
    const auto rate = [](const figures& f) { return f.jobs_per_s; };
    const auto client = [](const figures& f) { return f.client_us; };
    const auto server = [](const figures& f) { return f.server_us; };
    std::printf(
        "worker / plain loop, %s (medians; ratio: median of the rounds' ratios): jobs/s %.0f / "
        "%.0f = %.2f×, client CPU per job %.1f / %.1f µs = %.2f×",
        what, worker.jobs_per_s(), plain.jobs_per_s(), ratio(rate), worker.client_us(),
        plain.client_us(), ratio(client));
    if (plain.server_us() > 0)
        std::printf(", server CPU per job %.1f / %.1f µs = %.2f×", worker.server_us(),
                    plain.server_us(), ratio(server));
    std::printf("\n");
}

#if DELAYQ_BENCH_REDIS

// One command on a fresh connection to the server at `port` (the program's own, or --port's).
using delayq_test::command_at;

inline std::string text(int port, const std::vector<std::string>& args) {
    auto r = command_at(port, args);
    return r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

// redis-server's CPU time so far, user + system, in seconds (INFO cpu: getrusage of the server).
inline double server_cpu(int port) {
    const std::string info = text(port, {"INFO", "cpu"});
    return number_after(info, "used_cpu_user:").value_or(0) +
           number_after(info, "used_cpu_sys:").value_or(0);
}

// One delayq end-to-end run with its CPU figures; `stats` gets INFO commandstats over the run.
template <class Queue>
figures measured_each(int port, const objects<Queue>& qs, const run_shape& shape,
                      std::string* stats = nullptr) {
    for (Queue* q : qs) (void)q->size();  // connected before the clocks start
    command_at(port, {"CONFIG", "RESETSTAT"});
    const double server0 = server_cpu(port);
    const double client0 = own_cpu();
    const double switches0 = own_switches();
    lateness late;
    figures f;
    f.jobs_per_s = end_to_end_each(qs, shape, late);
    const double jobs = shape.jobs / 4 * 4;
    f.client_us = (own_cpu() - client0) * 1e6 / jobs;
    f.switches = (own_switches() - switches0) / jobs;
    f.server_us = (server_cpu(port) - server0) * 1e6 / jobs;
    if (stats != nullptr) *stats = text(port, {"INFO", "commandstats"});
    f.lateness = late.report();
    return f;
}

template <class Queue>
figures measured(int port, Queue& q, const run_shape& shape, std::string* stats = nullptr) {
    return measured_each(port, everyone(q), shape, stats);
}

#endif  // DELAYQ_BENCH_REDIS

}  // namespace delayq_bench
