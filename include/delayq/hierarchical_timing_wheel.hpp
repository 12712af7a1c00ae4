// hierarchical_timing_wheel<Clock>: Kafka's SystemTimer + TimingWheel, driven by delayq's own
// delay_queue.
//
// The idea. Levels of `wheel_size` buckets, each level's tick the whole span of the level below,
// overflow levels created on demand; every non-empty bucket sits in a delay_queue of buckets, which
// is what advances the wheel's clock, so empty ticks cost nothing. When a bucket expires, its tasks
// run if due, or fall to a finer level. The algorithm, with a worked picture, is at the top of
// detail/timing_wheel.hpp; it is one screen, thread-free, and not thread-safe.
//
// As in Kafka, locking lives in one place apart from the algorithm: the wheel_core of
// detail/wheel_core.hpp, the same as the hashed wheel's — one lock, schedule, cancel, and a pass
// that runs what is due in the heap's order (deadline, then first in, first out), each task
// cancellable until it starts. With own_thread (the default) the worker of detail/wheel_driver.hpp
// drives it, started by the first schedule; with own_thread = false the caller does, with
// advance_clock(max_wait) or advance(now), when next_expiry() says.
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
//   deadline; out of memory is an exception from schedule(), never a failure inside a pass (the
//   levels and the queue's room are made when a task first needs them);
// - no malloc per schedule for a callable up to 216 bytes: 48 B per timer with an 8-byte capture.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/time.hpp"
#include "detail/timing_wheel.hpp"
#include "detail/wheel_core.hpp"
#include "detail/wheel_driver.hpp"
#include "timeout.hpp"

namespace delayq {

/// Options of hierarchical_timing_wheel<Clock> (also reachable as
/// hierarchical_timing_wheel<Clock>::options).
template <class Clock = std::chrono::steady_clock>
struct hierarchical_timing_wheel_options {
    using duration = typename Clock::duration;  ///< the clock's duration

    /// The finest level's tick (> 0): what one bucket spans, and so the cost of a pass.
    duration tick = std::chrono::duration_cast<duration>(std::chrono::milliseconds(1));
    std::size_t wheel_size = 20;  ///< buckets per level, in [2, 2^24]
    std::size_t max_pending =
        0;  ///< schedule() beyond this many throws rejected_error; 0: no limit
    /// Called with what a task threw (on the thread that ran it); the wheel carries on.
    std::function<void(std::exception_ptr)> on_error;
    bool own_thread = true;  ///< false: no worker; the caller drives advance_clock() or advance()
    /// true: a task runs at its own deadline; false: at its tick's boundary (fewer wake-ups).
    bool precise = true;
    /// The worker (or advance_clock()) stops sleeping this long before a task's deadline and
    /// waits on the CPU, yielding it, for the rest: lateness without the OS's wake-up latency, for
    /// up to this much CPU per wake-up. 0 (the default): it sleeps until the deadline. >= 0.
    std::chrono::nanoseconds spin_before_deadline{0};
};

/// Kafka's hierarchical timing wheel (see the top of this header). Thread-safe.
template <class Clock = std::chrono::steady_clock>
class hierarchical_timing_wheel {
    using core_type = detail::wheel_core<Clock, detail::timing_wheel<Clock>>;

  public:
    using clock = Clock;                                       ///< the clock it runs on
    using time_point = typename Clock::time_point;             ///< deadlines on that clock
    using duration = typename Clock::duration;                 ///< delays on that clock
    using options = hierarchical_timing_wheel_options<Clock>;  ///< what the constructor takes

    /// Throws std::invalid_argument for a tick <= 0 or a wheel_size outside [2, 2^24]. With
    /// own_thread, the worker starts with the first schedule.
    explicit hierarchical_timing_wheel(options o = {})
        : core_(new core_type(o.max_pending, std::move(o.on_error), o.precise,
                              o.spin_before_deadline, o.tick, o.wheel_size, Clock::now())),
          own_thread_(o.own_thread) {}

    hierarchical_timing_wheel(const hierarchical_timing_wheel&) = delete;
    hierarchical_timing_wheel& operator=(const hierarchical_timing_wheel&) = delete;

