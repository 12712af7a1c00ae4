// <delayq/coro.hpp>: `co_await delayq::sleep_for(timer, 5ms)` — a C++20 coroutine sleeps on a
// wheel.
//
// The idea. A sleeping coroutine is one task on a wheel: await_suspend() schedules a task that
// holds nothing but a pointer to the awaiter (which lives in the coroutine's frame), so a sleep
// costs what any timer on that wheel costs (a 48-byte node, O(1) to schedule and to cancel) and ten
// thousand sleeping coroutines are ten thousand nodes and their frames, with no thread each. When
// the task runs, the coroutine resumes: on the thread that runs the wheel's tasks (the worker of a
// hashed_wheel_timer or of a hierarchical_timing_wheel, the caller of advance() on a hashed_wheel),
// or, when an executor is named, on whatever thread that executor runs it.
//
// `co_await` gives a bool: true when the time has passed, false when the sleep was cut short —
// by its stop_token, or because the timer was stopped or destroyed while the coroutine slept. A
// cut-short sleep still resumes the coroutine (never leaves it suspended forever), so a stopped
// server's coroutines unwind and free what they hold. A sleep that cannot begin (the timer is
// already stopped, or at max_pending) throws rejected_error from the co_await.
//
// Why this is in the library and not an example: the task, the stop_token and the resumption race
// each other across threads, and getting that right is the whole difficulty. The awaiter settles it
// with one atomic state word: `suspended` (await_suspend() is done with the frame) and `done` (the
// sleep ended, with ok_ written); `cut` says a stop request came first. Whichever of the two is set
// second resumes the coroutine, so it is resumed exactly once and never while await_suspend() is
// still using the frame.
//
// A frame destroyed while it sleeps (its owner called destroy(), e.g. a parent task dropping a
// child) sets `abandoned` and cancels the task, and the coroutine is not resumed. When the task can
// no longer be cancelled, its end is under way: on another thread (the worker running it, a stop()
// there), which the destructor waits for, briefly; or further up this very thread's stack — a
// stop() of the timer resumed a coroutine (inline) that now destroys this one — where waiting would
// never end: then the destructor detaches the task, which is still alive below it, from the frame.
//
// Where a cut-short sleep resumes, and where what the coroutine then throws goes. A promise whose
// unhandled_exception() rethrows hands what the coroutine throws to whoever resumed it; after a
// sleep that ran its course that is the timer's pass, which gives it to on_error. A stop request
// ends the sleep the same way: it marks the sleep `cut` and moves its task to now, and the timer's
// next pass (its worker; the next advance() of a thread-free wheel) resumes the coroutine with
// false, so a throw reaches on_error too. Never inside request_stop(), which is noexcept: a throw
// there would be std::terminate. (A stop requested before the co_await: the coroutine goes on at
// once, with false, without sleeping. Out of memory for the move, the sleep ends with false at its
// deadline.) The timer's stop() and destructor end every sleep unrun, inside the noexcept end of
// its task: the coroutine resumes there (false), on that thread, so that it is never left
// suspended or lost, and what it throws is handed to the timer's on_error there, on the thread
// that called stop() or the destructor (the awaiter's handle keeps the timer's core, and its
// on_error, alive). With an executor the coroutine resumes, and throws, wherever the executor
// runs it; name one when a coroutine would destroy that timer (it must not, resumed inline inside
// the timer's stop() or destructor).
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <optional>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <utility>

#include "detail/time.hpp"
#include "timeout.hpp"

namespace delayq {

/// What an executor is handed: calling it resumes the sleeping coroutine. Call it exactly once,
/// on the thread where the coroutine should go on. Cheap to copy (one pointer).
class resumption {
  public:
    /// Wraps the suspended coroutine `h` (done by the awaiter, not by users).
    explicit resumption(std::coroutine_handle<> h) noexcept : h_(h) {}

    /// Resumes the coroutine. Precondition: not called before (a coroutine is resumed once).
    void operator()() const { h_.resume(); }

