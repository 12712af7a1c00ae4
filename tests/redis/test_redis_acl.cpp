// delayq::redis against a real redis-server with a Redis ACL user that holds exactly the
// permissions docs/redis.md lists (the test reads them from that file): every call works, the
// check for keys of an older layout runs, and a refused command is an error that names the
// permission, never an answer.
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq_test::eventually;
using delayq_test::opts;
using delayq_test::redis_server;

namespace {

// A deadline already due by any server clock on this machine.
const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

// The ACL SETUSER command of docs/redis.md ("Redis ACLs"), word by word, with the password
// s3cret.
std::vector<std::string> documented_acl() {
    std::ifstream doc(DELAYQ_REDIS_DOC);
    std::stringstream all;
    all << doc.rdbuf();
    const std::string text = all.str();
    const auto begin = text.find("ACL SETUSER dq ");
    REQUIRE(begin != std::string::npos);
    const auto end = text.find("```", begin);
    REQUIRE(end != std::string::npos);
    std::istringstream words(text.substr(begin, end - begin));
    std::vector<std::string> cmd;
    for (std::string w; words >> w;) cmd.push_back(w == ">PASSWORD" ? ">s3cret" : w);
    return cmd;
}

// Creates the ACL user `dq` (password s3cret) as docs/redis.md says.
void add_queue_user(const redis_server& srv) {
    auto r = srv.command(documented_acl());
    REQUIRE(r->type == REDIS_REPLY_STATUS);
}

// Keys of a queue `q` written by a version of layout v2 (docs/redis.md, "Upgrading").
void write_v2_queue(const redis_server& srv) {
    REQUIRE(srv.command({"ZADD", "dq:v2:{q}:due", "1", "old-job"})->integer == 1);
    REQUIRE(srv.command({"SET", "dq:v2:{q}:seq", "5"})->type == REDIS_REPLY_STATUS);
}

// How many connections are logged in as `user` (CLIENT LIST's "user=" field).
int connections_of(const redis_server& srv, const std::string& user) {
    const std::string list = srv.text({"CLIENT", "LIST"});
    int n = 0;
    for (std::size_t at = list.find(" user=" + user + " "); at != std::string::npos;
         at = list.find(" user=" + user + " ", at + 1))
        ++n;
    return n;
}

}  // namespace

