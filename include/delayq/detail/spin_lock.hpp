// spin_lock: the lock a wheel takes for every schedule, cancel and claim — critical sections of a
// few dozen nanoseconds.
//
// Why not std::mutex. Acquiring this lock is one inline atomic exchange and releasing it one store;
// std::mutex is two calls into libc with an atomic read-modify-write each way, a visible share of
// a 15 ns schedule. And a std::mutex that is taken puts the thread to sleep in the kernel at once:
// two threads scheduling at the same time then pay a futex sleep and wake-up (microseconds) per
// schedule, and the pair runs many times slower than one thread alone. Here a thread that finds
// the lock taken spins briefly (the holder is almost always about to release it), then yields its
// core so that a holder that was preempted can run, and after many yields sleeps for a few
// microseconds at a time: it never waits for a wake-up that could be lost, and a long hold (a pass
// sorting a large batch) costs the waiters little CPU.
//
// Meets the standard's Lockable requirements (std::lock_guard, std::unique_lock).
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace delayq::detail {

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
        for (unsigned round = 0;; ++round) {
            // test before test-and-set: spinning on a read keeps the line shared, not bouncing
            while (locked_.load(std::memory_order_relaxed)) {
                if (round < 64) {
                    pause();
                } else if (round < 1024) {
                    std::this_thread::yield();
                } else {
                    std::this_thread::sleep_for(std::chrono::microseconds(20));
                }
                ++round;
            }
            if (!locked_.exchange(true, std::memory_order_acquire)) return;
        }
    }

    static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
    }

    std::atomic<bool> locked_{false};
};

}  // namespace delayq::detail