    /// The suspended coroutine, for executors that deal in handles.
    std::coroutine_handle<> handle() const noexcept { return h_; }

  private:
    std::coroutine_handle<> h_;
};

/// Something that runs a resumption later, on a thread of its choosing: a callable taking a
/// `resumption`, e.g. `[&io](delayq::resumption r) { boost::asio::post(io, r); }` or a thread
/// pool's submit. It should not throw; if it does, the coroutine is resumed on the calling thread
/// instead, so that it is never lost.
template <class E>
concept executor = std::move_constructible<E> && std::invocable<E&, resumption>;

/// The default: resume on the thread that ends the sleep (the wheel's worker, or advance()'s
/// caller).
struct resume_inline {
    /// Resumes `r` at once, on the calling thread.
    void operator()(resumption r) const { r(); }
};

namespace detail {
struct sleep_probe_task {
    void operator()() const noexcept {}
};

// How many sleeps this thread is ending unrun (a stop_token, stop(), a destructor) right now: a
// frame destroyed while this is non-zero may be destroyed from inside the very call that is about
// to end its own task (see ~sleep_awaiter).
inline thread_local int ending_unrun = 0;
}  // namespace detail

/// A timer a coroutine can sleep on: one with `clock`, `time_point` and
/// `schedule_at(task, time_point)` returning a `timeout<clock>` — hashed_wheel, hashed_wheel_timer
/// and hierarchical_timing_wheel.
template <class T>
concept sleep_timer = requires(T& t, typename T::time_point tp) {
    typename T::clock;
    { t.schedule_at(detail::sleep_probe_task{}, tp) } -> std::same_as<timeout<typename T::clock>>;
};

/// The awaitable of sleep_for() and sleep_until(); `co_await` it once, at once (it is neither
/// copyable nor movable). `co_await` yields true when the deadline has passed, false when the sleep
/// was cut short (stop_token: in the timer's next pass; or the timer stopped or destroyed: inside
/// stop() or the destructor, on its caller's thread; what the coroutine throws goes to on_error
/// either way, see the top of the header). Throws rejected_error from the co_await when the timer
/// refuses the task (stopped, or max_pending reached), or what scheduling throws (std::bad_alloc);
/// the coroutine then did not sleep.
template <sleep_timer Timer, executor Executor = resume_inline>
class [[nodiscard]] sleep_awaiter {
  public:
    using clock = typename Timer::clock;            ///< the timer's clock
    using time_point = typename Timer::time_point;  ///< a point on it

    /// Prefer sleep_for() and sleep_until().
    sleep_awaiter(Timer& timer, time_point deadline, Executor ex, std::stop_token stop)
        : timer_(timer), deadline_(deadline), ex_(std::move(ex)), stop_(std::move(stop)) {}
    sleep_awaiter(const sleep_awaiter&) = delete;
    sleep_awaiter& operator=(const sleep_awaiter&) = delete;

    /// A coroutine destroyed while it sleeps: its task is cancelled and it is not resumed. If the
    /// sleep is ending on another thread at that moment, waits (briefly) for that thread to let go
    /// of the frame. Destroying a frame whose sleep another thread is about to resume (it has
    /// already decided to) is a race, as for any coroutine.
    ~sleep_awaiter() {
        if (!handle_) return;  // never suspended
        stop_cb_.reset();      // waits for a stop callback running on another thread: it uses us
        const std::uint8_t prev = state_.fetch_or(abandoned, std::memory_order_acq_rel);
        if (prev & done) return;       // the usual case: resumed, nothing left to do
        if (handle_.cancel()) return;  // the task ended here, unrun, and saw `abandoned`
        // The task's end is under way. Below us on this thread (a stop() of the timer resumed the
        // coroutine that destroys this one), the task is alive and will not end before we return:
        // detach it. Otherwise another thread ends it: wait until it has.
        if (detail::ending_unrun > 0 && task_ && task_->detach()) return;
        while (!(state_.load(std::memory_order_acquire) & done)) std::this_thread::yield();
    }