// The list docs/redis.md once gave lacked every command the scripts run, so such a user's first put
// failed with "The user executing the script can't run this command".
TEST_CASE("an ACL user with exactly the documented permissions can use every call of the queue") {
    redis_server srv;
    add_queue_user(srv);
    auto o = opts(srv);
    o.user = "dq";
    o.password = "s3cret";
    o.lease = 60s;
    o.max_attempts = 2;
    delay_queue q(o), consumer(o);

    // The wake-up subscription: a waiting take hears a put (the scripts PUBLISH to it).
    auto waiting = std::async(std::launch::async, [&] { return consumer.take(20s); });
    const auto ended = [&] { return waiting.wait_for(0s) == std::future_status::ready; };
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1 || ended(); }));
    if (ended()) {
        (void)waiting.get();  // its error, in the report
        FAIL("take returned before any put");
    }
    REQUIRE(q.put_after("w", "pw", 0ms));
    auto w = waiting.get();
    REQUIRE(w);
    CHECK(w->payload == "pw");
    CHECK(consumer.ack(*w));

    // put, reschedule, take, ack, nack, dead letters (and how get(), dead() and jobs() show them),
    // cancel.
    REQUIRE(q.put("a", "", past));
    REQUIRE(q.put("b", "pb", past));
    REQUIRE(q.put_after("c", "", 1h));
    CHECK(q.reschedule("c", 2h));
    auto a = q.take(1s);
    REQUIRE(a);
    CHECK(q.ack(*a));
    auto b = q.take(0ms);
    REQUIRE(b);
    CHECK(b->id == "b");
    CHECK(q.nack(*b, 0ms, "first"));
    auto b2 = q.take(1s);
    REQUIRE(b2);
    CHECK(b2->attempts == 2);
    const auto leased = q.get("b");
    REQUIRE(leased);
    CHECK(leased->state == delayq::job_state::leased);
    CHECK(leased->last_error == "first");
    CHECK(q.jobs(delayq::job_state::leased, 10).size() == 1);   // "b"
    CHECK(q.jobs(delayq::job_state::waiting, 10).size() == 1);  // "c"
    CHECK(q.nack(*b2, 0ms));                                    // its last attempt: dead
    CHECK(q.dead_size() == 1);
    const auto dead = q.get("b");
    REQUIRE(dead);
    CHECK(dead->state == delayq::job_state::dead);
    const auto page = q.dead(10);
    REQUIRE(page.size() == 1);
    CHECK(page[0].last_error == "first");
    CHECK(q.dead(10, "b").empty());
    // Back from the dead letters, and dead again; then swept by a death under keep_dead.
    CHECK(q.requeue_dead("b", 0ms));
    auto b3 = q.take(1s);
    REQUIRE(b3);
    CHECK(b3->attempts == 1);
    CHECK(q.bury(*b3, "again"));
    CHECK(q.dead_size() == 1);
    auto keeping = o;
    keeping.keep_dead = 1ms;
    delay_queue k(keeping);
    REQUIRE(k.put("k", "", past));
    auto kj = k.take(1s);
    REQUIRE(kj);
    std::this_thread::sleep_for(5ms);  // "b" died more than keep_dead ago
    CHECK(k.bury(*kj));
    CHECK_FALSE(q.get("b"));
    CHECK(q.dead_size() == 1);
    CHECK(q.cancel("c"));
    CHECK(q.size() == 0);

    // The batches, after SCRIPT FLUSH: the scripts come back through EVAL.
    srv.command({"SCRIPT", "FLUSH"});
    std::vector<std::string> ids;
    for (int i = 0; i < 10; ++i) ids.push_back("m" + std::to_string(i));
    std::vector<delay_queue::put_request> many;
    for (const auto& id : ids) many.push_back({id, "p", 0ms});
    CHECK(q.put_many(many) == std::vector<bool>(ids.size(), true));
    std::vector<delayq::redis::job> got;
    while (got.size() < ids.size()) {
        auto more = q.take_many(ids.size(), 5s);
        REQUIRE_FALSE(more.empty());
        got.insert(got.end(), more.begin(), more.end());
    }
    CHECK(q.ack_many(got) == std::vector<bool>(ids.size(), true));

    // An ended lease, reclaimed by the next take.
    auto short_lease = o;
    short_lease.lease = 300ms;
    delay_queue s(short_lease);
    REQUIRE(s.put("r", "", past));
    auto r1 = s.take(1s);
    REQUIRE(r1);
    auto r2 = s.take(10s);
    REQUIRE(r2);
    CHECK(r2->attempts == 2);
    CHECK(s.ack(*r2));

    // A sharded queue: its own channel and keys, under the same patterns.
    delayq::redis::sharded_delay_queue sh(o, 3);
    for (const auto& id : ids) REQUIRE(sh.put(id, "", past));
    int taken = 0;
    while (auto j = sh.take(0ms)) {
        CHECK(sh.ack(*j));
        ++taken;
    }
    CHECK(taken == static_cast<int>(ids.size()));
    CHECK(sh.dead(10).empty());
    CHECK_FALSE(sh.get(ids.front()));

    // pause, paused and resume (the pause script: HSETNX, EXISTS, HDEL, ZRANGE, PUBLISH), on one
    // shard and on several; a paused take (the consume script's EXISTS).
    q.pause();
    CHECK(q.paused());
    REQUIRE(q.put("ps", "", past));
    CHECK_FALSE(q.take(0ms));
    q.resume();
    CHECK_FALSE(q.paused());
    auto ps = q.take(1s);
    REQUIRE(ps);
    CHECK(q.ack(*ps));
    sh.pause();
    CHECK(sh.paused());
    CHECK_FALSE(sh.take(0ms));
    sh.resume();
    CHECK_FALSE(sh.paused());

    // Series (put_every, put_cron), on a queue of their own: an ack and a burial that queue the
    // next run, a cancel.
    auto series_options = o;
    series_options.name = "series";
    delay_queue series(series_options);
    REQUIRE(series.put_every("every", "", 100ms));
    REQUIRE(series.put_cron("cron", "", "0 0 1 1 *"));
    auto run = series.take(10s);
    REQUIRE(run);
    CHECK(run->id == "every");
    CHECK(series.ack(*run));
    run = series.take(10s);
    REQUIRE(run);
    CHECK(series.bury(*run, "x"));
    CHECK(series.size() == 2);
    CHECK(series.cancel("every"));
    CHECK(series.cancel("cron"));
    CHECK(series.size() == 0);
    CHECK(series.dead_size() == 1);

    CHECK(q.size() == 0);
    CHECK(sh.size() == 0);
    CHECK(q.dead_size() == 1);
    std::this_thread::sleep_for(5ms);  // "k" died before now
    CHECK(q.purge_dead(0ms) == 1);
    CHECK(q.dead_size() == 0);
    CHECK(connections_of(srv, "dq") >= 3);       // each object's link, the subscription
    CHECK(connections_of(srv, "default") == 1);  // CLIENT LIST's own
}

