// delay_queue<T, Clock>: an unbounded blocking queue whose elements can be taken only once their
// deadline has passed. The JDK's DelayQueue, done for C++.
//
// The idea. A min-heap ordered by (deadline, insertion number) keeps the earliest element at the
// top, with ties in first-in, first-out order. It is four-ary (a node's four children side by
// side): half the levels of a binary heap for a put that rises or a take that sinks. A put
// compares the new element with its parent before moving anything, so deadlines put in
// increasing order (the common case) move nothing. One mutex guards it. Takers use the
// leader-follower pattern: at most one taker, the leader, sleeps until the head's deadline; every
// other taker sleeps without a timeout. When the head becomes due the leader takes it and, leaving,
// wakes one follower to become the next leader. A put that installs a new, earlier head deposes the
// leader and wakes one taker, which leads again against the new deadline. So one element coming due
// wakes one thread, not all of them, and only one thread at a time holds a timer.
//
// Details worth knowing:
// - An element's deadline is read once, when it is put; changing it afterwards has no effect on
//   the queue.
// - Takers sleep through Clock (detail/wait.hpp), so with manual_clock a test wakes them by moving
//   the clock.
// - Elements whose move may throw are kept boxed, so that sifting the heap never throws and `put`
//   has the strong guarantee: a throwing copy, move or allocation leaves the queue as it was.
// - A thread that takes with a timer wakes up to ~50 µs late under Linux's default timer slack;
//   `prctl(PR_SET_TIMERSLACK, 1)` on that thread removes most of it.
// - `close()` closes and wakes every taker before it hands anything back. If handing back throws
//   (allocating the vector, an element's copy or move), every element stays in the queue, in
//   order, and a later `close()` returns them. An element whose move may throw is copied out when
//   it is copyable, as std::vector does when it grows; a move-only one is moved out, and moved
//   back if a later one's move throws.
// - A taker whose sleep throws (a Clock's wait hook may) lets the exception out of `take()`
//   having taken nothing; it stops leading and hands the lead on.
// - `clear()` and a `remove_if()` that removes the head wake the takers, so that the leader
//   sleeps on the new head's deadline (or without a timer) rather than on the old one.
// - The clock going backwards (`manual_clock::set` to an earlier time, `system_clock` stepped
//   back): due is `deadline <= Clock::now()` as the clock reads at each check, so an element due
//   before the step is not due again until the clock comes back, and is then handed out as usual;
//   nothing is lost or reordered. A sleeping leader waits for the clock to reach the head's
//   deadline (manual_clock's `set()` wakes it to look). The limits of `take_for()`/`take_until()`
//   are points on the clock (`take_for`: now + d at the call), so a step back lengthens them.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <utility>
#include <vector>

#include "delayed.hpp"
#include "detail/spin_lock.hpp"
#include "detail/time.hpp"
#include "detail/wait.hpp"

namespace delayq {

namespace detail {

// T from args: with parentheses, or with braces for an aggregate such as delayed<V> (clang 14 has
// no parenthesized aggregate initialization).
template <class T, class... A>
concept constructible = std::is_constructible_v<T, A...> || requires(A&&... a) {
    T{std::forward<A>(a)...};
};

template <class T, class... A>
T construct(A&&... args) {
    if constexpr (std::is_constructible_v<T, A...>) {
        return T(std::forward<A>(args)...);
    } else {
        return T{std::forward<A>(args)...};
    }
}

}  // namespace detail

/// An unbounded blocking queue whose elements can be taken only once their deadline has passed:
/// the JDK's DelayQueue, done for C++ (see the top of this header for how it works).
///
/// `T` is any `Delayed<T, Clock>` type (a `deadline()` member, an ADL `deadline(x)`, a pointer
/// to one, or `delayed<V, Clock>`); move-only types work. Elements leave in deadline order, first
/// in, first out among equal deadlines; an element's deadline is read once, when it is put.
///
/// Thread safety: every member may be called from any number of threads at once (one mutex).
/// Complexity: N is the number of elements held. Elements whose move may throw are kept boxed
/// (one allocation each), so that the heap never throws while it sifts.
template <class T, class Clock = std::chrono::steady_clock>
requires Delayed<T, Clock>
class delay_queue {
  public:
    using value_type = T;                           ///< the element type
    using clock = Clock;                            ///< the clock deadlines and waits are read on
    using time_point = typename Clock::time_point;  ///< a point on `clock`
    using duration = typename Clock::duration;      ///< a duration on `clock`

