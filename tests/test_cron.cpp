// The five-field cron expressions of repeatable jobs (delayq/detail/cron.hpp): parsing, refusals,
// and the next matching minute, in UTC.
#include <chrono>
#include <delayq/detail/cron.hpp>
#include <stdexcept>
#include <string>

#include "catch.hpp"

namespace {

using namespace std::chrono;
using delayq::detail::cron;

system_clock::time_point at(int y, unsigned mo, unsigned d, int h = 0, int mi = 0, int s = 0) {
    return sys_days(year(y) / month(mo) / day(d)) + hours(h) + minutes(mi) + seconds(s);
}

}  // namespace

TEST_CASE("cron: every minute, and the next minute is strictly after") {
    const cron c("* * * * *");
    CHECK(c.next_after(at(2026, 12, 7, 10, 30)) == at(2026, 12, 7, 10, 31));
    CHECK(c.next_after(at(2026, 12, 7, 10, 30, 59)) == at(2026, 12, 7, 10, 31));
    CHECK(c.next_after(at(2026, 12, 31, 23, 59, 1)) == at(2027, 1, 1, 0, 0));
}

TEST_CASE("cron: lists, ranges, steps and names") {
    CHECK(cron("*/15 * * * *").next_after(at(2026, 1, 1, 0, 1)) == at(2026, 1, 1, 0, 15));
    CHECK(cron("0 9-17/4 * * *").next_after(at(2026, 1, 1, 9, 0)) == at(2026, 1, 1, 13, 0));
    CHECK(cron("0 9-17/4 * * *").next_after(at(2026, 1, 1, 17, 0)) == at(2026, 1, 2, 9, 0));
    CHECK(cron("5,10 0 * * *").next_after(at(2026, 1, 1, 0, 5)) == at(2026, 1, 1, 0, 10));
    CHECK(cron("0 0 1 jan,Jul *").next_after(at(2026, 2, 1)) == at(2026, 7, 1));
    // 2026-12-07 is a Monday.
    CHECK(cron("30 8 * * MON-FRI").next_after(at(2026, 12, 5)) == at(2026, 12, 7, 8, 30));
    CHECK(cron("0 0 * * 7").next_after(at(2026, 12, 7)) == at(2026, 12, 13));  // 7: Sunday
    CHECK(cron("0 0 * * 0").next_after(at(2026, 12, 7)) == at(2026, 12, 13));
}

TEST_CASE("cron: both day fields restricted match either, as in every crontab") {
    const cron c("0 9 1 * MON");  // the first of each month, and every Monday
    CHECK(c.next_after(at(2026, 12, 7, 10)) == at(2026, 12, 14, 9));
    CHECK(c.next_after(at(2026, 12, 28, 10)) == at(2027, 1, 1, 9));
    // One of them '*' (or "*/n"): the other decides.
    CHECK(cron("0 9 */10 * *").next_after(at(2026, 12, 2)) == at(2026, 12, 11, 9));
}

TEST_CASE("cron: a 29 February years away") {
    CHECK(cron("0 0 29 2 *").next_after(at(2026, 12, 7)) == at(2028, 2, 29));
}

TEST_CASE("cron: bad expressions are std::invalid_argument naming the problem") {
    for (const char* bad : {"", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *",
                            "* * * 13 *", "* * * * 8", "*/0 * * * *", "5-1 * * * *", "a * * * *",
                            "* * * FOO *", ",5 * * * *", "0 0 30 2 *"}) {
        INFO(bad);
        CHECK_THROWS_AS(cron(bad), std::invalid_argument);
    }
    try {
        cron c("0 25 * * *");
        FAIL("no exception");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("hour") != std::string::npos);
    }
}

TEST_CASE("cron: masks, and an expression made from them, are the same schedule") {
    for (const char* e : {"*/15 * * * *", "30 8 * * MON-FRI", "0 9 1 * MON", "0 0 29 2 *",
                          "59 23 31 12 *", "0,30 */2 */10 * *"}) {
        INFO(e);
        const cron c(e);
        const auto m = cron::from_masks(c.masks());
        REQUIRE(m.has_value());
        CHECK(m->masks() == c.masks());
        for (auto t = at(2026, 1, 1); t < at(2030, 1, 1); t += hours(24 * 37 + 5))
            CHECK(m->next_after(t) == c.next_after(t));
    }
    CHECK(cron("* * * * *").masks() == "1073741823:1073741823:16777215:4294967294:8190:127:3");
    for (const char* bad : {"", "1:2:3", "1:2:3:4:5:6:7:8", "a:0:0:0:0:0:0", "0:0:0:0:0:0:0"}) {
        INFO(bad);
        CHECK_FALSE(cron::from_masks(bad).has_value());
    }
}
