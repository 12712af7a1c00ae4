// periodic: when a periodic task (schedule_every) runs next, after a run — the arithmetic of its
// grid, apart from the wheel that keeps it. Plain functions over a task's periodic_part
// (timer_node.hpp); the wheel calls them under its lock (wheel_core.hpp, repeat() and
// reschedule()), and they touch nothing else.
//
// The grid. With period P, first due at S, the k-th run is due at S + k * P (missed_tick.hpp says
// the same to users): computed from k each time, never summed, so a run that came late moves
// nothing after it. The task keeps S and k; what a late run does to the next is its policy's:
// burst moves k on by one (the missed runs follow back to back, in the same pass, one period
// apart), skip to the first k whose run lies after the late run (the missed ones are dropped, the
// grid is kept), and delay starts the grid again one period after the late run. A reschedule
// starts it again at its new deadline (restart_grid()).
//
// The end of time. Counts are 64-bit, and a grid must end at time_point::max() rather than wrap
// or stick: a run whose successor would lie past time_point::max() is the task's last
// (next_run() says nullopt), so that a task ends even at the end of time. Clamping, as the
// saturating helpers of time.hpp do for a deadline, would be wrong here: a next run clamped to
// time_point::max() is due again at every pass once the clock reads max, and a burst would run it
// forever within one pass. So the sums are made in 128 bits (wide_rep), where S + k * P fits for
// every k a grid can reach (even 2^64, the run after one late by the whole time line), and
// compared with the end before they are narrowed.
//
// Why apart. These are a few lines of arithmetic whose edges (a period of one tick, a run late by
// 2^64 periods, the last run before time_point::max()) are worth testing on their own
// (test_periodic.cpp); what stays in the core is when they are called, and what a reschedule
// during the run does instead (its run goes where the reschedule put it, not through the policy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "time.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

/// The grid of `every` starts again at `first` (a reschedule): the run now due is its 0-th.
template <class Clock>
constexpr void restart_grid(periodic_part<Clock>& every,
                            typename Clock::time_point first) noexcept {
    every.start = first;
    every.k = 0;
}

/// When a periodic task's next run is due, after a run that a pass started at `now`; nullopt
/// when it would lie past time_point::max() (that run was the last; `every` is then unchanged).
/// Moves the task's grid (k, or start for repeat_policy::delay). Only a burst gives a time <= now:
/// skip and delay always land after `now`.
template <class Clock>
constexpr std::optional<typename Clock::time_point> next_run(
    periodic_part<Clock>& every, typename Clock::time_point now) noexcept {
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    constexpr wide_rep end = time_point::max().time_since_epoch().count();
    const wide_rep p = every.period.count();
    const wide_rep s = every.start.time_since_epoch().count();
    const wide_rep t = now.time_since_epoch().count();
    // In 128 bits: k may be 2^64 (the run after one late by the whole time line), and
    // s + k * p still fits (p < 2^63).
    wide_rep k = static_cast<wide_rep>(every.k) + 1;
    switch (every.policy) {
        case repeat_policy::burst:
            break;
        case repeat_policy::skip: {
            if (t >= s) k = std::max(k, (t - s) / p + 1);
            break;
        }
        case repeat_policy::delay:
            if (t + p > end) return std::nullopt;
            every.start = time_point{duration{static_cast<typename duration::rep>(t + p)}};
            every.k = 0;
            return every.start;
    }
    const wide_rep next = s + k * p;
    if (next > end) return std::nullopt;
    every.k = static_cast<std::uint64_t>(k);  // < 2^64: k * p <= end - s < 2^64
    return time_point{duration{static_cast<typename duration::rep>(next)}};
}

}  // namespace delayq::detail
