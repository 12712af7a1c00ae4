// due_batch: the tasks one pass of a wheel found due, in the order they run: the heap's order,
// deadline first, then first in, first out (the node's sequence number). Not thread-safe.
//
// The idea. A wheel's buckets give a pass its due nodes roughly by time but not in order: a bucket
// mixes the deadlines of a whole tick, a late pass empties several buckets (a hierarchical one
// several levels). So a pass sorts what it found. Deadlines are 64-bit, but within one pass they
// span little (a late pass of a minute spans 2^36 ns): a least-significant-digit radix sort on
// (deadline - earliest) needs only the digits that span has, 11 bits a pass, and keeps the input
// order among equal deadlines; equal deadlines (rare, and in short runs) are then put in sequence
// order. Already sorted input, the common case of a pass on time, is detected while gathering and
// costs nothing more.
//
// The sorted batch is an array of node pointers, so that running it can prefetch the nodes ahead:
// a large batch then waits for several cache misses at once. The arrays are kept between passes
// (and given back after a large one). If they cannot be had (out of memory), the batch is sorted
// in place as a linked list (a merge sort through `next`) and run from there: slower, never a
// failure.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "huge_pages.hpp"
#include "timer_node.hpp"

namespace delayq::detail {

template <class Clock>
class due_batch {
  public:
    using node = timer_node<Clock>;

    /// Starts a new batch (the last one cleared).
    void begin() noexcept {
        recs_.clear();
        chain_ = nullptr;
        count_ = 0;
        in_array_ = true;
        sorted_ = true;
    }

    /// Adds a due node (its `next` is the batch's from now on).
    void add(node* n) noexcept {
        ++count_;
        if (in_array_) {
            if (recs_.size() == recs_.capacity()) {
                try {
                    recs_.reserve(std::max<std::size_t>(64, 2 * recs_.capacity()));
                } catch (...) {
                    to_chain();
                }
            }
            if (in_array_) {
                if (!recs_.empty() && node::before(*n, *recs_.back().n)) sorted_ = false;
                recs_.push_back(
                    rec{static_cast<std::uint64_t>(n->deadline.time_since_epoch().count()), n});
                return;
            }
        }
        n->next = chain_;
        chain_ = n;
    }

