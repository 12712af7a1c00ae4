// The schedule texts of repeatable jobs (delayq/detail/job_queue/repeat.hpp) and the next run each
// gives: in phase for put_every, one catch-up run after a long pause, the next matching minute for
// put_cron.
#include <chrono>
#include <delayq/detail/job_queue/repeat.hpp>
#include <string>

#include "catch.hpp"

using delayq::detail::job_queue::cron_text;
using delayq::detail::job_queue::every_text;
using delayq::detail::job_queue::next_run;

TEST_CASE("repeat: every period, in phase, one catch-up run") {
    const auto e = every_text(std::chrono::seconds(60));
    CHECK(e == "e60000");
    CHECK(next_run(e, 1'000'000, 1'000'500) == 1'060'000);  // acked soon after its due time
    CHECK(next_run(e, 1'000'000, 1'060'000) == 1'120'000);  // acked right at the next slot
    CHECK(next_run(e, 1'000'000, 4'600'000) == 4'660'000);  // an hour late: the next slot after now
    CHECK(next_run(e, 1'000'000, 999'000) == 1'060'000);    // acked before its due time
}

TEST_CASE("repeat: a cron schedule's next run is the next matching minute after now") {
    const auto c = cron_text("*/15 * * * *");
    CHECK(c.front() == 'c');
    using namespace std::chrono;
    const auto t = sys_days(year(2026) / 12 / 7) + hours(10) + minutes(7) + seconds(30);
    const long long now = duration_cast<milliseconds>(t.time_since_epoch()).count();
    const long long want =
        duration_cast<milliseconds>(
            (sys_days(year(2026) / 12 / 7) + hours(10) + minutes(15)).time_since_epoch())
            .count();
    CHECK(next_run(c, now - 100'000, now) == want);
}

TEST_CASE("repeat: texts this version cannot read give no next run") {
    for (const char* bad : {"", "e", "e0", "e-5", "x100", "c1:2", "eabc"}) {
        INFO(bad);
        CHECK_FALSE(next_run(bad, 0, 0).has_value());
    }
}

TEST_CASE("repeat: a slot kept beside the schedule reads back") {
    using delayq::detail::job_queue::slot_of;
    using delayq::detail::job_queue::with_slot;
    const std::string s = with_slot(1'796'000'000'000, "e60000");
    CHECK(s == "1796000000000 e60000");
    const auto p = slot_of(s);
    REQUIRE(p.has_value());
    CHECK(p->slot == 1'796'000'000'000);
    CHECK(std::string(p->text) == "e60000");
    CHECK(slot_of("-5 e1")->slot == -5);
    for (const char* bad : {"", "e60000", " e1", "12a e1", "123456789012345678901 e1"}) {
        INFO(bad);
        CHECK_FALSE(slot_of(bad).has_value());
    }
}
