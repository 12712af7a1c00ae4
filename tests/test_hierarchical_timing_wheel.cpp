// hierarchical_wheel (thread-free: the test drives it with advance()), hierarchical_timing_wheel
// (its worker thread does), and, for the level arithmetic that the public class no longer shows,
// the algorithm itself: detail::timing_wheel, driven here as the wheels' core drives it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <delayq/delayed.hpp>
#include <delayq/detail/timing_wheel.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using delayq::manual_clock;
using delayq::test::eventually;
using mtp = manual_clock::time_point;
using wheel = delayq::hierarchical_wheel<manual_clock>;         // thread-free: advance() drives it
using timer = delayq::hierarchical_timing_wheel<manual_clock>;  // threaded: its worker drives it
using handle = delayq::timeout<manual_clock>;
using ring = delayq::detail::timing_wheel<manual_clock>;  // the levels alone: no lock, no tasks
using node = delayq::detail::timer_node<manual_clock>;

static_assert(std::is_same_v<wheel::options, timer::options>);

static_assert(delayq::Delayed<handle, manual_clock>);

namespace {

wheel::options manual(manual_clock::duration tick, std::size_t size = 20, bool precise = true) {
    wheel::options o;
    o.tick = tick;
    o.wheel_size = size;
    o.precise = precise;
    return o;
}

// Advances the wheel until nothing more is due (tasks that tasks schedule due now run in later
// passes); returns how many tasks ran.
std::size_t drain(wheel& w) {
    std::size_t n = 0;
    while (const std::size_t ran = w.advance()) n += ran;
    return n;
}

// Where hierarchical_wheel puts a task at schedule time: in a ring of the test wheel's shape, made
// now as the wheel was, once room is made for the task (prepare(), as schedule() does), how many
// levels there are and which one the task takes.
struct placement {
    std::size_t levels;
    int level;
};
// Leave to make room, as the core's schedule has it (detail/room.hpp).
delayq::detail::room_key room() {
    const delayq::detail::construction_room r;
    return r.key();
}

placement placed(manual_clock::duration tick, std::size_t size, mtp deadline) {
    ring r(tick, size, manual_clock::now());
    r.prepare(r.position(deadline), room());
    return {r.level_count(), r.level_of(deadline)};
}

// Bare nodes for a ring (no task: a ring never runs one), linked as the core links them, and the
// sink that collects what expire() hands over.
struct ring_nodes {
    std::deque<node> v;  // stable addresses; node i has seq i