    /// Never ready: even a deadline in the past goes through the timer (and the executor).
    bool await_ready() const noexcept { return false; }

    /// Schedules the wake-up. Throws what the timer's schedule_at() throws (nothing scheduled).
    bool await_suspend(std::coroutine_handle<> h) {
        if (stop_.stop_requested()) return false;  // cut short before it began: go on at once
        h_ = h;
        task t(this);
        try {
            handle_ = timer_.schedule_at(std::move(t), deadline_);
        } catch (...) {
            t.disarm();
            throw;
        }
        if (stop_.stop_possible()) stop_cb_.emplace(std::move(stop_), on_stop{this});
        const std::uint8_t prev = state_.fetch_or(suspended, std::memory_order_acq_rel);
        if (!(prev & done)) return true;  // whoever ends the sleep resumes the coroutine
        // It ended already (a past deadline on a busy worker, a stop requested before).
        if constexpr (std::is_same_v<Executor, resume_inline>) {
            return false;  // go on at once, on this thread
        } else {
            hop();
            return true;
        }
    }

    /// True if the deadline passed, false if the sleep was cut short.
    bool await_resume() const noexcept { return ok_; }

  private:
    static constexpr std::uint8_t suspended = 1;  // await_suspend() no longer touches the frame
    static constexpr std::uint8_t done = 2;       // the sleep ended; ok_ is written
    static constexpr std::uint8_t abandoned = 4;  // the frame is being destroyed: do not resume
    static constexpr std::uint8_t cut = 8;        // a stop request cut the sleep short

    // The wheel's task: ends the sleep when it runs (true, unless a stop request moved it) or when
    // it is destroyed unrun (false: by stop(), by the timer's destructor, or by ~sleep_awaiter).
    // Whoever takes the awaiter pointer out of it first owns the ending: the task, or a destructor
    // that detaches it.
    class task {
      public:
        explicit task(sleep_awaiter* a) noexcept : a_(a) {}
        // The move into the wheel's node, inside schedule_at(): the awaiter learns where it lives.
        task(task&& o) noexcept : a_(o.a_.exchange(nullptr, std::memory_order_relaxed)) {
            if (sleep_awaiter* a = a_.load(std::memory_order_relaxed)) a->task_ = this;
        }
        task& operator=(task&&) = delete;
        ~task() {
            if (sleep_awaiter* a = a_.exchange(nullptr, std::memory_order_acq_rel)) {
                ++detail::ending_unrun;
                struct uncount {
                    ~uncount() { --detail::ending_unrun; }
                } guard;
                a->end(false);
            }
        }
        void operator()() {
            if (sleep_awaiter* a = a_.exchange(nullptr, std::memory_order_acq_rel)) a->end(true);
        }
        void disarm() noexcept { a_.store(nullptr, std::memory_order_relaxed); }
        bool detach() noexcept {
            return a_.exchange(nullptr, std::memory_order_acq_rel) != nullptr;
        }

      private:
        std::atomic<sleep_awaiter*> a_;
    };

    // A stop request does not end the sleep where it is made: request_stop() is noexcept, and
    // the coroutine, resumed in there, could not report what it throws. It marks the sleep cut
    // short and moves its task to now, so that the timer's next pass ends it (false) as it ends
    // any sleep: what the coroutine then throws goes to on_error. Out of memory for that move,
    // the sleep still ends with false, at its deadline.
    struct on_stop {
        sleep_awaiter* a;
        void operator()() const noexcept {
            const std::uint8_t prev = a->state_.fetch_or(cut, std::memory_order_acq_rel);
            if (prev & (done | cut)) return;
            try {
                (void)a->handle_.reschedule_at(clock::now());  // false: it ran, or is ending
            } catch (...) {                                    // std::bad_alloc: see above
            }
        }
    };

