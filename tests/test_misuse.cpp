// Every way to misuse the public API that docs/misuse.md lists, and what happens: a typed
// exception whose message names the problem, or a documented, harmless outcome; never a crash, a
// hang or a lost element. Each TEST_CASE is named after its row in docs/misuse.md. Deterministic:
// manual_clock drives every timed behaviour. The Redis rows live in tests/redis-misuse/.
//
// The rows marked **finding** in docs/misuse.md are defects this work found, fixed since in the
// headers; their tests (tagged by behaviour, as every test) run by default and keep them fixed.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <delayq/delayq.hpp>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "expect_error.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using tp = mc::time_point;
using dur = mc::duration;
using handle = delayq::timeout<mc>;
using hw = delayq::hashed_wheel<mc>;
using hwt = delayq::hashed_wheel_timer<mc>;
using hiw = delayq::hierarchical_wheel<mc>;
using htw = delayq::hierarchical_timing_wheel<mc>;

using delayq::test::contains;
using delayq::test::message_of;

namespace {

hw::options hw_opts(dur tick = 1ms, std::size_t size = 8, std::size_t max_pending = 0) {
    hw::options o;
    o.tick = tick;
    o.wheel_size = size;
    o.max_pending = max_pending;
    return o;
}

// The options of both hierarchical wheels (hiw and htw take the same).
hiw::options htw_opts(dur tick = 1ms, std::size_t size = 8, std::size_t max_pending = 0) {
    hiw::options o;
    o.tick = tick;
    o.wheel_size = size;
    o.max_pending = max_pending;
    return o;
}

// Runs everything due on a thread-free hierarchical wheel.
void drive(hiw& w) {
    w.advance();
}

struct item {
    int id;
    tp at;
    tp deadline() const noexcept { return at; }
};

// A move-only task that records that it ran and whether it is still whole.
struct probe {
    std::shared_ptr<int> runs = std::make_shared<int>(0);
    std::unique_ptr<int> body = std::make_unique<int>(7);
    void operator()() { ++*runs; }
};

}  // namespace

// ---- construction ----------------------------------------------------------------------------

TEST_CASE("misuse: zero or negative tick") {
    mc::reset();
    for (dur t : {dur::zero(), dur(-1), dur::min()}) {
        CHECK(contains(message_of<std::invalid_argument>([&] { hw w(hw_opts(t)); }), "tick"));
        CHECK(contains(message_of<std::invalid_argument>([&] { hwt w(hw_opts(t)); }), "tick"));
        CHECK(contains(message_of<std::invalid_argument>([&] { hiw w(htw_opts(t)); }), "tick"));
        CHECK(contains(message_of<std::invalid_argument>([&] { htw w(htw_opts(t)); }), "tick"));
    }
}

TEST_CASE("misuse: zero wheel size") {
    mc::reset();
    CHECK(message_of<std::invalid_argument>([] { hw w(hw_opts(1ms, 0)); }) ==
          "delayq: wheel_size must be in [1, 2^30]");
    CHECK(
        contains(message_of<std::invalid_argument>([] { hwt w(hw_opts(1ms, 0)); }), "wheel_size"));
    CHECK(
        contains(message_of<std::invalid_argument>([] { hiw w(htw_opts(1ms, 0)); }), "wheel_size"));
    CHECK(
        contains(message_of<std::invalid_argument>([] { hiw w(htw_opts(1ms, 1)); }), "wheel_size"));
    CHECK(
        contains(message_of<std::invalid_argument>([] { htw w(htw_opts(1ms, 1)); }), "wheel_size"));
    hw one(hw_opts(1ms, 1));  // a one-bucket ring is legal and works
    probe p;
    auto runs = p.runs;
    one.schedule(std::move(p), 3ms);
    mc::advance(3ms);
    CHECK(one.advance() == 1);
    CHECK(*runs == 1);
}

