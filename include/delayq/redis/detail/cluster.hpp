// Routing commands to the Redis node that holds their keys: one server, or a Redis Cluster. Part
// of <delayq/redis/delay_queue.hpp>.
//
// The idea. A queue's keys share one hash tag, so every command of a queue goes to one slot, and
// the only question is which node serves that slot now. The router asks a node (`CLUSTER SLOTS`)
// and keeps a map of the 16 384 slots to their masters; a server without cluster support answers
// with an error, and then every slot is that server. The map goes stale when the cluster changes,
// and the servers say so, or stop answering:
//
// - `MOVED slot host:port`: the slot lives elsewhere now (a reshard finished, a replica took
//   over). The command did not run; the router sends it there and patches the slot (each other
//   slot that moved says so when it is next used).
// - `ASK slot host:port`: the slot is being migrated and this key may already be on the target.
//   The command did not run; the router sends `ASKING` and the command, back to back on the
//   target's connection, and leaves the map alone (the slot is not the target's yet).
// - `TRYAGAIN` (a multi-key command during a migration, some keys here, some there),
//   `CLUSTERDOWN` (no master for the slot during a failover), `LOADING` (a restarted server
//   reading its data): the command did not run; the router waits (10 ms, doubling to 100 ms) and
//   tries again, for up to `io_timeout` in all. The map's own load is retried so too: a server
//   that answers `CLUSTER SLOTS` with LOADING is waited for within the first call's io_timeout.
// - A slot that no node serves in the map just loaded (mid-failover, the node asked knows the old
//   master stepped down but not yet who took over): as CLUSTERDOWN, wait and reload the map.
// - A node that cannot be reached (connection refused after it died): nothing was sent; in a
//   cluster the router reloads the map from another node and tries again, within the same
//   `io_timeout`. Against a single server there is nowhere else to go, so that is an error at once.
// - A node that does not answer (a master hung, or stopped with SIGSTOP: the kernel still accepts
//   connections): the call times out, and is an error (it may have run). The node's link is
//   suspect from then on (connection.hpp), until it answers again, and every call for a slot on a
//   suspect node first reloads the map, asking healthy nodes first: once the cluster has failed the
//   node over, the next call goes to the new master.
//
// Time. A call has one budget, io_timeout from its start (connection.hpp): the map's reload, the
// waits and the round trip all spend from it, so the call returns or fails within io_timeout
// (plus one connect) whatever the nodes do. A reload is done by one thread at a time, without the
// router's lock, since a node asked may hang: meanwhile every call whose slot's node is healthy
// goes on with the map it has, and only the calls that need the new map wait for it, each within
// its own budget. So a sick node holds up no call to a healthy one.
//
// What it does not do: retry a command whose reply was lost (it may have run: only the caller
// knows whether running it twice is harmless), read from replicas, or follow a cluster whose
// every known node is gone (it starts again from the address in the options). The queue's
// scripts declare every key they touch or a key that never exists (see scripts.hpp), so Redis
// refuses them with TRYAGAIN while their slot is half migrated and runs them whole on one node.
// Debian's hiredis 0.14 has no cluster support of its own; this covers what a delay queue needs
// and no more (no multi-slot commands, no pub/sub sharding, no pipelines across nodes).
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "connection.hpp"

namespace delayq::redis::detail {

inline constexpr std::size_t slot_count = 16384;

// CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys with.
inline constexpr std::array<std::uint16_t, 256> crc16_table = [] {
    std::array<std::uint16_t, 256> t{};
    for (unsigned i = 0; i < 256; ++i) {
        unsigned c = i << 8;
        for (int b = 0; b < 8; ++b) c = (c & 0x8000U) != 0 ? (c << 1) ^ 0x1021U : c << 1;
        t[i] = static_cast<std::uint16_t>(c);
    }
    return t;
}();

constexpr std::uint16_t crc16(std::string_view s) noexcept {
    unsigned crc = 0;
    for (char ch : s)
        crc = ((crc << 8) ^ crc16_table[((crc >> 8) ^ static_cast<unsigned char>(ch)) & 0xFFU]) &
              0xFFFFU;
    return static_cast<std::uint16_t>(crc);
}

// The slot of `key`: only the part between the first '{' and the next '}' counts, if not empty.
constexpr std::uint16_t slot_of(std::string_view key) noexcept {
    if (const auto open = key.find('{'); open != std::string_view::npos) {
        const auto close = key.find('}', open + 1);
        if (close != std::string_view::npos && close > open + 1)
            key = key.substr(open + 1, close - open - 1);
    }
    return static_cast<std::uint16_t>(crc16(key) % slot_count);
}

// Answers that mean "not now": the command did not run, and may run a little later.
inline bool transient(std::string_view t) noexcept {
    return t.starts_with("TRYAGAIN") || t.starts_with("CLUSTERDOWN") || t.starts_with("LOADING") ||
           t.starts_with("MASTERDOWN");
}

class router {
  public:
    router(endpoint seed, milliseconds io_timeout)
        : seed_(std::move(seed)), io_timeout_(io_timeout) {}
    router(const router&) = delete;
    router& operator=(const router&) = delete;

