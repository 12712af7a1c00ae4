// reschedule() and periodic tasks (schedule_every) on both wheels (issue 15), driven by
// manual_clock through the thread-free cores; then reschedule racing expiry on the threaded timers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <delayq/detail/periodic.hpp>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "support.hpp"
#include "wheels.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using tp = mc::time_point;
using dur = mc::duration;
using handle = delayq::timeout<mc>;
using delayq::missed_tick;

namespace {

using hashed = delayq::test::hashed_core;
using hierarchical = delayq::test::hierarchical_core;

// Sets the clock and runs what is due, as an event loop would.
template <class W>
std::size_t at(W& w, tp t) {
    mc::set(t);
    return w.advance(t);
}

const tp t0{1h};

}  // namespace

TEMPLATE_TEST_CASE("reschedule moves a pending task, keeps its callable and handle, never early",
                   "", hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<tp> ran;
    auto keep = std::make_shared<int>(7);
    handle h = w.schedule_at([&, keep] { ran.push_back(mc::now()); }, t0 + 10ms);
    CHECK(h.reschedule_at(t0 + 25ms));  // later
    CHECK(h.deadline() == t0 + 25ms);
    CHECK(h.pending());
    CHECK(w.pending() == 1);
    CHECK(keep.use_count() == 2);       // the callable was kept, not copied or destroyed
    CHECK(at(w, t0 + 24ms) == 0);       // its old deadline is gone, its new one not yet come
    CHECK(h.reschedule_at(t0 + 12ms));  // earlier, behind the clock: due at the next pass
    CHECK(at(w, t0 + 24ms + 500us) == 1);
    REQUIRE(ran.size() == 1);
    CHECK(h.expired());
    CHECK_FALSE(h.reschedule(1ms));  // it ran: nothing changes
    CHECK(h.deadline() == t0 + 12ms);
    handle c = w.schedule_at([&] { ran.push_back(mc::now()); }, t0 + 40ms);
    CHECK(c.cancel());
    CHECK_FALSE(c.reschedule(1ms));  // cancelled: nothing changes
    CHECK(w.pending() == 0);
    handle d = w.schedule([&] { ran.push_back(mc::now()); }, 5ms);
    CHECK(d.reschedule(30ms));
    CHECK(at(w, mc::now() + 29ms) == 0);
    CHECK(at(w, mc::now() + 1ms) == 1);
    CHECK(ran.back() == d.deadline());  // precise: at its new deadline
    mc::reset();
}

TEMPLATE_TEST_CASE("reschedule from a task of the same pass moves a task that was due in it", "",
                   hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<int> ran;
    handle b;
    bool moved = false;
    w.schedule_at(
        [&] {
            ran.push_back(1);
            moved = b.reschedule_at(t0 + 50ms);
        },
        t0 + 5ms);
    b = w.schedule_at([&] { ran.push_back(2); }, t0 + 6ms);
    CHECK(at(w, t0 + 10ms) == 1);  // b was due in this pass, and moved before it started
    CHECK(moved);
    CHECK(ran == std::vector<int>{1});
    CHECK(b.pending());
    CHECK(w.pending() == 1);
    CHECK(at(w, t0 + 49ms) == 0);
    CHECK(at(w, t0 + 50ms) == 1);
    CHECK(ran == std::vector<int>{1, 2});
    mc::reset();
}

