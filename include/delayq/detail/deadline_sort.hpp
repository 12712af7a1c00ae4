// Sorting a pass's due nodes into the heap's order (deadline, then first in, first out), for
// due_batch and near_window.
//
// The idea. Deadlines are 64-bit, but the nodes of one pass span little (a late pass of a minute
// spans 2^36 ns). So: sort records (deadline, node) by (deadline - earliest), a radix sort over
// only the digits that span has — one most-significant-digit pass into 2048 bins when the batch
// is large, then each bin, small enough to stay in cache, least significant digit first, 8 bits a
// pass — which keeps the input order among equal deadlines; equal deadlines (rare, and in short
// runs) are then put in sequence order. A few records are insertion-sorted instead.
//
// sort_run_by_deadline sorts one part of an array the same way, least significant digit first
// only, and leaves the keys as they were: for a pass that gathers its nodes bucket by bucket, in
// time order, where sorting each bucket's part (in cache) puts the whole in order (due_batch.hpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "room.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

template <class Clock>
struct deadline_rec {
    std::uint64_t key;  // the deadline as an unsigned count (scrambled by a sort: read n->deadline)
    timer_node<Clock>* n;

    static deadline_rec of(timer_node<Clock>* n) noexcept {
        return {static_cast<std::uint64_t>(n->deadline.time_since_epoch().count()), n};
    }
};

/// A sort's records in room reserved ahead (room.hpp): a pass's, and stop()'s.
template <class Clock>
using deadline_recs = room_array<deadline_rec<Clock>>;

inline constexpr unsigned deadline_top_digit = 11;
inline constexpr std::size_t deadline_top_radix = std::size_t{1} << deadline_top_digit;

/// What a sort needs beside its input: room for a copy of the records, and the bins of a large
/// sort. Kept by its owner from one sort to the next; one whose room was reserved for n records
/// sorts up to n.
template <class Clock>
struct sort_scratch {
    deadline_recs<Clock> recs;
    // in room, not 32 KiB of the caller's stack: a pass may run on a coroutine's or a fiber's
    // small stack
    room_array<std::size_t> bins;

    /// Room to sort n records. Throws std::bad_alloc.
    void reserve(std::size_t n, room_key key) {
        if (n >= 4096 && bins.capacity() == 0) {
            bins.reserve(2 * deadline_top_radix + 1, key);
            bins.set_size(2 * deadline_top_radix + 1);
        }
        recs.reserve(n, key);
    }
};

/// Room for v to hold n records, and for s to sort them. Throws std::bad_alloc; then the room
/// holds what it held before.
template <class Clock>
void reserve_sort_room(deadline_recs<Clock>& v, sort_scratch<Clock>& s, std::size_t n,
                       room_key key) {
    s.reserve(n, key);  // a sort of the whole swaps v and s.recs: both get the same room
    v.reserve(n, key);
}

/// Empties v and its scratch s (what a sort left there is of no use); after more than 16 Ki
/// records, the pages of their room past those go back (room_array::release_unused).
template <class Clock>
void empty_sort_room(deadline_recs<Clock>& v, sort_scratch<Clock>& s) noexcept {
    constexpr std::size_t keep = std::size_t{1} << 14;
    const bool large = v.size() > keep;
    v.clear();
    s.recs.clear();
    if (large) {
        v.release_unused(keep);
        s.recs.release_unused(keep);
    }
}

