// hashed_wheel<Clock> (the thread-free core) and hashed_wheel_timer<Clock> (core + worker).
//
// Timing is driven by manual_clock, so nothing here sleeps on the time line it tests. The worker
// tests keep a far "sentinel" task pending, so that the worker always sleeps on a manual_clock
// deadline: then `step()` can move the clock and wait until the worker has woken, run what is due
// and gone back to sleep (its wake-up count went up and it sleeps on the clock again).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/manual_clock.hpp>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using wheel = delayq::hashed_wheel<mc>;
using timer = delayq::hashed_wheel_timer<mc>;
using tp = mc::time_point;
using handle = delayq::timeout<mc>;

namespace {

delayq::hashed_wheel_options<mc> opts(mc::duration tick, std::size_t wheel_size = 8,
                                      std::size_t max_pending = 0, bool precise = true) {
    delayq::hashed_wheel_options<mc> o;
    o.tick = tick;
    o.wheel_size = wheel_size;
    o.max_pending = max_pending;
    o.precise = precise;
    return o;
}

// Spins (yielding) until p() holds; fails the test after 30 s of real time.
template <class P>
void wait_for(P p) {
    const auto limit = std::chrono::steady_clock::now() + 30s;
    while (!p()) {
        if (std::chrono::steady_clock::now() > limit) FAIL("timed out waiting");
        std::this_thread::yield();
    }
}

// Waits until the worker sleeps on the manual clock for the first time.
void first_sleep() {
    wait_for([] { return mc::sleepers() == 1; });
}

// Moves the clock by d and waits until the worker has woken, run what is due, and sleeps again.
// Precondition: the worker sleeps on the clock (first_sleep() or an earlier step()).
void step(timer& t, mc::duration d) {
    const std::size_t w = t.wakeups();
    mc::advance(d);
    wait_for([&] { return t.wakeups() > w && mc::sleepers() == 1; });
}

auto sentinel() {
    return [] {};
}

// Counts how many of its copies are alive: a task's capture, to see when a task is destroyed.
struct tracker {
    std::shared_ptr<std::atomic<int>> alive;
    explicit tracker(std::shared_ptr<std::atomic<int>> a) : alive(std::move(a)) { ++*alive; }
    tracker(const tracker& o) : alive(o.alive) { ++*alive; }
    tracker(tracker&& o) noexcept : alive(o.alive) { ++*alive; }
    ~tracker() { --*alive; }
};

struct move_only_task {
    std::unique_ptr<int> p;
    void operator()() const {}
};

}  // namespace

TEST_CASE(
    "a task runs at its deadline (precise) or its tick boundary, never early, at every rotation "
    "edge") {
    const mc::duration tick = 10ms;
    const mc::duration rot = 8 * tick;  // 8 buckets
    const std::vector<mc::duration> delays = {0ns,
                                              1ns,
                                              tick - 1ns,
                                              tick,
                                              tick + 1ns,
                                              2 * tick + 5ms,
                                              rot - tick,
                                              rot - 1ns,
                                              rot,
                                              rot + 1ns,
                                              rot + tick,
                                              rot + tick + 1ns,
                                              5 * rot + 3 * tick + 1ns,
                                              1000 * rot,
                                              1000 * rot + 7 * tick + 1ns};
    for (const bool precise : {true, false}) {
        for (const mc::duration start :
             {mc::duration(0ns), mc::duration(3ns),
              mc::duration(7ms)}) {  // the wheel's origin, on or off a round number
            for (const mc::duration d : delays) {
                for (const bool jump : {false, true}) {
                    CAPTURE(precise, start.count(), d.count(), jump);
                    mc::reset();
                    mc::advance(start);
                    wheel w(opts(tick, 8, 0, precise));
                    const tp origin = mc::now();
                    const tp deadline = origin + d;
                    // The first tick boundary at or after the deadline.
                    const tp boundary = origin + ((d + tick - 1ns) / tick) * tick;
                    const tp expected = precise ? deadline : boundary;
                    tp ran_at = tp::max();
                    auto h = w.schedule_at([&] { ran_at = mc::now(); }, deadline);
                    REQUIRE(w.next_expiry() == expected);
                    if (jump) {
                        if (expected > origin) {
                            mc::set(expected - 1ns);
                            REQUIRE(w.advance() == 0);
                        }
                        mc::set(expected);
                        REQUIRE(w.advance() == 1);
                        CHECK(ran_at == expected);
                    } else {
                        while (w.advance() == 0) {
                            REQUIRE(mc::now() < boundary);
                            mc::advance(tick);
                        }
                        CHECK(ran_at == boundary);  // stepping by whole ticks from the origin
                    }
                    CHECK(ran_at >= deadline);
                    CHECK(ran_at - deadline < tick);
                    CHECK(h.expired());
                    CHECK(w.pending() == 0);
                    CHECK_FALSE(w.next_expiry().has_value());
                }
            }
        }
    }
}

