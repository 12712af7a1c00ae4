// timing_wheel: the levels of a hierarchical timing wheel (Kafka's TimingWheel), with no lock, no
// thread and no tasks: where each pending node sits, and which nodes are due. Not thread-safe.
//
// The algorithm. Time is counted in ticks from an origin (the start time rounded down to the tick
// grid). A node due at d belongs to tick u = ceil((d - origin) / tick): the first grid point at or
// after d. Level 0 is a ring of `wheel_size` buckets, one tick each; level k+1 is a ring of
// `wheel_size` buckets each as wide as the whole of level k, created when a node first needs it.
// Each level has a current time (a multiple of its own tick). A node goes to the finest level whose
// span from that level's current time covers u, into the bucket of u; the bucket's expiry is the
// start of its span (u rounded down to the level's tick). Whenever a bucket gets an expiry, a
// reference to it goes into a queue of buckets by expiry (deadline_heap.hpp; Kafka's DelayQueue,
// without its lock and clock): the queue is the wheel's clock.
//
// expire(now) first moves every level's current time up to now (never back), then takes every
// bucket the queue holds due at now, and empties each: a node whose deadline has come goes out; one
// whose tick is the one under way goes to the near_window (near_window.hpp), which keeps it in
// deadline order so that it runs at its own deadline; the others fall to a finer level (the
// currents being at now, they land in buckets not yet due). A bucket is queued to come out when its
// span's earliest deadline can have come: just after the tick before its span, one tick before
// Kafka's. Empty ticks cost nothing: no bucket, no work. A tick-rounded driver passes a `now` on
// the grid.
//
//              level 2: tick 25, span 125     [ 0  | 25 | 50 | 75 | 100 ]
//                                                     |  expires at 25: its nodes re-placed
//              level 1: tick 5,  span 25      [ 25 | 30 | 35 | 40 | 45 ]
//                                                  |  expires at 30
//              level 0: tick 1,  span 5       [ 30 | 31 | 32 | 33 | 34 ]
//                                                    |  expires at 31: nodes with d <= now go out
//     queue of bucket_refs:     (31, L0)  (35, L1)  (50, L2)  ...  only non-empty buckets
//
// Never early: a node goes out only when its own deadline is <= now, whatever bucket it was in.
// Kafka keys a task by its deadline rounded down and runs a bucket when its start is reached, so a
// task can run up to one tick early; here the bucket only says when to look.
//
// Details:
// - A node whose tick the wheel has already passed or opened (u <= level 0's current: its deadline
//   is due, or short, or the clock went back) goes to the window too.
// - A bucket whose nodes were all unlinked stays in the queue until due (as in Kafka) and is then
//   emptied for nothing; when the wheel holds nothing at all the queue is emptied (an epoch marks
//   every bucket unqueued), so an idle wheel has no next expiry. The queue keeps its room.
// - Nothing here allocates but the members that take a room_key (room.hpp), called at schedule
//   time, where an exception is harmless: prepare() creates the levels a deadline needs and makes
//   room in the queue for two references per bucket; prepare_repeat() creates the levels that a
//   periodic task's next run needs, whichever pass moves it there; reserve() makes room in the
//   window for every node a pass may stage (near_window.hpp, "Memory"). A bucket has at most one
//   live reference (a node is placed only at or after its level's current time, so a queued bucket
//   is never needed for an earlier span), plus stale ones that forget_buckets() removes; so
//   expire() never allocates and cannot fail.
// - Divisions by the ticks are multiplications by precomputed reciprocals.
#pragma once

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "bucket.hpp"
#include "deadline_heap.hpp"
#include "near_window.hpp"
#include "time.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

// floor(e / d) by a multiplication: the estimate from the reciprocal is at most 3 below the
// quotient, and a few steps correct it.
class divider {
  public:
    explicit divider(std::uint64_t d = 1) noexcept
        : d_(d), inv_(std::numeric_limits<std::uint64_t>::max() / d) {}

