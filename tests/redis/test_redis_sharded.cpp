// delayq::redis::sharded_delay_queue on one redis-server: one logical queue over N hash tags.
// (tests/redis-cluster runs it on a cluster, where the shards live on different masters.)

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <delayq/worker.hpp>
#include <future>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "flow.hpp"
#include "redis_proxy.hpp"
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

TEST_CASE(
    "a take whose SUBSCRIBE reaches a node that dies at once subscribes again, within "
    "io_timeout, and then gets its job") {
    redis_server srv;
    delayq_test::redis_proxy proxy(srv.port());
    proxy.drop_subscriptions(3);
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
    delayq_test::redis_proxy proxy(srv.port());
    proxy.drop_subscriptions(1'000'000);
    auto o = delayq_test::queue_options(proxy.port());
    o.io_timeout = 500ms;
    delayq::redis::delay_queue consumer(o);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(consumer.take(30s), delayq::redis::error);
    CHECK(std::chrono::steady_clock::now() - start >= 500ms);  // not at the first failure
    CHECK(proxy.dropped() >= 2);
}

TEST_CASE("sharded: dead() pages the dead letters of every shard in the order they died",
          "[lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    sharded_delay_queue q(o, 4);
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::set<std::size_t> shards;
    for (int i = 0; i < 12; ++i) {
        const std::string id = "d" + std::to_string(i);
        REQUIRE(q.put(id, "p" + id, past));
        shards.insert(delayq::redis::detail::fnv1a(id) % 4);
    }
    REQUIRE(shards.size() > 1);
    std::vector<std::string> died;  // in that order
    while (auto j = q.take(0ms)) {
        std::this_thread::sleep_for(2ms);  // a millisecond of its own
        REQUIRE(q.bury(*j, "why " + j->id));
        died.push_back(j->id);
    }
    REQUIRE(died.size() == 12);
    for (const std::size_t size : {1, 5, 12, 100}) {
        std::vector<std::string> seen;
        std::string after;
        for (auto page = q.dead(size); !page.empty(); page = q.dead(size, after)) {
            CHECK(page.size() <= size);
            for (const auto& d : page) {
                CHECK(d.state == delayq::job_state::dead);
                CHECK(d.payload == "p" + d.id);
                CHECK(d.last_error == "why " + d.id);
                seen.push_back(d.id);
            }
            after = page.back().id;
        }
        CHECK(seen == died);
    }
    const auto i = q.get("d7");  // on its own shard
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->last_error == "why d7");
    CHECK(q.dead(10, "nobody").empty());
}

TEST_CASE("sharded: dead letters of several shards that died in the same millisecond page by id",
          "[lookup]") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 3);
    // Written as a burial writes them: the dead-letter hash, the entry with the attempts, the time
    // and the last error, the place in the order ("died:id", died in 14 digits).
    const std::map<std::string, int> letters{{"a", 1000}, {"b", 1000}, {"c", 999}, {"d", 1000},
                                             {"e", 1001}, {"f", 1000}, {"g", 999}, {"h", 1001}};
    std::set<std::size_t> tied;  // the shards of those that died at 1000
    for (const auto& [id, ms] : letters) {
        const std::size_t shard = delayq::redis::detail::fnv1a(id) % 3;
        if (ms == 1000) tied.insert(shard);
        const std::string key = "dq:v3:{q#" + std::to_string(shard) + "}:dead";
        std::string died = std::to_string(ms);
        died.insert(0, 14 - died.size(), '0');
        srv.command({"HSET", key, id, "p"});
        srv.command({"HSET", key + ":info", id, "1:" + died + "/why " + id});
        srv.command({"ZADD", key + ":order", "0", died + ":" + id});
    }
    REQUIRE(tied.size() > 1);
    const std::vector<std::string> order{"c", "g", "a", "b", "d", "f", "e", "h"};
    std::vector<std::string> seen;
    std::string after;
    for (auto page = q.dead(3); !page.empty(); page = q.dead(3, after)) {
        for (const auto& d : page) {
            CHECK(d.time == std::chrono::system_clock::time_point(
                                std::chrono::milliseconds(letters.at(d.id))));
            CHECK(d.attempts == 1);
            CHECK(d.last_error == "why " + d.id);
            seen.push_back(d.id);
        }
        after = page.back().id;
    }
    CHECK(seen == order);
    const auto two = q.dead(2, "b");  // from within the tie
    REQUIRE(two.size() == 2);
    CHECK(two[0].id == "d");
    CHECK(two[1].id == "f");
}