    node& link(ring& r, mtp deadline) {
        node& n = v.emplace_back();
        n.init(nullptr, deadline, static_cast<std::uint32_t>(v.size() - 1), 1);
        const ring::place u = r.position(deadline);
        r.prepare(u, room());
        r.reserve(r.size() + 1, room());  // as the core makes room for its passes
        r.link(&n, u, mtp::min());
        return n;
    }
};

struct collect {
    std::vector<mtp>* deadlines;
    std::vector<std::uint32_t>* seqs;
    void operator()(node* n) {
        deadlines->push_back(n->deadline);
        if (seqs) seqs->push_back(n->seq);
    }
    void next_run() {}
};

// The deadlines a pass of `r` at `now` hands over (room made first: expire() must not throw).
std::vector<mtp> expire(ring& r, mtp now) {
    std::vector<mtp> out;
    out.reserve(r.size());
    r.expire(now, collect{&out, nullptr});
    return out;
}

// Sleeps on manual_clock until it reads `tp` or later, as an event loop sleeps in poll().
void sleep_until(mtp tp) {
    std::mutex m;
    std::condition_variable cv;
    std::unique_lock lk(m);
    while (manual_clock::now() < tp) manual_clock::wait_until(cv, lk, tp, std::stop_token{});
}

// An event loop's turn, up to `limit`: it sleeps until next_expiry() (or `limit`), then advances;
// again while nothing ran and `limit` is not reached. Returns how many tasks ran.
std::size_t run_until(wheel& w, mtp limit) {
    for (;;) {
        const std::optional<mtp> next = w.next_expiry();
        sleep_until(next ? std::min(*next, limit) : limit);
        if (const std::size_t ran = w.advance()) return ran;
        if (manual_clock::now() >= limit) return 0;
    }
}

// The first point of the tick grid (origin 0) at or after d.
mtp grid_ceil(mtp d, manual_clock::duration tick) {
    const auto c = d.time_since_epoch().count();
    if (c <= 0) return mtp{};
    const auto t = tick.count();
    return mtp{manual_clock::duration{(c + t - 1) / t * t}};
}

std::string invalid_message(wheel::options o) {
    try {
        wheel w(std::move(o));
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "(no exception)";
}

}  // namespace

TEST_CASE("htw: invalid options are refused, naming the problem") {
    manual_clock::reset();
    auto o = manual(0ns);
    CHECK(invalid_message(o).find("tick") != std::string::npos);
    o.tick = -1ms;
    CHECK(invalid_message(o).find("tick") != std::string::npos);
    o = manual(1ms, 1);
    CHECK(invalid_message(o).find("wheel_size") != std::string::npos);
    o = manual(1ms, 0);
    CHECK(invalid_message(o).find("wheel_size") != std::string::npos);
    o = manual(1ms, std::size_t{1} << 30);
    CHECK(invalid_message(o).find("wheel_size") != std::string::npos);
    o = manual(1ms, 2);
    CHECK(invalid_message(o) == "(no exception)");
}

// Kafka's TimerTest.testAlreadyExpiredTask, restated: tick 1, wheel size 3.
TEST_CASE("htw: already expired tasks run at the next advance, never inside schedule") {
    manual_clock::reset();
    manual_clock::set(mtp{1h});
    wheel w(manual(1ms, 3));
    std::vector<int> ran;
    std::vector<handle> hs;
    for (int d = -5; d <= -1; ++d)
        hs.push_back(w.schedule([&ran, d] { ran.push_back(d); }, std::chrono::milliseconds(d)));
    CHECK(ran.empty());  // never inside schedule
    CHECK(w.pending() == 5);
    for (auto& h : hs) CHECK(h.pending());
    CHECK(w.advance() == 5);
    CHECK(ran == std::vector<int>{-5, -4, -3, -2, -1});
    CHECK(w.pending() == 0);
    for (auto& h : hs) CHECK(h.expired());
    CHECK(w.advance() == 0);
}

// Kafka's TimerTest.testTaskExpiration, restated: tick 1, wheel size 3 (deep overflow chains);
// every task with delay 0..499 runs exactly once, never early, within one tick.
TEST_CASE("htw: delays 0..499 each run exactly once, on time") {
    manual_clock::reset();
    manual_clock::set(mtp{7ms + 300us});  // off the grid
    const manual_clock::duration tick = 1ms;
    wheel w(manual(tick, 3));
    std::vector<int> count(500, 0);
    std::vector<mtp> deadline(500), ran_at(500);
    // schedule in a scrambled order, some twice as in Kafka's test (ids 0..9 get a second task)
    std::vector<int> order(500);
    for (int i = 0; i < 500; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(42));
    for (int i : order) {
        auto h = w.schedule(
            [&, i] {
                ++count[i];
                ran_at[i] = manual_clock::now();
            },
            std::chrono::milliseconds(i));
        deadline[i] = h.deadline();
    }
    std::vector<int> extra(10, 0);
    for (int i = 0; i < 10; ++i)
        w.schedule([&extra, i] { ++extra[i]; }, std::chrono::milliseconds(i));
    CHECK(w.pending() == 510);
    CHECK(placed(tick, 3, deadline[499]).levels >= 5);  // 3, 9, 27, 81, 243, 729 ticks
    for (int step = 0; step < 2000 && w.pending() > 0; ++step) {
        manual_clock::advance(250us);
        drain(w);
    }
    CHECK(w.pending() == 0);
    for (int i = 0; i < 500; ++i) {
        INFO("task " << i);
        REQUIRE(count[i] == 1);
        CHECK(ran_at[i] >= deadline[i]);
        CHECK(ran_at[i] - deadline[i] < tick);
    }
    for (int i = 0; i < 10; ++i) CHECK(extra[i] == 1);
}

// Kafka's TimingWheel arithmetic at start 1000, tick 10, wheel size 5 (units: ns of manual_clock),
// on the ring, driven as a tick-rounded wheel drives it: at the grid point at or before now.
TEST_CASE("timing_wheel: level arithmetic at start 1000, tick 10, size 5 (tick-rounded)") {
    ring r(10ns, 5, mtp{1000ns});
    ring_nodes nodes;
    auto pass = [&](mtp now) { return expire(r, r.floor_to_grid(now)); };
    using list = std::vector<mtp>;
    CHECK(r.current_time() == mtp{1000ns});
    CHECK(r.level_count() == 1);

    nodes.link(r, mtp{1020ns});
    CHECK(r.level_of(mtp{1020ns}) == 0);
    CHECK(r.level_count() == 1);
    nodes.link(r, mtp{1060ns});
    CHECK(r.level_count() == 2);  // 1060 >= 1000 + 5 * 10: an overflow level is created
    CHECK(r.level_of(mtp{1060ns}) == 1);
    nodes.link(r, mtp{1005ns});
    CHECK(r.level_of(mtp{1005ns}) == 0);
    CHECK(r.size() == 3);
    // 1005's bucket (tick 1010: deadlines in (1000, 1010]) opens as soon as one of them can have
    // come
    REQUIRE(r.next_expiry());
    CHECK(*r.next_expiry() == mtp{1001ns});

    CHECK(pass(mtp{1005ns}).empty());  // rounded to 1000: 1005's tick has not ended
    CHECK(r.current_time() == mtp{1000ns});
    CHECK(pass(mtp{1009ns}).empty());

    CHECK(pass(mtp{1010ns}) == list{mtp{1005ns}});
    CHECK(r.current_time() == mtp{1010ns});
    CHECK(r.level_of(mtp{1060ns}) == 1);  // 1060 is still beyond level 0's span [1010, 1060)

    CHECK(pass(mtp{1020ns}) == list{mtp{1020ns}});
    CHECK(r.current_time() == mtp{1020ns});

    // level 1's bucket [1050, 1100) comes out: 1060, in the tick now under way, waits for its own
    // deadline at level 0's time
    CHECK(pass(mtp{1050ns}).empty());
    CHECK(r.current_time() == mtp{1050ns});
    CHECK(r.level_of(mtp{1060ns}) == 0);
    CHECK(r.size() == 1);
    REQUIRE(r.next_expiry());
    CHECK(*r.next_expiry() == mtp{1060ns});

    CHECK(pass(mtp{1059ns}).empty());
    CHECK(pass(mtp{1060ns}) == list{mtp{1060ns}});
    CHECK(r.size() == 0);
    CHECK_FALSE(r.next_expiry());  // nothing held: nothing to look at
}

// The same ring driven at the clock's own time (precise): a bucket opens up to one tick before
// its span starts, so the wheel's time may run up to one tick ahead of the clock, and the nodes of
// the tick under way come out at their own deadlines, never early.
TEST_CASE("timing_wheel: driven at the clock's time, nodes come out at their own deadlines") {
    ring r(10ns, 5, mtp{1000ns});
    ring_nodes nodes;
    using list = std::vector<mtp>;
    nodes.link(r, mtp{1007ns});
    nodes.link(r, mtp{1005ns});
    nodes.link(r, mtp{1060ns});
    CHECK(r.level_of(mtp{1060ns}) == 1);

    CHECK(expire(r, mtp{1004ns}).empty());   // 1005's bucket opened: its tick is under way
    CHECK(r.current_time() == mtp{1010ns});  // one tick ahead of the clock, no more
    REQUIRE(r.next_expiry());
    CHECK(*r.next_expiry() == mtp{1005ns});
    CHECK(expire(r, mtp{1005ns}) == list{mtp{1005ns}});
    CHECK(expire(r, mtp{1006ns}).empty());
    CHECK(expire(r, mtp{1007ns}) == list{mtp{1007ns}});

    // level 1's bucket [1050, 1100) opens after 1040; 1060 falls to level 0
    CHECK(expire(r, mtp{1041ns}).empty());
    CHECK(r.current_time() == mtp{1050ns});
    CHECK(r.level_of(mtp{1060ns}) == 0);
    CHECK(expire(r, mtp{1059ns}).empty());
    CHECK(expire(r, mtp{1060ns}) == list{mtp{1060ns}});
    CHECK(r.size() == 0);
}

// What a tick-rounded hierarchical_wheel does with those tasks: each runs at the grid point at or
// after its deadline, never before.
TEST_CASE("htw: tick-rounded at start 1000, tick 10, size 5: each task runs at its grid point") {
    manual_clock::reset();
    manual_clock::set(mtp{1000ns});
    wheel w(manual(10ns, 5, false));
    int ran1005 = 0, ran1020 = 0, ran1060 = 0;
    w.schedule_at([&] { ++ran1020; }, mtp{1020ns});
    auto h1060 = w.schedule_at([&] { ++ran1060; }, mtp{1060ns});
    w.schedule_at([&] { ++ran1005; }, mtp{1005ns});

    manual_clock::set(mtp{1005ns});
    CHECK(w.advance() == 0);  // 1005's tick ends at 1010: never early
    manual_clock::set(mtp{1009ns});
    CHECK(w.advance() == 0);
    CHECK(ran1005 == 0);

    manual_clock::set(mtp{1010ns});
    CHECK(w.advance() == 1);
    CHECK(ran1005 == 1);
    CHECK(ran1020 == 0);

    manual_clock::set(mtp{1020ns});
    CHECK(w.advance() == 1);
    CHECK(ran1020 == 1);

    manual_clock::set(mtp{1050ns});  // level 1's bucket comes out: 1060 drops to level 0
    CHECK(w.advance() == 0);
    CHECK(ran1060 == 0);
    CHECK(h1060.pending());

    manual_clock::set(mtp{1059ns});
    CHECK(w.advance() == 0);
    CHECK(ran1060 == 0);
    manual_clock::set(mtp{1060ns});
    CHECK(w.advance() == 1);
    CHECK(ran1060 == 1);
    CHECK(w.pending() == 0);
}

TEST_CASE("htw: empty ticks cost nothing: the clock jumps to the next bucket") {
    manual_clock::reset();
    wheel w(manual(1ms, 4));
    int ran = 0;
    w.schedule([&] { ++ran; }, 1000h);
    CHECK(placed(1ms, 4, mtp{1000h}).levels >= 5);
    manual_clock::advance(1000h);
    // one call does it all, however many ticks passed: the task's tick has passed on the clock,
    // so it runs straight from its top-level bucket instead of falling level by level
    CHECK(w.advance() == 1);
    CHECK(ran == 1);
    CHECK(w.advance() == 0);
    CHECK(w.pending() == 0);
    CHECK_FALSE(w.next_expiry());
}

TEST_CASE("timing_wheel: one pass at a far time takes a node from its top level, time follows") {
    ring r(1ms, 4, mtp{});
    ring_nodes nodes;
    nodes.link(r, mtp{1000h});
    CHECK(r.level_count() >= 5);
    const std::size_t top = r.level_count() - 1;
    CHECK(r.level_of(mtp{1000h}) == static_cast<int>(top));
    CHECK(expire(r, mtp{1000h}) == std::vector<mtp>{mtp{1000h}});
    CHECK(r.current_time() == mtp{1000h});  // in one step, not tick by tick
    CHECK(expire(r, mtp{1000h}).empty());
    CHECK(r.size() == 0);
    CHECK_FALSE(r.next_expiry());
}

TEST_CASE("htw: never early and at most one tick late across 5 levels, precise or tick-rounded") {
    for (const bool precise : {true, false}) {
        CAPTURE(precise);
        manual_clock::reset();
        const manual_clock::duration tick = 1ms;
        wheel w(manual(tick, 4, precise));  // levels span 4, 16, 64, 256, 1024 ticks
        std::mt19937_64 rng(7);
        std::uniform_int_distribution<std::int64_t> off(0, 1000 * 1'000'000 - 1);  // ns up to 1 s
        const int n = 3000;
        std::vector<mtp> deadline(n), ran_at(n);
        std::vector<int> count(n, 0);
        for (int i = 0; i < n; ++i) {
            // a third of the deadlines sit exactly on the tick grid
            auto ns = off(rng);
            if (i % 3 == 0) ns -= ns % tick.count();
            deadline[i] = mtp{std::chrono::nanoseconds(ns)};
            w.schedule_at(
                [&, i] {
                    ++count[i];
                    ran_at[i] = manual_clock::now();
                },
                deadline[i]);
        }
        CHECK(placed(tick, 4, *std::max_element(deadline.begin(), deadline.end())).levels == 5);
        // step through every quarter tick: a task must run exactly at the first grid point >=
        // deadline
        while (manual_clock::now() < mtp{1001ms}) {
            manual_clock::advance(250us);
            drain(w);
        }
        CHECK(w.pending() == 0);
        int exact = 0;
        for (int i = 0; i < n; ++i) {
            INFO("task " << i << " deadline " << deadline[i].time_since_epoch().count());
            REQUIRE(count[i] == 1);
            REQUIRE(ran_at[i] >= deadline[i]);        // never early
            REQUIRE(ran_at[i] - deadline[i] < tick);  // less than one tick late
            // stepping a quarter tick at a time: tick-rounded, exactly at the grid point; precise,
            // at the first step at or after the deadline
            if (!precise) REQUIRE(ran_at[i] == grid_ceil(deadline[i], tick));
            if (precise) REQUIRE(ran_at[i] - deadline[i] < 250us);
            if (ran_at[i] == deadline[i]) ++exact;
        }
        CHECK(exact >= n / 3);  // on-grid deadlines are not late at all
    }
}

TEST_CASE("htw: a task cancels another whose bucket is being flushed") {
    manual_clock::reset();
    wheel w(manual(1ms, 4));
    auto payload = std::make_shared<int>(0);
    std::weak_ptr<int> watch = payload;
    handle victim, far_victim;
    bool cancel_result = false, far_cancel_result = false, self_cancel = true;
    int victim_ran = 0;
    handle self;
    self = w.schedule(
        [&] {
            cancel_result = victim.cancel();
            CHECK(watch.expired());  // the victim's task is destroyed at once
            far_cancel_result = far_victim.cancel();
            self_cancel = self.cancel();
        },
        3ms);
    // same bucket, after `self`
    victim = w.schedule([&, p = std::move(payload)] { ++victim_ran; }, 3ms);
    // another bucket, at a coarser level
    far_victim = w.schedule([&] { ++victim_ran; }, 9ms);
    CHECK(placed(1ms, 4, far_victim.deadline()).level == 1);
    CHECK(w.pending() == 3);
    manual_clock::advance(3ms);
    CHECK(w.advance() == 1);
    CHECK(cancel_result);
    CHECK_FALSE(self_cancel);  // it is running: too late to cancel
    CHECK(self.expired());
    CHECK(victim.cancelled());
    CHECK(far_cancel_result);
    CHECK(far_victim.cancelled());
    CHECK(w.pending() == 0);
    manual_clock::advance(100ms);
    drain(w);
    CHECK(victim_ran == 0);
}

TEST_CASE("htw: cancel of a task made ready in the same advance") {
    manual_clock::reset();
    wheel w(manual(1ms, 4));
    int b_ran = 0;
    handle b;
    bool result = false;
    // a and b come out of level 1's bucket [4, 8) in the same pass (level 0 spans [0, 4)), a first
    w.schedule([&] { result = b.cancel(); }, 4ms);
    b = w.schedule([&] { ++b_ran; }, 5ms);
    CHECK(placed(1ms, 4, mtp{4ms}).level == 1);
    CHECK(placed(1ms, 4, b.deadline()).level == 1);
    manual_clock::advance(10ms);
    CHECK(w.advance() == 1);
    CHECK(result);
    CHECK(b_ran == 0);
    CHECK(w.pending() == 0);
}

TEST_CASE("htw: cancel frees the task and the place at once, max_pending") {
    manual_clock::reset();
    auto o = manual(1ms, 8);
    o.max_pending = 2;
    wheel w(o);
    auto p = std::make_shared<int>(1);
    auto h1 = w.schedule([p] {}, 10ms);
    auto h2 = w.schedule([] {}, 20ms);
    CHECK(p.use_count() == 2);
    CHECK(w.pending() == 2);
    CHECK_THROWS_AS(w.schedule([] {}, 30ms), delayq::rejected_error);
    CHECK(w.pending() == 2);
    CHECK(h1.cancel());
    CHECK(p.use_count() == 1);  // destroyed inside cancel()
    CHECK(w.pending() == 1);
    CHECK_FALSE(h1.cancel());  // only once
    CHECK(h1.cancelled());
    CHECK_FALSE(h1.expired());
    auto h3 = w.schedule([] {}, 30ms);  // the place is free at once
    CHECK(w.pending() == 2);
    CHECK_THROWS_AS(w.schedule([] {}, 1ms), delayq::rejected_error);
    manual_clock::advance(20ms);
    drain(w);
    CHECK(h2.expired());
    CHECK(w.pending() == 1);
    CHECK_NOTHROW(w.schedule([] {}, 1ms));
}

TEST_CASE("htw: hierarchical_wheel: due tasks wait for advance, pending counts them") {
    manual_clock::reset();
    wheel w(manual(1ms, 8));
    int ran = 0;
    w.schedule([&] { ++ran; }, 0ms);
    w.schedule([&] { ++ran; }, -1h);
    w.schedule([&] { ++ran; }, 2ms);
    manual_clock::advance(5ms);
    CHECK(ran == 0);
    CHECK(w.pending() == 3);
    CHECK(w.advance() == 3);
    CHECK(ran == 3);
    CHECK(w.pending() == 0);
    CHECK(w.advance() == 0);
}

TEST_CASE("htw: a task scheduled from a task runs in a later advance") {
    manual_clock::reset();
    wheel w(manual(1ms, 8));
    int chain = 0;
    std::function<void()> again = [&] {
        if (++chain < 5) w.schedule(again, 0ms);
    };
    w.schedule(again, 0ms);
    CHECK(w.advance() == 1);
    CHECK(chain == 1);  // bounded work per call, even for a task that reschedules itself at once
    CHECK(w.pending() == 1);
    for (int k = 2; k <= 5; ++k) {
        CHECK(w.advance() == 1);
        CHECK(chain == k);
    }
    CHECK(w.advance() == 0);
    CHECK(w.pending() == 0);
}

TEST_CASE("htw: advance from inside a task runs nothing and returns 0") {
    manual_clock::reset();
    wheel w(manual(1ms, 8));
    std::size_t inner = 99;
    int other_ran = 0;
    w.schedule([&] { inner = w.advance(); }, 0ms);
    w.schedule([&] { ++other_ran; }, 0ms);
    CHECK(w.advance() == 2);
    CHECK(inner == 0);
    CHECK(other_ran == 1);
}

// A thread-free wheel has no wait of its own: its event loop sleeps until next_expiry() (here
// run_until(), on another thread), and advance() then runs what came due.
TEST_CASE("htw: an event loop that sleeps until next_expiry runs a task when it comes due") {
    manual_clock::reset();
    wheel w(manual(1ms, 8));
    std::atomic<int> ran{0};
    w.schedule([&] { ++ran; }, 5ms);
    std::atomic<int> result{-1};
    std::thread t([&] { result = static_cast<int>(run_until(w, mtp{1h})); });
    REQUIRE(eventually([] { return manual_clock::sleepers() > 0; }));
    CHECK(result == -1);
    manual_clock::advance(4ms);
    CHECK(result == -1);
    manual_clock::advance(1ms);
    t.join();
    CHECK(result == 1);
    CHECK(ran == 1);

    // with nothing due before its limit, the loop gives up there
    w.schedule([&] { ++ran; }, 1h);
    std::thread t2([&] { result = static_cast<int>(run_until(w, manual_clock::now() + 10ms)); });
    REQUIRE(eventually([] { return manual_clock::sleepers() > 0; }));
    manual_clock::advance(10ms);
    t2.join();
    CHECK(result == 0);
    CHECK(ran == 1);
    CHECK(w.pending() == 1);
}

TEST_CASE("htw: a throwing task goes to on_error and the wheel carries on") {
    manual_clock::reset();
    auto o = manual(1ms, 8);
    std::vector<std::string> errors;
    o.on_error = [&](std::exception_ptr e) {
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            errors.push_back(x.what());
        }
    };
    wheel w(o);
    int ran = 0;
    w.schedule([] { throw std::runtime_error("boom"); }, 1ms);
    w.schedule([&] { ++ran; }, 1ms);
    w.schedule([&] { ++ran; }, 2ms);
    manual_clock::advance(2ms);
    drain(w);
    CHECK(errors == std::vector<std::string>{"boom"});
    CHECK(ran == 2);