// Period 10 ms, first due at t0 + 10 ms; the driver is on time for the first run, then comes back
// at t0 + 45 ms, late by two and a half periods.
TEMPLATE_TEST_CASE("periodic: each missed-tick policy with a driver back late by several periods",
                   "", hashed, hierarchical) {
    for (const missed_tick policy : {missed_tick::skip, missed_tick::burst, missed_tick::delay}) {
        CAPTURE(static_cast<int>(policy));
        mc::set(t0);
        typename TestType::wheel w(TestType::options());
        std::vector<tp> runs;
        handle h = w.schedule_every([&] { runs.push_back(mc::now()); }, 10ms, policy);
        CHECK(h.deadline() == t0 + 10ms);
        CHECK(at(w, t0 + 10ms) == 1);
        CHECK(h.pending());  // a periodic task stays pending
        CHECK_FALSE(h.expired());
        CHECK(h.deadline() == t0 + 20ms);
        CHECK(w.pending() == 1);
        // late: the run due at 20 ms happens at 45 ms (with burst, those due at 30 and 40 too)
        CHECK(at(w, t0 + 45ms) == (policy == missed_tick::burst ? 3U : 1U));
        switch (policy) {
            case missed_tick::skip:  // the runs due at 30 and 40 are dropped; the grid stays
                CHECK(h.deadline() == t0 + 50ms);
                CHECK(at(w, t0 + 45ms) == 0);
                CHECK(at(w, t0 + 50ms) == 1);
                CHECK(h.deadline() == t0 + 60ms);
                break;
            case missed_tick::burst:  // the runs due at 30 and 40 happened too, in that pass
                CHECK(h.deadline() == t0 + 50ms);
                CHECK(at(w, t0 + 45ms) == 0);
                CHECK(at(w, t0 + 50ms) == 1);
                break;
            case missed_tick::delay:  // the grid moves: next one period after the late run
                CHECK(h.deadline() == t0 + 55ms);
                CHECK(at(w, t0 + 54ms) == 0);
                CHECK(at(w, t0 + 55ms) == 1);
                CHECK(h.deadline() == t0 + 65ms);
                break;
        }
        for (std::size_t i = 1; i < runs.size(); ++i) CHECK(runs[i] >= runs[i - 1]);
        CHECK(h.cancel());
        CHECK(h.cancelled());
        CHECK(w.pending() == 0);
        const std::size_t n = runs.size();
        CHECK(at(w, t0 + 1s) == 0);
        CHECK(runs.size() == n);
    }
    mc::reset();
}

TEMPLATE_TEST_CASE("periodic: fixed-rate deadlines do not drift", "", hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<tp> runs;
    const dur period = 3ms + 7ns;  // off the tick grid
    handle h = w.schedule_every_at([&] { runs.push_back(mc::now()); }, t0 + 1ms, period);
    for (int k = 0; k < 1000; ++k) CHECK(at(w, t0 + 1ms + k * period) == 1);
    REQUIRE(runs.size() == 1000);
    for (int k = 0; k < 1000; ++k)
        CHECK(runs[static_cast<std::size_t>(k)] == t0 + 1ms + k * period);
    CHECK(h.deadline() == t0 + 1ms + 1000 * period);
    CHECK(h.cancel());
    mc::reset();
}

// Period 10 ms, first due at 10 ms, the driver back at 45 ms: the runs due at 20, 30 and 40 all
// happen in that one advance(), back to back, each seeing its own due time as deadline().
TEMPLATE_TEST_CASE("periodic burst: one late advance runs every missed run, back to back", "",
                   hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<tp> runs, due;
    handle h;
    h = w.schedule_every(
        [&] {
            runs.push_back(mc::now());
            due.push_back(h.deadline());
        },
        10ms, missed_tick::burst);
    CHECK(at(w, t0 + 10ms) == 1);
    CHECK(at(w, t0 + 45ms) == 3);
    CHECK(runs == std::vector<tp>{t0 + 10ms, t0 + 45ms, t0 + 45ms, t0 + 45ms});
    CHECK(due == std::vector<tp>{t0 + 10ms, t0 + 20ms, t0 + 30ms, t0 + 40ms});
    CHECK(h.deadline() == t0 + 50ms);  // back on the grid
    CHECK(h.pending());
    CHECK(w.pending() == 1);
    CHECK(at(w, t0 + 45ms) == 0);
    CHECK(at(w, t0 + 50ms) == 1);
    CHECK(runs.size() == 5);
    CHECK(h.cancel());
    CHECK(w.pending() == 0);
    mc::reset();
}

// A burst task's missed runs run at its place in the pass; a one-shot task due in the same pass
// runs once, and a task scheduled by a run waits for the next pass, as any task scheduled by a
// task.
TEMPLATE_TEST_CASE("periodic burst: many missed runs in one pass, other tasks once, none lost", "",
                   hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::size_t bursts = 0, once = 0, spawned = 0;
    handle h = w.schedule_every_at(
        [&] {
            if (++bursts == 2) w.schedule_at([&] { ++spawned; }, t0);
        },
        t0 + 1ms, 1us, missed_tick::burst);
    w.schedule_at([&] { ++once; }, t0 + 5ms);
    // due at 1 ms + k us for k = 0 .. 9000: 9001 runs, and the one-shot task
    CHECK(at(w, t0 + 10ms) == 9002);
    CHECK(bursts == 9001);
    CHECK(once == 1);
    CHECK(spawned == 0);
    CHECK(h.deadline() == t0 + 10ms + 1us);
    CHECK(w.pending() == 2);
    CHECK(at(w, t0 + 10ms) == 1);  // the task a run scheduled
    CHECK(spawned == 1);
    CHECK(bursts == 9001);
    CHECK(h.cancel());
    CHECK(w.pending() == 0);
    mc::reset();
}