TEST_CASE("sharded: jobs() pages the waiting jobs of every shard by due time, ties by id",
          "[lookup]") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 3);
    const auto base =
        std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::milliseconds>(
            (std::chrono::system_clock::now() + 1h).time_since_epoch()));
    const std::map<std::string, int> due{{"a", 1}, {"b", 1}, {"c", 0}, {"d", 1},
                                         {"e", 2}, {"f", 1}, {"g", 0}, {"h", 2}};
    std::set<std::size_t> tied;  // the shards of those due at base + 1 ms
    for (const auto& [id, ms] : due) {
        if (ms == 1) tied.insert(delayq::redis::detail::fnv1a(id) % 3);
        REQUIRE(q.put(id, "p" + id, base + std::chrono::milliseconds(ms)));
    }
    REQUIRE(tied.size() > 1);
    const std::vector<std::string> order{"c", "g", "a", "b", "d", "f", "e", "h"};
    std::vector<std::string> seen;
    std::string after;
    for (auto page = q.jobs(delayq::job_state::waiting, 3); !page.empty();
         page = q.jobs(delayq::job_state::waiting, 3, after)) {
        CHECK(page.size() <= 3);
        for (const auto& j : page) {
            CHECK(j.state == delayq::job_state::waiting);
            CHECK(j.time == base + std::chrono::milliseconds(due.at(j.id)));
            CHECK(j.payload == "p" + j.id);
            seen.push_back(j.id);
        }
        after = page.back().id;
    }
    CHECK(seen == order);
    const auto two = q.jobs(delayq::job_state::waiting, 2, "b");  // from within the tie
    REQUIRE(two.size() == 2);
    CHECK(two[0].id == "d");
    CHECK(two[1].id == "f");
    CHECK(q.jobs(delayq::job_state::leased, 10).empty());
    CHECK(q.jobs(delayq::job_state::leased, 10, "a").empty());
    CHECK(q.jobs(delayq::job_state::waiting, 10, "nobody").empty());
}