    // without on_error the exception is swallowed
    wheel quiet(manual(1ms, 8));
    quiet.schedule([] { throw 42; }, 0ms);
    quiet.schedule([&] { ++ran; }, 0ms);
    CHECK_NOTHROW(drain(quiet));
    CHECK(ran == 3);
}

TEST_CASE("htw: move-only tasks, saturating deadlines") {
    manual_clock::reset();
    wheel w(manual(1ms, 8));
    int got = 0;
    auto up = std::make_unique<int>(7);
    w.schedule([&got, p = std::move(up)] { got += *p; }, 1ms);
    auto never = w.schedule([] { FAIL("ran"); }, manual_clock::duration::max());
    CHECK(never.deadline() == mtp::max());
    auto never2 = w.schedule([] { FAIL("ran"); }, std::chrono::hours::max());
    CHECK(never2.deadline() == mtp::max());
    auto past = w.schedule([&] { ++got; }, std::chrono::hours::min());
    CHECK(past.deadline() == mtp::min());
    manual_clock::advance(1ms);
    drain(w);
    CHECK(got == 8);
    manual_clock::set(mtp::max() - 1h);
    drain(w);
    CHECK(never.pending());
    CHECK(never2.pending());
    CHECK(w.pending() == 2);
    auto left = w.stop();
    CHECK(left.size() == 2);
}