    std::uint64_t div(std::uint64_t e) const noexcept {
        __extension__ typedef unsigned __int128 uwide;
        std::uint64_t q = static_cast<std::uint64_t>((static_cast<uwide>(e) * inv_) >> 64);
        while (e - q * d_ >= d_) ++q;
        return q;
    }
    std::uint64_t divisor() const noexcept { return d_; }

  private:
    std::uint64_t d_;
    std::uint64_t inv_;
};

inline std::uint64_t sat_add_u64(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}
inline std::uint64_t sat_mul_u64(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}

template <class Clock>
class timing_wheel {
    struct bucket;

  public:
    using node = timer_node<Clock>;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using rep = typename duration::rep;

    static constexpr std::size_t max_wheel_size = std::size_t{1} << 24;

    /// What the queue holds: a bucket and the expiry it had when it was queued. A reference
    /// whose generation or epoch no longer matches its bucket's is stale and is skipped.
    struct bucket_ref {
        bucket* b;
        time_point at;
        std::uint64_t gen;
        std::uint64_t epoch;

        time_point deadline() const noexcept { return at; }
    };

    /// Throws std::invalid_argument for tick <= 0 or wheel_size outside [2, 2^24].
    timing_wheel(duration tick, std::size_t wheel_size, time_point start)
        : tick_(valid_tick(tick)), wheel_size_(valid_size(wheel_size)), ws_div_(wheel_size_) {
        // origin = start rounded down to the tick grid (floor, also for negative times; a start
        // within one tick of time_point::min() gives time_point::min(), off the grid)
        const rep t = start.time_since_epoch().count();
        const rep k = tick.count();
        rep q = t / k;
        if (t % k != 0 && t < 0) --q;
        origin_ = clamp_count<rep>(static_cast<wide_rep>(q) * k);
        levels_.reserve(max_levels);
        const construction_room room;
        add_level(room.key());
    }

    timing_wheel(const timing_wheel&) = delete;
    timing_wheel& operator=(const timing_wheel&) = delete;

    std::size_t size() const noexcept { return size_; }

    /// Where a node due at some deadline belongs: its tick.
    using place = std::uint64_t;

    /// The tick a node due at `deadline` belongs to. Depends on nothing that changes: a
    /// scheduling thread computes it before it takes the lock.
    place position(time_point deadline) const noexcept { return to_ticks(deadline); }

    /// Creates the levels tick `u` needs. Throws std::bad_alloc; then nothing visible has changed.
    void prepare(place u, room_key key) {
        while (u >= levels_.back().end) add_level(key);
    }

    /// Creates the levels that a node moved by a pass up to `period` after the pass's time needs,
    /// whenever the pass comes (a periodic task's next run): the top level spans that much past
    /// any time its current one can have. Throws std::bad_alloc; then nothing visible has changed.
    void prepare_repeat(duration period, room_key key) {
        // A pass at `now` has moved every level's current time to its tick at or before now; the
        // node, due at most `period` later, belongs to a tick at most ceil(period / tick) + 1
        // after now's; level k covers at least (wheel_size - 1) * its tick past now's.
        const auto ticks = static_cast<std::uint64_t>(
            std::max<wide_rep>(0, ceil_count<duration>(period) / tick_.count() + 2));
        while (levels_.size() < max_levels &&
               sat_mul_u64(wheel_size_ - 1, levels_.back().tick) < ticks)
            add_level(key);
    }

    /// Room for k nodes: the window's, which links to passed ticks and passes may put them all
    /// into. Throws std::bad_alloc; then the room is as it was.
    void reserve(std::size_t k, room_key key) { window_.reserve(k, key); }

    /// Links n (not in the wheel, n->deadline at tick `u`, prepare(u) done since the last pass).
    /// Returns whether it comes out before `wake_by` (time_point::min(): nobody waits; then
    /// false).
    bool link(node* n, place u, time_point wake_by) noexcept {
        ++size_;
        place_node(n, u);
        return n->deadline < wake_by;
    }

