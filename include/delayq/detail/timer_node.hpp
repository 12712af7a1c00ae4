// The storage shared by both wheels: one node per scheduled task, and the core a handle reaches
// to cancel it.
//
// One allocation per task: the node header and the callable live in one block (node_with<F>). The
// header is the intrusive list links, the deadline, a pointer to the callable's operations, a
// reference count and the state. Who holds references: the timer while the task is pending (it
// sits in a bucket), the worker while it runs the task, and every `timeout` handle.
//
// The core (timer_core) is the part of a timer that outlives it for the handles' sake. It is
// reference-counted by the timer and by every live node, so a handle can always reach it; after
// stop() its cancel() finds nothing pending and returns false.
//
// State changes happen under the core's lock; `state` is atomic only so that handles can read it
// from any thread without that lock.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace delayq::detail {

enum class timer_state : std::uint8_t {
    pending,    // in the timer, waiting for its deadline
    expired,    // handed to the worker to run (it may be running or done)
    cancelled,  // cancelled by a handle or by stop(); the task is gone
};

template <class Clock>
struct timer_node;

template <class Clock>
class timer_core {
public:
    timer_core() = default;
    timer_core(const timer_core&) = delete;
    timer_core& operator=(const timer_core&) = delete;

    /// Cancels n if it is still pending: under the timer's lock, unlinks it, destroys its task,
    /// and drops the timer's reference. Returns whether this call cancelled it.
    virtual bool cancel(timer_node<Clock>& n) noexcept = 0;

    void ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
    void unref() noexcept {
        if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }

protected:
    virtual ~timer_core() = default;

private:
    std::atomic<std::size_t> refs_{1};  // the timer's own reference
};

template <class Clock>
struct task_ops {
    void (*run)(timer_node<Clock>&);      // invokes the task (may throw)
    void (*destroy)(timer_node<Clock>&) noexcept;  // destroys the task, keeps the memory
    void (*deallocate)(timer_node<Clock>*) noexcept;
};

template <class Clock>
struct timer_node {
    using time_point = typename Clock::time_point;

    timer_node* prev = nullptr;  // bucket links; touched only under the core's lock
    timer_node* next = nullptr;
    time_point deadline{};
    const task_ops<Clock>* ops = nullptr;
    std::atomic<std::uint32_t> refs{1};
    std::atomic<timer_state> state{timer_state::pending};
    bool has_task = true;  // false once the task is destroyed; written by whoever owns the task:
                           // the timer (under its lock) while pending, the worker once expired
    std::uint16_t tag = 0;  // free for the wheel's use (e.g. a level)

    timer_state load_state() const noexcept { return state.load(std::memory_order_acquire); }

    void acquire() noexcept { refs.fetch_add(1, std::memory_order_relaxed); }

    /// Drops one reference; the last one frees the node and drops its reference on the core.
    void release(timer_core<Clock>& core) noexcept {
        if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            destroy_task();
            ops->deallocate(this);
            core.unref();
        }
    }

    void run() { ops->run(*this); }

    void destroy_task() noexcept {
        if (has_task) {
            has_task = false;
            ops->destroy(*this);
        }
    }
};

// A node and its callable in one allocation.
template <class Clock, class F>
struct node_with final : timer_node<Clock> {
    union {
        F fn;  // alive while has_task
    };

    template <class G>
        requires(!std::is_same_v<std::remove_cvref_t<G>, node_with>)
    explicit node_with(G&& g)  // NOLINT(bugprone-forwarding-reference-overload): constrained
        : fn(std::forward<G>(g)) {}
    ~node_with() {}

    static void run(timer_node<Clock>& n) { static_cast<node_with&>(n).fn(); }
    static void destroy(timer_node<Clock>& n) noexcept { static_cast<node_with&>(n).fn.~F(); }
    static void deallocate(timer_node<Clock>* n) noexcept { delete static_cast<node_with*>(n); }

    static constexpr task_ops<Clock> table{&run, &destroy, &deallocate};
};

/// Allocates a pending node for `task` due at `deadline`, holding one reference (the caller's),
/// and takes a reference on `core` for it. Throws what the allocation or the task's move throws;
/// then nothing was taken.
template <class Clock, class F>
timer_node<Clock>* make_node(F&& task, typename Clock::time_point deadline,
                             timer_core<Clock>& core) {
    using fn = std::decay_t<F>;
    static_assert(std::is_invocable_v<fn&>, "a task is a callable taking no arguments");
    static_assert(std::is_nothrow_destructible_v<fn>, "a task's destructor must not throw");
    auto* n = new node_with<Clock, fn>(std::forward<F>(task));
    n->ops = &node_with<Clock, fn>::table;
    n->deadline = deadline;
    core.ref();
    return n;
}

/// Runs n's task. What it throws goes to on_error; an on_error that throws (or none) is ignored:
/// the timer carries on.
template <class Clock>
void run_reporting(timer_node<Clock>& n, const std::function<void(std::exception_ptr)>& on_error) noexcept {
    try {
        n.run();
    } catch (...) {
        if (on_error) {
            try {
                on_error(std::current_exception());
            } catch (...) {
            }
        }
    }
}

/// For a timer's own thread: Linux adds up to 50 µs of "timer slack" to every timed sleep; 1 ns
/// lets the worker wake within microseconds of a deadline.
inline void reduce_timer_slack() noexcept {
#if defined(__linux__) && defined(PR_SET_TIMERSLACK)
    (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}

}  // namespace delayq::detail
