// hashed_wheel_timer<Clock>: Netty's HashedWheelTimer, without its known faults; and
// hashed_wheel<Clock>, the same timer with no thread, for an event loop to drive.
//
// The idea. Pending tasks sit in a ring of `ticks_per_wheel` buckets (detail/hashed_wheel.hpp):
// a task due at d goes into the bucket of the first tick boundary at or after d, so inserting and
// cancelling are O(1) whatever the number pending, and expiring costs only the buckets whose time
// has come. A task's node (a 40-byte header and the callable, in one block from the timer's slab
// pool) is shared by the timer and the `timeout<Clock>` handle the caller gets.
//
// The ring sits in a wheel_core (detail/wheel_core.hpp), the same as the hierarchical wheel's: one
// lock, schedule, cancel, and a pass that runs what is due in the heap's order. hashed_wheel<Clock>
// is the core driven by its user: advance(now) runs what is due on the calling thread, and
// next_expiry() says when to call it next. hashed_wheel_timer<Clock> adds the worker thread of
// detail/wheel_driver.hpp, started by the first schedule, that loops: run what is due, then sleep
// until next_expiry() — the next non-empty tick, not every tick, and with nothing pending no
// deadline at all (zero wake-ups). A schedule that makes the next expiry earlier wakes it.
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
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/hashed_wheel.hpp"
#include "detail/time.hpp"
#include "detail/wheel_core.hpp"
#include "detail/wheel_driver.hpp"
#include "timeout.hpp"

namespace delayq {

/// The options of hashed_wheel_timer and hashed_wheel.
template <class Clock = std::chrono::steady_clock>
struct hashed_wheel_options {
    using duration = typename Clock::duration;  ///< the clock's duration

    /// What one bucket spans (> 0): the cost of a pass, not its precision (see precise).
    duration tick = std::chrono::duration_cast<duration>(std::chrono::milliseconds(100));
    std::size_t ticks_per_wheel = 512;  ///< buckets, in [1, 2^30]; rounded up to a power of two
    std::size_t max_pending =
        0;  ///< schedule() beyond this many throws rejected_error; 0: no limit
    /// Called with what a task threw (on the thread that ran it); the timer carries on.
    std::function<void(std::exception_ptr)> on_error;
    /// true: a task runs at its own deadline; false: at its tick's boundary (fewer wake-ups).
    bool precise = true;
    /// The worker (or advance_clock()) stops sleeping this long before a task's deadline and
    /// waits on the CPU, yielding it, for the rest: lateness without the OS's wake-up latency, for
    /// up to this much CPU per wake-up. 0 (the default): it sleeps until the deadline. >= 0.
    std::chrono::nanoseconds spin_before_deadline{0};
};

namespace detail {

template <class Clock>
using hashed_core = wheel_core<Clock, hashed_wheel_ring<Clock>>;

template <class Clock>
hashed_core<Clock>* make_hashed_core(hashed_wheel_options<Clock>&& o) {
    return new hashed_core<Clock>(o.max_pending, std::move(o.on_error), o.precise,
                                  o.spin_before_deadline, o.tick, o.ticks_per_wheel, Clock::now());
}

}  // namespace detail

/// A hashed timing wheel with no thread of its own: the caller runs what is due with advance(),
/// when next_expiry() says (an event loop's timeout). Thread-safe; tasks run on advance()'s
/// caller. See the top of this header.
template <class Clock = std::chrono::steady_clock>
class hashed_wheel {
  public:
    using clock = Clock;                            ///< the clock it runs on
    using time_point = typename Clock::time_point;  ///< deadlines on that clock
    using duration = typename Clock::duration;      ///< delays on that clock
    using options = hashed_wheel_options<Clock>;    ///< what the constructor takes

    /// Throws std::invalid_argument for a tick <= 0 or ticks_per_wheel outside [1, 2^30].
    explicit hashed_wheel(options o = {}) : core_(detail::make_hashed_core(std::move(o))) {}
    hashed_wheel(const hashed_wheel&) = delete;
    hashed_wheel& operator=(const hashed_wheel&) = delete;

    /// Cancels what is pending; handles stay valid.
    ~hashed_wheel() {
        core_->template shut<false>();
        core_->drop_owner();
    }

