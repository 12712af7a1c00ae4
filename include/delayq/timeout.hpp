// timeout<Clock>: the handle both wheels return for a scheduled task, and rejected_error.
//
// A handle is two pointers: the task's node and the timer's core. Copies share the node through its
// reference count; the core outlives every node a handle holds (detail/timer_node.hpp), so a handle
// stays valid (and cancel() stays safe) after the timer is stopped or destroyed. A
// default-constructed handle refers to no task.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <exception>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "detail/time.hpp"
#include "detail/timer_node.hpp"

namespace delayq {

namespace detail {
/// What the wheels run: a callable taking no arguments (move-only welcome), invoked as an lvalue.
/// (Spelled with add_lvalue_reference_t: clang-format 14 breaks `F&>` inside a concept.)
template <class F>
concept task = std::is_invocable_v<std::add_lvalue_reference_t<std::decay_t<F>>>;
}  // namespace detail

/// Thrown by schedule() when the timer is stopped or max_pending would be exceeded.
class rejected_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

/// The handle both wheels return for a scheduled task: cheap to copy (one reference count), safe
/// to use from any thread, and after the timer is gone (cancel() then returns false). All copies
/// refer to the same task. Models Delayed through deadline().
template <class Clock = std::chrono::steady_clock>
class timeout {
  public:
    using clock = Clock;                            ///< the timer's clock
    using time_point = typename Clock::time_point;  ///< deadlines on that clock

    /// An empty handle: refers to no task; cancel() and reschedule() return false.
    timeout() noexcept = default;

    /// Another handle to the same task. O(1), thread-safe.
    timeout(const timeout& o) noexcept : node_(o.node_), core_(o.core_) {
        if (node_) node_->acquire();
    }
    /// Takes o's task; o becomes empty.
    timeout(timeout&& o) noexcept
        : node_(std::exchange(o.node_, nullptr)), core_(std::exchange(o.core_, nullptr)) {}
    /// Refers to o's task instead (a copy, or a move).
    timeout& operator=(timeout o) noexcept {
        swap(o);
        return *this;
    }
    /// Drops this handle's reference; the task itself is not cancelled.
    ~timeout() {
        if (node_) detail::timer_core<Clock>::release(*node_);
    }

    /// Exchanges the tasks of two handles.
    void swap(timeout& o) noexcept {
        std::swap(node_, o.node_);
        std::swap(core_, o.core_);
    }

    /// True if this call stopped the task from running (a periodic task: from running again, also
    /// when called from inside it). The task is destroyed before it returns, unless it is running
    /// (a periodic task cancelled during its run is destroyed when that run ends).
    bool cancel() noexcept { return node_ && core_->cancel(*node_); }

    /// The task was cancelled (by cancel(), or by the timer's stop()) and will not run (again).
    bool cancelled() const noexcept { return is(detail::timer_state::cancelled); }

    /// The task has been handed to the worker to run (it may still be running). A periodic task:
    /// only once its last run is over (the one whose successor would lie past
    /// time_point::max()); until then it is pending, during its runs too.
    bool expired() const noexcept { return is(detail::timer_state::expired); }

    /// Neither run nor cancelled yet.
    bool pending() const noexcept { return is(detail::timer_state::pending); }

    /// Moves the task, if it is still pending(), to run once `delay` (saturating; <= 0: due now,
    /// at the next pass) has passed on Clock; keeps the task and this handle. O(1) (a task in the
    /// tick under way: O(log n) of that tick), no allocation but, on a hierarchical wheel, a level
    /// that a deadline farther than any before needs. Returns whether it was pending: false,
    /// changing nothing, once a one-shot task ran or runs (it stops being pending when handed to
    /// run), a periodic task's last run is over, or the task was cancelled. A periodic task's next
    /// run moves, and its later runs follow from there; a periodic task is pending during its runs,
    /// so a reschedule() during one (from the task itself too) returns true and sets when the next
    /// run is due (a burst's missed runs that were still to come in that pass are dropped).
    /// Thread-safe, like cancel(). Throws std::bad_alloc (then nothing changed).
    template <class Rep, class Period>
    bool reschedule(std::chrono::duration<Rep, Period> delay) {
        return reschedule_at(detail::deadline_after<Clock>(delay));
    }

    /// reschedule(), to run once Clock reaches `deadline` (a past one: at the next pass).
    bool reschedule_at(time_point deadline) { return node_ && core_->reschedule(*node_, deadline); }

    /// When the task is due (a periodic task: its next run). Models Delayed. time_point{} for an
    /// empty handle.
    time_point deadline() const noexcept { return node_ ? node_->load_deadline() : time_point{}; }

    /// Whether this handle refers to a task.
    explicit operator bool() const noexcept { return node_ != nullptr; }

    /// Whether both handles refer to the same task (or both are empty).
    friend bool operator==(const timeout& a, const timeout& b) noexcept {
        return a.node_ == b.node_;
    }

    /// For timer implementations: adopts one reference to n.
    timeout(detail::timer_node<Clock>* n, detail::timer_core<Clock>* core) noexcept
        : node_(n), core_(core) {}

    /// For timer implementations (coro.hpp): hands `e` to the timer's on_error on this thread,
    /// also after the timer is stopped or destroyed; nothing for an empty handle.
    void report_error(std::exception_ptr e) const noexcept {
        if (core_) core_->report_error(std::move(e));
    }

    /// For timer implementations: the node this handle refers to.
    detail::timer_node<Clock>* node_for_timer() const noexcept { return node_; }

  private:
    bool is(detail::timer_state s) const noexcept { return node_ && node_->load_state() == s; }

    detail::timer_node<Clock>* node_ = nullptr;
    detail::timer_core<Clock>* core_ = nullptr;
};

}  // namespace delayq
