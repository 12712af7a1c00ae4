// hashed_wheel_ring: where the pending nodes of a hashed timing wheel sit, with no lock, no thread
// and no tasks: just which bucket holds each node, and which nodes are due. Not thread-safe.
//
// The idea. Time after `origin` is cut into ticks of `tick`; tick k ends at boundary(k) =
// origin + k * tick. A node due at d belongs to slot(d), the first tick whose boundary is at or
// after d (round up: a node never comes out before its deadline), and sits in bucket
// slot(d) mod W of a ring of W buckets (W a power of two). A bucket therefore mixes nodes of
// several rotations; instead of a remaining-rounds counter that must be decremented at every
// pass (Netty), each node keeps its deadline and a pass takes out only the nodes whose deadline
// has come. Every bucket keeps a lower bound of its deadlines, so a pass over a bucket whose
// nodes are all for later rotations costs one comparison.
//
// `cursor` is the first tick not yet processed. expire(now) processes the ticks cursor..tick(now)
// (at most one rotation: after W ticks every bucket has been seen once) and takes out every node
// of the buckets it visits whose slot has come: deadline <= boundary(tick(now)) <= now. Then, to
// run each task at its own deadline rather than its tick's boundary, it opens the tick under way
// (now strictly inside it): that tick's nodes that are due go out, the others move to the
// near_window (near_window.hpp), which keeps them in deadline order; each later pass takes the
// window's due prefix. A node linked into a tick already opened or passed (a short delay, a
// deadline in the past, a clock that went back, or one before the origin) goes to the window too.
// A tick-rounded driver passes a `now` on the grid, where no tick is ever opened early.
//
// Lists are circular with a sentinel, so unlink() needs only the node. A bucket's bit in the bitmap
// and its bounds (min, max) may outlive its last node when that node is unlinked: the next pass
// over the bucket finds it empty and clears them. So cancel touches nothing but the node and its
// neighbours; an emptied bucket costs at most one early wake-up.
//
// next_expiry() is when the next expire() will have work: the window's first deadline, or the
// earliest deadline of the earliest non-empty tick (its bucket's lower bound: exact unless a node
// was unlinked). A bitmap of non-empty buckets lets it and expire() skip empty buckets, so an idle
// ring costs nothing and a sparse one little. A bucket whose nodes are all due (its max <= the
// pass's limit, the usual case) is emptied whole.
//
// Staging. A new schedule's link does not go to its bucket at once: it goes to the end of the
// linking thread's staging lane (staging.hpp says why), and a lane settles into the buckets once it
// holds 4 x W links (1 024 to 16 384), or when a pass begins: expire() settles everything before
// it moves the cursor, so a staged node's slot is never behind it. next_expiry() counts the staged
// nodes through staging::min(). A reschedule, or a periodic task's next run, links at once
// (relink()): a moved node is cold, and staging it would touch it twice (docs/performance.md).
//
// Arithmetic is done in Clock::rep with 128-bit intermediates where it could overflow, so deadlines
// anywhere on the time line (time_point::max() included) are placed correctly.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "bucket.hpp"
#include "near_window.hpp"
#include "staging.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

template <class Clock>
class hashed_wheel_ring {
  public:
    using node = timer_node<Clock>;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using rep = typename duration::rep;
    static_assert(std::is_integral_v<rep> && std::is_signed_v<rep> && sizeof(rep) <= 8,
                  "hashed_wheel_ring needs a signed integral duration of at most 64 bits");

    static constexpr std::size_t max_wheel_size = std::size_t{1} << 30;

    /// Throws std::invalid_argument for tick <= 0, wheel_size == 0 or > 2^30.
    hashed_wheel_ring(duration tick, std::size_t wheel_size, time_point origin)
        : origin_(origin.time_since_epoch().count()),
          tick_(tick.count()),
          staged_(settle_at(wheel_size)) {
        if (tick <= duration::zero()) throw std::invalid_argument("delayq: tick must be > 0");
        inv_tick_ = std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(tick_);
        if (wheel_size == 0 || wheel_size > max_wheel_size)
            throw std::invalid_argument("delayq: wheel_size must be in [1, 2^30]");
        const std::size_t w = std::bit_ceil(wheel_size);
        mask_ = w - 1;
        buckets_ = std::vector<bucket>(w);
        bits_.resize((w + 63) / 64);
    }