// Limits and stats() run commands that no other call runs (ZCOUNT, ZREMRANGEBYSCORE): the
// documented user must hold them too.
TEST_CASE("an ACL user with exactly the documented permissions can use limits and stats()") {
    redis_server srv;
    add_queue_user(srv);
    auto o = opts(srv);
    o.user = "dq";
    o.password = "s3cret";
    o.limits.max_leased = 1;
    o.limits.rate = 10;
    o.limits.period = 1s;
    delay_queue q(o), other(o);
    REQUIRE(q.put("a", "", past));
    REQUIRE(q.put("b", "", past));
    auto a = q.take(1s);
    REQUIRE(a);
    CHECK_FALSE(other.take(0ms));  // held back: the time a place frees
    auto waiting = std::async(std::launch::async, [&] { return other.take(20s); });
    std::this_thread::sleep_for(200ms);
    CHECK(q.extend(*a, 100ms));  // shortened: the held take is told
    auto b = waiting.get();
    REQUIRE(b);
    CHECK(other.cancel(b->id));  // a cancel of a lease with limits
    const auto s = q.stats();
    CHECK(s.waiting == 1);  // "a", its lease ended
    CHECK(s.due_now == 1);
    CHECK(s.leased == 0);
    auto two = o;
    two.limits.max_leased = 2;                      // a share for each shard
    delayq::redis::sharded_delay_queue sh(two, 2);  // its own keys, {q#0} and {q#1}: empty
    REQUIRE(sh.put("s", "", past));
    CHECK(sh.stats().waiting == 1);
}

TEST_CASE("a refused login is delayq::redis::error naming AUTH and the server's words") {
    redis_server srv;
    add_queue_user(srv);
    auto o = opts(srv);
    o.user = "dq";
    o.password = "not-the-s3cret";
    delay_queue q(o);
    try {
        (void)q.put("a", "", past);
        FAIL("no error");
    } catch (const delayq::redis::error& e) {
        const std::string what = e.what();
        CHECK(what.find("AUTH as 'dq' refused") != std::string::npos);
        CHECK(what.find("WRONGPASS") != std::string::npos);
        CHECK(what.find("not-the-s3cret") == std::string::npos);  // never the password
    }
    CHECK(srv.command({"DBSIZE"})->integer == 0);
}

// The upgrade advice once gave an ACL without the old layout's keys: the check for them read the
// refusal (NOPERM) of its EXISTS as "no such keys", and the queue looked empty while its jobs sat
// in the old keys.
TEST_CASE(
    "a user who may not read the old layout's keys gets an error naming that permission, "
    "not an empty queue") {
    redis_server srv;
    write_v2_queue(srv);
    auto r = srv.command({"ACL", "SETUSER", "dq", "on", ">s3cret", "resetkeys", "~dq:v3:*",
                          "resetchannels", "&dq:v3:*", "+@all"});
    REQUIRE(r->type == REDIS_REPLY_STATUS);
    auto o = opts(srv);
    o.user = "dq";
    o.password = "s3cret";
    delay_queue q(o);
    try {
        const auto n = q.size();
        FAIL("size() answered " << n);
    } catch (const delayq::redis::layout_error& e) {
        FAIL("layout_error without the permission to look: " << e.what());
    } catch (const delayq::redis::error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("NOPERM") != std::string::npos);         // the server's words
        CHECK(what.find("read") != std::string::npos);           // what is missing
        CHECK(what.find("dq:v2:{q}:") != std::string::npos);     // on which keys
        CHECK(what.find("docs/redis.md") != std::string::npos);  // where the ACL is given
    }
    CHECK(srv.command({"EXISTS", "dq:v2:{q}:due"})->integer == 1);  // nothing touched
    CHECK(srv.keys("dq:v3:*").empty());
}

TEST_CASE(
    "the documented ACL lets the old-layout check run: a v2 queue is refused by "
    "layout_error") {
    redis_server srv;
    write_v2_queue(srv);
    add_queue_user(srv);
    auto o = opts(srv);
    o.user = "dq";
    o.password = "s3cret";
    delay_queue q(o);
    try {
        (void)q.put("a", "", past);
        FAIL("no error");
    } catch (const delayq::redis::layout_error& e) {
        CHECK(e.version() == "v2");
    }
    CHECK(srv.command({"ZCARD", "dq:v2:{q}:due"})->integer == 1);
    CHECK(srv.keys("dq:v3:*").empty());
}