    /// An empty, open queue. Allocates nothing.
    delay_queue() = default;
    delay_queue(const delay_queue&) = delete;
    delay_queue& operator=(const delay_queue&) = delete;

    /// Inserts `v`, due at `deadline_of(v)`. Returns false once the queue is closed, and then `v`
    /// is left untouched (not moved from): nothing is lost.
    ///
    /// Wakes one blocked taker when `v` becomes the new head. Complexity: O(log N); the storage
    /// doubles when full (amortized O(1) allocations; reserve() avoids them). Throws: what
    /// reading the deadline, moving `v` or allocating throws; then the queue is unchanged (strong
    /// guarantee).
    bool put(T&& v) { return emplace(std::move(v)); }
    /// As put(T&&), copying `v`. Throws what the copy throws (the queue is then unchanged).
    bool put(const T& v) { return emplace(v); }

    /// Constructs an element in place from `args` (with parentheses, or braces for an aggregate
    /// such as delayed<V>) and inserts it. Returns false once the queue is closed (nothing is
    /// constructed). As put(): O(log N), strong guarantee.
    template <class... A>
    requires detail::constructible<T, A...>
    bool emplace(A&&... args) {
        std::unique_lock lk = lock();
        if (closed_) return false;
        if (heap_.size() == heap_.capacity()) grow();
        heap_.emplace_back(seq_, std::forward<A>(args)...);  // strong: capacity is there
        ++seq_;
        if (sift_up(heap_.size() - 1) == 0) {
            leader_ = nullptr;  // the leader sleeps for a later deadline: depose it
            wake_one();
        }
        return true;
    }

    /// Blocks until the head is due and returns it, moved out. Returns nullopt only when the
    /// queue is closed (also while waiting: close() wakes every taker) or `stop` is requested.
    ///
    /// Only one blocked taker (the leader) sleeps with a timer, on the head's deadline; the others
    /// sleep without one. With manual_clock, moving the clock wakes it. Complexity: O(log N) to
    /// remove the head. Throws: what moving the element out throws (the element then stays), or
    /// what the Clock's wait hook throws (nothing is taken).
    std::optional<T> take(std::stop_token stop = {}) { return take_impl(std::move(stop), nullptr); }

    /// As take(), but gives up (nullopt) once Clock reaches `limit`; a `limit` in the past polls.
    std::optional<T> take_until(time_point limit, std::stop_token stop = {}) {
        return take_impl(std::move(stop), &limit);
    }

    /// As take(), but gives up (nullopt) after `d`, measured on Clock from this call
    /// (saturating: `duration::max()` waits without limit; `d <= 0` polls).
    template <class Rep, class Period>
    std::optional<T> take_for(std::chrono::duration<Rep, Period> d, std::stop_token stop = {}) {
        return take_until(detail::deadline_after<Clock>(d), std::move(stop));
    }

    /// The head, moved out, if it is due (deadline <= Clock::now()); else nullopt. Never
    /// blocks. O(log N). Throws what moving the element out throws (it then stays).
    std::optional<T> poll() { return poll(Clock::now()); }

    /// The head if its deadline is at or before `now` (a reading of Clock the caller took once,
    /// e.g. for a batch of polls), else nullopt. Never blocks.
    std::optional<T> poll(time_point now) {
        std::unique_lock lk = lock();
        if (heap_.empty() || now < heap_.front().at) return std::nullopt;
        return pop_front();
    }

    /// The head's deadline, due or not; nullopt when empty. O(1). Never blocks, except on the
    /// lock.
    std::optional<time_point> next_deadline() const {
        std::unique_lock lk(m_);
        if (heap_.empty()) return std::nullopt;
        return heap_.front().at;
    }

    /// A copy of the head, due or not; nullopt when empty. Only for copyable T. O(1). Throws
    /// what the copy throws.
    std::optional<T> peek() const requires std::is_copy_constructible_v<T> {
        std::unique_lock lk(m_);
        if (heap_.empty()) return std::nullopt;
        return std::optional<T>(std::in_place, value(heap_.front()));
    }

