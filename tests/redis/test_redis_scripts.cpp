// What the Redis queue's Lua scripts keep on the server, at its edges: fencing tokens of 10^14 and
// beyond, the one spelling of "no deadline", a put retried after its job was acked, the keys
// of an older layout, which are refused and left untouched, and where a job's last error and its
// dead letter are kept (beside the dead-letter hash that every version reads), and how dead
// letters are put back and removed: in bounded batches, by a purge or by keep_dead; the `leases`
// set that every script keeps (and a queue written before it existed), and the `grants` and the
// waits of the limits.
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <string_view>
#include <thread>
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
    // put, consume, cancel, reschedule, get, requeue dead, purge dead, pause and stats; size and
    // the dead page read no time
    CHECK(defined == 9);

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
