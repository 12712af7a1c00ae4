// What a user of a timer feels: how late each task runs (fire time - deadline), and how often an
// idle timer wakes up. Not a Google Benchmark: real time, real threads, real sleeping.
//
// For each structure: 100 000 timers with deadlines spread uniformly over one second (scheduled
// up front, in random order), each recording steady_clock::now() when it runs. Reports p50, p99 and
// max lateness, and counts early firings (must be 0). The wheels run twice: precise (the default: a
// task runs at its deadline) and tick-rounded (precise = false: at its tick's boundary).
//
// Then: sparse timers (one per 10 ticks on average) on the precise wheels, sleeping until each
// deadline and with spin_before_deadline = 200 us (with the CPU each costs); a dense burst (1M
// timers due within the same 10 ms, on a microsecond grid), whose expiry cost per timer (the
// process's CPU time while the main thread sleeps, over the timers) and worker wake-ups are
// compared precise vs rounded, beside the number of distinct deadlines; and the idle test: a timer
// with nothing pending for `idle_seconds`, counting the voluntary context switches of its threads.
//
// The first two parts run each structure `runs` times, one run of each in turn, and print the run
// with the median p99 and the range of p99 over the runs: this VM's host stalls it for a few
// milliseconds now and then, which moves the p99 of whichever run it hits by that much (one run
// each measured `delay_queue`'s p99 anywhere from 134 us to 3.7 ms).
//
// usage: lateness [timers=100000] [idle_seconds=5] [burst=1000000] [burst_runs=5] [runs=3]
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/delayq.hpp>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
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

// One run's lateness: percentiles in microseconds, and the early firings.
struct summary {
    std::size_t timers = 0, early = 0;
    double p50 = 0, p99 = 0, max = 0;
    double cpu = 0;  // what it cost its worker, per timer (us), where measured
};

summary summarize(result& r) {
    auto& v = r.late_ns;
    std::sort(v.begin(), v.end());
    auto pct = [&](double p) {
        return static_cast<double>(
                   v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))]) /
               1e3;
    };
    return summary{v.size(), r.early, pct(0.50), pct(0.99), static_cast<double>(v.back()) / 1e3};
}

void report(const char* name, result& r) {
    const summary s = summarize(r);
    std::printf("%-28s timers %zu  p50 %8.1f us  p99 %8.1f us  max %8.1f us  early %zu\n", name,
                s.timers, s.p50, s.p99, s.max, s.early);
}

// Several runs of one structure: the run with the median p99 (a host that stalls the VM for a few
// milliseconds now and then moves one run's p99 by that much, whichever structure it hits), the
// range of p99 over the runs, and the early firings of all of them.
void report(const std::string& name, std::vector<summary> runs) {
    std::size_t early = 0;
    for (const auto& r : runs) early += r.early;
    std::sort(runs.begin(), runs.end(),
              [](const summary& a, const summary& b) { return a.p99 < b.p99; });
    const summary& m = runs[runs.size() / 2];
    std::printf("%-28s timers %zu  p50 %8.1f us  p99 %8.1f us  max %8.1f us  early %zu",
                name.c_str(), m.timers, m.p50, m.p99, m.max, early);
    if (runs.size() > 1)
        std::printf("  (median of %zu runs; p99 %.1f-%.1f)", runs.size(), runs.front().p99,
                    runs.back().p99);
    std::printf("\n");
    if (m.cpu > 0) std::printf("%-28s   cpu %.1f us per timer\n", "", m.cpu);
}

// Runs each contender `runs` times, one run of each in turn (so that a slow minute of the host
// does not fall on one of them only), and reports each.
struct contender {
    std::string name;
    std::function<summary()> run;
};
void run_all(const std::vector<contender>& cs, int runs) {
    std::vector<std::vector<summary>> got(cs.size());
    for (int k = 0; k < runs; ++k)
        for (std::size_t i = 0; i < cs.size(); ++i) got[i].push_back(cs[i].run());
    for (std::size_t i = 0; i < cs.size(); ++i) report(cs[i].name, got[i]);
}