    /// Runs `task` once `delay` (saturating; <= 0: due now) has passed on Clock. O(1). Throws
    /// rejected_error after stop() or when max_pending tasks are pending (the task is then left
    /// untouched); std::bad_alloc or what moving the task throws (then nothing is scheduled).
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        return core_->schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` once Clock reaches `deadline` (a past one: at the next advance()). As
    /// schedule().
    template <detail::task F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// Runs `task` every `period` (> 0, else std::invalid_argument), the first time one period
    /// from now: the k-th run is due at first + k * period, never drifting. `policy` says what a
    /// run that comes late does to the next one (missed_tick: skip, the default, drops the missed
    /// runs and keeps the grid; burst runs them all at once; delay moves the grid). The task never
    /// runs concurrently with itself; one that throws goes to on_error and the period goes on;
    /// cancel() ends the repeat, also from inside the task; reschedule() moves the next run and
    /// the grid with it; stop() hands it back unless it is running. No allocation per run. As
    /// schedule() otherwise.
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule_every(F&& task, std::chrono::duration<Rep, Period> period,
                                  missed_tick policy = missed_tick::skip) {
        return schedule_every_at(std::forward<F>(task), detail::deadline_after<Clock>(period),
                                 period, policy);
    }

    /// schedule_every(), the first run due at `first`.
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule_every_at(F&& task, time_point first,
                                     std::chrono::duration<Rep, Period> period,
                                     missed_tick policy = missed_tick::skip) {
        return core_->schedule_every(std::forward<F>(task), first,
                                     detail::saturating_ceil<duration>(period), policy);
    }

    /// Runs, on this thread, every task due at `now` (deadline <= now; with precise = false, also
    /// its tick boundary reached), in deadline order; returns how many ran. A task that throws goes
    /// to on_error. From inside a task it returns 0; while another thread advances, it waits for
    /// that pass to end.
    std::size_t advance(time_point now = Clock::now()) { return core_->advance(now).ran; }

    /// When advance() will next have something to run; nullopt when nothing is pending. A time
    /// in the past means now. Precise: the earliest deadline (earlier after a cancel, never later);
    /// else its tick boundary.
    std::optional<time_point> next_expiry() const { return core_->next_expiry(); }

    /// Tasks neither run nor cancelled.
    std::size_t pending() const { return core_->pending(); }

    /// Refuses further schedules, cancels every pending task and returns their handles (now
    /// cancelled(), their cancel() false), earliest deadline first (first in, first out among
    /// equals); the tasks are destroyed in that order too, before it returns. Idempotent: later
    /// calls return nothing.
    std::vector<timeout<Clock>> stop() { return core_->template shut<true>(); }

  private:
    detail::hashed_core<Clock>* core_;
};

/// Netty's HashedWheelTimer, and better: see the top of this header and README.md.
template <class Clock = std::chrono::steady_clock>
class hashed_wheel_timer {
  public:
    using clock = Clock;                            ///< the clock it runs on
    using time_point = typename Clock::time_point;  ///< deadlines on that clock
    using duration = typename Clock::duration;      ///< delays on that clock
    using options = hashed_wheel_options<Clock>;    ///< what the constructor takes

    /// Throws std::invalid_argument for a tick <= 0 or ticks_per_wheel outside [1, 2^30]. The
    /// worker thread starts with the first schedule.
    explicit hashed_wheel_timer(options o = {}) : core_(detail::make_hashed_core(std::move(o))) {}
    hashed_wheel_timer(const hashed_wheel_timer&) = delete;
    hashed_wheel_timer& operator=(const hashed_wheel_timer&) = delete;

    /// Stops (pending tasks are cancelled) and joins the worker; from inside a task, lets the
    /// worker finish by itself instead.
    ~hashed_wheel_timer() {
        core_->template shut<false>();
        driver_.finish(*core_, true);
        core_->drop_owner();
    }

    /// Runs `task` on the worker once `delay` (saturating; <= 0: due now) has passed on Clock.
    /// O(1). Throws rejected_error after stop() or when max_pending tasks are pending (the task is
    /// then left untouched); std::bad_alloc, what moving the task throws, or std::system_error if
    /// the worker cannot start (then nothing is scheduled).
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        driver_.start(*core_);
        return core_->schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` on the worker once Clock reaches `deadline` (a past one: at once). As
    /// schedule().
    template <detail::task F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        driver_.start(*core_);
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// As hashed_wheel::schedule_every(): every `period`, first one period from now, `policy` for
    /// late runs; the tasks run on the worker. As schedule() otherwise.
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule_every(F&& task, std::chrono::duration<Rep, Period> period,
                                  missed_tick policy = missed_tick::skip) {
        return schedule_every_at(std::forward<F>(task), detail::deadline_after<Clock>(period),
                                 period, policy);
    }

    /// schedule_every(), the first run due at `first`.
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule_every_at(F&& task, time_point first,
                                     std::chrono::duration<Rep, Period> period,
                                     missed_tick policy = missed_tick::skip) {
        driver_.start(*core_);
        return core_->schedule_every(std::forward<F>(task), first,
                                     detail::saturating_ceil<duration>(period), policy);
    }

    /// Tasks neither run nor cancelled.
    std::size_t pending() const { return core_->pending(); }

    /// When the worker will next have something to run; nullopt when nothing is pending.
    std::optional<time_point> next_expiry() const { return core_->next_expiry(); }

    /// Refuses further schedules, cancels every pending task and returns their handles (now
    /// cancelled(), their cancel() false), earliest deadline first (first in, first out among
    /// equals); the tasks are destroyed in that order too, before it returns. Joins the worker,
    /// unless called from a task. Idempotent: later calls return an empty vector.
    std::vector<timeout<Clock>> stop() {
        auto out = core_->template shut<true>();
        driver_.finish(*core_, false);
        return out;
    }

    /// How many times the worker has woken up so far (for monitoring the idle behaviour).
    std::size_t wakeups() const noexcept { return core_->wakeups(); }

  private:
    detail::hashed_core<Clock>* core_;
    detail::wheel_driver<detail::hashed_core<Clock>, Clock> driver_;
};

}  // namespace delayq
