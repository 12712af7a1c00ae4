// What the Redis queue's Lua scripts keep on the server, at its edges: fencing tokens of 10^14 and
// beyond, the one spelling of "no deadline", a put retried after its job was acked, the keys
// of an older layout, which are refused and left untouched, and where a job's last error and its
// dead letter are kept (beside the dead-letter hash that every version reads), and how dead
// letters are put back and removed: in bounded batches, by a purge or by keep_dead; the `leases`
// set that every script keeps (and a queue written before it existed), and the `grants` and the
// waits of the limits; and the series of repeatable jobs: the scripts' Lua next run against the
// C++ one that defines it, where a run's schedule is kept, and one next run per run however the
// acks race or merge.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "expect_error.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq::test::contains;
using delayq_test::eventually;
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
    // put, consume, cancel, reschedule, get, requeue dead, purge dead, pause, stats and the jobs
    // page; size and the dead page read no time
    CHECK(defined == 10);

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

namespace {

// A deadline already due by any server clock on this machine.
const auto long_ago = std::chrono::system_clock::time_point(std::chrono::hours(24));

// The "m" entry of job `id` in queue `q`'s buckets (whichever bucket holds it), or "".
std::string meta_of(const redis_server& srv, const std::string& id) {
    for (const auto& bucket : srv.keys("dq:v3:{q}:data:*")) {
        const std::string m = srv.text({"HGET", bucket, "m" + id});
        if (!m.empty()) return m;
    }
    return "";
}

// `n` dead letters of queue `q` as a burial writes them, "old1" .. "old<n>", died at the epoch's
// 1001st .. ms: far older than anything kept. One script, not n round trips.
void write_old_dead_letters(const redis_server& srv, int n) {
    const auto r = srv.command({"EVAL",
                                "for i = 1, tonumber(ARGV[1]) do\n"
                                "  local id, died = 'old' .. i, string.format('%014d', 1000 + i)\n"
                                "  redis.call('HSET', KEYS[1], id, 'p')\n"
                                "  redis.call('HSET', KEYS[2], id, '1:' .. died .. '/ancient')\n"
                                "  redis.call('ZADD', KEYS[3], '0', died .. ':' .. id)\n"
                                "end",
                                "3", "dq:v3:{q}:dead", "dq:v3:{q}:dead:info",
                                "dq:v3:{q}:dead:order", std::to_string(n)});
    REQUIRE(r->type != REDIS_REPLY_ERROR);
}

// How many dead letters queue `q`'s three dead-letter keys hold: the hash, the info, the order.
std::vector<long long> dead_keys(const redis_server& srv) {
    return {srv.command({"HLEN", "dq:v3:{q}:dead"})->integer,
            srv.command({"HLEN", "dq:v3:{q}:dead:info"})->integer,
            srv.command({"ZCARD", "dq:v3:{q}:dead:order"})->integer};
}

}  // namespace

TEST_CASE("a job's last error rides in its meta entry: kept by a take and an extend, gone with it",
          "[scripts][lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 10s;
    delay_queue q(o);
    const std::string reason("503\0from\r\nupstream/x", 20);  // NUL, line breaks, a slash
    REQUIRE(q.put("j", "p", long_ago));
    auto j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 0ms, reason));
    CHECK(meta_of(srv, "j") == "1:0:0/" + reason);
    auto i = q.get("j");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->last_error == reason);

    j = q.take(5s);  // leased again: the last error stays
    REQUIRE(j);
    i = q.get("j");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->attempts == 2);
    CHECK(i->time == j->lease_deadline);
    CHECK(i->last_error == reason);
    REQUIRE(q.extend(*j, 20s));
    i = q.get("j");
    REQUIRE(i);
    CHECK(i->time > j->lease_deadline);
    CHECK(i->last_error == reason);

    REQUIRE(q.ack(*j));  // gone, and so is its last error: a new put starts without one
    CHECK_FALSE(q.get("j"));
    CHECK(meta_of(srv, "j").empty());
    REQUIRE(q.put("j", "again", long_ago));
    i = q.get("j");
    REQUIRE(i);
    CHECK(i->attempts == 0);
    CHECK(i->payload == "again");
    CHECK(i->last_error.empty());

    // An empty reason is a last error too: it replaces the one before.
    j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 1h, "first"));
    REQUIRE(q.reschedule("j", 0ms));
    j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 1h, ""));
    i = q.get("j");
    REQUIRE(i);
    CHECK(i->attempts == 2);
    CHECK(i->last_error.empty());
}

TEST_CASE("a reason with NUL bytes goes to the dead letters intact, and the dead hash is as before",
          "[scripts][lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    const std::string payload("a\0b", 3);
    const std::string reason("\0no\0such\0order\0", 15);
    REQUIRE(q.put("n", payload, long_ago));
    REQUIRE(q.put("b", payload, long_ago));
    auto j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 0ms, reason));  // its last attempt: dead
    auto k = q.take(1s);
    REQUIRE(k);
    REQUIRE(q.bury(*k, reason + "!"));
    for (const auto& [id, why] : {std::pair{j->id, reason}, std::pair{k->id, reason + "!"}}) {
        INFO(id);
        // What every version reads: id -> payload.
        CHECK(srv.text({"HGET", "dq:v3:{q}:dead", id}) == payload);
        const auto i = q.get(id);
        REQUIRE(i);
        CHECK(i->state == delayq::job_state::dead);
        CHECK(i->attempts == 1);
        CHECK(i->payload == payload);
        CHECK(i->last_error == why);
    }
    const auto page = q.dead(10);
    REQUIRE(page.size() == 2);
    CHECK(page[0].id == j->id);
    CHECK(page[0].last_error == reason);
    CHECK(page[1].id == k->id);
    CHECK(page[1].last_error == reason + "!");
    CHECK(page[0].time <= page[1].time);
}

