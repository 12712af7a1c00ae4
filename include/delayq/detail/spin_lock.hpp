// spin_lock: the lock a wheel takes for every schedule, cancel and claim — critical sections of a
// few dozen nanoseconds.
//
// Why not std::mutex. Acquiring this lock is one inline atomic exchange and releasing it one store;
// std::mutex is two calls into libc with an atomic read-modify-write each way, a visible share of
// a schedule that costs a few dozen nanoseconds (an unlock by exchange, as a futex lock needs,
// costs more: docs/performance.md, "spin_lock"). Here a thread that finds the lock taken spins
// briefly (the holder is almost always about to release it), yields its core twice (a holder that
// was preempted gets to run), then sleeps 20 µs at a time: it never waits for a wake-up that could
// be lost, and a long hold (a pass sorting a large batch) costs the waiters little CPU.
//
// Why sleep so soon. Two threads that both schedule flat out lose most of their time moving the
// lock's and the ring's cache lines between their cores whenever the lock changes hands. A waiter
// that sleeps leaves the holder the lock, and those lines, for many schedules in a row: the pair
// then does what one thread does alone (docs/performance.md, "spin_lock", has the figures).
// The price is fairness: under that kind of contention a thread may wait tens of microseconds for
// its turn (its sleeps, plus the OS's timer slack), while the other runs.
//
// Meets the standard's Lockable requirements (std::lock_guard, std::unique_lock).
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <type_traits>

namespace delayq::detail {

inline void spin_lock_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

/// How a thread waits for a lock that is taken: pauses that double from 1 to 64 (the holder is
/// almost always about to let go, and a waiter that looks less often leaves it the cache line, so
/// that it can take the lock again without a transfer), then two yields of its core (a holder that
/// was preempted gets to run), then sleeps of 20 µs (see the top of this header for why so soon).
class backoff {
  public:
    void wait() noexcept {
        if (n_ <= 64) {
            for (unsigned i = 0; i < n_; ++i) spin_lock_pause();
            n_ *= 2;
        } else if (++yields_ < 2) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

  private:
    unsigned n_ = 1;
    unsigned yields_ = 0;
};

class spin_lock {
  public:
    void lock() noexcept {
        if (!locked_.exchange(true, std::memory_order_acquire)) return;
        wait_and_lock();
    }

    bool try_lock() noexcept {
        return !locked_.load(std::memory_order_relaxed) &&
               !locked_.exchange(true, std::memory_order_acquire);
    }

    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

  private:
    [[gnu::noinline]] void wait_and_lock() noexcept {
        backoff b;
        do {
            // test before test-and-set: waiting on a read keeps the line shared, not bouncing
            while (locked_.load(std::memory_order_relaxed)) b.wait();
        } while (locked_.exchange(true, std::memory_order_acquire));
    }

    std::atomic<bool> locked_{false};
};

/// The contended part of lock_with_backoff(): tries with backoff, then blocks.
template <class Mutex>
[[gnu::noinline]] void lock_with_backoff_contended(Mutex& m) {
    backoff b;
    for (int i = 0; i < 9; ++i) {
        b.wait();
        if (m.try_lock()) return;
    }
    m.lock();
}

/// Locks a mutex whose holders hold it briefly: tries with backoff before blocking, so that two
/// threads contending do not put each other to sleep in the kernel at every turn.
///
/// The first try of a std::mutex under glibc reads the lock word and, when it is free, takes the
/// mutex with lock(), not try_lock(): glibc's lock() leaves out the atomic instruction while the
/// process has one thread, and its fast path is shorter than try_lock()'s, which saves five
/// registers and dispatches on the mutex's kind through a jump table. Losing the race between the
/// read and lock() costs one sleep in the kernel, as lock() does. Elsewhere the first try is
/// try_lock().
template <class Mutex>
void lock_with_backoff(Mutex& m) {
#if defined(__GLIBC__)
    if constexpr (std::is_same_v<Mutex, std::mutex>) {
        // __lock is the futex word of glibc's pthread_mutex_t: 0 when free (part of its ABI).
        if (__atomic_load_n(&m.native_handle()->__data.__lock, __ATOMIC_RELAXED) == 0) {
            m.lock();
            return;
        }
        lock_with_backoff_contended(m);
        return;
    }
#endif
    if (m.try_lock()) return;
    lock_with_backoff_contended(m);
}

}  // namespace delayq::detail
