// Replaces the global operator new so that a test can make one allocation fail on demand: set
// `delayq::test::allocations_before_failure` to k and the (k+1)-th allocation on this thread
// throws std::bad_alloc (once; then the counter is -1 again, and every allocation succeeds).
//
// Include it in exactly one translation unit of a test binary: the replacement is for the whole
// binary. The counter is per thread, so only the call under test fails, not another thread or the
// test framework. Every form of new and delete is replaced (the aligned ones too: the wheels' node
// pools take aligned slabs), so that a sanitizer sees malloc/free throughout.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace delayq::test {

// How many more allocations on this thread succeed before one throws; -1: all do.
inline thread_local long allocations_before_failure = -1;

inline void maybe_fail_allocation() {
    if (allocations_before_failure >= 0 && allocations_before_failure-- == 0)
        throw std::bad_alloc();
}

inline void* checked(void* p) {
    if (!p) throw std::bad_alloc();
    return p;
}

inline void* aligned(std::size_t n, std::align_val_t a) {
    const auto al = static_cast<std::size_t>(a);
    const std::size_t rounded =
        (n == 0 ? al : (n + al - 1) / al * al);  // aligned_alloc wants a multiple
    return std::aligned_alloc(al, rounded);
}

}  // namespace delayq::test

// Not inlined: g++ would then see a free() of what `new` returned (-Wmismatched-new-delete).
[[gnu::noinline]] void* operator new(std::size_t n) {
    delayq::test::maybe_fail_allocation();
    return delayq::test::checked(std::malloc(n == 0 ? 1 : n));
}
[[gnu::noinline]] void* operator new[](std::size_t n) {
    delayq::test::maybe_fail_allocation();
    return delayq::test::checked(std::malloc(n == 0 ? 1 : n));
}
[[gnu::noinline]] void* operator new(std::size_t n, std::align_val_t a) {
    delayq::test::maybe_fail_allocation();
    return delayq::test::checked(delayq::test::aligned(n, a));
}
[[gnu::noinline]] void* operator new[](std::size_t n, std::align_val_t a) {
    delayq::test::maybe_fail_allocation();
    return delayq::test::checked(delayq::test::aligned(n, a));
}
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    return std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
    return std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::align_val_t) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, std::align_val_t) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