TEST_CASE("a dead letter written by an earlier version is seen by get(), not paged by dead()",
          "[scripts][lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("warm", "", long_ago));  // the keys' layout checked, the scripts loaded
    REQUIRE(srv.command({"HSET", "dq:v3:{q}:dead", "old", std::string("p\0q", 3)})->integer == 1);
    auto i = q.get("old");
    REQUIRE(i);
    CHECK(i->id == "old");
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->time == std::chrono::system_clock::time_point{});  // unknown
    CHECK(i->attempts == 0);
    CHECK(i->payload == std::string("p\0q", 3));
    CHECK(i->last_error.empty());
    CHECK(q.dead_size() == 1);
    CHECK(q.dead(10).empty());
    CHECK(q.dead(10, "old").empty());  // it has no place in the order

    // Beside it, a dead letter of this version pages as usual.
    auto j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, "why"));
    const auto page = q.dead(10);
    REQUIRE(page.size() == 1);
    CHECK(page[0].id == "warm");
    CHECK(q.dead_size() == 2);
    // Put again and dead again, the old one becomes a dead letter of this version.
    REQUIRE(q.put("old", "new", long_ago));
    i = q.get("old");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    j = q.take(1s);
    REQUIRE(j);
    std::this_thread::sleep_for(2ms);  // dies after "warm", in a millisecond of its own
    REQUIRE(q.bury(*j));
    const auto both = q.dead(10);
    REQUIRE(both.size() == 2);
    CHECK(both[1].id == "old");
    CHECK(both[1].payload == "new");
    CHECK(both[1].attempts == 1);
}

TEST_CASE("a dead letter has one place in the order: dying again moves it, by hand it is dropped",
          "[scripts][lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    for (const char* why : {"first", "second"}) {
        REQUIRE(q.put("x", "p", long_ago));
        auto j = q.take(1s);
        REQUIRE(j);
        std::this_thread::sleep_for(2ms);  // a millisecond of its own
        REQUIRE(q.bury(*j, why));
    }
    REQUIRE(q.put("y", "p", long_ago));
    auto y = q.take(1s);
    REQUIRE(y);
    REQUIRE(q.bury(*y));
    CHECK(srv.command({"ZCARD", "dq:v3:{q}:dead:order"})->integer == 2);
    auto page = q.dead(10);
    REQUIRE(page.size() == 2);
    CHECK(page[0].id == "x");
    CHECK(page[0].last_error == "second");
    CHECK(page[1].id == "y");
    CHECK(page[1].last_error.empty());

    // Removed from the dead-letter hash by hand: the next page drops what stood beside it.
    REQUIRE(srv.command({"HDEL", "dq:v3:{q}:dead", "x"})->integer == 1);
    CHECK_FALSE(q.get("x"));
    CHECK(q.dead(10, "x").empty());
    page = q.dead(10);
    REQUIRE(page.size() == 1);
    CHECK(page[0].id == "y");
    CHECK(srv.command({"ZCARD", "dq:v3:{q}:dead:order"})->integer == 1);
    CHECK(srv.command({"HEXISTS", "dq:v3:{q}:dead:info", "x"})->integer == 0);
}

TEST_CASE("jobs that die in the same millisecond page by id", "[scripts][lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    o.lease = 200ms;
    delay_queue q(o);
    std::vector<std::string> ids;
    for (int i = 5; i-- > 0;) ids.push_back("t" + std::to_string(i));  // put in reverse
    for (const auto& id : ids) REQUIRE(q.put(id, "p", long_ago));
    REQUIRE(q.take_many(10, 1s).size() == ids.size());  // and never settled
    std::this_thread::sleep_for(300ms);
    CHECK_FALSE(q.take(0ms));  // one call finds every lease ended: they die in one script
    REQUIRE(q.dead_size() == ids.size());
    std::vector<std::string> seen;
    std::string after;
    const auto died = q.dead(1).at(0).time;
    while (true) {
        const auto page = q.dead(2, after);
        if (page.empty()) break;
        for (const auto& d : page) {
            CHECK(d.time == died);
            CHECK(d.last_error == std::string(delayq::lease_ended_reason));
            seen.push_back(d.id);
        }
        after = page.back().id;
    }
    CHECK(seen == std::vector<std::string>{"t0", "t1", "t2", "t3", "t4"});
}

TEST_CASE("a lease that ends keeps the job's last error: it is due again at its lease end",
          "[scripts][lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 200ms;
    delay_queue q(o);
    REQUIRE(q.put("j", "p", long_ago));
    auto j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 0ms, "timeout"));
    j = q.take(5s);
    REQUIRE(j);  // and never settled
    std::this_thread::sleep_for(300ms);
    auto i = q.get("j");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->time == j->lease_deadline);
    CHECK(i->attempts == 2);
    CHECK(i->last_error == "timeout");
    auto again = q.take(1s);
    REQUIRE(again);
    CHECK(again->attempts == 3);
    i = q.get("j");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->last_error == "timeout");
}

TEST_CASE("requeue_dead: the job waits again with its last error in its meta entry, attempts 0",
          "[scripts][dead]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("x", "px", long_ago));
    auto j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, "why"));
    CHECK(dead_keys(srv) == std::vector<long long>{1, 1, 1});
    REQUIRE(q.requeue_dead("x", 0ms));
    CHECK(dead_keys(srv) == std::vector<long long>{0, 0, 0});  // a dead letter no more
    CHECK(meta_of(srv, "x") == "0:0:0/why");
    j = q.take(1s);
    REQUIRE(j);
    CHECK(j->payload == "px");
    CHECK(j->attempts == 1);
    CHECK(meta_of(srv, "x").ends_with("/why"));
    CHECK(q.ack(*j));

    // A dead letter of an earlier version (in `dead` alone): back with no last error, no meta.
    REQUIRE(srv.command({"HSET", "dq:v3:{q}:dead", "legacy", "pl"})->integer == 1);
    REQUIRE(q.requeue_dead("legacy", 0ms));
    CHECK(meta_of(srv, "legacy").empty());
    CHECK(dead_keys(srv) == std::vector<long long>{0, 0, 0});
    const auto i = q.get("legacy");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->payload == "pl");
    CHECK(i->attempts == 0);
    CHECK(i->last_error.empty());
    CHECK_THROWS_AS(q.requeue_dead("", 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.requeue_dead("x", -1ms), std::invalid_argument);
}

