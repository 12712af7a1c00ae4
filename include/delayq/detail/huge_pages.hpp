// Memory for large, long-lived arrays and slabs, on huge pages where the system has them.
//
// A timer with a million pending nodes spreads them over 48 MiB; expiring them, or sorting the
// batch that a late pass takes out, touches that memory in an order the TLB cannot cover with
// 4 KiB pages: nearly every node would cost a page walk, and a page walk is what a prefetch waits
// for longest. Regions of 2 MiB, aligned to 2 MiB and advised as huge pages (Linux's
// MADV_HUGEPAGE; transparent huge pages in "madvise" mode need it, "always" mode does it anyway),
// make that one TLB entry per 2 MiB. Elsewhere the advice is skipped and nothing else changes.
//
// Reserved, not resident. The arrays a wheel's pass sorts into are reserved when timers are
// scheduled, for as many as are pending, so that a pass never allocates and cannot fail for memory
// (due_batch.hpp). Most of that room is touched only by a late pass, and only while it runs. So
// reserved_allocator maps those of 16 KiB and more straight from the system (Linux: mmap): a page
// costs memory once touched, and release_unused() hands the touched pages past a kept prefix back
// (MADV_DONTNEED) while the mapping, and so the reservation, stays. Smaller ones, and all of them
// elsewhere, come from operator new.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace delayq::detail {

inline constexpr std::size_t huge_page_bytes = std::size_t{1} << 21;

