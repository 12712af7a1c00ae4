// hierarchical_timing_wheel<Clock>: Kafka's SystemTimer + TimingWheel, driven by delayq's own
// delay_queue.
//
// The algorithm. Time is counted in ticks from an origin (the start time rounded down to the tick
// grid). A task due at time d belongs to tick u = ceil((d - origin) / tick): the first grid point
// at or after d. Level 0 is a ring of `wheel_size` buckets, one tick each; level k+1 is a ring of
// `wheel_size` buckets each as wide as the whole of level k, and is created only when a task needs
// it. Each level has a current time (its own tick grid, rounded down). A task goes to the finest
// level whose span from that level's current time covers u, into the bucket of u; the bucket's
// expiry is the start of its span (u rounded down to the level's tick). A bucket holds its task
// nodes in circular intrusive lists (O(1) insert and cancel). Whenever an insertion gives a bucket
// a new expiry, a reference to the bucket is put into a delay_queue<bucket_ref, Clock>: buckets
// model Delayed, and the queue that serves as a heap of elements serves as the wheel's clock.
// advance_clock() takes the first due bucket from that queue (sleeping until one is due, up to a
// limit), moves every level's current time up to the bucket's expiry, empties the bucket and
// re-inserts each task: a task whose tick u has been reached becomes ready and runs; the others
// fall to a finer level. Then every other due bucket is taken without blocking. Empty ticks cost
// nothing: no bucket, no wake-up.
//
//              level 2: tick 25, span 125     [ 0  | 25 | 50 | 75 | 100 ]
//                                                     |  flushed at 25: its tasks re-insert
//              level 1: tick 5,  span 25      [ 25 | 30 | 35 | 40 | 45 ]
//                                                  |  flushed at 30
//              level 0: tick 1,  span 5       [ 30 | 31 | 32 | 33 | 34 ]
//                                                    |  flushed at 31: tasks with u <= 31 run
//     delay_queue<bucket_ref>:  (31, L0)  (35, L1)  (50, L2)  ...  only non-empty buckets
//
// Never early. Kafka keys a task by its deadline rounded *down* and runs a bucket when its start
// is reached, so a task can run up to one tick before its deadline. Here a task is keyed by its
// deadline rounded *up* to the tick grid (u above), and runs only once the wheel's level-0 time has
// reached u, which happens only when the delay queue hands out a bucket whose expiry, on Clock,
// has passed. So every task runs at or after its deadline, and less than one tick after it plus
// the time to wake up. (A deadline within one tick of time_point::max() is "never".)
//
// Details:
// - One lock (the core's) guards the levels; the delay queue has its own (order: core, then queue).
//   advance_clock() takes buckets without the core lock, flushes them under it, and runs each task
//   with no lock held. Only one thread advances at a time; a call from inside a task returns false.
// - A task that is due when scheduled goes to a "ready" bucket that is queued as already due, so it
//   runs in the next advance_clock(), never inside schedule(). A task that a task schedules runs in
//   a later advance_clock(), so one call does a bounded amount of work.
// - When a bucket is flushed, a task whose tick has already passed on Clock (the driver was late,
//   or the clock jumped) runs straight away instead of falling level by level: a late driver pays
//   one flush per task, not one per level.
// - The tasks a flush makes due sit in an array until each one runs and stay cancellable until the
//   moment it starts: cancelling a task whose bucket is being flushed works (cancel() returns true,
//   the task never runs). The array lets the runner prefetch the nodes ahead.
// - A bucket's tasks are spread over a few lists ("lanes") that a flush walks in turn, prefetching
//   each lane's next node: a flush waits for several cache misses at once rather than one after the
//   other down one long list.
// - Buckets whose tasks were all cancelled stay in the delay queue until due (as in Kafka) and are
//   then flushed empty; when the last pending task is cancelled the queue is cleared, so an idle
//   timer sleeps without a deadline (the reaper may wake once more, at the old head's deadline).
// - The reaper thread (own_thread = true) sets Linux timer slack to 1 ns, so it wakes within a few
//   microseconds of a bucket's expiry rather than up to 50 µs late.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "delay_queue.hpp"
#include "detail/time.hpp"
#include "detail/timer_node.hpp"
#include "detail/wait.hpp"
#include "timeout.hpp"

