// Close connections that have been idle for 30 seconds, on a hashed wheel: the classic wheel
// workload. Every read pushes its connection's deadline back; a connection closes only when no
// read came for 30 s.
//
// Pushing a deadline back is one reschedule() (O(1)): the pending close moves to its new deadline,
// keeping its callable and its handle, with no allocation. Without reschedule() users write
// cancel() + schedule() (what Netty users do): the callable is destroyed and a new node filled at
// every read. The second half of the program measures both per read, with 10 000 open
// connections.
//
// The wheel is a hashed_wheel, the thread-free core of hashed_wheel_timer: the server's event loop
// drives it (see event_loop_wheel.cpp), so the close runs on the loop's thread, next to the
// connection's state, without locks. The first half runs on a manual_clock, moved by the script
// below, so it is the same every run.
#include <chrono>
#include <cstdio>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/manual_clock.hpp>
#include <map>
#include <random>
#include <vector>

using namespace std::chrono_literals;

namespace {

template <class Clock>
struct connection {
    int fd = -1;
    bool open = true;
    delayq::timeout<Clock> idle;  // the pending close
};

// The pattern: every read re-arms the connection's idle timer. reschedule() is false when there is
// no pending close (the first read, or the close has just run): then a new one is scheduled.
template <class Clock, class Wheel, class OnIdle>
void rearm(Wheel& wheel, connection<Clock>& c, typename Clock::duration idle_after,
           OnIdle on_idle) {
    if (!c.idle.reschedule(idle_after)) c.idle = wheel.schedule(on_idle, idle_after);
}

// The same without reschedule(), for the measurement.
template <class Clock, class Wheel, class OnIdle>
void cancel_and_schedule(Wheel& wheel, connection<Clock>& c, typename Clock::duration idle_after,
                         OnIdle on_idle) {
    c.idle.cancel();  // false if there was none, or it has just fired: both are fine here
    c.idle = wheel.schedule(on_idle, idle_after);
}

int simulate() {
    using clock_type = delayq::manual_clock;
    clock_type::reset();
    delayq::hashed_wheel_options<clock_type> o;
    o.tick = 1s;        // closes happen within a second after 30 s of silence
    o.wheel_size = 64;  // one rotation spans the 30 s timeout
    delayq::hashed_wheel<clock_type> wheel(o);
    auto secs = [] {
        return static_cast<long>(
            std::chrono::duration_cast<std::chrono::seconds>(clock_type::now().time_since_epoch())
                .count());
    };

    std::map<int, connection<clock_type>> conns;
    auto on_read = [&](int fd) {
        auto& c = conns[fd];
        c.fd = fd;
        rearm(wheel, c, 30s, [&conns, fd, secs] {
            conns[fd].open = false;
            std::printf("  %3ld s  fd %d idle for 30 s: closed\n", secs(), fd);
        });
    };

    std::puts("Idle connections closed after 30 s without a read (simulated clock):");
    // fd 5 reads every 10 s, fd 6 reads twice and falls silent, fd 7 connects and never reads,
    // fd 8 reads every 25 s (always just in time).
    std::multimap<long, int> reads{{0, 5},  {0, 6},  {0, 7},  {0, 8},  {10, 5}, {12, 6}, {20, 5},
                                   {25, 8}, {30, 5}, {40, 5}, {50, 5}, {50, 8}, {60, 5}, {75, 8}};
    for (long s = 0; s <= 120; ++s) {
        auto [first, last] = reads.equal_range(s);
        for (auto it = first; it != last; ++it) {
            if (conns.count(it->second) == 0)
                std::printf("  %3ld s  fd %d connected\n", s, it->second);
            on_read(it->second);
        }
        wheel.advance();
        clock_type::advance(1s);
    }
    // fd 7 closes at 30 s, fd 6 at 42 s, fd 5 at 90 s, fd 8 at 105 s.
    int closed = 0;
    for (auto& [fd, c] : conns) closed += c.open ? 0 : 1;
    std::printf("%d connections, %d closed as idle, %zu timers pending\n",
                static_cast<int>(conns.size()), closed, wheel.pending());
    return closed == 4 && wheel.pending() == 0 ? 0 : 1;
}

// The cost per read of reschedule(), and of cancel() + schedule(), on a real clock, with `open`
// connections pending.
void measure() {
    using clock_type = std::chrono::steady_clock;
    constexpr int open = 10'000;
    constexpr int reads = 200'000;
    delayq::hashed_wheel_options<clock_type> o;
    o.tick = 100ms;
    o.wheel_size = 512;
    delayq::hashed_wheel<clock_type> wheel(o);
    std::vector<connection<clock_type>> conns(open);
    int closes = 0;
    auto on_idle = [&closes] { ++closes; };
    for (auto& c : conns) rearm(wheel, c, 30s, on_idle);

    std::mt19937 rng(42);
    std::uniform_int_distribution<int> pick(0, open - 1);
    std::vector<int> order(reads);
    for (int& i : order) i = pick(rng);
    auto per_read = [&](auto how) {
        const auto start = clock_type::now();
        for (int i : order) how(wheel, conns[static_cast<std::size_t>(i)], 30s, on_idle);
        return std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / reads;
    };
    const double moved = per_read([](auto&&... a) { rearm(a...); });
    const double renewed = per_read([](auto&&... a) { cancel_and_schedule(a...); });
    std::printf(
        "cost per read with %d connections open: reschedule %.0f ns, cancel + schedule "
        "%.0f ns (%.2fx)%s\n",
        open, moved, renewed, moved / renewed,
#ifdef __OPTIMIZE__
        ""
#else
        " (an unoptimized build: a release build is several times faster)"
#endif
    );
    std::printf("  %d reads re-armed each way; %zu timers pending, one per connection\n", reads,
                wheel.pending());
}

}  // namespace

int main() {
    const int rc = simulate();
    measure();
    return rc;
}