    hashed_wheel_ring(const hashed_wheel_ring&) = delete;
    hashed_wheel_ring& operator=(const hashed_wheel_ring&) = delete;

    std::size_t size() const noexcept { return size_; }
    std::size_t buckets() const noexcept { return mask_ + 1; }
    duration tick() const noexcept { return duration{tick_}; }

    /// Where a node due at some deadline belongs: the deadline's count and its slot.
    struct place {
        rep d;
        std::uint64_t s;
    };

    /// Where a node due at `deadline` belongs. Depends on nothing that changes: a scheduling
    /// thread computes it before it takes the lock.
    place position(time_point deadline) const noexcept {
        const rep d = deadline.time_since_epoch().count();
        return {d, slot(d)};
    }

    /// Makes the room a link at `p` may need: none beyond what reserve() made.
    void prepare(place, room_key) noexcept {}

    /// Makes the room a pass's move of a node up to `period` ahead needs: none here.
    void prepare_repeat(duration, room_key) noexcept {}

    /// Room for k nodes: the window's, which links behind the cursor and passes may put them all
    /// into. Throws std::bad_alloc; then the room is as it was.
    void reserve(std::size_t k, room_key key) { window_.reserve(k, key); }

    /// Links a new node n (not in the ring, n->deadline at `p`, prepare(p) done since the last
    /// pass) through the calling thread's staging lane (see "Staging" above). Returns whether it
    /// comes out before `wake_by` (time_point::min(): nobody waits; then false).
    bool link(node* n, place p, time_point wake_by) noexcept {
        if (in_window(p.d, p.s)) return to_window(n, wake_by);
        ++size_;
        staged_.push(n, p.d, [this](node* m) { place_node(m); });
        return comes_out_before(n, wake_by);
    }

    /// As link(), for a node moved (reschedule, a periodic task's next run): into its bucket at
    /// once.
    bool relink(node* n, place p, time_point wake_by) noexcept {
        if (in_window(p.d, p.s)) return to_window(n, wake_by);
        ++size_;
        place_node(n, p.d, p.s);
        return comes_out_before(n, wake_by);
    }

    /// Whether n, which this ring holds, may stay where it is when its deadline moves later (the
    /// caller then writes the new deadline): yes in a bucket or a staging lane, whose pass files
    /// it again by its own deadline; not in the window, which is ordered by deadline.
    bool may_postpone(const node* n) const noexcept { return !near_window<Clock>::holds(n); }

    /// A hint that unlink(n) comes soon (n held): starts the misses it will wait for.
    void prefetch_unlink(const node* n) const noexcept {
        if (!near_window<Clock>::holds(n)) node_list::prefetch_unlink(n);
    }

    /// Unlinks n, which this ring holds. O(1) in a bucket, which is not even touched (its bit and
    /// bounds may stay behind: a pass clears them); O(log h) in the window's heap.
    void unlink(node* n) noexcept {
        if (near_window<Clock>::holds(n)) {
            window_.unlink(n);
        } else {
            node_list::unlink(n);
        }
        --size_;
    }

