// How the threads of a queue object wait for due jobs without polling the server: the job queues'
// one taker (delayq/detail/job_queue/taker.hpp) over the shards of the queue and its pub/sub
// channel. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. Every script reports how far off its shard's next event is, and every script that
// makes it earlier publishes the new time on the queue's channel (see "Wake-ups" in scripts.hpp),
// so the taker knows, for each shard (a lane), a time before which nothing there is due. One
// thread, the leader, waits on a subscription to the channel until the earliest of those times;
// the others sleep in the taker. So a process needs one subscribed connection per queue object,
// however many threads consume. After `max_block` without news a shard is looked at anyway: each
// answer's next event is taken as at most max_block away, a safety net for messages lost while a
// connection was down. Every waiting object hears every message, so when a job comes due each idle
// object looks once and one of them gets it (the others learn the next due time); busy objects run
// nothing.
//
// A take that waits holds the subscription, not a link (connection.hpp), so it holds up no other
// call of the object. A shard whose script fails is set aside by the taker for a while, so that a
// sharded queue goes on serving from the others.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../../detail/job_queue/taker.hpp"
#include "../../job.hpp"
#include "../types.hpp"
#include "cluster.hpp"
#include "connection.hpp"
#include "script_client.hpp"

namespace delayq::redis::detail {

// What the taker needs of a Redis queue: its shards as lanes, the consume script as the claim,
// the channel's subscription as the wake source.
class taker_store {
  public:
    using clock = std::chrono::steady_clock;
    using claimed = delayq::detail::job_queue::claimed<clock>;
    using news = delayq::detail::job_queue::news<clock>;

    static constexpr bool external_wake = true;
    static constexpr bool claim_for_all = false;  // the combiner merges concurrent consumes
    static constexpr bool look_on_entry = true;   // another client's put may not be heard yet
    static constexpr std::size_t claim_cap = max_take_many;
    // A lost subscription is never the caller's: subscribe again (a restarted server).
    static constexpr unsigned wake_losses_per_take = std::numeric_limits<unsigned>::max();

    explicit taker_store(script_client& client) : client_(client) {}

    [[nodiscard]] std::size_t lanes() const noexcept { return client_.shards(); }

    claimed claim(std::size_t s, std::size_t want, bool patient) {
        consumed c = client_.consume(s, {}, want, patient);
        return {std::move(c.jobs), next_of(c.next)};
    }

    // Shard `s`'s next event, from a script's answer: `ms` away (+1 ms: the server rounds its now
    // down, so the distance may be short by less than a millisecond), 0: more is due now, -1:
    // nothing queued; and at most max_block (see the top of this file).
    [[nodiscard]] clock::time_point next_of(long long ms) const {
        const milliseconds max_block = client_.get_options().max_block;
        const milliseconds d =
            ms < 0 ? max_block : std::min(milliseconds(ms + (ms > 0 ? 1 : 0)), max_block);
        return clock::now() + d;
    }

    // No recheck: max_block bounds every shard's `next` instead (next_of()).
    static clock::duration recheck_every() noexcept { return clock::duration::max(); }
    static bool changed_elsewhere() noexcept { return false; }

    // (Re)subscribes. A SUBSCRIBE is harmless to repeat, so whatever befalls the connection
    // (refused, or the node died before it answered) it is tried again, as the router retries a
    // command that did not run, within io_timeout. In a cluster every node hears every PUBLISH:
    // each try goes to the node of the next shard, so that one node down does not stop the
    // waiting.
    void open_wake() {
        sub_.reset();
        std::exception_ptr failed;
        router& route = client_.route();
        const milliseconds io_timeout = client_.get_options().io_timeout;
        const auto give_up = clock::now() + io_timeout;
        milliseconds pause(10);
        for (std::size_t attempt = 0;; ++attempt) {
            std::optional<endpoint> at;
            try {
                at = route.node_of(client_.slot(attempt % client_.shards()));
            } catch (const error&) {  // no node of the cluster answered (yet): try again
                failed = std::current_exception();
            }
            if (at) {
                try {
                    sub_ = std::make_unique<subscriber>(*at, io_timeout, client_.channel());
                    return;
                } catch (const io_failure&) {  // the connection: try again
                    failed = std::current_exception();
                }  // a refusal (SUBSCRIBE not allowed), out of memory: final
            }
            const auto now = clock::now();
            if (now >= give_up) std::rethrow_exception(failed);
            if (route.clustered()) route.invalidate();  // the map may name a dead node
            std::this_thread::sleep_for(std::min<clock::duration>(pause, give_up - now));
            pause = std::min(pause * 2, milliseconds(100));
        }
    }

