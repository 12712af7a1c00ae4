// delayq::redis::sharded_delay_queue on one redis-server: one logical queue over N hash tags.
// (tests/redis-cluster runs it on a cluster, where the shards live on different masters.)
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <future>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "flow.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::sharded_delay_queue;
using delayq_test::eventually;
using delayq_test::opts;
using delayq_test::redis_server;

TEST_CASE("sharded: the number of shards must be 1..16384") {
    const auto o = delayq_test::queue_options(6379);
    CHECK_THROWS_AS(sharded_delay_queue(o, 0), std::invalid_argument);
    CHECK_THROWS_AS(sharded_delay_queue(o, 16385), std::invalid_argument);
    CHECK(sharded_delay_queue(o, 16384).shards() == 16384);  // nothing connects yet
}

TEST_CASE(
    "sharded: an id's shard is FNV-1a of the id modulo the shard count, whichever object puts it") {
    redis_server srv;
    sharded_delay_queue a(opts(srv), 8), b(opts(srv), 8);
    for (int i = 0; i < 50; ++i) {
        const std::string id = "order-" + std::to_string(i);
        REQUIRE(a.put_after(id, "p", 1h));
        CHECK_FALSE(b.put_after(id, "again", 1h));  // idempotent by id across objects
        const auto shard = delayq::redis::detail::fnv1a(id) % 8;
        CHECK(srv.text({"ZSCORE", "dq:v3:{q#" + std::to_string(shard) + "}:events", id}) != "");
    }
    CHECK(a.size() == 50);
    CHECK(b.cancel("order-7"));
    CHECK_FALSE(a.cancel("order-7"));
    CHECK(b.reschedule("order-8", 0ms));
    auto j = a.take(1s);
    REQUIRE(j);
    CHECK(j->id == "order-8");
    CHECK(a.ack(*j));
    CHECK(a.size() == 48);
}

TEST_CASE("sharded: jobs come out of every shard, in deadline order within each, never early") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 4);
    const long long before = srv.time_ms();
    std::map<std::string, int> delay_of;
    for (int i = 0; i < 40; ++i) {
        const std::string id = "j" + std::to_string(i);
        delay_of[id] = (i * 37) % 300;
        REQUIRE(q.put_after(id, "", std::chrono::milliseconds(delay_of[id])));
    }
    std::map<std::uint64_t, std::vector<std::chrono::system_clock::time_point>>
        per_shard;  // due times
    for (int n = 0; n < 40; ++n) {
        auto j = q.take(5s);
        REQUIRE(j);
        const auto taken_at = j->lease_deadline - 30s;
        CHECK(taken_at >= j->deadline);  // never early, by the server's clock
        CHECK(j->deadline >= std::chrono::system_clock::time_point(
                                 std::chrono::milliseconds(before + delay_of[j->id])));
        per_shard[delayq::redis::detail::fnv1a(j->id) % 4].push_back(j->deadline);
        CHECK(q.ack(*j));
    }
    CHECK(per_shard.size() == 4);
    for (const auto& [shard, dues] : per_shard) CHECK(std::is_sorted(dues.begin(), dues.end()));
    CHECK_FALSE(q.take(0ms));
}

TEST_CASE("sharded: a waiting take listens on one connection and wakes for a put to any shard") {
    redis_server srv;
    sharded_delay_queue consumer(opts(srv), 16);
    CHECK_FALSE(consumer.take(0ms));
    for (const char* id : {"x", "y", "z"}) {
        auto taken = std::async(std::launch::async, [&] { return consumer.take(20s); });
        REQUIRE(
            eventually([&] { return srv.waiting_objects() == 1; }));  // 16 shards, one subscription
        sharded_delay_queue producer(opts(srv), 16);
        REQUIRE(producer.put_after(id, id, 100ms));
        REQUIRE(taken.wait_for(5s) == std::future_status::ready);
        auto j = taken.get();
        REQUIRE(j);
        CHECK(j->id == id);
        const auto taken_at = j->lease_deadline - 30s;
        CHECK(taken_at >= j->deadline);
        CHECK(taken_at - j->deadline < 2s);  // not a max_block (5 s) late
        CHECK(consumer.ack(*j));
    }
}

