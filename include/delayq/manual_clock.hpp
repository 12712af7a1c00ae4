// A chrono clock whose time moves only when told, for deterministic tests of anything that waits.
//
// Structures in delayq wait through their Clock (detail/wait.hpp). manual_clock implements the
// wait hook: a waiter registers its mutex and condition variable, and advance()/set()/reset() lock
// each registered waiter's mutex and notify it. Locking the waiter's mutex before notifying is what
// makes the wake-up impossible to lose: the waiter checks the time and goes to sleep under that
// same mutex, so advance() either runs before the check (the waiter sees the new time) or after the
// waiter is asleep (the notification reaches it).
//
// The clock is global (static now(), as chrono requires): call reset() at the start of each test.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stop_token>
#include <vector>

#include "detail/time.hpp"
#include "detail/wait.hpp"

namespace delayq {

/// A chrono Clock whose time moves only when told (advance(), set(), reset()), for tests of
/// anything that waits: every delayq structure waits through its Clock, and moving this one wakes
/// every thread sleeping on one of its deadlines, so timing tests need no sleep and cannot be
/// flaky. Its time is global (static, as chrono requires): call reset() at the start of each test.
///
/// Thread safety: every member may be called from any thread. now() is one atomic load; moving
/// the clock costs O(number of sleeping waiters).
class manual_clock {
  public:
    using duration = std::chrono::nanoseconds;                 ///< nanoseconds
    using rep = duration::rep;                                 ///< a 64-bit count
    using period = duration::period;                           ///< std::nano
    using time_point = std::chrono::time_point<manual_clock>;  ///< a point on this clock
    static constexpr bool is_steady = true;  ///< advance() never goes back (set() may: tests only)

    /// The current time: time_point{} after reset(), then wherever it was moved. Never throws.
    static time_point now() noexcept {
        return time_point{duration{state().now.load(std::memory_order_acquire)}};
    }

    /// Moves time forward by d (saturating; a negative d is ignored: the clock is steady) and
    /// wakes every thread sleeping on a manual_clock deadline, to look at the new time. Throws
    /// std::bad_alloc (the list of sleepers is copied); the time has moved by then.
    static void advance(duration d) {
        if (d <= duration::zero()) return;
        auto& s = state();
        rep cur = s.now.load(std::memory_order_relaxed);
        rep next;
        do {
            next = detail::saturating_add(time_point{duration{cur}}, d).time_since_epoch().count();
        } while (!s.now.compare_exchange_weak(cur, next, std::memory_order_acq_rel));
        wake_all();
    }

    /// Sets the time (tests may move it anywhere, backwards included) and wakes the sleepers, as
    /// advance().
    static void set(time_point tp) {
        state().now.store(tp.time_since_epoch().count(), std::memory_order_release);
        wake_all();
    }

    /// Back to time_point{}, as set(time_point{}).
    static void reset() { set(time_point{}); }

    /// Number of threads now sleeping on a manual_clock deadline (lets a test wait until a
    /// thread it started is really asleep before it moves the clock).
    static std::size_t sleepers() {
        auto& s = state();
        std::lock_guard lk(s.m);
        return s.waiters.size();
    }

    /// How many waits on a manual_clock deadline have begun, ever. A wait that begins after an
    /// advance() returned has seen the new time: a test that sees this count grow knows a waiter
    /// has looked at the clock since.
    static std::uint64_t sleeps_begun() {
        auto& s = state();
        std::lock_guard lk(s.m);
        return s.begun;
    }

    /// The wait hook of detail/wait.hpp, called by the structures, not by users: sleeps on `cv`
    /// (with `lk` held on entry and on return, as condition variables do) until notified, stop
    /// requested, or now() >= tp. May return spuriously. Throws std::bad_alloc (the registration
    /// allocates), with `lk` held.
    template <class CV>
    static void wait_until(CV& cv, std::unique_lock<std::mutex>& lk, time_point tp,
                           std::stop_token st) {
        waiter w{lk.mutex(), &cv, &notify<CV>};
        enlist(w);
        if (now() < tp) detail::wait(cv, lk, std::move(st));
        delist(w, lk);
    }

  private:
    struct waiter {
        std::mutex* m;
        void* cv;
        void (*notify)(void*);
        int pins = 0;  // wake_all() holds a pin while it may still touch m and cv
    };

    struct shared {
        std::atomic<rep> now{0};
        std::mutex m;  // guards waiters and pins
        std::condition_variable unpinned;
        std::vector<waiter*> waiters;
        std::uint64_t begun = 0;
    };

    static shared& state() {
        static shared s;
        return s;
    }

    template <class CV>
    static void notify(void* cv) {
        static_cast<CV*>(cv)->notify_all();
    }

    static void enlist(waiter& w) {
        auto& s = state();
        std::lock_guard lk(s.m);
        s.waiters.push_back(&w);
        ++s.begun;
    }

    // Called with the waiter's own mutex held. A wake_all() that pinned w may be blocked on that
    // mutex, so let go of it while waiting for the pin to drop.
    static void delist(waiter& w, std::unique_lock<std::mutex>& own) {
        auto& s = state();
        std::unique_lock lk(s.m);
        std::erase(s.waiters, &w);
        if (w.pins == 0) return;
        own.unlock();
        s.unpinned.wait(lk, [&] { return w.pins == 0; });
        lk.unlock();
        own.lock();
    }

    static void wake_all() {
        auto& s = state();
        std::vector<waiter*> targets;
        {
            std::lock_guard lk(s.m);
            targets = s.waiters;
            for (auto* w : targets) ++w->pins;
        }
        for (auto* w : targets) {
            std::lock_guard lk(*w->m);
            w->notify(w->cv);
        }
        {
            std::lock_guard lk(s.m);
            for (auto* w : targets) --w->pins;
        }
        s.unpinned.notify_all();
    }
};

}  // namespace delayq
