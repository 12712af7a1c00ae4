// hashed_wheel_timer<Clock>: Netty's HashedWheelTimer, without its known faults; and
// hashed_wheel<Clock>, the same timer with no thread, for an event loop to drive.
//
// The idea. Pending tasks sit in a ring of `ticks_per_wheel` buckets (detail/hashed_wheel.hpp):
// a task due at d goes into the bucket of the first tick boundary at or after d, so inserting and
// cancelling are O(1) whatever the number pending, and expiring costs only the buckets whose time
// has come. One allocation per task holds the node header and the callable (detail/timer_node.hpp);
// the caller gets a `timeout<Clock>` handle sharing that node.
//
// A core (detail::hashed_wheel_core) owns the ring under one mutex and implements the handles'
// cancel(). It is reference-counted by its owner and by every live node, so handles outlive the
// timer. hashed_wheel<Clock> is the core driven by its user: advance(now) runs what is due on the
// calling thread, next_expiry() says when to call it next. hashed_wheel_timer<Clock> adds one
// worker thread, started by the first schedule, that loops: run what is due, then sleep until
// next_expiry(): the next non-empty tick, not every tick, and with nothing pending it sleeps
// without a deadline (zero wake-ups). A schedule that makes the next expiry earlier wakes it.
//
// What is better than Netty, and how:
// - cancel() unlinks the node under the lock and destroys the task before it returns; pending()
//   and max_pending see it at once (Netty queues cancellations until the next tick);
// - idle: the worker sleeps until the earliest non-empty tick boundary, or indefinitely;
// - never early: a deadline is rounded up to a tick boundary, and a node comes out only when its
//   deadline <= now; at most one tick late (plus the scheduler's wake-up latency);
// - deadlines saturate: schedule(f, duration::max()) is "never", past time points are due now and
//   run at the next pass, not a tick later;
// - a task that throws goes to on_error and the worker carries on;
// - tasks run outside the lock: a task may schedule, cancel, or stop() the timer (stop() from a
//   task does not join; the destructor, or a stop() on another thread, does);
// - one allocation per schedule at most, move-only callables welcome: a node whose callable is
//   small (node + capture <= 256 B) comes from the core's own slab pool (detail/hashed_wheel.hpp),
//   exactly its size, with no malloc; the task is moved into it under the lock, so a task's move
//   constructor must not call back into the timer.
//
// Tasks due together run in one batch in deadline order (first in, first out among equal
// deadlines). A batch is handed to run as a whole: once a task is expired(), cancelling it fails,
// and a stop() from inside a task leaves the rest of its batch to run.
//
// The worker sets PR_SET_TIMERSLACK to 1 ns on Linux, so it wakes within microseconds of a tick
// boundary instead of up to 50 µs late.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/hashed_wheel.hpp"
#include "detail/time.hpp"
#include "detail/timer_node.hpp"
#include "detail/wait.hpp"
#include "timeout.hpp"

namespace delayq {

/// The options of hashed_wheel_timer and hashed_wheel.
template <class Clock = std::chrono::steady_clock>
struct hashed_wheel_options {
    using duration = typename Clock::duration;
    duration tick = std::chrono::duration_cast<duration>(std::chrono::milliseconds(100));  // > 0
    std::size_t ticks_per_wheel = 512;  // in [1, 2^30]; rounded up to a power of two
    std::size_t max_pending = 0;        // 0 = unbounded
    std::function<void(std::exception_ptr)> on_error;  // a task that throws; the timer carries on
};

namespace detail {

template <class Clock>
class hashed_wheel_core final : public timer_core<Clock> {
public:
    using node = timer_node<Clock>;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;

    explicit hashed_wheel_core(hashed_wheel_options<Clock>&& o)
        : ring_(o.tick, o.ticks_per_wheel, Clock::now()),
          max_pending_(o.max_pending),
          on_error_(std::move(o.on_error)) {}

