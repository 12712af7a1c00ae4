// Sorting a pass's due nodes into the heap's order (deadline, then first in, first out), for
// due_batch and near_window.
//
// The idea. Deadlines are 64-bit, but the nodes of one pass span little (a late pass of a minute
// spans 2^36 ns). So: sort records (deadline, node) by (deadline - earliest), a radix sort over
// only the digits that span has — one most-significant-digit pass into 2048 bins when the batch
// is large, then each bin, small enough to stay in cache, least significant digit first, 8 bits a
// pass — which keeps the input order among equal deadlines; equal deadlines (rare, and in short
// runs) are then put in sequence order. A few records are insertion-sorted instead.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "huge_pages.hpp"
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

template <class Clock>
using deadline_recs = std::vector<deadline_rec<Clock>, huge_page_allocator<deadline_rec<Clock>>>;

inline constexpr unsigned deadline_top_digit = 11;
inline constexpr std::size_t deadline_top_radix = std::size_t{1} << deadline_top_digit;

// Least significant digit first, 8 bits a pass, over the low `bits` bits of the keys of
// a[0..n), ping-ponging with `scratch`; stable. Returns where the sorted records are.
template <class Rec>
Rec* lsd_sort(Rec* a, Rec* scratch, std::size_t n, unsigned bits) noexcept {
    constexpr unsigned digit = 8;
    constexpr std::size_t radix = std::size_t{1} << digit;
    std::size_t counts[radix];
    for (unsigned shift = 0; shift < bits; shift += digit) {
        std::fill(std::begin(counts), std::end(counts), std::size_t{0});
        for (std::size_t i = 0; i < n; ++i) ++counts[(a[i].key >> shift) & (radix - 1)];
        std::size_t sum = 0;
        for (std::size_t& c : counts) {
            const std::size_t k = c;
            c = sum;
            sum += k;
        }
        for (std::size_t i = 0; i < n; ++i)
            scratch[counts[(a[i].key >> shift) & (radix - 1)]++] = a[i];
        std::swap(a, scratch);
    }
    return a;
}

/// Sorts v by (deadline, seq), using `scratch` (resized to v's size). False, with v unchanged
/// in content, if the scratch array cannot be had.
template <class Clock>
bool sort_by_deadline(deadline_recs<Clock>& v, deadline_recs<Clock>& scratch) noexcept {
    using rec = deadline_rec<Clock>;
    using node = timer_node<Clock>;

    const std::size_t n = v.size();
    if (n <= 32) {  // insertion sort: cheaper than the passes for a few nodes
        for (std::size_t i = 1; i < n; ++i) {
            const rec r = v[i];
            std::size_t j = i;
            for (; j > 0 && node::before(*r.n, *v[j - 1].n); --j) v[j] = v[j - 1];
            v[j] = r;
        }
        return true;
    }
    try {
        scratch.resize(n);
    } catch (...) {
        return false;
    }
    // Deadlines are signed: flip the sign bit so that unsigned order is time order.
    constexpr std::uint64_t sign = std::uint64_t{1} << 63;
    std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
    for (rec& r : v) {
        r.key ^= sign;
        lo = std::min(lo, r.key);
        hi = std::max(hi, r.key);
    }
    for (rec& r : v) r.key -= lo;
    const auto bits = static_cast<unsigned>(std::bit_width(hi - lo));
    if (n < 4096 || bits <= 16) {
        if (lsd_sort(v.data(), scratch.data(), n, bits) != v.data())
            std::copy(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(n), v.begin());
    } else {
        // Most significant digit first, into scratch: 2048 bins whose ranges are sorted apart;
        // then each bin, small enough to stay in cache, by its remaining digits.
        const unsigned shift = bits - deadline_top_digit;
        std::size_t bounds[deadline_top_radix + 1] = {};
        for (std::size_t i = 0; i < n; ++i) ++bounds[(v[i].key >> shift) + 1];
        for (std::size_t d = 0; d < deadline_top_radix; ++d) bounds[d + 1] += bounds[d];
        std::size_t at[deadline_top_radix];
        std::copy(bounds, bounds + deadline_top_radix, at);
        for (std::size_t i = 0; i < n; ++i) scratch[at[v[i].key >> shift]++] = v[i];
        for (std::size_t d = 0; d < deadline_top_radix; ++d) {
            const std::size_t b = bounds[d], e = bounds[d + 1];
            if (e - b > 1 &&
                lsd_sort(scratch.data() + b, v.data() + b, e - b, shift) != scratch.data() + b)
                std::copy(v.begin() + static_cast<std::ptrdiff_t>(b),
                          v.begin() + static_cast<std::ptrdiff_t>(e),
                          scratch.begin() + static_cast<std::ptrdiff_t>(b));
        }
        v.swap(scratch);
    }
    // equal deadlines: sequence order (the radix passes kept the input order, which a bucket's
    // lanes and a hierarchical wheel's levels do not make the schedule order)
    for (std::size_t i = 0; i < n;) {
        std::size_t j = i + 1;
        while (j < n && v[j].key == v[i].key) ++j;
        for (std::size_t a = i + 1; a < j; ++a) {
            const rec r = v[a];
            std::size_t b = a;
            for (; b > i && node::seq_before(r.n->seq, v[b - 1].n->seq); --b) v[b] = v[b - 1];
            v[b] = r;
        }
        i = j;
    }
    return true;
}

}  // namespace delayq::detail