TEST_CASE("htw: stop returns the pending tasks, cancelled, earliest first, idempotent") {
    manual_clock::reset();
    wheel w(manual(1ms, 4));
    auto p = std::make_shared<int>(0);
    int ran = 0;
    auto a = w.schedule([&] { ++ran; }, 1ms);
    auto c = w.schedule([&ran, p] { ++ran; }, 300ms);
    auto b = w.schedule([&] { ++ran; }, 20ms);
    auto due = w.schedule([&] { ++ran; }, 0ms);
    manual_clock::advance(1ms);
    CHECK(w.advance() == 2);
    CHECK(ran == 2);
    auto left = w.stop();
    REQUIRE(left.size() == 2);
    CHECK(left[0] == b);
    CHECK(left[1] == c);
    CHECK(p.use_count() == 1);  // the unrun tasks are destroyed
    for (auto& h : left) {
        CHECK(h.cancelled());
        CHECK_FALSE(h.cancel());
    }
    CHECK(b.cancelled());
    CHECK(a.expired());
    CHECK(w.pending() == 0);
    CHECK(w.stop().empty());
    CHECK_THROWS_AS(w.schedule([] {}, 1ms), delayq::rejected_error);
    CHECK(w.advance() == 0);
    manual_clock::advance(1h);
    CHECK(w.advance() == 0);
    CHECK(ran == 2);
}