    /// Schedules `task` at `deadline`. Throws rejected_error (task untouched) when stopped or
    /// full, or what allocating or moving the task throws; then nothing is scheduled.
    template <class F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        if (stopped_.load(std::memory_order_acquire)) throw rejected_error("delayq: timer is stopped");
        if (max_pending_ != 0) reserve();
        using fn = std::decay_t<F>;
        static_assert(std::is_nothrow_destructible_v<fn>, "a task's destructor must not throw");
        using pooled = pooled_node<Clock, fn>;
        node* n;
        bool wake = false;
        if constexpr (node_pool::fits(sizeof(pooled), alignof(pooled))) {
            // A pooled node: taken from the pool and filled under the lock (so a rejected task is
            // never touched, even when stop() races with this call).
            std::unique_lock lk(m_);
            if (stopped_.load(std::memory_order_relaxed)) {
                lk.unlock();
                unreserve(1);
                throw rejected_error("delayq: timer is stopped");
            }
            void* mem;
            try {
                mem = pool_.allocate(sizeof(pooled));
            } catch (...) {
                lk.unlock();
                unreserve(1);
                throw;
            }
            pooled* p;
            try {
                p = ::new (mem) pooled(std::forward<F>(task));
            } catch (...) {
                node_pool::deallocate(mem, sizeof(pooled));
                lk.unlock();
                unreserve(1);
                throw;
            }
            p->ops = &pooled::table;
            p->deadline = deadline;
            p->refs.store(2, std::memory_order_relaxed);  // the timer's and the handle's
            this->ref();                                  // the node's on the core
            n = p;
            const time_point when = ring_.link(n);
            if (when < wake_at_) {
                wake_at_ = when;
                wake = true;
            }
        } else {
            try {
                n = make_node<Clock>(std::forward<F>(task), deadline, *this);
            } catch (...) {
                unreserve(1);
                throw;
            }
            n->refs.store(2, std::memory_order_relaxed);  // the timer's and the handle's
            std::unique_lock lk(m_);
            if (stopped_.load(std::memory_order_relaxed)) {
                // stop() came in between: the task was moved into the node; it is destroyed.
                lk.unlock();
                n->refs.store(1, std::memory_order_relaxed);
                unreserve(1);
                n->release(*this);
                throw rejected_error("delayq: timer is stopped");
            }
            const time_point when = ring_.link(n);
            if (when < wake_at_) {
                wake_at_ = when;
                wake = true;
            }
        }
        if (wake) cv_.notify_one();
        return timeout<Clock>(n, this);
    }

    bool cancel(node& n) noexcept override {
        {
            std::lock_guard lk(m_);
            if (n.state.load(std::memory_order_relaxed) != timer_state::pending) return false;
            ring_.unlink(&n);
            n.state.store(timer_state::cancelled, std::memory_order_release);
        }
        unreserve(1);
        n.destroy_task();  // outside the lock: a task's destructor may call back into the timer
        n.release(*this);  // the timer's reference; the caller's handle still holds one
        return true;
    }

    std::size_t pending() const {
        std::lock_guard lk(m_);
        return ring_.size();
    }

    std::optional<time_point> next_expiry() const {
        std::lock_guard lk(m_);
        return ring_.next_expiry();
    }

    /// Runs every task due at `now` on the calling thread; returns how many ran.
    std::size_t run_due(time_point now) {
        std::size_t count;
        node* batch;
        {
            std::lock_guard lk(m_);
            batch = take_due(now, count);
        }
        run(batch);
        return count;
    }

    /// Refuses further schedules and cancels every pending task. Idempotent. With `collect`,
    /// returns their handles, earliest deadline first; else releases them. Does not throw
    /// without `collect`.
    std::vector<timeout<Clock>> shut(bool collect) {
        std::vector<timeout<Clock>> out;
        node* chain;
        std::size_t count;
        {
            std::lock_guard lk(m_);
            if (stopped_.load(std::memory_order_relaxed)) return out;
            count = ring_.size();
            if (collect) out.reserve(count);  // before any change: a throw leaves all as it was
            stopped_.store(true, std::memory_order_release);
            chain = ring_.take_all();
            for (node* n = chain; n; n = n->next) n->state.store(timer_state::cancelled, std::memory_order_release);
            wake_at_ = time_point::min();
        }
        cv_.notify_all();
        unreserve(count);
        while (chain) {
            node* n = std::exchange(chain, chain->next);
            n->next = nullptr;
            n->destroy_task();
            if (collect) out.emplace_back(n, this);  // adopts the timer's reference
            else n->release(*this);
        }
        std::stable_sort(out.begin(), out.end(),
                         [](const timeout<Clock>& a, const timeout<Clock>& b) { return a.deadline() < b.deadline(); });
        return out;
    }