    /// Unlinks every node due at `now` and hands each to sink(node*), in no particular order but
    /// bucket by bucket, in time order, calling sink.next_run() between two buckets (due_batch);
    /// returns how many.
    template <class Sink>
    // NOLINTNEXTLINE(bugprone-exception-escape): sinks append only where room was made
    std::size_t expire(time_point now_tp, Sink&& sink) noexcept {
        const rep now = now_tp.time_since_epoch().count();
        std::size_t count = 0;
        auto out = [&](node_links* n) {
            sink(node::of(n));
            ++count;
        };
        // before the cursor moves: a staged node's slot is not behind it yet
        staged_.settle([this](node* m) { place_node(m); });
        count += window_.take_due(now_tp, sink);
        if (now >= origin_) {
            const std::uint64_t t = floor_tick(now);
            if (t >= cursor_) {
                if (size_ != count) {
                    // A node comes out at its slot's boundary: the passes are the same whether the
                    // clock moved tick by tick or jumped.
                    const rep limit = boundary_rep(t);
                    const std::size_t w = mask_ + 1;
                    const std::uint64_t span = t - cursor_ + 1;
                    const std::size_t start = static_cast<std::size_t>(cursor_) & mask_;
                    const std::size_t visits = span >= w ? w : static_cast<std::size_t>(span);
                    for (std::size_t i = next_nonempty(start, visits); i < visits;
                         i = next_nonempty(start, visits, i + 1)) {
                        const std::size_t b = (start + i) & mask_;
                        bucket& k = buckets_[b];
                        if (k.min > limit) continue;
                        sink.next_run();
                        if (k.max <= limit) {
                            // All due, but for a node postponed in place: no unlinking one by
                            // one. The bounds are made again by what stays.
                            reset_bounds(k);
                            k.nodes.drain([&](node_links* l) {
                                const rep d = node::of(l)->deadline.time_since_epoch().count();
                                if (d <= limit) return out(l);
                                place_node(node::of(l), d, slot(d));
                            });
                        } else {
                            rep lo = never, hi = std::numeric_limits<rep>::min();
                            k.nodes.for_each([&](node_links* l) {
                                const rep d = node::of(l)->deadline.time_since_epoch().count();
                                if (d <= limit) {
                                    node_list::unlink(l);
                                    out(l);
                                } else if (!refiled(l, d, b)) {
                                    lo = std::min(lo, d);
                                    hi = std::max(hi, d);
                                }
                            });
                            k.min = lo;
                            k.max = hi;
                        }
                        if (k.nodes.empty()) clear(k, b);
                    }
                }
                cursor_ = t + 1;
            }
            // Inside the tick under way (not on its boundary: a tick-rounded pass never is):
            // open it, so that its tasks run at their own deadlines.
            if (cursor_ == t + 1 && now > boundary_rep(t) && size_ != count) {
                sink.next_run();
                open(t + 1, now, out);
            }
        }
        window_.end_stage();
        size_ -= count;
        return count;
    }

    /// When expire() will next have work: nullopt when the ring is empty; a time <= now when
    /// something is due already. Never later than the earliest deadline's slot boundary.
    std::optional<time_point> next_expiry() const noexcept {
        if (size_ == 0) return std::nullopt;
        const std::optional<time_point> w = window_.next();
        rep best = w ? w->time_since_epoch().count() : never;
        best = std::min(best, staged_.min());  // exact, or early after a cancel (staging.hpp)
        const std::size_t n = mask_ + 1;
        const std::size_t start = static_cast<std::size_t>(cursor_) & mask_;
        for (std::size_t i = next_nonempty(start, n); i < n; i = next_nonempty(start, n, i + 1)) {
            const std::uint64_t k = cursor_ + i;  // the first tick this bucket stands for
            const rep opens = tick_start(k);      // no node in it is due before
            if (opens >= best) break;             // later buckets stand for later ticks still
            const bucket& b = buckets_[(start + i) & mask_];
            const rep cand = std::max(b.min, opens);  // b.min: exact unless a node was unlinked
            if (cand < best) best = cand;
        }
        return time_point{duration{best}};
    }

    /// Whether next_expiry() is when a task is due: true here (it is a node's deadline, or an
    /// early bound left by an unlinked node: then a spin for nothing). A driver spins only before
    /// such a time.
    bool next_expiry_runs_a_task() const noexcept { return true; }

    /// The tick grid: the boundary at or before t (t itself before the origin), and the boundary
    /// at or after t. A driver that wants tick-rounded firing advances at floor_to_grid(now) and
    /// sleeps until ceil_to_grid(next_expiry()).
    time_point floor_to_grid(time_point t) const noexcept {
        const rep c = t.time_since_epoch().count();
        return c < origin_ ? t : time_point{duration{boundary_rep(floor_tick(c))}};
    }
    time_point ceil_to_grid(time_point t) const noexcept {
        const rep c = t.time_since_epoch().count();
        return c < origin_ ? t : boundary(slot(c));
    }