    /// Stops (pending tasks are cancelled) and joins the worker, unless destroyed from one of its
    /// own tasks: then the worker finishes that task and exits by itself.
    ~hierarchical_timing_wheel() {
        core_->template shut<false>();
        driver_.finish(*core_, true);
        core_->drop_owner();
    }

    /// Runs `task` (any void() callable, move-only included) once `delay` (saturating; <= 0: due
    /// now) has passed on Clock. Throws rejected_error after stop() or at max_pending (the task
    /// is then left untouched); std::bad_alloc or what moving the task throws (then nothing is
    /// scheduled).
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        if (own_thread_) driver_.start(*core_);
        return core_->schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` once Clock reaches `deadline` (a past deadline: at the next pass). As
    /// schedule().
    template <detail::task F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        if (own_thread_) driver_.start(*core_);
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// As hashed_wheel::schedule_every(): every `period` (> 0, else std::invalid_argument), the
    /// k-th run due at first + k * period, `policy` for late runs (missed_tick), cancel() ends the
    /// repeat, no allocation per run. As schedule() otherwise.
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
        if (own_thread_) driver_.start(*core_);
        return core_->schedule_every(std::forward<F>(task), first,
                                     detail::saturating_ceil<duration>(period), policy);
    }

    /// Waits up to `max_wait` for a bucket to come due, then empties every due bucket and runs the
    /// tasks that are due, on the calling thread, in deadline order. True if a bucket was
    /// processed. Returns false at once from inside a task or after stop(); with own_thread the
    /// worker is normally the one advancing, and a caller waits its turn.
    template <class Rep, class Period>
    bool advance_clock(std::chrono::duration<Rep, Period> max_wait) {
        core_->add_owner();  // a task on another driver may destroy this timer while we wait
        struct release {
            core_type* c;
            ~release() { c->drop_owner(); }
        } guard{core_};
        if (core_->advancing_here()) return false;
        if (!core_->wait_for_work(detail::deadline_after<Clock>(max_wait))) return false;
        const auto p = core_->advance(Clock::now());
        return p.worked || p.ran != 0;
    }

    /// Runs, on the calling thread, every task due at `now`, in deadline order, without waiting;
    /// returns how many ran (as hashed_wheel::advance).
    std::size_t advance(time_point now = Clock::now()) { return core_->advance(now).ran; }

    /// Tasks neither run nor cancelled (due ones included).
    std::size_t pending() const { return core_->pending(); }
    /// The same as pending(), kept for existing users.
    std::size_t size() const { return core_->pending(); }

    /// When advance_clock() will next have a bucket to process (a time in the past: now), for an
    /// event loop's poll timeout with own_thread = false; nullopt when nothing is pending. It may
    /// be early (a bucket whose tasks were all cancelled), never late.
    std::optional<time_point> next_expiry() const { return core_->next_expiry(); }

    /// Refuses further schedules, cancels every pending task and returns their handles (now
    /// cancelled(), their cancel() false), earliest deadline first (first in, first out among
    /// equals); the tasks are destroyed in that order too, before it returns. Joins the worker
    /// unless called from one of its tasks. Idempotent: later calls return nothing.
    std::vector<timeout<Clock>> stop() {
        auto out = core_->template shut<true>();
        driver_.finish(*core_, false);
        return out;
    }

    /// How many times a driver has woken up so far (for monitoring the idle behaviour).
    std::size_t wakeups() const noexcept { return core_->wakeups(); }

    // ---- introspection, for tests and diagnostics ----

    /// Number of wheel levels created so far (1 + overflow levels).
    std::size_t levels() const {
        return core_->with_ring([](const auto& r) { return r.level_count(); });
    }
    /// The wheel's level-0 current time (it follows the clock at each pass).
    time_point current_time() const {
        return core_->with_ring([](const auto& r) { return r.current_time(); });
    }
    /// How many drivers (the worker, advance_clock() callers) are asleep waiting for work now.
    std::size_t drivers_asleep() const { return core_->drivers_asleep(); }
    /// The level a pending task sits at, or -1 when it is due, overdue or no longer pending.
    int level_of(const timeout<Clock>& t) const {
        if (!t.pending()) return -1;
        return core_->with_ring([&](const auto& r) { return r.level_of(t.deadline()); });
    }

  private:
    core_type* core_;
    detail::wheel_driver<core_type, Clock> driver_;
    bool own_thread_;
};

}  // namespace delayq