    /// As link(), for a node moved (reschedule, a periodic task's next run): the same here.
    bool relink(node* n, place u, time_point wake_by) noexcept { return link(n, u, wake_by); }

    /// Whether n, which this wheel holds, may stay where it is when its deadline moves later (the
    /// caller then writes the new deadline): yes in a bucket, whose expiry places it again by its
    /// own deadline, as it places every node it does not run; not in the window, which is
    /// ordered by deadline.
    bool may_postpone(const node* n) const noexcept { return !near_window<Clock>::holds(n); }

    /// A hint that unlink(n) comes soon (n held): starts the misses it will wait for.
    void prefetch_unlink(const node* n) const noexcept {
        if (!near_window<Clock>::holds(n)) node_list::prefetch_unlink(n);
    }

    /// Unlinks n, which this wheel holds. O(1) in a bucket, O(log h) in the window's heap.
    void unlink(node* n) noexcept {
        if (near_window<Clock>::holds(n)) {
            window_.unlink(n);
        } else {
            node_list::unlink(n);
        }
        if (--size_ == 0) forget_buckets();
    }

    /// Unlinks every node due at `now` and hands each to sink(node*), in no particular order but
    /// bucket by bucket, by the buckets' expiry, calling sink.next_run() between two buckets
    /// (due_batch); returns how many.
    template <class Sink>
    // NOLINTNEXTLINE(bugprone-exception-escape): sinks append only where room was made
    std::size_t expire(time_point now, Sink&& sink) noexcept {
        std::size_t count = 0;
        auto out = [&](node_links* l) {
            sink(node::of(l));
            ++count;
        };
        window_.take_due(now, out);
        // The wheel's time follows the clock: a node re-placed below lands in a bucket not yet
        // due, so one pass suffices however late the driver is.
        const std::uint64_t nowt = floor_ticks(now);
        if (now > origin_tp()) advance_to(nowt);
        while (std::optional<bucket_ref> r = queue_.poll(now)) {
            bucket& b = *r->b;
            if (!b.queued || b.gen != r->gen || r->epoch != epoch_) continue;
            b.queued = false;
            // A bucket opens up to one tick before its span starts (its earliest deadline may be
            // just after the tick before): the wheel's time goes to the span's start, so that the
            // finer levels cover the whole span and its nodes land there, not back in it.
            advance_to(b.expiry);
            sink.next_run();
            b.nodes.drain([&](node_links* l) {
                node* n = node::of(l);
                if (n->deadline <= now) return out(l);
                const std::uint64_t u = to_ticks(n->deadline);
                // The tick under way (or one already passed: the clock went back): to the
                // window, to run at its own deadline.
                if (u <= nowt + 1) {
                    window_.stage(n);
                    return;
                }
                place_node(n, u);
            });
        }
        window_.end_stage();
        size_ -= count;
        if (size_ == 0 && count != 0) forget_buckets();
        assert(invariants());
        return count;
    }

    /// When expire() will next have work: nullopt when the wheel is empty. It may be early (a
    /// bucket whose nodes were all unlinked), never late.
    std::optional<time_point> next_expiry() const noexcept {
        if (size_ == 0) return std::nullopt;
        const std::optional<time_point> q = queue_.next_deadline();
        const std::optional<time_point> w = window_.next();
        if (q && w) return std::min(*q, *w);
        return q ? q : w;
    }

    /// Whether next_expiry() is when a task is due (the window's first), not when a bucket opens
    /// (the earliest its span could hold one): a driver spins only before the former.
    bool next_expiry_runs_a_task() const noexcept {
        const std::optional<time_point> q = queue_.next_deadline();
        const std::optional<time_point> w = window_.next();
        return w && (!q || *w <= *q);
    }

