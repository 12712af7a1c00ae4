// near_window: the pending nodes of the tick under way — and any whose tick a wheel has already
// passed — in deadline order, so that a wheel runs each task at its own deadline instead of at its
// tick's boundary. Not thread-safe.
//
// The idea. A wheel's bucket says only "due within this tick". When the clock enters a tick, the
// wheel opens that tick's bucket: what is due already goes out, the rest comes here, sorted once
// (deadline_sort.hpp; a sorted array is consumed from its front). From then on each pass takes the
// window's due prefix, and the driver sleeps until the window's first deadline: one wake-up per
// distinct deadline, each at that deadline. A node linked after its tick was opened (a short
// delay, a deadline in the past, a clock that went back) joins a small binary heap beside the
// array; a pass merges the two fronts. So a node costs one sort (or one heap push and pop) more
// than with tick-rounded firing, and nothing when its whole tick is late anyway.
//
// A node here has prev == node_links::window_mark() or heap_mark() and its index in `next`:
// unlink() is O(1) for the array (the slot becomes a hole that the front skips) and O(log h) for
// the heap.
//
// Memory. Room is made at schedule time, where an exception is harmless: the array's and the
// heap's for as many nodes as the wheel holds (reserve(), with a room_key: room.hpp), the most a
// link or a pass can put here. So neither insert() nor a pass allocates, and stage() cannot fail.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "deadline_sort.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

template <class Clock>
class near_window {
  public:
    using node = timer_node<Clock>;
    using time_point = typename Clock::time_point;

    std::size_t size() const noexcept { return live_ + heap_.size(); }
    bool empty() const noexcept { return size() == 0; }

    /// Whether n is in this window.
    static bool holds(const node* n) noexcept {
        return n->prev == sorted_marker() || n->prev == heap_marker();
    }

    /// Room for n nodes (as many as the wheel holds), linked here by insert() or staged by passes
    /// into the array or, while it holds nodes from before, the heap. Throws std::bad_alloc; then
    /// the room is as it was.
    void reserve(std::size_t n, room_key key) {
        reserve_sort_room(sorted_, scratch_, n, key);
        heap_.reserve(n, key);
    }

    /// Adds n (room reserved). O(log h).
    void insert(node* n) noexcept {
        heap_.push_back(rec::of(n));
        sift_up(heap_.size() - 1);
    }

    /// During a pass: adds n, to be sorted by end_stage(). Pre: reserve() was called with a count
    /// that n and every other node this window holds are part of.
    void stage(node* n) noexcept {
        if (live_ != 0 && !staging_) {
            // the array still holds nodes from before this pass: merge by the heap instead
            insert(n);
            return;
        }
        if (!staging_) {
            sorted_.clear();
            pos_ = 0;
            staging_ = true;
        }
        sorted_.push_back(rec::of(n));
        n->prev = sorted_marker();  // the index is set by end_stage()
        ++live_;
    }

    /// Ends a pass's staging: sorts what the array holds.
    void end_stage() noexcept {
        if (!staging_) return;
        staging_ = false;
        sort_by_deadline(sorted_, scratch_);
        for (std::size_t i = 0; i < sorted_.size(); ++i) set_index(sorted_[i].n, i);
    }

    /// Unlinks n, which this window holds.
    void unlink(node* n) noexcept {
        const std::size_t i = index_of(n);
        if (n->prev == sorted_marker()) {
            sorted_[i].n = nullptr;
            --live_;
            skip_holes();
        } else {
            erase_heap(i);
        }
        n->prev = n->next = nullptr;
    }

    /// The earliest deadline held, if any.
    std::optional<time_point> next() const noexcept {
        const node* a = front();
        const node* b = heap_.empty() ? nullptr : heap_[0].n;
        if (!a && !b) return std::nullopt;
        if (!a) return b->deadline;
        if (!b) return a->deadline;
        return std::min(a->deadline, b->deadline);
    }

    /// Unlinks every node due at `now` and hands each to sink(node*), earliest first; returns how
    /// many.
    template <class Sink>
    // NOLINTNEXTLINE(bugprone-exception-escape): sinks append only where room was made
    std::size_t take_due(time_point now, Sink&& sink) noexcept {
        std::size_t count = 0;
        for (;;) {
            node* a = front();
            node* b = heap_.empty() ? nullptr : heap_[0].n;
            node* n = !b || (a && node::before(*a, *b)) ? a : b;
            if (!n || now < n->deadline) return count;
            unlink(n);
            sink(n);
            ++count;
        }
    }

    /// Unlinks every node and hands each to f(node*) (prev null; f may reuse next).
    template <class F>
    void take_all(F&& f) noexcept {
        auto out = [&](node* n) {
            n->prev = nullptr;
            f(n);
        };
        for (std::size_t i = pos_; i < sorted_.size(); ++i)
            if (sorted_[i].n) out(sorted_[i].n);
        for (auto& r : heap_) out(r.n);
        empty_array();
        heap_.clear();
        live_ = 0;
    }

  private:
    using rec = deadline_rec<Clock>;

    static node_links* sorted_marker() noexcept { return node_links::window_mark(); }
    static node_links* heap_marker() noexcept { return node_links::heap_mark(); }

    static void set_index(node* n, std::size_t i) noexcept {
        // NOLINTNEXTLINE(performance-no-int-to-ptr): an index, never dereferenced
        n->next = reinterpret_cast<node_links*>(static_cast<std::uintptr_t>(i));
    }
    static std::size_t index_of(const node* n) noexcept {
        return static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(n->next));
    }

    node* front() const noexcept { return pos_ < sorted_.size() ? sorted_[pos_].n : nullptr; }

    void skip_holes() noexcept {
        while (pos_ < sorted_.size() && !sorted_[pos_].n) ++pos_;
        if (pos_ == sorted_.size() && !staging_) empty_array();
    }

    // The array is done with: its room stays, the pages of a large one go back.
    void empty_array() noexcept {
        empty_sort_room(sorted_, scratch_);
        pos_ = 0;
    }

    // ---- the heap: ordered by node::before, each node's index in its `next` ----

    void place(std::size_t i, rec r) noexcept {
        heap_[i] = r;
        r.n->prev = heap_marker();
        set_index(r.n, i);
    }

    void sift_up(std::size_t i) noexcept {
        const rec r = heap_[i];
        while (i > 0) {
            const std::size_t parent = (i - 1) / 2;
            if (!node::before(*r.n, *heap_[parent].n)) break;
            place(i, heap_[parent]);
            i = parent;
        }
        place(i, r);
    }

    void sift_down(std::size_t i) noexcept {
        const rec r = heap_[i];
        const std::size_t n = heap_.size();
        for (;;) {
            std::size_t c = 2 * i + 1;
            if (c >= n) break;
            if (c + 1 < n && node::before(*heap_[c + 1].n, *heap_[c].n)) ++c;
            if (!node::before(*heap_[c].n, *r.n)) break;
            place(i, heap_[c]);
            i = c;
        }
        place(i, r);
    }

    void erase_heap(std::size_t i) noexcept {
        const rec last = heap_.back();
        heap_.pop_back();
        if (i == heap_.size()) return;
        place(i, last);
        sift_down(i);
        sift_up(index_of(last.n));
    }

    deadline_recs<Clock> sorted_;  // a tick's nodes, sorted; holes where unlinked
    sort_scratch<Clock> scratch_;  // for the sort
    deadline_recs<Clock> heap_;
    std::size_t pos_ = 0;   // the first entry of sorted_ not taken
    std::size_t live_ = 0;  // entries of sorted_ that are not holes
    bool staging_ = false;
};

}  // namespace delayq::detail