TEST_CASE("a task comes out only when its deadline has passed even when the wheel is late") {
    mc::reset();
    wheel w(opts(10ms, 4));
    std::vector<int> order;
    // Deadlines all over several rotations, scheduled out of order.
    std::vector<mc::duration> ds = {95ms, 5ms, 45ms, 41ms, 200ms, 1ms, 81ms, 40ms, 400ms, 41ms};
    std::vector<handle> hs;
    for (std::size_t i = 0; i < ds.size(); ++i) {
        hs.push_back(
            w.schedule_at([&order, i] { order.push_back(static_cast<int>(i)); }, tp{} + ds[i]));
    }
    SECTION("one late pass over many rotations runs what is due, in deadline order") {
        mc::set(tp{} + 100ms);
        REQUIRE(w.advance() == 8);
        // 1, 5, 40, 41, 41 (first in first), 45, 81, 95
        CHECK(order == std::vector<int>{5, 1, 7, 3, 9, 2, 6, 0});
        CHECK(w.pending() == 2);
        REQUIRE(w.next_expiry() == tp{} + 200ms);
        mc::set(tp{} + 199ms);
        CHECK(w.advance() == 0);
        mc::set(tp{} + 400ms);
        CHECK(w.advance() == 2);
        CHECK(order.back() == 8);
    }
    SECTION("ticking through, every task runs at its own boundary") {
        std::vector<tp> at(ds.size());
        for (std::size_t i = 0; i < ds.size(); ++i) {
            hs[i].cancel();
            hs[i] = w.schedule_at([&at, i] { at[i] = mc::now(); }, tp{} + ds[i]);
        }
        for (int k = 0; k <= 40; ++k) {
            mc::set(tp{} + k * 10ms);
            w.advance();
        }
        for (std::size_t i = 0; i < ds.size(); ++i) {
            CAPTURE(i);
            CHECK(at[i] >= tp{} + ds[i]);
            CHECK(at[i] - (tp{} + ds[i]) < 10ms);
        }
    }
}

TEST_CASE("first in first out within a bucket and deadline order within a tick") {
    mc::reset();
    wheel w(opts(10ms, 8));
    std::vector<int> order;
    for (int i = 0; i < 5; ++i) w.schedule_at([&order, i] { order.push_back(i); }, tp{} + 7ms);
    // Same tick, earlier deadlines, scheduled later.
    w.schedule_at([&order] { order.push_back(10); }, tp{} + 3ms);
    w.schedule_at([&order] { order.push_back(11); }, tp{} + 2ms);
    // Same bucket, next rotation: not due.
    w.schedule_at([&order] { order.push_back(20); }, tp{} + 87ms);
    mc::set(tp{} + 10ms);
    REQUIRE(w.advance() == 7);
    CHECK(order == std::vector<int>{11, 10, 0, 1, 2, 3, 4});
    CHECK(w.pending() == 1);
}