TEST_CASE("purge_dead goes through 2500 dead letters in calls of at most 1000", "[scripts][dead]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("fresh", "", long_ago));
    auto j = q.take(1s);  // the keys' layout checked, the scripts loaded
    REQUIRE(j);
    REQUIRE(q.bury(*j));
    write_old_dead_letters(srv, 2500);
    // One removed from the dead-letter hash by hand (its place and entry stay): not counted.
    REQUIRE(srv.command({"HDEL", "dq:v3:{q}:dead", "old7"})->integer == 1);
    // One of an earlier version, in `dead` alone: no purge sees it.
    REQUIRE(srv.command({"HSET", "dq:v3:{q}:dead", "legacy", ""})->integer == 1);
    CHECK(q.dead_size() == 2501);
    CHECK(q.purge_dead(1h) == 2499);
    CHECK(dead_keys(srv) == std::vector<long long>{2, 1, 1});  // "fresh" and "legacy"
    // 2501 places: 1000, 1000 and 501, each removed by one ZREMRANGEBYLEX of its own call.
    CHECK(srv.info_field("commandstats", "cmdstat_zremrangebylex:calls=") == "3");
    CHECK(q.purge_dead(1h) == 0);
    const auto page = q.dead(10);
    REQUIRE(page.size() == 1);
    CHECK(page[0].id == "fresh");
    CHECK(q.get("legacy"));
    CHECK_FALSE(q.get("old1"));
    CHECK_THROWS_AS(q.purge_dead(-1ms), std::invalid_argument);
}

TEST_CASE("keep_dead: each death removes at most 10 dead letters kept too long, oldest first",
          "[scripts][dead]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 2;
    o.keep_dead = 1h;
    delay_queue q(o);
    REQUIRE(q.put("warm", "", long_ago));
    REQUIRE(q.cancel("warm"));
    write_old_dead_letters(srv, 500);

    // A burial.
    REQUIRE(q.put("b", "", long_ago));
    auto j = q.take(1s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, "buried"));
    CHECK(dead_keys(srv) == std::vector<long long>{491, 491, 491});
    CHECK_FALSE(q.get("old10"));
    CHECK(q.get("old11"));  // the oldest went first

    // A nack of the last attempt.
    REQUIRE(q.put("n", "", long_ago));
    for (int k = 0; k < 2; ++k) {
        j = q.take(5s);
        REQUIRE(j);
        REQUIRE(q.nack(*j, 0ms, "nacked"));
    }
    CHECK(dead_keys(srv) == std::vector<long long>{482, 482, 482});

    // A take that finds the last lease ended.
    auto short_lease = o;
    short_lease.lease = 100ms;
    short_lease.max_attempts = 1;
    delay_queue r(short_lease);
    REQUIRE(r.put("r", "", long_ago));
    REQUIRE(r.take(1s));
    std::this_thread::sleep_for(200ms);
    CHECK_FALSE(r.take(0ms));
    CHECK(dead_keys(srv) == std::vector<long long>{473, 473, 473});
    const auto reclaimed = q.get("r");
    REQUIRE(reclaimed);
    CHECK(reclaimed->state == delayq::job_state::dead);

    // A stream of deaths: after 47 more, none of the old ones is left, and nothing new goes.
    for (int k = 0; k < 100; ++k) {
        REQUIRE(q.put("s" + std::to_string(k), "", long_ago));
        j = q.take(1s);
        REQUIRE(j);
        REQUIRE(q.bury(*j));
        const auto held = q.dead_size();
        CHECK(held == (k < 47 ? 473 - 9 * static_cast<std::size_t>(k + 1)
                              : 4 + static_cast<std::size_t>(k)));
    }
    CHECK(dead_keys(srv) == std::vector<long long>{103, 103, 103});
    CHECK(q.get("b"));
    CHECK(q.dead(1).at(0).id == "b");
}

TEST_CASE(
    "pause is one hash per shard, dq:v3:{q}:paused: set by the first pause, gone after a resume, "
    "and a queue without it is not paused",
    "[scripts][pause]") {
    redis_server srv;
    delay_queue q(opts(srv)), other(opts(srv));
    REQUIRE(q.put("j", "p", long_ago));
    CHECK_FALSE(q.paused());
    CHECK(srv.keys("dq:v3:{q}:paused").empty());  // never written by a look
    const long long before = srv.time_ms();
    q.pause();
    CHECK(srv.text({"TYPE", "dq:v3:{q}:paused"}) == "hash");
    const std::string since = srv.text({"HGET", "dq:v3:{q}:paused", "since"});
    REQUIRE_FALSE(since.empty());
    CHECK(std::stoll(since) >= before);  // the server's ms when it was paused
    std::this_thread::sleep_for(5ms);
    other.pause();  // idempotent: the first pause's time stays
    CHECK(srv.text({"HGET", "dq:v3:{q}:paused", "since"}) == since);
    CHECK(srv.command({"HLEN", "dq:v3:{q}:paused"})->integer == 1);
    CHECK(other.paused());
    CHECK_FALSE(other.take(0ms));
    other.resume();
    CHECK(srv.keys("dq:v3:{q}:paused").empty());
    CHECK_FALSE(q.paused());
    // A queue of the version before this key existed (no key: what a resume leaves) takes.
    auto j = q.take(0ms);
    REQUIRE(j);
    CHECK(j->attempts == 1);
    CHECK(q.ack(*j));
    // The key alone says paused, whoever wrote it.
    REQUIRE(srv.command({"HSET", "dq:v3:{q}:paused", "since", "1"})->integer == 1);
    CHECK(q.paused());
    REQUIRE(q.put("k", "p", long_ago));
    CHECK_FALSE(q.take(0ms));
    srv.command({"DEL", "dq:v3:{q}:paused"});
    CHECK_FALSE(q.paused());
    CHECK(q.take(0ms));
}

