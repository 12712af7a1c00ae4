// The ring of a hashed timing wheel, with no lock, no thread and no tasks: just where each pending
// node sits, and which nodes are due.
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
// of the buckets it visits whose slot has come: deadline <= boundary(tick(now)) <= now. A node whose slot is already behind the cursor
// (a deadline in the past) goes to a separate `due` list that the next expire() empties first.
//
// next_expiry() is when the next expire() will have work: the boundary of the earliest non-empty
// slot (or a past time when the due list holds something). A bitmap of non-empty buckets lets it
// and expire() skip empty buckets, so an idle ring costs nothing and a sparse one little.
//
// Lists are intrusive (the node's prev/next), doubly linked with head and tail, appended at the
// tail: first in, first out within a bucket. unlink() is O(1); only when the node is a list's head
// or tail does it recompute which list (one division). node.tag says which kind of list holds it.
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
#include <new>
#include <atomic>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "timer_node.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define DELAYQ_HW_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DELAYQ_HW_ASAN 1
#endif
#endif
#ifndef DELAYQ_HW_ASAN
#define DELAYQ_HW_ASAN 0
#endif
#if DELAYQ_HW_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace delayq::detail {

// The nodes of one timer come from its node_pool: slabs of 64 KiB cut into slots of a few sizes
// (multiples of 16 bytes up to 256), so a node with a small capture costs exactly its size (48 B)
// instead of malloc's 64, and allocating is a pop from a list. Slots are taken under the timer's
// lock; a node is freed from any thread (its last reference may be a handle anywhere), so a freed
// slot is pushed onto a lock-free per-size list that the allocator takes over whole when its own
// list runs dry (push and take-all: no ABA problem). A slab's first bytes point back to its pool,
// so a node finds its pool from its own address. Slabs are released with the pool, that is when
// the timer's core goes, after the last node.
class node_pool {
public:
    static constexpr std::size_t slab_bytes = std::size_t{1} << 16;
    static constexpr std::size_t granule = 16;
    static constexpr std::size_t max_slot = 256;

    /// Whether a block of this size and alignment comes from the pool.
    static constexpr bool fits(std::size_t size, std::size_t align) noexcept {
        return size <= max_slot && align <= granule;
    }

    node_pool() = default;
    node_pool(const node_pool&) = delete;
    node_pool& operator=(const node_pool&) = delete;
    ~node_pool() {
        while (slabs_) {
            header* h = slabs_;
            slabs_ = h->next;
            unpoison(h, slab_bytes);
            ::operator delete(static_cast<void*>(h), std::align_val_t{slab_bytes});
        }
    }

    /// A block of `size` bytes (fits()). Under the owner's lock. Throws std::bad_alloc.
    void* allocate(std::size_t size) {
        const std::size_t c = class_of(size);
        cls& k = classes_[c];
        if (!k.local) k.local = k.remote.exchange(nullptr, std::memory_order_acquire);
        if (slot* s = k.local) {
            unpoison(s, c * granule);
            k.local = s->next;
            return s;
        }
        const std::size_t bytes = c * granule;
        if (static_cast<std::size_t>(k.end - k.bump) < bytes) {
            void* mem = ::operator new(slab_bytes, std::align_val_t{slab_bytes});
            auto* h = ::new (mem) header{this, slabs_};
            slabs_ = h;
            k.bump = static_cast<char*>(mem) + sizeof(header);
            k.end = static_cast<char*>(mem) + slab_bytes;
        }
        void* p = k.bump;
        k.bump += bytes;
        return p;
    }

    /// Returns a block that allocate(size) gave, from any thread.
    static void deallocate(void* p, std::size_t size) noexcept {
        // The slab's header starts at the slab-aligned address below p: step back by p's offset.
        auto* h = reinterpret_cast<header*>(static_cast<char*>(p) -
                                            (reinterpret_cast<std::uintptr_t>(p) & (slab_bytes - 1)));
        const std::size_t c = class_of(size);
        cls& k = h->pool->classes_[c];
        auto* s = static_cast<slot*>(p);
        poison(reinterpret_cast<char*>(s) + sizeof(slot), c * granule - sizeof(slot));
        slot* head = k.remote.load(std::memory_order_relaxed);
        do {
            s->next = head;
        } while (!k.remote.compare_exchange_weak(head, s, std::memory_order_release, std::memory_order_relaxed));
    }

private:
    struct slot {
        slot* next;
    };
    struct alignas(64) header {
        node_pool* pool;
        header* next;
    };
    struct cls {
        slot* local = nullptr;                // taken under the owner's lock
        char* bump = nullptr;                 // the rest of the current slab for this size
        char* end = nullptr;
        alignas(64) std::atomic<slot*> remote{nullptr};  // freed by anyone
    };

    static constexpr std::size_t class_of(std::size_t size) noexcept { return (size + granule - 1) / granule; }

