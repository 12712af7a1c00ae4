// node_pool: where a timer's nodes live. Not thread-safe, except deallocate().
//
// The idea. Blocks up to 256 bytes come from slabs of 64 KiB cut into slots of a few sizes
// (multiples of 16 bytes), so a node with a small capture costs exactly its size (48 B) instead of
// malloc's 64, and allocating is a pop from a list, done under the timer's lock. A slab's first
// bytes point back to its pool, so a block finds its pool from its own address. Slabs are cut from
// regions: 64 KiB ones at first, huge pages once the pool is large (see new_slab()). Larger blocks
// come from operator new with a 16-byte prefix that points back to the pool.
//
// Freeing. The owner frees under its lock onto a local list (free_local). Anyone else (a handle
// dropping the last reference, on any thread) pushes the block onto a lock-free list per size
// (deallocate); the owner takes such a list over whole when its own runs dry (push and take-all:
// no ABA problem).
//
// Lifetime without a count per block. The pool belongs to a core that must outlive every block a
// handle still holds. Counting live blocks in an atomic would cost every schedule a
// read-modify-write; instead the owner, when it lets go for good, orphans the pool: it swaps a
// marker into every lock-free list (from then on a freed block is not pushed but counted down),
// and adds the number of blocks still out to `live_`. Whoever brings `live_` to zero — the orphan
// call itself, or the last late free — calls the pool's `on_empty` (which deletes the core, and the
// pool and its slabs with it). A free racing with the orphaning either got its push in before the
// marker (then orphan() finds the block on the list and does not count it) or finds the marker
// (then it counts itself down): each block is counted exactly once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "huge_pages.hpp"
#include "room.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define DELAYQ_POOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DELAYQ_POOL_ASAN 1
#endif
#endif
#ifndef DELAYQ_POOL_ASAN
#define DELAYQ_POOL_ASAN 0
#endif
#if DELAYQ_POOL_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace delayq::detail {

class node_pool {
  public:
    static constexpr std::size_t slab_bytes = std::size_t{1} << 16;
    static constexpr std::size_t granule = 16;
    static constexpr std::size_t max_slot = 256;

    /// Whether a block of this size and alignment comes from a slab.
    static constexpr bool fits(std::size_t size, std::size_t align) noexcept {
        return size <= max_slot && align <= granule;
    }

    /// `on_empty(owner)` runs once the pool is orphaned and no block is out.
    node_pool(void (*on_empty)(void*), void* owner) noexcept : on_empty_(on_empty), owner_(owner) {}
    node_pool(const node_pool&) = delete;
    node_pool& operator=(const node_pool&) = delete;
    ~node_pool() {
        drop_large(take(large_remote_));  // small blocks go with their slabs
        while (regions_) {
            header* h = regions_;
            regions_ = h->next_region;
            const std::size_t bytes = h->region_bytes;
            unpoison(h, bytes);
            deallocate_region(h, bytes);
        }
    }

    /// A block of `size` bytes aligned to `align`. Owner only, making room (room.hpp: a pass
    /// cannot call it). Throws std::bad_alloc.
    void* allocate(std::size_t size, std::size_t align, room_key) {
        if (!fits(size, align)) return allocate_large(size, align);
        const std::size_t c = class_of(size);
        cls& k = classes_[c];
        if (!k.local) k.local = take(k.remote);
        if (slot* s = k.local) {
            unpoison(s, c * granule);
            k.local = s->next;
            return s;
        }
        const std::size_t bytes = c * granule;
        if (static_cast<std::size_t>(k.end - k.bump) < bytes) {
            char* slab = new_slab();
            k.bump = slab + sizeof(header);
            k.end = slab + slab_bytes;
        }
        void* p = k.bump;
        k.bump += bytes;
        ++carved_;
        return p;
    }

    /// Returns a block the owner no longer needs. Owner only (under its lock).
    void free_local(void* p, std::size_t size, std::size_t align) noexcept {
        if (!fits(size, align)) {
            delete_large(p, align);
            --large_live_;
            return;
        }
        const std::size_t c = class_of(size);
        auto* s = static_cast<slot*>(p);
        s->next = classes_[c].local;
        classes_[c].local = s;
        poison(reinterpret_cast<char*>(s) + sizeof(slot), c * granule - sizeof(slot));
    }

    /// Returns a block from any thread, the pool's owner alive or not.
    static void deallocate(void* p, std::size_t size, std::size_t align) noexcept {
        node_pool* pool;
        std::atomic<slot*>* list;
        if (fits(size, align)) {
            // The slab's header starts at the slab-aligned address below p.
            auto* h = reinterpret_cast<header*>(
                static_cast<char*>(p) - (reinterpret_cast<std::uintptr_t>(p) & (slab_bytes - 1)));
            pool = h->pool;
            list = &pool->classes_[class_of(size)].remote;
            poison(static_cast<char*>(p) + sizeof(slot), class_of(size) * granule - sizeof(slot));
        } else {
            pool = large_prefix(p)->pool;
            list = &pool->large_remote_;
        }
        auto* s = static_cast<slot*>(p);
        slot* head = list->load(std::memory_order_relaxed);
        do {
            if (head == orphaned()) {
                if (!fits(size, align)) delete_large(p, align);
                pool->count_down(1);
                return;
            }
            s->next = head;
        } while (!list->compare_exchange_weak(head, s, std::memory_order_release,
                                              std::memory_order_relaxed));
    }