TEST_CASE("htw: handles outlive the wheel, destruction drops pending tasks") {
    manual_clock::reset();
    auto p = std::make_shared<int>(0);
    handle h, done;
    {
        wheel w(manual(1ms, 4));
        h = w.schedule([p] {}, 1h);
        done = w.schedule([] {}, 0ms);
        CHECK(w.advance() == 1);
        CHECK(p.use_count() == 2);
    }
    CHECK(p.use_count() == 1);
    CHECK(h.cancelled());
    CHECK_FALSE(h.cancel());
    CHECK(done.expired());
    CHECK(h.deadline() == mtp{1h});
}

TEST_CASE("htw: hierarchical_timing_wheel runs tasks on its worker, driven by the clock") {
    manual_clock::reset();
    timer::options o;
    o.tick = 1ms;
    o.wheel_size = 8;
    timer w(o);
    std::atomic<int> ran{0};
    std::thread::id runner;
    auto h = w.schedule(
        [&] {
            runner = std::this_thread::get_id();
            ++ran;
        },
        10ms);
    REQUIRE(eventually([] { return manual_clock::sleepers() > 0; }));
    manual_clock::advance(9ms);
    REQUIRE(eventually([] { return manual_clock::sleepers() > 0; }));
    CHECK(ran == 0);  // never early
    manual_clock::advance(1ms);
    REQUIRE(eventually([&] { return ran == 1; }));
    CHECK(runner != std::this_thread::get_id());
    // a due task wakes the worker without moving the clock
    w.schedule([&] { ++ran; }, 0ms);
    REQUIRE(eventually([&] { return ran == 2; }));
    CHECK(w.pending() == 0);
}

