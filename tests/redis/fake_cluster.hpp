// Fake Redis Cluster nodes for the routing tests: each is a scripted_server (redis_server.hpp)
// that answers CLUSTER SLOTS from a slot map the test sets, and passes every other command on to
// a real redis-server. Several fake nodes in front of one real server make a "cluster" whose slots
// the test moves at will (a failover is a new map; the data stays where it was), and each node can
// be made sick on its own: hang (a node stopped with SIGSTOP: the kernel still accepts connections,
// nothing is answered), answer LOADING (a node reading its data after a restart), or go away
// (destroy it: connections are refused). Deterministic: no node timeout, no election.
#pragma once

#include <hiredis/hiredis.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redis_server.hpp"

namespace delayq_test {

// What CLUSTER SLOTS answers on every fake node of a test: ranges of slots and the port of the
// node that serves each. With no range, the nodes say "cluster support disabled": one server.
class slot_map {
  public:
    struct range {
        int first, last, port;
    };
    void set(std::vector<range> ranges) {
        std::lock_guard lk(m_);
        ranges_ = std::move(ranges);
    }
    // Every slot to the node on `port`.
    void all_to(int port) { set({{0, 16383, port}}); }

    std::string cluster_slots() const {
        std::lock_guard lk(m_);
        if (ranges_.empty()) return "-ERR This instance has cluster support disabled\r\n";
        std::string out = "*" + std::to_string(ranges_.size()) + "\r\n";
        for (const auto& r : ranges_)
            out += "*3\r\n:" + std::to_string(r.first) + "\r\n:" + std::to_string(r.last) +
                   "\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + std::to_string(r.port) + "\r\n";
        return out;
    }

  private:
    mutable std::mutex m_;
    std::vector<range> ranges_;
};

// A reply of hiredis's back in RESP, as the server wrote it.
inline std::string to_resp(const redisReply* r) {
    switch (r->type) {
        case REDIS_REPLY_STRING:
            return "$" + std::to_string(r->len) + "\r\n" + std::string(r->str, r->len) + "\r\n";
        case REDIS_REPLY_STATUS:
            return "+" + std::string(r->str, r->len) + "\r\n";
        case REDIS_REPLY_ERROR:
            return "-" + std::string(r->str, r->len) + "\r\n";
        case REDIS_REPLY_INTEGER:
            return ":" + std::to_string(r->integer) + "\r\n";
        case REDIS_REPLY_ARRAY: {
            std::string out = "*" + std::to_string(r->elements) + "\r\n";
            for (std::size_t i = 0; i < r->elements; ++i) out += to_resp(r->element[i]);
            return out;
        }
        default:
            return "$-1\r\n";
    }
}

class fake_node {
  public:
    // A node of the "cluster" of `map`, in front of the real server on `upstream`.
    fake_node(std::shared_ptr<slot_map> map, int upstream)
        : map_(std::move(map)),
          upstream_(upstream),
          server_([this](const std::vector<std::string>& args) { return answer(args); }) {}
    fake_node(const fake_node&) = delete;
    fake_node& operator=(const fake_node&) = delete;
    ~fake_node() {
        {
            std::lock_guard lk(m_);
            stopping_ = true;
        }
        cv_.notify_all();  // the held commands end their connections: server_ can join
    }

    int port() const noexcept { return server_.port(); }

    // From now on nothing is answered (commands are read and held), as by a server stopped with
    // SIGSTOP.
    void hang() {
        std::lock_guard lk(m_);
        hung_ = true;
    }
    // Answers again, the held commands first.
    void resume() {
        {
            std::lock_guard lk(m_);
            hung_ = false;
        }
        cv_.notify_all();
    }
    // The next `n` commands are answered LOADING, as by a server reading its data.
    void loading(int n) {
        std::lock_guard lk(m_);
        loading_ = n;
    }
    int loading_left() const {
        std::lock_guard lk(m_);
        return loading_;
    }
    // Commands read and held (hang()), not answered yet.
    int held() const {
        std::lock_guard lk(m_);
        return held_;
    }
    // CLUSTER SLOTS asked so far (answered or held).
    int slots_asked() const {
        std::lock_guard lk(m_);
        return slots_asked_;
    }

  private:
    std::optional<std::string> answer(const std::vector<std::string>& args) {
        const bool slots = args.size() == 2 && args[0] == "CLUSTER" && args[1] == "SLOTS";
        std::unique_lock lk(m_);
        slots_asked_ += slots ? 1 : 0;
        ++held_;
        cv_.wait(lk, [&] { return !hung_ || stopping_; });
        --held_;
        if (stopping_) return std::nullopt;
        if (loading_ > 0) {
            --loading_;
            return "-LOADING Redis is loading the dataset in memory\r\n";
        }
        if (slots) return map_->cluster_slots();
        return forward(args);  // under m_: one command at a time on the one upstream connection
    }

    std::string forward(const std::vector<std::string>& args) {
        if (up_ == nullptr) {
            up_.reset(redisConnect("127.0.0.1", upstream_));
            if (up_ == nullptr || up_->err != 0) {
                up_.reset();
                return "-ERR fake node: no upstream\r\n";
            }
        }
        redisReply* r = command_argv(up_.get(), args);
        if (r == nullptr) {
            up_.reset();
            return "-ERR fake node: upstream lost\r\n";
        }
        std::string out = to_resp(r);
        freeReplyObject(r);
        return out;
    }

    std::shared_ptr<slot_map> map_;
    int upstream_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    bool hung_ = false, stopping_ = false;
    int loading_ = 0, held_ = 0, slots_asked_ = 0;
    struct context_free {
        void operator()(redisContext* c) const noexcept { redisFree(c); }
    };
    std::unique_ptr<redisContext, context_free> up_;  // under m_
    scripted_server server_;  // last, so destroyed first: its threads use the members above
};

}  // namespace delayq_test