    /// Starts the worker into `t` unless it runs already. Throws rejected_error once stopped.
    void start_worker(std::thread& t) {
        std::lock_guard lk(m_);
        if (stopped_.load(std::memory_order_relaxed)) throw rejected_error("delayq: timer is stopped");
        if (started_.load(std::memory_order_relaxed)) return;
        this->ref();  // the worker's
        try {
            t = std::thread([this] {
                work();
                this->unref();
            });
        } catch (...) {
            this->unref();
            throw;
        }
        started_.store(true, std::memory_order_release);
    }

    bool started() const noexcept { return started_.load(std::memory_order_acquire); }

    std::size_t wakeups() const noexcept { return wakeups_.load(std::memory_order_relaxed); }

private:
    ~hashed_wheel_core() override = default;  // by unref() only

    // The worker: run what is due, then sleep until the next expiry (or a schedule that makes it
    // earlier, or stop).
    void work() {
        reduce_timer_slack();
        std::unique_lock lk(m_);
        while (!stopped_.load(std::memory_order_relaxed)) {
            std::size_t count;
            node* batch = take_due(Clock::now(), count);
            if (batch) {
                lk.unlock();
                run(batch);
                lk.lock();
                continue;
            }
            const std::optional<time_point> next = ring_.next_expiry();
            wake_at_ = next ? *next : time_point::max();
            detail::wait_until<Clock>(cv_, lk, wake_at_);
            wake_at_ = time_point::min();  // awake: a schedule need not notify
            wakeups_.fetch_add(1, std::memory_order_relaxed);
        }
    }

    // Under the lock: unlinks what is due and marks it expired.
    node* take_due(time_point now, std::size_t& count) noexcept {
        node* batch = ring_.expire(now, count);
        for (node* n = batch; n; n = n->next) n->state.store(timer_state::expired, std::memory_order_release);
        unreserve(count);
        return batch;
    }

    // Outside the lock: runs a batch, destroys each task and drops the reference it carried.
    void run(node* batch) noexcept {
        while (batch) {
            node* n = std::exchange(batch, batch->next);
            n->next = nullptr;
            run_reporting(*n, on_error_);
            n->destroy_task();
            n->release(*this);
        }
    }

    void reserve() {
        std::size_t cur = reserved_.load(std::memory_order_relaxed);
        do {
            if (cur >= max_pending_) throw rejected_error("delayq: max_pending reached");
        } while (!reserved_.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed));
    }

    void unreserve(std::size_t k) noexcept {
        if (max_pending_ != 0 && k != 0) reserved_.fetch_sub(k, std::memory_order_relaxed);
    }

    mutable std::mutex m_;
    std::condition_variable cv_;  // the worker sleeps here
    hashed_wheel_ring<Clock> ring_;
    time_point wake_at_ = time_point::min();  // when the sleeping worker wakes by itself; min: no one sleeps
    std::atomic<bool> stopped_{false};
    std::atomic<bool> started_{false};
    std::atomic<std::size_t> wakeups_{0};
    const std::size_t max_pending_;
    std::atomic<std::size_t> reserved_{0};  // pending + being scheduled; used when max_pending_ > 0
    std::function<void(std::exception_ptr)> on_error_;
    node_pool pool_;  // its slabs go with the core, after the last node (each node holds a core reference)
};

}  // namespace detail

/// A hashed timing wheel with no thread of its own: the caller runs what is due with advance(),
/// when next_expiry() says (an event loop's timeout). Thread-safe; tasks run on advance()'s
/// caller. See the top of this header.
template <class Clock = std::chrono::steady_clock>
class hashed_wheel {
public:
    using clock = Clock;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using options = hashed_wheel_options<Clock>;

    /// Throws std::invalid_argument for a tick <= 0 or ticks_per_wheel outside [1, 2^30].
    explicit hashed_wheel(options o = {}) : core_(new detail::hashed_wheel_core<Clock>(std::move(o))) {}
    hashed_wheel(const hashed_wheel&) = delete;
    hashed_wheel& operator=(const hashed_wheel&) = delete;