    static void poison([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t n) noexcept {
#if DELAYQ_HW_ASAN
        __asan_poison_memory_region(p, n);
#endif
    }
    static void unpoison([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t n) noexcept {
#if DELAYQ_HW_ASAN
        __asan_unpoison_memory_region(p, n);
#endif
    }

    cls classes_[max_slot / granule + 1];
    header* slabs_ = nullptr;
};

// A node and its callable in one pooled block (node_with, with the pool's deallocation).
template <class Clock, class F>
struct pooled_node final : timer_node<Clock> {
    union {
        F fn;  // alive while has_task
    };

    template <class G>
        requires(!std::is_same_v<std::remove_cvref_t<G>, pooled_node>)
    explicit pooled_node(G&& g)  // NOLINT(bugprone-forwarding-reference-overload): constrained
        : fn(std::forward<G>(g)) {}
    ~pooled_node() {}

    static void run(timer_node<Clock>& n) { static_cast<pooled_node&>(n).fn(); }
    static void destroy(timer_node<Clock>& n) noexcept { static_cast<pooled_node&>(n).fn.~F(); }
    static void deallocate(timer_node<Clock>* n) noexcept {
        auto* p = static_cast<pooled_node*>(n);
        p->~pooled_node();
        node_pool::deallocate(p, sizeof(pooled_node));
    }

    static constexpr task_ops<Clock> table{&run, &destroy, &deallocate};
};

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
        buckets_.resize(w);
        bits_.resize((w + 63) / 64);
    }

    hashed_wheel_ring(const hashed_wheel_ring&) = delete;
    hashed_wheel_ring& operator=(const hashed_wheel_ring&) = delete;

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    std::size_t buckets() const noexcept { return mask_ + 1; }
    duration tick() const noexcept { return duration{tick_}; }

    /// Links n (not in any list) by its deadline. Returns when it comes out: the boundary of its
    /// slot, or its deadline if it is already behind the cursor.
    time_point link(node* n) noexcept {
        const rep d = n->deadline.time_since_epoch().count();
        const std::uint64_t s = slot(d);
        list* l;
        time_point when;
        if (s < cursor_) {
            n->tag = due_tag;
            l = &due_;
            when = n->deadline;
        } else {
            n->tag = bucket_tag;
            const std::size_t b = static_cast<std::size_t>(s) & mask_;
            l = &buckets_[b];
            if (!l->head) bits_[b >> 6] |= std::uint64_t{1} << (b & 63);
            when = boundary(s);
        }
        append(*l, n);
        if (d < l->min) l->min = d;
        ++size_;
        return when;
    }

    /// Unlinks n, which this ring holds. O(1).
    void unlink(node* n) noexcept {
        list* l = nullptr;
        if (n->prev) {
            n->prev->next = n->next;
        } else {
            l = &list_of(n);
            l->head = n->next;
        }
        if (n->next) {
            n->next->prev = n->prev;
        } else {
            if (!l) l = &list_of(n);
            l->tail = n->prev;
        }
        if (l && !l->head) {
            l->min = never;
            if (n->tag == bucket_tag) {
                const auto b = static_cast<std::size_t>(l - buckets_.data());
                bits_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
            }
        }
        n->prev = n->next = nullptr;
        --size_;
    }

    /// Unlinks every node due at `now` and returns them chained through `next` (prev is null), in
    /// deadline order (first in, first out among equal deadlines); `count` gets how many.
    node* expire(time_point now_tp, std::size_t& count) noexcept {
        const rep now = now_tp.time_since_epoch().count();
        count = 0;
        if (size_ == 0) {
            if (now >= origin_) cursor_ = std::max(cursor_, floor_tick(now) + 1);
            return nullptr;
        }
        node* head = nullptr;
        node** tail = &head;
        bool sorted = true;
        rep last = std::numeric_limits<rep>::min();
        auto take = [&](list& l, rep upto) {
            rep lo = never;
            for (node* n = l.head; n;) {
                node* next = n->next;
                const rep d = n->deadline.time_since_epoch().count();
                if (d <= upto) {
                    remove(l, n);
                    if (d < last) sorted = false;
                    last = d;
                    *tail = n;
                    tail = &n->next;
                    ++count;
                } else if (d < lo) {
                    lo = d;
                }
                n = next;
            }
            l.min = lo;
        };
        if (due_.head && due_.min <= now) take(due_, now);
        if (now >= origin_) {
            const std::uint64_t t = floor_tick(now);
            if (t >= cursor_) {
                // A node comes out at its slot's boundary: the passes are the same whether the
                // clock moved tick by tick or jumped.
                const rep limit = boundary_rep(t);
                const std::size_t w = mask_ + 1;
                const std::uint64_t span = t - cursor_ + 1;
                const std::size_t start = static_cast<std::size_t>(cursor_) & mask_;
                const std::size_t visits = span >= w ? w : static_cast<std::size_t>(span);
                // Visit the buckets of ticks cursor .. cursor + visits - 1, skipping empty ones.
                for (std::size_t i = next_nonempty(start, visits); i < visits;
                     i = next_nonempty(start, visits, i + 1)) {
                    const std::size_t b = (start + i) & mask_;
                    list& l = buckets_[b];
                    if (l.min <= limit) {
                        take(l, limit);
                        if (!l.head) bits_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
                    }
                }
                cursor_ = t + 1;
            }
        }
        *tail = nullptr;
        size_ -= count;
        // Buckets are visited in tick order and hold one slot's deadlines each within a rotation,
        // so the chain is nearly always sorted already; a pass over a whole rotation is not.
        if (!sorted) head = sort(head, count);
        return head;
    }

