// The storage both wheels share: one node per scheduled task, and the core a handle reaches to
// cancel it.
//
// The idea. A task lives in one block: a 40-byte header (the list links, the deadline, a pointer to
// the callable's operations with the state and a periodic task's flags in its low bits, a reference
// count and a sequence number) followed by the callable. With an 8-byte capture a node is 48 bytes.
// Blocks come from the core's node_pool (detail/node_pool.hpp), so scheduling never calls malloc
// for a small callable.
//
// Who holds a node: the timer, from schedule until it is done with the task (ran, cancelled or
// handed back by stop()), and every `timeout` handle. The last one to let go frees the block. The
// task itself (the callable) is destroyed by whoever ends it: the runner after running it, the
// canceller, or stop(). So freeing a block never runs user code.
//
// Where a node is, and its state (status(), under the core's lock: the one question cancel(),
// reschedule(), the runner and stop() each ask first). Its place is read from `prev`: null, out of
// the timer; batch_mark(), in the batch a pass is about to run; window_mark() or heap_mark(), in a
// ring's near window (near_window.hpp); anything else, a list: a bucket or a staging lane. Its
// state is pending, expired or cancelled. The pairs that occur:
//
//   list or window, pending     waiting in the ring
//   list or window, cancelled   cancel() left it linked; the core's next bury() unlinks it
//   batch, pending              due, in a pass's batch, not yet claimed by the runner
//   out, pending                a periodic task running (its flag `running`), or a node stop() is
//                               taking (under the lock, for a moment)
//   out, expired or cancelled   done: ran, or cancelled (also while a batch's array still names
//                               it: the runner skips a node no longer marked)
//
// So a linked node is not always pending: a cancelled one may be linked, its task already
// destroyed.
//
// Who writes which field. Every write is under the core's lock, except where said.
//   prev, next   the ring (link, unlink, a pass's moves) and the core (the batch mark; cancel()
//                and the runner unmark a batch node); while a node is in a window, `next` holds
//                its index there; nobody reads `next` of a node out of the timer.
//   deadline     the core: init() before the node is published, store_deadline() (reschedule, a
//                periodic task's next run); handles read it without the lock (load_deadline()).
//   ops_state    the callable's operations: init() only. The state: whoever ends the task, once
//                (cancel(), the runner, stop(); stop() after it took the node, outside the lock:
//                nobody else writes a node stop() took), published with release for handles,
//                which read it without the lock. The periodic flags: the core (the runner,
//                cancel(), reschedule()), read under the lock only.
//   refs         atomic, by anyone who holds a reference (a handle, on any thread).
//   seq          the core: schedule, reschedule, a periodic task's next run.
// The callable, and the periodic repeat (periodic_part) that sits in front of a periodic task's
// callable, are read only while the task lives: by the runner while it runs or is claimed, by
// reschedule() and the runner's repeat while the task is pending. A cancelled or ended task's
// block is never read past its header: the flags that cancel() and reschedule() read are in the
// header (ops_state), not in the callable.
//
// Changing a node's place or state is a plain store under the lock, so cancel(), the runner and
// stop() decide who ends a task under that lock; the only read-modify-write on a node is its
// reference count.
//
// The core (timer_core) owns the node pool and is the part of a timer that outlives it for the
// handles' sake. Its owners (the timer object and its worker thread) hold it by `owners_`; when the
// last owner lets go, the pool is orphaned (node_pool::orphan) and the core lives on until the last
// node a handle still holds is freed. No count on the core is touched per node: only the node's
// own.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

#include "node_pool.hpp"

namespace delayq::detail {

/// What a periodic task does after a late run: the values of the public missed_tick
/// (<delayq/missed_tick.hpp>, which says what each does), in the same order.
enum class repeat_policy : std::uint8_t { skip, burst, delay };

enum class timer_state : std::uint8_t {
    pending = 0,    // in the timer, waiting for its deadline
    expired = 1,    // handed to run (it may be running or done)
    cancelled = 2,  // cancelled by a handle or by stop(); the task is gone
};

// The intrusive links of a node, and of a list's sentinel.
struct node_links {
    node_links* prev;  // where the node is: see status() above
    node_links* next;