    /// Moves every element due now (at most `max`) to `out`, earliest first, and returns how
    /// many. Never blocks. Complexity: O(k log N) for k elements.
    ///
    /// Precondition: `out` must not call back into this queue (it is written under the lock).
    /// Throws: what writing to `out` or moving an element throws; the elements written before
    /// stay written and out of the queue, the rest stay in it.
    template <class OutIt>
    std::size_t drain_to(OutIt out, std::size_t max = SIZE_MAX) {
        std::unique_lock lk(m_);
        if (heap_.empty()) return 0;
        const time_point now = Clock::now();
        std::size_t n = 0;
        while (n < max && !heap_.empty() && heap_.front().at <= now) {
            *out = std::move(value(heap_.front()));
            ++out;
            pop_top();
            ++n;
        }
        return n;
    }

    /// Removes every element, due or not, for which `pred(element)` is true; returns how many.
    /// The removed elements are destroyed after the lock is released. Complexity: O(N) calls of
    /// `pred`, and O(N) to rebuild the heap when anything is removed.
    ///
    /// Precondition: `pred` must not call back into this queue. Throws: what `pred` or an
    /// allocation throws; then nothing is removed.
    template <class Pred>
    std::size_t remove_if(Pred pred) {
        std::vector<entry> removed;  // destroyed after the lock is released
        std::unique_lock lk(m_);
        std::vector<bool> hit(heap_.size());
        std::size_t count = 0;
        for (std::size_t i = 0; i < heap_.size(); ++i) {
            const T& v = value(heap_[i]);
            if (pred(v)) {
                hit[i] = true;
                ++count;
            }
        }
        if (count == 0) return 0;
        const bool head_removed = hit[0];
        removed.reserve(count);
        std::size_t keep = 0;
        for (std::size_t i = 0; i < heap_.size(); ++i) {
            if (hit[i]) {
                removed.push_back(std::move(heap_[i]));
            } else {
                if (keep != i) heap_[keep] = std::move(heap_[i]);
                ++keep;
            }
        }
        heap_.erase(heap_.begin() + static_cast<std::ptrdiff_t>(keep), heap_.end());
        heapify();
        if (head_removed) depose_leader();
        return count;
    }

    /// How many elements are held, due or not. O(1).
    std::size_t size() const {
        std::unique_lock lk(m_);
        return heap_.size();
    }

    /// size() == 0. O(1).
    bool empty() const { return size() == 0; }

    /// Makes room for `n` elements in all, so that puts up to that size do not allocate (an
    /// element that must be boxed still allocates its box). Throws what the allocation throws;
    /// then nothing changed.
    void reserve(std::size_t n) {
        std::unique_lock lk(m_);
        heap_.reserve(n);
    }

    /// How many threads are blocked in take(), take_for() or take_until() right now (for tests
    /// and metrics). O(1).
    std::size_t waiting_takers() const {
        std::unique_lock lk(m_);
        return sleepers_ + stoppable_sleepers_;
    }

    /// Destroys every element (after releasing the lock), due or not; the queue stays open. A
    /// leader sleeping on the old head is woken to sleep without a timer. O(N). Never throws.
    void clear() {
        std::vector<entry> gone;  // destroyed after the lock is released
        std::unique_lock lk(m_);
        gone.swap(heap_);
        if (!gone.empty()) depose_leader();
    }

    /// Refuses further puts, wakes every blocked taker (they return nullopt) and hands back every
    /// element still held, earliest first. Idempotent: later calls return what is still held, which
    /// is nothing unless handing back failed.
    ///
    /// Closing and the wake-up come first and cannot fail. Handing back can (the allocation of the
    /// vector, an element's copy or move): then the exception propagates, the queue is closed and
    /// still holds every element, in order, and a later close() hands them back.
    ///
    /// Complexity: O(N log N) (the elements are sorted).
    std::vector<T> close() {
        std::vector<entry> gone;  // destroyed after the lock is released
        std::vector<T> out;
        std::unique_lock lk(m_);
        closed_ = true;
        leader_ = nullptr;
        cv_.notify_all();
        cv_any_.notify_all();
        // Sorted is a heap too: if handing back throws, heap_ is still valid.
        std::sort(heap_.begin(), heap_.end(), before);
        out.reserve(heap_.size());
        hand_back(out);
        gone.swap(heap_);
        return out;
    }

    /// Whether close() has been called. O(1).
    bool closed() const {
        std::unique_lock lk(m_);
        return closed_;
    }

  private:
    // Sifting moves elements, so it must not throw: elements whose move may throw are boxed.
    static constexpr bool in_place =
        std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T>;
    using stored = std::conditional_t<in_place, T, std::unique_ptr<T>>;

