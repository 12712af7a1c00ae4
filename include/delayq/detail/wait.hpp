// How every structure in delayq sleeps: through its Clock.
//
// A structure that waits for a deadline calls `detail::wait_until<Clock>(cv, lock, tp, stop)`. A
// clock whose time does not move by itself (manual_clock) provides a static
// `wait_until(cv, lock, tp, stop)` hook; it registers the waiter so that moving the clock wakes it.
//
// Which clocks are safe to hand to a condition variable. The standard library waits on
// steady_clock and system_clock as they are (libstdc++: pthread_cond_clockwait on CLOCK_MONOTONIC
// or CLOCK_REALTIME), for any deadline, time_point::max() included: those two are passed straight
// through, so a steady_clock user pays nothing here. Any other clock the library converts itself,
// by adding (deadline - Clock::now()) to steady_clock::now() in 64-bit counts, unchecked: on a
// clock whose epoch is later than steady_clock's (time since program start, say), a deadline near
// time_point::max() overflows that sum (UBSan reports it), and the wait returns at once, every
// time: a worker or a taker that spins at 100 % CPU. So for every other clock this header converts:
// the time left until `tp` in 128 bits, rounded up to steady_clock's unit and clamped, added to
// steady_clock::now() saturating (time.hpp); the condition variable then sees only steady_clock.
// A wait so converted ends when steady_clock says the time left has passed: if Clock runs slower
// or jumps, the caller finds its deadline not reached yet and waits again, as after any early
// return.
//
// Every wait here may return spuriously: callers re-check their state in a loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <type_traits>
#include <utility>

#include "time.hpp"

namespace delayq::detail {

// A predicate that is false once, then true: turns condition_variable_any's predicate waits (the
// only ones that take a stop_token) into "wait for one wake-up".
struct once {
    bool fired = false;
    bool operator()() noexcept { return std::exchange(fired, true); }
};

template <class Clock, class CV>
concept has_wait_hook = requires(CV& cv, std::unique_lock<std::mutex>& lk,
                                 typename Clock::time_point tp, std::stop_token st) {
    Clock::wait_until(cv, lk, tp, st);
};

/// Clocks the standard library's condition variables wait on without converting a deadline (see
/// the top of this header).
template <class Clock>
inline constexpr bool waits_natively = std::is_same_v<Clock, std::chrono::steady_clock> ||
                                       std::is_same_v<Clock, std::chrono::system_clock>;

// Wait for a notification on `cv`, or a stop request (condition_variable_any only).
template <class CV>
void wait(CV& cv, std::unique_lock<std::mutex>& lk, std::stop_token st = {}) {
    if constexpr (std::is_same_v<CV, std::condition_variable_any>) {
        cv.wait(lk, std::move(st), once{});
    } else {
        cv.wait(lk);
    }
}

// The condition variable's own timed wait, for a deadline on a clock it waits on natively.
template <class CV, class TimePoint>
void wait_natively(CV& cv, std::unique_lock<std::mutex>& lk, TimePoint tp, std::stop_token st) {
    if constexpr (std::is_same_v<CV, std::condition_variable_any>) {
        cv.wait_until(lk, std::move(st), tp, once{});
    } else {
        cv.wait_until(lk, tp);
    }
}

// Wait for a notification, a stop request, or until Clock reaches tp. A tp of time_point::max()
// means "no deadline": a waiter for it is woken only by a notification, even on a clock that can
// be set to time_point::max() (manual_clock).
template <class Clock, class CV>
void wait_until(CV& cv, std::unique_lock<std::mutex>& lk, typename Clock::time_point tp,
                std::stop_token st = {}) {
    if (tp == Clock::time_point::max()) {
        wait(cv, lk, std::move(st));
        return;
    }
    if constexpr (has_wait_hook<Clock, CV>) {
        Clock::wait_until(cv, lk, tp, std::move(st));
    } else if constexpr (waits_natively<Clock>) {
        wait_natively(cv, lk, tp, std::move(st));
    } else {
        using steady = std::chrono::steady_clock;
        const auto left = saturating_between<steady::duration>(Clock::now(), tp);
        wait_natively(cv, lk, saturating_add(steady::now(), left), std::move(st));
    }
}

// wait_until() for a real deadline, time_point::max() included: on a clock that can reach it
// (one with a wait hook, such as manual_clock) the waiter is woken when the clock gets there. A
// clock without a hook never reaches time_point::max(), so that is a wait without a deadline.
template <class Clock, class CV>
void wait_until_deadline(CV& cv, std::unique_lock<std::mutex>& lk, typename Clock::time_point tp,
                         std::stop_token st = {}) {
    if constexpr (has_wait_hook<Clock, CV>) {
        Clock::wait_until(cv, lk, tp, std::move(st));
    } else {
        wait_until<Clock>(cv, lk, tp, std::move(st));
    }
}

}  // namespace delayq::detail