TEST_CASE("misuse: absurd wheel_size") {
    mc::reset();
    for (std::size_t n : {std::numeric_limits<std::size_t>::max(), (std::size_t{1} << 30) + 1,
                          std::size_t{1} << 62}) {
        CHECK(contains(message_of<std::invalid_argument>([&] { hw w(hw_opts(1ms, n)); }),
                       "wheel_size"));
        CHECK(contains(message_of<std::invalid_argument>([&] { hiw w(htw_opts(1ms, n)); }),
                       "wheel_size"));
    }
}

// ---- deadlines at the ends of the time line ---------------------------------------------------

TEST_CASE("misuse: duration::max() delay") {
    mc::reset();
    mc::advance(5s);
    // delay_queue: delay_for saturates to time_point::max(): never due
    delayq::delay_queue<delayq::delayed<int, mc>, mc> q;
    q.put(delayq::delay_for<mc>(1, dur::max()));
    q.put(delayq::delay_for<mc>(2, std::chrono::hours::max()));  // a coarser unit: saturates too
    CHECK(q.next_deadline() == tp::max());
    mc::advance(std::chrono::hours(24 * 365 * 100));
    CHECK_FALSE(q.poll());
    CHECK_FALSE(q.take_for(0s));  // a limit that has come: returns, does not wait for max()
    CHECK(q.size() == 2);

    hw w(hw_opts());
    probe p;
    auto runs = p.runs;
    handle h = w.schedule(std::move(p), dur::max());
    CHECK(h.deadline() == tp::max());
    hiw x(htw_opts());
    probe p2;
    auto runs2 = p2.runs;
    handle h2 = x.schedule(std::move(p2), std::chrono::hours::max());
    CHECK(h2.deadline() == tp::max());
    mc::advance(std::chrono::hours(24 * 365 * 100));
    w.advance();
    drive(x);
    CHECK(*runs == 0);
    CHECK(*runs2 == 0);
    CHECK(h.pending());
    CHECK(h2.pending());
    CHECK(h.cancel());
    CHECK(h2.cancel());
    CHECK(w.pending() == 0);
    CHECK(x.pending() == 0);

    // a negative "max" (duration::min()) is a deadline in the past: due now
    handle h3 = w.schedule(probe{}, dur::min());
    CHECK(w.advance() == 1);
    CHECK(h3.expired());
}

TEST_CASE("misuse: time_point::min() and time_point::max() deadlines") {
    mc::reset();
    mc::advance(1s);
    delayq::delay_queue<item, mc> q;
    q.put(item{1, tp::max()});
    q.put(item{2, tp::min()});
    auto first = q.poll();  // min is due at once
    REQUIRE(first);
    CHECK(first->id == 2);
    CHECK_FALSE(q.poll());

    hw w(hw_opts());
    hiw x(htw_opts());
    probe a, b, c, d;
    auto ra = a.runs, rb = b.runs, rc = c.runs, rd = d.runs;
    handle ha = w.schedule_at(std::move(a), tp::min());
    handle hb = w.schedule_at(std::move(b), tp::max());
    handle hc = x.schedule_at(std::move(c), tp::min());
    handle hd = x.schedule_at(std::move(d), tp::max());
    CHECK(*ra == 0);  // never inside schedule
    CHECK(*rc == 0);
    CHECK(w.advance() == 1);
    drive(x);
    CHECK(*ra == 1);
    CHECK(*rc == 1);
    mc::advance(std::chrono::hours(1000000));
    w.advance();
    drive(x);
    CHECK(*rb == 0);
    CHECK(*rd == 0);
    CHECK(hb.pending());
    CHECK(hd.pending());
    // the clock itself at the end of time: only then is max due
    mc::set(tp::max());
    CHECK(w.advance() == 1);
    drive(x);
    CHECK(*rb == 1);
    CHECK(*rd == 1);
}

// ---- Delayed types ---------------------------------------------------------------------------

