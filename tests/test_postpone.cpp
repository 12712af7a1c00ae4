// reschedule() to a later deadline leaves the node where it is (wheel_core::reschedule, the rings'
// may_postpone()): the pass that meets it files it again by its own deadline. These tests hold the
// contract that makes that safe, on both thread-free wheels: after every advance(now), every task
// with deadline <= now has run, exactly once, and none with a later deadline has; whatever mix of
// postponements, advancements, cancels and clock jumps (by less than a tick, by many rotations)
// came before.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <delayq/manual_clock.hpp>
#include <optional>
#include <random>
#include <vector>

#include "catch.hpp"
#include "wheels.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;
using hashed = delayq::test::hashed_core;
using hierarchical = delayq::test::hierarchical_core;

namespace {

struct timer {
    delayq::timeout<mc> handle;
    mc::time_point deadline{};
    int runs = 0;
    bool cancelled = false;
};

// Checks the contract at `now`, after an advance(now).
void check_all(const std::vector<timer>& ts, mc::time_point now) {
    for (std::size_t i = 0; i < ts.size(); ++i) {
        const timer& t = ts[i];
        INFO("timer " << i << " due at " << t.deadline.time_since_epoch().count() << " ns, now "
                      << now.time_since_epoch().count() << " ns");
        if (t.cancelled) {
            REQUIRE(t.runs == 0);
        } else if (t.deadline <= now) {
            REQUIRE(t.runs == 1);  // never late: it ran in the pass that reached it
        } else {
            REQUIRE(t.runs == 0);  // never early
        }
    }
}

}  // namespace

TEMPLATE_TEST_CASE(
    "postpone: a task moved later runs at its new deadline, never before, never after",
    "[postpone]", hashed, hierarchical) {
    mc::reset();
    typename TestType::wheel w(TestType::options(8));  // 1 ms tick, 8 buckets: rotations of 8 ms
    timer t;
    t.handle = w.schedule([&] { ++t.runs; }, 3ms);
    t.deadline = mc::now() + 3ms;
    // to the same bucket a rotation on, to another bucket, within the tick, past many rotations
    for (const std::chrono::microseconds later : {11000us, 13000us, 13500us, 100000us, 1000000us}) {
        REQUIRE(t.handle.reschedule_at(mc::time_point{later}));
        t.deadline = mc::time_point{later};
        REQUIRE(w.next_expiry());
        CHECK(*w.next_expiry() <= t.deadline);  // may be early (the old place), never late
        for (;;) {
            const auto next = w.next_expiry();
            REQUIRE(next);
            if (*next >= t.deadline) break;
            mc::set(std::max(*next, mc::now()));
            w.advance();
            REQUIRE(t.runs == 0);
        }
        REQUIRE(w.pending() == 1);
    }
    mc::set(t.deadline - 1ns);
    CHECK(w.advance() == 0);
    mc::set(t.deadline);
    CHECK(w.advance() == 1);
    CHECK(t.runs == 1);
    CHECK(w.pending() == 0);
}

TEMPLATE_TEST_CASE("postpone: random postponements, cancels and clock steps keep every task exact",
                   "[postpone]", hashed, hierarchical) {
    for (std::uint32_t seed = 1; seed <= 20; ++seed) {
        INFO("seed " << seed);
        mc::reset();
        std::mt19937_64 rng(seed);
        auto pick = [&](std::int64_t lo, std::int64_t hi) {
            return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
        };
        typename TestType::wheel w(TestType::options(8));
        std::vector<timer> ts(400);
        for (auto& t : ts) {
            t.deadline = mc::now() + std::chrono::microseconds(pick(0, 40'000));
            t.handle = w.schedule_at([&t] { ++t.runs; }, t.deadline);
        }
        std::size_t pending = ts.size();
        while (pending != 0) {
            // move some pending tasks: mostly later (in place), sometimes earlier (relinked)
            for (int k = 0; k < 40; ++k) {
                timer& t =
                    ts[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(ts.size()) - 1))];
                if (t.runs != 0 || t.cancelled) continue;
                if (pick(0, 19) == 0) {
                    REQUIRE(t.handle.cancel());
                    t.cancelled = true;
                    --pending;
                    continue;
                }
                const auto by = std::chrono::microseconds(pick(-2'000, 30'000));
                const auto d = std::max(mc::now(), t.deadline + by);
                REQUIRE(t.handle.reschedule_at(d));
                t.deadline = d;
            }
            // then step the clock: within a tick, a few ticks, or past several rotations
            const std::int64_t step = pick(0, 9) < 7 ? pick(0, 3'000) : pick(3'000, 60'000);
            mc::advance(std::chrono::microseconds(step));
            pending -= w.advance();
            check_all(ts, mc::now());
            REQUIRE(w.pending() == pending);
        }
    }
}

TEMPLATE_TEST_CASE("postpone: a periodic task moved later keeps its period from the new start",
                   "[postpone]", hashed, hierarchical) {
    mc::reset();
    typename TestType::wheel w(TestType::options(8));
    std::vector<mc::time_point> at;
    auto h = w.schedule_every([&] { at.push_back(mc::now()); }, 5ms);
    REQUIRE(h.reschedule_at(mc::time_point{37ms}));  // later than its first run, 5 ms
    for (int i = 0; i < 60; ++i) {
        mc::advance(1ms);
        w.advance();
    }
    CHECK(at == std::vector<mc::time_point>{mc::time_point{37ms}, mc::time_point{42ms},
                                            mc::time_point{47ms}, mc::time_point{52ms},
                                            mc::time_point{57ms}});
}