TEST_CASE("past deadlines are due at once and duration::max() never comes") {
    mc::reset();
    wheel w(opts(10ms, 8));
    int ran = 0;
    SECTION("before the first pass") {
        w.schedule_at([&] { ++ran; }, tp::min());
        w.schedule([&] { ++ran; }, -5s);
        CHECK(w.next_expiry() <= mc::now());
        CHECK(w.advance() == 2);
        CHECK(ran == 2);
    }
    SECTION("after the wheel has turned, no tick is waited for") {
        mc::set(tp{} + 1h + 3ms);
        w.advance();
        w.schedule_at([&] { ++ran; }, tp{} + 1h);  // an hour-old deadline
        w.schedule([&] { ++ran; }, 0ns);           // due now, not on a tick boundary
        w.schedule_at([&] { ++ran; }, tp::min());
        CHECK(w.next_expiry() <= mc::now());
        CHECK(w.advance() == 3);  // the one due now, mid-tick, too: precise
        CHECK(ran == 3);
    }
    SECTION("tick-rounded, a task due now waits for its boundary") {
        wheel r(opts(10ms, 8, 0, false));
        mc::set(tp{} + 1h + 3ms);
        r.advance();
        r.schedule_at([&] { ++ran; }, tp{} + 1h);  // an hour-old deadline
        r.schedule([&] { ++ran; }, 0ns);           // due now, not on a tick boundary
        r.schedule_at([&] { ++ran; }, tp::min());
        CHECK(r.advance() == 2);
        CHECK(ran == 2);
        mc::set(tp{} + 1h + 10ms);
        CHECK(r.advance() == 1);
        CHECK(ran == 3);
    }
    SECTION("saturation") {
        mc::set(tp{} + 5s);
        auto never = w.schedule([&] { ++ran; }, std::chrono::hours::max());
        auto never2 = w.schedule([&] { ++ran; }, mc::duration::max());
        CHECK(never.deadline() == tp::max());
        CHECK(never2.deadline() == tp::max());
        CHECK(w.next_expiry() == tp::max());
        mc::set(tp::max() - 1ns);
        CHECK(w.advance() == 0);
        mc::set(tp::max());
        CHECK(w.advance() == 2);
        CHECK(ran == 2);
    }
}

TEST_CASE("cancel unlinks and destroys the task at once") {
    mc::reset();
    wheel w(opts(10ms, 8, 2));
    auto alive = std::make_shared<std::atomic<int>>(0);
    int ran = 0;
    auto a = w.schedule([t = tracker(alive), &ran] { ++ran; }, 15ms);
    auto b = w.schedule([t = tracker(alive), &ran] { ++ran; }, 95ms);  // same bucket, next rotation
    REQUIRE(*alive == 2);
    REQUIRE(w.pending() == 2);
    REQUIRE_THROWS_AS(w.schedule([] {}, 1ms), delayq::rejected_error);  // max_pending = 2

    CHECK(a.cancel());
    CHECK(*alive == 1);  // destroyed before cancel() returned
    CHECK(w.pending() == 1);
    CHECK(a.cancelled());
    CHECK_FALSE(a.expired());
    CHECK_FALSE(a.cancel());               // only once
    CHECK_NOTHROW(w.schedule([] {}, 1h));  // the place is free at once
    CHECK(w.pending() == 2);

    // The bucket's lower bound may still remember a; the next expiry is never later than b's.
    REQUIRE(w.next_expiry() <= tp{} + 95ms);
    mc::set(tp{} + 20ms);
    CHECK(w.advance() == 0);
    CHECK(w.next_expiry() == tp{} + 95ms);  // b's own deadline (precise)
    mc::set(tp{} + 95ms);
    CHECK(w.advance() == 1);
    CHECK(ran == 1);
    CHECK(*alive == 0);  // run, then destroyed
    CHECK(b.expired());
    CHECK_FALSE(b.cancel());
    CHECK_FALSE(b.cancelled());
}

TEST_CASE("cancel of entries in the bucket being expired from a task of that bucket") {
    mc::reset();
    wheel w(opts(10ms, 8));
    std::vector<int> ran;
    handle same_batch, next_round;
    bool cancel_same = false, cancel_next = false;
    w.schedule_at(
        [&] {
            ran.push_back(0);
            cancel_same = same_batch.cancel();  // due in this pass, not started: still cancellable
            cancel_next = next_round.cancel();  // same bucket, a later rotation: still pending
        },
        tp{} + 5ms);
    same_batch = w.schedule_at([&] { ran.push_back(1); }, tp{} + 6ms);
    next_round = w.schedule_at([&] { ran.push_back(2); }, tp{} + 85ms);
    mc::set(tp{} + 10ms);
    CHECK(w.advance() == 1);
    CHECK(cancel_same);
    CHECK(same_batch.cancelled());
    CHECK(cancel_next);
    CHECK(ran == std::vector<int>{0});
    CHECK(next_round.cancelled());
    CHECK(w.pending() == 0);
    mc::set(tp{} + 1h);
    CHECK(w.advance() == 0);
}