TEST_CASE(
    "while paused, a lease that ends is not buried: the take after the resume buries it, as "
    "without a pause",
    "[scripts][pause]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 100ms;
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("j", "p", long_ago));
    auto j = q.take(0ms);
    REQUIRE(j);
    q.pause();
    std::this_thread::sleep_for(200ms);  // its lease, its last attempt, ended
    CHECK_FALSE(q.take(0ms));
    CHECK(q.dead_size() == 0);
    CHECK(q.size() == 1);
    CHECK_FALSE(q.ack(*j));  // the lease ended all the same
    q.resume();
    CHECK_FALSE(q.take(0ms));  // buried instead of handed out
    CHECK(q.dead_size() == 1);
    const auto d = q.get("j");
    REQUIRE(d);
    CHECK(d->state == delayq::job_state::dead);
    CHECK(d->last_error == std::string(delayq::lease_ended_reason));
}

namespace {

// A leased job's lease end in server ms, as `leases` and `events` hold it.
std::string lease_ms_of(const delayq::redis::job& j) {
    return std::to_string(
        std::chrono::duration_cast<std::chrono::milliseconds>(j.lease_deadline.time_since_epoch())
            .count());
}

// How many script calls the server ran so far (INFO commandstats).
long long script_calls(const redis_server& srv) {
    const auto v = srv.info_field("commandstats", "cmdstat_evalsha:calls=");
    return v.empty() ? 0 : std::stoll(v);
}

const std::string leases_key = "dq:v3:{q}:leases";
const std::string events_key = "dq:v3:{q}:events";
const std::string grants_key = "dq:v3:{q}:grants";

}  // namespace

TEST_CASE("leases: a take adds each lease, an extend moves it, and every end of a lease removes it",
          "[scripts][leases]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 5;
    delay_queue q(o);
    for (const char* id : {"a", "b", "c", "d", "e"}) REQUIRE(q.put(id, "p", long_ago));
    auto jobs = q.take_many(5, 1s);
    REQUIRE(jobs.size() == 5);
    std::map<std::string, delayq::redis::job> by_id;
    for (const auto& j : jobs) {
        CHECK(srv.text({"ZSCORE", leases_key, j.id}) == lease_ms_of(j));
        CHECK(srv.text({"ZSCORE", events_key, j.id}) == lease_ms_of(j));
        by_id[j.id] = j;
    }
    CHECK(srv.command({"ZCARD", leases_key})->integer == 5);

    REQUIRE(q.extend(by_id["a"], 1h));
    const auto a = q.get("a");
    REQUIRE(a);
    const std::string a_end = std::to_string(
        std::chrono::duration_cast<std::chrono::milliseconds>(a->time.time_since_epoch()).count());
    CHECK(srv.text({"ZSCORE", leases_key, "a"}) == a_end);
    CHECK(srv.text({"ZSCORE", events_key, "a"}) == a_end);
    CHECK(srv.text({"ZSCORE", leases_key, "a"}) != lease_ms_of(by_id["a"]));

    CHECK(q.ack(by_id["a"]));
    CHECK(srv.text({"ZSCORE", leases_key, "a"}).empty());
    CHECK(q.nack(by_id["b"], 1h, "later"));
    CHECK(srv.text({"ZSCORE", leases_key, "b"}).empty());
    CHECK_FALSE(srv.text({"ZSCORE", events_key, "b"}).empty());  // waiting again
    CHECK(q.bury(by_id["c"], "never"));
    CHECK(srv.text({"ZSCORE", leases_key, "c"}).empty());
    CHECK(q.cancel("d"));
    CHECK(srv.text({"ZSCORE", leases_key, "d"}).empty());
    CHECK(srv.list({"ZRANGE", leases_key, "0", "-1"}) == std::vector<std::string>{"e"});

    // A dead letter with an entry left by hand (or by an older client): a requeue removes it.
    REQUIRE(srv.command({"ZADD", leases_key, "1", "c"})->integer == 1);
    CHECK(q.requeue_dead("c", 0ms));
    CHECK(srv.text({"ZSCORE", leases_key, "c"}).empty());
    CHECK(q.ack(by_id["e"]));
    CHECK(srv.command({"EXISTS", leases_key})->integer == 0);  // a zset goes with its last member
}

TEST_CASE(
    "leases: a lease that ran out stays until its job is leased again, or buried after its last "
    "attempt",
    "[scripts][leases]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 200ms;
    o.max_attempts = 2;
    delay_queue q(o);
    REQUIRE(q.put("j", "p", long_ago));
    auto first = q.take(1s);
    REQUIRE(first);
    std::this_thread::sleep_for(300ms);  // the lease ran out
    CHECK(srv.text({"ZSCORE", leases_key, "j"}) == lease_ms_of(*first));
    auto s = q.stats();
    CHECK(s.leased == 0);
    CHECK(s.waiting == 1);
    CHECK(s.due_now == 1);
    auto second = q.take(1s);
    REQUIRE(second);
    CHECK(second->attempts == 2);
    CHECK(srv.text({"ZSCORE", leases_key, "j"}) == lease_ms_of(*second));  // moved by the ZADD
    CHECK(q.stats().leased == 1);
    std::this_thread::sleep_for(300ms);  // its last lease ran out: the next take buries it
    CHECK_FALSE(q.take(0ms));
    CHECK(q.dead_size() == 1);
    CHECK(srv.command({"EXISTS", leases_key})->integer == 0);
    s = q.stats();
    CHECK(s.waiting == 0);
    CHECK(s.leased == 0);
    CHECK(s.dead == 1);
}

