// due_batch: the tasks one pass of a wheel found due, in the order they run: the heap's order,
// deadline first, then first in, first out (the node's sequence number). Not thread-safe.
//
// The idea. A wheel's buckets give a pass its due nodes roughly by time but not in order: a bucket
// mixes the deadlines of a whole tick, a late pass empties several buckets (a hierarchical one
// several levels). So a pass sorts what it found (deadline_sort.hpp). Already sorted input, the
// common case of a pass on time, is detected while gathering and costs nothing more.
//
// Runs. A ring hands its nodes over bucket by bucket (next_run() between two), and the buckets of
// a late pass come in time order: a hashed wheel's ticks one after the other, a hierarchical
// wheel's buckets by expiry. Then sorting each bucket's run on its own, while it is in cache, puts
// the whole batch in order; a run that starts before the one before it ended (buckets whose times
// overlap: a hierarchical wheel's levels, a hashed wheel late by more than a rotation) sends the
// batch to one sort of the whole (docs/performance.md, "expire", has what the runs bought).
//
// The sorted batch is an array of node pointers, so that running it can prefetch the nodes ahead:
// a large batch then waits for several cache misses at once. The arrays are kept between passes
// (and given back after a large one). If they cannot be had (out of memory), the batch is sorted
// in place as a linked list (a merge sort through `next`) and run from there: slower, never a
// failure. The chain runs through the nodes' own links, which the ring needs back when a node
// leaves the batch for it (reschedule()): such a node is taken out of the chain first (remove(), a
// walk along it), and stop() takes the rest of the batch whole (take_from()).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "deadline_sort.hpp"
#include "huge_pages.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

/// Sorts a chain of n nodes by (deadline, seq), through `next`; returns its new head. A merge
/// sort: no allocation, recursion log2(n) deep.
template <class Clock>
node_links* sort_chain(node_links* h, std::size_t n) noexcept {
    using node = timer_node<Clock>;
    if (n < 2) {
        if (h) h->next = nullptr;
        return h;
    }
    node_links* mid = h;
    for (std::size_t i = 1; i < n / 2; ++i) mid = mid->next;
    node_links* second = mid->next;
    mid->next = nullptr;
    node_links* a = sort_chain<Clock>(h, n / 2);
    node_links* b = sort_chain<Clock>(second, n - n / 2);
    node_links* out = nullptr;
    node_links** t = &out;
    while (a && b) {
        if (node::before(*node::of(b), *node::of(a))) {
            *t = b;
            b = b->next;
        } else {
            *t = a;
            a = a->next;
        }
        t = &(*t)->next;
    }
    *t = a ? a : b;
    return out;
}

template <class Clock>
class due_batch {
  public:
    using node = timer_node<Clock>;

    /// Starts a new batch (the last one cleared) of at most `most` nodes.
    void begin(std::size_t most) noexcept {
        most_ = most;
        recs_.clear();
        chain_ = nullptr;
        count_ = 0;
        in_array_ = true;
        run_start_ = 0;
        run_sorted_ = true;
        runs_ordered_ = true;
    }

    /// The nodes added from now on are another bucket's (see "Runs" above).
    void next_run() noexcept {
        end_run();
        run_start_ = recs_.size();
        run_sorted_ = true;
    }

    /// Adds a due node (its `next` is the batch's from now on).
    // NOLINTNEXTLINE(bugprone-exception-escape): push_back only after room was made
    void add(node* n) noexcept {
        ++count_;
        if (in_array_) {
            if (recs_.size() == recs_.capacity()) {
                if (!grow()) to_chain();
            }
            if (in_array_) {
                if (recs_.size() > run_start_ && node::before(*n, *recs_.back().n))
                    run_sorted_ = false;
                recs_.push_back(rec::of(n));
                return;
            }
        }
        n->next = chain_;
        chain_ = n;
    }

    /// Puts the batch in running order.
    void finish() noexcept {
        end_run();
        if (in_array_ && (runs_ordered_ || radix_sort())) return;
        to_chain();
        chain_ = sort_chain<Clock>(chain_, count_);
    }

    std::size_t size() const noexcept { return count_; }