    // The sleep ended: `ran`, its task ran (in a pass: the deadline came, or a stop request moved
    // it); else the task was ended unrun (the timer's stop() or destructor). The frame is touched
    // only before the fetch_or, unless this call is the one that resumes the coroutine.
    void end(bool ran) {
        ok_ = ran && !(state_.load(std::memory_order_acquire) & cut);
        const std::uint8_t prev = state_.fetch_or(done, std::memory_order_acq_rel);
        if ((prev & abandoned) || !(prev & suspended)) return;
        if (ran) {
            go_on();  // what the coroutine throws leaves the task: the pass gives it to on_error
            return;
        }
        // Inside the timer's stop() or destructor, under a task's noexcept destructor: what the
        // coroutine throws goes to on_error from here (letting it out would call std::terminate).
        // The handle is copied first: the resumed coroutine destroys this awaiter, and the copy
        // keeps the node, and so the timer's core and its on_error, alive.
        const timeout<clock> reporter = handle_;
        try {
            go_on();
        } catch (...) {
            reporter.report_error(std::current_exception());
        }
    }

    void go_on() {
        if constexpr (std::is_same_v<Executor, resume_inline>) {
            h_.resume();
        } else {
            hop();
        }
    }

    // Hands the coroutine to the executor. The executor is moved out of the frame first: once it
    // has the resumption, the coroutine may run, and destroy this awaiter, at any moment.
    void hop() {
        Executor ex(std::move(ex_));
        const std::coroutine_handle<> h = h_;
        try {
            ex(resumption(h));
        } catch (...) {
            h.resume();  // never lose the coroutine (see `executor`)
        }
    }

    Timer& timer_;
    time_point deadline_;
    Executor ex_;
    std::stop_token stop_;
    std::coroutine_handle<> h_;
    timeout<clock> handle_;
    task* task_ = nullptr;  // the task in the wheel's node, while it is alive
    std::optional<std::stop_callback<on_stop>> stop_cb_;  // after handle_: destroyed before it
    std::atomic<std::uint8_t> state_{0};
    bool ok_ = false;
};

/// `co_await sleep_for(timer, d)`: resumes the coroutine once `d` (measured on the timer's clock
/// from this call; saturating) has passed, on the thread that runs the timer's tasks. Cut short
/// (false) when `stop` is requested or the timer stops. See sleep_awaiter.
template <sleep_timer Timer, class Rep, class Period>
sleep_awaiter<Timer> sleep_for(Timer& timer, std::chrono::duration<Rep, Period> d,
                               std::stop_token stop = {}) {
    return {timer, detail::deadline_after<typename Timer::clock>(d), resume_inline{},
            std::move(stop)};
}

/// As sleep_for(timer, d, stop), resuming the coroutine through `ex` (see `executor`).
template <sleep_timer Timer, class Rep, class Period, executor Executor>
sleep_awaiter<Timer, std::decay_t<Executor>> sleep_for(Timer& timer,
                                                       std::chrono::duration<Rep, Period> d,
                                                       Executor&& ex, std::stop_token stop = {}) {
    return {timer, detail::deadline_after<typename Timer::clock>(d), std::forward<Executor>(ex),
            std::move(stop)};
}

/// `co_await sleep_until(timer, deadline)`: resumes the coroutine once the timer's clock reaches
/// `deadline` (a past one: at the timer's next pass). As sleep_for().
template <sleep_timer Timer>
sleep_awaiter<Timer> sleep_until(Timer& timer, typename Timer::time_point deadline,
                                 std::stop_token stop = {}) {
    return {timer, deadline, resume_inline{}, std::move(stop)};
}

/// As sleep_until(timer, deadline, stop), resuming the coroutine through `ex`.
template <sleep_timer Timer, executor Executor>
sleep_awaiter<Timer, std::decay_t<Executor>> sleep_until(Timer& timer,
                                                         typename Timer::time_point deadline,
                                                         Executor&& ex, std::stop_token stop = {}) {
    return {timer, deadline, std::forward<Executor>(ex), std::move(stop)};
}

}  // namespace delayq