TEST_CASE("schedule and cancel from inside a task") {
    mc::reset();
    wheel w(opts(10ms, 8));
    std::vector<int> ran;
    handle victim = w.schedule_at([&] { ran.push_back(99); }, tp{} + 50ms);
    handle child;
    w.schedule_at(
        [&] {
            ran.push_back(1);
            child = w.schedule([&] { ran.push_back(2); }, 10ms);
            CHECK(victim.cancel());
        },
        tp{} + 10ms);
    mc::set(tp{} + 10ms);
    CHECK(w.advance() == 1);
    CHECK(child.deadline() == tp{} + 20ms);
    mc::set(tp{} + 19ms);
    CHECK(w.advance() == 0);
    mc::set(tp{} + 1h);
    CHECK(w.advance() == 1);
    CHECK(ran == std::vector<int>{1, 2});
}

TEST_CASE("invalid options throw std::invalid_argument") {
    mc::reset();
    CHECK_THROWS_AS(wheel(opts(0ns)), std::invalid_argument);
    CHECK_THROWS_AS(wheel(opts(-1ms)), std::invalid_argument);
    CHECK_THROWS_AS(wheel(opts(1ms, 0)), std::invalid_argument);
    CHECK_THROWS_AS(wheel(opts(1ms, (std::size_t{1} << 30) + 1)), std::invalid_argument);
    CHECK_THROWS_AS(timer(opts(0ns)), std::invalid_argument);
    CHECK_THROWS_AS(timer(opts(1ms, 0)), std::invalid_argument);
    CHECK_NOTHROW(wheel(opts(1ns, 1)));
    CHECK_NOTHROW(timer(opts(1ms, 3)));  // rounded up to 4
}

TEST_CASE("stop() cancels what is pending and returns it and is idempotent") {
    mc::reset();
    wheel w(opts(10ms, 8));
    int ran = 0;
    auto done = w.schedule([&] { ++ran; }, 5ms);
    auto late = w.schedule([&] { ++ran; }, 3h);
    auto soon = w.schedule([&] { ++ran; }, 20ms);
    auto gone = w.schedule([&] { ++ran; }, 30ms);
    mc::set(tp{} + 10ms);
    REQUIRE(w.advance() == 1);
    REQUIRE(gone.cancel());
    auto left = w.stop();
    REQUIRE(left.size() == 2);
    CHECK(left[0] == soon);  // earliest first
    CHECK(left[1] == late);
    for (auto& h : left) {
        CHECK(h.cancelled());
        CHECK_FALSE(h.cancel());
    }
    CHECK(late.cancelled());
    CHECK(done.expired());
    CHECK(w.pending() == 0);
    CHECK(w.stop().empty());
    auto task = std::make_unique<int>(7);
    CHECK_THROWS_AS(w.schedule([t = std::move(task)] {}, 1ms), delayq::rejected_error);
    mc::set(tp{} + 10h);
    CHECK(w.advance() == 0);
    CHECK(ran == 1);
}

TEST_CASE("schedule after stop is rejected and leaves a move-only task untouched") {
    mc::reset();
    timer t(opts(1ms));
    t.stop();
    move_only_task task{std::make_unique<int>(42)};
    CHECK_THROWS_AS(t.schedule(std::move(task), 1ms), delayq::rejected_error);
    CHECK_THROWS_AS(t.schedule_at(std::move(task), tp{}), delayq::rejected_error);
    REQUIRE(task.p != nullptr);  // nothing was moved out of it
    CHECK(*task.p == 42);
}

TEST_CASE("max_pending rejects without touching the task and a cancel frees a place at once") {
    mc::reset();
    timer t(opts(1ms, 8, 2));
    auto a = t.schedule(sentinel(), 1h);
    auto b = t.schedule(sentinel(), 1h);
    auto p = std::make_shared<int>(1);
    CHECK_THROWS_AS(t.schedule([q = p] {}, 1ms), delayq::rejected_error);
    CHECK(p.use_count() == 1);  // the rejected copy is gone, nothing leaked
    move_only_task move_only{std::make_unique<int>(3)};
    CHECK_THROWS_AS(t.schedule(std::move(move_only), 1ms), delayq::rejected_error);
    CHECK(move_only.p != nullptr);
    REQUIRE(a.cancel());
    CHECK(t.pending() == 1);
    CHECK_NOTHROW(t.schedule(std::move(move_only), 1h));
    CHECK(move_only.p == nullptr);  // this time it was taken
    CHECK(t.pending() == 2);
}