    /// The owner lets go for good (no allocate or free_local after this). True if no block is out:
    /// then on_empty has not run and the caller disposes of the pool's owner; else the last
    /// deallocate() runs on_empty.
    [[nodiscard]] bool orphan() noexcept {
        std::int64_t out =
            static_cast<std::int64_t>(carved_) + static_cast<std::int64_t>(large_live_);
        for (cls& k : classes_) {
            out -= length(k.local);
            out -= length(k.remote.exchange(orphaned(), std::memory_order_acquire));
        }
        out -= drop_large(large_remote_.exchange(orphaned(), std::memory_order_acquire));
        return live_.fetch_add(out, std::memory_order_acq_rel) + out == 0;
    }

  private:
    struct slot {
        slot* next;
    };
    // At the start of every slab; the region fields only in a region's first slab.
    struct alignas(64) header {
        node_pool* pool;
        header* next_region;
        std::size_t region_bytes;
    };

    // A slab for a size class: the next one of the current region, or the first of a new region.
    // The first regions are one slab each, so that a small timer costs a few KiB; once the pool
    // holds a few MiB, regions are huge pages (2 MiB), so that walking a million nodes does not
    // miss the TLB on nearly every node (that, not the cache, was what a large flush waited for).
    char* new_slab() {
        if (region_next_ == region_end_) {
            const std::size_t bytes = region_count_ < small_regions ? slab_bytes : huge_page_bytes;
            auto* h = static_cast<header*>(allocate_region(bytes));
            h->next_region = regions_;
            h->region_bytes = bytes;
            regions_ = h;
            ++region_count_;
            region_next_ = reinterpret_cast<char*>(h);
            region_end_ = region_next_ + bytes;
        }
        char* slab = region_next_;
        region_next_ += slab_bytes;
        reinterpret_cast<header*>(slab)->pool = this;
        return slab;
    }

    static constexpr std::size_t small_regions = 32;  // 2 MiB in 64 KiB regions, then huge pages
    struct cls {
        slot* local = nullptr;  // owner only
        char* bump = nullptr;   // the rest of the current slab for this size
        char* end = nullptr;
        alignas(64) std::atomic<slot*> remote{nullptr};  // freed by anyone
    };

    static constexpr std::size_t class_of(std::size_t size) noexcept {
        return (size + granule - 1) / granule;
    }
    static constexpr std::size_t prefix(std::size_t align) noexcept {
        return align > granule ? align : granule;
    }

    // The 16 bytes just before a large block: its pool, and its alignment (to delete it with).
    struct large_header {
        node_pool* pool;
        std::size_t align;
    };
    static large_header* large_prefix(void* p) noexcept {
        return reinterpret_cast<large_header*>(static_cast<char*>(p) - sizeof(large_header));
    }

    static slot* orphaned() noexcept {
        static slot marker{nullptr};
        return &marker;
    }

    static slot* take(std::atomic<slot*>& list) noexcept {
        if (list.load(std::memory_order_relaxed) == nullptr) return nullptr;
        slot* s = list.exchange(nullptr, std::memory_order_acquire);
        return s == orphaned() ? nullptr : s;
    }

    static std::int64_t length(const slot* s) noexcept {
        std::int64_t n = 0;
        for (; s && s != orphaned(); s = s->next) ++n;
        return n;
    }

    void* allocate_large(std::size_t size, std::size_t align) {
        large_live_ -= static_cast<std::size_t>(drop_large(take(large_remote_)));
        const std::size_t pre = prefix(align);
        void* mem = ::operator new (pre + size, std::align_val_t{pre});
        void* p = static_cast<char*>(mem) + pre;
        ::new (large_prefix(p)) large_header{this, align};
        ++large_live_;
        return p;
    }

    static void delete_large(void* p, std::size_t align) noexcept {
        const std::size_t pre = prefix(align);
        ::operator delete (static_cast<char*>(p) - pre, std::align_val_t{pre});
    }

    // Deletes a list of freed large blocks (their alignment is in the prefix's second word);
    // returns how many.
    static std::int64_t drop_large(slot* s) noexcept {
        std::int64_t n = 0;
        while (s && s != orphaned()) {
            slot* next = s->next;
            delete_large(s, large_prefix(s)->align);
            s = next;
            ++n;
        }
        return n;
    }

    void count_down(std::int64_t k) noexcept {
        if (live_.fetch_sub(k, std::memory_order_acq_rel) == k) on_empty_(owner_);
    }

    static void poison([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t n) noexcept {
#if DELAYQ_POOL_ASAN
        __asan_poison_memory_region(p, n);
#endif
    }
    static void unpoison([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t n) noexcept {
#if DELAYQ_POOL_ASAN
        __asan_unpoison_memory_region(p, n);
#endif
    }

    cls classes_[max_slot / granule + 1];
    alignas(64) std::atomic<slot*> large_remote_{nullptr};  // freed large blocks
    std::atomic<std::int64_t> live_{0};                     // blocks out, once orphaned
    header* regions_ = nullptr;
    char* region_next_ = nullptr;  // the next unused slab of the newest region
    char* region_end_ = nullptr;
    std::size_t region_count_ = 0;
    std::size_t carved_ = 0;      // blocks ever cut from slabs
    std::size_t large_live_ = 0;  // large blocks allocated and not yet deleted by the owner
    void (*on_empty_)(void*);
    void* owner_;
};

}  // namespace delayq::detail
