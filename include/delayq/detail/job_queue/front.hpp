// The front of every job queue: the checks of a call's arguments and of a queue's options, made
// before anything reaches the store, with one rule and one message for every backend. A queue
// type holds one `front` that names it ("delayq::sqlite::delay_queue"), so that its messages say
// whose call was refused: `front.id(id)` before every call that names a job, `front.not_negative(d,
// "a lease")` for a duration a call must not get negative, `front.option(ok, "options.lease must be
// > 0")` for each option, `front.limits(options.limits)` for the limits, `front::take_count(n)` for
// the jobs a take_many() may lease. The rules are public (delayq/job.hpp): max_id_size,
// max_take_many.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../../job.hpp"
#include "../epoch_ms.hpp"
#include "repeat.hpp"

namespace delayq::detail::job_queue {

class front {
  public:
    /// A front whose messages begin with `who`, a string that outlives it (a literal).
    explicit constexpr front(std::string_view who) noexcept : who_(who) {}

    /// Throws std::invalid_argument unless `id` is a job id: not empty, at most max_id_size bytes.
    void id(std::string_view id) const {
        if (id.empty()) refuse("a job id must not be empty");
        if (id.size() > max_id_size)
            refuse("a job id must be at most " + std::to_string(max_id_size) +
                   " bytes (this one has " + std::to_string(id.size()) + ")");
    }

    /// Throws std::invalid_argument unless `d` (a lease, delay or age given to a call) is >= 0:
    /// "`what` must not be negative".
    void not_negative(std::chrono::milliseconds d, std::string_view what) const {
        if (d < std::chrono::milliseconds::zero())
            refuse(std::string(what) + " must not be negative");
    }

    /// Throws std::invalid_argument saying `what` (an option's rule) unless `ok`.
    void option(bool ok, std::string_view what) const {
        if (!ok) refuse(what);
    }

    /// Throws std::invalid_argument unless `l` (options.limits) is a set of limits: a rate has a
    /// period > 0, and a period has a rate.
    void limits(const job_limits& l) const {
        option(l.period >= std::chrono::milliseconds::zero(),
               "options.limits.period must not be negative");
        option(l.rate == 0 || l.period > std::chrono::milliseconds::zero(),
               "options.limits.period must be > 0 when options.limits.rate is set");
        option(l.rate > 0 || l.period == std::chrono::milliseconds::zero(),
               "options.limits.rate must be > 0 when options.limits.period is set");
    }

    /// The schedule text of put_every(..., period) (repeat.hpp): a period beyond delayq's end of
    /// time (max_ms) is that long. Throws std::invalid_argument unless period > 0.
    std::string every(std::chrono::milliseconds period) const {
        if (period <= std::chrono::milliseconds::zero()) refuse("a period must be > 0");
        return every_text(std::min(period, std::chrono::milliseconds(max_ms)));
    }

    /// The schedule text of put_cron(..., expression) (repeat.hpp). Throws std::invalid_argument
    /// saying what is wrong with the expression, or that it never matches.
    std::string cron(std::string_view expression) const {
        try {
            return cron_text(expression);
        } catch (const std::invalid_argument& e) {
            refuse(e.what());
        }
    }

    /// Throws std::invalid_argument saying `what`, after the queue type's name.
    [[noreturn]] void refuse(std::string_view what) const {
        std::string m(who_);
        m.append(": ").append(what);
        throw std::invalid_argument(m);
    }

    /// The jobs a take_many(asked, ...) leases at most: asked, up to max_take_many.
    static constexpr std::size_t take_count(std::size_t asked) noexcept {
        return std::min(asked, max_take_many);
    }

  private:
    std::string_view who_;
};

}  // namespace delayq::detail::job_queue
