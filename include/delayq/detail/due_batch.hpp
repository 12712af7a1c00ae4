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
// clear() hands the pages past the first 16 Ki records back (room.hpp). stop() sorts what it takes
// in the same room (give_up()).
#pragma once

#include <cstddef>

#include "deadline_sort.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

template <class Clock>
class due_batch {
  public:
    using node = timer_node<Clock>;

    /// Room for a batch of n nodes (as many as the wheel holds). Throws std::bad_alloc; then the
    /// room still holds every batch it held before.
    void reserve(std::size_t n, room_key key) { reserve_sort_room(recs_, tmp_, n, key); }

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
    void add(node* n) noexcept {
        if (recs_.size() > run_start_ && node::before(*n, *recs_.back().n)) run_sorted_ = false;
        recs_.push_back(rec::of(n));
    }

    /// Puts the batch in running order.
    void finish() noexcept {
        end_run();
        if (!runs_ordered_) sort_by_deadline(recs_, tmp_);
    }

    std::size_t size() const noexcept { return recs_.size(); }

    /// The i-th node to run; prefetches a few ahead.
    node* at(std::size_t i) noexcept {
        constexpr std::size_t ahead = 8;
        if (i + ahead < recs_.size()) __builtin_prefetch(recs_[i + ahead].n, 1);
        return recs_[i].n;
    }

    /// What give_up() hands over: the batch's room.
    struct room {
        deadline_recs<Clock> recs;
        sort_scratch<Clock> scratch;
    };

    /// For stop(), which ends the batch and sorts what it takes in the batch's room (a stopped
    /// wheel runs no more passes): hands over the records, holding the nodes from position `from`
    /// on (the first that at() has not returned; size() when no pass is under way) at their front,
    /// and the sort's scratch. The batch is left empty and without room: a pass under way finds
    /// nothing more to run.
    room give_up(std::size_t from) noexcept {
        room r;
        r.recs.swap(recs_);
        r.scratch.recs.swap(tmp_.recs);
        r.scratch.bins.swap(tmp_.bins);
        const std::size_t n = r.recs.size() - from;
        for (std::size_t i = 0; i < n; ++i) r.recs[i] = r.recs[from + i];
        r.recs.set_size(n);
        return r;
    }

    /// Done with the batch: the room stays, its pages past the first 16 Ki records go back.
    void clear() noexcept { empty_sort_room(recs_, tmp_); }

  private:
    using rec = deadline_rec<Clock>;

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
            sort_run_by_deadline(run, n, tmp_);
        }
        if (run_start_ != 0 && node::before(*run[0].n, *run[-1].n)) runs_ordered_ = false;
    }

    deadline_recs<Clock> recs_;
    sort_scratch<Clock> tmp_;
    std::size_t run_start_ = 0;  // where the run under way starts in recs_
    bool run_sorted_ = true;     // the run under way came in running order
    bool runs_ordered_ = true;   // the runs so far, each sorted, are in running order
};

}  // namespace delayq::detail
