// What the Redis queue's Lua scripts keep on the server, at its edges: fencing tokens of 10^14 and
// beyond, the one spelling of "no deadline", a put retried after its job was acked, and the keys
// of an older layout, which are refused and left untouched.
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <string>
#include <string_view>

#include "catch.hpp"
#include "expect_error.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq::test::contains;
using delayq_test::opts;
using delayq_test::redis_server;

TEST_CASE("fencing tokens of 10^14 and beyond still match: ack, nack and redelivery work",
          "[scripts]") {
    // Issue 10, item 12. Lua's `..` formats numbers with %.14g: the token 10^14 went into `meta` as
    // "1e+14", so no ack or nack matched it again.
    redis_server srv;
    auto o = opts(srv);
    o.lease = 2s;  // the acks and nacks below come within it, on a loaded machine too
    delay_queue q(o);
    REQUIRE(q.put_after("warm", "", 0ms));
    auto w = q.take(1s);  // creates the keys and loads the scripts
    REQUIRE(w);
    REQUIRE(q.ack(*w));
    const auto counters = srv.keys("dq:*{q}*:seq");  // the fencing-token counter
    REQUIRE(counters.size() == 1);
    srv.command({"SET", counters.front(), "99999999999998"});
    for (int i = 0; i < 2; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "", 0ms));
    auto a = q.take(1s);
    auto b = q.take(1s);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->token >= 99'999'999'999'999ULL);
    CHECK(b->token >= 100'000'000'000'000ULL);
    CHECK(q.ack(*a));
    CHECK(q.nack(*b, 0ms));
    auto b2 = q.take(1s);
    REQUIRE(b2);
    CHECK(b2->id == b->id);
    CHECK(b2->attempts == 2);
    CHECK(q.ack(*b2));
    // A lease that ends: redelivered with the attempt counted, its token refused afterwards.
    REQUIRE(q.put_after("j2", "", 0ms));
    auto c = q.take(1s);
    REQUIRE(c);
    auto c2 = q.take(10s);
    REQUIRE(c2);
    CHECK(c2->id == c->id);
    CHECK(c2->attempts == 2);
    CHECK_FALSE(q.ack(*c));
    CHECK(q.ack(*c2));
    CHECK(q.size() == 0);
}

TEST_CASE("'no deadline' is spelled once: the scripts take it from the C++ constant", "[scripts]") {
    // Issue 28. 99 999 999 999 999 ms was written out in C++ and twice in the Lua text; now the
    // scripts' prelude defines max_ms in the digits of delayq::redis::detail::max_ms, and no script
    // spells it, or 10^14, any other way.
    using delayq::redis::detail::max_ms;
    const std::string prelude = "local max_ms = " + std::to_string(max_ms) + "\n";
    std::size_t defined = 0;
    for (std::string_view text : delayq::redis::detail::scripts) {
        std::string rest(text);
        if (rest.starts_with(prelude)) {
            rest.erase(0, prelude.size());
            ++defined;
        }
        INFO(rest);
        CHECK(rest.find("local max_ms") == std::string::npos);
        for (const char* other :
             {"9999", "1e14", "1e+14", "1E14", "1E+14", "10^14", "100000000000000"})
            CHECK(rest.find(other) == std::string::npos);
    }
    CHECK(defined == 4);  // put, consume, cancel and reschedule; size reads no time

    // The scripts clamp with it: a far delay (put, reschedule) and a far lease end (take); and
    // EVALSHA finds every script that the object loaded (no EVAL fallback).
    redis_server srv;
    auto o = opts(srv);
    o.lease = std::chrono::milliseconds(max_ms);
    delay_queue q(o);
    REQUIRE(q.put_after("later", "", std::chrono::milliseconds::max()));
    REQUIRE(q.put_after("moved", "", 1h));
    REQUIRE(q.reschedule("moved", std::chrono::milliseconds::max()));
    const auto due = srv.keys("dq:*{q}*:events");
    REQUIRE(due.size() == 1);
    CHECK(srv.text({"ZSCORE", due.front(), "later"}) == std::to_string(max_ms));
    CHECK(srv.text({"ZSCORE", due.front(), "moved"}) == std::to_string(max_ms));
    REQUIRE(q.put_after("now", "", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->id == "now");
    const auto leased = srv.keys("dq:*{q}*:events");
    REQUIRE(leased.size() == 1);
    CHECK(srv.text({"ZSCORE", leased.front(), "now"}) == std::to_string(max_ms));
    CHECK(j->lease_deadline >
          std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 100));
    CHECK(q.ack(*j));
    CHECK(q.size() == 2);
    CHECK(srv.info_field("commandstats", "cmdstat_eval:calls=").empty());
    CHECK_FALSE(srv.info_field("commandstats", "cmdstat_evalsha:calls=").empty());
}

TEST_CASE(
    "a put retried after its job was acked queues the job again: put is idempotent only while "
    "queued") {
    // Issue 10, item 14: a deliberate behaviour, stated precisely in docs/redis.md and
    // docs/misuse.md. The docs used to promise "never a duplicate" for any retry.
    redis_server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("order-1", "v1", 0ms));
    CHECK_FALSE(q.put_after("order-1", "retry while waiting", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK_FALSE(q.put_after("order-1", "retry while leased", 0ms));
    REQUIRE(q.ack(*j));
    CHECK(q.put_after("order-1", "retry after the ack", 0ms));  // a second delivery follows
    auto again = q.take(1s);
    REQUIRE(again);
    CHECK(again->payload == "retry after the ack");
    CHECK(q.ack(*again));
}

TEST_CASE("a queue written in key layout v2 is refused with layout_error, its jobs untouched",
          "[layout]") {
    redis_server srv;
    // What delayq with layout v2 left: a waiting job, its payload in a bucket, a token counter.
    REQUIRE(srv.command({"ZADD", "dq:v2:{q}:due", "1000", "old"})->integer == 1);
    REQUIRE(srv.command({"HSET", "dq:v2:{q}:data:7", "pold", "payload"})->integer == 1);
    REQUIRE(srv.command({"SET", "dq:v2:{q}:seq", "41"})->type == REDIS_REPLY_STATUS);
    delay_queue q(opts(srv));
    try {
        q.put_after("new", "", 0ms);
        FAIL("no layout_error");
    } catch (const delayq::redis::layout_error& e) {
        CHECK(e.version() == "v2");
        CHECK(contains(e.what(), "layout v2"));
        CHECK(contains(e.what(), "{q}"));
    }
    CHECK_THROWS_AS(q.take(0ms), delayq::redis::layout_error);
    CHECK_THROWS_AS(q.size(), delayq::redis::layout_error);
    // Nothing was written in either layout.
    CHECK(srv.text({"ZSCORE", "dq:v2:{q}:due", "old"}) == "1000");
    CHECK(srv.text({"HGET", "dq:v2:{q}:data:7", "pold"}) == "payload");
    CHECK(srv.keys("dq:v3:*").empty());
    // Another queue on the same server is not concerned.
    auto o = opts(srv);
    o.name = "other";
    delay_queue fresh(o);
    CHECK(fresh.put_after("new", "", 0ms));
}
