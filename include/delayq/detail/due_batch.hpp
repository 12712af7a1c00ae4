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
// Room. The sorted batch is an array of node pointers, so that running it can prefetch the nodes
// ahead: a large batch then waits for several cache misses at once. A batch holds at most every
// pending node, and the wheel reserves room for that many when it schedules (reserve(), where an
// exception is harmless): so a pass never allocates and cannot fail for memory, and there is no
// second way to sort. The room is address space more than memory: a late pass touches it, and
// clear() hands the pages past the first 16 Ki records back (huge_pages.hpp, "Reserved, not
// resident").
#pragma once

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "deadline_sort.hpp"
#include "huge_pages.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

/// Sorts a chain of n nodes by (deadline, seq), through `next`; returns its new head. A merge
/// sort: no allocation, recursion log2(n) deep. For stop() in a destructor that finds no room for
/// its records.
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

    /// Room for a batch of n nodes (as many as the wheel holds). Throws std::bad_alloc; then the
    /// room still holds every batch it held before.
    void reserve(std::size_t n) { reserve_sort_room(recs_, tmp_, n); }

    /// Starts a new batch (the last one cleared).
    void begin() noexcept {
        recs_.clear();
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

    /// Adds a due node. Pre: the room reserved holds it (a batch holds pending nodes only).
    // NOLINTNEXTLINE(bugprone-exception-escape): push_back into room reserved
    void add(node* n) noexcept {
        assert(recs_.size() < recs_.capacity() && "reserve() made room for every pending node");
        if (recs_.size() > run_start_ && node::before(*n, *recs_.back().n)) run_sorted_ = false;
        recs_.push_back(rec::of(n));
    }

    /// Puts the batch in running order.
    void finish() noexcept {
        end_run();
        if (!runs_ordered_) sort(sort_by_deadline(recs_, tmp_));
    }

    std::size_t size() const noexcept { return recs_.size(); }

    /// The i-th node to run; prefetches a few ahead.
    node* at(std::size_t i) noexcept {
        constexpr std::size_t ahead = 8;
        if (i + ahead < recs_.size()) __builtin_prefetch(recs_[i + ahead].n, 1);
        return recs_[i].n;
    }

    /// Hands every node from position `from` (the first that at() has not returned) on to
    /// f(node), which may reuse its links, and ends the batch there (for stop(), which takes what
    /// has not run yet).
    template <class F>
    void take_from(std::size_t from, F&& f) {
        for (std::size_t i = from; i < recs_.size(); ++i) f(recs_[i].n);
        while (recs_.size() > from) recs_.pop_back();
    }

    /// Done with the batch: the room stays, its pages past the first 16 Ki records go back.
    void clear() noexcept { empty_sort_room(recs_, tmp_); }

  private:
    using rec = deadline_rec<Clock>;

    // The sorts cannot fail here: reserve() gave them their room.
    static void sort([[maybe_unused]] bool sorted) noexcept {
        assert(sorted && "reserve() made the sort's room");
    }

    // Sorts the run under way, and notes whether it follows the one before in order.
    void end_run() noexcept {
        if (!runs_ordered_) return;  // one sort of the whole will do
        const std::size_t n = recs_.size() - run_start_;
        if (n == 0) return;
        rec* run = recs_.data() + run_start_;
        if (!run_sorted_) {
            if (n > deadline_run_max) {
                runs_ordered_ = false;
                return;
            }
            sort(sort_run_by_deadline(run, n, tmp_));
        }
        if (run_start_ != 0 && node::before(*run[0].n, *run[-1].n)) runs_ordered_ = false;
    }

    reserved_recs<Clock> recs_;
    reserved_scratch<Clock> tmp_;
    std::size_t run_start_ = 0;  // where the run under way starts in recs_
    bool run_sorted_ = true;     // the run under way came in running order
    bool runs_ordered_ = true;   // the runs so far, each sorted, are in running order
};

}  // namespace delayq::detail