TEST_CASE("sharded: purge_dead purges every shard and sums, requeue_dead finds the id's shard",
          "[dead]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    sharded_delay_queue q(o, 4);
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::set<std::size_t> shards;
    for (int i = 0; i < 20; ++i) {
        const std::string id = "d" + std::to_string(i);
        REQUIRE(q.put(id, "p" + id, past));
        shards.insert(delayq::redis::detail::fnv1a(id) % 4);
    }
    REQUIRE(shards.size() == 4);
    while (auto j = q.take(0ms)) REQUIRE(q.bury(*j, "why " + j->id));
    REQUIRE(q.dead_size() == 20);
    REQUIRE(q.requeue_dead("d3", 0ms));
    CHECK_FALSE(q.requeue_dead("d3", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->id == "d3");
    CHECK(j->attempts == 1);
    CHECK(q.get("d3")->last_error == "why d3");
    CHECK(q.ack(*j));
    CHECK(q.purge_dead(1h) == 0);
    std::this_thread::sleep_for(20ms);  // each died at least a few ms before now
    CHECK(q.purge_dead(0ms) == 19);
    CHECK(q.dead_size() == 0);
    CHECK(q.dead(10).empty());
    for (std::size_t s = 0; s < 4; ++s)
        CHECK(srv.keys("dq:v3:{q#" + std::to_string(s) + "}:dead*").empty());
}

TEST_CASE(
    "sharded: pause sets every shard's paused key and resume removes them all, waking a take "
    "blocked on them",
    "[pause]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_block = 1h;  // so that only a resume's message can wake the take
    sharded_delay_queue q(o, 4), other(o, 4);
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::set<std::size_t> shards;
    for (int i = 0; i < 12; ++i) {
        const std::string id = "p" + std::to_string(i);
        REQUIRE(q.put(id, "", past));
        shards.insert(delayq::redis::detail::fnv1a(id) % 4);
    }
    REQUIRE(shards.size() == 4);
    other.pause();
    for (std::size_t s = 0; s < 4; ++s)
        CHECK(srv.command({"EXISTS", "dq:v3:{q#" + std::to_string(s) + "}:paused"})->integer == 1);
    CHECK(q.paused());
    CHECK(q.take_many(20, 0ms).empty());
    auto taken = std::async(std::launch::async, [&] { return q.take_many(20, 120s); });
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1; }));
    std::this_thread::sleep_for(300ms);
    CHECK(taken.wait_for(0s) == std::future_status::timeout);  // due jobs on every shard, paused
    other.resume();
    CHECK(srv.keys("dq:v3:{q#*}:paused").empty());
    CHECK_FALSE(q.paused());
    REQUIRE(taken.wait_for(60s) == std::future_status::ready);  // not the max_block of an hour
    auto jobs = taken.get();
    REQUIRE_FALSE(jobs.empty());
    std::set<std::string> ids;
    for (const auto& j : jobs) ids.insert(j.id);
    while (ids.size() < 12) {
        auto more = q.take_many(20, 5s);
        REQUIRE_FALSE(more.empty());
        for (const auto& j : more) ids.insert(j.id);
        jobs.insert(jobs.end(), more.begin(), more.end());
    }
    CHECK(ids.size() == 12);
    const auto acked = q.ack_many(jobs);
    CHECK(std::count(acked.begin(), acked.end(), true) == 12);
}

TEST_CASE(
    "sharded: shards that disagree (a pause or resume that failed part way): paused() is true, "
    "the shards not paused still serve, and resume() ends it",
    "[pause]") {
    redis_server srv;
    sharded_delay_queue q(opts(srv), 3);
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::array<std::string, 3> ids;  // one id of each shard
    for (int i = 0; ids[0].empty() || ids[1].empty() || ids[2].empty(); ++i) {
        const std::string id = "s" + std::to_string(i);
        ids[delayq::redis::detail::fnv1a(id) % 3] = id;
    }
    for (const auto& id : ids) REQUIRE(q.put(id, "", past));
    // Shard 1 alone paused, as a pause() that failed after its first shards leaves it (shard 0
    // first, so the middle one stands for any).
    REQUIRE(srv.command({"HSET", "dq:v3:{q#1}:paused", "since", "1"})->integer == 1);
    CHECK(q.paused());
    std::set<std::string> got;
    std::vector<delayq::redis::job> held;
    while (auto j = q.take(0ms)) {
        got.insert(j->id);
        held.push_back(*j);
    }
    CHECK(got == std::set<std::string>{ids[0], ids[2]});
    q.pause();  // completes it, as any pause: every shard paused
    for (std::size_t s = 0; s < 3; ++s)
        CHECK(srv.command({"EXISTS", "dq:v3:{q#" + std::to_string(s) + "}:paused"})->integer == 1);
    CHECK(srv.text({"HGET", "dq:v3:{q#1}:paused", "since"}) == "1");  // the first pause's
    for (const auto& j : held) CHECK(q.ack(j));                       // every call but a take works
    q.resume();
    CHECK_FALSE(q.paused());
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == ids[1]);
    CHECK(q.ack(*j));
    CHECK(q.size() == 0);
}