    /// The tick grid: the grid point at or before t, and at or after t (t itself before the
    /// origin). A driver that wants tick-rounded firing advances at floor_to_grid(now) and sleeps
    /// until ceil_to_grid(next_expiry()).
    time_point floor_to_grid(time_point t) const noexcept {
        return t <= origin_tp() ? t : to_time(floor_ticks(t));
    }
    time_point ceil_to_grid(time_point t) const noexcept {
        return t <= origin_tp() ? t : to_time(to_ticks(t));
    }

    /// Unlinks every node and hands each to f(node*) (prev null; f may reuse next), in no order:
    /// a bucket's stripes in turn, so that several nodes' cache misses overlap.
    template <class F>
    void take_all(F&& f) noexcept {
        auto out = [&](node_links* l) { f(node::of(l)); };
        window_.take_all(f);
        for (level& lv : levels_)
            for (std::size_t i = 0; i < wheel_size_; ++i) lv.buckets[i].nodes.unlink_all(out);
        size_ = 0;
        forget_buckets();
    }

    /// Debug builds check after every pass: every non-empty bucket is queued, and every
    /// level's current time is a multiple of its tick.
    bool invariants() const noexcept {
        for (const level& lv : levels_) {
            if (lv.current % lv.tick != 0) return false;
            for (std::size_t i = 0; i < wheel_size_; ++i)
                if (!lv.buckets[i].nodes.empty() && !is_queued(lv.buckets[i])) return false;
        }
        return true;
    }

    // ---- for tests: the level arithmetic ----

    std::size_t level_count() const noexcept { return levels_.size(); }
    /// Level 0's current time, on Clock.
    time_point current_time() const noexcept { return to_time(levels_[0].current); }
    /// The level a node due at `deadline` would sit at now; -1 when it would be in the window.
    int level_of(time_point deadline) const noexcept {
        const std::uint64_t u = to_ticks(deadline);
        if (u <= levels_[0].current) return -1;
        for (std::size_t k = 0; k < levels_.size(); ++k)
            if (u < levels_[k].end) return static_cast<int>(k);
        return -1;
    }

  private:
    static constexpr std::size_t max_levels = 66;  // one per bit of a tick count, and one more
    static constexpr time_point never = time_point::max();

    struct bucket {
        striped_list<16> nodes;
        std::uint64_t expiry = 0;  // in ticks from the origin; meaningful while queued
        std::uint64_t gen = 0;     // bumped at each put into the delay queue
        std::uint64_t epoch = 0;   // the wheel's epoch at that put
        bool queued = false;       // a reference with this gen is in the delay queue
    };

    struct level {
        std::uint64_t tick;      // in level-0 ticks
        std::uint64_t interval;  // tick * wheel_size (saturating)
        std::uint64_t current;   // a multiple of tick
        divider by_tick;
        std::unique_ptr<bucket[]> buckets;
        std::uint64_t end = 0;  // current + interval (saturating): the level covers [current, end)

        void set_current(std::uint64_t c) noexcept {
            current = c;
            end = sat_add_u64(c, interval);
        }
    };

    static duration valid_tick(duration t) {
        if (t <= duration::zero()) throw std::invalid_argument("delayq: tick must be > 0");
        return t;
    }
    static std::size_t valid_size(std::size_t w) {
        if (w < 2 || w > max_wheel_size)
            throw std::invalid_argument("delayq: wheel_size must be in [2, 2^24]");
        return w;
    }

    void add_level(room_key key) {
        if (levels_.size() == max_levels) return;  // the last level spans the whole time line
        const std::uint64_t tick = levels_.empty() ? 1 : levels_.back().interval;
        level lv{tick, sat_mul_u64(tick, wheel_size_), 0, divider(tick),
                 std::make_unique<bucket[]>(wheel_size_)};
        const std::uint64_t c = levels_.empty() ? 0 : levels_[0].current;
        lv.set_current(c - c % tick);
        queue_.reserve(2 * wheel_size_ * (levels_.size() + 1) + 2, key);
        levels_.push_back(std::move(lv));  // room reserved: no throw
    }