TEST_CASE("htw: stop and destruction from inside a task do not deadlock") {
    manual_clock::reset();
    timer::options o;
    o.tick = 1ms;
    auto w = std::make_unique<timer>(o);
    std::atomic<bool> stopped{false};
    std::vector<handle> left;
    auto other = w->schedule([] {}, 1h);
    w->schedule(
        [&] {
            left = w->stop();
            stopped = true;
        },
        1ms);
    manual_clock::advance(1ms);
    REQUIRE(eventually([&] { return stopped.load(); }));
    CHECK(left.size() == 1);
    CHECK(other.cancelled());
    CHECK(w->stop().empty());
    w.reset();

    std::atomic<bool> destroyed{false};
    auto w2 = std::make_unique<timer>(o);
    w2->schedule(
        [&] {
            w2.reset();
            destroyed = true;
        },
        0ms);
    REQUIRE(eventually([&] { return destroyed.load(); }));
}

TEST_CASE("htw: property: random schedule, cancel and advance against a sorted multimap") {
    const manual_clock::duration tick = 1ms;
    for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
        manual_clock::reset();
        wheel w(manual(tick, seed == 4 ? 2 : 5, false));  // the model runs a task at its grid point
        std::mt19937_64 rng(seed);
        std::multimap<mtp, int>
            model;  // the reference: pending tasks by the grid point they run at
        std::map<int, std::multimap<mtp, int>::iterator> where;
        std::vector<handle> hs;
        std::vector<int> runs;
        std::vector<mtp> deadlines;
        std::vector<int> ran_now;
        int steps = 0;
        for (; steps < 6000; ++steps) {
            const int op = static_cast<int>(rng() % 10);
            if (op < 5) {  // schedule, from 3 ticks in the past to ~2000 ticks ahead, off the grid
                const std::int64_t span =
                    static_cast<std::int64_t>(rng() % 2'000'000'000ULL) - 3'000'000;
                const std::int64_t d = (rng() % 4 == 0) ? span - span % tick.count() : span;
                const int id = static_cast<int>(hs.size());
                const mtp dl = manual_clock::now() + std::chrono::nanoseconds(d);
                runs.push_back(0);
                deadlines.push_back(dl);
                hs.push_back(w.schedule_at(
                    [&runs, &ran_now, &deadlines, id] {
                        ++runs[id];
                        ran_now.push_back(id);
                        CHECK(manual_clock::now() >= deadlines[id]);
                    },
                    dl));
                where[id] = model.emplace(grid_ceil(dl, tick), id);
            } else if (op < 7 && !hs.empty()) {  // cancel a random task, pending or not
                const int id = static_cast<int>(rng() % hs.size());
                const bool expect = where.count(id) > 0;
                REQUIRE(hs[id].cancel() == expect);
                if (expect) {
                    model.erase(where[id]);
                    where.erase(id);
                }
                REQUIRE(hs[id].pending() == false);
            } else {  // move the clock, mostly a little, sometimes far, and advance
                const auto r = rng() % 100;
                const std::int64_t by = r < 90
                                            ? static_cast<std::int64_t>(rng() % 5'000'000)
                                            : static_cast<std::int64_t>(rng() % 3'000'000'000ULL);
                manual_clock::advance(std::chrono::nanoseconds(by));
                ran_now.clear();
                const std::size_t ran = w.advance();  // one call runs everything due
                std::set<int> expected;
                const mtp now = manual_clock::now();
                for (auto it = model.begin(); it != model.end() && it->first <= now;) {
                    expected.insert(it->second);
                    where.erase(it->second);
                    it = model.erase(it);
                }
                std::set<int> got(ran_now.begin(), ran_now.end());
                REQUIRE(got.size() == ran_now.size());  // nobody twice
                REQUIRE(got == expected);
                REQUIRE(ran == expected.size());
                REQUIRE(w.advance() == 0);
            }
            REQUIRE(w.pending() == model.size());
        }
        for (std::size_t i = 0; i < runs.size(); ++i) REQUIRE(runs[i] <= 1);
        auto left = w.stop();
        REQUIRE(left.size() == model.size());
        for (std::size_t i = 1; i < left.size(); ++i)
            REQUIRE(left[i - 1].deadline() <= left[i].deadline());
    }
}

// The ring alone against a model, from starts anywhere on the time line, driven at the clock's
// time or tick-rounded (what the public wheel's fuzz target cannot see, the levels, is checked
// here): a pass hands over exactly the nodes held that are due at the time it is given, each once;
// there is at most one level per bit of a tick count; the wheel's time runs at most one tick ahead
// of the latest time it started or passed at; next_expiry() is nullopt exactly when nothing is
// held, else never later than the earliest deadline held.
TEST_CASE("timing_wheel: property: random link, unlink and passes against a model") {
    using rep = manual_clock::rep;
    const auto plus = [](mtp t, rep d) {
        rep r;
        if (__builtin_add_overflow(t.time_since_epoch().count(), d, &r))
            return d > 0 ? mtp::max() : mtp::min();
        return mtp{manual_clock::duration{r}};
    };
    for (std::uint64_t seed = 1; seed <= 12; ++seed) {
        std::mt19937_64 rng(seed);
        const mtp starts[] = {
            mtp{},      mtp::min() + 5ns, mtp::max() - 1ms,
            mtp::min(), mtp::max(),       mtp{std::chrono::nanoseconds(rng() >> 1)}};
        mtp now = starts[seed % 6];
        const rep tick = 1 + static_cast<rep>(rng() % 1000);
        const std::size_t size = 2 + rng() % 7;
        const bool rounded = seed % 2 == 0;  // passes at the grid point at or before the clock
        CAPTURE(seed, now.time_since_epoch().count(), tick, size, rounded);
        ring r(manual_clock::duration{tick}, size, now);
        mtp latest = now;
        ring_nodes nodes;
        std::set<std::uint32_t> held;
        std::vector<mtp> out;
        std::vector<std::uint32_t> seqs;
        std::size_t came_out = 0;
        for (int step = 0; step < 4000; ++step) {
            const auto op = rng() % 10;
            if (op < 4) {
                // link: from 3 ticks back to 2000 ticks ahead (1 in 4 on the tick grid), or (1 in
                // 16) anywhere
                const rep off =
                    rng() % 16 == 0
                        ? static_cast<rep>(rng())
                        : static_cast<rep>(rng() % (2003 * static_cast<std::uint64_t>(tick))) -
                              3 * tick;
                const mtp d = plus(now, off);
                held.insert(nodes.link(r, rng() % 4 == 0 ? r.ceil_to_grid(d) : d).seq);
            } else if (op < 6 && !held.empty()) {  // unlink one
                auto it = held.begin();
                std::advance(it, static_cast<std::ptrdiff_t>(rng() % held.size()));
                r.unlink(&nodes.v[*it]);
                held.erase(it);
            } else {
                // the clock moves: to a deadline held (maybe back), to next_expiry() (as an event
                // loop does), on a little, sometimes far, sometimes back; then a pass
                const auto k = rng() % 100;
                const std::uint64_t t = static_cast<std::uint64_t>(tick);
                if (k < 15 && !held.empty()) {
                    auto it = held.begin();
                    std::advance(it, static_cast<std::ptrdiff_t>(rng() % held.size()));
                    now = nodes.v[*it].deadline;
                } else if (k < 30 && r.next_expiry()) {
                    now = std::max(now, *r.next_expiry());
                } else {
                    const rep by = k < 80   ? static_cast<rep>(rng() % (5 * t))
                                   : k < 95 ? static_cast<rep>(rng() % (3000 * t))
                                            : -static_cast<rep>(rng() % (10 * t));
                    now = plus(now, by);
                }
                const mtp at = rounded ? r.floor_to_grid(now) : now;
                latest = std::max(latest, at);
                out.clear();
                seqs.clear();
                out.reserve(held.size());
                seqs.reserve(held.size());
                const std::size_t count = r.expire(at, collect{&out, &seqs});
                REQUIRE(count == seqs.size());
                std::set<std::uint32_t> expected;
                for (const std::uint32_t id : held)
                    if (nodes.v[id].deadline <= at) expected.insert(id);
                const std::set<std::uint32_t> got(seqs.begin(), seqs.end());
                REQUIRE(got.size() == seqs.size());  // each once
                REQUIRE(got == expected);            // never early, never late
                for (const std::uint32_t id : got) held.erase(id);
                came_out += got.size();
                REQUIRE(r.current_time() <= plus(latest, tick));
            }
            REQUIRE(r.size() == held.size());
            REQUIRE(r.level_count() >= 1);
            REQUIRE(r.level_count() <= 66);
            const std::optional<mtp> next = r.next_expiry();
            REQUIRE(next.has_value() == !held.empty());
            if (next) {
                mtp earliest = mtp::max();
                for (const std::uint32_t id : held)
                    earliest = std::min(earliest, nodes.v[id].deadline);
                REQUIRE(*next <= earliest);
            }
        }
        std::set<std::uint32_t> rest;
        r.take_all([&](node* n) { rest.insert(n->seq); });
        // the passes had work (fewer near time_point::max(), where most deadlines saturate to
        // "never")
        CHECK(came_out > 10);
        CHECK(rest == held);
        CHECK(r.size() == 0);
        CHECK_FALSE(r.next_expiry());
    }
}

TEST_CASE("htw: threads schedule and cancel, every task runs once or is cancelled") {
    manual_clock::reset();
    timer::options o;
    o.tick = 1ms;
    o.wheel_size = 8;
    timer w(o);
    constexpr int threads = 4, per = 10000;
    std::vector<std::atomic<int>> runs(threads * per);
    std::vector<std::atomic<int>> cancels(threads * per);
    std::vector<mtp> deadlines(threads * per);
    std::atomic<int> early{0};
    std::atomic<bool> go{false};
    std::atomic<int> finished{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
            while (!go) std::this_thread::yield();
            std::mt19937 rng(static_cast<unsigned>(t));
            std::vector<std::pair<int, handle>> mine;
            for (int i = 0; i < per; ++i) {
                const int id = t * per + i;
                const auto d = std::chrono::microseconds(rng() % 50'000);
                deadlines[id] =
                    manual_clock::now() + d;  // written before schedule: read by the task
                auto dl = deadlines[id];
                mine.emplace_back(id, w.schedule_at(
                                          [&, id, dl] {
                                              if (manual_clock::now() < dl) ++early;
                                              ++runs[id];
                                          },
                                          dl));
                if (rng() % 3 == 0 && !mine.empty()) {
                    auto& [cid, h] = mine[rng() % mine.size()];
                    if (h.cancel()) ++cancels[cid];
                }
            }
            for (auto& [cid, h] : mine)
                if (rng() % 4 == 0 && h.cancel()) ++cancels[cid];
            ++finished;
        });
    }
    go = true;
    // drive the clock while the threads work
    std::thread driver([&] {
        while (finished < threads) {
            manual_clock::advance(100us);
            std::this_thread::yield();
        }
    });
    for (auto& t : ts) t.join();
    driver.join();
    manual_clock::advance(1s);
    REQUIRE(eventually([&] { return w.pending() == 0; }));
    auto left = w.stop();
    CHECK(left.empty());
    int ran = 0, cancelled = 0;
    for (int i = 0; i < threads * per; ++i) {
        INFO("task " << i);
        REQUIRE(runs[i] + cancels[i] == 1);
        ran += runs[i];
        cancelled += cancels[i];
    }
    CHECK(early == 0);
    CHECK(ran + cancelled == threads * per);
    CHECK(cancelled > 0);
    CHECK(ran > 0);
}

