// basic_wheel<Clock, Ring, Options, Threaded>: the one public shape of both timing wheels.
//
// Users name it through four aliases, two per wheel:
//
//                      thread-free (you drive it)      threaded (a worker drives it)
//   hashed ring        hashed_wheel<Clock>             hashed_wheel_timer<Clock>
//   levels of rings    hierarchical_wheel<Clock>       hierarchical_timing_wheel<Clock>
//
// so that all four have the same members, the same options' field names and the same errors, by
// construction: schedule(), schedule_at(), schedule_every(), schedule_every_at(), next_expiry(),
// pending() and stop() everywhere; advance(now) on the thread-free wheels, which run their tasks
// on advance()'s caller (an event loop calls it when next_expiry() says); wakeups() on the
// threaded ones, whose worker thread starts with the first schedule and sleeps until
// next_expiry() (no deadline at all when nothing is pending: zero idle wake-ups).
//
// What the wheels share, and what makes them differ, lives below this header: the lock, schedule,
// cancel and the pass that runs what is due in the heap's order are detail/wheel_core.hpp; where
// nodes sit and which are due is the Ring (detail/hashed_wheel_ring.hpp, detail/timing_wheel.hpp);
// the worker is detail/wheel_driver.hpp. The guarantees each wheel adds to the system it comes
// from (Netty's HashedWheelTimer, Kafka's TimingWheel) are at the top of hashed_wheel_timer.hpp
// and hierarchical_timing_wheel.hpp.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/time.hpp"
#include "detail/wheel_core.hpp"
#include "detail/wheel_driver.hpp"
#include "missed_tick.hpp"
#include "timeout.hpp"

namespace delayq {

namespace detail {
// What the public layer gives wheel_core (which names no public header): its handle type, and
// how it refuses a schedule.
template <class Clock>
struct timeout_face {
    using handle = timeout<Clock>;
    [[noreturn]] static void refuse(const char* what) { throw rejected_error(what); }
};

// A thread-free wheel's driver is its user; spin_before_deadline is still checked, so that the
// same options are refused the same way by all four wheels.
struct no_driver {
    explicit no_driver(std::chrono::nanoseconds spin) { (void)valid_spin(spin); }
};
}  // namespace detail

/// A timing wheel: `Ring` says where tasks sit, `Options` (hashed_wheel_options or
/// hierarchical_wheel_options) what the constructor takes, `Threaded` whether a worker thread of
/// its own drives it. Thread-safe. Name it through its aliases (see the top of this header).
template <class Clock, class Ring, class Options, bool Threaded>
class basic_wheel {
    using core_type = detail::wheel_core<Clock, Ring, detail::timeout_face<Clock>>;

  public:
    using clock = Clock;                            ///< the clock it runs on
    using time_point = typename Clock::time_point;  ///< deadlines on that clock
    using duration = typename Clock::duration;      ///< delays on that clock
    using options = Options;                        ///< what the constructor takes

    /// Throws std::invalid_argument for a tick <= 0, a wheel_size out of the wheel's range, or
    /// a spin_before_deadline < 0. A threaded wheel's worker starts with the first schedule.
    explicit basic_wheel(options o = {})
        : driver_(o.spin_before_deadline),
          core_(new core_type(o.max_pending, std::move(o.on_error), o.precise, o.tick, o.wheel_size,
                              Clock::now())) {}
    basic_wheel(const basic_wheel&) = delete;
    basic_wheel& operator=(const basic_wheel&) = delete;

    /// Cancels what is pending (handles stay valid) and, threaded, joins the worker; from inside
    /// one of its tasks it lets the worker finish that task and exit by itself instead.
    ~basic_wheel() {
        core_->template shut<false>();
        if constexpr (Threaded) driver_.finish(true);
        core_->drop_owner();
    }

    /// Runs `task` (any void() callable, move-only included) once `delay` (saturating; <= 0: due
    /// now) has passed on Clock. O(1). Throws rejected_error after stop() or when max_pending tasks
    /// are pending (the task is then left untouched); std::bad_alloc, what moving the task throws,
    /// or (threaded) std::system_error if the worker cannot start: then nothing is scheduled.
    template <detail::task F, class Rep, class Period>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        return schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` once Clock reaches `deadline` (a past one: at the next pass). As schedule().
    template <detail::task F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        start();
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// Runs `task` every `period` (> 0, else std::invalid_argument), the first time one period
    /// from now: the k-th run is due at first + k * period, never drifting. `policy` says what a
    /// run that comes late does to the next one (missed_tick). The task never runs concurrently
    /// with itself; one that throws goes to on_error and the period goes on; cancel() ends the
    /// repeat, also from inside the task; reschedule() moves the next run and the grid with it;
    /// stop() hands it back unless it is running. No allocation per run. As schedule() otherwise.
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
        start();
        return core_->schedule_every(std::forward<F>(task), first,
                                     detail::saturating_ceil<duration>(period),
                                     static_cast<detail::repeat_policy>(policy));
    }

    /// Thread-free wheels: runs, on this thread, every task due at `now` (deadline <= now; with
    /// precise = false, also its tick boundary reached), in deadline order, first in, first out
    /// among equals; returns how many ran. A task that throws goes to on_error. From inside a task
    /// it returns 0; while another thread advances, it waits for that pass to end.
    std::size_t advance(time_point now = Clock::now()) requires(!Threaded) {
        return core_->advance(now);
    }

    /// When the next task is due (thread-free: when to call advance() next); nullopt when nothing
    /// is pending. A time in the past means now. Precise: the earliest deadline; else its tick
    /// boundary. May be early after a cancel (the hierarchical wheel: a bucket whose tasks were
    /// all cancelled), never late.
    std::optional<time_point> next_expiry() const { return core_->next_expiry(); }

    /// Tasks neither run nor cancelled.
    std::size_t pending() const { return core_->pending(); }

    /// Refuses further schedules, cancels every pending task and returns their handles (now
    /// cancelled(), their cancel() false), earliest deadline first (first in, first out among
    /// equals); the tasks are destroyed in that order too, before it returns. Threaded: joins the
    /// worker, unless called from one of its tasks. Idempotent: later calls return nothing.
    std::vector<timeout<Clock>> stop() {
        auto out = core_->template shut<true>();
        if constexpr (Threaded) driver_.finish(false);
        return out;
    }

    /// Threaded wheels: how many times the worker has woken up so far (for monitoring the idle
    /// behaviour: it does not wake while nothing is pending).
    std::size_t wakeups() const noexcept requires Threaded { return driver_.wakeups(); }

  private:
    void start() {
        if constexpr (Threaded) {
            if (!driver_.start(*core_)) throw rejected_error("delayq: timer is stopped");
        }
    }

    // The driver first: it checks the options before the core is allocated.
    [[no_unique_address]] std::conditional_t<Threaded, detail::wheel_driver<core_type, Clock>,
                                             detail::no_driver>
        driver_;
    core_type* core_;
};

}  // namespace delayq