    struct entry {
        time_point at;
        std::uint64_t seq;
        stored v;

        template <class... A>
        entry(std::uint64_t s, A&&... args) : seq(s), v(make(std::forward<A>(args)...)) {
            at = deadline_of(get());
        }
        entry(entry&&) noexcept = default;
        entry& operator=(entry&&) noexcept = default;

        template <class... A>
        static stored make(A&&... args) {
            if constexpr (in_place) {
                return detail::construct<T>(std::forward<A>(args)...);
            } else {
                if constexpr (std::is_constructible_v<T, A...>) {
                    return std::make_unique<T>(std::forward<A>(args)...);
                } else {
                    return std::unique_ptr<T>(new T{std::forward<A>(args)...});
                }
            }
        }
        T& get() noexcept {
            if constexpr (in_place)
                return v;
            else
                return *v;
        }
        const T& get() const noexcept {
            if constexpr (in_place)
                return v;
            else
                return *v;
        }
    };

    // The lock, for put, poll and take: held for a sift of the heap, so a thread that finds it
    // taken tries again with backoff before it sleeps in the kernel (detail/spin_lock.hpp): two
    // threads putting at once then cost about what one does, rather than a futex sleep per put.
    std::unique_lock<std::mutex> lock() const {
        detail::lock_with_backoff(m_);
        return std::unique_lock<std::mutex>(m_, std::adopt_lock);
    }

    static T& value(entry& e) noexcept { return e.get(); }
    static const T& value(const entry& e) noexcept { return e.get(); }

    static bool before(const entry& a, const entry& b) noexcept {
        return a.at < b.at || (a.at == b.at && a.seq < b.seq);
    }

    // Doubles the storage before a put (out of line: rare, and the put's code stays short).
    [[gnu::noinline]] void grow() { heap_.reserve(std::max<std::size_t>(16, 2 * heap_.size())); }

    // Four children a node: half the levels of a binary heap, so a put that rises and a take that
    // sinks visit half as many nodes, and a node's four children lie side by side in memory.
    static constexpr std::size_t arity = 4;

    // Returns the index where the element at i came to rest. It is compared with its parent before
    // anything moves: an element due no earlier than its parent (deadlines put in increasing
    // order, the common case) stays where it was put, and nothing is moved at all.
    std::size_t sift_up(std::size_t i) noexcept {
        if (i == 0 || !before(heap_[i], heap_[(i - 1) / arity])) return i;
        entry e = std::move(heap_[i]);
        do {
            const std::size_t parent = (i - 1) / arity;
            heap_[i] = std::move(heap_[parent]);
            i = parent;
        } while (i > 0 && before(e, heap_[(i - 1) / arity]));
        heap_[i] = std::move(e);
        return i;
    }

    // Puts `e` into the hole at i (an element moved from), below which heap_ is a heap, moving the
    // earliest child up while it is due before `e`.
    void sift_down(std::size_t i, entry&& e) noexcept {
        const std::size_t n = heap_.size();
        for (;;) {
            const std::size_t first = arity * i + 1;
            if (first >= n) break;
            const std::size_t last = std::min(first + arity, n);
            std::size_t c = first;
            for (std::size_t k = first + 1; k < last; ++k) {
                if (before(heap_[k], heap_[c])) c = k;
            }
            if (!before(heap_[c], e)) break;
            heap_[i] = std::move(heap_[c]);
            i = c;
        }
        heap_[i] = std::move(e);
    }

    void pop_top() noexcept {
        entry last = std::move(heap_.back());
        heap_.pop_back();
        if (!heap_.empty()) sift_down(0, std::move(last));
    }

    // Makes heap_ a heap again after remove_if() compacted it: O(N).
    void heapify() noexcept {
        const std::size_t n = heap_.size();
        if (n < 2) return;
        for (std::size_t i = (n - 2) / arity + 1; i-- > 0;) {
            entry e = std::move(heap_[i]);
            sift_down(i, std::move(e));
        }
    }

    // The head, moved out. If moving it throws, the queue is unchanged.
    std::optional<T> pop_front() {
        std::optional<T> out(std::in_place, std::move(value(heap_.front())));
        pop_top();
        return out;
    }

