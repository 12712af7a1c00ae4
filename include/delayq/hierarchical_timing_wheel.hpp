// hierarchical_timing_wheel<Clock>: Kafka's SystemTimer + TimingWheel; and
// hierarchical_wheel<Clock>, the same wheel with no thread, for an event loop to drive.
//
// The idea. Levels of `wheel_size` buckets, each level's tick the whole span of the level below,
// overflow levels created on demand; every non-empty bucket sits in a queue of buckets by expiry,
// which is what advances the wheel's clock, so empty ticks cost nothing. When a bucket expires, its
// tasks run if due, or fall to a finer level. The algorithm, with a worked picture, is at the top
// of detail/timing_wheel.hpp; it is one screen, thread-free, and not thread-safe.
//
// As in Kafka, locking lives in one place apart from the algorithm: the wheel_core of
// detail/wheel_core.hpp, the same as the hashed wheel's — one lock, schedule, cancel, and a pass
// that runs what is due in the heap's order (deadline, then first in, first out), each task
// cancellable until it starts. Both are basic_wheel (basic_wheel.hpp), with the hashed wheel's
// shape: hierarchical_timing_wheel's worker, started by the first schedule, drives it;
// hierarchical_wheel's user does, calling advance(now) when next_expiry() says.
//
// What is better than Kafka, and how:
// - never early: a task runs only once its own deadline has passed on Clock (Kafka runs a bucket
//   when its start is reached: up to one tick early); and, with `precise` (the default), at that
//   deadline plus the wake-up, not at its tick's boundary: the tick under way is kept in deadline
//   order (detail/near_window.hpp). precise = false runs a task at the grid point at or after it;
// - a late driver (or a clock that jumped) runs every due task in one pass, in deadline order,
//   paying one flush per task rather than one per level; a clock that steps back makes nothing
//   early and loses nothing;
// - cancel() unlinks the task and destroys it before returning; pending() is exact at once;
// - an idle wheel (nothing pending) has no bucket in the queue and its worker sleeps without a
//   deadline; out of memory is an exception from schedule() or reschedule(), never a failure
//   inside a pass (the levels and the queue's room are made when a task first needs them, and a
//   periodic task's for all its later runs when it is scheduled);
// - no malloc per schedule for a callable up to 216 bytes: 48 B per timer with an 8-byte capture.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>

#include "basic_wheel.hpp"
#include "detail/timing_wheel.hpp"

namespace delayq {

/// The options of hierarchical_timing_wheel and hierarchical_wheel (the same field names as
/// hashed_wheel_options).
template <class Clock = std::chrono::steady_clock>
struct hierarchical_wheel_options {
    using duration = typename Clock::duration;  ///< the clock's duration

    /// The finest level's tick (> 0): what one bucket spans, and so the cost of a pass.
    duration tick = std::chrono::duration_cast<duration>(std::chrono::milliseconds(1));
    std::size_t wheel_size = 20;  ///< buckets per level, in [2, 2^24]
    std::size_t max_pending = 0;  ///< schedule() beyond this many throws rejected_error; 0: none
    /// Called with what a task threw (on the thread that ran it); the wheel carries on.
    std::function<void(std::exception_ptr)> on_error;
    /// true: a task runs at its own deadline; false: at its tick's boundary (fewer wake-ups).
    bool precise = true;
    /// Threaded: the worker stops sleeping this long before a task's deadline and waits on the
    /// CPU, yielding it, for the rest: lateness without the OS's wake-up latency, for up to this
    /// much CPU per wake-up. 0 (the default): it sleeps until the deadline. >= 0.
    std::chrono::nanoseconds spin_before_deadline{0};
};

/// Kafka's hierarchical timing wheel with no thread of its own: advance(now) runs what is due on
/// its caller, when next_expiry() says (an event loop's timeout). See basic_wheel.
template <class Clock = std::chrono::steady_clock>
using hierarchical_wheel =
    basic_wheel<Clock, detail::timing_wheel<Clock>, hierarchical_wheel_options<Clock>, false>;

/// Kafka's SystemTimer and TimingWheel, and better (see the top of this header): a hierarchical
/// wheel and its worker thread. See basic_wheel.
template <class Clock = std::chrono::steady_clock>
using hierarchical_timing_wheel =
    basic_wheel<Clock, detail::timing_wheel<Clock>, hierarchical_wheel_options<Clock>, true>;

}  // namespace delayq
