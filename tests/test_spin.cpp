// spin_before_deadline (both threaded wheels): the worker spins instead of sleeping for the last
// stretch before a task's deadline. With manual_clock, whose time moves only when a test sets it,
// a spin of an hour means the worker always spins: tasks must still run at their deadlines, never
// early, an earlier schedule must end the spin, stop() must not wait for it, and a clock that does
// not move must not keep the worker spinning for ever.
#include <atomic>
#include <chrono>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <stdexcept>

#include "catch.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using tp = mc::time_point;

namespace {

template <class Timer>
typename Timer::options spinning(std::chrono::nanoseconds spin) {
    typename Timer::options o;
    o.tick = 1ms;
    o.spin_before_deadline = spin;
    return o;
}

// Records the clock's time when it runs.
struct record {
    std::atomic<tp::rep>* at;
    void operator()() const { at->store(mc::now().time_since_epoch().count()); }
};

constexpr tp::rep never_ran = -1;

template <class Timer>
void runs_on_time_while_spinning() {
    mc::set(tp{} + 1000s);
    Timer t(spinning<Timer>(std::chrono::hours(1)));
    const tp t0 = mc::now();
    std::atomic<tp::rep> a{never_ran}, b{never_ran}, c{never_ran};
    t.schedule_at(record{&a}, t0 + 10ms);
    mc::set(t0 + 5ms);  // the worker spins for a; a must not run before its deadline
    mc::set(t0 + 10ms);
    REQUIRE(delayq::test::eventually([&] { return a.load() != never_ran; }));
    CHECK(a.load() >= (t0 + 10ms).time_since_epoch().count());

    // spinning for b (due at +20 ms), a schedule of c before it ends the spin: c runs first. The
    // test gives the worker 100 ms of real time to start spinning for b (it cannot see the spin);
    // were it slower, c would be scheduled before the worker looks, and the test pass trivially.
    t.schedule_at(record{&b}, t0 + 20ms);
    const auto spinning_by = std::chrono::steady_clock::now() + 100ms;
    delayq::test::eventually([&] { return std::chrono::steady_clock::now() >= spinning_by; });
    t.schedule_at(record{&c}, t0 + 15ms);
    mc::set(t0 + 15ms);
    // before the spinner would give up by itself (2 s of real time spinning): the wake-up ended it
    REQUIRE(delayq::test::eventually([&] { return c.load() != never_ran; }, 1500ms));
    CHECK(c.load() == (t0 + 15ms).time_since_epoch().count());
    CHECK(b.load() == never_ran);
    mc::set(t0 + 20ms);
    REQUIRE(delayq::test::eventually([&] { return b.load() != never_ran; }));
    CHECK(b.load() == (t0 + 20ms).time_since_epoch().count());

    // stop() while the worker spins for a task an hour away: it returns, handing the task back
    std::atomic<tp::rep> d{never_ran};
    t.schedule_at(record{&d}, t0 + 1h);
    const auto back = t.stop();
    CHECK(back.size() == 1);
    CHECK(d.load() == never_ran);
}

}  // namespace

TEST_CASE("spin_before_deadline: hashed_wheel_timer runs tasks at their deadlines while spinning") {
    runs_on_time_while_spinning<delayq::hashed_wheel_timer<mc>>();
}

TEST_CASE(
    "spin_before_deadline: hierarchical_timing_wheel runs tasks at their deadlines while "
    "spinning") {
    runs_on_time_while_spinning<delayq::hierarchical_timing_wheel<mc>>();
}

TEST_CASE("spin_before_deadline: a clock that does not move sends the spinner to sleep") {
    mc::set(tp{} + 1000s);
    delayq::hashed_wheel_timer<mc> t(
        spinning<delayq::hashed_wheel_timer<mc>>(std::chrono::hours(1)));
    std::atomic<tp::rep> a{never_ran};
    t.schedule_at(record{&a}, mc::now() + 10ms);
    // after 2 s of spinning without the clock moving, the worker sleeps on the clock instead
    REQUIRE(delayq::test::eventually([] { return mc::sleepers() == 1; }, 30s));
    mc::advance(10ms);
    REQUIRE(delayq::test::eventually([&] { return a.load() != never_ran; }));
}

TEST_CASE("spin_before_deadline: a negative spin is refused") {
    using H = delayq::hashed_wheel_timer<mc>;
    using K = delayq::hierarchical_timing_wheel<mc>;
    CHECK_THROWS_AS(H(spinning<H>(-1ns)), std::invalid_argument);
    CHECK_THROWS_AS(K(spinning<K>(-1ns)), std::invalid_argument);
    CHECK_THROWS_AS(delayq::hashed_wheel<mc>(spinning<H>(-1ns)), std::invalid_argument);
    CHECK_THROWS_AS(delayq::hierarchical_wheel<mc>(spinning<K>(-1ns)), std::invalid_argument);
}
