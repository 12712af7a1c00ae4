// stress: threads scheduling, cancelling and consuming at random, all at once, across delay_queue,
// hashed_wheel_timer and hierarchical_timing_wheel (steady_clock, delays of a few milliseconds),
// for a given time. Then everything is shut down and counted:
//
//   delay_queue:  put            == taken + removed (remove_if) + returned by close()
//   each wheel:   scheduled      == ran + cancelled (cancel() true) + returned by stop()
//
// and no task runs before its deadline or twice. One thread per wheel schedules far-future tasks
// and cancels them at once (their cancel() must be true): if cancelled nodes leaked, the resident
// set would grow, so without a sanitizer the RSS at the end must stay within a tolerance of the
// RSS after warm-up.
//
//   stress [--seconds N | --minutes M] [--seed S] [--quiet]      (default: 10 seconds)
//
// Exit status 0 when every check holds; 1 and a message on stderr otherwise.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <delayq/delayq.hpp>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define DELAYQ_STRESS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define DELAYQ_STRESS_SANITIZED 1
#endif
#endif
#ifndef DELAYQ_STRESS_SANITIZED
#define DELAYQ_STRESS_SANITIZED 0
#endif

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

std::atomic<int> failures{0};

void fail(const std::string& what) {
    std::fprintf(stderr, "stress: FAILED: %s\n", what.c_str());
    failures.fetch_add(1);
}

std::size_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    std::size_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

struct flag {
    std::atomic<bool> stop{false};
    bool operator()() const { return stop.load(std::memory_order_relaxed); }
};

// ---- delay_queue -------------------------------------------------------------------------------

struct dq_test {
    using item = delayq::delayed<std::uint64_t>;
    delayq::delay_queue<item> q;
    std::atomic<std::uint64_t> put{0}, taken{0}, removed{0}, early{0};

    void producer(const flag& stop, unsigned seed) {
        std::mt19937_64 rng(seed);
        std::uniform_int_distribution<int> us(0, 2000);
        while (!stop()) {
            // mostly due within 2 ms; one in 16 within 2 s, so that close() has something to return
            const auto d = (rng() & 15) == 0 ? std::chrono::microseconds(rng() % 2'000'000)
                                             : std::chrono::microseconds(us(rng));
            if (q.put(delayq::delay_for(rng(), d))) put.fetch_add(1, std::memory_order_relaxed);
            if ((rng() & 63) == 0) std::this_thread::sleep_for(50us);
        }
    }

    void check(const item& v) {
        if (v.at > steady::now()) early.fetch_add(1, std::memory_order_relaxed);
    }

    void consumer(unsigned seed) {
        std::mt19937_64 rng(seed);
        for (;;) {
            switch (rng() % 3) {
                case 0: {
                    auto v = q.take_for(5ms);
                    if (v) {
                        check(*v);
                        taken.fetch_add(1, std::memory_order_relaxed);
                    } else if (q.closed()) {
                        return;
                    }
                    break;
                }
                case 1: {
                    if (auto v = q.poll()) {
                        check(*v);
                        taken.fetch_add(1, std::memory_order_relaxed);
                    }
                    if (q.closed()) return;
                    break;
                }
                default: {
                    std::vector<item> out;
                    const std::size_t n = q.drain_to(std::back_inserter(out), 1 + rng() % 64);
                    for (const auto& v : out) check(v);
                    taken.fetch_add(n, std::memory_order_relaxed);
                    if (q.closed()) return;
                    if (n == 0) std::this_thread::sleep_for(100us);
                    break;
                }
            }
        }
    }

    void remover(const flag& stop, unsigned seed) {
        std::mt19937_64 rng(seed);
        while (!stop()) {
            const std::uint64_t r = rng() % 8;
            removed.fetch_add(q.remove_if([&](const item& v) {
                return v.value % 8 == r && (v.value & 0x700) == 0;
            }),
                              std::memory_order_relaxed);
            std::this_thread::sleep_for(1ms);
        }
    }
};

// ---- the wheels
// ----------------------------------------------------------------------------------

template <class Timer>
struct wheel_test {
    const char* name;
    Timer timer;
    std::atomic<std::uint64_t> scheduled{0}, ran{0}, cancelled{0}, rejected{0}, early{0},
        far_cancel_failed{0};
    std::mutex ring_m;
    std::vector<delayq::timeout<>> ring = std::vector<delayq::timeout<>>(1024);

