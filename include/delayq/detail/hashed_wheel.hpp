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
// of the buckets it visits whose slot has come: deadline <= boundary(tick(now)) <= now. A node
// whose slot is already behind the cursor (a deadline in the past), or before the origin (a clock
// that went back that far), goes to a separate `due` list that every expire() checks by deadline.
//
// Invariant: a node is in a bucket exactly when slot(deadline) >= cursor and deadline >= origin
// (the cursor passes a slot only after taking out all of its nodes, and never moves back), else in
// `due`. So unlink() finds a node's list from its deadline, with no tag in the node.
//
// next_expiry() is when the next expire() will have work: the boundary of the earliest non-empty
// slot (or a past time when the due list holds something). A bitmap of non-empty buckets lets it
// and expire() skip empty buckets, so an idle ring costs nothing and a sparse one little.
//
// Arithmetic is done in Clock::rep with 128-bit intermediates where it could overflow, so deadlines
// anywhere on the time line (time_point::max() included) are placed correctly.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "bucket.hpp"
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

    static constexpr std::size_t max_ticks_per_wheel = std::size_t{1} << 30;

    /// Throws std::invalid_argument for tick <= 0, ticks_per_wheel == 0 or > 2^30.
    hashed_wheel_ring(duration tick, std::size_t ticks_per_wheel, time_point origin)
        : origin_(origin.time_since_epoch().count()), tick_(tick.count()) {
        if (tick <= duration::zero()) throw std::invalid_argument("delayq: tick must be > 0");
        inv_tick_ = std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(tick_);
        if (ticks_per_wheel == 0 || ticks_per_wheel > max_ticks_per_wheel)
            throw std::invalid_argument("delayq: ticks_per_wheel must be in [1, 2^30]");
        const std::size_t w = std::bit_ceil(ticks_per_wheel);
        mask_ = w - 1;
        buckets_ = std::vector<bucket>(w);
        bits_.resize((w + 63) / 64);
    }

    hashed_wheel_ring(const hashed_wheel_ring&) = delete;
    hashed_wheel_ring& operator=(const hashed_wheel_ring&) = delete;

    std::size_t size() const noexcept { return size_; }
    std::size_t buckets() const noexcept { return mask_ + 1; }
    duration tick() const noexcept { return duration{tick_}; }

    /// Nothing to prepare: linking never allocates.
    void prepare(time_point) noexcept {}

    /// Links n (not in the ring) by its deadline. Returns when it comes out: the boundary of its
    /// slot, or its deadline if that slot is already behind the cursor.
    time_point link(node* n) noexcept {
        const rep d = n->deadline.time_since_epoch().count();
        const std::uint64_t s = slot(d);
        ++size_;
        if (in_due(d, s)) {
            due_.push_back(n);
            if (d < due_min_) due_min_ = d;
            return n->deadline;
        }
        const std::size_t b = static_cast<std::size_t>(s) & mask_;
        bucket& k = buckets_[b];
        if (k.count++ == 0) bits_[b >> 6] |= std::uint64_t{1} << (b & 63);
        k.nodes.push_back(n);
        if (d < k.min) k.min = d;
        return boundary(s);
    }

    /// Unlinks n, which this ring holds. O(1).
    void unlink(node* n) noexcept {
        node_list::unlink(n);
        --size_;
        const rep d = n->deadline.time_since_epoch().count();
        const std::uint64_t s = slot(d);
        if (in_due(d, s)) {
            if (due_.empty()) due_min_ = never;
            return;
        }
        const std::size_t b = static_cast<std::size_t>(s) & mask_;
        bucket& k = buckets_[b];
        if (--k.count == 0) {
            k.min = never;
            bits_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
        }
    }

    /// Unlinks every node due at `now` and hands each to sink(node*), in no particular order;
    /// returns how many. `worked`: whether anything came out.
    template <class Sink>
    std::size_t expire(time_point now_tp, Sink&& sink, bool& worked) noexcept {
        const rep now = now_tp.time_since_epoch().count();
        std::size_t count = 0;
        auto out = [&](node_links* n) {
            node_list::unlink(n);
            sink(node::of(n));
            ++count;
        };
        if (due_min_ <= now) {
            rep lo = never;
            for (node_links* l = due_.head.next; l != &due_.head;) {
                node_links* next = l->next;
                const rep d = node::of(l)->deadline.time_since_epoch().count();
                if (d <= now) {
                    out(l);
                } else if (d < lo) {
                    lo = d;
                }
                l = next;
            }
            due_min_ = lo;
        }
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
                        rep lo = never;
                        k.nodes.for_each([&](node_links* l) {
                            const rep d = node::of(l)->deadline.time_since_epoch().count();
                            if (d <= limit) {
                                out(l);
                                --k.count;
                            } else if (d < lo) {
                                lo = d;
                            }
                        });
                        k.min = lo;
                        if (k.count == 0) bits_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
                    }
                }
                cursor_ = t + 1;
            }
        }
        size_ -= count;
        worked = worked || count != 0;
        return count;
    }

    /// When expire() will next have work: nullopt when the ring is empty; a time <= now when
    /// something is due already. Never later than the earliest deadline's slot boundary.
    std::optional<time_point> next_expiry() const noexcept {
        if (size_ == 0) return std::nullopt;
        rep best = due_min_;
        const std::size_t w = mask_ + 1;
        const std::size_t start = static_cast<std::size_t>(cursor_) & mask_;
        for (std::size_t i = next_nonempty(start, w); i < w; i = next_nonempty(start, w, i + 1)) {
            const std::uint64_t k = cursor_ + i;  // the first tick this bucket stands for
            const rep bk = boundary_rep(k);
            if (bk >= best) break;  // later buckets stand for later ticks still
            const bucket& b = buckets_[(start + i) & mask_];
            const rep cand = boundary_rep(std::max(slot(b.min), k));
            if (cand < best) best = cand;
        }
        return time_point{duration{best}};
    }

    /// Unlinks every node and returns them chained through `next` (prev null), in no order.
    node_links* take_all() noexcept {
        node_links* chain = due_.detach_onto(nullptr);
        due_min_ = never;
        for (auto& k : buckets_) {
            if (k.count == 0) continue;
            chain = k.nodes.detach_onto(chain);
            k.count = 0;
            k.min = never;
        }
        std::fill(bits_.begin(), bits_.end(), 0);
        size_ = 0;
        return chain;
    }

  private:
    static constexpr rep never = std::numeric_limits<rep>::max();

    // Whether a node due at d (slot s) belongs in the due list: its slot is behind the cursor, or
    // it is before the origin (the clock went back that far), where no tick boundary is <= d.
    bool in_due(rep d, std::uint64_t s) const noexcept { return s < cursor_ || d < origin_; }
    __extension__ typedef __int128 wide;

    struct bucket {
        laned_list<8> nodes;
        std::size_t count = 0;
        rep min = never;  // a lower bound of the deadlines held (exact after a pass)
    };

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
    node_list due_;  // nodes whose slot was already behind the cursor
    rep due_min_ = never;
    std::vector<bucket> buckets_;
    std::vector<std::uint64_t> bits_;  // bit b: buckets_[b] is non-empty
};

}  // namespace delayq::detail