    /// The i-th node to run; prefetches a few ahead. i goes up from 0, one at a time.
    node* at(std::size_t i) noexcept {
        if (!in_array_) {
            node* n = node::of(chain_);
            chain_ = chain_->next;
            return n;
        }
        constexpr std::size_t ahead = 8;
        if (i + ahead < count_) __builtin_prefetch(recs_[i + ahead].n, 1);
        return recs_[i].n;
    }

    /// Hands every node from position `from` (the first that at() has not returned) on to
    /// f(node), which may reuse its links, and ends the batch there (for stop(), which takes what
    /// has not run yet).
    template <class F>
    void take_from(std::size_t from, F&& f) {
        if (in_array_) {
            for (std::size_t i = from; i < count_; ++i) f(recs_[i].n);
        } else {
            for (node_links* l = chain_; l;) {
                node_links* next = l->next;
                f(node::of(l));
                l = next;
            }
            chain_ = nullptr;
        }
        count_ = from;
    }

    /// Takes n, which at() has not returned yet, out of the batch if the batch is a chain (its
    /// links are then free again; O(the nodes after it)): true. An array keeps it: false.
    bool remove(const node* n) noexcept {
        if (in_array_) return false;
        for (node_links** l = &chain_; *l; l = &(*l)->next) {
            if (*l == n) {
                *l = (*l)->next;
                --count_;
                return true;
            }
        }
        return false;
    }

    /// Done with the batch: keeps the arrays for the next one unless they are large.
    void clear() noexcept {
        constexpr std::size_t keep = std::size_t{1} << 14;
        if (recs_.capacity() > keep) {
            decltype(recs_)().swap(recs_);
            tmp_ = sort_scratch<Clock>{};
        } else {
            recs_.clear();
        }
        chain_ = nullptr;
        count_ = 0;
        in_array_ = true;
    }

  private:
    using rec = deadline_rec<Clock>;

    bool radix_sort() noexcept { return sort_by_deadline(recs_, tmp_); }

    // Makes room for one more record; false if none can be had. Small batches double; one that
    // outgrows 4 096 records is a late pass, and gets room for the most it can hold at once: the
    // pages it does not touch cost nothing, and the copies and the fresh pages of each doubling
    // (a fifth of a 1M pass on this VM, where first touch is dear) are saved.
    bool grow() noexcept {
        const std::size_t cap = recs_.capacity();
        const std::size_t doubled = std::max<std::size_t>(64, 2 * cap);
        if (cap >= 4096 && most_ > doubled && reserve(most_)) return true;
        return reserve(doubled);  // a small batch, or no room for the most: doubling
    }

    bool reserve(std::size_t n) noexcept {
        try {
            recs_.reserve(n);
            return true;
        } catch (...) {
            return false;
        }
    }

    // Sorts the run under way, and notes whether it follows the one before in order.
    void end_run() noexcept {
        if (!in_array_ || !runs_ordered_) return;  // one sort of the whole will do
        const std::size_t n = recs_.size() - run_start_;
        if (n == 0) return;
        rec* run = recs_.data() + run_start_;
        if (!run_sorted_ && (n > deadline_run_max || !sort_run_by_deadline(run, n, tmp_))) {
            runs_ordered_ = false;
            return;
        }
        if (run_start_ != 0 && node::before(*run[0].n, *run[-1].n)) runs_ordered_ = false;
    }

    // From the array to the chain (when the array cannot grow or be sorted): no allocation.
    void to_chain() noexcept {
        for (const rec& r : recs_) {
            r.n->next = chain_;
            chain_ = r.n;
        }
        recs_.clear();
        in_array_ = false;
    }

    deadline_recs<Clock> recs_;
    sort_scratch<Clock> tmp_;
    node_links* chain_ = nullptr;  // the batch when it could not be put in an array
    std::size_t count_ = 0;
    std::size_t most_ = 0;  // begin(): the most nodes this batch can get
    bool in_array_ = true;
    std::size_t run_start_ = 0;  // where the run under way starts in recs_
    bool run_sorted_ = true;     // the run under way came in running order
    bool runs_ordered_ = true;   // the runs so far, each sorted, are in running order
};

}  // namespace delayq::detail