    // Puts n where tick u belongs: the window when the wheel has passed that tick, else the
    // finest level whose span covers it. A bucket is queued to come out when the earliest
    // deadline it may hold can have come (the start of its span).
    void place_node(node* n, std::uint64_t u) noexcept {
        if (u <= levels_[0].current) {
            window_.insert(n);  // room: prepare() for a schedule; a pass stages instead
            return;
        }
        for (level& lv : levels_) {
            if (u >= lv.end) continue;
            const std::uint64_t vid = lv.by_tick.div(u);
            bucket& b = lv.buckets[vid - ws_div_.div(vid) * wheel_size_];
            const std::uint64_t expiry = vid * lv.tick;
            if (!is_queued(b)) enqueue(b, expiry, opens(expiry));
            assert(b.expiry <= expiry);  // see "Details" at the top
            b.nodes.push_back(n);
            return;
        }
        assert(false && "prepare() creates the levels a deadline needs");
    }

    // When the span that starts at tick e begins: no deadline in it is earlier.
    time_point opens(std::uint64_t e) const noexcept {
        if (e == 0) return time_point::min();
        const time_point t = to_time(e - 1);
        return t == time_point::max() ? t : t + duration{1};
    }

    // Moves every level's current time up to tick t (never back).
    void advance_to(std::uint64_t t) noexcept {
        for (level& lv : levels_) {
            const std::uint64_t c = t - t % lv.tick;
            if (c > lv.current) lv.set_current(c);
        }
    }

    bool is_queued(const bucket& b) const noexcept { return b.queued && b.epoch == epoch_; }

    void enqueue(bucket& b, std::uint64_t expiry, time_point at) noexcept {
        queue_.put(bucket_ref{&b, at, b.gen + 1, epoch_});  // room made by add_level()
        ++b.gen;
        b.epoch = epoch_;
        b.expiry = expiry;
        b.queued = true;
    }

    // When nothing is held: drops every bucket reference, so that an idle wheel has no expiry.
    // The queue keeps the room add_level() made, which keeps a later put from allocating in
    // noexcept code.
    void forget_buckets() noexcept {
        ++epoch_;
        queue_.clear();
    }

    time_point origin_tp() const noexcept { return time_point{duration{origin_}}; }

    // The first tick at or after d (0 for anything at or before the origin), at most 2^64 - 2.
    std::uint64_t to_ticks(time_point d) const noexcept {
        const rep c = d.time_since_epoch().count();
        if (c <= origin_) return 0;
        const std::uint64_t diff =
            static_cast<std::uint64_t>(c) - static_cast<std::uint64_t>(origin_);
        const std::uint64_t q = by_tick0().div(diff);
        const std::uint64_t u = q + (q * by_tick0().divisor() != diff);
        return std::min(u, std::numeric_limits<std::uint64_t>::max() - 1);
    }

    // The last tick at or before t (0 for anything at or before the origin).
    std::uint64_t floor_ticks(time_point t) const noexcept {
        const rep c = t.time_since_epoch().count();
        if (c <= origin_) return 0;
        return by_tick0().div(static_cast<std::uint64_t>(c) - static_cast<std::uint64_t>(origin_));
    }

    // The time of tick u, saturating at time_point::max().
    time_point to_time(std::uint64_t u) const noexcept {
        const wide_rep t = static_cast<wide_rep>(origin_) +
                           static_cast<wide_rep>(u) * static_cast<wide_rep>(tick_.count());
        return time_point{duration{clamp_count<rep>(t)}};
    }

    const divider& by_tick0() const noexcept { return tick_div_; }

    const duration tick_;
    const std::size_t wheel_size_;
    const divider ws_div_;
    const divider tick_div_{static_cast<std::uint64_t>(tick_.count())};
    rep origin_;
    std::vector<level> levels_;
    near_window<Clock> window_;  // the tick under way, and nodes whose tick the wheel has passed
    std::size_t size_ = 0;
    std::uint64_t epoch_ = 0;
    deadline_heap<bucket_ref> queue_;
};

}  // namespace delayq::detail
