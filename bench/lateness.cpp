// What a user of a timer feels: how late each task runs (fire time - deadline), and how often an
// idle timer wakes up. Not a Google Benchmark: real time, real threads, real sleeping.
//
// For each structure: 100 000 timers with deadlines spread uniformly over one second (scheduled
// up front, in random order), each recording steady_clock::now() when it runs. Reports p50, p99 and
// max lateness, and counts early firings (must be 0). Then the idle test: a timer with nothing
// pending for `idle_seconds`, counting the voluntary context switches of its threads.
//
// usage: lateness [timers=100000] [idle_seconds=5]
#include <delayq/delayq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#if __has_include(<boost/asio.hpp>)
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#define DELAYQ_LATENESS_ASIO 1
#endif

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

struct result {
    std::vector<std::int64_t> late_ns;  // one per timer
    std::size_t early = 0;
};

void report(const char* name, result& r) {
    auto& v = r.late_ns;
    std::sort(v.begin(), v.end());
    auto pct = [&](double p) { return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))]; };
    std::printf("%-28s timers %zu  p50 %8.1f us  p99 %8.1f us  max %8.1f us  early %zu\n", name,
                v.size(), pct(0.50) / 1e3, pct(0.99) / 1e3, static_cast<double>(v.back()) / 1e3, r.early);
}

struct plan {
    std::vector<clk::time_point> deadline;
    std::vector<std::size_t> order;  // schedule order: random
    std::vector<std::atomic<std::int64_t>> fired_at;
    explicit plan(std::size_t n) : deadline(n), order(n), fired_at(n) {
        const auto start = clk::now() + 300ms;  // scheduling 100k timers takes time too
        std::mt19937_64 rng(11);
        for (std::size_t i = 0; i < n; ++i) {
            deadline[i] = start + std::chrono::nanoseconds(rng() % 1'000'000'000);
            order[i] = i;
        }
        std::shuffle(order.begin(), order.end(), rng);
    }
    void fire(std::size_t i) {
        fired_at[i].store(clk::now().time_since_epoch().count(), std::memory_order_relaxed);
    }
    result collect() {
        result r;
        for (std::size_t i = 0; i < deadline.size(); ++i) {
            const auto late = fired_at[i].load() - deadline[i].time_since_epoch().count();
            if (late < 0) ++r.early;
            r.late_ns.push_back(late);
        }
        return r;
    }
};

void low_slack() {
#if defined(__linux__)
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}

result run_delay_queue(std::size_t n) {
    plan p(n);
    struct job {
        std::size_t i;
        clk::time_point at;
        clk::time_point deadline() const { return at; }
    };
    delayq::delay_queue<job> q;
    std::thread consumer([&] {
        low_slack();  // as the README advises for takers
        while (auto j = q.take()) p.fire(j->i);
    });
    for (auto i : p.order) q.put(job{i, p.deadline[i]});
    while (q.size() > 0) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(10ms);
    q.close();
    consumer.join();
    return p.collect();
}

template <class Timer>
result run_wheel(std::size_t n, typename Timer::options o) {
    plan p(n);
    Timer t(std::move(o));
    std::atomic<std::size_t> done{0};
    for (auto i : p.order)
        t.schedule_at([&p, &done, i] {
            p.fire(i);
            done.fetch_add(1, std::memory_order_relaxed);
        }, p.deadline[i]);
    while (done.load() < n) std::this_thread::sleep_for(10ms);
    t.stop();
    return p.collect();
}

#ifdef DELAYQ_LATENESS_ASIO
result run_asio(std::size_t n) {
    plan p(n);
    boost::asio::io_context io;
    std::vector<std::unique_ptr<boost::asio::steady_timer>> timers(n);
    for (auto i : p.order) {
        timers[i] = std::make_unique<boost::asio::steady_timer>(io, p.deadline[i]);
        timers[i]->async_wait([&p, i](const boost::system::error_code&) { p.fire(i); });
    }
    std::thread runner([&] {
        low_slack();
        io.run();
    });
    runner.join();
    return p.collect();
}
#endif

// Voluntary context switches of every thread of this process but the calling one.
long others_voluntary_switches() {
    long total = 0;
    const std::string self = std::to_string(gettid());
    DIR* d = opendir("/proc/self/task");
    if (!d) return -1;
    while (auto* e = readdir(d)) {
        std::string tid = e->d_name;
        if (tid == "." || tid == ".." || tid == self) continue;
        std::ifstream f("/proc/self/task/" + tid + "/status");
        std::string line;
        while (std::getline(f, line))
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0) total += std::atol(line.c_str() + 24);
    }
    closedir(d);
    return total;
}

template <class Timer>
void idle_wakeups(const char* name, typename Timer::options o, int seconds) {
    Timer t(std::move(o));
    auto h = t.schedule([] {}, 1ms);  // starts the worker
    std::this_thread::sleep_for(50ms);
    const long before = others_voluntary_switches();
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    const long after = others_voluntary_switches();
    std::printf("%-28s idle wake-ups in %d s: %ld\n", name, seconds, after - before);
    t.stop();
}

}  // namespace

int main(int argc, char** argv) {
    const std::size_t n = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 100'000;
    const int idle = argc > 2 ? std::atoi(argv[2]) : 5;
    std::printf("lateness of %zu timers spread over 1 s (fire time - deadline)\n", n);
    {
        auto r = run_delay_queue(n);
        report("delay_queue (taker thread)", r);
    }
    {
        delayq::hashed_wheel_timer<>::options o;
        o.tick = 1ms;
        auto r = run_wheel<delayq::hashed_wheel_timer<>>(n, o);
        report("hashed_wheel_timer 1ms", r);
    }
    {
        delayq::hierarchical_timing_wheel<>::options o;
        o.tick = 1ms;
        auto r = run_wheel<delayq::hierarchical_timing_wheel<>>(n, o);
        report("hierarchical_wheel 1ms", r);
    }
#ifdef DELAYQ_LATENESS_ASIO
    {
        auto r = run_asio(n);
        report("asio steady_timer", r);
    }
#endif
    if (idle > 0) {
        delayq::hashed_wheel_timer<>::options h;
        h.tick = 1ms;
        idle_wakeups<delayq::hashed_wheel_timer<>>("hashed_wheel_timer 1ms", h, idle);
        delayq::hierarchical_timing_wheel<>::options k;
        k.tick = 1ms;
        idle_wakeups<delayq::hierarchical_timing_wheel<>>("hierarchical_wheel 1ms", k, idle);
    }
    return 0;
}