TEST_CASE(
    "sharded: a pause that the server does not answer fails within one io_timeout for all its "
    "shards, and a second pause completes it",
    "[pause]") {
    redis_server srv;
    auto o = opts(srv);
    o.io_timeout = 2s;
    sharded_delay_queue q(o, 8);
    CHECK_FALSE(q.paused());  // the script loaded, the layout checked, on every shard
    // The server holds every script (CLIENT PAUSE WRITE): the first shard's call waits there.
    REQUIRE(srv.command({"CLIENT", "PAUSE", "30000", "WRITE"})->type == REDIS_REPLY_STATUS);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(q.pause(), delayq::redis::connection_error);
    // One io_timeout (2 s) for the eight shards, not one each (16 s).
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    srv.command({"CLIENT", "UNPAUSE"});
    // The shards after the first were never sent theirs; the first's may have run or not.
    const std::size_t left = srv.keys("dq:v3:{q#*}:paused").size();
    CHECK(left <= 1);
    CHECK(q.paused() == (left == 1));
    q.pause();
    CHECK(srv.keys("dq:v3:{q#*}:paused").size() == 8);
    q.resume();
    CHECK_FALSE(q.paused());
    CHECK(srv.keys("dq:v3:{q#*}:paused").empty());
}

TEST_CASE("sharded: a limit smaller than the shard count is refused, one as large is not",
          "[limits]") {
    auto o = delayq_test::queue_options(6379);
    o.limits.max_leased = 3;
    CHECK_THROWS_AS(sharded_delay_queue(o, 4), std::invalid_argument);
    CHECK(sharded_delay_queue(o, 3).shards() == 3);  // nothing connects yet
    o.limits.max_leased = 0;
    o.limits.rate = 3;
    o.limits.period = 1s;
    CHECK_THROWS_AS(sharded_delay_queue(o, 4), std::invalid_argument);
    CHECK(sharded_delay_queue(o, 3).shards() == 3);
    try {
        sharded_delay_queue q(o, 8);
        FAIL("no exception");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("options.limits.rate") != std::string::npos);
    }
}

TEST_CASE("sharded: each shard leases within its share of max_leased, and the shares add up to it",
          "[limits]") {
    redis_server srv;
    auto o = opts(srv);
    o.limits.max_leased = 6;  // shares of 4 shards: 2, 2, 1, 1
    sharded_delay_queue a(o, 4), b(o, 4);
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::array<int, 4> per_shard{};
    for (int i = 0; i < 40; ++i) {
        const std::string id = "m" + std::to_string(i);
        REQUIRE(a.put(id, "", past));
        ++per_shard[delayq::redis::detail::fnv1a(id) % 4];
    }
    for (int n : per_shard) REQUIRE(n >= 2);
    std::vector<delayq::redis::job> held;
    for (bool more = true; more;) {
        more = false;
        for (auto* q : {&a, &b}) {
            auto got = q->take_many(10, 0ms);
            more = more || !got.empty();
            held.insert(held.end(), got.begin(), got.end());
        }
    }
    CHECK(held.size() == 6);  // every shard full: all of the limit
    const std::array<long long, 4> share{2, 2, 1, 1};
    std::array<long long, 4> leased{};
    for (const auto& j : held) ++leased[delayq::redis::detail::fnv1a(j.id) % 4];
    CHECK(leased == share);
    CHECK(a.stats().leased == 6);
    // An ack frees a place of its job's shard: the next take leases from that shard.
    const auto freed = delayq::redis::detail::fnv1a(held.front().id) % 4;
    CHECK(b.ack(held.front()));
    auto next = a.take(5s);
    REQUIRE(next);
    CHECK(delayq::redis::detail::fnv1a(next->id) % 4 == freed);
    CHECK_FALSE(b.take(0ms));
    held.front() = *next;
    for (const auto& j : held) CHECK(a.ack(j));
}