// The threaded timers on manual_clock: the worker runs the same three runs at 45 ms, and no more.
template <class Timer>
void burst_on_worker() {
    mc::set(t0);
    typename Timer::options o;
    o.tick = 1ms;
    Timer t(std::move(o));
    std::mutex m;
    std::vector<tp> due;
    std::atomic<std::size_t> count{0};
    handle h;
    {
        std::lock_guard lk(m);  // h is assigned before the first run reads it
        h = t.schedule_every(
            [&] {
                std::lock_guard l(m);
                due.push_back(h.deadline());
                ++count;
            },
            10ms, missed_tick::burst);
    }
    mc::set(t0 + 10ms);
    CHECK(delayq::test::eventually([&] { return count.load() == 1; }));
    mc::set(t0 + 45ms);
    CHECK(delayq::test::eventually([&] { return count.load() == 4; }));
    CHECK(delayq::test::eventually([&] { return h.deadline() == t0 + 50ms; }));
    CHECK(h.cancel());
    t.stop();
    std::lock_guard lk(m);
    CHECK(due == std::vector<tp>{t0 + 10ms, t0 + 20ms, t0 + 30ms, t0 + 40ms});
    mc::reset();
}

TEST_CASE("periodic burst: the threaded timers run every missed run at 45 ms") {
    burst_on_worker<delayq::hashed_wheel_timer<mc>>();
    burst_on_worker<delayq::hierarchical_timing_wheel<mc>>();
}

// A run whose successor would lie past time_point::max() is the last: the task ends (expired, no
// longer pending) instead of running again at every pass once the clock reads time_point::max().
TEMPLATE_TEST_CASE("periodic: the run whose successor lies past time_point::max() is the last", "",
                   hashed, hierarchical) {
    for (const missed_tick policy : {missed_tick::skip, missed_tick::burst, missed_tick::delay}) {
        CAPTURE(static_cast<int>(policy));
        mc::set(tp::max() - 1h);
        typename TestType::wheel w(TestType::options());
        auto alive = std::make_shared<int>(0);
        std::vector<tp> due;
        handle h;
        h = w.schedule_every_at([&, alive] { due.push_back(h.deadline()); }, tp::max() - 25ms, 10ms,
                                policy);
        CHECK(at(w, tp::max() - 25ms) == 1);
        CHECK(h.deadline() == tp::max() - 15ms);
        // the clock reaches the end of time: due at max - 15 (and, burst, max - 5); max + 5 is not
        const std::size_t last = policy == missed_tick::burst ? 2U : 1U;
        CHECK(at(w, tp::max()) == last);
        CHECK(due.size() == 1 + last);
        CHECK(due.back() == (policy == missed_tick::burst ? tp::max() - 5ms : tp::max() - 15ms));
        CHECK(at(w, tp::max()) == 0);
        CHECK(at(w, tp::max()) == 0);
        CHECK(due.size() == 1 + last);
        CHECK(h.expired());
        CHECK_FALSE(h.pending());
        CHECK_FALSE(h.cancel());
        CHECK(w.pending() == 0);
        CHECK(alive.use_count() == 1);  // the task was destroyed after its last run

        // a run due at time_point::max() itself runs, and is the last
        mc::set(tp::max() - 1h);
        typename TestType::wheel w2(TestType::options());
        std::size_t runs = 0;
        handle e = w2.schedule_every_at([&] { ++runs; }, tp::max() - 20ms, 10ms, policy);
        CHECK(at(w2, tp::max() - 20ms) == 1);
        CHECK(at(w2, tp::max() - 10ms) == 1);
        CHECK(e.deadline() == tp::max());
        CHECK(at(w2, tp::max()) == 1);
        CHECK(at(w2, tp::max()) == 0);
        CHECK(runs == 3);
        CHECK(e.expired());
        CHECK(w2.pending() == 0);

        // a period far past the end: the first run is the last
        mc::set(tp::max() - 1h);
        typename TestType::wheel w3(TestType::options());
        handle f =
            w3.schedule_every_at([&] { ++runs; }, tp::max() - 1ms, std::chrono::hours(1), policy);
        CHECK(at(w3, tp::max() - 1ms) == 1);
        CHECK(f.expired());
        CHECK(f.deadline() == tp::max() - 1ms);
        CHECK(at(w3, tp::max()) == 0);
        CHECK(runs == 4);
        CHECK(w3.pending() == 0);
    }
    mc::reset();
}