namespace delayq {

/// Options of hierarchical_timing_wheel<Clock> (also reachable as
/// hierarchical_timing_wheel<Clock>::options).
template <class Clock = std::chrono::steady_clock>
struct hierarchical_timing_wheel_options {
    using duration = typename Clock::duration;

    duration tick = std::chrono::duration_cast<duration>(std::chrono::milliseconds(1));  // > 0
    std::size_t wheel_size = 20;                       // > 1 (and at most 2^24)
    std::size_t max_pending = 0;                       // 0 = unbounded
    std::function<void(std::exception_ptr)> on_error;  // a task that throws; the wheel carries on
    bool own_thread = true;                            // false: the caller drives advance_clock()
};

namespace detail {

// A circular intrusive list of nodes with a sentinel. Unlinking needs only the node's own links.
template <class Clock>
struct htw_list {
    timer_node<Clock> head;

    htw_list() noexcept { head.prev = head.next = &head; }
    htw_list(const htw_list&) = delete;
    htw_list& operator=(const htw_list&) = delete;

    bool empty() const noexcept { return head.next == &head; }

    void push_back(timer_node<Clock>* n) noexcept {
        n->prev = head.prev;
        n->next = &head;
        head.prev->next = n;
        head.prev = n;
    }

    void clear() noexcept { head.prev = head.next = &head; }

    // Empties the list and returns its nodes as a null-terminated chain (nullptr if empty).
    timer_node<Clock>* detach() noexcept {
        if (empty()) return nullptr;
        timer_node<Clock>* first = head.next;
        head.prev->next = nullptr;
        clear();
        return first;
    }

    // Appends every node of `from` (emptied).
    void splice_back(htw_list& from) noexcept {
        if (from.empty()) return;
        timer_node<Clock>* first = from.head.next;
        timer_node<Clock>* last = from.head.prev;
        first->prev = head.prev;
        head.prev->next = first;
        last->next = &head;
        head.prev = last;
        from.clear();
    }
};

// A bucket: its tasks spread round-robin over a few lists ("lanes"). A flush walks the lanes in
// turn and prefetches each lane's next node, so that it waits for several cache misses at once
// instead of one after the other down a single list (pointer chasing is what a flush of a large
// bucket costs). Insertion order is kept across lanes as long as nothing is cancelled.
template <class Clock>
struct htw_bucket {
    static constexpr std::size_t lanes = 16;

    htw_list<Clock> lane[lanes];
    std::uint64_t expiry = 0;  // in ticks from the origin; meaningful while queued
    std::uint64_t gen = 0;     // bumped at each put into the delay queue
    std::uint64_t epoch = 0;   // the core's epoch at that put
    unsigned next_lane = 0;
    bool queued = false;  // a reference with this gen is in the delay queue

    htw_bucket() noexcept = default;
    htw_bucket(const htw_bucket&) = delete;
    htw_bucket& operator=(const htw_bucket&) = delete;

    bool empty() const noexcept {
        for (const auto& l : lane)
            if (!l.empty()) return false;
        return true;
    }

    void push_back(timer_node<Clock>* n) noexcept {
        lane[next_lane].push_back(n);
        next_lane = (next_lane + 1) % lanes;
    }

    // Calls f(node) for every node, emptying the bucket first (f may insert elsewhere). Lanes are
    // visited in turn, each lane's next node prefetched while the others are handled.
    template <class F>
    void drain(F&& f) {
        timer_node<Clock>* cur[lanes];
        for (std::size_t i = 0; i < lanes; ++i) cur[i] = lane[i].detach();
        next_lane = 0;
        for (bool more = true; more;) {
            more = false;
            for (timer_node<Clock>*& slot : cur) {
                timer_node<Clock>* n = slot;
                if (!n) continue;
                timer_node<Clock>* next = n->next;
                if (next) __builtin_prefetch(next, 1);
                slot = next;
                more = true;
                f(n);
            }
        }
    }
};

// What the delay queue holds: a bucket and the expiry it had when it was put. A reference whose
// generation no longer matches its bucket's is stale and is skipped.
template <class Clock>
struct htw_bucket_ref {
    htw_bucket<Clock>* bucket;
    typename Clock::time_point at;
    std::uint64_t gen;
    std::uint64_t epoch;