    bool linked() const noexcept { return prev != nullptr; }

    /// The `prev` of a node in a pass's batch (wheel_core.hpp).
    static node_links* batch_mark() noexcept { return mark<0>(); }
    /// The `prev` of a node in a near window's sorted array, or its heap (near_window.hpp).
    static node_links* window_mark() noexcept { return mark<1>(); }
    static node_links* heap_mark() noexcept { return mark<2>(); }

  private:
    template <int I>
    static node_links* mark() noexcept {
        static node_links m{nullptr, nullptr};
        return &m;
    }
};

/// Where a node is (status(), above).
enum class node_place : std::uint8_t { out, list, batch, window };

/// The flags of a periodic task, in its node's header (who writes them: above).
enum class periodic_flag : std::uintptr_t {
    running = 4,   // handed to run: from the claim to the re-link (a burst's runs too)
    stopping = 8,  // cancelled while running: no re-link, the runner ends it
    moved = 16,    // rescheduled while running: the next run is at the repeat's `start`
};

template <class Clock>
struct timer_node;

template <class Clock>
struct periodic_part;

template <class Clock>
struct task_ops {
    void (*run)(timer_node<Clock>&);               // invokes the task (may throw)
    void (*destroy)(timer_node<Clock>&) noexcept;  // destroys the task, keeps the memory
    std::uint32_t size;                            // of the whole block (node_pool's size)
    std::uint32_t align;
    periodic_part<Clock>* (*periodic)(timer_node<Clock>&) noexcept;  // null: runs once
};

template <class Clock>
struct timer_node : node_links {
    using time_point = typename Clock::time_point;

    // ops_state: the operations' address (aligned to 32) | the periodic flags (bits 2-4) | the
    // state (bits 0-1).
    static constexpr std::uintptr_t state_mask = 3;
    static constexpr std::uintptr_t bits_mask = 31;

    // node_links: touched only under the core's lock
    time_point deadline;
    std::atomic<std::uintptr_t> ops_state;  // the callable's operations (aligned), | the state
    std::atomic<std::uint32_t> refs;  // the timer's (while it holds the node) + one per handle
    std::uint32_t seq;  // schedule order: first in, first out among equal deadlines (mod 2^32)

    /// Before the node is published: a pending task with `refs` references.
    void init(const task_ops<Clock>* ops, time_point d, std::uint32_t s, std::uint32_t r) noexcept {
        deadline = d;
        ops_state.store(reinterpret_cast<std::uintptr_t>(ops), std::memory_order_relaxed);
        refs.store(r, std::memory_order_relaxed);
        seq = s;
    }

    const task_ops<Clock>* ops() const noexcept {
        const std::uintptr_t bits = ops_state.load(std::memory_order_relaxed) & ~bits_mask;
        // NOLINTNEXTLINE(performance-no-int-to-ptr): the pointer stored by init(), state bits off
        return reinterpret_cast<const task_ops<Clock>*>(bits);
    }

    timer_state load_state() const noexcept {
        return static_cast<timer_state>(ops_state.load(std::memory_order_acquire) & state_mask);
    }

    /// For whoever won the node under the core's lock (the only writer): publishes its new state.
    void set_state(timer_state s) noexcept {
        const std::uintptr_t v = ops_state.load(std::memory_order_relaxed) & ~state_mask;
        ops_state.store(v | static_cast<std::uintptr_t>(s), std::memory_order_release);
    }

    /// Under the core's lock: where the node is.
    node_place place() const noexcept {
        if (prev == nullptr) return node_place::out;
        if (prev == batch_mark()) return node_place::batch;
        if (prev == window_mark() || prev == heap_mark()) return node_place::window;
        return node_place::list;
    }

    /// Under the core's lock: where the node is, and its state (see the top of this header).
    struct status_t {
        node_place place;
        timer_state state;
    };
    status_t status() const noexcept {
        return {place(),
                static_cast<timer_state>(ops_state.load(std::memory_order_relaxed) & state_mask)};
    }