TEST_CASE(
    "sharded: put_many, take_many and ack_many across shards keep the single calls' answers") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 5);
    std::vector<std::string> ids;
    for (int i = 0; i < 1100; ++i) ids.push_back("b" + std::to_string(i));
    std::vector<sharded_delay_queue::put_request> reqs;
    for (const auto& id : ids) reqs.push_back({id, id, 0ms});
    reqs.push_back({ids[3], "duplicate", 0ms});
    const auto queued = q.put_many(reqs);
    REQUIRE(queued.size() == reqs.size());
    CHECK(std::count(queued.begin(), queued.end(), true) == 1100);
    CHECK_FALSE(queued.back());
    std::set<std::string> seen;
    while (seen.size() < ids.size()) {
        auto jobs = q.take_many(300, 1s);
        REQUIRE_FALSE(jobs.empty());
        std::set<std::uint64_t> shards;
        for (const auto& j : jobs) {
            CHECK(j.payload == j.id);
            CHECK(seen.insert(j.id).second);
            shards.insert(delayq::redis::detail::fnv1a(j.id) % 5);
        }
        CHECK(shards.size() == 1);  // one script call: one shard
        const auto acked = q.ack_many(jobs);
        CHECK(std::count(acked.begin(), acked.end(), true) == static_cast<long>(jobs.size()));
    }
    CHECK(q.size() == 0);
}

TEST_CASE("sharded: 4 producers x 4 consumers over 8 shards: every job acked exactly once") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 8);
    const auto r = delayq_test::run_flow(q, {});
    for (const auto& f : r.failures) FAIL_CHECK(f);
    CHECK(r.all_acked_once());
    CHECK(q.size() == 0);
}

TEST_CASE(
    "sharded: fencing tokens count per shard: a job's next lease has a greater token, two "
    "shards can hand out the same token") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 2);
    std::array<std::string, 2> ids;  // one id of each shard
    for (int i = 0; ids[0].empty() || ids[1].empty(); ++i) {
        const std::string id = "t" + std::to_string(i);
        ids[delayq::redis::detail::fnv1a(id) % 2] = id;
    }
    for (const auto& id : ids) REQUIRE(q.put_after(id, "", 0ms));
    auto a = q.take(5s), b = q.take(5s);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->id != b->id);
    CHECK(a->token == b->token);  // each shard's first lease: its counter's first value
    REQUIRE(q.nack(*a, 0ms));
    auto again = q.take(5s);
    REQUIRE(again);
    CHECK(again->id == a->id);
    CHECK(again->token > a->token);  // the same job, the same shard: a greater token
    CHECK_FALSE(q.ack(*a));          // the old lease is fenced off
    CHECK(q.ack(*again));
    CHECK(q.ack(*b));
    CHECK(q.size() == 0);
}

namespace {

// A loopback TCP proxy in front of a redis-server that closes, as soon as it arrives, each of
// the first `drops` connections on which a SUBSCRIBE comes: a node that dies just after a
// subscription reached it. Everything else passes through both ways.
class subscribe_dropper {
  public:
    subscribe_dropper(int upstream, int drops)
        : upstream_(upstream), drops_(drops), listen_(::socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in a = loopback(0);
        socklen_t len = sizeof a;
        if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(listen_, 16) != 0 ||
            ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
            ::pipe(stop_.data()) != 0)
            throw std::runtime_error("subscribe_dropper: cannot listen");
        port_ = ntohs(a.sin_port);
        acceptor_ = std::thread([this] { accept_all(); });
    }
    subscribe_dropper(const subscribe_dropper&) = delete;
    subscribe_dropper& operator=(const subscribe_dropper&) = delete;
    ~subscribe_dropper() {
        (void)!::write(stop_[1], "!", 1);  // never read: every poll sees it from now on
        acceptor_.join();
        for (auto& t : pumps_) t.join();
        ::close(listen_);
        ::close(stop_[0]);
        ::close(stop_[1]);
    }
    int port() const noexcept { return port_; }
    int dropped() const noexcept { return dropped_.load(); }

