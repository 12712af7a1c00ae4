// delayq inside a Boost.Asio io_context: one asio::steady_timer drives a thread-free hashed_wheel,
// so a server with a million connection timeouts pays for one Asio timer, not a million.
//
// The steady_timer is armed for the wheel's next expiry (next_expiry(): the earliest non-empty
// tick); its handler runs what is due (advance()) and arms it again. A schedule re-arms it only
// when its deadline is earlier than the armed one, which in a server (every timeout the same
// length, so each new one is the latest) is almost never. Everything runs on the io_context's
// thread: the tasks may touch the connections' state without locks, as Asio handlers do.
//
// The program runs 10 000 request timeouts through the loop (90 % cancelled by their "reply", the
// rest firing), then measures, for 100 000 pending timeouts (or as many as its argument says), the
// memory and the time per schedule and per cancel: the wheel against one Asio timer per timeout.
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <delayq/hashed_wheel_timer.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace asio = boost::asio;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// A hashed_wheel whose one driver is an asio::steady_timer on an io_context. Not thread-safe:
// use it from the io_context's thread, as Asio's own timers.
class asio_wheel {
  public:
    asio_wheel(asio::io_context& io, delayq::hashed_wheel_options<clock_type> o)
        : wheel_(std::move(o)), timer_(io) {}

    template <class F>
    delayq::timeout<clock_type> schedule(F&& task, clock_type::duration delay) {
        auto t = wheel_.schedule(std::forward<F>(task), delay);
        // A deadline not before the armed time cannot make the next expiry earlier.
        if (t.deadline() < armed_for_) arm();
        return t;
    }

    std::size_t pending() const { return wheel_.pending(); }

  private:
    void arm() {
        const auto next = wheel_.next_expiry();
        if (!next) {  // nothing pending: no wait outstanding, so io_context::run() can return
            if (armed_for_ != clock_type::time_point::max()) timer_.cancel();
            armed_for_ = clock_type::time_point::max();
            return;
        }
        if (*next == armed_for_) return;
        armed_for_ = *next;
        timer_.expires_at(*next);  // cancels the wait in progress: its handler sees an error
        timer_.async_wait([this](const boost::system::error_code& ec) {
            if (ec) return;  // re-armed or cancelled meanwhile
            armed_for_ = clock_type::time_point::max();
            wheel_.advance();  // runs what is due, here, on the io_context's thread
            arm();
        });
    }

    delayq::hashed_wheel<clock_type> wheel_;
    asio::steady_timer timer_;
    clock_type::time_point armed_for_ = clock_type::time_point::max();
};

// Bytes the program holds from malloc: small blocks, and the large ones malloc maps by themselves
// (the wheel's slabs, a vector of 100 000 timers).
std::size_t heap_in_use() {
#if defined(__GLIBC__)
    const auto mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#else
    return 0;
#endif
}

void run_requests() {
    asio::io_context io;
    delayq::hashed_wheel_options<clock_type> o;
    o.tick = 1ms;
    o.wheel_size = 128;
    asio_wheel wheel(io, o);

    constexpr int requests = 10'000;
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> timeout_ms(20, 60);
    std::vector<delayq::timeout<clock_type>> timers;
    std::vector<double> late_us;
    timers.reserve(requests);
    for (int i = 0; i < requests; ++i) {
        const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms(rng));
        timers.push_back(wheel.schedule(
            [&late_us, deadline] {
                late_us.push_back(
                    std::chrono::duration<double, std::micro>(clock_type::now() - deadline)
                        .count());
            },
            deadline - clock_type::now()));
    }
    // The replies: nine requests in ten are answered before their timeout.
    int cancelled = 0;
    for (int i = 0; i < requests; ++i)
        if (i % 10 != 0 && timers[static_cast<std::size_t>(i)].cancel()) ++cancelled;
    const auto start = clock_type::now();
    io.run();  // returns when the wheel is empty: the driver leaves no wait outstanding
    std::sort(late_us.begin(), late_us.end());
    std::printf(
        "%d request timeouts on one asio::steady_timer: %d cancelled by their reply, %zu "
        "fired in %.0f ms of io_context::run()\n",
        requests, cancelled, late_us.size(),
        std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
    if (!late_us.empty())
        std::printf("  fired late by: median %.0f us, max %.0f us (1 ms tick); early: %s\n",
                    late_us[late_us.size() / 2], late_us.back(),
                    late_us.front() < 0 ? "yes (a bug)" : "never");
}