    // Runs `c` on the master of `slot`, following the cluster's redirections (see "The idea"),
    // within io_timeout (plus one connect). Error replies other than those come back as replies;
    // I/O failures are thrown. Not `patient`: no waiting at all: a node that cannot be reached,
    // TRYAGAIN, CLUSTERDOWN or LOADING end the call at once (for a caller that has elsewhere to
    // go meanwhile: a sharded take with other shards to serve it).
    reply_ptr call(std::uint16_t slot, command c, bool patient = true) {
        return call(slot, c, patient, budget::from_now(io_timeout_));
    }

    // The same within `b`, a budget that began earlier (a call merged with others spends the
    // budget of the earliest of them).
    reply_ptr call(std::uint16_t slot, command c, bool patient, const budget& b) {
        const auto give_up = patient ? b.deadline : b.start;
        milliseconds pause(10);
        const auto wait = [&] {
            if (steady::now() + pause > give_up) return false;
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, milliseconds(100));
            return true;
        };
        node* target = nullptr;
        bool asking = false;
        for (int redirects = 0;;) {
            if (target == nullptr) {
                routed to = route(slot, b);
                if (to.why != nullptr) {  // no slot map
                    if (!to.retry || !wait()) std::rethrow_exception(to.why);
                    continue;
                }
                if ((target = to.n) == nullptr) {  // mid-failover: no master for the slot yet
                    if (!wait()) throw unserved(slot);
                    continue;
                }
            }
            reply_ptr r;
            try {
                if (asking) {
                    static constexpr std::array<std::string_view, 1> asking_cmd{"ASKING"};
                    const std::array<command, 2> both{command(asking_cmd), c};
                    r = std::move(target->l->call(both, b)[1]);
                } else {
                    r = target->l->call(c, b);
                }
            } catch (const unsent_error&) {
                // Nothing ran. The node is suspect now, so the next route reloads the map: in a
                // cluster someone else may serve the slot, or will soon. One server is the only
                // place to go.
                if (!clustered() || !wait()) throw;
                target = nullptr;
                asking = false;
                continue;
            }
            // Any other failure is thrown as it is (the command may have run): the node is
            // suspect, and the next call reloads the map before it goes there.
            if (r->type != REDIS_REPLY_ERROR) return r;
            const std::string_view t = text_of(r.get());
            const bool moved = t.starts_with("MOVED "), ask = t.starts_with("ASK ");
            if ((moved || ask) && ++redirects <= 16) {
                endpoint to = redirect_target(t, target->at);
                std::lock_guard lk(m_);
                target = &node_at(to);
                if (moved) slots_[slot] = target;  // the other slots say so when asked
                asking = ask;
                continue;
            }
            if (!transient(t) || !wait()) return r;
            target = nullptr;  // the slot may have moved meanwhile
            asking = false;
        }
    }

    // The node that serves `slot` now; a subscriber listens there (in a cluster, every node
    // hears every PUBLISH). Throws error when none is known yet.
    endpoint node_of(std::uint16_t slot) {
        routed to = route(slot, budget::from_now(io_timeout_));
        if (to.why != nullptr) std::rethrow_exception(to.why);
        if (to.n == nullptr) throw unserved(slot);
        return to.n->at;
    }

    bool clustered() {
        std::lock_guard lk(m_);
        return mode_ == mode::cluster;
    }

    // The map is out of date (a node could not be reached): the next route reloads it.
    void invalidate() {
        std::lock_guard lk(m_);
        reload_ = true;
    }

  private:
    struct node {
        explicit node(const endpoint& e) : at(e), l(shared_link(e)) {}
        endpoint at;
        std::shared_ptr<link> l;
    };
    enum class mode { unknown, single, cluster };