TEST_CASE(
    "leases: a queue written before the leases key existed keeps working, and what an older client "
    "leased is not counted",
    "[scripts][leases]") {
    redis_server srv;
    auto o = opts(srv);
    delay_queue q(o);
    for (const char* id : {"a-old", "b-older", "c-new"}) REQUIRE(q.put(id, "p", long_ago));
    auto old = q.take(1s);  // in the order of their ids: due at the same time
    auto older = q.take(1s);
    REQUIRE(old);
    REQUIRE(older);
    REQUIRE(old->id == "a-old");
    REQUIRE(older->id == "b-older");
    // As an older version leaves them: leased, in `events` and their buckets, but no `leases`.
    REQUIRE(srv.command({"DEL", leases_key})->integer == 1);
    auto s = q.stats();
    CHECK(s.leased == 0);   // not counted ...
    CHECK(s.waiting == 3);  // ... but queued, and not due until their lease ends
    CHECK(s.due_now == 1);
    CHECK(q.get("a-old")->state == delayq::job_state::leased);

    // An object with a limit of one lease does not see them: it leases the due job.
    auto lo = opts(srv);
    lo.limits.max_leased = 1;
    delay_queue limited(lo);
    auto fresh = limited.take(1s);
    REQUIRE(fresh);
    CHECK(fresh->id == "c-new");
    CHECK(limited.stats().leased == 1);

    // Their holders settle them as ever; an extend makes one known.
    CHECK(q.ack(*old));
    CHECK(limited.extend(*older, 1h));
    CHECK(srv.text({"ZSCORE", leases_key, "b-older"}) != "");
    CHECK(q.stats().leased == 2);
    CHECK(limited.ack(*older));
    CHECK(limited.ack(*fresh));
    CHECK(q.size() == 0);
    CHECK(srv.command({"EXISTS", leases_key})->integer == 0);
}

TEST_CASE("limits: each lease under a rate is one grant, and grants older than the period go",
          "[scripts][limits]") {
    redis_server srv;
    auto o = opts(srv);
    o.limits.rate = 5;
    o.limits.period = 1s;
    delay_queue q(o);
    for (const char* id : {"a", "b", "c"}) REQUIRE(q.put(id, "p", long_ago));
    const auto two = q.take_many(2, 1s);
    REQUIRE(two.size() == 2);
    const auto members = srv.list({"ZRANGE", grants_key, "0", "-1"});
    REQUIRE(members.size() == 2);
    for (const auto& j : two) {
        // Its token, scored by the time of the lease (its lease end less the lease).
        const auto at = std::chrono::duration_cast<std::chrono::milliseconds>(
            (j.lease_deadline - o.lease).time_since_epoch());
        CHECK(srv.text({"ZSCORE", grants_key, std::to_string(j.token)}) ==
              std::to_string(at.count()));
    }
    // An object without a rate makes no grant, and an ack takes none back.
    delay_queue plain(opts(srv));
    CHECK(plain.ack(two[0]));
    std::this_thread::sleep_for(1100ms);
    auto third = q.take(1s);  // trims the two of more than a period ago
    REQUIRE(third);
    CHECK(srv.list({"ZRANGE", grants_key, "0", "-1"}) ==
          std::vector<std::string>{std::to_string(third->token)});
    REQUIRE(q.put("d", "p", long_ago));
    auto fourth = plain.take(1s);
    REQUIRE(fourth);
    CHECK(srv.command({"ZCARD", grants_key})->integer == 1);
}

TEST_CASE(
    "limits: a take that max_leased holds back asks the server again only when a place may free",
    "[scripts][limits]") {
    redis_server srv;
    auto o = opts(srv);
    o.limits.max_leased = 1;
    o.lease = 1500ms;
    o.max_block = 1h;  // no look but those the answers ask for
    delay_queue a(o), b(o);
    REQUIRE(a.put("x", "p", long_ago));
    REQUIRE(a.put("y", "p", long_ago));
    auto held = a.take(1s);
    REQUIRE(held);
    CHECK_FALSE(b.take(0ms));  // connects and loads the scripts before counting
    const long long before = script_calls(srv);
    // The answer is the lease's end: the take sleeps until then, then leases the next.
    auto next = b.take(60s);
    REQUIRE(next);
    CHECK(next->lease_deadline - o.lease >= held->lease_deadline - 2ms);
    // The first look, held back; the look at the lease's end (and one more if that came a
    // millisecond early by the server's clock). A take that spins makes thousands.
    CHECK(script_calls(srv) - before <= 4);
    CHECK(b.ack(*next));
}

TEST_CASE("limits: a take that a rate holds back sleeps until the oldest grant leaves the window",
          "[scripts][limits]") {
    redis_server srv;
    auto o = opts(srv);
    o.limits.rate = 2;
    o.limits.period = 1500ms;
    o.max_block = 1h;
    delay_queue a(o), b(o);
    for (const char* id : {"a", "b", "c"}) REQUIRE(a.put(id, "p", long_ago));
    const auto first = a.take_many(2, 1s);
    REQUIRE(first.size() == 2);
    CHECK(a.ack_many(first) == std::vector<bool>{true, true});  // acks free no grant
    CHECK_FALSE(b.take(0ms));
    const long long before = script_calls(srv);
    auto next = b.take(60s);
    REQUIRE(next);
    CHECK(next->lease_deadline - o.lease >= first[0].lease_deadline - o.lease + 1500ms - 2ms);
    CHECK(script_calls(srv) - before <= 4);
    CHECK(b.ack(*next));
}

TEST_CASE(
    "limits: an ack, a nack, a cancel or a shortened lease by an object with limits wakes a take "
    "that the limit holds back, in another object",
    "[scripts][limits]") {
    redis_server srv;
    auto o = opts(srv);
    o.limits.max_leased = 1;
    o.max_block = 1h;  // only a message can wake the held take before a lease's end
    delay_queue a(o), b(o);
    for (const char* id : {"1", "2", "3", "4", "5", "6", "7", "8"})
        REQUIRE(a.put(id, "p", long_ago));
    const auto released = [&](const std::function<void(const delayq::redis::job&)>& settle) {
        auto held = a.take(1s);
        REQUIRE(held);
        auto got = std::async(std::launch::async, [&] { return b.take(120s); });
        REQUIRE(eventually([&] { return srv.waiting_objects() >= 1; }));
        std::this_thread::sleep_for(200ms);
        CHECK(got.wait_for(0s) == std::future_status::timeout);  // held back
        settle(*held);
        REQUIRE(got.wait_for(60s) == std::future_status::ready);  // not the lease's 30 s end
        auto j = got.get();
        REQUIRE(j);
        return *j;
    };
    auto j = released([&](const delayq::redis::job& h) { CHECK(a.ack(h)); });
    CHECK(b.ack(j));
    j = released([&](const delayq::redis::job& h) { CHECK(a.nack(h, 1h)); });
    CHECK(b.ack(j));
    j = released([&](const delayq::redis::job& h) { CHECK(a.cancel(h.id)); });
    CHECK(b.ack(j));
    // Shortened to 300 ms: a place frees then, sooner than the held take was told.
    j = released([&](const delayq::redis::job& h) { CHECK(a.extend(h, 300ms)); });
    CHECK(b.ack(j));
}