namespace {
struct shifting {
    int id;
    std::shared_ptr<tp> at;  // the deadline lives outside: the caller can change it after put
    tp deadline() const noexcept { return *at; }
};
struct throwing_deadline {
    int id;
    tp deadline() const {
        if (id < 0) throw std::runtime_error("no deadline");
        return tp{};
    }
};
}  // namespace

TEST_CASE("misuse: a Delayed whose deadline changes after put") {
    mc::reset();
    delayq::delay_queue<shifting, mc> q;
    auto at = std::make_shared<tp>(tp{} + 10ms);
    q.put(shifting{1, at});
    q.put(shifting{2, std::make_shared<tp>(tp{} + 5ms)});
    *at = tp{} + 1ms;  // earlier now: the queue does not notice; it read the deadline once, at put
    mc::advance(1ms);
    CHECK_FALSE(q.poll());
    CHECK(q.next_deadline() == tp{} + 5ms);
    mc::advance(4ms);
    auto a = q.poll();
    REQUIRE(a);
    CHECK(a->id == 2);
    *at = tp::max();  // later now: it still comes out at the deadline it had when put
    mc::advance(5ms);
    auto b = q.poll();
    REQUIRE(b);
    CHECK(b->id == 1);
    // to change a deadline: remove_if it and put it again
}

TEST_CASE("misuse: a Delayed whose deadline() throws") {
    mc::reset();
    delayq::delay_queue<throwing_deadline, mc> q;
    q.put(throwing_deadline{1});
    CHECK_THROWS_AS(q.put(throwing_deadline{-1}), std::runtime_error);
    CHECK(q.size() == 1);  // nothing half-inserted
    CHECK(q.poll());
}

TEST_CASE("misuse: an element whose copy throws") {
    mc::reset();
    struct fragile {
        int id;
        tp at;
        fragile(int i, tp t) : id(i), at(t) {}
        fragile(const fragile& o) : id(o.id), at(o.at) {
            if (id < 0) throw std::runtime_error("copy");
        }
        fragile(fragile&&) noexcept = default;
        fragile& operator=(fragile&&) noexcept = default;
        tp deadline() const noexcept { return at; }
    };
    delayq::delay_queue<fragile, mc> q;
    const fragile good(1, tp{}), bad(-1, tp{});
    q.put(good);
    CHECK_THROWS_AS(q.put(bad), std::runtime_error);
    CHECK(q.size() == 1);
}

// ---- delay_queue after close -----------------------------------------------------------------

TEST_CASE("misuse: put and take after close") {
    mc::reset();
    delayq::delay_queue<delayq::delayed<std::unique_ptr<int>, mc>, mc> q;
    q.put({std::make_unique<int>(1), tp{}});
    auto rest = q.close();
    REQUIRE(rest.size() == 1);  // handed back, not lost
    delayq::delayed<std::unique_ptr<int>, mc> v{std::make_unique<int>(2), tp{}};
    CHECK_FALSE(q.put(std::move(v)));
    REQUIRE(v.value);  // refused: left untouched
    CHECK(*v.value == 2);
    CHECK_FALSE(q.take());  // returns at once, does not block
    CHECK_FALSE(q.take_for(1h));
    CHECK(q.close().empty());  // idempotent
}

// ---- timers: stop, handles, rejection --------------------------------------------------------

TEST_CASE("misuse: schedule after stop") {
    mc::reset();
    hw w(hw_opts());
    hwt t(hw_opts());
    hiw x(htw_opts());
    w.stop();
    t.stop();
    x.stop();
    probe p;
    CHECK(contains(message_of<delayq::rejected_error>([&] { w.schedule(std::move(p), 1ms); }),
                   "stopped"));
    CHECK(p.body);  // the task is left untouched
    CHECK(contains(message_of<delayq::rejected_error>([&] { t.schedule(std::move(p), 1ms); }),
                   "stopped"));
    CHECK(p.body);
    CHECK(contains(message_of<delayq::rejected_error>([&] { x.schedule(std::move(p), 1ms); }),
                   "stopped"));
    CHECK(p.body);
    CHECK(w.stop().empty());  // idempotent
    CHECK(t.stop().empty());
    CHECK(x.stop().empty());
    CHECK(x.advance(tp::max()) == 0);  // runs nothing after stop
}