    /// Under the core's lock: a periodic task's flag.
    bool has(periodic_flag f) const noexcept {
        return (ops_state.load(std::memory_order_relaxed) & static_cast<std::uintptr_t>(f)) != 0;
    }
    void set(periodic_flag f, bool on) noexcept {
        const std::uintptr_t v = ops_state.load(std::memory_order_relaxed);
        const auto b = static_cast<std::uintptr_t>(f);
        ops_state.store(on ? v | b : v & ~b, std::memory_order_release);
    }

    /// Whether the task repeats (a property of its type: readable whether or not it lives).
    bool is_periodic() const noexcept { return ops()->periodic != nullptr; }

    void acquire() noexcept { refs.fetch_add(1, std::memory_order_relaxed); }

    /// Drops one reference; true if it was the last (the caller frees the block).
    [[nodiscard]] bool drop() noexcept { return refs.fetch_sub(1, std::memory_order_acq_rel) == 1; }

    /// Seq order, robust to wrap-around: a before b when a was scheduled less than 2^31
    /// schedules before b.
    static bool seq_before(std::uint32_t a, std::uint32_t b) noexcept {
        return static_cast<std::int32_t>(a - b) < 0;
    }
    /// The heap's order: deadline, then first in, first out.
    static bool before(const timer_node& a, const timer_node& b) noexcept {
        return a.deadline < b.deadline || (a.deadline == b.deadline && seq_before(a.seq, b.seq));
    }

    static timer_node* of(node_links* l) noexcept { return static_cast<timer_node*>(l); }

    void run() { ops()->run(*this); }
    void destroy_task() noexcept { ops()->destroy(*this); }

    /// The repeat of a periodic task; null for one that runs once. In the callable's block: only
    /// while the task lives.
    periodic_part<Clock>* periodic() noexcept {
        const auto* o = ops();
        return o->periodic ? o->periodic(*this) : nullptr;
    }

    /// The deadline, from any thread (reschedule() moves it under the core's lock).
    time_point load_deadline() const noexcept {
        return std::atomic_ref<time_point>(const_cast<time_point&>(deadline))
            .load(std::memory_order_relaxed);
    }
    /// Under the core's lock: a new deadline.
    void store_deadline(time_point d) noexcept {
        std::atomic_ref<time_point>(deadline).store(d, std::memory_order_relaxed);
    }
};

/// What a periodic task keeps besides its callable (its flags are in the node's header). The k-th
/// run is due at start + k * period (computed, not summed: no drift); a run whose successor would
/// lie past time_point::max() is the last. `policy` says what a late run does to the next. Touched
/// only under the core's lock, while the task lives.
template <class Clock>
struct periodic_part {
    typename Clock::time_point start;
    typename Clock::duration period;
    std::uint64_t k = 0;  // the run now scheduled is the k-th
    repeat_policy policy;
};

static_assert(sizeof(timer_node<std::chrono::steady_clock>) == 40, "a node header is 40 bytes");

template <class Clock, class F>
struct periodic_task;

template <class F>
inline constexpr bool is_periodic_task = false;
template <class Clock, class F>
inline constexpr bool is_periodic_task<periodic_task<Clock, F>> = true;

// A node and its callable in one block (for a periodic task, the callable is a periodic_task).
template <class Clock, class F>
struct node_with final : timer_node<Clock> {
    union {
        F fn;  // alive from schedule until the task is ended
    };

    // clang-format off
    template <class G>
        requires(!std::is_same_v<std::remove_cvref_t<G>, node_with>)
    explicit node_with(G&& g)  // NOLINT(bugprone-forwarding-reference-overload): constrained
        : fn(std::forward<G>(g)) {}
    // clang-format on
    /// A periodic task: its repeat and its callable, built in place.
    template <class G>
    node_with(periodic_part<Clock> every, G&& g) : fn{every, std::forward<G>(g)} {}
    node_with(const node_with&) = delete;
    node_with& operator=(const node_with&) = delete;
    ~node_with() {}