    // Appends every element of heap_, in heap_'s order, to `out`, whose capacity is reserved. All
    // or nothing: if it throws, heap_ still holds every element (but see the move-only case).
    void hand_back(std::vector<T>& out) {
        if constexpr (std::is_nothrow_move_constructible_v<T> || std::is_copy_constructible_v<T>) {
            // A move that cannot throw, or else a copy (as std::vector does when it grows): the
            // originals stay as they are until the last one is handed over.
            for (entry& e : heap_) out.push_back(std::move_if_noexcept(value(e)));
        } else {
            // Move-only, with a move that may throw: if one does, the elements moved so far go
            // back, each into a new box (T need not be assignable). Should a move back throw too,
            // that element stays in the queue as the failed move left it: nothing better exists.
            std::size_t moved = 0;
            try {
                for (; moved < heap_.size(); ++moved) out.push_back(std::move(value(heap_[moved])));
            } catch (...) {
                for (std::size_t i = 0; i < moved; ++i) {
                    try {
                        heap_[i].v = std::make_unique<T>(std::move(out[i]));
                    } catch (...) {  // the first exception is the one to report
                    }
                }
                throw;
            }
        }
    }

    // The head was removed: the next one is due later, or there is none, so a leader asleep on the
    // old deadline would wake for nothing (or keep a timer on an empty queue). Depose it and wake
    // every taker, on both condition variables since the leader cannot be woken alone; one of them
    // leads again, on the new head. Only clear() and remove_if() come here, so the simple way.
    void depose_leader() noexcept {
        if (leader_ == nullptr) return;
        leader_ = nullptr;
        cv_.notify_all();
        cv_any_.notify_all();
    }

    // Wakes one sleeping taker, whichever condition variable it sleeps on.
    void wake_one() {
        if (sleepers_ > 0) {
            cv_.notify_one();
        } else if (stoppable_sleepers_ > 0) {
            cv_any_.notify_one();
        }
    }

    // A Clock's wait hook may throw (manual_clock's bookkeeping allocates); like the condition
    // variables' own waits, it returns and throws with the lock held.
    void sleep(std::unique_lock<std::mutex>& lk, const std::stop_token& stop, time_point until) {
        const bool stoppable = stop.stop_possible();
        // Counted while asleep, and uncounted however the wait ends: wake_one() trusts the counts.
        std::size_t& count = stoppable ? stoppable_sleepers_ : sleepers_;
        ++count;
        struct uncount {
            std::size_t& n;
            ~uncount() { --n; }
        } guard{count};
        if (stoppable) {
            detail::wait_until<Clock>(cv_any_, lk, until, stop);
        } else {
            detail::wait_until<Clock>(cv_, lk, until);
        }
    }

    std::optional<T> take_impl(std::stop_token stop, const time_point* limit) {
        std::unique_lock lk = lock();
        const char self = 0;  // identifies this call as the leader
        // However this call ends, a return or an exception out of sleep(), it no longer leads; and
        // whoever leaves with no leader in place and elements still held hands the lead on.
        struct hand_over {
            delay_queue& q;
            const void* self;
            ~hand_over() {
                if (q.leader_ == self) q.leader_ = nullptr;
                if (q.leader_ == nullptr && !q.heap_.empty()) q.wake_one();
            }
        } guard{*this, &self};

        for (;;) {
            if (closed_ || stop.stop_requested()) return std::nullopt;
            time_point until = time_point::max();
            bool leading = false;
            if (!heap_.empty()) {
                const time_point now = Clock::now();
                if (heap_.front().at <= now) return pop_front();
                if (limit && *limit <= now) return std::nullopt;
                if (leader_ == nullptr) {
                    leader_ = &self;
                    leading = true;
                    until = heap_.front().at;
                }
            } else if (limit && *limit <= Clock::now()) {
                return std::nullopt;
            }
            if (limit) until = std::min(until, *limit);
            sleep(lk, stop, until);
            if (leading && leader_ == &self) leader_ = nullptr;
        }
    }

    mutable std::mutex m_;
    std::condition_variable cv_;          // takers without a stop_token
    std::condition_variable_any cv_any_;  // takers with one
    std::vector<entry> heap_;
    std::uint64_t seq_ = 0;
    const void* leader_ = nullptr;  // the taker sleeping on the head's deadline, if any
    std::size_t sleepers_ = 0;
    std::size_t stoppable_sleepers_ = 0;
    bool closed_ = false;
};

}  // namespace delayq
