#include <atomic>
#include <condition_variable>
#include <delayq/manual_clock.hpp>
#include <mutex>
#include <thread>

#include "catch.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using delayq::manual_clock;
using delayq::test::eventually;

TEST_CASE("manual_clock moves only when told") {
    manual_clock::reset();
    CHECK(manual_clock::now() == manual_clock::time_point{});
    manual_clock::advance(5ms);
    CHECK(manual_clock::now() == manual_clock::time_point{5ms});
    manual_clock::advance(-1s);  // steady: never backwards by advance
    CHECK(manual_clock::now() == manual_clock::time_point{5ms});
    manual_clock::advance(manual_clock::duration::max());
    CHECK(manual_clock::now() == manual_clock::time_point::max());
    manual_clock::set(manual_clock::time_point{42s});
    CHECK(manual_clock::now() == manual_clock::time_point{42s});
    manual_clock::reset();
    CHECK(manual_clock::now() == manual_clock::time_point{});
    STATIC_REQUIRE(manual_clock::is_steady);
}

TEST_CASE("a waiter on a manual_clock deadline wakes when advance passes it, not before") {
    manual_clock::reset();
    std::mutex m;
    std::condition_variable cv;
    std::atomic<bool> woke{false};
    std::thread t([&] {
        std::unique_lock lk(m);
        while (manual_clock::now() < manual_clock::time_point{10ms})
            delayq::detail::wait_until<manual_clock>(cv, lk, manual_clock::time_point{10ms});
        woke = true;
    });
    REQUIRE(eventually([] { return manual_clock::sleepers() == 1; }));
    const auto before = manual_clock::sleeps_begun();
    manual_clock::advance(9ms);
    // It looked at the clock after the advance and went back to sleep.
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before || woke; }));
    CHECK_FALSE(woke);
    manual_clock::advance(1ms);
    REQUIRE(eventually([&] { return woke.load(); }));
    t.join();
    CHECK(manual_clock::sleepers() == 0);
}

TEST_CASE("manual_clock wake-ups are not lost when advance races the waiter") {
    manual_clock::reset();
    for (int round = 0; round < 200; ++round) {
        std::mutex m;
        std::condition_variable cv;
        const auto target = manual_clock::now() + 1ms;
        std::thread t([&] {
            std::unique_lock lk(m);
            while (manual_clock::now() < target)
                delayq::detail::wait_until<manual_clock>(cv, lk, target);
        });
        manual_clock::advance(1ms);  // may come before, during or after the wait begins
        t.join();                    // hangs (and the ctest timeout fails it) if a wake-up is lost
    }
    CHECK(manual_clock::sleepers() == 0);
}