    typename Clock::time_point deadline() const noexcept { return at; }
};

inline std::uint64_t htw_sat_add(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}
inline std::uint64_t htw_sat_mul(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}

// The shared state of a hierarchical_timing_wheel: the levels, the bucket queue and the lock.
// Reference-counted (timer_core): the timer, its reaper thread and every live node hold it.
template <class Clock>
class htw_core final : public timer_core<Clock> {
  public:
    using node = timer_node<Clock>;
    using bucket = htw_bucket<Clock>;
    using bucket_ref = htw_bucket_ref<Clock>;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using rep = typename duration::rep;

    htw_core(const hierarchical_timing_wheel_options<Clock>& o, time_point start)
        : tick_(o.tick),
          tick_count_(static_cast<std::uint64_t>(o.tick.count())),
          wheel_size_(o.wheel_size),
          max_pending_(o.max_pending),
          on_error_(o.on_error) {
        // origin = start rounded down to the tick grid (floor, also for negative times; a start
        // within one tick of time_point::min() gives time_point::min(), off the grid)
        const rep t = start.time_since_epoch().count();
        const rep k = o.tick.count();
        rep q = t / k;
        if (t % k != 0 && t < 0) --q;
        origin_ = time_point{duration{clamp_count<rep>(static_cast<wide_rep>(q) * k)}};
        levels_.push_back(make_level(1));
    }

    // ---- the handle's entry point ----

    bool cancel(node& n) noexcept override {
        {
            std::lock_guard lk(m_);
            if (n.load_state() != timer_state::pending) return false;
            unlink(n);
            n.state.store(timer_state::cancelled, std::memory_order_release);
            unreserve();
        }
        n.destroy_task();  // the node is ours alone now: destroy the task outside the lock
        n.release(*this);  // the timer's reference
        return true;
    }

    // ---- the timer's operations ----

    template <class F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        {
            // Refuse, or reserve a place (size() counts it from now), before the task is moved:
            // a refused task is left untouched.
            std::lock_guard lk(m_);
            if (stopped_) throw rejected_error("hierarchical_timing_wheel: stopped");
            if (max_pending_ != 0 && size_ >= max_pending_)
                throw rejected_error("hierarchical_timing_wheel: max_pending reached");
            ++size_;
        }
        node* n;
        try {
            n = make_node<Clock>(std::forward<F>(task), deadline, *this);
        } catch (...) {
            std::lock_guard lk(m_);
            if (!stopped_) unreserve();
            throw;
        }
        std::unique_lock lk(m_);
        if (stopped_) {  // stop() came in between (it has already let go of the reservation)
            lk.unlock();
            n->release(*this);
            throw rejected_error("hierarchical_timing_wheel: stopped");
        }
        try {
            place(n, to_ticks(deadline), true, levels_[0].current);
        } catch (...) {
            unreserve();
            lk.unlock();
            n->release(*this);
            throw;
        }
        n->acquire();  // the timer's reference; the caller's becomes the handle's
        return timeout<Clock>(n, this);
    }

    std::size_t size() const {
        std::lock_guard lk(m_);
        return size_;
    }

    std::optional<time_point> next_expiry() const { return queue_.next_deadline(); }

    bool stopped() const {
        std::lock_guard lk(m_);
        return stopped_;
    }

    // Whether the calling thread is the reaper thread.
    bool on_worker() const {
        std::lock_guard lk(m_);
        return worker_ == std::this_thread::get_id();
    }

    void set_worker() {
        std::lock_guard lk(m_);
        worker_ = std::this_thread::get_id();
    }

