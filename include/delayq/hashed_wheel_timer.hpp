// hashed_wheel_timer<Clock>: Netty's HashedWheelTimer, without its known faults; and
// hashed_wheel<Clock>, the same timer with no thread, for an event loop to drive.
//
// The idea. Pending tasks sit in a ring of `wheel_size` buckets (detail/hashed_wheel_ring.hpp):
// a task due at d goes into the bucket of the first tick boundary at or after d, so inserting and
// cancelling are O(1) whatever the number pending, and expiring costs only the buckets whose time
// has come. A task's node (a 40-byte header and the callable, in one block from the timer's slab
// pool) is shared by the timer and the `timeout<Clock>` handle the caller gets.
//
// Both are basic_wheel (basic_wheel.hpp), the one shape of delayq's wheels: hashed_wheel<Clock> is
// driven by its user (advance(now) runs what is due on the calling thread, next_expiry() says when
// to call it next); hashed_wheel_timer<Clock> has a worker thread, started by the first schedule,
// that loops: run what is due, then sleep until next_expiry() — the next non-empty tick, not every
// tick, and with nothing pending no deadline at all (zero wake-ups). A schedule that makes the
// next expiry earlier wakes it.
//
// What is better than Netty, and how:
// - cancel() unlinks the node under the lock and destroys the task before it returns; pending()
//   and max_pending see it at once (Netty queues cancellations until the next tick); a task stays
//   cancellable until it starts, so cancel() == true always means it never runs;
// - idle: the worker sleeps until the earliest non-empty tick boundary, or indefinitely;
// - as precise as a heap (option `precise`, the default): a task runs at its own deadline, plus the
//   wake-up latency, not at its tick's boundary. The tick sets only the cost: when the clock enters
//   a tick, that tick's tasks are sorted once (detail/near_window.hpp) and the worker sleeps until
//   each distinct deadline. With precise = false tasks run at the tick boundary at or after their
//   deadline (fewer wake-ups: at most one per non-empty tick);
// - never early: a node comes out only when its deadline <= now;
// - tasks due together run in deadline order, first in, first out among equal deadlines (Netty
//   runs a bucket in insertion order, so a late tick runs them out of order);
// - deadlines saturate: schedule(f, duration::max()) is "never", past time points are due now and
//   run at the next pass, not a tick later; a clock that steps back makes nothing early;
// - a task that throws goes to on_error and the worker carries on;
// - tasks run outside the lock: a task may schedule, cancel, or stop() the timer (stop() from a
//   task does not join; the destructor, or a stop() on another thread, does);
// - no malloc per schedule for a callable up to 216 bytes (48 B per timer with an 8-byte capture),
//   move-only callables welcome; the task is moved into its node under the lock, so a task's move
//   constructor must not call back into the timer.
//
// The worker sets PR_SET_TIMERSLACK to 1 ns on Linux, so it wakes within microseconds of a
// deadline instead of up to 50 µs late.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>

#include "basic_wheel.hpp"
#include "detail/hashed_wheel_ring.hpp"

namespace delayq {

/// The options of hashed_wheel_timer and hashed_wheel (the same field names as
/// hierarchical_wheel_options).
template <class Clock = std::chrono::steady_clock>
struct hashed_wheel_options {
    using duration = typename Clock::duration;  ///< the clock's duration

    /// What one bucket spans (> 0): the cost of a pass, not its precision (see precise).
    duration tick = std::chrono::duration_cast<duration>(std::chrono::milliseconds(100));
    std::size_t wheel_size = 512;  ///< buckets, in [1, 2^30]; rounded up to a power of two
    std::size_t max_pending = 0;   ///< schedule() beyond this many throws rejected_error; 0: none
    /// Called with what a task threw (on the thread that ran it); the timer carries on.
    std::function<void(std::exception_ptr)> on_error;
    /// true: a task runs at its own deadline; false: at its tick's boundary (fewer wake-ups).
    bool precise = true;
    /// Threaded: the worker stops sleeping this long before a task's deadline and waits on the
    /// CPU, yielding it, for the rest: lateness without the OS's wake-up latency, for up to this
    /// much CPU per wake-up. 0 (the default): it sleeps until the deadline. >= 0.
    std::chrono::nanoseconds spin_before_deadline{0};
};

/// A hashed timing wheel with no thread of its own: advance(now) runs what is due on its caller,
/// when next_expiry() says (an event loop's timeout). See basic_wheel.
template <class Clock = std::chrono::steady_clock>
using hashed_wheel =
    basic_wheel<Clock, detail::hashed_wheel_ring<Clock>, hashed_wheel_options<Clock>, false>;

/// Netty's HashedWheelTimer, and better (see the top of this header): a hashed wheel and its
/// worker thread. See basic_wheel.
template <class Clock = std::chrono::steady_clock>
using hashed_wheel_timer =
    basic_wheel<Clock, detail::hashed_wheel_ring<Clock>, hashed_wheel_options<Clock>, true>;

}  // namespace delayq