    // What route() found: the node, or (why) that no map could be had, and whether that may
    // change if asked again (retry).
    struct routed {
        node* n = nullptr;
        std::exception_ptr why;
        bool retry = false;
    };

    // A slot map as CLUSTER SLOTS gave it, or the reason none came.
    struct loaded {
        struct range {
            std::size_t first, end;
            endpoint master;
        };
        mode what = mode::unknown;  // unknown: it failed
        std::vector<range> ranges;
        std::vector<endpoint> replicas;  // nodes to ask next time too
        std::exception_ptr why;
        bool retry = false;  // a node said LOADING, CLUSTERDOWN, TRYAGAIN
        bool unsent = true;  // every failure was a node that could not be reached
    };

    // "MOVED 3999 127.0.0.1:6381"; an empty host means the host we asked.
    static endpoint redirect_target(std::string_view t, const endpoint& asked) {
        const auto at = t.rfind(' ');
        const auto colon = t.rfind(':');
        if (at == std::string_view::npos || colon == std::string_view::npos || colon < at)
            throw error("delayq::redis: cannot read the redirection '" + std::string(t) + "'");
        endpoint e{std::string(t.substr(at + 1, colon - at - 1)), 0, asked.user, asked.password};
        const auto port = t.substr(colon + 1);
        std::from_chars(port.data(), port.data() + port.size(), e.port);
        if (e.host.empty()) e.host = asked.host;
        return e;
    }

    node& node_at(const endpoint& e) {  // under m_; nodes are never removed, so pointers stay valid
        for (auto& n : nodes_)
            if (n->at == e) return *n;
        nodes_.push_back(std::make_unique<node>(e));
        return *nodes_.back();
    }

    // The node that serves `slot`, reloading the map first when there is none yet, when the
    // slot's node is suspect (a call there timed out or failed: it may have been failed over) or
    // has none (mid-failover), or when invalidate() asked for it. One thread reloads at a time,
    // without the lock (the nodes it asks may hang): the others go on with the map they have
    // where their node is not suspect, and wait (within their budget) for the reload otherwise.
    routed route(std::uint16_t slot, const budget& b) {
        std::unique_lock lk(m_);
        if (generation_ != fork_generation()) {  // a child: a reload of the parent's never ends
            loading_ = false;
            // Made anew, not destroyed: its waiters were the parent's threads (waiting.hpp's
            // forget_the_parent() says why).
            new (&cv_) std::condition_variable;
            generation_ = fork_generation();
        }
        const std::uint64_t seen = loads_;
        for (;;) {
            if (mode_ == mode::single) return {&node_at(seed_), nullptr, false};
            node* n = mode_ == mode::cluster ? slots_[slot] : nullptr;
            const bool usable = n != nullptr && !n->l->suspect();
            if (loads_ != seen) {            // reloaded since this call came: take what it found
                if (mode_ == mode::unknown)  // each waiter its own copy (copy_of says why)
                    return {nullptr, copy_of(last_why_), last_retry_};
                return {n, nullptr, false};
            }
            if (usable && !reload_) return {n, nullptr, false};
            if (loading_) {
                if (usable)
                    return {n, nullptr, false};  // only invalidate() wants it: no need to wait
                if (!cv_.wait_until(lk, b.deadline, [&] { return !loading_; }))
                    return {nullptr,
                            std::make_exception_ptr(connection_error(
                                "delayq::redis: no slot map within io_timeout (" +
                                std::to_string(b.io_timeout.count()) +
                                " ms): the nodes asked for CLUSTER SLOTS did not answer")),
                            false};
                continue;
            }
            loading_ = true;
            reload_ = false;
            const std::vector<asked> ask = ask_order();
            lk.unlock();
            loaded got;
            try {
                got = load(ask, b);
            } catch (...) {  // out of memory
                got.why = std::current_exception();
                got.unsent = false;
            }
            lk.lock();
            install(got);
            loading_ = false;
            ++loads_;
            cv_.notify_all();
        }
    }

    // A node to ask for the slot map, and its link.
    using asked = std::pair<endpoint, std::shared_ptr<link>>;

    // Under m_: the nodes to ask for the slot map, healthy ones first, suspect ones last: every
    // node known (the seed, masters, the replicas of the last map).
    std::vector<asked> ask_order() {
        (void)node_at(seed_);
        for (const auto& e : replicas_) (void)node_at(e);
        std::vector<asked> good, bad;
        for (const auto& n : nodes_) (n->l->suspect() ? bad : good).emplace_back(n->at, n->l);
        good.insert(good.end(), bad.begin(), bad.end());
        return good;
    }

