// cancel() counts a task out and destroys it at once, but leaves its node linked for a later
// cancel, pass or stop() to unlink, a batch of them at a time (wheel_core::cancel, bury()). These
// tests hold what that must not change, on both thread-free wheels: the callable is gone before
// cancel() returns, pending() is exact, a cancelled task never runs and cannot be cancelled or
// rescheduled again (through another copy of its handle), nothing is left due once everything is
// cancelled, and every node is freed (the ASan preset's leak check sees a node never let go).
#include <chrono>
#include <cstddef>
#include <delayq/manual_clock.hpp>
#include <memory>
#include <random>
#include <vector>

#include "catch.hpp"
#include "wheels.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using tp = mc::time_point;
using handle = delayq::timeout<mc>;
using hashed = delayq::test::hashed_core;
using hierarchical = delayq::test::hierarchical_core;

namespace {

// The tasks alive that capture `token` (a moved-from one holds none).
long alive(const std::shared_ptr<int>& token) {
    return token.use_count() - 1;
}

}  // namespace

TEMPLATE_TEST_CASE("cancel: a random mix keeps the live callables equal to pending()", "", hashed,
                   hierarchical) {
    // 20 000 steps of schedule, cancel (through the handle or a copy of it), reschedule, drop a
    // handle and advance, in a wheel of 4 buckets (or levels of 4) so that cancelled nodes sit
    // next to each other. After every step: one callable alive per pending task, no more, no
    // fewer (so cancel() destroyed its task before it returned); every task cancelled never ran,
    // every task run ran once and not before its deadline.
    mc::reset();
    typename TestType::wheel w(TestType::options(4));
    auto token = std::make_shared<int>(0);
    struct timer {
        handle h, copy;
        tp due{};
        int runs = 0;
        bool cancelled = false;
    };
    std::vector<std::unique_ptr<timer>> ts;
    std::mt19937_64 rng(GENERATE(1u, 2u, 3u));
    std::size_t pending = 0;
    for (int step = 0; step < 20'000; ++step) {
        const unsigned op = rng() % 10;
        if (op < 4 || ts.empty()) {
            auto t = std::make_unique<timer>();
            t->due = mc::now() + std::chrono::microseconds(rng() % 20'000);
            t->h = w.schedule_at([token, &runs = t->runs] { ++runs; }, t->due);
            t->copy = t->h;
            ts.push_back(std::move(t));
            ++pending;
        } else {
            timer& t = *ts[rng() % ts.size()];
            const bool was_pending = !t.cancelled && t.runs == 0;
            if (op < 7) {
                const bool first = t.h && rng() % 2 == 0;  // t.h may have been dropped
                const bool did = (first ? t.h : t.copy).cancel();
                CHECK(did == was_pending);
                if (did) {
                    t.cancelled = true;
                    --pending;
                }
                if (first) CHECK_FALSE(t.copy.cancel());  // the other copy: too late
                if (!first && t.h) CHECK_FALSE(t.h.cancel());
            } else if (op < 8) {
                const tp to = mc::now() + std::chrono::microseconds(rng() % 20'000);
                const bool did = t.copy.reschedule_at(to);
                CHECK(did == was_pending);
                if (did) t.due = to;
            } else if (op < 9) {
                t.h = handle{};  // the copy keeps the task reachable
            } else {
                mc::advance(std::chrono::microseconds(rng() % 3'000));
                w.advance(mc::now());
                for (const auto& u : ts) {
                    if (u->cancelled) continue;
                    if (u->due <= mc::now() && u->runs == 1) continue;
                    CHECK(u->runs == 0);
                    CHECK(u->due > mc::now());
                }
                pending = 0;
                for (const auto& u : ts) pending += !u->cancelled && u->runs == 0 ? 1 : 0;
            }
        }
        REQUIRE(w.pending() == pending);
        REQUIRE(alive(token) == static_cast<long>(pending));
    }
    for (const auto& t : ts) {
        CHECK(t->runs <= 1);
        if (t->cancelled) CHECK(t->runs == 0);
    }
    CHECK(w.stop().size() == pending);
    CHECK(alive(token) == 0);
}

TEMPLATE_TEST_CASE("cancel: a cancelled task stays cancelled through every copy of its handle", "",
                   hashed, hierarchical) {
    // The first cancel leaves the node linked; the 64th cancel after it unlinks it; the 64th after
    // that lets go of the timer's reference. At each stage another copy of the handle finds the
    // task cancelled: cancel() and reschedule() are false, and the task never runs.
    mc::reset();
    typename TestType::wheel w(TestType::options(4));
    int runs = 0;
    const handle first = w.schedule_at([&] { ++runs; }, tp{} + 5ms);
    const handle copy = first;
    std::vector<handle> others;
    for (int i = 0; i < 200; ++i) others.push_back(w.schedule_at([&] { ++runs; }, tp{} + 5ms));
    handle a = first;
    CHECK(a.cancel());
    for (int stage = 0; stage < 3; ++stage) {
        INFO("stage " << stage);
        CHECK(copy.cancelled());
        CHECK_FALSE(handle(copy).cancel());
        CHECK_FALSE(handle(copy).reschedule_at(tp{} + 1ms));
        CHECK(w.pending() == others.size() - static_cast<std::size_t>(stage) * 64);
        for (int i = 0; i < 64; ++i)
            CHECK(others[static_cast<std::size_t>(stage * 64 + i)].cancel());
    }
    mc::set(tp{} + 10ms);
    CHECK(w.advance(mc::now()) == 200 - 3 * 64);
    CHECK(runs == 200 - 3 * 64);
}

TEMPLATE_TEST_CASE("cancel: a wheel whose tasks are all cancelled says nothing is due", "", hashed,
                   hierarchical) {
    // Fewer cancels than a batch: the nodes all wait to be unlinked, but nothing is pending, so
    // next_expiry() is nullopt (a driver sleeps without a deadline), in any order.
    mc::reset();
    typename TestType::wheel w(TestType::options(4));
    std::vector<handle> hs;
    for (int i = 0; i < 10; ++i)
        hs.push_back(w.schedule_at([] {}, tp{} + std::chrono::milliseconds(1 + 3 * i)));
    for (std::size_t i : {3u, 0u, 9u, 5u, 1u, 2u, 8u, 4u, 7u}) CHECK(hs[i].cancel());
    REQUIRE(w.next_expiry());
    CHECK(*w.next_expiry() <= tp{} + 19ms);  // task 6, or earlier: never later
    CHECK(hs[6].cancel());
    CHECK(w.pending() == 0);
    CHECK_FALSE(w.next_expiry());
    mc::set(tp{} + 1h);
    CHECK(w.advance(mc::now()) == 0);
    CHECK(w.stop().empty());
}

TEMPLATE_TEST_CASE("cancel: stop() hands back the pending tasks only, and lets go of the rest", "",
                   hashed, hierarchical) {
    // 100 cancelled (some unlinked, some not yet), their handles dropped, 50 pending: stop()
    // returns the 50, and the wheel lets go of every node (leak check under ASan).
    mc::reset();
    auto token = std::make_shared<int>(0);
    int runs = 0;
    std::vector<handle> kept;
    {
        typename TestType::wheel w(TestType::options(4));
        for (int i = 0; i < 150; ++i) {
            handle h = w.schedule_at([token, &runs] { ++runs; },
                                     tp{} + std::chrono::milliseconds(1 + i % 7));
            if (i % 3 == 0) {
                kept.push_back(h);
            } else {
                CHECK(h.cancel());
            }
        }
        CHECK(alive(token) == 50);
        const auto back = w.stop();
        CHECK(back.size() == 50);
        CHECK(alive(token) == 0);
    }
    for (auto& h : kept) CHECK(h.cancelled());
    CHECK(runs == 0);
}

TEMPLATE_TEST_CASE(
    "cancel: a pass that runs the last pending task while cancelled nodes wait says "
    "nothing is due",
    "", hashed, hierarchical) {
    // A and B run in one pass; A cancels C, which stays linked (it is not the last pending task:
    // B is). Then the pass runs B, the last one: nothing is pending, so nothing is due, although
    // C's node still waits to be unlinked (found by the fuzz targets' model).
    mc::reset();
    typename TestType::wheel w(TestType::options(4));
    handle c;
    int runs = 0;
    w.schedule_at(
        [&] {
            CHECK(c.cancel());
            ++runs;
        },
        tp{} + 1ms);
    w.schedule_at([&] { ++runs; }, tp{} + 1ms);
    c = w.schedule_at([&] { ++runs; }, tp{} + 50ms);
    mc::set(tp{} + 1ms);
    CHECK(w.advance(mc::now()) == 2);
    CHECK(runs == 2);
    CHECK(w.pending() == 0);
    CHECK_FALSE(w.next_expiry());
    mc::set(tp{} + 1h);
    CHECK(w.advance(mc::now()) == 0);
    CHECK(runs == 2);
}

// When a cancelled node's block goes back to the pool (wheel_core's arrays say it): by the next
// advance() (the end of the pass, or at once when nothing was due), and at once when the cancel
// leaves nothing pending. Seen through the pool, which hands a freed block out again first: the
// next schedule's node is the cancelled one's. Before, the block waited for the second bury()
// after its cancel (the 128th cancel, or the pass after next), whatever the time.
TEMPLATE_TEST_CASE("cancel: a cancelled node's block goes back by the next advance()", "", hashed,
                   hierarchical) {
    mc::reset();
    typename TestType::wheel w(TestType::options());
    const handle keep = w.schedule_at([] {}, mc::now() + 1h);  // pending throughout
    SECTION("a pass with nothing due") {
        handle h = w.schedule_at([] {}, mc::now() + 30min);
        const auto* const freed = h.node_for_timer();
        CHECK(h.cancel());
        h = handle{};  // the timer's reference is the last
        w.advance(mc::now());
        const handle next = w.schedule_at([] {}, mc::now() + 2h);
        CHECK(next.node_for_timer() == freed);
    }
    SECTION("a pass that runs a task") {
        handle h = w.schedule_at([] {}, mc::now() + 30min);
        const auto* const freed = h.node_for_timer();
        CHECK(h.cancel());
        h = handle{};
        w.schedule_at([] {}, mc::now() + 1ms);  // its handle dropped: its block goes back too
        mc::advance(1ms);
        CHECK(w.advance(mc::now()) == 1);
        std::vector<const void*> next;
        for (int i = 0; i < 2; ++i)
            next.push_back(w.schedule_at([] {}, mc::now() + 2h).node_for_timer());
        CHECK((next[0] == freed || next[1] == freed));
    }
    SECTION("the last pending task cancelled") {
        handle h = w.schedule_at([] {}, mc::now() + 30min);
        const auto* const freed = h.node_for_timer();
        CHECK(handle(keep).cancel());
        CHECK(h.cancel());  // nothing pending now
        CHECK(w.pending() == 0);
        h = handle{};
        const handle next = w.schedule_at([] {}, mc::now() + 2h);
        CHECK(next.node_for_timer() == freed);
    }
    w.stop();
}