    static void run(timer_node<Clock>& n) { static_cast<node_with&>(n).fn(); }
    static void destroy(timer_node<Clock>& n) noexcept { static_cast<node_with&>(n).fn.~F(); }
    static periodic_part<Clock>* repeat([[maybe_unused]] timer_node<Clock>& n) noexcept {
        if constexpr (is_periodic_task<F>) {
            return &static_cast<node_with&>(n).fn.every;
        } else {
            return nullptr;  // never called: the table holds no pointer to it
        }
    }

    // aligned so that the state and the periodic flags fit in the low bits of a pointer to it
    alignas(32) static constexpr task_ops<Clock> table{&run, &destroy, sizeof(node_with),
                                                       alignof(node_with),
                                                       is_periodic_task<F> ? &repeat : nullptr};
};

// A periodic task's callable: its repeat in front of the user's callable.
template <class Clock, class F>
struct periodic_task {
    periodic_part<Clock> every;
    F fn;
    void operator()() { fn(); }
};

/// The part of a timer that handles reach: its node pool, and cancel(). Owned by the timer and its
/// worker (owners_); outlives them while handles hold nodes (see the top of this header).
template <class Clock>
class timer_core {
  public:
    using node = timer_node<Clock>;

    timer_core(const timer_core&) = delete;
    timer_core& operator=(const timer_core&) = delete;

    /// Cancels n if it is still pending: counts it out and marks it under the core's lock, and
    /// destroys its task before it returns (the node is unlinked, and the timer's reference
    /// dropped, later). Returns whether this call cancelled it.
    virtual bool cancel(node& n) noexcept = 0;

    /// Moves n, if still pending, to `deadline`, keeping its task; false (nothing changed) if it
    /// ran, runs (a one-shot task), or was cancelled. Throws std::bad_alloc (nothing changed).
    virtual bool reschedule(node& n, typename Clock::time_point deadline) = 0;

    /// Hands `e` to the timer's on_error on the calling thread, from any thread, also after the
    /// timer is stopped or destroyed: for a task that throws where no pass runs it (a coroutine
    /// resumed by stop() or the destructor, see coro.hpp). An on_error that throws is ignored.
    virtual void report_error(std::exception_ptr e) noexcept = 0;

    /// Drops one reference to n, from any thread; the last one frees the block.
    static void release(node& n) noexcept {
        if (n.drop()) free_block(n);
    }

    /// Frees the block of a node nobody references any more, from any thread.
    static void free_block(node& n) noexcept {
        node_pool::deallocate(&n, n.ops()->size, n.ops()->align);
    }

    void add_owner() noexcept { owners_.fetch_add(1, std::memory_order_relaxed); }

    /// An owner lets go. The last one orphans the pool: the core is deleted now if no node is
    /// left, else by whoever frees the last node.
    void drop_owner() noexcept {
        if (owners_.fetch_sub(1, std::memory_order_acq_rel) == 1 && pool_.orphan()) destroy(this);
    }

  protected:
    timer_core() : pool_(&destroy, this) {}
    virtual ~timer_core() = default;

    node_pool pool_;  // under the derived core's lock, except deallocate()

  private:
    static void destroy(void* self) noexcept { delete static_cast<timer_core*>(self); }

    std::atomic<std::uint32_t> owners_{1};
};

/// Hands an error to on_error; an on_error that throws (or none) is ignored: the timer carries on.
inline void report_error(const std::function<void(std::exception_ptr)>& on_error,
                         std::exception_ptr e) noexcept {
    if (!on_error) return;
    try {
        on_error(std::move(e));
    } catch (...) {
    }
}

/// Runs n's task. What it throws goes to on_error (report_error).
template <class Clock>
void run_reporting(timer_node<Clock>& n,
                   const std::function<void(std::exception_ptr)>& on_error) noexcept {
    try {
        n.run();
    } catch (...) {
        report_error(on_error, std::current_exception());
    }
}

}  // namespace delayq::detail
