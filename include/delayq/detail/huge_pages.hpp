// Memory for large, long-lived arrays and slabs, on huge pages where the system has them.
//
// A timer with a million pending nodes spreads them over 48 MiB; expiring them, or sorting the
// batch that a late pass takes out, touches that memory in an order the TLB cannot cover with
// 4 KiB pages: nearly every node would cost a page walk, and a page walk is what a prefetch waits
// for longest. Regions of 2 MiB, aligned to 2 MiB and advised as huge pages (Linux's
// MADV_HUGEPAGE; transparent huge pages in "madvise" mode need it, "always" mode does it anyway),
// make that one TLB entry per 2 MiB. Elsewhere the advice is skipped and nothing else changes.
#pragma once

#include <cstddef>
#include <limits>
#include <new>

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

/// A std::allocator that puts arrays of 2 MiB and more on huge pages (allocate_region).
template <class T>
struct huge_page_allocator {
    using value_type = T;

    huge_page_allocator() noexcept = default;
    template <class U>
    huge_page_allocator(const huge_page_allocator<U>&) noexcept {}  // NOLINT: rebinding converts

    T* allocate(std::size_t n) {
        // at most PTRDIFF_MAX bytes once rounded up to whole huge pages
        constexpr auto most = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
        if (n > (most - huge_page_bytes) / sizeof(T)) throw std::bad_array_new_length();
        const std::size_t bytes = n * sizeof(T);
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

}  // namespace delayq::detail
