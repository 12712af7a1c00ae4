// Routing commands to the Redis node that holds their keys: one server, or a Redis Cluster. Part
// of <delayq/redis/delay_queue.hpp>.
//
// The idea. A queue's keys share one hash tag, so every command of a queue goes to one slot, and
// the only question is which node serves that slot now. The router asks the first node it can
// reach (`CLUSTER SLOTS`) and keeps a map of the 16 384 slots to their masters; a server without
// cluster support answers with an error, and then every slot is that server. The map goes stale
// when the cluster changes, and the servers say so:
//
// - `MOVED slot host:port`: the slot lives elsewhere now (a reshard finished, a replica took
//   over). The command did not run; the router sends it there, patches the slot, and reloads the
//   whole map before the next command.
// - `ASK slot host:port`: the slot is being migrated and this key may already be on the target.
//   The command did not run; the router sends `ASKING` and the command, back to back on the
//   target's connection, and leaves the map alone (the slot is not the target's yet).
// - `TRYAGAIN` (a multi-key command during a migration, some keys here, some there),
//   `CLUSTERDOWN` (no master for the slot during a failover), `LOADING` (a restarted server
//   reading its data): the command did not run; the router waits (10 ms, doubling to 100 ms) and
//   tries again, for up to `io_timeout` in all.
// - A slot that no node serves in the map just loaded (mid-failover, the node asked knows the old
//   master stepped down but not yet who took over): as CLUSTERDOWN, wait and reload the map.
// - A node that cannot be reached (connection refused after it died): nothing was sent; in a
//   cluster the router reloads the map from another node and tries again, within the same
//   `io_timeout`. Against a single server there is nowhere else to go, so that is an error at once.
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
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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

class router {
  public:
    router(endpoint seed, milliseconds io_timeout)
        : seed_(std::move(seed)), io_timeout_(io_timeout) {}
    router(const router&) = delete;
    router& operator=(const router&) = delete;

