// wheel_driver<Core, Clock>: the worker thread of a threaded wheel (hashed_wheel_timer,
// hierarchical_timing_wheel), and everything about threads the wheels have: the worker's sleep
// and spin, its identity, its timer slack, its start and its join. The core (wheel_core.hpp) is
// the algorithm; this is the loop "sleep until the next expiry, run what is due" around it, as
// Kafka's SystemTimer's reaper is around its TimingWheel.
//
// Sleeping. The worker looks at the core and arms it (wheel_core::look) while it holds its own
// mutex, and keeps that mutex until it waits; the core's waker (worker::wake) takes the same mutex.
// So a schedule that makes the next expiry earlier either comes before the look (the worker sees
// it) or wakes the worker asleep. With nothing pending it sleeps without a deadline: an idle timer
// never wakes. With spin_before_deadline = s, the worker sleeps until d - s only, then waits on the
// CPU (yielding it) until d: the OS's wake-up latency (tens to hundreds of µs on a VM) is then paid
// before the deadline instead of after it, for at most s of CPU per wake-up. A wake-up ends the
// spin as it ends a sleep; a spin that lasts 2 s of real time without the deadline coming (a clock
// that does not move by itself, such as manual_clock) sleeps instead.
//
// Lifetime. The worker holds the core as an owner and shares its own state (worker) with the
// core's waker slot and the timer: a timer destroyed by one of its tasks detaches the worker,
// which finishes that task and exits on its own, touching nothing of the timer.
//
// Join policy. stop() from another thread joins the worker. stop() from a task (on the worker)
// cannot: it returns at once, and the worker ends by itself after that task. The destructor from a
// task detaches the worker instead of joining it. Whether the caller is the worker is decided
// before anything is locked: a task that stops the timer while another thread is inside stop(),
// joining, must not wait for that thread's lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "wait.hpp"
#include "wheel_core.hpp"

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace delayq::detail {

/// Lets the calling thread wake within microseconds of a deadline instead of up to 50 µs late (the
/// default timer slack on Linux); nothing elsewhere.
inline void reduce_timer_slack() noexcept {
#if defined(__linux__) && defined(PR_SET_TIMERSLACK)
    (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}

/// spin_before_deadline, checked: std::invalid_argument if negative.
inline std::chrono::nanoseconds valid_spin(std::chrono::nanoseconds s) {
    if (s < std::chrono::nanoseconds::zero())
        throw std::invalid_argument("delayq: spin_before_deadline must be >= 0");
    return s;
}

template <class Core, class Clock>
class wheel_driver {
    using time_point = typename Clock::time_point;

  public:
    /// `spin`: spin_before_deadline (see the top of this header). Throws std::invalid_argument if
    /// negative.
    explicit wheel_driver(std::chrono::nanoseconds spin) : spin_(valid_spin(spin)) {}
    wheel_driver(const wheel_driver&) = delete;
    wheel_driver& operator=(const wheel_driver&) = delete;

    /// Starts the worker unless it runs already. False once the core is stopped (no worker);
    /// throws what starting a thread throws (std::system_error; then no worker runs).
    bool start(Core& core) {
        if (started_.load(std::memory_order_acquire)) return true;
        std::lock_guard lk(m_);
        if (started_.load(std::memory_order_relaxed)) return true;
        auto w = std::make_shared<worker>();
        if (!core.set_waker(w)) return false;
        core.add_owner();  // the worker's
        try {
            thread_ = std::thread([c = &core, w, spin = spin_] {
                w->id.store(std::this_thread::get_id(), std::memory_order_release);
                reduce_timer_slack();
                while (wait_for_work(*c, *w, spin)) c->advance(Clock::now());
                c->drop_owner();
            });
        } catch (...) {
            (void)core.set_waker(nullptr);
            core.drop_owner();
            throw;
        }
        state_ = std::move(w);
        started_.store(true, std::memory_order_release);
        return true;
    }

    /// After core.shut(): joins the worker; on the worker itself, only detaches it when the
    /// timer is being destroyed (`destroying`).
    void finish(bool destroying) {
        if (on_worker()) {
            if (destroying) {
                std::lock_guard lk(m_);
                if (thread_.joinable()) thread_.detach();
            }
            return;
        }
        std::lock_guard lk(m_);
        if (thread_.joinable()) thread_.join();
    }

    /// How many times the worker has woken up so far.
    std::size_t wakeups() const noexcept {
        if (!started_.load(std::memory_order_acquire)) return 0;
        return state_->wakeups.load(std::memory_order_relaxed);
    }

  private:
    // What the worker thread and the core's waker slot share; outlives the timer when a task
    // destroyed it.
    struct worker final : wheel_waker {
        std::mutex m;  // held by the worker from its look at the core until it waits
        std::condition_variable cv;
        std::atomic<std::size_t> wake_count{0};  // wake() calls: ends a spin
        std::atomic<std::size_t> wakeups{0};
        std::atomic<std::thread::id> id{};

        void wake() noexcept override {
            wake_count.fetch_add(1, std::memory_order_release);  // ends a spin (spin_until())
            std::lock_guard lk(m);
            cv.notify_all();
        }
    };

    bool on_worker() const noexcept {
        return started_.load(std::memory_order_acquire) &&
               state_->id.load(std::memory_order_acquire) == std::this_thread::get_id();
    }

    // Waits until the core has something due, a schedule makes the next expiry earlier, or stop.
    // False once stopped.
    static bool wait_for_work(Core& core, worker& w, std::chrono::nanoseconds spin) {
        std::unique_lock sl(w.m);  // held from the look to the wait: see worker::wake()
        bool may_spin = spin > std::chrono::nanoseconds::zero();
        for (;;) {
            bool due = false;
            bool deadline = false;  // false: sleep until woken
            bool spinning = false;  // now is within `spin` of a task's deadline
            time_point until{};
            std::size_t seen = 0;
            const bool running = core.look(
                [&](std::optional<time_point> next, bool runs_a_task) -> std::optional<time_point> {
                    const time_point now = Clock::now();
                    if (next && *next <= now) {
                        due = true;
                        return std::nullopt;
                    }
                    deadline = next.has_value();
                    until = next ? *next : time_point::max();
                    if (may_spin && next && runs_a_task) {
                        const time_point early = spin_start(until, spin);
                        if (early <= now) {
                            spinning = true;  // a schedule before `until` must end the spin
                            seen = w.wake_count.load(std::memory_order_acquire);
                        } else {
                            until = early;  // sleep until then, and spin the rest
                        }
                    }
                    return until;
                });
            if (!running) return false;
            if (due) return true;
            if (spinning) {
                sl.unlock();  // a spinner holds nothing: wake() must not wait for it
                if (!spin_until(until, seen, w)) may_spin = false;  // the clock did not get there
                sl.lock();
                core.disarm();
                continue;
            }
            if (deadline) {
                detail::wait_until_deadline<Clock>(w.cv, sl, until);
            } else {
                detail::wait(w.cv, sl);  // nothing pending: no deadline, no wake-up
            }
            core.disarm();
            w.wakeups.fetch_add(1, std::memory_order_relaxed);
        }
    }

    // When a worker waiting for deadline d starts to spin: d - spin (spin in Clock's unit rounded
    // up, saturating).
    static time_point spin_start(time_point d, std::chrono::nanoseconds spin) noexcept {
        return saturating_add(d, -saturating_ceil<typename Clock::duration>(spin));
    }

    // Spins, yielding the CPU, until Clock reaches `until` or wake_count moves on from `seen`
    // (read under the core's lock, so that no wake-up after the look is missed): true; or for 2 s
    // of real time without either (false: the clock does not move by itself).
    static bool spin_until(time_point until, std::size_t seen, const worker& w) noexcept {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        for (unsigned i = 0;; ++i) {
            if (Clock::now() >= until || w.wake_count.load(std::memory_order_acquire) != seen)
                return true;
            if ((i & 1023) == 1023 && std::chrono::steady_clock::now() >= give_up) return false;
            std::this_thread::yield();
        }
    }

    const std::chrono::nanoseconds spin_;
    std::mutex m_;                   // start and join, one at a time
    std::thread thread_;             // written by start() under m_
    std::shared_ptr<worker> state_;  // written by start() before started_
    std::atomic<bool> started_{false};
};

}  // namespace delayq::detail