    /// When expire() will next have work: nullopt when the ring is empty; a time <= now when
    /// something is due already. Never later than the earliest deadline's slot boundary.
    std::optional<time_point> next_expiry() const noexcept {
        if (size_ == 0) return std::nullopt;
        rep best = due_.head ? due_.min : never;
        const std::size_t w = mask_ + 1;
        const std::size_t start = static_cast<std::size_t>(cursor_) & mask_;
        for (std::size_t i = next_nonempty(start, w); i < w; i = next_nonempty(start, w, i + 1)) {
            const std::uint64_t k = cursor_ + i;  // the first tick this bucket stands for
            const rep bk = boundary_rep(k);
            if (bk >= best) break;  // later buckets stand for later ticks still
            const list& l = buckets_[(start + i) & mask_];
            const rep cand = boundary_rep(std::max(slot(l.min), k));
            if (cand < best) best = cand;
        }
        return time_point{duration{best}};
    }

    /// Unlinks every node and returns them chained through `next` (prev is null), in no
    /// particular order.
    node* take_all() noexcept {
        node* chain = nullptr;
        auto grab = [&](list& l) {
            for (node* n = l.head; n;) {
                node* next = n->next;
                n->prev = nullptr;
                n->next = chain;
                chain = n;
                n = next;
            }
            l = list{};
        };
        grab(due_);
        for (auto& l : buckets_) grab(l);
        std::fill(bits_.begin(), bits_.end(), 0);
        size_ = 0;
        return chain;
    }

private:
    static constexpr rep never = std::numeric_limits<rep>::max();
    static constexpr std::uint16_t bucket_tag = 0;
    static constexpr std::uint16_t due_tag = 1;
    __extension__ typedef __int128 wide;

    struct list {
        node* head = nullptr;
        node* tail = nullptr;
        rep min = never;  // a lower bound of the deadlines held (exact after a pass)
    };

    static void append(list& l, node* n) noexcept {
        n->next = nullptr;
        n->prev = l.tail;
        if (l.tail) l.tail->next = n; else l.head = n;
        l.tail = n;
    }

    static void remove(list& l, node* n) noexcept {
        if (n->prev) n->prev->next = n->next; else l.head = n->next;
        if (n->next) n->next->prev = n->prev; else l.tail = n->prev;
        n->prev = n->next = nullptr;
    }

    // Stable merge sort of a chain by deadline.
    static node* sort(node* h, std::size_t n) noexcept {
        if (n < 2) return h;
        node* mid = h;
        for (std::size_t i = 1; i < n / 2; ++i) mid = mid->next;
        node* second = mid->next;
        mid->next = nullptr;
        node* a = sort(h, n / 2);
        node* b = sort(second, n - n / 2);
        node* out = nullptr;
        node** t = &out;
        while (a && b) {
            if (b->deadline < a->deadline) {
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

    list& list_of(const node* n) noexcept {
        if (n->tag == due_tag) return due_;
        return buckets_[static_cast<std::size_t>(slot(n->deadline.time_since_epoch().count())) & mask_];
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
        if (!__builtin_sub_overflow(now, origin_, &e)) return div_tick(static_cast<std::uint64_t>(e));
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
    std::size_t next_nonempty(std::size_t start, std::size_t count, std::size_t from = 0) const noexcept {
        while (from < count) {
            const std::size_t b = (start + from) & mask_;
            const std::uint64_t word = bits_[b >> 6] >> (b & 63);
            if (word) {
                const std::size_t i = from + static_cast<std::size_t>(std::countr_zero(word));
                // Bits past the end of the ring (w < 64) are never set, so i stays in range
                // unless the run crosses the ring's end; then wrap and look again.
                const std::size_t room = std::min<std::size_t>(64 - (b & 63), mask_ + 1 - b);
                if (static_cast<std::size_t>(std::countr_zero(word)) < room) return std::min(i, count);
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
    list due_;                    // nodes whose slot was already behind the cursor
    std::vector<list> buckets_;
    std::vector<std::uint64_t> bits_;  // bit b: buckets_[b] is non-empty
};

}  // namespace delayq::detail