TEST_CASE("htw: real clock: tasks run on time on the worker thread") {
    using rwheel = delayq::hierarchical_timing_wheel<>;
    rwheel::options o;
    o.tick = 1ms;
    rwheel w(o);
    constexpr int n = 200;
    std::atomic<int> ran{0}, early{0};
    std::atomic<std::int64_t> worst_late_us{0};
    for (int i = 0; i < n; ++i) {
        const auto dl = std::chrono::steady_clock::now() + std::chrono::microseconds(i * 150);
        w.schedule_at(
            [&, dl] {
                const auto now = std::chrono::steady_clock::now();
                if (now < dl) ++early;
                const auto late =
                    std::chrono::duration_cast<std::chrono::microseconds>(now - dl).count();
                std::int64_t w0 = worst_late_us.load();
                while (late > w0 && !worst_late_us.compare_exchange_weak(w0, late)) {
                }
                ++ran;
            },
            dl);
    }
    REQUIRE(eventually([&] { return ran == n; }, 10s));
    CHECK(early == 0);
    CHECK(w.pending() == 0);
    WARN("worst lateness " << worst_late_us.load() << " us (tick 1 ms)");
}

namespace {
struct owning_task {  // move-only; a moved-from one has no body
    std::unique_ptr<int> body = std::make_unique<int>(1);
    void operator()() const {}
};
}  // namespace