    /// Waits (until `limit`, or a stop request) for a due bucket, flushes every due bucket and runs
    /// the tasks that became due. True if a bucket was processed.
    bool advance(time_point limit, std::stop_token st) {
        {
            std::unique_lock lk(m_);
            for (;;) {
                if (stopped_) return false;
                if (!advancing_) break;
                if (advancer_ == std::this_thread::get_id()) return false;  // from inside a task
                if (limit <= Clock::now() || st.stop_requested()) return false;
                detail::wait_until<Clock>(advance_cv_, lk, limit);
            }
            advancing_ = true;
            advancer_ = std::this_thread::get_id();
        }
        struct done {
            htw_core& c;
            ~done() {
                std::lock_guard lk(c.m_);
                c.advancing_ = false;
                c.advancer_ = std::thread::id{};
                c.advance_cv_.notify_all();
            }
        } guard{*this};

        bool any = false;
        while (!any) {
            std::optional<bucket_ref> r = queue_.take_until(limit, st);
            if (!r) return false;
            std::lock_guard lk(m_);
            if (stopped_) return false;
            const std::uint64_t now = floor_ticks(Clock::now());
            any = process(*r, now);
            while (std::optional<bucket_ref> more = queue_.poll()) any = process(*more, now) || any;
            if (any) {
                // everything due now runs in this call; tasks scheduled from here on wait for the
                // next one (their ready bucket is queued afresh)
                for (node* n = ready_.lane[0].detach(); n;) {
                    node* next = n->next;
                    push_run(n);
                    n = next;
                }
                ready_.queued = false;
            }
        }
        run_ready();
        return true;
    }

    /// Cancels every pending task, refuses further schedules and wakes the advancing thread.
    /// Returns the handles of the cancelled tasks, earliest deadline first. Idempotent.
    std::vector<timeout<Clock>> stop() {
        std::vector<node*> nodes;
        {
            std::lock_guard lk(m_);
            if (stopped_) return {};
            nodes.reserve(size_);  // may throw: nothing has changed yet
            stopped_ = true;
            for (auto& lv : levels_)
                for (std::size_t i = 0; i < wheel_size_; ++i) take_all(lv.buckets[i], nodes);
            take_all(ready_, nodes);
            for (std::size_t i = run_pos_; i < run_.size(); ++i) {
                if (node* n = run_[i]) {
                    n->prev = n->next = nullptr;
                    n->state.store(timer_state::cancelled, std::memory_order_release);
                    nodes.push_back(n);
                }
            }
            run_.clear();
            run_pos_ = 0;
            size_ = 0;
            queue_.close();
            advance_cv_.notify_all();
        }
        std::vector<timeout<Clock>> out;
        try {
            out.reserve(nodes.size());
        } catch (...) {
            for (node* n : nodes) {
                n->destroy_task();
                n->release(*this);
            }
            throw;
        }
        std::stable_sort(nodes.begin(), nodes.end(),
                         [](const node* a, const node* b) { return a->deadline < b->deadline; });
        for (node* n : nodes) {
            n->destroy_task();
            out.emplace_back(n, this);  // adopts the timer's reference
        }
        return out;
    }

    // ---- for tests: the level arithmetic ----

    std::size_t level_count() const {
        std::lock_guard lk(m_);
        return levels_.size();
    }
    /// Level 0's current time, on Clock.
    time_point current_time() const {
        std::lock_guard lk(m_);
        return to_time(levels_[0].current);
    }
    /// The level a pending task sits at; -1 when it is ready to run (or not pending).
    int level_of(const timeout<Clock>& t) const {
        std::lock_guard lk(m_);
        if (!t.pending()) return -1;
        const std::uint64_t u = to_ticks(t.deadline());
        if (u <= levels_[0].current) return -1;
        for (std::size_t k = 0; k < levels_.size(); ++k)
            if (u < htw_sat_add(levels_[k].current, levels_[k].interval))
                return static_cast<int>(k);
        return -1;
    }

  private:
    struct level {
        std::uint64_t tick;      // in level-0 ticks
        std::uint64_t interval;  // tick * wheel_size (saturating)
        std::uint64_t current;   // multiple of tick
        std::unique_ptr<bucket[]> buckets;
    };

    ~htw_core() override = default;

    level make_level(std::uint64_t tick) const {
        level lv;
        lv.tick = tick;
        lv.interval = htw_sat_mul(tick, wheel_size_);
        lv.current = levels_.empty() ? 0 : levels_[0].current - levels_[0].current % tick;
        lv.buckets = std::make_unique<bucket[]>(wheel_size_);
        return lv;
    }

