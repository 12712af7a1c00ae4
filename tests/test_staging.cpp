// Staging (detail/staging.hpp): the hashed wheel links a schedule through its thread's staging
// lane, which settles into the buckets when it is full or when a pass begins. The hierarchical
// wheel links at once; it runs the same checks, as the reference the hashed one must match.
// Driven by manual_clock through the thread-free cores.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <random>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "wheels.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using tp = mc::time_point;
using handle = delayq::timeout<mc>;

namespace {

// Small wheels, so that a lane settles (at 1 024 links) long before a pass: 4 buckets of 1 ms, or
// levels of 4 buckets.
struct hashed {
    using wheel = delayq::test::hashed_core::wheel;
    static wheel::options options() { return delayq::test::hashed_core::options(4); }
};
// A large ring: its lanes settle at 16 384 links, so here only when a pass begins.
struct hashed_large {
    using wheel = delayq::test::hashed_core::wheel;
    static wheel::options options() { return delayq::test::hashed_core::options(8192); }
};
struct hierarchical {
    using wheel = delayq::test::hierarchical_core::wheel;
    static wheel::options options() { return delayq::test::hierarchical_core::options(4); }
};

}  // namespace

TEMPLATE_TEST_CASE(
    "staging: tasks linked by two threads and settled lane by lane run at their "
    "deadlines",
    "", hashed, hashed_large, hierarchical) {
    // 3 000 tasks from each of two threads go through both a lane's settling and a pass's, some
    // cancelled and some rescheduled on the way; every task not cancelled runs once, at its
    // (final) deadline, in deadline order.
    mc::reset();
    typename TestType::wheel w(TestType::options());
    constexpr std::size_t per_thread = 3000;
    struct record {
        tp due;
        tp ran{};
        int runs = 0;
    };
    std::vector<record> rec(2 * per_thread);
    std::vector<handle> hs(2 * per_thread);
    std::vector<std::size_t> ran_order;
    auto producer = [&](std::size_t first, unsigned seed) {
        std::mt19937_64 rng(seed);
        for (std::size_t i = first; i < first + per_thread; ++i) {
            rec[i].due = tp{} + std::chrono::microseconds(1000 + rng() % 199'000);
            hs[i] = w.schedule_at(
                [&, i] {
                    rec[i].ran = mc::now();
                    ++rec[i].runs;
                    ran_order.push_back(i);
                },
                rec[i].due);
        }
    };
    std::thread a(producer, 0, 1), b(producer, per_thread, 2);
    a.join();
    b.join();
    std::size_t cancelled = 0;
    for (std::size_t i = 0; i < rec.size(); i += 7) cancelled += hs[i].cancel() ? 1 : 0;
    CHECK(cancelled == (rec.size() + 6) / 7);
    for (std::size_t i = 3; i < rec.size(); i += 11) {
        if (i % 7 == 0) continue;
        rec[i].due = std::min(rec[i].due + 37ms, tp{} + 199ms);
        CHECK(hs[i].reschedule_at(rec[i].due));
    }
    CHECK(w.pending() == rec.size() - cancelled);
    tp first = tp::max();
    for (std::size_t i = 0; i < rec.size(); ++i)
        if (i % 7 != 0) first = std::min(first, rec[i].due);
    REQUIRE(w.next_expiry());
    CHECK(*w.next_expiry() <= first);  // early at most (a cancelled staged node), never late
    std::size_t ran = 0;
    for (int k = 1; k <= 200; ++k) {
        mc::set(tp{} + k * 1ms);
        const std::size_t before = ran_order.size();
        ran += w.advance(mc::now());
        for (std::size_t j = before + 1; j < ran_order.size(); ++j)
            CHECK(rec[ran_order[j - 1]].due <= rec[ran_order[j]].due);
    }
    CHECK(ran == rec.size() - cancelled);
    CHECK(w.pending() == 0);
    CHECK_FALSE(w.next_expiry());
    for (std::size_t i = 0; i < rec.size(); ++i) {
        CAPTURE(i);
        CHECK(rec[i].runs == (i % 7 == 0 ? 0 : 1));
        if (i % 7 == 0) continue;
        CHECK(rec[i].ran >= rec[i].due);
        CHECK(rec[i].ran - rec[i].due < 1ms);
    }
}

TEMPLATE_TEST_CASE("staging: the next expiry counts a staged task, and a pass runs it on time", "",
                   hashed, hashed_large, hierarchical) {
    // One task, staged (no lane is full): the wheel must wake for it although no bucket holds it.
    mc::reset();
    typename TestType::wheel w(TestType::options());
    int ran = 0;
    w.schedule_at([&] { ++ran; }, tp{} + 2500us);
    REQUIRE(w.next_expiry());
    CHECK(*w.next_expiry() <= tp{} + 2500us);
    mc::set(tp{} + 2499us);
    CHECK(w.advance(mc::now()) == 0);
    mc::set(tp{} + 2500us);
    CHECK(w.advance(mc::now()) == 1);
    CHECK(ran == 1);
    // Staged, then handed back by stop() with everything else: nothing lost.
    for (int i = 0; i < 10; ++i) w.schedule_at([&] { ++ran; }, tp{} + 1h);
    CHECK(w.pending() == 10);
    CHECK(w.stop().size() == 10);
    CHECK(ran == 1);
}

TEMPLATE_TEST_CASE(
    "staging: 400 000 timers for one instant, scheduled hours apart, run first in, "
    "first out",
    "", hashed, hashed_large, hierarchical) {
    // Half scheduled at 0, half one second before they are all due, in a wheel of 4 buckets (or
    // levels of 4): what a pass gathers of one deadline, bucket by bucket and list by list, need
    // not be in schedule order, and the pass must put it back in order (the sort of equal
    // deadlines, quadratic before: test_due_batch) without taking longer than a sort.
    mc::reset();
    typename TestType::wheel w(TestType::options());
    const std::size_t half = 200'000;
    const tp at = tp{} + 2h;
    std::vector<std::uint32_t> order;
    order.reserve(2 * half);
    std::uint32_t next = 0;
    auto schedule_half = [&] {
        for (std::size_t i = 0; i < half; ++i)
            w.schedule_at([&order, k = next++] { order.push_back(k); }, at);
    };
    schedule_half();
    mc::set(tp{} + 1h + 59min + 59s);  // the first half has cascaded, or sits in its bucket
    CHECK(w.advance(mc::now()) == 0);
    schedule_half();
    mc::set(at);
    CHECK(w.advance(mc::now()) == 2 * half);
    REQUIRE(order.size() == 2 * half);
    CHECK(std::is_sorted(order.begin(), order.end()));
}

TEMPLATE_TEST_CASE("staging: a lane whose lists cancels left uneven settles every node once", "",
                   hashed, hierarchical) {
    // A lane spreads its links over 8 lists in turn and settles them together when it holds
    // 1 024. Cancels between the links leave those lists of unequal lengths (every third and
    // every fifth link gone, and runs of 8 in a row); the lane settles four times while they
    // happen. Every task not cancelled runs once, at its deadline; no cancelled one runs.
    mc::reset();
    typename TestType::wheel w(TestType::options());
    constexpr std::size_t n = 4500;
    std::vector<int> runs(n, 0);
    std::vector<tp> ran_at(n);
    std::vector<handle> hs(n);
    std::vector<tp> due(n);
    std::vector<bool> gone(n, false);
    std::mt19937_64 rng(5);
    std::size_t cancelled = 0;
    for (std::size_t i = 0; i < n; ++i) {
        due[i] = tp{} + std::chrono::microseconds(1000 + rng() % 99'000);
        hs[i] = w.schedule_at(
            [&runs, &ran_at, i] {
                ++runs[i];
                ran_at[i] = mc::now();
            },
            due[i]);
        for (const std::size_t back : {std::size_t{3}, std::size_t{5}}) {
            if (i < back || (i - back) % back != 0 || gone[i - back]) continue;
            CHECK(hs[i - back].cancel());
            gone[i - back] = true;
            ++cancelled;
        }
        if (i % 512 == 511) {  // a run of 8 links in a row: one from each list
            for (std::size_t j = i - 7; j <= i; ++j) {
                if (gone[j]) continue;
                CHECK(hs[j].cancel());
                gone[j] = true;
                ++cancelled;
            }
        }
    }
    CHECK(w.pending() == n - cancelled);
    std::size_t ran = 0;
    for (int k = 1; k <= 100; ++k) {
        mc::set(tp{} + k * 1ms);
        ran += w.advance(mc::now());
    }
    CHECK(ran == n - cancelled);
    CHECK(w.pending() == 0);
    for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        CHECK(runs[i] == (gone[i] ? 0 : 1));
        if (gone[i]) continue;
        CHECK(ran_at[i] >= due[i]);
        CHECK(ran_at[i] - due[i] < 1ms);
    }
}