TEST_CASE("timer: the worker runs a task at its deadline, precise, and not before") {
    mc::reset();
    timer t(opts(10ms, 8));
    std::atomic<std::int64_t> ran_at{-1};
    t.schedule(sentinel(), 100h);
    first_sleep();
    auto h = t.schedule([&] { ran_at = mc::now().time_since_epoch().count(); }, 25ms);
    step(t, 24ms);
    CHECK(ran_at == -1);
    step(t, 1ms);  // the deadline, mid-tick
    CHECK(std::chrono::nanoseconds(ran_at.load()) == 25ms);
    CHECK(h.expired());
    CHECK(t.pending() == 1);
}

TEST_CASE("timer: tick-rounded, the worker runs a task at its tick boundary and not before") {
    mc::reset();
    timer t(opts(10ms, 8, 0, false));
    std::atomic<std::int64_t> ran_at{-1};
    t.schedule(sentinel(), 100h);
    first_sleep();
    auto h = t.schedule([&] { ran_at = mc::now().time_since_epoch().count(); }, 25ms);
    step(t, 24ms);
    CHECK(ran_at == -1);
    step(t, 1ms);  // the deadline, mid-tick
    CHECK(ran_at == -1);
    step(t, 4ms);
    CHECK(ran_at == -1);
    step(t, 1ms);  // the boundary
    CHECK(std::chrono::nanoseconds(ran_at.load()) == 30ms);
    CHECK(h.expired());
    CHECK(t.pending() == 1);
}

TEST_CASE("timer: a schedule earlier than the worker's sleep wakes it") {
    mc::reset();
    timer t(opts(10ms, 8));
    t.schedule(sentinel(), 100h);
    first_sleep();
    std::atomic<bool> ran{false};
    t.schedule_at([&] { ran = true; }, mc::now());  // due now: the clock does not move
    wait_for([&] { return ran.load(); });
    CHECK(ran);
    CHECK(t.pending() == 1);
}

TEST_CASE("timer: no wake-ups while nothing is pending (manual clock)") {
    mc::reset();
    timer t(opts(1ms, 8));
    std::atomic<int> ran{0};
    t.schedule([&] { ++ran; }, 5ms);
    first_sleep();
    mc::advance(5ms);
    wait_for([&] { return ran == 1 && t.pending() == 0; });
    const std::size_t w = t.wakeups();
    CHECK(w >= 1);
    // An idle worker sleeps without a deadline: it is not on the clock, and moving the clock
    // through a thousand ticks does not wake it.
    for (int i = 0; i < 1000; ++i) mc::advance(1ms);
    CHECK(mc::sleepers() == 0);
    CHECK(t.wakeups() == w);
    // A new task does wake it (so the count above could move).
    t.schedule([&] { ++ran; }, 0ms);
    wait_for([&] { return ran == 2; });
    CHECK(t.wakeups() > w);
}

TEST_CASE("timer: no wake-ups while nothing is pending (steady_clock with a 1 ms tick)") {
    delayq::hashed_wheel_options<> o;
    o.tick = 1ms;
    delayq::hashed_wheel_timer<> t(o);
    std::atomic<int> ran{0};
    t.schedule([&] { ++ran; }, 2ms);
    wait_for([&] { return ran == 1; });
    std::this_thread::sleep_for(20ms);  // let the worker settle into its sleep
    const std::size_t w = t.wakeups();
    std::this_thread::sleep_for(200ms);  // 200 ticks
    CHECK(t.wakeups() == w);
    // With one task far away, it still does not tick: it sleeps until that task's deadline.
    t.schedule([] {}, 1h);
    std::this_thread::sleep_for(200ms);
    CHECK(t.wakeups() <= w + 1);  // the schedule itself may wake it once
}