// Least significant digit first, over the low `bits` bits of the keys of a[0..n), ping-ponging
// with `scratch`; stable. Returns where the sorted records are. Digits of at most MaxDigit bits,
// as few passes as that allows: 8 keeps the counts in a few lines (2 KiB of stack); 11 saves
// passes over a run of up to 2^18 records (counts of 32 bits: 8 KiB of stack).
template <unsigned MaxDigit = 8, class Rec>
Rec* lsd_sort(Rec* a, Rec* scratch, std::size_t n, unsigned bits) noexcept {
    static_assert(MaxDigit == 8 || MaxDigit == 11);
    using count = std::conditional_t<MaxDigit == 8, std::size_t, std::uint32_t>;
    if (bits == 0) return a;
    const unsigned passes = (bits + MaxDigit - 1) / MaxDigit;
    const unsigned digit = (bits + passes - 1) / passes;
    const std::size_t radix = std::size_t{1} << digit;
    count counts[std::size_t{1} << MaxDigit];
    for (unsigned shift = 0; shift < bits; shift += digit) {
        std::fill(counts, counts + radix, std::size_t{0});
        for (std::size_t i = 0; i < n; ++i) ++counts[(a[i].key >> shift) & (radix - 1)];
        count sum = 0;
        for (std::size_t d = 0; d < radix; ++d) {
            const count k = counts[d];
            counts[d] = sum;
            sum += k;
        }
        for (std::size_t i = 0; i < n; ++i)
            scratch[counts[(a[i].key >> shift) & (radix - 1)]++] = a[i];
        std::swap(a, scratch);
    }
    return a;
}

// Equal deadlines (equal keys) of v[0..n), sorted by key: sequence order. The radix passes kept
// the input order, which a bucket's stripes and a hierarchical wheel's levels do not make the
// schedule order. A few equal deadlines are insertion-sorted; many (timers all set for one
// instant) are sorted by their seqs in O(k log k): insertion-sorted, 300 000 of them in reverse
// took n^2 / 4 moves, hours (test_due_batch).
template <class Clock>
void order_equal_deadlines(deadline_rec<Clock>* v, std::size_t n) noexcept {
    using rec = deadline_rec<Clock>;
    using node = timer_node<Clock>;
    for (std::size_t i = 0; i < n;) {
        std::size_t j = i + 1;
        while (j < n && v[j].key == v[i].key) ++j;
        if (j - i <= 16) {
            for (std::size_t a = i + 1; a < j; ++a) {
                const rec r = v[a];
                std::size_t b = a;
                for (; b > i && node::seq_before(r.n->seq, v[b - 1].n->seq); --b) v[b] = v[b - 1];
                v[b] = r;
            }
        } else {
            // Seqs compare mod 2^32 (seq_before); counted from the run's first in, as numbers.
            const std::uint64_t key = v[i].key;
            std::uint32_t first = v[i].n->seq;
            for (std::size_t a = i + 1; a < j; ++a)
                if (node::seq_before(v[a].n->seq, first)) first = v[a].n->seq;
            for (std::size_t a = i; a < j; ++a) v[a].key = v[a].n->seq - first;
            std::sort(v + i, v + j, [](const rec& x, const rec& y) { return x.key < y.key; });
            for (std::size_t a = i; a < j; ++a) v[a].key = key;
        }
        i = j;
    }
}

// Insertion sort of v[0..n) by (deadline, seq): cheaper than radix passes for a few records.
template <class Clock>
void insertion_sort_by_deadline(deadline_rec<Clock>* v, std::size_t n) noexcept {
    for (std::size_t i = 1; i < n; ++i) {
        const deadline_rec<Clock> r = v[i];
        std::size_t j = i;
        for (; j > 0 && timer_node<Clock>::before(*r.n, *v[j - 1].n); --j) v[j] = v[j - 1];
        v[j] = r;
    }
}