/// `bytes` (a multiple of 64 KiB), aligned to min(bytes, 2 MiB); huge pages advised for 2 MiB
/// and more. Throws std::bad_alloc.
inline void* allocate_region(std::size_t bytes) {
    const std::size_t align = bytes < huge_page_bytes ? bytes : huge_page_bytes;
    void* p = ::operator new (bytes, std::align_val_t{align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= huge_page_bytes) (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

inline void deallocate_region(void* p, std::size_t bytes) noexcept {
    const std::size_t align = bytes < huge_page_bytes ? bytes : huge_page_bytes;
    ::operator delete (p, std::align_val_t{align});
}

/// The bytes of an array of n T, at most PTRDIFF_MAX once rounded up to whole huge pages. Throws
/// std::bad_array_new_length.
template <class T>
std::size_t array_bytes(std::size_t n) {
    constexpr auto most = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
    if (n > (most - huge_page_bytes) / sizeof(T)) throw std::bad_array_new_length();
    return n * sizeof(T);
}

/// A std::allocator that puts arrays of 2 MiB and more on huge pages (allocate_region).
template <class T>
struct huge_page_allocator {
    using value_type = T;

    huge_page_allocator() noexcept = default;
    template <class U>
    huge_page_allocator(const huge_page_allocator<U>&) noexcept {}  // NOLINT: rebinding converts

    T* allocate(std::size_t n) {
        const std::size_t bytes = array_bytes<T>(n);
        if (bytes < huge_page_bytes)
            return static_cast<T*>(::operator new (bytes, std::align_val_t{alignof(T)}));
        return static_cast<T*>(allocate_region(round_up(bytes)));
    }

    void deallocate(T* p, std::size_t n) noexcept {
        const std::size_t bytes = n * sizeof(T);
        if (bytes < huge_page_bytes) {
            ::operator delete (p, std::align_val_t{alignof(T)});
        } else {
            deallocate_region(p, round_up(bytes));
        }
    }

    friend bool operator==(const huge_page_allocator&, const huge_page_allocator&) noexcept {
        return true;
    }

  private:
    static std::size_t round_up(std::size_t b) noexcept {
        return (b + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
    }
};

#if defined(__linux__)
inline constexpr std::size_t page_bytes = 4096;  // the smallest page Linux maps; a multiple of it
                                                 // is a multiple of any smaller page size
// The smallest array mapped on its own (1 Ki records): each mapping is one of the process's at
// most ~65 000 (vm.max_map_count), so a program with thousands of small wheels must not spend them.
inline constexpr std::size_t mapped_bytes = std::size_t{1} << 14;

/// `bytes` (a multiple of page_bytes) mapped from the system, aligned to 2 MiB (and huge pages
/// advised) from 2 MiB on. Throws std::bad_alloc.
inline void* map_region(std::size_t bytes) {
    if (bytes < huge_page_bytes) {
        void* p =
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        return p;
    }
    // Over-map by 2 MiB and trim both ends, so that the region starts on a huge page.
    const std::size_t over = bytes + huge_page_bytes;
    void* raw = ::mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    char* const first = static_cast<char*>(raw);
    const auto a = reinterpret_cast<std::uintptr_t>(raw);
    const std::size_t lead = ((a + huge_page_bytes - 1) & ~(huge_page_bytes - 1)) - a;
    char* const p = first + lead;
    if (lead != 0) (void)::munmap(first, lead);
    if (const std::size_t tail = over - lead - bytes; tail != 0) (void)::munmap(p + bytes, tail);
#if defined(MADV_HUGEPAGE)
    (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}
#endif

/// A std::allocator for the arrays reserved for as many records as a wheel holds: from 16 KiB on,
/// mapped from the system (Linux), on huge pages from 2 MiB on; see "Reserved, not resident"
/// above. Elsewhere, huge_page_allocator's.
template <class T>
struct reserved_allocator {
    using value_type = T;

    reserved_allocator() noexcept = default;
    template <class U>
    reserved_allocator(const reserved_allocator<U>&) noexcept {}  // NOLINT: rebinding converts

    T* allocate(std::size_t n) {
#if defined(__linux__)
        const std::size_t bytes = array_bytes<T>(n);
        if (bytes >= mapped_bytes) return static_cast<T*>(map_region(round_up(bytes)));
        return static_cast<T*>(::operator new (bytes, std::align_val_t{alignof(T)}));
#else
        return huge_page_allocator<T>().allocate(n);
#endif
    }

    void deallocate(T* p, std::size_t n) noexcept {
#if defined(__linux__)
        const std::size_t bytes = n * sizeof(T);
        if (bytes >= mapped_bytes) {
            (void)::munmap(p, round_up(bytes));
        } else {
            ::operator delete (p, std::align_val_t{alignof(T)});
        }
#else
        huge_page_allocator<T>().deallocate(p, n);
#endif
    }

    /// Hands back the memory of the pages of p[0..n) (an array from allocate(n)) from element
    /// `keep` on: they read as zeros when next touched, and cost nothing until then. The caller
    /// holds nothing there. Where arrays are not mapped, does nothing.
    static void release_unused([[maybe_unused]] T* p, [[maybe_unused]] std::size_t n,
                               [[maybe_unused]] std::size_t keep) noexcept {
#if defined(__linux__)
        const std::size_t bytes = n * sizeof(T);
        if (bytes < mapped_bytes) return;
        const std::size_t unit = bytes < huge_page_bytes ? page_bytes : huge_page_bytes;
        const std::size_t from = (keep * sizeof(T) + unit - 1) / unit * unit;
        const std::size_t end = round_up(bytes);
        if (from < end)
            (void)::madvise(static_cast<char*>(static_cast<void*>(p)) + from, end - from,
                            MADV_DONTNEED);
#endif
    }

    friend bool operator==(const reserved_allocator&, const reserved_allocator&) noexcept {
        return true;
    }

  private:
#if defined(__linux__)
    // Whole pages, whole huge pages from 2 MiB on.
    static std::size_t round_up(std::size_t b) noexcept {
        const std::size_t unit = b < huge_page_bytes ? page_bytes : huge_page_bytes;
        return (b + unit - 1) / unit * unit;
    }
#endif
};

/// The pages of v's room past its first `keep` elements, handed back (v holds no more than
/// `keep`): see reserved_allocator::release_unused.
template <class T>
void release_unused(std::vector<T, reserved_allocator<T>>& v, std::size_t keep) noexcept {
    if (v.size() <= keep) reserved_allocator<T>::release_unused(v.data(), v.capacity(), keep);
}

}  // namespace delayq::detail