    wheel_test(const char* n, typename Timer::options o) : name(n), timer(std::move(o)) {}

    // Schedules tasks a few ms out; keeps some handles where the canceller can find them.
    void scheduler(const flag& stop, unsigned seed) {
        std::mt19937_64 rng(seed);
        while (!stop()) {
            // mostly due within 5 ms; one in 16 within 2 s, so that stop() has something to return
            const auto delay =
                std::chrono::microseconds((rng() & 15) == 0 ? rng() % 2'000'000 : rng() % 5000);
            const auto due = steady::now() + delay;
            try {
                auto h = timer.schedule(
                    [this, due, big = std::vector<char>(rng() % 64)] {
                        if (steady::now() < due) early.fetch_add(1, std::memory_order_relaxed);
                        ran.fetch_add(1, std::memory_order_relaxed);
                    },
                    delay);
                scheduled.fetch_add(1, std::memory_order_relaxed);
                std::lock_guard lk(ring_m);
                ring[rng() % ring.size()] = std::move(h);
            } catch (const delayq::rejected_error&) {
                rejected.fetch_add(1, std::memory_order_relaxed);
                std::this_thread::sleep_for(200us);
            }
            if ((rng() & 31) == 0) std::this_thread::sleep_for(100us);
        }
    }

    void canceller(const flag& stop, unsigned seed) {
        std::mt19937_64 rng(seed);
        while (!stop()) {
            delayq::timeout<> h;
            {
                std::lock_guard lk(ring_m);
                h = ring[rng() % ring.size()];
            }
            if (h.cancel()) cancelled.fetch_add(1, std::memory_order_relaxed);
            if ((rng() & 15) == 0) std::this_thread::sleep_for(50us);
        }
    }

    // Far-future tasks cancelled at once: they cannot have run, so cancel() must be true, and their
    // storage must be released (the RSS check).
    void churner(const flag& stop, unsigned seed) {
        std::mt19937_64 rng(seed);
        while (!stop()) {
            try {
                auto h = timer.schedule([this, big = std::vector<char>(256)] { ran.fetch_add(1); },
                                        std::chrono::seconds(10 + rng() % 3600));
                scheduled.fetch_add(1, std::memory_order_relaxed);
                if (h.cancel())
                    cancelled.fetch_add(1, std::memory_order_relaxed);
                else
                    far_cancel_failed.fetch_add(1, std::memory_order_relaxed);
            } catch (const delayq::rejected_error&) {
                rejected.fetch_add(1, std::memory_order_relaxed);
                std::this_thread::sleep_for(200us);
            }
        }
    }

    void finish(bool quiet) {
        {
            std::lock_guard lk(ring_m);
            ring.assign(ring.size(), delayq::timeout<>{});
        }
        const auto rest = timer.stop();
        for (const auto& h : rest)
            if (!h.cancelled())
                fail(std::string(name) + ": a handle returned by stop() is not cancelled()");
        const std::uint64_t s = scheduled.load(), r = ran.load(), c = cancelled.load(),
                            n = rest.size();
        if (!quiet)
            std::printf(
                "%-26s scheduled %10llu = ran %10llu + cancelled %10llu + returned %6llu (rejected "
                "%llu)\n",
                name, static_cast<unsigned long long>(s), static_cast<unsigned long long>(r),
                static_cast<unsigned long long>(c), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(rejected.load()));
        if (s != r + c + n)
            fail(std::string(name) + ": conservation: scheduled != ran + cancelled + returned");
        if (early.load() != 0)
            fail(std::string(name) + ": " + std::to_string(early.load()) + " tasks ran early");
        if (far_cancel_failed.load() != 0)
            fail(std::string(name) + ": cancel() of a far-future task returned false");
        if (s == 0 || r == 0 || c == 0) fail(std::string(name) + ": nothing happened");
    }
};

}  // namespace

