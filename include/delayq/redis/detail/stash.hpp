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
// above). `options::prefetch = false` turns it off; so does a lease under 16 ms. The bookkeeping
// and the keeper thread are delayq::detail::prefetch_keeper, which the SQLite queue shares; this
// file is the Redis side: which script calls keep, extend and give back.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/prefetch_keeper.hpp"
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
          keeper_(
              m_, client.get_options().lease, client.get_options().prefetch,
              [this](const std::vector<handed>& hs) { extend_all(hs); },
              [this](const std::vector<held>& hs) { release(hs); }),
          hold_ms_(std::to_string(keeper_.hold().count())) {}
    stash(const stash&) = delete;
    stash& operator=(const stash&) = delete;

    // Gives back the jobs that acks leased for a take() that never came: without this
    // they would wait for their hold to end. Best effort: if it fails, the hold ends anyway.
    ~stash() { keeper_.stop(); }

    // Under lk: up to `want` kept jobs that are still fresh; the keeper gives stale ones back,
    // and extends the ones handed out unless an ack or nack of them comes first.
    std::vector<job> take(std::unique_lock<std::mutex>& /*lk*/, std::size_t want) {
        return keeper_.take(want);
    }

    // take() or take_many() handed `n` jobs to user code: until each is acked or nacked, an ack
    // may keep one job for the next take().
    void hand_out(std::size_t n) {
        std::lock_guard lk(m_);
        keeper_.hand_out(n);
    }

    // Settles job `j` of shard `s` by the consume script (`how`: see scripts.hpp). With
    // `keep_next`, and prefetch on, the same call leases the shard's next due job for the next
    // take(). False if the lease was lost.
    bool settle(std::size_t s, const job& j, std::string_view how, bool keep_next) {
        bool fetch = false;
        {
            std::lock_guard lk(m_);
            fetch = keeper_.settling(keep_next);
        }
        const std::string token = std::to_string(j.token);
        const std::array<std::string_view, 3> args{how, j.id, token};
        const auto sent = clock::now();
        consumed c = client_.consume(s, args, fetch ? 1 : 0, fetch ? hold_ms_ : "0");
        std::lock_guard lk(m_);
        room_.learn(s, c.next);
        keeper_.settled(j);  // settled (or lost): nothing to extend
        if (!c.jobs.empty()) {
            keeper_.keep(std::move(c.jobs.front()), s, sent);
            room_.wake_one();  // a thread waiting in take() may have it
        }
        return c.ok.front();
    }

    // The jobs in `js` were acked or nacked by one batch call: out of user code, and their
    // hand-over proved (nothing to extend).
    void settled(std::span<const job> js) {
        std::lock_guard lk(m_);
        keeper_.settled(js);
    }

    // `id` is being cancelled: a kept job of it must not be handed out, nor extended.
    void forget(std::string_view id) {
        std::lock_guard lk(m_);
        keeper_.forget(id);
    }

  private:
    using keeper = delayq::detail::prefetch_keeper<job, std::size_t>;  // a job's shard
    using held = keeper::held;
    using handed = keeper::handed;

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
    void release(const std::vector<held>& hs) {
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
    keeper keeper_;        // its thread uses client_ and room_, and is stopped before they go
    std::string hold_ms_;  // how long the server keeps a job an ack kept (keeper::hold())
};

}  // namespace delayq::redis::detail
