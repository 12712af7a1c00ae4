// An event loop that drives a hashed_wheel (the thread-free core of hashed_wheel_timer): no timer
// thread at all. Each turn, the loop asks the wheel when it next has work (next_expiry()), sleeps
// in poll() at most that long (epoll_wait, or a timerfd armed to that time, works the same way),
// handles its file descriptors, then runs the due tasks with advance(). Tasks run on the loop's
// own thread, so they may touch the loop's state without locks.
//
// What it does: a heartbeat that re-arms itself every 50 ms, an I/O event (a byte written into a
// pipe by a timer, standing for a socket becoming readable), a cancelled timer that never fires,
// and a last timer that ends the loop.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <delayq/hashed_wheel_timer.hpp>
#include <functional>

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

int main() {
    delayq::hashed_wheel_options<> o;
    o.tick = 10ms;  // the loop wakes at most once per 10 ms tick, and only for ticks with work
    o.wheel_size = 64;
    delayq::hashed_wheel<> wheel(o);

    int fds[2];
    if (::pipe(fds) != 0) return 1;
    const auto start = clock_type::now();
    auto ms = [&] {
        return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start)
            .count();
    };

    int beats = 0;
    std::function<void()> heartbeat = [&] {
        std::printf("%4lld ms  heartbeat %d\n", static_cast<long long>(ms()), ++beats);
        if (beats < 5) wheel.schedule(heartbeat, 50ms);  // re-arm from inside the task
    };
    wheel.schedule(heartbeat, 50ms);

    wheel.schedule([&] { (void)!::write(fds[1], "x", 1); }, 120ms);  // "data arrives" at 120 ms

    auto never = wheel.schedule([] { std::puts("never printed"); }, 100ms);
    never.cancel();  // unlinked and destroyed at once

    bool done = false;
    wheel.schedule([&] { done = true; }, 300ms);

    int turns = 0;
    while (!done) {
        int timeout_ms = -1;  // nothing pending: sleep until I/O
        if (const auto next = wheel.next_expiry()) {
            const auto wait = *next - clock_type::now();
            // Round up: waking early would only cost an empty turn, never an early task.
            timeout_ms =
                wait <= 0ns
                    ? 0
                    : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count());
        }
        pollfd p{fds[0], POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) > 0) {
            char c;
            if (::read(fds[0], &c, 1) == 1)
                std::printf("%4lld ms  I/O event\n", static_cast<long long>(ms()));
        }
        wheel.advance();  // runs what is due, on this thread
        ++turns;
    }
    std::printf("%4lld ms  done after %d loop turns; cancelled timer: cancelled()=%d\n",
                static_cast<long long>(ms()), turns, never.cancelled());
    ::close(fds[0]);
    ::close(fds[1]);
    return beats == 5 && never.cancelled() ? 0 : 1;
}