TEST_CASE("timer: a throwing task goes to on_error and the worker carries on") {
    mc::reset();
    auto o = opts(10ms, 8);
    std::mutex m;
    std::vector<std::string> errors;
    o.on_error = [&](std::exception_ptr e) {
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            std::lock_guard lk(m);
            errors.emplace_back(x.what());
        }
        throw 1;  // an on_error that throws is ignored
    };
    timer t(std::move(o));
    std::atomic<int> ran{0};
    t.schedule(sentinel(), 100h);
    first_sleep();
    t.schedule([] { throw std::runtime_error("boom"); }, 10ms);
    t.schedule([&] { ++ran; }, 10ms);
    t.schedule([&] { ++ran; }, 20ms);
    step(t, 10ms);
    step(t, 10ms);
    CHECK(ran == 2);
    std::lock_guard lk(m);
    CHECK(errors == std::vector<std::string>{"boom"});
}

TEST_CASE("timer: stop() from inside a task does not deadlock") {
    mc::reset();
    timer t(opts(10ms, 8));
    std::vector<handle> from_task;
    std::atomic<bool> stopped{false};
    std::atomic<int> after{0};
    auto late = t.schedule([] {}, 1h);
    first_sleep();
    t.schedule(
        [&] {
            from_task = t.stop();
            stopped = true;
            try {
                t.schedule([] {}, 1ms);
            } catch (const delayq::rejected_error&) {
                ++after;
            }
        },
        10ms);
    mc::advance(10ms);
    wait_for([&] { return stopped.load(); });
    CHECK(t.stop().empty());  // idempotent; joins the worker
    REQUIRE(from_task.size() == 1);
    CHECK(from_task[0] == late);
    CHECK(late.cancelled());
    CHECK(after == 1);
}

TEST_CASE("timer: destroyed from inside its own task") {
    mc::reset();
    auto t = std::make_unique<timer>(opts(10ms, 8));
    std::atomic<bool> done{false};
    auto pending = t->schedule([] {}, 1h);
    t->schedule(
        [&] {
            t.reset();
            done = true;
        },
        0ms);
    wait_for([&] { return done.load(); });
    CHECK(t == nullptr);
    CHECK(pending.cancelled());
    CHECK_FALSE(pending.cancel());
}

TEST_CASE("timer: destruction with pending tasks destroys them and handles outlive the timer") {
    mc::reset();
    auto alive = std::make_shared<std::atomic<int>>(0);
    std::vector<handle> hs;
    {
        timer t(opts(10ms, 8));
        for (int i = 0; i < 100; ++i)
            hs.push_back(t.schedule([k = tracker(alive)] {}, i * 1ms + 1h));
        CHECK(*alive == 100);
        CHECK(t.pending() == 100);
    }
    CHECK(*alive == 0);
    for (auto& h : hs) {
        CHECK(h.cancelled());
        CHECK_FALSE(h.cancel());
        CHECK_FALSE(h.expired());
    }
    CHECK(hs[3].deadline() == tp{} + 1h + 3ms);
    // A wheel too: its handles outlive it.
    handle h;
    {
        wheel w(opts(1ms));
        h = w.schedule([k = tracker(alive)] {}, 1ms);
        CHECK(*alive == 1);
    }
    CHECK(*alive == 0);
    CHECK_FALSE(h.cancel());
    CHECK(h.cancelled());
}

TEST_CASE("timer: cancel racing expiry from another thread: runs or is cancelled but never both") {
    for (int round = 0; round < 20; ++round) {
        mc::reset();
        timer t(opts(1ms, 8));
        constexpr int k = 500;
        std::vector<std::atomic<int>> runs(k);
        std::vector<handle> hs;
        t.schedule(sentinel(), 100h);
        first_sleep();
        for (int i = 0; i < k; ++i)
            hs.push_back(t.schedule([&runs, i] { ++runs[i]; }, 10ms + (i % 3) * 1ms));
        std::vector<char> won(k);
        std::thread clock([] { mc::advance(12ms); });
        for (int i = k - 1; i >= 0; --i) won[i] = hs[i].cancel();
        clock.join();
        wait_for([&] { return t.pending() == 1; });
        t.stop();  // joins: every expired task has run
        int cancelled = 0, ran = 0;
        for (int i = 0; i < k; ++i) {
            CAPTURE(round, i);
            REQUIRE(runs[i] <= 1);
            REQUIRE(runs[i] + won[i] == 1);
            REQUIRE(hs[i].expired() == (runs[i] == 1));
            REQUIRE(hs[i].cancelled() == (won[i] == 1));
            cancelled += won[i];
            ran += runs[i];
        }
        CHECK(cancelled + ran == k);
    }
}