int main(int argc, char** argv) {
    double seconds = 10;
    unsigned seed = std::random_device{}();
    bool quiet = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc)
            seconds = std::atof(argv[++i]);
        else if (a == "--minutes" && i + 1 < argc)
            seconds = 60 * std::atof(argv[++i]);
        else if (a == "--seed" && i + 1 < argc)
            seed = static_cast<unsigned>(std::strtoul(argv[++i], nullptr, 10));
        else if (a == "--quiet")
            quiet = true;
        else {
            std::fprintf(stderr,
                         "usage: stress [--seconds N | --minutes M] [--seed S] [--quiet]\n");
            return 2;
        }
    }
    if (!quiet)
        std::printf("stress: %.0f s, seed %u, %s\n", seconds, seed,
                    DELAYQ_STRESS_SANITIZED ? "sanitized (no RSS check)" : "RSS checked");

    dq_test dq;
    delayq::hashed_wheel_timer<>::options ho;
    ho.tick = 1ms;
    ho.wheel_size = 64;
    ho.max_pending = 1'000'000;
    wheel_test<delayq::hashed_wheel_timer<>> hashed("hashed_wheel_timer", std::move(ho));
    delayq::hierarchical_timing_wheel<>::options to;
    to.tick = 1ms;
    to.wheel_size = 16;
    to.max_pending = 1'000'000;
    wheel_test<delayq::hierarchical_timing_wheel<>> hier("hierarchical_timing_wheel",
                                                         std::move(to));

    flag stop;
    std::vector<std::thread> workers, consumers;
    unsigned s = seed;
    for (int i = 0; i < 2; ++i) workers.emplace_back([&, k = s++] { dq.producer(stop, k); });
    workers.emplace_back([&, k = s++] { dq.remover(stop, k); });
    for (int i = 0; i < 2; ++i) consumers.emplace_back([&, k = s++] { dq.consumer(k); });
    workers.emplace_back([&, k = s++] { hashed.scheduler(stop, k); });
    workers.emplace_back([&, k = s++] { hashed.canceller(stop, k); });
    workers.emplace_back([&, k = s++] { hashed.churner(stop, k); });
    workers.emplace_back([&, k = s++] { hier.scheduler(stop, k); });
    workers.emplace_back([&, k = s++] { hier.canceller(stop, k); });
    workers.emplace_back([&, k = s++] { hier.churner(stop, k); });

    const auto start = steady::now();
    const auto total = std::chrono::duration<double>(seconds);
    const auto warm = start + std::chrono::duration_cast<steady::duration>(total * 0.3);
    std::this_thread::sleep_until(warm);
    const std::size_t rss_warm = rss_bytes();
    std::this_thread::sleep_until(start + std::chrono::duration_cast<steady::duration>(total));
    const std::size_t rss_end = rss_bytes();

    stop.stop = true;
    for (auto& t : workers) t.join();
    const std::vector<dq_test::item> rest = dq.q.close();
    for (auto& t : consumers) t.join();

    const std::uint64_t p = dq.put.load(), tk = dq.taken.load(), rm = dq.removed.load(),
                        rt = rest.size();
    if (!quiet)
        std::printf("%-26s put       %10llu = taken %8llu + removed %10llu + returned %6llu\n",
                    "delay_queue", static_cast<unsigned long long>(p),
                    static_cast<unsigned long long>(tk), static_cast<unsigned long long>(rm),
                    static_cast<unsigned long long>(rt));
    if (p != tk + rm + rt) fail("delay_queue: conservation: put != taken + removed + returned");
    if (dq.early.load() != 0)
        fail("delay_queue: " + std::to_string(dq.early.load()) + " elements taken early");
    if (p == 0 || tk == 0) fail("delay_queue: nothing happened");
    hashed.finish(quiet);
    hier.finish(quiet);

    const double mib = 1024.0 * 1024.0;
    if (!quiet)
        std::printf("RSS after warm-up %.1f MiB, at the end %.1f MiB\n", rss_warm / mib,
                    rss_end / mib);
    if (!DELAYQ_STRESS_SANITIZED) {
        const std::size_t tolerance = std::max<std::size_t>(16u << 20, rss_warm / 4);
        if (rss_end > rss_warm + tolerance)
            fail("RSS grew by " + std::to_string((rss_end - rss_warm) / mib) + " MiB");
    }
    if (failures.load() != 0) return 1;
    if (!quiet) std::printf("stress: OK\n");
    return 0;
}