// The widest lateness there is: first due at time_point::min(), period 1 ns, run when the clock
// reads time_point::max(). Skip's next run is the (2^64)-th: past the end, so that run was the last
// (the count of periods must not wrap to 0 and put the next run back in the past).
TEMPLATE_TEST_CASE("periodic skip late by the whole time line: that run is the last", "", hashed,
                   hierarchical) {
    mc::set(tp::max() - 1h);
    typename TestType::wheel w(TestType::options());
    std::size_t runs = 0;
    handle h = w.schedule_every_at([&] { ++runs; }, tp::min(), 1ns, missed_tick::skip);
    CHECK(at(w, tp::max()) == 1);
    CHECK(at(w, tp::max()) == 0);
    CHECK(runs == 1);
    CHECK(h.expired());
    CHECK(h.deadline() == tp::min());
    CHECK(w.pending() == 0);
    mc::reset();
}

// A burst with a 1 us period, late by a millisecond at the end of time: its thousand missed runs
// happen in one pass, and the one due at time_point::max() is the last; no pass runs it again.
TEMPLATE_TEST_CASE("periodic burst at time_point::max(): every missed run once, then it ends", "",
                   hashed, hierarchical) {
    mc::set(tp::max() - 1h);
    typename TestType::wheel w(TestType::options());
    std::size_t runs = 0;
    handle h = w.schedule_every_at([&] { ++runs; }, tp::max() - 1ms, 1us, missed_tick::burst);
    CHECK(at(w, tp::max() - 1ms) == 1);
    CHECK(at(w, tp::max()) == 1000);  // due at max - 1 ms + k us, k = 1 .. 1000
    CHECK(at(w, tp::max()) == 0);
    CHECK(runs == 1001);
    CHECK(h.expired());
    CHECK(h.deadline() == tp::max());
    CHECK(w.pending() == 0);
    mc::reset();
}