TEST_CASE("htw: a refused schedule leaves the task untouched") {
    manual_clock::reset();
    auto o = manual(1ms, 8);
    o.max_pending = 1;
    wheel w(o);
    w.schedule(owning_task{}, 1ms);
    owning_task t;
    CHECK_THROWS_AS(w.schedule(std::move(t), 1ms), delayq::rejected_error);
    CHECK(t.body != nullptr);  // not moved from
    CHECK(w.pending() == 1);
    w.stop();
    owning_task t2;
    CHECK_THROWS_AS(w.schedule(std::move(t2), 1ms), delayq::rejected_error);
    CHECK(t2.body != nullptr);
    CHECK(w.pending() == 0);
}

TEST_CASE("htw: a clock near time_point::min() or max()") {
    // never early, and run within one more tick, at both ends of the clock's range
    for (mtp start : {mtp::min() + 5ns, mtp::max() - 10us}) {
        manual_clock::set(start);
        wheel w(manual(1000ns, 4));
        int ran = 0;
        mtp ran_at{};
        auto h = w.schedule(
            [&] {
                ++ran;
                ran_at = manual_clock::now();
            },
            5000ns);
        auto never = w.schedule([&] { ++ran; }, 1h);  // saturates near max(): then never runs
        manual_clock::advance(4999ns);
        drain(w);
        CHECK(ran == 0);
        manual_clock::advance(1ns);  // at the deadline
        drain(w);
        manual_clock::advance(1000ns);  // one tick later at the latest
        drain(w);
        CHECK(h.expired());
        CHECK(ran_at >= h.deadline());
        CHECK(ran_at - h.deadline() <= 1000ns);  // observed at our step: at most one tick
        if (never.deadline() == mtp::max()) {
            CHECK(ran == 1);
            CHECK(never.pending());
        }
    }
    manual_clock::reset();
}

TEST_CASE("htw: next_expiry tells an event loop when to call advance") {
    manual_clock::reset();
    wheel w(manual(1ms, 4));
    CHECK_FALSE(w.next_expiry());
    auto h = w.schedule([] {}, 2500us);
    REQUIRE(w.next_expiry());
    CHECK(*w.next_expiry() <= mtp{3ms});  // never late: the bucket's expiry
    CHECK(h.cancel());
    CHECK_FALSE(w.next_expiry());  // nothing pending: nothing to wait for
    int ran = 0;
    w.schedule([&] { ++ran; }, 2500us);
    // an event loop: sleep (move the clock) until next_expiry, then advance
    for (int i = 0; i < 10 && ran == 0; ++i) {
        auto next = w.next_expiry();
        REQUIRE(next);
        if (*next > manual_clock::now()) manual_clock::set(*next);
        w.advance();
    }
    CHECK(ran == 1);
    CHECK(manual_clock::now() == mtp{2500us});  // at its own deadline (precise)
    w.schedule([] {}, -1ms);
    REQUIRE(w.next_expiry());
    CHECK(*w.next_expiry() <= manual_clock::now());  // due now
}