    /// Unlinks every node and hands each to f(node*) (prev null; f may reuse next), in no order:
    /// a bucket's stripes in turn, so that several nodes' cache misses overlap.
    template <class F>
    void take_all(F&& f) noexcept {
        auto out = [&](node_links* l) { f(node::of(l)); };
        window_.take_all(f);
        staged_.take_all(f);
        for (std::size_t b = 0; b < buckets_.size(); ++b) {
            if (!(bits_[b >> 6] >> (b & 63) & 1)) continue;
            buckets_[b].nodes.unlink_all(out);
            clear(buckets_[b], b);
        }
        std::fill(bits_.begin(), bits_.end(), 0);
        size_ = 0;
    }

  private:
    static constexpr rep never = std::numeric_limits<rep>::max();

    // A lane settles at 4 links per bucket, within [1 024, 16 384].
    static std::size_t settle_at(std::size_t wheel_size) noexcept {
        const std::size_t w = std::bit_ceil(std::clamp<std::size_t>(wheel_size, 1, max_wheel_size));
        return std::clamp<std::size_t>(4 * w, 1024, 16384);
    }

    // Whether a node due at d (slot s) belongs in the window: its tick has been opened already
    // (its slot is behind the cursor), or it is before the origin (the clock went back that far).
    bool in_window(rep d, std::uint64_t s) const noexcept { return s < cursor_ || d < origin_; }

    // When tick k begins (just after boundary(k - 1)): no node of slot k is due before.
    rep tick_start(std::uint64_t k) const noexcept {
        if (k == 0) return std::numeric_limits<rep>::min();
        const rep b = boundary_rep(k - 1);
        return b == never ? never : b + 1;
    }

    // Opens tick s (the one under way, now inside it): the nodes of slot s in its bucket that are
    // due go out, the others move to the window.
    template <class Out>
    // NOLINTNEXTLINE(bugprone-exception-escape): sinks append only where room was made
    void open(std::uint64_t s, rep now, Out& out) noexcept {
        const std::size_t b = static_cast<std::size_t>(s) & mask_;
        cursor_ = s + 1;
        if (!(bits_[b >> 6] >> (b & 63) & 1)) return;
        bucket& k = buckets_[b];
        const rep last = boundary_rep(s);  // nodes of slot s are due by then; others are later
        if (k.min > last) return;
        rep lo = never, hi = std::numeric_limits<rep>::min();
        k.nodes.for_each([&](node_links* l) {
            node* n = node::of(l);
            const rep d = n->deadline.time_since_epoch().count();
            if (d <= last) {
                node_list::unlink(l);
                if (d <= now) {
                    out(l);
                } else {
                    window_.stage(n);
                }
                return;
            }
            if (refiled(l, d, b)) return;
            lo = std::min(lo, d);
            hi = std::max(hi, d);
        });
        k.min = lo;
        k.max = hi;
        if (k.nodes.empty()) clear(k, b);
    }
    __extension__ typedef __int128 wide;

    struct bucket {
        striped_list<8> nodes;
        rep min = never;  // bounds of the deadlines held (exact after a pass)
        rep max = std::numeric_limits<rep>::min();
    };

    // Links n (due at d, slot s) into its bucket (s is not behind the cursor).
    void place_node(node* n, rep d, std::uint64_t s) noexcept {
        const std::size_t b = static_cast<std::size_t>(s) & mask_;
        bucket& k = buckets_[b];
        bits_[b >> 6] |= std::uint64_t{1} << (b & 63);
        k.nodes.push_back(n);
        if (d < k.min) k.min = d;
        if (d > k.max) k.max = d;
    }

    // A node of bucket b that is not due, met by a pass: if it was postponed in place to a slot of
    // another bucket, it moves there (true). Its slot is after the pass's, never behind the
    // cursor.
    bool refiled(node_links* l, rep d, std::size_t b) noexcept {
        const std::uint64_t s = slot(d);
        if ((static_cast<std::size_t>(s) & mask_) == b) return false;
        node_list::unlink(l);
        place_node(node::of(l), d, s);
        return true;
    }

    // A staged node: its slot, computed again from its deadline.
    void place_node(node* n) noexcept {
        const rep d = n->deadline.time_since_epoch().count();
        place_node(n, d, slot(d));
    }

    // link() and relink() of a node whose tick is opened or passed: into the window, in deadline
    // order.
    bool to_window(node* n, time_point wake_by) noexcept {
        ++size_;
        window_.insert(n);
        return n->deadline < wake_by;
    }

