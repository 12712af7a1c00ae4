// The prefetch stash: the jobs that acks lease for the object's next take(), and the keeper thread
// that looks after them. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea: one round trip per job. Users write `while (auto j = q.take(t)) { work(*j);
// q.ack(*j); }`. The ack (not a nack) of a job that take() handed out also leases the next due
// job of its shard, in the same script call, and keeps it for the object's next take(), which
// then needs no round trip: the loop costs the consumer one call per job while jobs are due
// (BullMQ's worker does the same when it completes a job). A job kept that way is handed to no
// user code yet, so the server holds it for a short `hold`, min(400 ms, lease / 4), its attempt
// not counted (the "kept" state of scripts.hpp): an object that never calls again (stopped,
// killed, or done taking) cannot keep it any longer, and it is never dead-lettered for a delivery
// nobody saw. take() hands a kept job out only within a quarter of the hold after the ack was
// sent, min(100 ms, lease / 16); an ack or nack of it proves the hand-over by itself, and if none
// came within half that window the keeper thread extends it (scripts.hpp's "extend": the whole
// lease, the attempt counted), long before the hold ends. So a loop whose jobs take under 50 ms
// costs no extra call. The keeper also gives back (release) the kept jobs that no take() came for
// within the window, and the destructor the rest. The object keeps at most one per job that
// take() handed out and that is not yet acked or nacked (one per consumer thread in the loop
// above). `options::prefetch = false` turns it off; so does a lease under 16 ms.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../types.hpp"
#include "script_client.hpp"
#include "waiting.hpp"

namespace delayq::redis::detail {

// The kept jobs of one queue object, under its lock (waiting_room::mutex()).
class stash {
  public:
    using clock = std::chrono::steady_clock;

    stash(script_client& client, waiting_room& room)
        : client_(client),
          room_(room),
          m_(room.mutex()),
          hold_(std::min(milliseconds(400), client.get_options().lease / 4)),
          window_(hold_ / 4),
          hold_ms_(std::to_string(hold_.count())),
          prefetch_(client.get_options().prefetch && window_ >= milliseconds(1)) {}
    stash(const stash&) = delete;
    stash& operator=(const stash&) = delete;

    // Gives back the jobs that acks leased for a take() that never came: without this
    // they would wait for their hold to end. Best effort: if it fails, the hold ends anyway.
    ~stash() {
        std::vector<held> left;
        {
            std::lock_guard lk(m_);
            left.swap(stash_);
            stopping_ = true;
        }
        keeper_cv_.notify_all();
        if (keeper_.joinable()) keeper_.join();
        try {
            release(left);
        } catch (...) {  // the server is gone: the leases end by themselves
        }
    }

    // Under lk: up to `want` kept jobs that are still fresh; stale ones go back to the queue.
    // The keeper extends the ones handed out, unless an ack or nack of them comes first.
    std::vector<job> take(std::unique_lock<std::mutex>& lk, std::size_t want) {
        std::vector<job> out;
        if (stash_.empty()) return out;
        const auto now = clock::now();
        std::vector<held> stale;
        std::vector<handed> extend;
        out.reserve(std::min(want, stash_.size()));  // the moves below then cannot throw
        stale.reserve(stash_.size());
        extend.reserve(out.capacity());
        std::erase_if(stash_, [&](held& h) {
            if (now - h.sent >= window_) {
                stale.push_back(std::move(h));
                return true;
            }
            if (out.size() >= want) return false;
            extend.push_back(handed{{}, h.j.token, h.from, std::max(now, h.sent + window_ / 2)});
            out.push_back(std::move(h.j));
            return true;
        });
        for (std::size_t i = 0; i < out.size(); ++i) {
            extend[i].id = out[i].id;
            wake_keeper(extend[i].at);
        }
        handed_.insert(handed_.end(), std::make_move_iterator(extend.begin()),
                       std::make_move_iterator(extend.end()));
        if (!stale.empty()) {
            lk.unlock();
            try {
                release(stale);
            } catch (const error&) {  // their leases end by themselves
            }
            lk.lock();
        }
        return out;
    }

    // take() handed a job to user code: until it is acked or nacked, an ack may keep one job
    // for the next take().
    void hand_out() {
        std::lock_guard lk(m_);
        ++in_hand_;
    }

    // Settles job `j` of shard `s` by the consume script (`how`: see scripts.hpp). With
    // `keep_next`, and prefetch on, the same call leases the shard's next due job for the next
    // take(). False if the lease was lost.
    bool settle(std::size_t s, const job& j, std::string_view how, bool keep_next) {
        bool fetch = false;
        {
            std::lock_guard lk(m_);
            fetch = keep_next && prefetch_ && in_hand_ > stash_.size() && start_keeper();
            if (in_hand_ > 0) --in_hand_;
        }
        const std::string token = std::to_string(j.token);
        const std::array<std::string_view, 3> args{how, j.id, token};
        const auto sent = clock::now();
        consumed c = client_.consume(s, args, fetch ? 1 : 0, fetch ? hold_ms_ : "0");
        std::lock_guard lk(m_);
        room_.learn(s, c.next);
        forget_handed(j);  // settled (or lost): nothing to extend
        if (!c.jobs.empty()) {
            stash_.push_back(held{std::move(c.jobs.front()), s, sent});
            room_.wake_one();  // a thread waiting in take() may have it
            wake_keeper(sent + window_);
        }
        return c.ok.front();
    }

