// How every structure in delayq sleeps: through its Clock.
//
// A structure that waits for a deadline calls `detail::wait_until<Clock>(cv, lock, tp, stop)`. By
// default that is the condition variable's own timed wait, so a steady_clock user pays nothing. A
// clock whose time does not move by itself (manual_clock) provides a static
// `wait_until(cv, lock, tp, stop)` hook; it registers the waiter so that moving the clock wakes it.
//
// Every wait here may return spuriously: callers re-check their state in a loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <type_traits>
#include <utility>

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

// Wait for a notification on `cv`, or a stop request (condition_variable_any only).
template <class CV>
void wait(CV& cv, std::unique_lock<std::mutex>& lk, std::stop_token st = {}) {
    if constexpr (std::is_same_v<CV, std::condition_variable_any>) {
        cv.wait(lk, std::move(st), once{});
    } else {
        cv.wait(lk);
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
    } else if constexpr (std::is_same_v<CV, std::condition_variable_any>) {
        cv.wait_until(lk, std::move(st), tp, once{});
    } else {
        cv.wait_until(lk, tp);
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