    static connection_error unserved(std::uint16_t slot) {
        return connection_error("delayq::redis: no node of the cluster serves slot " +
                                std::to_string(slot));
    }

    // Asks the nodes of `ask` in turn for CLUSTER SLOTS until one answers with a map (or says
    // it is no cluster), within `b`. No lock held: a node may hang, and only this call waits.
    static loaded load(const std::vector<asked>& ask, const budget& b) {
        static constexpr std::array<std::string_view, 2> slots_cmd{"CLUSTER", "SLOTS"};
        loaded out;
        for (const auto& node : ask) {
            const endpoint& e = node.first;  // a name, not a binding: lambdas below capture it
            reply_ptr r;
            try {
                r = node.second->call(command(slots_cmd), b);
            } catch (const unsent_error&) {
                out.why = std::current_exception();
                continue;
            } catch (const error&) {
                out.why = std::current_exception();
                out.unsent = false;
                continue;
            }
            out.unsent = false;
            const std::string_view t = text_of(r.get());
            if (r->type == REDIS_REPLY_ERROR &&
                t.find("cluster support disabled") != std::string_view::npos) {
                out.what = mode::single;
                return out;
            }
            if (r->type != REDIS_REPLY_ARRAY) {
                out.retry = out.retry || (r->type == REDIS_REPLY_ERROR && transient(t));
                out.why = std::make_exception_ptr(
                    error("delayq::redis: CLUSTER SLOTS: " + std::string(t)));
                continue;
            }
            for (std::size_t i = 0; i < r->elements; ++i) {
                const redisReply* range = r->element[i];
                if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
                const auto node_in = [&](const redisReply* at, endpoint& to) {
                    if (at->type != REDIS_REPLY_ARRAY || at->elements < 2) return false;
                    to = {std::string(text_of(at->element[0])),
                          static_cast<int>(at->element[1]->integer), e.user, e.password};
                    if (to.host.empty() || to.host == "?") to.host = e.host;
                    return true;
                };
                loaded::range got{
                    static_cast<std::size_t>(range->element[0]->integer),
                    std::min(static_cast<std::size_t>(range->element[1]->integer) + 1, slot_count),
                    {}};
                if (!node_in(range->element[2], got.master)) continue;
                out.ranges.push_back(std::move(got));
                for (std::size_t k = 3; k < range->elements; ++k)
                    if (endpoint replica; node_in(range->element[k], replica))
                        out.replicas.push_back(std::move(replica));
            }
            out.what = mode::cluster;
            return out;
        }
        return out;
    }

    // Under m_: what load() found becomes the map. A failure leaves the map as it was and says
    // whether asking again may help: a node said "not now", or, in a known cluster, no node could
    // be reached (a failover's moment). Against an unknown seed that refuses, there is nothing to
    // wait for.
    void install(loaded& got) {
        last_why_ = got.why;
        last_retry_ = got.retry || (got.unsent && mode_ == mode::cluster);
        if (got.what == mode::single) {
            mode_ = mode::single;
            return;
        }
        if (got.what != mode::cluster) return;
        std::fill(slots_.begin(), slots_.end(), nullptr);
        for (const auto& r : got.ranges) {
            node* n = &node_at(r.master);
            for (std::size_t s = r.first; s < r.end; ++s) slots_[s] = n;
        }
        replicas_ = std::move(got.replicas);
        mode_ = mode::cluster;
    }

    endpoint seed_;
    milliseconds io_timeout_;
    std::mutex m_;
    std::condition_variable cv_;  // a reload ended
    mode mode_ = mode::unknown;
    bool reload_ = false;          // invalidate() asked for a reload
    bool loading_ = false;         // a thread is reloading the map
    std::uint64_t loads_ = 0;      // reloads ended so far
    std::exception_ptr last_why_;  // why the last reload found no map
    bool last_retry_ = false;      // and whether asking again may help
    std::vector<std::unique_ptr<node>> nodes_;
    std::vector<endpoint> replicas_;           // from the last map: asked for the next one too
    unsigned generation_ = fork_generation();  // the fork generation this was last used in
    std::vector<node*> slots_ = std::vector<node*>(slot_count);  // 128 KiB: off the object
};

}  // namespace delayq::redis::detail