TEST_CASE("stats: one script call per shard, whatever the queue holds", "[scripts][stats]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    std::vector<delayq::redis::put_request> many;
    std::vector<std::string> ids;
    for (int i = 0; i < 300; ++i) ids.push_back("j" + std::to_string(i));
    for (int i = 0; i < 300; ++i)
        many.push_back({ids[static_cast<std::size_t>(i)], "p", i < 100 ? 0ms : 1h});
    REQUIRE(q.put_many(many) == std::vector<bool>(300, true));
    auto leased = q.take_many(30, 1s);
    REQUIRE(leased.size() == 30);
    CHECK(q.bury(leased.back()));
    leased.pop_back();
    (void)q.stats();  // loads the script
    srv.command({"CONFIG", "RESETSTAT"});
    const auto s = q.stats();
    CHECK(script_calls(srv) == 1);
    CHECK(s.waiting == 270);
    CHECK(s.due_now == 70);
    CHECK(s.leased == 29);
    CHECK(s.dead == 1);
    // Each command the script ran is O(log n) or O(1): nothing went through the jobs.
    for (const char* cmd : {"zrangebyscore", "zrangebylex", "hgetall", "hmget", "scan", "keys"})
        CHECK(srv.info_field("commandstats", std::string("cmdstat_") + cmd + ":calls=").empty());
}

