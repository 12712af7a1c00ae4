// timeout<Clock>: the handle both wheels return for a scheduled task, and rejected_error.
//
// A handle is two pointers: the task's node and the timer's core. Copies share the node through its
// reference count; the core outlives every node a handle holds (detail/timer_node.hpp), so a handle
// stays valid (and cancel() stays safe) after the timer is stopped or destroyed. A
// default-constructed handle refers to no task.
#pragma once

#include <chrono>
#include <stdexcept>
#include <utility>

#include "detail/timer_node.hpp"

namespace delayq {

/// Thrown by schedule() when the timer is stopped or max_pending would be exceeded.
class rejected_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

template <class Clock = std::chrono::steady_clock>
class timeout {
  public:
    using clock = Clock;
    using time_point = typename Clock::time_point;

    timeout() noexcept = default;

    timeout(const timeout& o) noexcept : node_(o.node_), core_(o.core_) {
        if (node_) node_->acquire();
    }
    timeout(timeout&& o) noexcept
        : node_(std::exchange(o.node_, nullptr)), core_(std::exchange(o.core_, nullptr)) {}
    timeout& operator=(timeout o) noexcept {
        swap(o);
        return *this;
    }
    ~timeout() {
        if (node_) detail::timer_core<Clock>::release(*node_);
    }

    void swap(timeout& o) noexcept {
        std::swap(node_, o.node_);
        std::swap(core_, o.core_);
    }

    /// True if this call stopped the task from running. The task is destroyed before it returns.
    bool cancel() noexcept { return node_ && core_->cancel(*node_); }

    bool cancelled() const noexcept { return is(detail::timer_state::cancelled); }

    /// The task has been handed to the worker to run (it may still be running).
    bool expired() const noexcept { return is(detail::timer_state::expired); }

    /// Neither run nor cancelled yet.
    bool pending() const noexcept { return is(detail::timer_state::pending); }

    /// When the task is due. Models Delayed. time_point{} for an empty handle.
    time_point deadline() const noexcept { return node_ ? node_->deadline : time_point{}; }

    /// Whether this handle refers to a task.
    explicit operator bool() const noexcept { return node_ != nullptr; }

    friend bool operator==(const timeout& a, const timeout& b) noexcept {
        return a.node_ == b.node_;
    }

    /// For timer implementations: adopts one reference to n.
    timeout(detail::timer_node<Clock>* n, detail::timer_core<Clock>* core) noexcept
        : node_(n), core_(core) {}

    /// For timer implementations: the node this handle refers to.
    detail::timer_node<Clock>* node_for_timer() const noexcept { return node_; }

  private:
    bool is(detail::timer_state s) const noexcept { return node_ && node_->load_state() == s; }

    detail::timer_node<Clock>* node_ = nullptr;
    detail::timer_core<Clock>* core_ = nullptr;
};

}  // namespace delayq