    /// Cancels what is pending; handles stay valid.
    ~hashed_wheel() {
        core_->shut(false);
        core_->unref();
    }

    /// Runs `task` once `delay` (saturating; <= 0: due now) has passed on Clock.
    template <class F, class Rep, class Period>
        requires std::is_invocable_v<std::decay_t<F>&>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        return core_->schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` once Clock reaches `deadline` (a past one: at the next advance()).
    template <class F>
        requires std::is_invocable_v<std::decay_t<F>&>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// Runs, on this thread, every task due at `now` (deadline <= now, its tick boundary reached);
    /// returns how many ran. A task that throws goes to on_error.
    std::size_t advance(time_point now = Clock::now()) { return core_->run_due(now); }

    /// When advance() will next have something to run; nullopt when nothing is pending. A time
    /// in the past means now. Never later than one tick after the earliest deadline.
    std::optional<time_point> next_expiry() const { return core_->next_expiry(); }

    /// Tasks neither run nor cancelled.
    std::size_t pending() const { return core_->pending(); }

    /// As hashed_wheel_timer::stop(): later schedules throw rejected_error; returns the handles
    /// still pending, now cancelled(). Idempotent.
    std::vector<timeout<Clock>> stop() { return core_->shut(true); }

private:
    detail::hashed_wheel_core<Clock>* core_;
};

/// Netty's HashedWheelTimer, and better: see the top of this header and SPEC.md.
template <class Clock = std::chrono::steady_clock>
class hashed_wheel_timer {
public:
    using clock = Clock;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using options = hashed_wheel_options<Clock>;

    /// Throws std::invalid_argument for a tick <= 0 or ticks_per_wheel outside [1, 2^30]. The
    /// worker thread starts with the first schedule.
    explicit hashed_wheel_timer(options o = {})
        : core_(new detail::hashed_wheel_core<Clock>(std::move(o))) {}
    hashed_wheel_timer(const hashed_wheel_timer&) = delete;
    hashed_wheel_timer& operator=(const hashed_wheel_timer&) = delete;

    /// Stops (pending tasks are cancelled) and joins the worker; from inside a task, lets the
    /// worker finish by itself instead.
    ~hashed_wheel_timer() {
        core_->shut(false);
        finish(true);
        core_->unref();
    }

    /// Runs `task` on the worker once `delay` (saturating; <= 0: due now) has passed on Clock.
    /// Throws rejected_error after stop() or when max_pending tasks are pending; the task is then
    /// left untouched (unless the callable is too large for the node pool, over 216 B, and stop()
    /// races with this call: then it is destroyed).
    template <class F, class Rep, class Period>
        requires std::is_invocable_v<std::decay_t<F>&>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        start();
        return core_->schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` on the worker once Clock reaches `deadline` (a past one: at once).
    template <class F>
        requires std::is_invocable_v<std::decay_t<F>&>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        start();
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// Tasks neither run nor cancelled.
    std::size_t pending() const { return core_->pending(); }

    /// Refuses further schedules, cancels every pending task and returns their handles (now
    /// cancelled(), their cancel() false), earliest first. Joins the worker, unless called from a
    /// task. Idempotent: later calls return an empty vector.
    std::vector<timeout<Clock>> stop() {
        auto out = core_->shut(true);
        finish(false);
        return out;
    }

    /// How many times the worker has woken up so far (for monitoring the idle behaviour).
    std::size_t wakeups() const noexcept { return core_->wakeups(); }

private:
    void start() {
        if (!core_->started()) core_->start_worker(worker_);
    }

    void finish(bool destroying) {
        std::lock_guard lk(join_m_);
        if (!worker_.joinable()) return;
        if (worker_.get_id() != std::this_thread::get_id()) {
            worker_.join();
        } else if (destroying) {
            worker_.detach();  // destroyed by one of its tasks: the worker ends by itself
        }
    }

    detail::hashed_wheel_core<Clock>* core_;
    std::mutex join_m_;
    std::thread worker_;  // written under the core's lock before it is stopped; joined under join_m_
};

}  // namespace delayq