namespace {
std::size_t stress_tasks() {
    if (const char* e = std::getenv("DELAYQ_STRESS_TASKS")) return std::strtoull(e, nullptr, 10);
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    return 100'000;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
    return 100'000;
#else
    return 1'000'000;
#endif
#else
    return 1'000'000;
#endif
}
}  // namespace

TEST_CASE("timer: threads schedule and cancel 1M tasks and every one is accounted for") {
    const std::size_t total = stress_tasks();
    constexpr std::size_t threads = 4;
    delayq::hashed_wheel_options<> o;
    o.tick = 1ms;
    o.wheel_size = 64;
    delayq::hashed_wheel_timer<> t(o);
    std::vector<std::atomic<std::uint8_t>> runs(total);
    std::atomic<std::size_t> cancelled{0};
    std::vector<std::thread> ts;
    for (std::size_t th = 0; th < threads; ++th) {
        ts.emplace_back([&, th] {
            std::mt19937 rng(static_cast<unsigned>(th));
            std::vector<delayq::timeout<>> mine;
            const std::size_t lo = total * th / threads, hi = total * (th + 1) / threads;
            mine.reserve(hi - lo);
            for (std::size_t i = lo; i < hi; ++i) {
                const auto r = rng() % 100;
                // Most are due within a few ticks; some an hour away, left for stop().
                const auto delay = r < 10 ? std::chrono::microseconds(1h)
                                          : std::chrono::microseconds(rng() % 3000);
                mine.push_back(t.schedule(
                    [&runs, i] { runs[i].fetch_add(1, std::memory_order_relaxed); }, delay));
                if (r % 3 == 0 && !mine.empty()) {  // cancel a random earlier one of ours
                    if (mine[rng() % mine.size()].cancel()) ++cancelled;
                }
            }
        });
    }
    for (auto& x : ts) x.join();
    auto left = t.stop();
    std::size_t ran = 0;
    for (std::size_t i = 0; i < total; ++i) {
        REQUIRE(runs[i] <= 1);
        ran += runs[i];
    }
    for (auto& h : left) REQUIRE(h.cancelled());
    CHECK(ran > 0);
    CHECK(cancelled > 0);
    CHECK(left.size() > 0);
    CHECK(ran + cancelled + left.size() == total);
    CHECK(t.pending() == 0);
}

TEST_CASE("tasks of every size: pooled slots of each size class and large captures on the heap") {
    mc::reset();
    auto alive = std::make_shared<std::atomic<int>>(0);
    int ran = 0;
    std::vector<handle> cancelled_ones;
    {
        wheel w(opts(1ms, 8));
        auto add = [&](auto pad) {
            for (int i = 0; i < 3000; ++i) {  // several slabs' worth of the small sizes
                auto h = w.schedule([pad, t = tracker(alive), &ran] { ran += 1 + pad[0]; },
                                    1ms * (i % 5));
                if (i % 3 == 0) {
                    REQUIRE(h.cancel());
                    cancelled_ones.push_back(h);
                }
            }
        };
        add(std::array<char, 1>{});
        add(std::array<char, 40>{});
        add(std::array<char, 200>{});   // the largest pooled size class
        add(std::array<char, 1000>{});  // beyond the pool: one ordinary allocation
        CHECK(*alive == 4 * 2000);
        mc::set(tp{} + 4ms);
        CHECK(w.advance() == 4 * 2000);
        CHECK(ran == 4 * 2000);
        CHECK(*alive == 0);
        // The freed slots are used again.
        for (int i = 0; i < 100; ++i) w.schedule([t = tracker(alive)] {}, 1h);
        CHECK(w.pending() == 100);
    }
    CHECK(*alive == 0);
    for (auto& h : cancelled_ones) CHECK(h.cancelled());
}