// Repeatable jobs (scripts.hpp, "Repeatable jobs"): the Lua next run against the C++ one that
// defines it, where the schedule rides, and the next run made once by racing or merged acks.
namespace {

using delayq::detail::job_queue::cron_text;
using delayq::detail::job_queue::every_text;

// The Lua next_run (scripts.hpp's repeat_lua, the very text the scripts run) on the server, for
// `schedule` and each (slot, now) of `at`: the due times it gives, -1 for none. The text reads no
// key and no clock, so EVAL runs it with times of the test's choosing.
std::vector<long long> lua_next_runs(const redis_server& srv, const std::string& schedule,
                                     const std::vector<std::pair<long long, long long>>& at) {
    std::string script(delayq::redis::detail::repeat_lua.view());
    script +=
        "local out = {}\n"
        "for i = 2, #ARGV, 2 do\n"
        "  local r = next_run(ARGV[1], tonumber(ARGV[i]), tonumber(ARGV[i + 1]))\n"
        "  out[#out + 1] = r and string.format('%d', r) or '-1'\n"
        "end\n"
        "return out\n";
    std::vector<std::string> args{"EVAL", script, "0", schedule};
    for (const auto& p : at) {
        args.push_back(std::to_string(p.first));
        args.push_back(std::to_string(p.second));
    }
    std::vector<long long> out;
    for (const auto& s : srv.list(args)) out.push_back(std::stoll(s));
    return out;
}

long long ms_of(std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

long long ms_of(int y, unsigned mo, unsigned d, int h = 0, int mi = 0, int s = 0) {
    using namespace std::chrono;
    return ms_of(sys_days(year(y) / month(mo) / day(d)) + hours(h) + minutes(mi) + seconds(s));
}

// The "r" entry of job `id` in queue `q`'s buckets (its schedule), or "".
std::string schedule_of(const redis_server& srv, const std::string& id) {
    for (const auto& bucket : srv.keys("dq:v3:{q}:data:*")) {
        const std::string r = srv.text({"HGET", bucket, "r" + id});
        if (!r.empty()) return r;
    }
    return "";
}

}  // namespace

TEST_CASE("repeat: the scripts' Lua next run is the C++ next_run, for cron and every schedules",
          "[scripts][repeat]") {
    redis_server srv;
    // Times around the edges a calendar walk can get wrong (ends of months and years, 29
    // February in leap years and in 2100, which is none, the epoch, the last minute of a day),
    // then many at random from 1970 to 2200.
    std::vector<long long> times{0,
                                 59'999,
                                 60'000,
                                 ms_of(1999, 12, 31, 23, 59, 59),
                                 ms_of(2000, 2, 28, 23, 59),
                                 ms_of(2000, 2, 29, 12),
                                 ms_of(2024, 2, 29, 0, 0),
                                 ms_of(2026, 12, 7, 10, 7, 30),
                                 ms_of(2027, 1, 31, 23, 59, 59),
                                 ms_of(2096, 3, 1),
                                 ms_of(2100, 2, 28, 23, 59, 59),
                                 ms_of(2100, 3, 1)};
    std::mt19937_64 rng(20261207);
    std::uniform_int_distribution<long long> any_time(0, ms_of(2200, 1, 1));
    for (int i = 0; i < 60; ++i) times.push_back(any_time(rng));
    for (int i = 0; i < 8; ++i) {  // exactly on a minute, and just before one
        const long long t = any_time(rng) / 60'000 * 60'000;
        times.push_back(t);
        times.push_back(t - 1);
    }
    std::vector<std::string> schedules;
    for (const char* e : {"* * * * *",         "*/15 * * * *", "0 3 * * *",
                          "0 9 1 * MON",       "0 0 29 2 *",   "30 23 31 12 *",
                          "0 0 * * 0",         "0 0 * * 7",    "5-10/2 8-18 * JAN,JUL SAT,SUN",
                          "0 12 15 * *",       "0 0 1 1 *",    "59 23 * * *",
                          "0 0 */2 * *",       "0 0 * */3 *",  "0 0 13 * FRI",
                          "0 0 31 * *",        "45 4 1-7 * 1", "0,30 * * 2 *",
                          "29,30,59 22 * * *", "0 0 29 2 MON", "0 0 */5 * 1-5",
                          "0 0 * * */2",       "7 7 7 7 *",    "0 0 30 * *"})
        schedules.push_back(cron_text(e));
    // Masks no expression makes: bits above each field's range (ignored), and none at all.
    for (const char* c : {"c4294967295:4294967295:4294967295:4294967295:4294967295:127:3",
                          "c1:0:1:4294967294:8190:0:2", "c0:0:0:0:0:0:0", "c1:0:1:2:4:1:0"})
        schedules.emplace_back(c);
    for (long long p : {1LL, 7LL, 1000LL, 60'000LL, 3'600'000LL, 86'400'000LL + 1})
        schedules.push_back(every_text(std::chrono::milliseconds(p)));
    // What no version writes: no next run, from either.
    for (const char* bad : {"", "e", "e0", "e-5", "x100", "c1:2", "eabc"})
        schedules.emplace_back(bad);

    std::uniform_int_distribution<long long> offset(-10'000'000, 10'000'000);
    for (const auto& s : schedules) {
        std::vector<std::pair<long long, long long>> at;
        for (long long now : times) {
            const long long slot = std::max(0LL, now + offset(rng));  // now and then after now
            at.emplace_back(slot, now);
        }
        const auto lua = lua_next_runs(srv, s, at);
        REQUIRE(lua.size() == at.size());
        for (std::size_t i = 0; i < at.size(); ++i) {
            INFO(s << " slot " << at[i].first << " now " << at[i].second);
            const auto want = delayq::detail::job_queue::next_run(s, at[i].first, at[i].second);
            CHECK(lua[i] == want.value_or(-1));
        }
    }
}

TEST_CASE("repeat: put_cron's first run is the C++ next run after the server's now",
          "[scripts][repeat]") {
    redis_server srv;
    delay_queue q(opts(srv));
    int n = 0;
    for (const char* e : {"* * * * *", "*/2 * * * *", "0 * * * *", "0 3 * * *", "0 9 1 * MON",
                          "0 0 29 2 *", "5-10/2 8-18 * JAN,JUL SAT,SUN", "59 23 31 12 *"}) {
        const std::string id = "c" + std::to_string(n++);
        const std::string text = cron_text(e);
        const long long before = srv.time_ms();
        REQUIRE(q.put_cron(id, "p", e));
        const long long after = srv.time_ms();
        const auto info = q.get(id);
        REQUIRE(info);
        INFO(e);
        // The server's now lies between the two reads: the C++ next run after one of them.
        const long long got = ms_of(info->time);
        const auto first = delayq::detail::job_queue::next_run(text, 0, before);
        const auto last = delayq::detail::job_queue::next_run(text, 0, after);
        CHECK((got == first || got == last));
        CHECK(schedule_of(srv, id) == std::to_string(got) + " " + text);
    }
    const std::string cron_error = delayq::test::message_of<std::invalid_argument>(
        [&] { q.put_cron("bad", "p", "0 25 * *"); });
    CHECK(contains(cron_error, "delayq::redis::delay_queue"));
    CHECK(contains(cron_error, "5 fields"));
    const std::string hour_error = delayq::test::message_of<std::invalid_argument>(
        [&] { q.put_cron("bad", "p", "0 25 * * *"); });
    CHECK(contains(hour_error, "hour"));
    CHECK(contains(
        delayq::test::message_of<std::invalid_argument>([&] { q.put_every("bad", "p", 0ms); }),
        "period"));
    CHECK_FALSE(q.get("bad"));
}

TEST_CASE("repeat: the schedule rides in the job's bucket, moves with each run and goes with it",
          "[scripts][repeat]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 2;
    delay_queue q(o);
    const long long before = srv.time_ms();
    REQUIRE(q.put_every("s", "p", 100ms));
    const std::string first = schedule_of(srv, "s");
    REQUIRE(first.ends_with(" e100"));
    const long long slot = std::stoll(first);
    CHECK(slot >= before + 100);
    CHECK(slot == ms_of(q.get("s")->time));

    // A nack before the last attempt retries the run: the same slot, its attempt counted.
    auto run = q.take(10s);
    REQUIRE(run);
    CHECK(ms_of(run->deadline) == slot);
    REQUIRE(q.nack(*run, 0ms, "once"));
    CHECK(schedule_of(srv, "s") == first);
    run = q.take(10s);
    REQUIRE(run);
    CHECK(run->attempts == 2);
    // Its ack: the next run, in phase, with no attempts and no last error left ("m" gone).
    REQUIRE(q.ack(*run));
    const std::string second = schedule_of(srv, "s");
    const long long next = std::stoll(second);
    CHECK(second == std::to_string(next) + " e100");
    CHECK(next > slot);
    CHECK((next - slot) % 100 == 0);
    CHECK(meta_of(srv, "s").empty());
    const auto info = q.get("s");
    REQUIRE(info);
    CHECK(info->attempts == 0);
    CHECK(info->last_error.empty());
    CHECK(ms_of(info->time) == next);
    // A reschedule moves the run, not its slot: the series stays in phase.
    REQUIRE(q.reschedule("s", 0ms));
    CHECK(schedule_of(srv, "s") == second);
    run = q.take(10s);
    REQUIRE(run);
    REQUIRE(q.ack(*run));
    CHECK((std::stoll(schedule_of(srv, "s")) - slot) % 100 == 0);

    // A schedule this version cannot read (a later one's) ends the series at the run's end.
    run = q.take(10s);
    REQUIRE(run);
    for (const auto& bucket : srv.keys("dq:v3:{q}:data:*"))
        if (!srv.text({"HGET", bucket, "rs"}).empty()) srv.command({"HSET", bucket, "rs", "5 z1"});
    REQUIRE(q.ack(*run));
    CHECK(q.size() == 0);
    CHECK(schedule_of(srv, "s").empty());
    CHECK(srv.keys("dq:v3:{q}:data:*").empty());  // nothing of it left

    // A cancel ends a series and takes its schedule with it.
    REQUIRE(q.put_cron("c", "p", "0 0 1 1 *"));
    CHECK_FALSE(schedule_of(srv, "c").empty());
    REQUIRE(q.cancel("c"));
    CHECK(schedule_of(srv, "c").empty());
    CHECK(srv.keys("dq:v3:{q}:data:*").empty());
    // A plain put on the id after that is a plain job: no next run after its ack.
    REQUIRE(q.put_after("c", "p", 0ms));
    run = q.take(10s);
    REQUIRE(run);
    REQUIRE(q.ack(*run));
    CHECK(q.size() == 0);
}

TEST_CASE("repeat: racing acks of one run from two objects make one next run",
          "[scripts][repeat]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 10s;
    delay_queue a(o), b(o);
    REQUIRE(a.put_every("s", "p", 50ms));
    for (int round = 0; round < 20; ++round) {
        auto run = a.take(10s);
        REQUIRE(run);
        const long long slot = ms_of(run->deadline);
        const delayq::redis::job copy = *run;
        auto by_b = std::async(std::launch::async, [&b, &copy] { return b.ack(copy); });
        const bool by_a = a.ack(*run);
        const bool other = by_b.get();
        CHECK(by_a != other);  // one holder's ack holds, the other finds the run gone
        CHECK(a.size() == 1);
        const auto info = a.get("s");
        REQUIRE(info);
        CHECK(info->state == delayq::job_state::waiting);
        CHECK(info->attempts == 0);
        CHECK(ms_of(info->time) > slot);
        CHECK((ms_of(info->time) - slot) % 50 == 0);
    }
}

TEST_CASE("repeat: a run whose lease ended is the next holder's: only that ack makes the next run",
          "[scripts][repeat]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 300ms;
    delay_queue a(o);
    o.lease = 10s;
    delay_queue b(o);
    REQUIRE(a.put_every("s", "p", 100ms));
    auto first = a.take(10s);
    REQUIRE(first);
    auto second = b.take(10s);  // once the first lease ended
    REQUIRE(second);
    CHECK(second->attempts == 2);
    CHECK_FALSE(a.ack(*first));
    CHECK(b.size() == 1);
    CHECK(b.get("s")->state == delayq::job_state::leased);
    CHECK(b.ack(*second));
    const auto info = b.get("s");
    REQUIRE(info);
    CHECK(info->state == delayq::job_state::waiting);
    CHECK(info->attempts == 0);
    CHECK(ms_of(info->time) > ms_of(first->deadline));
    CHECK((ms_of(info->time) - ms_of(first->deadline)) % 100 == 0);  // the first run's slot
    CHECK(b.size() == 1);
}

TEST_CASE("repeat: acks merged into one script call each queue their run's next run",
          "[scripts][repeat]") {
    redis_server srv;
    delay_queue q(opts(srv));
    constexpr int n = 8;
    for (int i = 0; i < n; ++i) REQUIRE(q.put_every("s" + std::to_string(i), "p", 100ms));
    REQUIRE(q.put_after("plain", "p", 0ms));
    std::vector<delayq::redis::job> runs;
    while (runs.size() < n + 1) {
        auto more = q.take_many(n + 1 - runs.size(), 10s);
        REQUIRE_FALSE(more.empty());
        runs.insert(runs.end(), more.begin(), more.end());
    }
    // The server holds every write while the threads hand their acks in: they go together.
    std::vector<int> ok(runs.size(), -1);
    srv.command({"CONFIG", "RESETSTAT"});
    REQUIRE(srv.command({"CLIENT", "PAUSE", "10000", "WRITE"})->type == REDIS_REPLY_STATUS);
    std::atomic<std::size_t> ready{0};
    std::vector<std::thread> ts;
    for (std::size_t i = 0; i < runs.size(); ++i)
        ts.emplace_back([&, i] {
            ++ready;
            ok[i] = q.ack(runs[i]) ? 1 : 0;
        });
    while (ready.load() < runs.size()) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(300ms);
    srv.command({"CLIENT", "UNPAUSE"});
    for (auto& t : ts) t.join();
    CHECK(script_calls(srv) < static_cast<long long>(runs.size()));  // some went together
    CHECK(ok == std::vector<int>(runs.size(), 1));
    CHECK(q.size() == n);  // every series' next run, and the plain job gone
    CHECK_FALSE(q.get("plain"));
    for (const auto& r : runs) {
        if (r.id == "plain") continue;
        INFO(r.id);
        const auto info = q.get(r.id);
        REQUIRE(info);
        CHECK(info->state == delayq::job_state::waiting);
        CHECK(info->attempts == 0);
        CHECK(ms_of(info->time) > ms_of(r.deadline));
        CHECK((ms_of(info->time) - ms_of(r.deadline)) % 100 == 0);
    }
}

TEST_CASE("repeat: the next run wakes a take that waits in another object, unless paused",
          "[scripts][repeat]") {
    redis_server srv;
    auto o = opts(srv);
    o.max_block = 30s;  // only a message wakes the waiting take in time
    delay_queue a(o), b(o);
    REQUIRE(a.put_every("s", "p", 200ms));
    auto run = a.take(10s);
    REQUIRE(run);
    auto waiting = std::async(std::launch::async, [&b] { return b.take(20s); });
    REQUIRE(eventually([&] { return srv.waiting_objects() >= 1; }));
    REQUIRE(a.ack(*run));  // the next run comes before the lease end that was the next event
    REQUIRE(waiting.wait_for(15s) == std::future_status::ready);
    auto next = waiting.get();
    REQUIRE(next);
    CHECK(next->id == "s");
    CHECK(next->deadline > run->deadline);

    // Paused: the ack queues the next run and publishes nothing; the resume does.
    a.pause();
    srv.command({"CONFIG", "RESETSTAT"});
    REQUIRE(b.ack(*next));
    CHECK(srv.info_field("commandstats", "cmdstat_publish:calls=").empty());
    CHECK(a.size() == 1);
    a.resume();
    CHECK(srv.info_field("commandstats", "cmdstat_publish:calls=") == "1");
}