TEST_CASE(
    "sharded: workers on two objects with max_leased 5 over 4 shards never hold more than 5 "
    "leases",
    "[limits]") {
    redis_server srv;
    auto o = opts(srv);
    o.limits.max_leased = 5;
    sharded_delay_queue a(o, 4), b(o, 4);
    constexpr int jobs = 60;
    for (int i = 0; i < jobs; ++i) REQUIRE(a.put_after("w" + std::to_string(i), "", 0ms));
    std::atomic<int> running{0}, most{0}, ran{0};
    const auto handler = [&](const delayq::job&) {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(5ms);
        --running;
        ++ran;
    };
    {
        delayq::worker wa(a, handler, {.threads = 4});
        delayq::worker wb(b, handler, {.threads = 4});
        CHECK(eventually([&] { return ran >= jobs; }, 60s));
    }
    CHECK(most <= 5);
    CHECK(ran == jobs);
    CHECK(a.size() == 0);
}

TEST_CASE("sharded: stats sums the shards, and the lag is the largest", "[stats]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    sharded_delay_queue q(o, 4);
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::set<std::size_t> shards;
    for (int i = 0; i < 20; ++i) {
        const std::string id = "s" + std::to_string(i);
        REQUIRE(q.put_after(id, "", i < 12 ? 0ms : 1h));
        shards.insert(delayq::redis::detail::fnv1a(id) % 4);
    }
    REQUIRE(shards.size() == 4);
    REQUIRE(q.put("oldest", "", past));
    // Due for decades in its shard, a few ms in the others: the largest, not a sum or a mean.
    const auto first = q.stats();
    CHECK(first.lag > std::chrono::hours(24 * 365));
    CHECK(first.lag < std::chrono::hours(24 * 365 * 200));
    CHECK(first.waiting == 21);
    CHECK(first.due_now == 13);
    auto leased = q.take_many(3, 5s);  // from one shard, earliest first: "oldest" among them
    REQUIRE_FALSE(leased.empty());
    auto more = q.take(5s);
    REQUIRE(more);
    CHECK(q.bury(*more));
    const auto s = q.stats();
    CHECK(s.leased == leased.size());
    CHECK(s.dead == 1);
    CHECK(s.waiting == 21 - leased.size() - 1);
    CHECK(s.due_now == 13 - leased.size() - 1);
    CHECK(s.waiting + s.leased == q.size());
    CHECK(s.dead == q.dead_size());
    CHECK(s.lag > 0ms);
    for (const auto& j : leased) CHECK(q.ack(j));
}

TEST_CASE("sharded: a series' next run stays on its shard, made once by racing objects",
          "[repeat]") {
    redis_server srv;
    sharded_delay_queue a(opts(srv), 8), b(opts(srv), 8);
    std::vector<std::string> ids;
    for (int i = 0; i < 16; ++i) ids.push_back("series-" + std::to_string(i));
    for (const auto& id : ids) REQUIRE(a.put_every(id, "p", 100ms));
    for (const auto& id : ids) CHECK_FALSE(b.put_cron(id, "p", "* * * * *"));
    const auto shard_key = [](const std::string& id) {
        return "dq:v3:{q#" + std::to_string(delayq::redis::detail::fnv1a(id) % 8) + "}:events";
    };
    // Two rounds of runs, each acked by both objects at once: one ack holds, one next run.
    for (int round = 0; round < 2; ++round) {
        std::vector<delayq::redis::job> runs;
        while (runs.size() < ids.size()) {
            auto j = a.take(10s);
            REQUIRE(j);
            runs.push_back(*j);
        }
        for (const auto& run : runs) {
            auto by_b = std::async(std::launch::async, [&b, &run] { return b.ack(run); });
            const bool by_a = a.ack(run);
            CHECK(by_a != by_b.get());
        }
        CHECK(a.size() == ids.size());
        for (const auto& run : runs) {
            INFO(run.id);
            const auto info = b.get(run.id);
            REQUIRE(info);
            CHECK(info->state == delayq::job_state::waiting);
            CHECK(info->time > run.deadline);
            CHECK(srv.text({"ZSCORE", shard_key(run.id), run.id}) != "");
        }
    }
    for (const auto& id : ids) CHECK(b.cancel(id));
    CHECK(a.size() == 0);
}