TEST_CASE("misuse: max_pending exceeded") {
    mc::reset();
    hw w(hw_opts(1ms, 8, 2));
    w.schedule(probe{}, 1ms);
    handle h = w.schedule(probe{}, 1ms);
    probe p;
    CHECK(contains(message_of<delayq::rejected_error>([&] { w.schedule(std::move(p), 1ms); }),
                   "max_pending"));
    CHECK(p.body);  // left untouched
    CHECK(w.pending() == 2);
    CHECK(h.cancel());  // room again at once
    w.schedule(std::move(p), 1ms);
    CHECK(w.pending() == 2);

    hiw x(htw_opts(1ms, 8, 2));
    x.schedule(probe{}, 1ms);
    handle hx = x.schedule(probe{}, 1ms);
    CHECK(contains(message_of<delayq::rejected_error>([&] { x.schedule(probe{}, 1ms); }),
                   "max_pending"));
    CHECK(x.pending() == 2);  // nothing half-scheduled
    CHECK(hx.cancel());
    x.schedule(probe{}, 1ms);
    CHECK(x.pending() == 2);
}

TEST_CASE("misuse: max_pending refusal leaves the task untouched (hierarchical)", "[limits]") {
    // hierarchical_timing_wheel::schedule used to move the task into its node before it checked
    // max_pending, so the caller's task was gone (hashed_wheel left it untouched). Fixed in
    // d0d47e6.
    mc::reset();
    hiw x(htw_opts(1ms, 8, 1));
    x.schedule(probe{}, 1ms);
    probe p;
    CHECK_THROWS_AS(x.schedule(std::move(p), 1ms), delayq::rejected_error);
    CHECK(p.body);
}

TEST_CASE("misuse: use of a handle after the timer is gone") {
    mc::reset();
    handle pending_h, ran_h, copy;
    {
        hw w(hw_opts());
        pending_h = w.schedule(probe{}, 1h);
        ran_h = w.schedule(probe{}, 1ms);
        mc::advance(1ms);
        CHECK(w.advance() == 1);
        copy = pending_h;
    }
    CHECK(pending_h.cancelled());
    CHECK_FALSE(pending_h.cancel());
    CHECK_FALSE(copy.cancel());
    CHECK(copy == pending_h);
    CHECK(ran_h.expired());
    CHECK_FALSE(ran_h.cancel());
    {
        hiw x(htw_opts());
        pending_h = x.schedule(probe{}, 1h);
    }
    CHECK(pending_h.cancelled());
    CHECK_FALSE(pending_h.cancel());
    {
        hwt t(hw_opts());
        pending_h = t.schedule(probe{}, 1h);
    }
    CHECK(pending_h.cancelled());
    CHECK_FALSE(pending_h.cancel());
    handle empty;  // a default handle refers to nothing
    CHECK_FALSE(empty.cancel());
    CHECK_FALSE(empty.pending());
}