    // The jobs in `js` were acked or nacked: that proved their hand-over, nothing to extend.
    void settled(std::span<const job> js) {
        std::lock_guard lk(m_);
        for (const auto& j : js) forget_handed(j);
    }

    // `id` is being cancelled: a kept job of it must not be handed out, nor extended.
    void forget(std::string_view id) {
        std::lock_guard lk(m_);
        std::erase_if(stash_, [&](const held& h) { return h.j.id == id; });
        std::erase_if(handed_, [&](const handed& h) { return h.id == id; });
    }

  private:
    struct held {  // a job that an ack kept for the next take()
        job j;
        std::size_t from;        // its shard
        clock::time_point sent;  // the ack was sent then: the server's hold began after that
    };

    struct handed {  // a kept job that take() handed out: its lease is to be extended
        std::string id;
        std::uint64_t token = 0;
        std::size_t from = 0;  // its shard
        clock::time_point at;  // extend it then, unless an ack or nack of it came first
    };

    // Under m_: the keeper thread runs (started now if need be); false if it cannot be started,
    // and then nothing is kept.
    bool start_keeper() {
        if (keeper_.joinable()) return true;
        if (stopping_) return false;
        try {
            keeper_ = std::thread([this] { keep(); });
        } catch (const std::system_error&) {
            return false;
        }
        return true;
    }

    // Under m_: the keeper has something to do at `t`.
    void wake_keeper(clock::time_point t) {
        if (t < keeper_until_) keeper_cv_.notify_one();
    }

    // Under m_: `j` was acked or nacked: the ack or nack proved the hand-over by itself.
    void forget_handed(const job& j) {
        std::erase_if(handed_, [&](const handed& h) { return h.token == j.token && h.id == j.id; });
    }

    // The keeper thread: extends the kept jobs that take() handed out and that no ack or nack
    // settled within half the window, and gives back the kept jobs that no take() came for within
    // the window. Failures are left alone: a hold that is not extended or given back ends by itself
    // (the holder of an unextended job then finds its lease lost, as after any lost lease).
    void keep() noexcept {
        std::unique_lock lk(m_);
        std::vector<handed> extend;
        std::vector<held> stale;
        while (!stopping_) {
            try {
                const auto now = clock::now();
                auto next = clock::time_point::max();
                extend.reserve(handed_.size());  // the moves below then cannot throw
                stale.reserve(stash_.size());
                std::erase_if(handed_, [&](handed& h) {
                    if (h.at > now) {
                        next = std::min(next, h.at);
                        return false;
                    }
                    extend.push_back(std::move(h));
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
                if (extend.empty() && stale.empty()) {
                    keeper_until_ = next;
                    if (next == clock::time_point::max())
                        keeper_cv_.wait(lk);
                    else
                        keeper_cv_.wait_until(lk, next);
                    keeper_until_ = clock::time_point::min();  // awake: it looks again anyway
                    continue;
                }
                lk.unlock();
                extend_all(extend);
                release(stale);
            } catch (...) {  // the server is gone, or no memory: the holds end by themselves
            }
            extend.clear();
            stale.clear();
            if (!lk.owns_lock()) lk.lock();
        }
    }

    // Makes the leases of handed-out kept jobs whole, one script call per shard.
    void extend_all(const std::vector<handed>& hs) {
        for (std::size_t s = 0; s < client_.shards(); ++s) {
            std::vector<std::string> tokens;
            for (const auto& h : hs)
                if (h.from == s) tokens.push_back(std::to_string(h.token));
            if (tokens.empty()) continue;
            std::vector<std::string_view> args;
            std::size_t k = 0;
            for (const auto& h : hs)
                if (h.from == s) args.insert(args.end(), {"x", h.id, tokens[k++]});
            room_.consume_and_learn(s, args);
        }
    }

    // Gives kept jobs back to their shards, as they were before an ack leased them.
    void release(std::vector<held>& hs) {
        for (std::size_t s = 0; s < client_.shards(); ++s) {
            std::vector<std::string> ms, tokens;
            std::vector<std::string_view> args;
            for (const auto& h : hs)
                if (h.from == s) {
                    ms.push_back(tagged('r', to_ms(h.j.deadline)));
                    tokens.push_back(std::to_string(h.j.token));
                }
            if (ms.empty()) continue;
            std::size_t k = 0;
            for (const auto& h : hs)
                if (h.from == s) {
                    args.insert(args.end(), {ms[k], h.j.id, tokens[k]});
                    ++k;
                }
            room_.consume_and_learn(s, args);
        }
    }

    script_client& client_;
    waiting_room& room_;
    std::mutex& m_;        // the object's lock (waiting_room::mutex())
    milliseconds hold_;    // how long the server keeps a job an ack kept (see "The idea")
    milliseconds window_;  // how long after its ack take() may hand out a kept job
    std::string hold_ms_;
    bool prefetch_;  // options::prefetch, unless the lease is too short for a window
    std::vector<held> stash_;
    std::size_t in_hand_ = 0;     // jobs take() handed out, not yet acked or nacked
    std::vector<handed> handed_;  // kept jobs take() handed out, to extend
    std::condition_variable keeper_cv_;
    clock::time_point keeper_until_ = clock::time_point::max();  // when the keeper wakes by itself
    bool stopping_ = false;                                      // the destructor has begun
    std::thread keeper_;  // last: it starts after, and is joined before, everything it uses
};

}  // namespace delayq::redis::detail
