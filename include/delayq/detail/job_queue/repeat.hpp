// The schedule of a repeatable job (put_every, put_cron), as every store keeps it beside the job:
// one short ASCII text that each store decodes where it runs the step that queues the next run
// (SQLite in C++, Redis in Lua, PostgreSQL in SQL), so that the next run is made in the same
// atomic step as the ack, or the move to the dead letters, of the run before it.
//
//   e<period ms>                                     every period, in phase with the first run
//   c<m0>:<m1>:<hours>:<days>:<months>:<weekdays>:<any>
//                                                    a cron expression, as bit masks: minutes
//                                                    0-29 (m0) and 30-59 (m1, bit 0 = minute 30),
//                                                    hours 0-23, days of the month 1-31, months
//                                                    1-12, weekdays 0-6 (Sunday 0); `any`: 1 when
//                                                    the day-of-month field began with '*', 2 when
//                                                    the weekday field did (detail/cron.hpp)
//
// Every mask is below 2^32, so that a Lua number (a double) or an SQL bigint holds it exactly.
//
// The next run, given the store's time `now` (ms) and the run that ends (due at `due`):
// - every: the first due + k * period after now (k >= 1): a series whose consumers were down for
//   an hour makes one catch-up run (the one that was due), then goes on in phase, not sixty;
// - cron: the first whole minute after now that matches.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../cron.hpp"

namespace delayq::detail::job_queue {

/// A schedule text for put_every(period): "e<ms>". Pre: period > 0.
inline std::string every_text(std::chrono::milliseconds period) {
    return "e" + std::to_string(period.count());
}

/// A schedule text for put_cron(expression); std::invalid_argument for a bad expression.
inline std::string cron_text(std::string_view expression) {
    const cron c(expression);
    return "c" + c.masks();
}

/// The due time (ms since the epoch) of the run after one due at `due` (its slot: where the
/// schedule put it, not where a retry or a reschedule moved it), ended at `now`, for the
/// schedule `text`; nullopt for a text this version cannot read.
inline std::optional<long long> next_run(std::string_view text, long long due, long long now) {
    if (text.size() < 2) return std::nullopt;
    if (text[0] == 'e') {
        // At most 15 digits (31 000 years): the sums below stay far from overflow.
        if (text.size() > 16) return std::nullopt;
        long long period = 0;
        for (const char c : text.substr(1)) {
            if (c < '0' || c > '9') return std::nullopt;
            period = period * 10 + (c - '0');
        }
        if (period <= 0) return std::nullopt;
        if (due > now) return due + period;  // (a run acked before its time: the next in phase)
        return due + ((now - due) / period + 1) * period;
    }
    if (text[0] == 'c') {
        const auto c = cron::from_masks(text.substr(1));
        if (!c) return std::nullopt;
        using namespace std::chrono;
        const auto next = c->next_after(system_clock::time_point(milliseconds(now)));
        if (!next) return std::nullopt;
        return duration_cast<milliseconds>(next->time_since_epoch()).count();
    }
    return std::nullopt;
}

/// What a store that keeps a run's slot beside its schedule in one text holds: "<slot> <text>"
/// (the slot in ms since the epoch), as the Redis queue's r<id> field and the SQLite queue's
/// repeat column do.
inline std::string with_slot(long long slot, std::string_view text) {
    return std::to_string(slot) + " " + std::string(text);
}

/// A with_slot() text, parsed.
struct slotted {
    long long slot = 0;
    std::string_view text;
};

/// The slot and the schedule of a with_slot() text; nullopt for one that is not such a text.
inline std::optional<slotted> slot_of(std::string_view stored) {
    const auto space = stored.find(' ');
    if (space == 0 || space == std::string_view::npos || space > 19) return std::nullopt;
    slotted out;
    bool negative = stored[0] == '-';
    for (const char c : stored.substr(negative ? 1 : 0, space - (negative ? 1 : 0))) {
        if (c < '0' || c > '9') return std::nullopt;
        out.slot = out.slot * 10 + (c - '0');
    }
    if (negative) out.slot = -out.slot;
    out.text = stored.substr(space + 1);
    return out;
}

}  // namespace delayq::detail::job_queue