    // The first tick at or after d (0 for anything at or before the origin).
    std::uint64_t to_ticks(time_point d) const noexcept {
        if (d <= origin_) return 0;
        const std::uint64_t diff = static_cast<std::uint64_t>(d.time_since_epoch().count()) -
                                   static_cast<std::uint64_t>(origin_.time_since_epoch().count());
        std::uint64_t u = diff / tick_count_;
        if (diff % tick_count_ != 0) ++u;
        return std::min(u, std::numeric_limits<std::uint64_t>::max() - 1);
    }

    // The last tick at or before t (0 for anything at or before the origin).
    std::uint64_t floor_ticks(time_point t) const noexcept {
        if (t <= origin_) return 0;
        const std::uint64_t diff = static_cast<std::uint64_t>(t.time_since_epoch().count()) -
                                   static_cast<std::uint64_t>(origin_.time_since_epoch().count());
        return diff / tick_count_;
    }

    // The time of tick u, saturating at time_point::max().
    time_point to_time(std::uint64_t u) const noexcept {
        const wide_rep t = static_cast<wide_rep>(origin_.time_since_epoch().count()) +
                           static_cast<wide_rep>(u) * static_cast<wide_rep>(tick_count_);
        return time_point{duration{clamp_count<rep>(t)}};
    }

    // Unlinks n from its bucket list, or clears its slot in run_.
    void unlink(node& n) noexcept {
        if (n.prev == &run_marker_) {
            run_[reinterpret_cast<std::uintptr_t>(n.next)] = nullptr;
        } else {
            n.prev->next = n.next;
            n.next->prev = n.prev;
        }
        n.prev = n.next = nullptr;
    }

    // Under the lock: appends n to the tasks this advance runs. A node in run_ has prev ==
    // &run_marker_ and its index in next, so that cancel() can clear its slot in O(1).
    void push_run(node* n) noexcept {  // terminates if the vector cannot grow
        n->prev = &run_marker_;
        // NOLINTNEXTLINE(performance-no-int-to-ptr): an index into run_, never dereferenced
        n->next = reinterpret_cast<node*>(static_cast<std::uintptr_t>(run_.size()));
        run_.push_back(n);
    }

    // Under the lock: unlinks every node of l, marks it cancelled and appends it to out (which
    // has room: out was reserved for size_ nodes).
    static void take_all(htw_list<Clock>& l, std::vector<node*>& out) noexcept {
        for (node* n = l.head.next; n != &l.head;) {
            node* next = n->next;
            n->prev = n->next = nullptr;
            n->state.store(timer_state::cancelled, std::memory_order_release);
            out.push_back(n);
            n = next;
        }
        l.clear();
    }
    static void take_all(bucket& b, std::vector<node*>& out) noexcept {
        for (auto& l : b.lane) take_all(l, out);
        b.queued = false;
    }

    bool is_queued(const bucket& b) const noexcept { return b.queued && b.epoch == epoch_; }

    // Puts a reference to b, due at `at`, into the delay queue. Strong guarantee.
    void enqueue(bucket& b, std::uint64_t expiry, time_point at) {
        queue_.put(bucket_ref{&b, at, b.gen + 1, epoch_});  // false only after stop: never here
        ++b.gen;
        b.epoch = epoch_;
        b.expiry = expiry;
        b.queued = true;
    }

    // Under the lock: puts n where tick u belongs. A task whose tick is at most `due` is ready:
    // from schedule (`wake`), it goes to the ready bucket, which gets queued as due; from a flush,
    // it goes straight to run_. Throws only before changing anything.
    void place(node* n, std::uint64_t u, bool wake, std::uint64_t due) {
        if (u <= due) {
            if (wake) {
                if (!is_queued(ready_)) enqueue(ready_, 0, time_point::min());
                ready_.lane[0].push_back(n);
            } else {
                push_run(n);  // a flush: runs in this advance
            }
            return;
        }
        for (std::size_t k = 0;; ++k) {
            if (k == levels_.size()) {
                if (levels_.size() == levels_.capacity()) levels_.reserve(2 * levels_.size() + 4);
                levels_.push_back(make_level(levels_[k - 1].interval));
            }
            level& lv = levels_[k];
            if (u < htw_sat_add(lv.current, lv.interval)) {
                const std::uint64_t vid = u / lv.tick;
                bucket& b = lv.buckets[vid % wheel_size_];
                const std::uint64_t expiry = vid * lv.tick;
                if (!is_queued(b) || b.expiry != expiry) enqueue(b, expiry, to_time(expiry));
                b.push_back(n);
                return;
            }
        }
    }

