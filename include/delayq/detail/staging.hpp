// staging: where a wheel's new links wait, one lane per linking thread, before they go to their
// buckets in bulk. Not thread-safe (the wheel's lock covers it, as it covers the buckets).
//
// The idea. Linking a node into its bucket writes that bucket's lines and the bucket's last node.
// With random deadlines over a large wheel, the last node is one linked thousands of links ago,
// long gone from the cache: every schedule waits for a miss under the lock. With two threads
// scheduling, each such line was also last written by the other core, and the hashed wheel's
// schedules slowed down several times over (docs/performance.md, "staging"). So a
// schedule links its node at the end of the calling thread's lane instead (the node it links after
// is one this thread linked a few schedules before: in its cache), and a lane moves to the buckets
// ("settles") once it holds `settle_at` nodes, in one loop whose iterations do not depend on each
// other: the CPU overlaps their misses. A lane is itself a striped_list (bucket.hpp) whose
// `stripes` lists take its links in turn, so that settling walks that many chains at once, each
// one's next node prefetched: a lane of one chain is walked one miss after another once its nodes
// have left the cache, as they have when they are blocks freed by earlier cancels, scattered over
// the pool (docs/performance.md, "cancel + schedule"). The wheel settles everything before a pass
// moves its time (a staged node's place depends on it), when it has it all handed over (take_all),
// and that is all it needs to do.
//
// Only the hashed wheel stages. The hierarchical one tried it and lost: with Kafka's 20 buckets a
// level, the few bucket tails its schedules write stay in cache anyway, and settling re-reads each
// node and works out its level and bucket again (two divisions), so its inserts were slower.
//
// A staged node is in a list like any other, so unlinking it (cancel) is the same O(1). min() is a
// lower bound of the staged deadlines for the wheel's next expiry: exact, or early after the
// earliest staged node was cancelled (then one early wake-up, whose pass settles and looks again).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <iterator>
#include <limits>

#include "bucket.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

template <class Clock>
class staging {
  public:
    using node = timer_node<Clock>;
    using rep = typename Clock::duration::rep;
    static constexpr rep never = std::numeric_limits<rep>::max();

    /// A lane settles when it holds settle_at nodes (>= 1).
    explicit staging(std::size_t settle_at) noexcept : settle_at_(settle_at) {}

    /// A lower bound of the staged deadlines (never when none was staged since the last settle).
    rep min() const noexcept { return min_; }

    /// Links n (due at d, in no list) at the end of the calling thread's lane. When that lane
    /// then holds settle_at nodes, hands each of them, unlinked, to place(node*).
    template <class Place>
    void push(node* n, rep d, Place&& place) noexcept {
        const std::size_t l = thread_lane() & (lanes - 1);
        lane_[l].push_back_to(count_[l], n);  // its stripes in turn
        any_ = true;
        if (d < min_) min_ = d;
        if (++count_[l] >= settle_at_) {
            count_[l] = 0;
            lane_[l].drain([&](node_links* c) { place(node::of(c)); });
        }
    }

    /// Hands every staged node, unlinked, to place(node*): lane by lane, each lane's stripes in
    /// turn. place may link the node anywhere.
    template <class Place>
    void settle(Place&& place) noexcept {
        if (!any_) return;
        for (auto& lane : lane_) lane.drain([&](node_links* l) { place(node::of(l)); });
        reset();
    }

    /// Hands every staged node to f(node*), unlinked (prev null; f may reuse next).
    template <class F>
    void take_all(F&& f) noexcept {
        for (auto& lane : lane_) lane.unlink_all([&](node_links* l) { f(node::of(l)); });
        reset();
    }

  private:
    static constexpr std::size_t lanes = 8;
    static constexpr std::size_t stripes = 8;

    void reset() noexcept {
        std::fill(std::begin(count_), std::end(count_), std::size_t{0});
        min_ = never;
        any_ = false;
    }

    // A small number of the calling thread's own (for its lane), given out in turn.
    static std::size_t thread_lane() noexcept {
        static std::atomic<std::size_t> given{0};
        thread_local std::size_t mine = 0;  // 0: none yet
        if (mine == 0) mine = given.fetch_add(1, std::memory_order_relaxed) + 1;
        return mine;
    }

    striped_list<stripes> lane_[lanes];  // one lane per thread
    std::size_t count_[lanes] = {};      // links into each lane since it settled
    rep min_ = never;                    // <= the earliest staged deadline
    bool any_ = false;                   // something was staged since the last settle
    std::size_t settle_at_;
};

}  // namespace delayq::detail
