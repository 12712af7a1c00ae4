// A user's own clock: neither steady_clock nor system_clock (which the standard library's condition
// variables wait on as they are) nor one with a wait hook (manual_clock). Every structure waits on
// it through detail/wait.hpp. libstdc++ waits for a deadline on such a clock by adding
// (deadline - Clock::now()) to steady_clock::now(), in 64 bits: for a deadline near
// time_point::max() on a clock whose epoch is later than steady_clock's, that sum overflows
// (UBSan reports it) and the wait returns at once, every time: a worker or a taker that spins. The
// tests count what a spinning waiter does many times over (the worker's wake-ups, the clock's
// reads), never time.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <delayq/delay_queue.hpp>
#include <delayq/delayed.hpp>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <stop_token>
#include <thread>
#include <utility>

#include "catch.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using delayq::test::eventually;

namespace {

// Time since an epoch 200 years after steady_clock's (it reads about -2^62.5 ns): the distance from
// its now to a deadline in the last ~90 years of its time line (where the hierarchical wheel's top
// bucket for such a deadline opens too) is more than libstdc++'s conversion holds. Counts its
// reads.
struct late_epoch_clock {
    using duration = std::chrono::nanoseconds;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<late_epoch_clock>;
    [[maybe_unused]] static constexpr bool is_steady = true;  // a chrono Clock; unused here

    static inline std::atomic<std::uint64_t> reads{0};
    static constexpr std::chrono::hours epoch{24 * 365 * 200};

    static time_point now() noexcept {
        reads.fetch_add(1, std::memory_order_relaxed);
        return time_point{std::chrono::steady_clock::now().time_since_epoch() - epoch};
    }
};

using tp = late_epoch_clock::time_point;

// Far past any test's end, and close enough to time_point::max() to overflow the conversion.
const tp far = tp::max() - 1h;

// A threaded wheel holds a task due at `far_at`, and runs two tasks 20 ms apart meanwhile: its
// worker sleeps for each, then for the far one again. A worker that spun would wake up millions of
// times a second; one that sleeps wakes a few times per task.
template <class Timer>
void sleeps_before_a_far_deadline(tp far_at, std::chrono::nanoseconds spin) {
    typename Timer::options o;
    o.tick = 1ms;
    o.spin_before_deadline = spin;
    Timer t(std::move(o));
    t.schedule_at([] {}, far_at);
    std::atomic<int> ran{0};
    for (int i = 1; i <= 2; ++i) {
        t.schedule([&ran] { ++ran; }, 20ms);
        REQUIRE(eventually([&] { return ran.load() == i; }));
    }
    // the far task waits on, while the worker sleeps: allow it to look at the clock once more
    const std::size_t before = t.wakeups();
    t.schedule([&ran] { ++ran; }, 20ms);
    REQUIRE(eventually([&] { return ran.load() == 3; }));
    // Real time for the worker to sleep in before the far task alone (nothing is asserted about
    // time): a worker that spun would wake thousands of times meanwhile.
    std::this_thread::sleep_for(50ms);
    CHECK(t.wakeups() - before < 20);
    CHECK(t.wakeups() < 50);
    const auto back = t.stop();
    CHECK(back.size() == 1);
}

}  // namespace

TEST_CASE("user clock: a threaded wheel's worker sleeps before a deadline near time_point::max()",
          "[time-limits]") {
    SECTION("hashed near max") {
        sleeps_before_a_far_deadline<delayq::hashed_wheel_timer<late_epoch_clock>>(far, 0ns);
    }
    SECTION("hierarchical near max") {
        sleeps_before_a_far_deadline<delayq::hierarchical_timing_wheel<late_epoch_clock>>(far, 0ns);
    }
    // spin_before_deadline: the worker sleeps until max() - spin, which is not max()
    SECTION("hashed at max spinning") {
        sleeps_before_a_far_deadline<delayq::hashed_wheel_timer<late_epoch_clock>>(tp::max(), 1ms);
    }
    SECTION("hierarchical at max spinning") {
        sleeps_before_a_far_deadline<delayq::hierarchical_timing_wheel<late_epoch_clock>>(tp::max(),
                                                                                          1ms);
    }
}

TEST_CASE("user clock: a delay_queue taker sleeps before a head near time_point::max()",
          "[time-limits]") {
    using item = delayq::delayed<int, late_epoch_clock>;
    for (const bool stoppable : {false, true}) {
        CAPTURE(stoppable);
        delayq::delay_queue<item, late_epoch_clock> q;
        REQUIRE(q.put(item{1, far}));
        std::stop_source stop;
        std::atomic<bool> started{false}, got{true};
        std::thread taker([&] {  // no Catch assertion on this thread: Catch is not thread-safe
            started = true;
            got = (stoppable ? q.take(stop.get_token()) : q.take()).has_value();
        });
        REQUIRE(eventually([&] { return started.load(); }));
        const std::uint64_t before = late_epoch_clock::reads.load();
        // Real time for the taker to sleep in (nothing is asserted about time): a taker that spun
        // would read the clock thousands of times meanwhile.
        std::this_thread::sleep_for(50ms);
        const std::uint64_t reads = late_epoch_clock::reads.load() - before;
        if (stoppable) {
            stop.request_stop();
        } else {
            CHECK(q.close().size() == 1);
        }
        taker.join();
        CHECK_FALSE(got);
        CHECK(reads < 20);
    }
}