    /// Puts the batch in running order.
    void finish() noexcept {
        if (in_array_ && (sorted_ || radix_sort())) return;
        to_chain();
        chain_ = merge_sort(chain_, count_);
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

    /// Calls f(node) for every node from position `from` on (for stop(), which cancels what has
    /// not run yet). Does not move the running position.
    template <class F>
    void for_each_from(std::size_t from, F&& f) const {
        if (in_array_) {
            for (std::size_t i = from; i < count_; ++i) f(recs_[i].n);
        } else {
            for (node_links* l = chain_; l; l = l->next) f(node::of(l));
        }
    }

    /// Done with the batch: keeps the arrays for the next one unless they are large.
    void clear() noexcept {
        constexpr std::size_t keep = std::size_t{1} << 14;
        if (recs_.capacity() > keep) {
            decltype(recs_)().swap(recs_);
            decltype(tmp_)().swap(tmp_);
        } else {
            recs_.clear();
        }
        chain_ = nullptr;
        count_ = 0;
        in_array_ = true;
    }

  private:
    struct rec {
        std::uint64_t key;  // the deadline as an unsigned count (then minus the batch's earliest)
        node* n;
    };

    // From the array to the chain (when the array cannot grow or be sorted): no allocation.
    void to_chain() noexcept {
        for (const rec& r : recs_) {
            r.n->next = chain_;
            chain_ = r.n;
        }
        recs_.clear();
        in_array_ = false;
    }

    // Sorts recs_ by (deadline, seq). False if the scratch array cannot be had.
    bool radix_sort() noexcept {
        const std::size_t n = recs_.size();
        if (n <= 32) {  // insertion sort: cheaper than the passes for a few nodes
            for (std::size_t i = 1; i < n; ++i) {
                const rec r = recs_[i];
                std::size_t j = i;
                for (; j > 0 && node::before(*r.n, *recs_[j - 1].n); --j) recs_[j] = recs_[j - 1];
                recs_[j] = r;
            }
            return true;
        }
        try {
            tmp_.resize(n);
        } catch (...) {
            return false;
        }
        // Deadlines are signed: flip the sign bit so that unsigned order is time order.
        constexpr std::uint64_t sign = std::uint64_t{1} << 63;
        std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
        for (rec& r : recs_) {
            r.key ^= sign;
            lo = std::min(lo, r.key);
            hi = std::max(hi, r.key);
        }
        for (rec& r : recs_) r.key -= lo;
        const auto bits = static_cast<unsigned>(std::bit_width(hi - lo));
        if (n < 4096 || bits <= 16) {
            if (lsd(recs_.data(), tmp_.data(), n, bits) != recs_.data())
                std::copy(tmp_.begin(), tmp_.begin() + static_cast<std::ptrdiff_t>(n),
                          recs_.begin());
        } else {
            // Most significant digit first, into tmp_: 2048 bins whose ranges are sorted apart;
            // then each bin, small enough to stay in cache, by its remaining digits.
            const unsigned shift = bits - top_digit;
            std::size_t bounds[top_radix + 1] = {};
            for (std::size_t i = 0; i < n; ++i) ++bounds[(recs_[i].key >> shift) + 1];
            for (std::size_t d = 0; d < top_radix; ++d) bounds[d + 1] += bounds[d];
            std::size_t at[top_radix];
            std::copy(bounds, bounds + top_radix, at);
            for (std::size_t i = 0; i < n; ++i) tmp_[at[recs_[i].key >> shift]++] = recs_[i];
            for (std::size_t d = 0; d < top_radix; ++d) {
                const std::size_t b = bounds[d], e = bounds[d + 1];
                if (e - b > 1 &&
                    lsd(tmp_.data() + b, recs_.data() + b, e - b, shift) != tmp_.data() + b)
                    std::copy(recs_.begin() + static_cast<std::ptrdiff_t>(b),
                              recs_.begin() + static_cast<std::ptrdiff_t>(e),
                              tmp_.begin() + static_cast<std::ptrdiff_t>(b));
            }
            recs_.swap(tmp_);
        }
        // equal deadlines: sequence order (the radix passes kept the input order, which a bucket's
        // lanes and a hierarchical wheel's levels do not make the schedule order)
        for (std::size_t i = 0; i < n;) {
            std::size_t j = i + 1;
            while (j < n && recs_[j].key == recs_[i].key) ++j;
            for (std::size_t a = i + 1; a < j; ++a) {
                const rec r = recs_[a];
                std::size_t b = a;
                for (; b > i && node::seq_before(r.n->seq, recs_[b - 1].n->seq); --b)
                    recs_[b] = recs_[b - 1];
                recs_[b] = r;
            }
            i = j;
        }
        return true;
    }

    static constexpr unsigned top_digit = 11;
    static constexpr std::size_t top_radix = std::size_t{1} << top_digit;

    // Least significant digit first, 8 bits a pass, over the low `bits` bits of the keys of
    // a[0..n), ping-ponging with `scratch`; stable. Returns where the sorted records are.
    static rec* lsd(rec* a, rec* scratch, std::size_t n, unsigned bits) noexcept {
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

    // Sorts a chain of n nodes by (deadline, seq), through `next`; no allocation.
    static node_links* merge_sort(node_links* h, std::size_t n) noexcept {
        if (n < 2) {
            if (h) h->next = nullptr;
            return h;
        }
        node_links* mid = h;
        for (std::size_t i = 1; i < n / 2; ++i) mid = mid->next;
        node_links* second = mid->next;
        mid->next = nullptr;
        node_links* a = merge_sort(h, n / 2);
        node_links* b = merge_sort(second, n - n / 2);
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

    std::vector<rec, huge_page_allocator<rec>> recs_;
    std::vector<rec, huge_page_allocator<rec>> tmp_;
    node_links* chain_ = nullptr;  // the batch when it could not be put in an array
    std::size_t count_ = 0;
    bool in_array_ = true;
    bool sorted_ = true;  // the nodes came in running order
};

}  // namespace delayq::detail