    // Waits on the subscription; a message "<shard> <ms>" says the shard's next event is that
    // near now. A lost connection (a killed client, a restarted server) is a lost wake source.
    bool wait_wake(clock::time_point until, int poke, std::vector<news>& heard, bool) {
        messages_.clear();
        try {
            sub_->wait(until, messages_, poke);
        } catch (const error&) {
            sub_.reset();
            return false;
        }
        for (const std::string& m : messages_) {
            const std::string_view msg(m);
            const auto space = msg.find(' ');
            std::size_t i = 0;
            long long ms = 0;
            if (space == std::string_view::npos ||
                std::from_chars(msg.data(), msg.data() + space, i).ec != std::errc() ||
                std::from_chars(msg.data() + space + 1, msg.data() + msg.size(), ms).ec !=
                    std::errc())
                continue;  // not ours (a newer layout on the same channel): ignore it
            heard.push_back({i, clock::now() + milliseconds(ms + (ms > 0 ? 1 : 0))});
        }
        return true;
    }

    // One consume per take: nothing answers several takes at once.
    static std::exception_ptr copy_error(const std::exception_ptr& e) noexcept { return e; }

    // A shard's own failure (its node down, a failover): the other shards may still serve.
    static bool lane_failure(const std::exception_ptr& e) noexcept {
        try {
            std::rethrow_exception(e);
        } catch (const error&) {
            return true;
        } catch (...) {
            return false;
        }
    }

    // A child after fork(): the subscription is the parent's; the child's copy of its descriptor
    // is closed, and nothing is sent on it.
    void drop_inherited() noexcept {
        sub_.reset();
        messages_.clear();
    }

  private:
    script_client& client_;
    std::unique_ptr<subscriber> sub_;    // used by the taker's leader only
    std::vector<std::string> messages_;  // likewise
};

// The waiting takes of one queue object, and the calls whose answers they learn from.
class waiting_room {
  public:
    explicit waiting_room(script_client& client) : client_(client), store_(client) {}

    std::vector<job> take(std::size_t want, milliseconds max_wait, const std::stop_token& stop) {
        return taker_.take(want, max_wait, stop);
    }

    // The consume script for the calls that settle leases, and that may lease `take` jobs too
    // without waiting (ack_and_try_take): the taker learns the shard's next event from it at once,
    // as from its own claims. A job leased here was due, so its lane's `next` had come: the answer
    // sets it anew (more due now: another take is woken; else the leader, asleep until a time this
    // answer moved, is brought back if it would sleep past the new one), and news heard on the way
    // stays (the flight's floor).
    consumed consume_and_learn(std::size_t s, std::span<const std::string_view> settle,
                               std::size_t take = 0) {
        return taker_.learn_from(s, [&](taker_store::clock::time_point& next) {
            consumed c = client_.consume(s, settle, take);
            next = store_.next_of(c.next);
            return c;
        });
    }

    // Whether a take would rather lease from another shard than `s` now (taker::other_lane_first).
    bool other_shard_first(std::size_t s) noexcept { return taker_.other_lane_first(s); }

    // Shard `s` may have a job for a take now (a place under the limits freed, and the script
    // that freed it did not answer the taker: a cancel).
    void hint(std::size_t s) { taker_.hint(s, taker_store::clock::now()); }

  private:
    script_client& client_;
    taker_store store_;
    delayq::detail::job_queue::taker<taker_store> taker_{store_};
};

}  // namespace delayq::redis::detail