struct plan {
    std::vector<clk::time_point> deadline;
    std::vector<std::size_t> order;  // schedule order: random
    std::vector<std::atomic<std::int64_t>> fired_at;
    // n deadlines spread over `span` from `lead` on, on a grid of `grain` (1 ns: anywhere)
    explicit plan(std::size_t n, std::chrono::nanoseconds span = 1s,
                  std::chrono::nanoseconds lead = 300ms, std::chrono::nanoseconds grain = 1ns)
        : deadline(n), order(n), fired_at(n) {
        const auto start = clk::now() + lead;  // scheduling 100k timers takes time too
        std::mt19937_64 rng(11);
        const auto slots = static_cast<std::uint64_t>(span / grain);
        for (std::size_t i = 0; i < n; ++i) {
            deadline[i] = start + grain * static_cast<std::int64_t>(rng() % slots);
            order[i] = i;
        }
        std::shuffle(order.begin(), order.end(), rng);
    }
    std::size_t distinct() const {
        return std::set<clk::time_point>(deadline.begin(), deadline.end()).size();
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

result run_delay_queue(plan& p) {
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

double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// What a run of a wheel costs its worker: CPU seconds from the first deadline on, and wake-ups.
struct cost {
    double cpu = 0;
    std::size_t wakeups = 0;
};

template <class Timer>
result run_wheel(plan& p, typename Timer::options o, cost* c = nullptr) {
    const std::size_t n = p.deadline.size();
    Timer t(std::move(o));
    std::atomic<std::size_t> done{0};
    for (auto i : p.order)
        t.schedule_at(
            [&p, &done, i] {
                p.fire(i);
                done.fetch_add(1, std::memory_order_relaxed);
            },
            p.deadline[i]);
    const auto first = *std::min_element(p.deadline.begin(), p.deadline.end());
    std::this_thread::sleep_until(first - 20ms);  // the main thread sleeps from here on
    const double cpu0 = cpu_seconds();
    const std::size_t w0 = t.wakeups();
    while (done.load() < n) std::this_thread::sleep_for(5ms);
    if (c) *c = cost{cpu_seconds() - cpu0, t.wakeups() - w0};
    t.stop();
    return p.collect();
}

template <class Timer>
result run_wheel(std::size_t n, typename Timer::options o) {
    plan p(n);
    return run_wheel<Timer>(p, std::move(o));
}

template <class Timer>
typename Timer::options wheel_options(bool precise) {
    typename Timer::options o;
    o.tick = 1ms;
    o.precise = precise;
    return o;
}

#ifdef DELAYQ_LATENESS_ASIO
result run_asio(plan& p) {
    boost::asio::io_context io;
    std::vector<std::unique_ptr<boost::asio::steady_timer>> timers(p.deadline.size());
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
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
                total += std::atol(line.c_str() + 24);
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

// delay_queue and Asio's timers, each run on a fresh plan of n timers over `span`: what the wheels'
// rows are compared with.
std::vector<contender> baselines(std::size_t n, std::chrono::nanoseconds span) {
    std::vector<contender> cs;
    cs.push_back({"delay_queue (taker thread)", [n, span] {
                      plan p(n, span);
                      auto r = run_delay_queue(p);
                      return summarize(r);
                  }});
#ifdef DELAYQ_LATENESS_ASIO
    cs.push_back({"asio steady_timer", [n, span] {
                      plan p(n, span);
                      auto r = run_asio(p);
                      return summarize(r);
                  }});
#endif
    return cs;
}

}  // namespace

using hashed = delayq::hashed_wheel_timer<>;
using hierarchical = delayq::hierarchical_timing_wheel<>;

// A dense burst: n timers due within the same 10 ms, on a 1 us grid. The expiry cost moves by
// ±30 % from run to run here, so each mode runs `runs` times, alternating, and the medians are
// compared; the lateness printed is that of the last run of each mode.
template <class Timer>
void burst(const char* name, std::size_t n, int runs = 5) {
    std::vector<cost> c[2];
    std::size_t distinct = 0;
    for (int k = 0; k < runs; ++k) {
        for (const bool precise : {true, false}) {
            plan p(n, 10ms, 1500ms, 1us);
            distinct = p.distinct();
            cost one;
            auto r = run_wheel<Timer>(p, wheel_options<Timer>(precise), &one);
            c[precise ? 0 : 1].push_back(one);
            if (k + 1 == runs)
                report((std::string(name) + (precise ? " precise" : " rounded")).c_str(), r);
        }
    }
    auto median = [](std::vector<cost> v) {
        std::sort(v.begin(), v.end(), [](const cost& a, const cost& b) { return a.cpu < b.cpu; });
        return v[v.size() / 2];
    };
    const cost p = median(c[0]), q = median(c[1]);
    std::printf(
        "%-28s burst of %zu (%zu distinct deadlines), median of %d: expiry %.1f ns/timer precise "
        "vs "
        "%.1f rounded (%.2fx), wake-ups %zu precise vs %zu rounded\n",
        name, n, distinct, runs, p.cpu * 1e9 / static_cast<double>(n),
        q.cpu * 1e9 / static_cast<double>(n), p.cpu / q.cpu, p.wakeups, q.wakeups);
}

int main(int argc, char** argv) {
    const std::size_t n = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 100'000;
    const int idle = argc > 2 ? std::atoi(argv[2]) : 5;
    const std::size_t burst_n = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 1'000'000;
    const int burst_runs = argc > 4 ? std::max(1, std::atoi(argv[4])) : 5;
    const int runs = argc > 5 ? std::max(1, std::atoi(argv[5])) : 3;
    std::printf("lateness of %zu timers spread over 1 s (fire time - deadline)\n", n);
    {
        std::vector<contender> cs = baselines(n, 1s);
        for (const bool precise : {true, false}) {
            const std::string mode = precise ? "precise" : "rounded";
            cs.push_back({"hashed_wheel_timer 1ms " + mode, [n, precise] {
                              auto r = run_wheel<hashed>(n, wheel_options<hashed>(precise));
                              return summarize(r);
                          }});
            cs.push_back({"hierarchical_timing_wheel 1ms " + mode, [n, precise] {
                              auto r =
                                  run_wheel<hierarchical>(n, wheel_options<hierarchical>(precise));
                              return summarize(r);
                          }});
        }
        run_all(cs, runs);
    }
    if (n >= 1000) {
        // one per 10 ms on average, far fewer than one per 1 ms tick: 1 000 over 10 s for 100 000
        const std::size_t sparse = std::max<std::size_t>(n / 100, 200);
        std::printf("sparse: %zu timers spread over %zu s\n", sparse, sparse / 100);
        const auto span = std::chrono::seconds(sparse / 100);
        std::vector<contender> cs = baselines(sparse, span);
        // Then with spin_before_deadline: the worker spins (yielding) the last 200 us before each
        // deadline instead of sleeping through it; the CPU it costs is printed per timer.
        for (const auto spin : {0us, 200us}) {
            const std::string suffix =
                spin == 0us ? "" : " spin " + std::to_string(spin.count()) + "us";
            auto one = [sparse, span, spin]<class Timer>(Timer*) {
                plan p(sparse, span);
                cost c;
                auto o = wheel_options<Timer>(true);
                o.spin_before_deadline = spin;
                auto r = run_wheel<Timer>(p, std::move(o), &c);
                summary s = summarize(r);
                s.cpu = c.cpu * 1e6 / static_cast<double>(sparse);
                return s;
            };
            cs.push_back({"hashed_wheel_timer 1ms" + suffix,
                          [one] { return one(static_cast<hashed*>(nullptr)); }});
            cs.push_back({"hierarchical_timing_wheel 1ms" + suffix,
                          [one] { return one(static_cast<hierarchical*>(nullptr)); }});
        }
        run_all(cs, runs);
    }
    if (burst_n > 0) {
        std::printf("dense burst: %zu timers due within the same 10 ms\n", burst_n);
        burst<hashed>("hashed_wheel_timer 1ms", burst_n, burst_runs);
        burst<hierarchical>("hierarchical_timing_wheel 1ms", burst_n, burst_runs);
    }
    if (idle > 0) {
        delayq::hashed_wheel_timer<>::options h;
        h.tick = 1ms;
        idle_wakeups<delayq::hashed_wheel_timer<>>("hashed_wheel_timer 1ms", h, idle);
        delayq::hierarchical_timing_wheel<>::options k;
        k.tick = 1ms;
        idle_wakeups<delayq::hierarchical_timing_wheel<>>("hierarchical_timing_wheel 1ms", k, idle);
    }
    return 0;
}
