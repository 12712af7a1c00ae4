// A five-field cron expression, in UTC: when a repeatable job's next run is due.
//
//   minute hour day-of-month month day-of-week
//   0-59   0-23 1-31         1-12  0-7 (0 and 7: Sunday)
//
// Each field is `*`, or a list of items separated by `,`, each a number, a range `a-b`, either
// with a step (`*/15`, `8-18/2`), or a name (months JAN..DEC, days SUN..SAT, any case). As in
// Vixie cron (and every crontab since), when both day fields are restricted, a day matches if
// either does ("0 9 1 * MON": the first of the month, and every Monday).
//
// next_after(t) is the first whole minute after t that matches: at most 366 * 8 days are looked
// at (a 29 February may be 8 years away), each in constant time. An expression that never
// matches (`0 0 30 2 *`) is refused when it is made.
#pragma once

#include <bitset>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace delayq::detail {

class cron {
  public:
    using time_point = std::chrono::system_clock::time_point;

    /// Parses `expr`; std::invalid_argument naming what is wrong with it, or when it never matches.
    explicit cron(std::string_view expr) : text_(expr) {
        std::vector<std::string_view> fields;
        for (std::size_t i = 0; i < expr.size();) {
            while (i < expr.size() && (expr[i] == ' ' || expr[i] == '\t')) ++i;
            const std::size_t start = i;
            while (i < expr.size() && expr[i] != ' ' && expr[i] != '\t') ++i;
            if (i > start) fields.push_back(expr.substr(start, i - start));
        }
        if (fields.size() != 5)
            refuse("a cron expression has 5 fields (minute hour day month weekday), this one has " +
                   std::to_string(fields.size()));
        parse(fields[0], 0, 59, {}, minute_, "minute");
        parse(fields[1], 0, 23, {}, hour_, "hour");
        // As Vixie cron: a day field that begins with '*' ("*", "*/2") leaves the choice to the
        // other one.
        dom_any_ = fields[2].front() == '*';
        parse(fields[2], 1, 31, {}, dom_, "day of month");
        static constexpr std::string_view months[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                                      "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
        parse(fields[3], 1, 12, months, month_, "month");
        dow_any_ = fields[4].front() == '*';
        static constexpr std::string_view days[] = {"SUN", "MON", "TUE", "WED",
                                                    "THU", "FRI", "SAT"};
        std::bitset<64> dow;
        parse(fields[4], 0, 7, days, dow, "day of week");
        if (dow[7]) dow.set(0);  // 7 is Sunday too
        dow_ = std::bitset<7>(dow.to_ulong() & 0x7f);
        if (!next_after(time_point{}))
            refuse("'" + text_ + "' never matches a day of the calendar");
    }

    /// The expression as given ("" for one made from masks).
    const std::string& text() const noexcept { return text_; }

    /// The expression as bit masks, "m0:m1:hours:days:months:weekdays:any" (each below 2^32):
    /// minutes 0-29 and 30-59 (bit 0: minute 30), hours, days of the month (bit d: day d),
    /// months (bit m: month m), weekdays (bit 0: Sunday), and 1 | 2 when the day-of-month |
    /// weekday field began with '*'. What a store that computes the next run itself reads
    /// (detail/job_queue/repeat.hpp).
    std::string masks() const {
        const auto minutes = minute_.to_ullong();
        return std::to_string(minutes & 0x3fffffffULL) + ":" + std::to_string(minutes >> 30) + ":" +
               std::to_string(hour_.to_ullong()) + ":" + std::to_string(dom_.to_ullong()) + ":" +
               std::to_string(month_.to_ullong()) + ":" + std::to_string(dow_.to_ullong()) + ":" +
               std::to_string((dom_any_ ? 1 : 0) | (dow_any_ ? 2 : 0));
    }

    /// The expression that masks() wrote; nullopt for text that is not such masks, or masks that
    /// never match.
    static std::optional<cron> from_masks(std::string_view text) {
        unsigned long long v[7] = {};
        std::size_t n = 0;
        for (std::size_t i = 0; i <= text.size(); ++i) {
            if (i == text.size() || text[i] == ':') {
                if (++n > 7) return std::nullopt;
                continue;
            }
            if (n >= 7 || text[i] < '0' || text[i] > '9' || v[n] > (1ULL << 40))
                return std::nullopt;
            v[n] = v[n] * 10 + static_cast<unsigned>(text[i] - '0');
        }
        if (n != 7) return std::nullopt;
        cron c;
        c.minute_ = std::bitset<60>((v[0] & 0x3fffffffULL) | ((v[1] & 0x3fffffffULL) << 30));
        c.hour_ = std::bitset<24>(v[2]);
        c.dom_ = std::bitset<32>(v[3] & ~1ULL);
        c.month_ = std::bitset<13>(v[4] & ~1ULL);
        c.dow_ = std::bitset<7>(v[5]);
        c.dom_any_ = (v[6] & 1) != 0;
        c.dow_any_ = (v[6] & 2) != 0;
        if (!c.next_after(time_point{})) return std::nullopt;
        return c;
    }

    /// The first whole minute after `t` that matches; none within 8 years (only an expression that
    /// never matches, which the constructor refuses).
    std::optional<time_point> next_after(time_point t) const {
        using namespace std::chrono;
        // From the minute after t's minute.
        const auto from = floor<minutes>(t) + minutes(1);
        sys_days day = floor<days>(from);
        int hour = static_cast<int>(duration_cast<hours>(from - day).count());
        int minute = static_cast<int>(duration_cast<minutes>(from - day).count() % 60);
        for (int n = 0; n < 366 * 8; ++n, day += days(1), hour = 0, minute = 0) {
            if (!day_matches(day)) continue;
            for (int h = hour; h < 24; ++h) {
                if (!hour_[static_cast<std::size_t>(h)]) continue;
                for (int m = h == hour ? minute : 0; m < 60; ++m)
                    if (minute_[static_cast<std::size_t>(m)])
                        return time_point(day) + hours(h) + minutes(m);
            }
        }
        return std::nullopt;
    }

  private:
    cron() = default;

    [[noreturn]] static void refuse(const std::string& why) { throw std::invalid_argument(why); }

    bool day_matches(std::chrono::sys_days day) const {
        using namespace std::chrono;
        const year_month_day ymd(day);
        if (!month_[static_cast<unsigned>(ymd.month())]) return false;
        const bool dom = dom_[static_cast<unsigned>(ymd.day())];
        const bool dow = dow_[weekday(day).c_encoding()];
        if (dom_any_ || dow_any_) return dom && dow;  // one of them is '*': every day there
        return dom || dow;
    }

    // One field into `bits`: items separated by ',', each `*`, `n`, `a-b` or a name, with `/step`.
    template <std::size_t N>
    static void parse(std::string_view field, int lo, int hi,
                      std::span<const std::string_view> names, std::bitset<N>& bits,
                      const char* what) {
        const auto bad = [&](const std::string& why) {
            refuse("cron " + std::string(what) + " field '" + std::string(field) + "': " + why);
        };
        const auto value = [&](std::string_view s) {
            for (std::size_t i = 0; i < names.size(); ++i)
                if (s.size() == 3 && equal_upper(s, names[i])) return lo + static_cast<int>(i);
            if (s.empty() || s.size() > 2) bad("'" + std::string(s) + "' is not a number");
            int v = 0;
            for (char c : s) {
                if (c < '0' || c > '9') bad("'" + std::string(s) + "' is not a number");
                v = v * 10 + (c - '0');
            }
            if (v < lo || v > hi)
                bad(std::to_string(v) + " is outside " + std::to_string(lo) + "-" +
                    std::to_string(hi));
            return v;
        };
        std::size_t start = 0;
        while (true) {
            const std::size_t comma = field.find(',', start);
            std::string_view item = field.substr(start, comma - start);
            int step = 1;
            if (const auto slash = item.find('/'); slash != std::string_view::npos) {
                const std::string_view s = item.substr(slash + 1);
                step = 0;
                if (s.empty() || s.size() > 2) bad("the step '" + std::string(s) + "'");
                for (char c : s) {
                    if (c < '0' || c > '9') bad("the step '" + std::string(s) + "'");
                    step = step * 10 + (c - '0');
                }
                if (step == 0) bad("a step of 0");
                item = item.substr(0, slash);
            }
            int a = lo, b = hi;
            if (item.empty()) bad("an empty item");
            if (item != "*") {
                const auto dash = item.find('-');
                a = value(item.substr(0, dash));
                b = dash == std::string_view::npos ? (step > 1 ? hi : a)
                                                   : value(item.substr(dash + 1));
                if (b < a) bad("the range " + std::string(item) + " runs backwards");
            }
            for (int v = a; v <= b; v += step) bits.set(static_cast<std::size_t>(v));
            if (comma == std::string_view::npos) break;
            start = comma + 1;
        }
    }

    static bool equal_upper(std::string_view s, std::string_view upper) {
        for (std::size_t i = 0; i < s.size(); ++i) {
            const char c = s[i] >= 'a' && s[i] <= 'z' ? static_cast<char>(s[i] - 'a' + 'A') : s[i];
            if (c != upper[i]) return false;
        }
        return true;
    }

    std::string text_;
    std::bitset<60> minute_;
    std::bitset<24> hour_;
    std::bitset<32> dom_;
    std::bitset<13> month_;
    std::bitset<7> dow_;
    bool dom_any_ = false, dow_any_ = false;
};

}  // namespace delayq::detail