  private:
    static sockaddr_in loopback(int port) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        return a;
    }

    static bool send_all(int fd, const char* p, long n) {
        while (n > 0) {
            const long w = ::write(fd, p, static_cast<std::size_t>(n));
            if (w <= 0) return false;
            p += w;
            n -= w;
        }
        return true;
    }

    void accept_all() {  // pumps_ is this thread's until the destructor joins it
        for (;;) {
            std::array<pollfd, 2> p{};
            p[0] = {listen_, POLLIN, 0};
            p[1] = {stop_[0], POLLIN, 0};
            if (::poll(p.data(), 2, -1) < 0) continue;
            if ((p[1].revents & POLLIN) != 0) return;
            const int client = ::accept(listen_, nullptr, nullptr);
            if (client >= 0) pumps_.emplace_back([this, client] { pump(client); });
        }
    }

    void pump(int client) {
        const int up = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = loopback(upstream_);
        if (up < 0 || ::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            if (up >= 0) ::close(up);
            ::close(client);
            return;
        }
        std::array<char, 65536> buf{};
        for (bool open = true; open;) {
            std::array<pollfd, 3> p{};
            p[0] = {client, POLLIN, 0};
            p[1] = {up, POLLIN, 0};
            p[2] = {stop_[0], POLLIN, 0};
            if (::poll(p.data(), 3, -1) < 0) continue;
            if ((p[2].revents & POLLIN) != 0) break;
            if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
                const long n = ::read(client, buf.data(), buf.size());
                const std::string_view got(buf.data(), n > 0 ? static_cast<std::size_t>(n) : 0);
                if (n <= 0) break;
                if (got.find("\r\nSUBSCRIBE\r\n") != std::string_view::npos) {
                    int left = drops_.load();
                    while (left > 0 && !drops_.compare_exchange_weak(left, left - 1)) {
                    }
                    if (left > 0) {
                        ++dropped_;
                        break;
                    }
                }
                open = send_all(up, buf.data(), n);
            }
            if (open && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
                const long n = ::read(up, buf.data(), buf.size());
                open = n > 0 && send_all(client, buf.data(), n);
            }
        }
        ::close(up);
        ::close(client);
    }

    int upstream_;
    std::atomic<int> drops_, dropped_{0};
    int listen_;
    int port_ = 0;
    std::array<int, 2> stop_{-1, -1};
    std::thread acceptor_;
    std::vector<std::thread> pumps_;
};

}  // namespace

TEST_CASE(
    "a take whose SUBSCRIBE reaches a node that dies at once subscribes again, within "
    "io_timeout, and then gets its job") {
    redis_server srv;
    subscribe_dropper proxy(srv.port(), 3);
    auto o = delayq_test::queue_options(proxy.port());
    sharded_delay_queue consumer(o, 4);
    auto taken = std::async(std::launch::async, [&] { return consumer.take(30s); });
    const auto settled = [&] {
        return srv.waiting_objects() == 1 || taken.wait_for(0s) == std::future_status::ready;
    };
    REQUIRE(eventually(settled, 20s));
    if (taken.wait_for(0s) == std::future_status::ready) {  // it gave up: say why
        try {
            taken.get();
            FAIL("take() returned before any job was put");
        } catch (const std::exception& e) {
            FAIL("take() threw: " << e.what());
        }
    }
    CHECK(proxy.dropped() == 3);  // subscribed at the fourth try
    sharded_delay_queue producer(opts(srv), 4);
    REQUIRE(producer.put_after("x", "p", 0ms));
    REQUIRE(taken.wait_for(10s) == std::future_status::ready);
    auto j = taken.get();
    REQUIRE(j);
    CHECK(j->id == "x");
    CHECK(consumer.ack(*j));
    CHECK(consumer.size() == 0);
}

TEST_CASE(
    "a take whose every SUBSCRIBE dies keeps trying for io_timeout, then throws "
    "delayq::redis::error") {
    redis_server srv;
    subscribe_dropper proxy(srv.port(), 1'000'000);
    auto o = delayq_test::queue_options(proxy.port());
    o.io_timeout = 500ms;
    delayq::redis::delay_queue consumer(o);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(consumer.take(30s), delayq::redis::error);
    CHECK(std::chrono::steady_clock::now() - start >= 500ms);  // not at the first failure
    CHECK(proxy.dropped() >= 2);
}