    // A node in a bucket comes out when its tick is opened: at its deadline, or at its slot's
    // boundary; either way before `wake_by` if its deadline is.
    static bool comes_out_before(const node* n, time_point wake_by) noexcept {
        return wake_by != time_point::min() && n->deadline < wake_by;
    }

    static void reset_bounds(bucket& k) noexcept {
        k.min = never;
        k.max = std::numeric_limits<rep>::min();
    }

    void clear(bucket& k, std::size_t b) noexcept {
        reset_bounds(k);
        bits_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
    }

    // The first tick whose boundary is at or after d.
    std::uint64_t slot(rep d) const noexcept {
        rep e;
        if (!__builtin_sub_overflow(d, origin_, &e)) {
            if (e <= 0) return 0;
            const auto u = static_cast<std::uint64_t>(e);
            const std::uint64_t q = div_tick(u);
            return q + (q * static_cast<std::uint64_t>(tick_) != u);
        }
        const wide we = static_cast<wide>(d) - origin_;
        if (we <= 0) return 0;
        return static_cast<std::uint64_t>((we + tick_ - 1) / tick_);
    }

    // floor(e / tick) for 0 <= e < 2^63, by a multiplication: the estimate from the reciprocal is
    // the quotient or one less (e < 2^63 keeps the error below one), and one step corrects it.
    std::uint64_t div_tick(std::uint64_t e) const noexcept {
        __extension__ typedef unsigned __int128 uwide;
        std::uint64_t q = static_cast<std::uint64_t>((static_cast<uwide>(e) * inv_tick_) >> 64);
        const auto t = static_cast<std::uint64_t>(tick_);
        if (e - q * t >= t) ++q;
        return q;
    }

    // The last tick whose boundary is at or before now (now >= origin).
    std::uint64_t floor_tick(rep now) const noexcept {
        if (now == never) return std::numeric_limits<std::uint64_t>::max() - 1;  // the end of time
        rep e;
        if (!__builtin_sub_overflow(now, origin_, &e))
            return div_tick(static_cast<std::uint64_t>(e));
        return static_cast<std::uint64_t>((static_cast<wide>(now) - origin_) / tick_);
    }

    // boundary(k) = origin + k * tick, saturated to time_point::max().
    rep boundary_rep(std::uint64_t k) const noexcept {
        const wide b = static_cast<wide>(origin_) + static_cast<wide>(k) * tick_;
        return b >= never ? never : static_cast<rep>(b);
    }
    time_point boundary(std::uint64_t k) const noexcept {
        return time_point{duration{boundary_rep(k)}};
    }

    // The first i in [from, count) such that bucket (start + i) & mask is non-empty, else count.
    std::size_t next_nonempty(std::size_t start, std::size_t count,
                              std::size_t from = 0) const noexcept {
        while (from < count) {
            const std::size_t b = (start + from) & mask_;
            const std::uint64_t word = bits_[b >> 6] >> (b & 63);
            if (word) {
                const std::size_t i = from + static_cast<std::size_t>(std::countr_zero(word));
                // Bits past the end of the ring (w < 64) are never set, so i stays in range
                // unless the run crosses the ring's end; then wrap and look again.
                const std::size_t room = std::min<std::size_t>(64 - (b & 63), mask_ + 1 - b);
                if (static_cast<std::size_t>(std::countr_zero(word)) < room)
                    return std::min(i, count);
                from += room;
            } else {
                from += std::min<std::size_t>(64 - (b & 63), mask_ + 1 - b);
            }
        }
        return count;
    }

    rep origin_;
    rep tick_;
    std::uint64_t inv_tick_;  // floor((2^64 - 1) / tick)
    std::size_t mask_ = 0;
    std::uint64_t cursor_ = 0;  // the first tick not yet processed
    std::size_t size_ = 0;
    near_window<Clock> window_;  // the opened tick's nodes, and any linked behind the cursor
    std::vector<bucket> buckets_;
    std::vector<std::uint64_t> bits_;  // bit b: buckets_[b] is non-empty
    staging<Clock> staged_;            // nodes linked since the last pass, one lane per thread
};

}  // namespace delayq::detail