    // Runs `c` on the master of `slot`, following the cluster's redirections (see "The idea").
    // Error replies other than those come back as replies; I/O failures are thrown. Not
    // `patient`: no waiting at all: a node that cannot be reached, TRYAGAIN, CLUSTERDOWN or
    // LOADING end the call at once (for a caller that has elsewhere to go meanwhile: a sharded
    // take with other shards to serve it).
    reply_ptr call(std::uint16_t slot, command c, bool patient = true) {
        using clock = std::chrono::steady_clock;
        const auto give_up = patient ? clock::now() + io_timeout_ : clock::now();
        milliseconds pause(10);
        const auto wait = [&] {
            if (clock::now() + pause > give_up) return false;
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, milliseconds(100));
            return true;
        };
        node* target = nullptr;
        bool asking = false;
        for (int redirects = 0;;) {
            if (target == nullptr && (target = route(slot)) == nullptr) {
                if (!wait()) throw unserved(slot);
                continue;  // mid-failover: the map is reloaded before the next try
            }
            reply_ptr r;
            try {
                if (asking) {
                    static constexpr std::array<std::string_view, 1> asking_cmd{"ASKING"};
                    const std::array<command, 2> both{command(asking_cmd), c};
                    r = std::move(target->l.call(both)[1]);
                } else {
                    r = target->l.call(c);
                }
            } catch (const unsent_error&) {
                if (!clustered()) throw;
                invalidate();  // that node is gone: someone else serves the slot, or will soon
                if (!wait()) throw;
                target = nullptr;
                asking = false;
                continue;
            }
            if (r->type != REDIS_REPLY_ERROR) return r;
            const std::string_view t = text_of(r.get());
            const bool moved = t.starts_with("MOVED "), ask = t.starts_with("ASK ");
            if ((moved || ask) && ++redirects <= 16) {
                endpoint to = redirect_target(t, target->at);
                std::lock_guard lk(m_);
                target = &node_at(to);
                if (moved) {
                    slots_[slot] = target;
                    stale_ = true;
                }
                asking = ask;
                continue;
            }
            const bool transient = t.starts_with("TRYAGAIN") || t.starts_with("CLUSTERDOWN") ||
                                   t.starts_with("LOADING");
            if (!transient || !wait()) return r;
            target = nullptr;  // the slot may have moved meanwhile
            asking = false;
        }
    }

    // The node that serves `slot` now; a subscriber listens there (in a cluster, every node
    // hears every PUBLISH).
    endpoint node_of(std::uint16_t slot) {
        if (node* n = route(slot)) return n->at;
        throw unserved(slot);
    }

    bool clustered() {
        std::lock_guard lk(m_);
        return mode_ == mode::cluster;
    }

    // The map is out of date (a node could not be reached): reload it before the next command.
    void invalidate() {
        std::lock_guard lk(m_);
        stale_ = true;
    }

  private:
    struct node {
        node(endpoint e, milliseconds io) : at(e), l(std::move(e), io) {}
        endpoint at;
        link l;
    };
    enum class mode { unknown, single, cluster };

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
        nodes_.push_back(std::make_unique<node>(e, io_timeout_));
        return *nodes_.back();
    }

    // The node that serves `slot`, or nullptr while none does: in the middle of a failover a node
    // can answer CLUSTER SLOTS without the slot that changes hands. The map is then reloaded
    // before the next route.
    node* route(std::uint16_t slot) {
        std::lock_guard lk(m_);
        if (mode_ == mode::unknown || stale_) refresh();
        if (mode_ == mode::single) return &node_at(seed_);
        if (slots_[slot] == nullptr) stale_ = true;
        return slots_[slot];
    }

    static error unserved(std::uint16_t slot) {
        return error("delayq::redis: no node of the cluster serves slot " + std::to_string(slot));
    }

    // Reloads the slot map (under m_) from the first node that answers, the seed last.
    void refresh() {
        std::vector<endpoint> ask;
        for (auto& n : nodes_) ask.push_back(n->at);
        if (std::find(ask.begin(), ask.end(), seed_) == ask.end()) ask.push_back(seed_);
        std::exception_ptr last;
        for (const auto& e : ask) {
            static constexpr std::array<std::string_view, 2> slots_cmd{"CLUSTER", "SLOTS"};
            reply_ptr r;
            try {
                r = node_at(e).l.call(slots_cmd);
            } catch (const error&) {
                last = std::current_exception();
                continue;
            }
            if (r->type == REDIS_REPLY_ERROR &&
                text_of(r.get()).find("cluster support disabled") != std::string_view::npos) {
                mode_ = mode::single;
                stale_ = false;
                return;
            }
            if (r->type != REDIS_REPLY_ARRAY) {
                last = std::make_exception_ptr(
                    error("delayq::redis: CLUSTER SLOTS: " + std::string(text_of(r.get()))));
                continue;
            }
            std::vector<node*> fresh(slot_count);
            for (std::size_t i = 0; i < r->elements; ++i) {
                const redisReply* range = r->element[i];
                if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
                    range->element[2]->elements < 2)
                    continue;
                const redisReply* master = range->element[2];
                endpoint m{std::string(text_of(master->element[0])),
                           static_cast<int>(master->element[1]->integer), e.user, e.password};
                if (m.host.empty() || m.host == "?") m.host = e.host;
                node* n = &node_at(m);
                const auto first = static_cast<std::size_t>(range->element[0]->integer);
                const auto end =
                    std::min(static_cast<std::size_t>(range->element[1]->integer) + 1, slot_count);
                for (std::size_t s = first; s < end; ++s) fresh[s] = n;
            }
            slots_.swap(fresh);
            mode_ = mode::cluster;
            stale_ = false;
            return;
        }
        std::rethrow_exception(last);
    }

    endpoint seed_;
    milliseconds io_timeout_;
    std::mutex m_;
    mode mode_ = mode::unknown;
    bool stale_ = false;
    std::vector<std::unique_ptr<node>> nodes_;
    std::vector<node*> slots_ = std::vector<node*>(slot_count);  // 128 KiB: off the object
};

}  // namespace delayq::redis::detail