TEST_CASE("misuse: stop() from a task") {
    mc::reset();
    SECTION("hashed_wheel") {
        hw w(hw_opts());
        std::vector<handle> got;
        handle later = w.schedule(probe{}, 1h);
        w.schedule([&] { got = w.stop(); }, 1ms);
        mc::advance(1ms);
        CHECK(w.advance() == 1);
        REQUIRE(got.size() == 1);
        CHECK(got[0] == later);
        CHECK(later.cancelled());
        CHECK_THROWS_AS(w.schedule(probe{}, 1ms), delayq::rejected_error);
    }
    SECTION("hierarchical_wheel") {
        hiw x(htw_opts());
        std::vector<handle> got;
        handle later = x.schedule(probe{}, 1h);
        x.schedule([&] { got = x.stop(); }, 1ms);
        mc::advance(1ms);
        drive(x);
        REQUIRE(got.size() == 1);
        CHECK(got[0] == later);
        CHECK(later.cancelled());
    }
    SECTION("hashed_wheel_timer, on its worker") {
        hwt t(hw_opts());
        std::atomic<bool> done{false};
        std::vector<handle> got;
        handle later = t.schedule(probe{}, 1h);
        t.schedule(
            [&] {
                got = t.stop();
                done = true;
            },
            1ms);
        REQUIRE(delayq::test::eventually([] { return mc::sleepers() >= 1; }));
        mc::advance(1ms);
        REQUIRE(delayq::test::eventually([&] { return done.load(); }));
        REQUIRE(got.size() == 1);
        CHECK(got[0] == later);
        CHECK(t.stop().empty());  // from this thread: joins the worker, which has ended
    }
    SECTION("hierarchical_timing_wheel, on its worker") {
        htw x(htw_opts());
        std::atomic<bool> done{false};
        std::vector<handle> got;
        handle later = x.schedule(probe{}, 1h);
        x.schedule(
            [&] {
                got = x.stop();
                done = true;
            },
            1ms);
        REQUIRE(delayq::test::eventually([] { return mc::sleepers() >= 1; }));
        mc::advance(1ms);
        REQUIRE(delayq::test::eventually([&] { return done.load(); }));
        REQUIRE(got.size() == 1);
        CHECK(got[0] == later);
        CHECK(x.stop().empty());
    }
}

TEST_CASE("misuse: destroying a timer from its own task") {
    mc::reset();
    auto t = std::make_unique<hwt>(hw_opts());
    std::atomic<bool> done{false};
    t->schedule(
        [&] {
            t.reset();
            done = true;
        },
        1ms);
    REQUIRE(delayq::test::eventually([] { return mc::sleepers() >= 1; }));
    mc::advance(1ms);
    REQUIRE(delayq::test::eventually([&] { return done.load(); }));
    CHECK_FALSE(t);

    auto x = std::make_unique<htw>(htw_opts());
    done = false;
    x->schedule(
        [&] {
            x.reset();
            done = true;
        },
        1ms);
    REQUIRE(delayq::test::eventually([] { return mc::sleepers() >= 1; }));
    mc::advance(1ms);
    REQUIRE(delayq::test::eventually([&] { return done.load(); }));
    CHECK_FALSE(x);
    // the detached workers end by themselves; give them a moment before the clock is reset
    std::this_thread::sleep_for(50ms);
}

TEST_CASE("misuse: advance() from inside a task") {
    mc::reset();
    auto advance_from_task = [](auto& w) {
        std::optional<std::size_t> inner;
        probe p;
        auto runs = p.runs;
        w.schedule([&] { inner = w.advance(tp::max()); }, 1ms);
        w.schedule(std::move(p), 1ms);  // in the same pass, after the task that advances
        mc::advance(1ms);
        CHECK(w.advance() == 2);
        REQUIRE(inner);
        CHECK(*inner == 0);  // returns at once: no deadlock, no recursion, nothing run
        CHECK(*runs == 1);   // the pass under way went on
        CHECK(w.pending() == 0);
    };
    hw w(hw_opts());
    advance_from_task(w);
    hiw x(htw_opts());
    advance_from_task(x);
}

