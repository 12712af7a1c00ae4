// prefetch_keeper<Job, Where>: what both job queues keep for their prefetch, and the thread that
// looks after it. redis/detail/stash.hpp says what prefetch is and why its times are what they are;
// sqlite/delay_queue.hpp follows the same rules. In short: the ack of a job that take() handed out
// may also lease the next due job and keep it for this object's next take(). Such a job is held
// only briefly (`hold`: min(400 ms, lease / 4)), its attempt not counted, and take() hands it out
// only within `window` (hold / 4) of the ack; one handed out is made whole (the full lease, the
// attempt counted) by the keeper thread unless an ack or nack of it came within half the window,
// and one that no take() came for within the window is given back. The object keeps at most one
// job per job that take() handed out and that is not settled yet.
//
// This class is the bookkeeping and the thread; the backend does the I/O, through the two
// functions it gives: `extend` (make these handed-out jobs' leases whole) and `give_back` (return
// these kept jobs as they were before the ack leased them). Both are called without the lock, on
// the keeper thread or in stop(); a failure there is left alone, because a hold that is neither
// extended nor given back ends by itself (the holder of an unextended job then finds its lease
// lost, as after any lost lease). `Where` is where a job lives (a Redis shard's number), handed
// back to the backend with it.
//
// Locking: every member but the constructor and stop() is called under the owner's mutex, the
// one given to the constructor, which the keeper thread takes too.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace delayq::detail {

/// `Where` for a backend whose jobs all live in one place.
struct one_place {};

template <class Job, class Where = one_place>
class prefetch_keeper {
  public:
    using clock = std::chrono::steady_clock;
    using milliseconds = std::chrono::milliseconds;

    struct held {  // a job that an ack kept for the next take()
        Job j;
        Where from;
        clock::time_point sent;  // the ack was sent then: the hold began after that
    };
    struct handed {  // a kept job that take() handed out: its lease is to be made whole
        std::string id;
        std::uint64_t token = 0;
        Where from;
        clock::time_point at;  // then, unless an ack or nack of it came first
    };
    using extend_fn = std::function<void(const std::vector<handed>&)>;
    using give_back_fn = std::function<void(const std::vector<held>&)>;

    /// `prefetch`: the user's option; off anyway when the lease is too short for a window of at
    /// least 1 ms. The thread starts with the first job kept.
    prefetch_keeper(std::mutex& m, milliseconds lease, bool prefetch, extend_fn extend,
                    give_back_fn give_back)
        : m_(m),
          hold_(std::min(milliseconds(400), lease / 4)),
          window_(hold_ / 4),
          on_(prefetch && window_ >= milliseconds(1)),
          extend_(std::move(extend)),
          give_back_(std::move(give_back)) {}
    prefetch_keeper(const prefetch_keeper&) = delete;
    prefetch_keeper& operator=(const prefetch_keeper&) = delete;
    ~prefetch_keeper() { stop(); }

    /// How long the backend holds a kept job for this object.
    milliseconds hold() const noexcept { return hold_; }