// The grid's arithmetic on its own (detail/periodic.hpp), at its edges: a period of one tick
// caught up after a billion missed periods, the phase a skip keeps, the run at time_point::max()
// itself, and the end of time for each policy (nullopt, the grid untouched).
TEST_CASE("periodic arithmetic: one-tick periods, many missed runs, the end of time") {
    using part = delayq::detail::periodic_part<mc>;
    using delayq::detail::next_run;
    using delayq::detail::repeat_policy;
    constexpr dur tick{1};
    {  // skip, one tick, late by 10^9 periods: the first run after the late one, on the grid
        part every{t0, tick, 0, repeat_policy::skip};
        CHECK(next_run(every, t0 + 1s) == t0 + 1s + tick);
        CHECK(every.k == 1'000'000'001U);
        CHECK(every.start == t0);
    }
    {  // skip keeps the phase: period 3, late by 10 ticks: the 4th run, not now + 3
        part every{t0, 3 * tick, 0, repeat_policy::skip};
        CHECK(next_run(every, t0 + 10 * tick) == t0 + 12 * tick);
        CHECK(every.k == 4U);
    }
    {  // burst: one period on, however late; the run due at max itself is the last one reached
        part every{tp::max() - 2 * tick, tick, 0, repeat_policy::burst};
        CHECK(next_run(every, tp::max()) == tp::max() - tick);
        CHECK(next_run(every, tp::max()) == tp::max());
        CHECK(every.k == 2U);
        CHECK(next_run(every, tp::max()) == std::nullopt);
        CHECK(every.k == 2U);
    }
    {  // delay: one period after the late run, the grid moved there; none past max
        part every{t0, tick, 7, repeat_policy::delay};
        CHECK(next_run(every, tp::max() - tick) == tp::max());
        CHECK(every.start == tp::max());
        CHECK(every.k == 0U);
        every.start = t0;
        CHECK(next_run(every, tp::max()) == std::nullopt);
        CHECK(every.start == t0);
    }
    {  // skip late by the whole time line: the 2^64-th run lies past max (k does not wrap to 0)
        part every{tp::min(), tick, 0, repeat_policy::skip};
        CHECK(next_run(every, tp::max()) == std::nullopt);
        CHECK(every.k == 0U);
        CHECK(every.start == tp::min());
    }
    {  // a reschedule starts the grid again
        part every{t0, tick, 41, repeat_policy::skip};
        delayq::detail::restart_grid(every, t0 + 1h);
        CHECK(every.start == t0 + 1h);
        CHECK(every.k == 0U);
        CHECK(next_run(every, t0) == t0 + 1h + tick);
    }
    // constexpr: the grid can be worked out at compile time
    static_assert([] {
        part every{tp{}, 10ns, 0, repeat_policy::skip};
        return next_run(every, tp{25ns}) == tp{30ns} && every.k == 3;
    }());
}

// The contract of reschedule() during a run: it returns whether the task is pending(). A one-shot
// task stops being pending when it is handed to run: false, nothing moves. A periodic task is
// pending during its runs: true, and its next run moves there (its later runs follow from it).
TEMPLATE_TEST_CASE(
    "reschedule of itself during its run: a periodic task moves its next run, a "
    "one-shot task does not",
    "", hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<tp> periodic_runs;
    handle p;
    bool p_moved = false, p_pending = false;
    tp p_seen{};
    p = w.schedule_every(
        [&] {
            periodic_runs.push_back(mc::now());
            if (periodic_runs.size() == 1) {
                p_pending = p.pending();
                p_moved = p.reschedule_at(t0 + 25ms);
                p_seen = p.deadline();
            }
        },
        10ms);
    int once_runs = 0;
    handle o;
    bool o_moved = true, o_expired = false;
    o = w.schedule_at(
        [&] {
            ++once_runs;
            o_expired = o.expired();
            o_moved = o.reschedule_at(t0 + 30ms);
        },
        t0 + 10ms);
    CHECK(at(w, t0 + 10ms) == 2);
    CHECK(p_pending);
    CHECK(p_moved);
    CHECK(p_seen == t0 + 25ms);
    CHECK(p.deadline() == t0 + 25ms);
    CHECK(o_expired);
    CHECK_FALSE(o_moved);
    CHECK(o.deadline() == t0 + 10ms);
    CHECK(o.expired());
    CHECK(w.pending() == 1);
    CHECK(at(w, t0 + 20ms) == 0);  // its old next run is gone
    CHECK(at(w, t0 + 25ms) == 1);
    CHECK(at(w, t0 + 30ms) == 0);  // the one-shot task did not come back
    CHECK(at(w, t0 + 35ms) == 1);  // the grid starts again at 25
    CHECK(periodic_runs == std::vector<tp>{t0 + 10ms, t0 + 25ms, t0 + 35ms});
    CHECK(once_runs == 1);
    CHECK(p.cancel());
    CHECK(w.pending() == 0);
    mc::reset();
}

// Rescheduled during a burst run, a periodic task's remaining missed runs are dropped (the grid
// starts again where it was moved); moved to a time already passed, it runs at the next pass, as
// any task rescheduled into the past, not again in this one.
TEMPLATE_TEST_CASE("reschedule of itself during a burst run ends the burst there", "", hashed,
                   hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<tp> due;
    handle h;
    tp move_to = t0 + 100ms;
    bool moved = false;
    h = w.schedule_every(
        [&] {
            due.push_back(h.deadline());
            if (due.size() == 2) moved = h.reschedule_at(move_to);
        },
        10ms, missed_tick::burst);
    CHECK(at(w, t0 + 10ms) == 1);
    CHECK(at(w, t0 + 45ms) == 1);  // the run due at 20 moved the next one to 100: 30, 40 dropped
    CHECK(moved);
    CHECK(h.deadline() == t0 + 100ms);
    CHECK(at(w, t0 + 100ms) == 1);
    CHECK(h.deadline() == t0 + 110ms);
    CHECK(due == std::vector<tp>{t0 + 10ms, t0 + 20ms, t0 + 100ms});
    CHECK(h.cancel());

    // into the past: not run again in the same pass
    due.clear();
    moved = false;
    move_to = t0;
    h = w.schedule_every_at(
        [&] {
            due.push_back(h.deadline());
            if (due.size() == 2) moved = h.reschedule_at(move_to);
        },
        t0 + 200ms, 10ms, missed_tick::burst);
    CHECK(at(w, t0 + 200ms) == 1);
    CHECK(at(w, t0 + 235ms) == 1);
    CHECK(moved);
    CHECK(h.deadline() == t0);
    // the next pass: the grid from t0, 24 runs due at t0 + 0 .. 230 ms, burst
    CHECK(at(w, t0 + 235ms) == 24);
    CHECK(h.deadline() == t0 + 240ms);
    CHECK(due.size() == 2 + 24);
    CHECK(h.cancel());
    CHECK(w.pending() == 0);
    mc::reset();
}

TEMPLATE_TEST_CASE("periodic: cancel from inside the task, a throwing run, stop() hands it back",
                   "", hashed, hierarchical) {
    mc::set(t0);
    auto o = TestType::options();
    int errors = 0;
    o.on_error = [&](std::exception_ptr) { ++errors; };
    typename TestType::wheel w(std::move(o));
    auto alive = std::make_shared<int>(0);
    int runs = 0;
    handle self;
    bool cancelled_inside = false;
    self = w.schedule_every(
        [&, alive] {
            if (++runs == 3) cancelled_inside = self.cancel();
        },
        10ms);
    int thrown = 0;
    w.schedule_every(
        [&] {
            ++thrown;
            throw std::runtime_error("periodic task throws");
        },
        10ms);
    for (int k = 1; k <= 5; ++k) at(w, t0 + k * 10ms);
    CHECK(runs == 3);  // not after it cancelled itself
    CHECK(cancelled_inside);
    CHECK(self.cancelled());
    CHECK(alive.use_count() == 1);  // its capture was destroyed when that run ended
    CHECK(thrown == 5);             // the period goes on after each throw
    CHECK(errors == 5);
    CHECK(w.pending() == 1);
    auto rest = w.stop();
    REQUIRE(rest.size() == 1);
    CHECK(rest[0].cancelled());
    CHECK(rest[0].deadline() == t0 + 60ms);
    CHECK(at(w, t0 + 1s) == 0);
    CHECK(thrown == 5);
    mc::reset();
}

TEMPLATE_TEST_CASE(
    "periodic: reschedule moves the next run and the grid - and a period <= 0 is invalid", "",
    hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    std::vector<tp> runs;
    handle h = w.schedule_every([&] { runs.push_back(mc::now()); }, 10ms);
    CHECK(at(w, t0 + 10ms) == 1);
    CHECK(h.reschedule_at(t0 + 33ms));
    CHECK(at(w, t0 + 20ms) == 0);
    CHECK(at(w, t0 + 33ms) == 1);
    CHECK(h.deadline() == t0 + 43ms);
    CHECK(at(w, t0 + 43ms) == 1);
    CHECK(runs == std::vector<tp>{t0 + 10ms, t0 + 33ms, t0 + 43ms});
    CHECK_THROWS_AS(w.schedule_every([] {}, 0ms), std::invalid_argument);
    CHECK_THROWS_AS(w.schedule_every([] {}, -1ms), std::invalid_argument);
    CHECK(w.pending() == 1);
    mc::reset();
}

// stop() from inside a periodic task's run counts it out (it runs no more); a cancel() or
// reschedule() of it later in that run finds nothing to do, and the count stays exact.
TEMPLATE_TEST_CASE("periodic: stop() during its run - then cancel and reschedule find nothing",
                   "[stop]", hashed, hierarchical) {
    mc::set(t0);
    typename TestType::wheel w(TestType::options());
    handle self;
    int runs = 0;
    bool cancelled = true, moved = true;
    std::size_t handed_back = 99;
    self = w.schedule_every(
        [&] {
            ++runs;
            handed_back = w.stop().size();  // this task is running: not handed back
            cancelled = self.cancel();
            moved = self.reschedule(1ms);
        },
        10ms);
    CHECK(at(w, t0 + 10ms) == 1);
    CHECK(runs == 1);
    CHECK(handed_back == 0);
    CHECK_FALSE(cancelled);
    CHECK_FALSE(moved);
    CHECK(w.pending() == 0);
    CHECK(self.cancelled());
    CHECK(at(w, t0 + 1s) == 0);
    CHECK(runs == 1);
    mc::reset();
}

// Threads reschedule tasks while the worker expires them: each one-shot task runs exactly once,
// never before the deadline it last got (a task reads its own deadline when it runs: reschedule()
// cannot move a task that started).
template <class Timer>
void reschedule_racing_expiry() {
    using clk = std::chrono::steady_clock;
    constexpr int n = 3000;
    typename Timer::options o;
    o.tick = 1ms;
    Timer t(std::move(o));
    std::vector<delayq::timeout<clk>> hs(n);
    std::vector<std::atomic<int>> runs(n);
    std::atomic<int> early{0}, started{0};
    for (int i = 0; i < n; ++i)
        hs[static_cast<std::size_t>(i)] = t.schedule(
            [&, i] {
                while (started.load() == 0) std::this_thread::yield();  // hs is complete
                if (clk::now() < hs[static_cast<std::size_t>(i)].deadline()) ++early;
                ++runs[static_cast<std::size_t>(i)];
            },
            // due over a second: the movers, however late they start, find tasks to move
            std::chrono::microseconds(5000 + (i * 7919) % 1000000));
    started = 1;
    std::atomic<int> moved{0};
    std::vector<std::thread> movers;
    for (int m = 0; m < 2; ++m)
        movers.emplace_back([&, m] {
            std::mt19937 rng(static_cast<unsigned>(m));
            const auto end = clk::now() + 40ms;
            while (clk::now() < end) {
                auto& h = hs[rng() % n];
                if (h.reschedule(std::chrono::microseconds(rng() % 3000))) ++moved;
            }
        });
    for (auto& m : movers) m.join();
    CHECK(delayq::test::eventually([&] { return t.pending() == 0; }));
    t.stop();
    for (int i = 0; i < n; ++i) CHECK(runs[static_cast<std::size_t>(i)].load() == 1);
    CHECK(early.load() == 0);
    CHECK(moved.load() > 0);
}

TEST_CASE("reschedule racing expiry on the threaded timers: every task runs once, never early") {
    reschedule_racing_expiry<delayq::hashed_wheel_timer<>>();
    reschedule_racing_expiry<delayq::hierarchical_timing_wheel<>>();
}

// Periodic tasks on the worker while two threads reschedule and cancel them: a task never runs
// concurrently with itself, ends when cancelled, and every capture is destroyed.
template <class Timer>
void periodic_racing_handles() {
    using clk = std::chrono::steady_clock;
    constexpr int n = 200;
    typename Timer::options o;
    o.tick = 1ms;
    Timer t(std::move(o));
    struct state {
        std::atomic<int> inside{0}, overlap{0};
    };
    std::vector<state> st(n);
    auto alive = std::make_shared<int>(0);
    std::vector<delayq::timeout<clk>> hs;
    for (int i = 0; i < n; ++i) {
        state& s = st[static_cast<std::size_t>(i)];
        hs.push_back(t.schedule_every(
            [&s, alive] {
                if (s.inside.fetch_add(1) != 0) ++s.overlap;
                s.inside.fetch_sub(1);
            },
            std::chrono::microseconds(200 + (i * 37) % 800), static_cast<missed_tick>(i % 3)));
    }
    std::vector<std::thread> movers;
    for (int m = 0; m < 2; ++m)
        movers.emplace_back([&, m] {
            std::mt19937 rng(static_cast<unsigned>(m));
            const auto end = clk::now() + 60ms;
            while (clk::now() < end) {
                const std::size_t i = rng() % n;
                if (rng() % 16 == 0) {
                    hs[i].cancel();
                } else {
                    hs[i].reschedule(std::chrono::microseconds(rng() % 2000));
                }
            }
        });
    for (auto& m : movers) m.join();
    for (auto& h : hs) h.cancel();
    t.stop();
    CHECK(t.pending() == 0);
    int overlap = 0;
    for (auto& s : st) overlap += s.overlap.load();
    CHECK(overlap == 0);
    CHECK(alive.use_count() == 1);  // every task's capture is gone
}

TEST_CASE("periodic tasks racing reschedule and cancel on the threaded timers") {
    periodic_racing_handles<delayq::hashed_wheel_timer<>>();
    periodic_racing_handles<delayq::hierarchical_timing_wheel<>>();
}