TEST_CASE("misuse: a task that throws, with and without on_error") {
    mc::reset();
    hw quiet(hw_opts());  // no on_error: the exception is swallowed, the wheel carries on
    quiet.schedule([] { throw std::runtime_error("boom"); }, 1ms);
    probe p;
    auto runs = p.runs;
    quiet.schedule(std::move(p), 1ms);
    mc::advance(1ms);
    CHECK(quiet.advance() == 2);
    CHECK(*runs == 1);

    auto o = htw_opts();
    int errors = 0;
    o.on_error = [&](std::exception_ptr) {
        ++errors;
        throw std::logic_error("on_error throws too");  // ignored
    };
    hiw x(o);
    x.schedule([] { throw 42; }, 1ms);
    probe q;
    auto runs2 = q.runs;
    x.schedule(std::move(q), 1ms);
    mc::advance(1ms);
    drive(x);
    CHECK(errors == 1);
    CHECK(*runs2 == 1);
}

TEST_CASE("misuse: a task whose move throws at schedule") {
    mc::reset();
    struct bad_move {
        bool armed = false;
        bad_move() = default;
        bad_move(bad_move&& o) : armed(o.armed) {
            if (armed) throw std::runtime_error("move");
        }
        void operator()() {}
    };
    hw w(hw_opts(1ms, 8, 1));
    hiw x(htw_opts(1ms, 8, 1));
    bad_move b;
    b.armed = true;
    CHECK_THROWS_AS(w.schedule(std::move(b), 1ms), std::runtime_error);
    CHECK_THROWS_AS(x.schedule(std::move(b), 1ms), std::runtime_error);
    CHECK(w.pending() == 0);  // nothing half-scheduled, and the max_pending slot is free again
    CHECK(x.pending() == 0);
    w.schedule(bad_move{}, 1ms);
    x.schedule(bad_move{}, 1ms);
}

TEST_CASE("misuse: manual_clock moved backwards") {
    mc::reset();
    mc::advance(10ms);
    mc::advance(-5ms);  // ignored: the clock is steady
    CHECK(mc::now() == tp{} + 10ms);
    // set() may move it back (tests only); a delay_queue judges due-ness by the clock as it is
    delayq::delay_queue<item, mc> q;
    q.put(item{1, tp{} + 10ms});
    mc::set(tp{} + 5ms);
    CHECK_FALSE(q.poll());
    mc::set(tp{} + 10ms);
    CHECK(q.poll());
}

TEST_CASE("misuse: hierarchical wheel started within a tick of time_point::min()",
          "[time-limits]") {
    // htw_core's constructor rounded the start down to the tick grid as `q * k` in Clock::rep: for
    // a start within one tick of time_point::min() that product overflowed (UBSan: signed integer
    // overflow). Fixed in d0d47e6 (clamped origin). The wheel must still be never early and at most
    // one tick late there.
    mc::set(tp::min() + dur(5));
    hiw x(htw_opts(dur(1000)));
    probe p;
    auto runs = p.runs;
    const handle h = x.schedule(std::move(p), dur(1000));
    mc::set(h.deadline() - dur(1));
    drive(x);
    CHECK(*runs == 0);  // not early
    mc::set(h.deadline() + dur(1000));
    drive(x);
    CHECK(*runs == 1);  // within one tick
    mc::reset();
}

TEST_CASE(
    "misuse: hierarchical wheel spanning the whole time line never runs a time_point::max() task "
    "early",
    "[time-limits]") {
    // Origin at time_point::min() (a start within a tick of it) and tick 1 ns: a deadline of
    // time_point::max() is 2^64 - 1 ticks away; to_ticks() clamps that to 2^64 - 2, whose time is
    // time_point::max() - 1, so the task used to run 1 ns before its deadline. Fixed: a task goes
    // out only when its own deadline has passed too (detail/timing_wheel.hpp, "Never early").
    mc::set(tp::min());
    hiw x(htw_opts(dur(1)));
    probe p;
    auto runs = p.runs;
    x.schedule_at(std::move(p), tp::max());
    mc::set(tp::max() - dur(1));
    drive(x);
    CHECK(*runs == 0);
    mc::set(tp::max());
    drive(x);
    CHECK(*runs == 1);
    mc::reset();
}
