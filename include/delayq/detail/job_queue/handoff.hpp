// A waiting thread's own mailbox: another thread tells it what happened to its call (answered,
// its turn to send or to read) under the mailbox's own lock, and the waiting thread reads it.
// Used by the combiner (each call handed in) and by the Redis link (each request).
//
// Why a lock and a condition variable per waiting thread, not one for all: a thread is woken only
// for news of its own (one futex wake, not a herd), and the signal is given under the mailbox's
// own lock, so the waiting thread cannot see the news, return and destroy the mailbox before the
// signalling thread has let go of it (POSIX lets a mutex be destroyed right after another thread
// unlocked it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace delayq::detail::job_queue {

/// `State` is an enum whose value-initialized state (0) means "nothing said"; `Taken` is the one
/// state that a wait takes, so that the next wait waits for the next signal (a role handed over,
/// as opposed to a final answer).
template <class State, State Taken>
class handoff {
  public:
    /// Tells the waiting thread `what`.
    void signal(State what) noexcept {
        std::lock_guard lk(m_);
        st_ = what;
        cv_.notify_one();
    }

    /// Waits until `t` for signal() and returns what it said: State{} when nothing was said by
    /// then. A `Taken` is taken.
    State await_until(std::chrono::steady_clock::time_point t) noexcept {
        std::unique_lock lk(m_);
        cv_.wait_until(lk, t, [&] { return st_ != State{}; });
        const State said = st_;
        if (said == Taken) st_ = State{};
        return said;
    }

    /// Waits, however long it takes, until `what` is said.
    void await(State what) noexcept {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return st_ == what; });
    }

    /// A `Taken` said and not yet taken is taken back: the thread, if it woke for it, finds
    /// nothing said and waits on.
    void take_back() noexcept {
        std::lock_guard lk(m_);
        if (st_ == Taken) st_ = State{};
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    State st_{};
};

}  // namespace delayq::detail::job_queue