// Deadlines are signed: flip the sign bit so that unsigned order is time order, then subtract the
// earliest, so that the keys of v[0..n) have only as many digits as their span needs. Returns the
// earliest (for key_offsets_undo) and how many bits the span has.
struct key_span {
    std::uint64_t lo;
    unsigned bits;
};
template <class Rec>
key_span key_offsets(Rec* v, std::size_t n) noexcept {
    constexpr std::uint64_t sign = std::uint64_t{1} << 63;
    std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
    for (std::size_t i = 0; i < n; ++i) {
        v[i].key ^= sign;
        lo = std::min(lo, v[i].key);
        hi = std::max(hi, v[i].key);
    }
    for (std::size_t i = 0; i < n; ++i) v[i].key -= lo;
    return {lo, static_cast<unsigned>(std::bit_width(hi - lo))};
}
// The keys as they were before key_offsets() (which returned `lo`).
template <class Rec>
void key_offsets_undo(Rec* v, std::size_t n, std::uint64_t lo) noexcept {
    constexpr std::uint64_t sign = std::uint64_t{1} << 63;
    for (std::size_t i = 0; i < n; ++i) v[i].key = (v[i].key + lo) ^ sign;
}

/// The most records sort_run_by_deadline() sorts: a larger run is left to sort_by_deadline().
inline constexpr std::size_t deadline_run_max = std::size_t{1} << 18;

/// Sorts v[0..n) (n <= deadline_run_max) by (deadline, seq), keys unchanged, using `scratch`.
/// Pre: scratch's room holds n records.
template <class Clock>
void sort_run_by_deadline(deadline_rec<Clock>* v, std::size_t n,
                          sort_scratch<Clock>& scratch_) noexcept {
    auto& scratch = scratch_.recs;
    if (n <= 32) {
        insertion_sort_by_deadline(v, n);
        return;
    }
    if (scratch.size() < n) scratch.set_size(n);
    const auto [lo, bits] = key_offsets(v, n);
    static_assert(deadline_run_max <= std::numeric_limits<std::uint32_t>::max());
    deadline_rec<Clock>* sorted = n < 4096 ? lsd_sort<8>(v, scratch.data(), n, bits)
                                           : lsd_sort<11>(v, scratch.data(), n, bits);
    if (sorted != v) std::copy(scratch.data(), scratch.data() + n, v);
    order_equal_deadlines(v, n);
    key_offsets_undo(v, n, lo);
}

/// Sorts v by (deadline, seq), using `scratch`. Pre: scratch's room holds v.size() records.
template <class Clock>
void sort_by_deadline(deadline_recs<Clock>& v, sort_scratch<Clock>& scratch_) noexcept {
    const std::size_t n = v.size();
    if (n <= 32) {
        insertion_sort_by_deadline(v.data(), n);
        return;
    }
    auto& scratch = scratch_.recs;
    scratch.set_size(n);
    const unsigned bits = key_offsets(v.data(), n).bits;  // the keys stay scrambled
    if (n < 4096 || bits <= 16) {
        if (lsd_sort(v.data(), scratch.data(), n, bits) != v.data())
            std::copy(scratch.begin(), scratch.begin() + n, v.begin());
    } else {
        // Most significant digit first, into scratch: 2048 bins whose ranges are sorted apart;
        // then each bin, small enough to stay in cache, by its remaining digits.
        const unsigned shift = bits - deadline_top_digit;
        std::size_t* bounds = scratch_.bins.data();
        std::size_t* at = bounds + deadline_top_radix + 1;
        std::fill(bounds, bounds + deadline_top_radix + 1, std::size_t{0});
        for (std::size_t i = 0; i < n; ++i) ++bounds[(v[i].key >> shift) + 1];
        for (std::size_t d = 0; d < deadline_top_radix; ++d) bounds[d + 1] += bounds[d];
        std::copy(bounds, bounds + deadline_top_radix, at);
        for (std::size_t i = 0; i < n; ++i) scratch[at[v[i].key >> shift]++] = v[i];
        for (std::size_t d = 0; d < deadline_top_radix; ++d) {
            const std::size_t b = bounds[d], e = bounds[d + 1];
            if (e - b > 1 &&
                lsd_sort(scratch.data() + b, v.data() + b, e - b, shift) != scratch.data() + b)
                std::copy(v.begin() + b, v.begin() + e, scratch.begin() + b);
        }
        v.swap(scratch);
    }
    order_equal_deadlines(v.data(), n);
}

}  // namespace delayq::detail