struct cost {
    double bytes, schedule_ns, cancel_ns;
};

double ns_per(clock_type::duration d, std::size_t n) {
    return std::chrono::duration<double, std::nano>(d).count() / static_cast<double>(n);
}

// n pending timeouts on the wheel: the handles the caller keeps are counted in the bytes.
cost measure_wheel(std::size_t n) {
    asio::io_context io;
    delayq::hashed_wheel_options<clock_type> o;
    o.tick = 100ms;
    o.wheel_size = 1024;
    asio_wheel wheel(io, o);
    const std::size_t before = heap_in_use();
    std::vector<delayq::timeout<clock_type>> handles;
    handles.reserve(n);
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < n; ++i)
        handles.push_back(wheel.schedule([] {}, 30s + std::chrono::microseconds(i)));
    const auto t1 = clock_type::now();
    const std::size_t in_use = heap_in_use() - before;
    for (auto& h : handles) h.cancel();
    const auto t2 = clock_type::now();
    return {static_cast<double>(in_use) / static_cast<double>(n), ns_per(t1 - t0, n),
            ns_per(t2 - t1, n)};
}

// n pending timeouts as n asio::steady_timers, each with an async_wait (the timer objects count
// in the bytes). A cancel queues the handler with operation_aborted; running it is part of it.
cost measure_asio(std::size_t n) {
    asio::io_context io;
    const std::size_t before = heap_in_use();
    std::vector<asio::steady_timer> timers;
    timers.reserve(n);
    std::size_t aborted = 0;
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < n; ++i) {
        timers.emplace_back(io, 30s + std::chrono::microseconds(i));
        timers.back().async_wait([&aborted](const boost::system::error_code& ec) {
            if (ec) ++aborted;
        });
    }
    const auto t1 = clock_type::now();
    const std::size_t in_use = heap_in_use() - before;
    for (auto& t : timers) t.cancel();
    io.poll();  // the cancelled handlers run
    const auto t2 = clock_type::now();
    if (aborted != n) std::puts("  (not every Asio handler saw its cancel)");
    return {static_cast<double>(in_use) / static_cast<double>(n), ns_per(t1 - t0, n),
            ns_per(t2 - t1, n)};
}

}  // namespace

int main(int argc, char** argv) {
    run_requests();
    const std::size_t n = argc > 1 ? std::stoul(argv[1]) : 100'000;
    const cost w = measure_wheel(n);
    const cost a = measure_asio(n);
    std::printf("%zu pending timeouts (a first fill: cold memory)\n", n);
    std::puts("                                     bytes each   schedule   cancel");
    std::printf("  hashed_wheel on one steady_timer   %7.0f B   %6.0f ns  %5.0f ns\n", w.bytes,
                w.schedule_ns, w.cancel_ns);
    std::printf("  one asio::steady_timer each        %7.0f B   %6.0f ns  %5.0f ns\n", a.bytes,
                a.schedule_ns, a.cancel_ns);
    std::printf(
        "  (bytes: heap in use over n, the caller's %zu-byte timeout handle or %zu-byte "
        "steady_timer included)\n",
        sizeof(delayq::timeout<clock_type>), sizeof(asio::steady_timer));
#ifndef __OPTIMIZE__
    std::puts("  (an unoptimized build: build in Release for figures worth quoting)");
#endif
#if !defined(__GLIBC__)
    std::puts("  (bytes are measured with glibc's mallinfo2: not available here)");
#endif
    return 0;
}