    // Under the lock: handles one reference taken from the queue. True unless it was stale.
    // `now`: Clock's time in whole ticks. A task whose tick has passed on Clock runs in this
    // advance straight from whatever level it is at, rather than falling level by level.
    bool process(const bucket_ref& r, std::uint64_t now) noexcept {
        bucket& b = *r.bucket;
        if (!is_queued(b) || b.gen != r.gen || r.epoch != epoch_) return false;
        b.queued = false;
        if (&b == &ready_) return true;  // its tasks are already in ready_
        // move every level's clock up to the bucket's expiry (never backwards)
        const std::uint64_t t = b.expiry;
        for (auto& lv : levels_) {
            const std::uint64_t c = t - t % lv.tick;
            if (c > lv.current) lv.current = c;
        }
        // flush: re-insert every task; due ones become ready, the rest fall to finer levels
        const std::uint64_t due = std::max(now, levels_[0].current);
        b.drain([this, due](node* n) {
            place(n, to_ticks(n->deadline), false, due);  // throws only on allocation failure
        });
        return true;
    }

    // Under the lock: one pending task fewer (cancelled, or a schedule that failed).
    void unreserve() noexcept {
        if (--size_ == 0) forget_buckets();
    }

    // Under the lock, when nothing is pending: drops every bucket reference, so that an idle
    // reaper sleeps without a deadline.
    void forget_buckets() noexcept {
        ++epoch_;
        ready_.queued = false;
        queue_.clear();
    }

    // Runs the tasks in run_, one at a time; each stays cancellable until it starts. run_ is an
    // array rather than a list so that the nodes ahead can be prefetched: running a large batch
    // does not wait for one cache miss after another.
    void run_ready() {
        constexpr std::size_t ahead = 8;
        for (;;) {
            node* n;
            {
                std::lock_guard lk(m_);
                while (run_pos_ < run_.size() && run_[run_pos_] == nullptr) ++run_pos_;
                if (run_pos_ == run_.size()) {
                    if (run_.capacity() > (std::size_t{1} << 16)) {
                        std::vector<node*>().swap(run_);
                    } else {
                        run_.clear();
                    }
                    run_pos_ = 0;
                    return;
                }
                n = run_[run_pos_++];
                if (run_pos_ + ahead < run_.size() && run_[run_pos_ + ahead])
                    __builtin_prefetch(run_[run_pos_ + ahead], 1);
                n->prev = n->next = nullptr;
                n->state.store(timer_state::expired, std::memory_order_release);
                --size_;
            }
            run_reporting(*n, on_error_);
            n->destroy_task();
            n->release(*this);  // the timer's reference, which the runner held
        }
    }

    const duration tick_;
    const std::uint64_t tick_count_;
    const std::size_t wheel_size_;
    const std::size_t max_pending_;
    const std::function<void(std::exception_ptr)> on_error_;
    time_point origin_;

    mutable std::mutex m_;
    std::vector<level> levels_;
    bucket ready_;             // due tasks waiting for the next advance (lane 0 only)
    std::vector<node*> run_;   // due tasks the current advance runs; nullptr: cancelled
    std::size_t run_pos_ = 0;  // the next one to run
    node run_marker_;          // prev of a node in run_ (an address, never linked)
    std::size_t size_ = 0;
    std::uint64_t epoch_ = 0;
    bool stopped_ = false;
    bool advancing_ = false;
    std::thread::id advancer_{};
    std::thread::id worker_{};
    std::condition_variable advance_cv_;
    delay_queue<bucket_ref, Clock> queue_;
};

}  // namespace detail

/// Kafka's hierarchical timing wheel (see the top of this header). Thread-safe.
template <class Clock = std::chrono::steady_clock>
class hierarchical_timing_wheel {
  public:
    using clock = Clock;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using options = hierarchical_timing_wheel_options<Clock>;