    /// Not under the lock. Ends the keeper thread and gives back every kept job (best effort).
    /// Idempotent; the owner calls it before the members that `extend` and `give_back` use go.
    void stop() noexcept {
        std::vector<held> left;
        {
            std::lock_guard lk(m_);
            left.swap(stash_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (keeper_.joinable()) keeper_.join();
        try {
            if (!left.empty()) give_back_(left);
        } catch (...) {  // the holds end by themselves
        }
    }

    /// take() handed `n` jobs to user code: until each is settled, an ack may keep one job.
    void hand_out(std::size_t n) noexcept { in_hand_ += n; }

    /// One job handed out is being settled (acked or nacked) by one call. True if that call is to
    /// keep the next due job (`may_keep`: an ack, not a nack; prefetch on; fewer kept than in
    /// user code; the keeper thread runs).
    bool settling(bool may_keep) {
        const bool keep = may_keep && on_ && in_hand_ > stash_.size() && start_keeper();
        if (in_hand_ > 0) --in_hand_;
        return keep;
    }

    /// The call that settled `j` is back (`settled` below), and kept `next`, sent at `sent`.
    void keep(Job next, Where from, clock::time_point sent) {
        stash_.push_back(held{std::move(next), std::move(from), sent});
        wake(sent + window_);
    }

    /// Up to `want` kept jobs that are still fresh, oldest first, handed to user code now (the
    /// caller counts them with hand_out()). Stale ones are left to the keeper to give back.
    std::vector<Job> take(std::size_t want) {
        std::vector<Job> out;
        if (stash_.empty()) return out;
        const auto now = clock::now();
        for (auto it = stash_.begin(); it != stash_.end() && out.size() < want;) {
            if (now - it->sent >= window_) {
                ++it;
                continue;
            }
            const auto at = std::max(now, it->sent + window_ / 2);
            handed_.push_back(handed{it->j.id, it->j.token, it->from, at});
            wake(at);
            out.push_back(std::move(it->j));
            it = stash_.erase(it);
        }
        return out;
    }

    /// `j` was acked or nacked by a call that went through settling(): that proved its hand-over.
    void settled(const Job& j) {
        std::erase_if(handed_, [&](const handed& h) { return h.token == j.token && h.id == j.id; });
    }

    /// The jobs in `js` were acked or nacked by one batch call (no settling()): out of user code.
    void settled(std::span<const Job> js) {
        for (const auto& j : js) settled(j);
        in_hand_ -= std::min(in_hand_, js.size());
    }

    /// `id` is being cancelled: a kept job of it must not be handed out, nor extended.
    void forget(std::string_view id) {
        std::erase_if(stash_, [&](const held& h) { return h.j.id == id; });
        std::erase_if(handed_, [&](const handed& h) { return h.id == id; });
    }

  private:
    // The keeper thread runs (started now if need be); false if it cannot be started, and then
    // nothing is kept.
    bool start_keeper() {
        if (keeper_.joinable()) return true;
        if (stopping_) return false;
        try {
            keeper_ = std::thread([this] { run(); });
        } catch (const std::system_error&) {
            return false;
        }
        return true;
    }

    // The keeper has something to do at `t`.
    void wake(clock::time_point t) {
        if (t < until_) cv_.notify_one();
    }

    // The keeper thread: extends the kept jobs handed out that no ack or nack settled within half
    // the window, and gives back the kept jobs that no take() came for within the window.
    void run() noexcept {
        std::unique_lock lk(m_);
        std::vector<handed> due;
        std::vector<held> stale;
        while (!stopping_) {
            try {
                const auto now = clock::now();
                auto next = clock::time_point::max();
                due.reserve(handed_.size());  // the moves below then cannot throw
                stale.reserve(stash_.size());
                std::erase_if(handed_, [&](handed& h) {
                    if (h.at > now) {
                        next = std::min(next, h.at);
                        return false;
                    }
                    due.push_back(std::move(h));
                    return true;
                });
                std::erase_if(stash_, [&](held& h) {
                    if (h.sent + window_ > now) {
                        next = std::min(next, h.sent + window_);
                        return false;
                    }
                    stale.push_back(std::move(h));
                    return true;
                });
                if (due.empty() && stale.empty()) {
                    until_ = next;
                    if (next == clock::time_point::max())
                        cv_.wait(lk);
                    else
                        cv_.wait_until(lk, next);
                    until_ = clock::time_point::min();  // awake: it looks again anyway
                    continue;
                }
                lk.unlock();
                if (!due.empty()) extend_(due);
                if (!stale.empty()) give_back_(stale);
            } catch (...) {  // no memory, or the backend failed: the holds end by themselves
            }
            due.clear();
            stale.clear();
            if (!lk.owns_lock()) lk.lock();
        }
    }

    std::mutex& m_;  // the owner's
    milliseconds hold_;
    milliseconds window_;
    bool on_;
    extend_fn extend_;
    give_back_fn give_back_;
    std::vector<held> stash_;     // jobs acks kept for the next take(), oldest first
    std::vector<handed> handed_;  // kept jobs handed out, whose leases are to be made whole
    std::size_t in_hand_ = 0;     // jobs take() handed out, not yet settled
    std::condition_variable cv_;
    clock::time_point until_ = clock::time_point::max();  // when the keeper wakes by itself
    bool stopping_ = false;                               // stop() has begun
    std::thread keeper_;  // last: it starts after, and is joined before, everything it uses
};

}  // namespace delayq::detail