    explicit hierarchical_timing_wheel(options o = {}) {
        if (o.tick <= duration::zero())
            throw std::invalid_argument("hierarchical_timing_wheel: tick must be > 0");
        if (o.wheel_size < 2)
            throw std::invalid_argument("hierarchical_timing_wheel: wheel_size must be > 1");
        if (o.wheel_size > (std::size_t{1} << 24))
            throw std::invalid_argument("hierarchical_timing_wheel: wheel_size must be <= 2^24");
        core_ = new detail::htw_core<Clock>(o, Clock::now());
        if (o.own_thread) {
            core_->ref();  // the reaper's reference
            try {
                thread_ = std::jthread([c = core_](std::stop_token st) {
                    detail::reduce_timer_slack();
                    c->set_worker();
                    while (!st.stop_requested() && !c->stopped()) c->advance(time_point::max(), st);
                    c->unref();
                });
            } catch (...) {
                core_->unref();
                core_->unref();
                throw;
            }
        }
    }

    hierarchical_timing_wheel(const hierarchical_timing_wheel&) = delete;
    hierarchical_timing_wheel& operator=(const hierarchical_timing_wheel&) = delete;

    /// Stops (pending tasks are cancelled and dropped) and joins the reaper, unless destroyed from
    /// one of its own tasks: then the reaper finishes that task and exits by itself.
    ~hierarchical_timing_wheel() {
        stop();
        {
            std::lock_guard lk(join_m_);
            if (thread_.joinable()) thread_.detach();  // only when called on the reaper
        }
        core_->unref();
    }

    /// Runs `task` (any void() callable, move-only included) once `delay` has passed.
    /// Throws rejected_error when stopped or at max_pending.
    template <class F, class Rep, class Period>
        requires std::is_invocable_v<std::decay_t<F>&>
    timeout<Clock> schedule(F&& task, std::chrono::duration<Rep, Period> delay) {
        return core_->schedule_at(std::forward<F>(task), detail::deadline_after<Clock>(delay));
    }

    /// Runs `task` once Clock reaches `deadline` (a past deadline: at the next advance).
    template <class F>
        requires std::is_invocable_v<std::decay_t<F>&>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        return core_->schedule_at(std::forward<F>(task), deadline);
    }

    /// Waits up to `max_wait` for a bucket to come due, flushes every due bucket and runs the tasks
    /// that are due, on the calling thread. True if a bucket was processed. Returns false at once
    /// when called from inside a task or after stop(); with own_thread = true the reaper is
    /// normally the one advancing, and a caller waits its turn for at most max_wait.
    template <class Rep, class Period>
    bool advance_clock(std::chrono::duration<Rep, Period> max_wait) {
        core_->ref();  // a task may destroy this timer while we run it
        struct unref {
            detail::htw_core<Clock>* c;
            ~unref() { c->unref(); }
        } guard{core_};
        return core_->advance(detail::deadline_after<Clock>(max_wait), {});
    }

    /// Tasks neither run nor cancelled (due ones included).
    std::size_t size() const { return core_->size(); }

    /// When advance_clock() will next have a bucket to process (a time in the past: now), for an
    /// event loop's poll timeout with own_thread = false; nullopt when nothing is queued. It may be
    /// early (a bucket whose tasks were all cancelled), never late.
    std::optional<time_point> next_expiry() const { return core_->next_expiry(); }

    /// Refuses further schedules, cancels every pending task and returns their handles (now
    /// cancelled(), their cancel() false), earliest first. Joins the reaper unless called from one
    /// of its tasks. Idempotent: later calls return nothing.
    std::vector<timeout<Clock>> stop() {
        std::vector<timeout<Clock>> out = core_->stop();
        if (!core_->on_worker()) {
            std::lock_guard lk(join_m_);
            if (thread_.joinable()) {
                thread_.request_stop();
                thread_.join();
            }
        }
        return out;
    }

    // ---- introspection, for tests and diagnostics ----

    /// Number of wheel levels created so far (1 + overflow levels).
    std::size_t levels() const { return core_->level_count(); }
    /// The wheel's level-0 current time (it moves only when a bucket is processed).
    time_point current_time() const { return core_->current_time(); }
    /// The level a pending task sits at, or -1 when it is ready to run or no longer pending.
    int level_of(const timeout<Clock>& t) const { return core_->level_of(t); }

  private:
    detail::htw_core<Clock>* core_ = nullptr;
    std::mutex join_m_;
    std::jthread thread_;
};

}  // namespace delayq
