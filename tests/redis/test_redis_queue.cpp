// delayq::redis::delay_queue against a real redis-server: the API's semantics. Built a second time
// with DELAYQ_TEST_CLUSTER (tests/redis-cluster), where each test's server is a Redis Cluster of
// 3 masters and 3 replicas instead.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <delayq/worker.hpp>
#include <future>
#include <map>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "redis_server.hpp"
#ifdef DELAYQ_TEST_CLUSTER
#include "redis_cluster.hpp"
using server = delayq_test::cluster_server;
#else
using server = delayq_test::redis_server;
#endif

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq_test::eventually;
using delayq_test::opts;

namespace {
// A deadline already due by any server clock on this machine (puts due "now" are due at the next
// millisecond, which a take in the same millisecond does not see yet).
const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
}  // namespace

TEST_CASE("bad options and ids are std::invalid_argument naming the problem") {
    delayq::redis::options o;
    auto fails_with = [](delayq::redis::options bad, const std::string& word) {
        try {
            delay_queue q(std::move(bad));
        } catch (const std::invalid_argument& e) {
            return std::string(e.what()).find(word) != std::string::npos;
        }
        return false;
    };
    CHECK(fails_with(o, "name"));
    o.name = "a{b";
    CHECK(fails_with(o, "hash tag"));
    o.name = "a}";
    CHECK(fails_with(o, "hash tag"));
    o.name = "ok";
    o.lease = 0ms;
    CHECK(fails_with(o, "lease"));
    o.lease = 1s;
    o.io_timeout = -1ms;
    CHECK(fails_with(o, "io_timeout"));
    o.io_timeout = 1s;
    o.max_block = 1ms;
    CHECK(fails_with(o, "max_block"));
    o.max_block = 1s;
    o.keep_dead = -1ms;
    CHECK(fails_with(o, "keep_dead"));
    o.keep_dead = 0ms;
    delay_queue q(o);  // valid options do not connect: no server is needed yet
    CHECK_THROWS_AS(q.put_after("", "x", 0ms), std::invalid_argument);
    const std::string too_long(delayq::max_id_size + 1, 'x');
    CHECK_THROWS_AS(q.get(""), std::invalid_argument);
    CHECK_THROWS_AS(q.get(too_long), std::invalid_argument);
    CHECK_THROWS_AS(q.dead(1, too_long), std::invalid_argument);
    CHECK_THROWS_AS(q.requeue_dead(too_long, 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.requeue_dead("x", -1ms), std::invalid_argument);
    CHECK_THROWS_AS(q.purge_dead(-1ms), std::invalid_argument);
}

TEST_CASE("put then take then ack: a binary payload goes through intact") {
    server srv;
    delay_queue q(opts(srv));
    const std::string payload("a\0b\r\n\xff", 6);
    REQUIRE(q.put_after("j1", payload, 0ms));
    CHECK(q.size() == 1);
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->id == "j1");
    CHECK(j->payload == payload);
    CHECK(j->attempts == 1);
    CHECK(j->lease_deadline - j->deadline >= 30s);
    CHECK(q.size() == 1);  // leased still counts
    CHECK(q.ack(*j));
    CHECK_FALSE(q.ack(*j));
    CHECK(q.size() == 0);
    CHECK_FALSE(q.take(0ms));
}

TEST_CASE("put is idempotent by id while queued: the id is free again after ack or cancel") {
    server srv;
    delay_queue q(opts(srv));
    CHECK(q.put_after("a", "first", 10min));
    CHECK_FALSE(q.put_after("a", "second", 0ms));
    CHECK(q.size() == 1);
    CHECK(q.cancel("a"));
    CHECK(q.put_after("a", "third", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->payload == "third");
    CHECK_FALSE(q.put_after("a", "while leased", 0ms));
    CHECK(q.ack(*j));
    CHECK(q.put_after("a", "again", 0ms));
}

TEST_CASE("jobs come out in deadline order and never before their deadline (server clock)") {
    server srv;
    delay_queue q(opts(srv));
    const std::vector<int> delays{250, 40, 180, 0, 120, 60, 220, 10, 90, 150};
    const long long before = srv.time_ms();
    for (std::size_t i = 0; i < delays.size(); ++i)
        REQUIRE(q.put_after("j" + std::to_string(i), std::to_string(delays[i]),
                            std::chrono::milliseconds(delays[i])));
    std::vector<std::chrono::system_clock::time_point> got;  // due times, as taken
    while (got.size() < delays.size()) {
        auto j = q.take(5s);
        REQUIRE(j);
        const auto taken_at = j->lease_deadline - 30s;  // the server's time at the take
        const auto due = std::chrono::system_clock::time_point(
            std::chrono::milliseconds(before + std::stoi(j->payload)));
        CHECK(taken_at >= j->deadline);
        CHECK(j->deadline >= due);
        got.push_back(j->deadline);
        CHECK(q.ack(*j));
    }
    // By due time, not by delay: on a loaded machine the puts may be spread over more than the
    // delays' 10 ms gaps.
    CHECK(std::is_sorted(got.begin(), got.end()));
}

TEST_CASE("an absolute deadline is kept as server time rounded up to the millisecond") {
    server srv;
    delay_queue q(opts(srv));
    const auto now =
        std::chrono::system_clock::time_point(std::chrono::milliseconds(srv.time_ms()));
    REQUIRE(q.put("later", "", now + 1h + 300us));
    REQUIRE(q.put("past", "", now - 1h));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->id == "past");
    CHECK(j->deadline == now - 1h);
    CHECK_FALSE(q.take(0ms));
    CHECK(srv.text({"ZSCORE", "dq:v3:{q}:events", "later"}) ==
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                             (now + 1h + 1ms).time_since_epoch())
                             .count()));
}

TEST_CASE("cancel removes a waiting or a leased job: the holder's ack is then refused") {
    server srv;
    delay_queue q(opts(srv));
    CHECK_FALSE(q.cancel("nope"));
    REQUIRE(q.put_after("w", "", 1h));
    CHECK(q.cancel("w"));
    CHECK_FALSE(q.cancel("w"));
    REQUIRE(q.put_after("l", "", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(q.cancel("l"));
    CHECK_FALSE(q.ack(*j));
    CHECK_FALSE(q.nack(*j, 0ms));
    CHECK(q.size() == 0);
    // Nothing is left behind in Redis.
    CHECK(
        srv.command({"EXISTS", "dq:v3:{q}:events", "dq:v3:{q}:data", "dq:v3:{q}:dead"})->integer ==
        0);
    CHECK(srv.keys("dq:v3:{q}:data:*").empty());
}

TEST_CASE("reschedule moves a waiting job: false for unknown or leased ids") {
    server srv;
    delay_queue q(opts(srv));
    CHECK_FALSE(q.reschedule("nope", 0ms));
    REQUIRE(q.put_after("a", "", 1h));
    CHECK_FALSE(q.take(0ms));
    CHECK(q.reschedule("a", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->id == "a");
    CHECK_FALSE(q.reschedule("a", 0ms));  // leased
    CHECK(q.nack(*j, 0ms));
    CHECK(q.reschedule("a", 1h));
    CHECK_FALSE(q.take(0ms));
}

TEST_CASE("a blocked take is woken by a put from another client: and holds up no other thread") {
    server srv;
    delay_queue consumer(opts(srv));
    auto taken = std::async(std::launch::async, [&] { return consumer.take(20s); });
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1; }));
    // The same object serves another thread while one take is blocked.
    CHECK(consumer.size() == 0);
    delay_queue producer(opts(srv));
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(producer.put_after("x", "hello", 0ms));
    REQUIRE(taken.wait_for(4s) ==
            std::future_status::ready);  // well before the 5 s idle block ends
    const auto j = taken.get();
    REQUIRE(j);
    CHECK(j->payload == "hello");
    CHECK(std::chrono::steady_clock::now() - start < 4s);
}

TEST_CASE(
    "a take waiting for a due time is handed the job promptly and not at the server's next tick") {
    // Redis ends blocking timeouts in its cron, every 1000/hz ms: with hz 1, a take that left the
    // wake-up to the server would be up to a second late, and after the first take 950 ms late
    // each time (the ack and the next put follow the tick that woke the take: the next due time is
    // 50 ms after a tick, 950 ms before the next). A loaded machine may make wake-ups late too, so
    // the bound is on the sum: 8 takes woken by the server are over 6.6 s late in all; woken by
    // the client, under 4 s even when each is half a second late.
    server srv({"--hz", "1"});
    delay_queue q(opts(srv));
    std::chrono::system_clock::duration late{};
    for (int i = 0; i < 8; ++i) {
        REQUIRE(q.put_after("soon", "", 50ms));
        auto j = q.take(10s);
        REQUIRE(j);
        const auto taken_at = j->lease_deadline - 30s;
        CHECK(taken_at >= j->deadline);
        late += taken_at - j->deadline;
        REQUIRE(q.ack(*j));
    }
    CHECK(late < 4s);
}

TEST_CASE("take with max_wait <= 0 does not block: a bounded take gives up on time") {
    server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("later", "", 1h));
    auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(q.take(0ms));
    CHECK_FALSE(q.take(-5ms));
    CHECK(std::chrono::steady_clock::now() - start < 2s);
    start = std::chrono::steady_clock::now();
    CHECK_FALSE(q.take(300ms));
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 300ms);
    CHECK(took < 3s);
    REQUIRE(q.put_after("now", "", 0ms));
    CHECK(q.take(std::chrono::milliseconds::max()));  // "forever" saturates, and a due job ends it
}

TEST_CASE("an idle consumer does not poll: INFO commandstats") {
    server srv;
    auto o = opts(srv);
    o.max_block = 1s;
    delay_queue q(o);
    CHECK_FALSE(q.take(0ms));  // connects and loads the scripts before counting
    srv.command({"CONFIG", "RESETSTAT"});
    CHECK_FALSE(q.take(3500ms));
    const auto calls = [&](const std::string& cmd) {
        const auto v = srv.info_field("commandstats", "cmdstat_" + cmd + ":calls=");
        return v.empty() ? 0 : std::stoi(v);
    };
    // One consume script per max_block (1 s), plus the last, shorter, wait.
    CHECK(calls("evalsha") <= 5);
    CHECK(calls("evalsha") >= 2);    // it does look now and then (max_block)
    CHECK(calls("subscribe") <= 1);  // and waits on a subscription, not a blocking command
}

TEST_CASE("an ended lease redelivers the job with attempts + 1: the stale holder is refused") {
    server srv;
    auto o = opts(srv);
    o.lease = 2s;  // the acks below come within it, on a loaded machine too
    delay_queue q(o);
    REQUIRE(q.put_after("j", "p", 0ms));
    auto first = q.take(1s);
    REQUIRE(first);
    CHECK(first->attempts == 1);
    auto second = q.take(10s);  // waits for the lease to end
    REQUIRE(second);
    CHECK(second->id == "j");
    CHECK(second->attempts == 2);
    CHECK(second->deadline == first->lease_deadline);
    CHECK(second->lease_deadline - o.lease >= first->lease_deadline);  // not before the lease ended
    CHECK(second->token != first->token);
    CHECK_FALSE(q.ack(*first));
    CHECK_FALSE(q.nack(*first, 0ms));
    CHECK(q.ack(*second));
    CHECK(q.size() == 0);
}

TEST_CASE("an ack after the lease ended is refused even before anyone reclaims the job") {
    server srv;
    auto o = opts(srv);
    o.lease = 50ms;
    delay_queue q(o);
    REQUIRE(q.put_after("j", "", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    const auto lease_end_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(j->lease_deadline.time_since_epoch())
            .count();
    REQUIRE(eventually([&] { return srv.time_ms() > lease_end_ms; }));
    CHECK_FALSE(q.ack(*j));
    CHECK(q.size() == 1);  // still queued: it will be delivered again
}

TEST_CASE("nack puts the job back after retry_after and counts the attempt") {
    server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("j", "p", 0ms));
    auto a = q.take(1s);
    REQUIRE(a);
    REQUIRE(q.nack(*a, 150ms));
    CHECK_FALSE(q.ack(*a));
    auto b = q.take(5s);
    REQUIRE(b);
    CHECK(b->attempts == 2);
    CHECK(b->deadline - (a->lease_deadline - 30s) >= 150ms);
    CHECK(q.ack(*b));
}

TEST_CASE("max_attempts moves a job to the dead-letter hash") {
    server srv;
    auto o = opts(srv);
    o.max_attempts = 2;
    o.lease = 1s;  // each nack below comes within it, on a loaded machine too
    delay_queue q(o);
    REQUIRE(q.put_after("j", "payload", 0ms));
    auto a = q.take(1s);
    REQUIRE(a);
    REQUIRE(q.nack(*a, 0ms));
    auto b = q.take(1s);
    REQUIRE(b);
    CHECK(b->attempts == 2);
    // The lease of the last allowed attempt ends: dead, not redelivered.
    CHECK_FALSE(q.take(3s));
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 1);
    CHECK(srv.text({"HGET", "dq:v3:{q}:dead", "j"}) == "payload");
    // A nack of the last attempt dead-letters at once.
    REQUIRE(q.put_after("k", "", 0ms));
    auto c = q.take(1s);
    REQUIRE(q.nack(*c, 0ms));
    auto d = q.take(1s);
    REQUIRE(d);
    CHECK(q.nack(*d, 0ms));
    CHECK(q.dead_size() == 2);
    CHECK(q.size() == 0);
}

TEST_CASE("get() and dead() show a job, then its dead letter, with its last error", "[lookup]") {
    server srv;
    auto o = opts(srv);
    o.max_attempts = 2;
    o.lease = 10s;
    delay_queue q(o);
    REQUIRE(q.put("a", "pa", past));
    auto j = q.take(1s);
    REQUIRE(j);
    auto i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->time == j->lease_deadline);
    REQUIRE(q.nack(*j, 0ms, "first"));
    i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->attempts == 1);
    CHECK(i->last_error == "first");
    j = q.take(5s);
    REQUIRE(j);
    CHECK(j->attempts == 2);
    REQUIRE(q.nack(*j, 0ms, "second"));  // its last attempt: dead
    i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->attempts == 2);
    CHECK(i->payload == "pa");
    CHECK(i->last_error == "second");
    const auto page = q.dead(10);
    REQUIRE(page.size() == 1);
    CHECK(page[0].id == "a");
    CHECK(page[0].time == i->time);
    CHECK(q.dead(10, "a").empty());
    CHECK(q.dead(0).empty());
    CHECK_FALSE(q.get("b"));
}

TEST_CASE("requeue_dead wakes a take blocked on another object, as a put does", "[dead]") {
    server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue producer(o), consumer(o);
    REQUIRE(producer.put("x", "px", past));
    auto j = producer.take(1s);
    REQUIRE(j);
    REQUIRE(producer.bury(*j, "why"));
    const long long listening = srv.waiting_objects();  // the producer, if its take had to wait
    auto taken = std::async(std::launch::async, [&] { return consumer.take(20s); });
    REQUIRE(eventually([&] { return srv.waiting_objects() == listening + 1; }));
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(producer.requeue_dead("x", 0ms));
    REQUIRE(taken.wait_for(4s) ==
            std::future_status::ready);  // well before the 5 s idle block ends
    j = taken.get();
    REQUIRE(j);
    CHECK(j->id == "x");
    CHECK(j->payload == "px");
    CHECK(j->attempts == 1);
    CHECK(std::chrono::steady_clock::now() - start < 4s);
    CHECK(producer.dead_size() == 0);
    const auto i = producer.get("x");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->last_error == "why");
    CHECK(consumer.ack(*j));
}

TEST_CASE("scripts are reloaded after the server forgets them (NOSCRIPT)") {
    server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("a", "", 0ms));
    srv.command({"SCRIPT", "FLUSH"});
    REQUIRE(q.put_after("b", "", 0ms));
    srv.command({"SCRIPT", "FLUSH"});
    auto j = q.take(1s);
    REQUIRE(j);
    srv.command({"SCRIPT", "FLUSH"});
    CHECK(q.ack(*j));
    CHECK(q.size() == 1);
}

TEST_CASE("duplicate puts racing from many threads make one job") {
    server srv;
    delay_queue q(opts(srv));
    for (int round = 0; round < 20; ++round) {
        const std::string id = "dup" + std::to_string(round);
        std::atomic<int> wins{0};
        std::vector<std::thread> ts;
        for (int t = 0; t < 6; ++t)
            ts.emplace_back([&] {
                if (q.put_after(id, "x", 1h)) ++wins;
            });
        for (auto& t : ts) t.join();
        CHECK(wins == 1);
    }
    CHECK(q.size() == 20);
}

TEST_CASE("server errors are delayq::redis::error with the server's message: the object recovers") {
    server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("a", "", 0ms));
    srv.command({"CONFIG", "SET", "maxmemory", "1"});
    try {
        q.put_after("b", std::string(1000, 'x'), 0ms);
        FAIL("no error for a put beyond maxmemory");
    } catch (const delayq::redis::error& e) {
        CHECK(std::string(e.what()).find("OOM") != std::string::npos);
        // A refusal, not a server out of reach: retrying later would not help by itself.
        CHECK(dynamic_cast<const delayq::unavailable_error*>(&e) == nullptr);
    }
    srv.command({"CONFIG", "SET", "maxmemory", "0"});
    CHECK(q.put_after("b", "", 0ms));
    CHECK(q.size() == 2);
}

TEST_CASE(
    "an unreachable server is delayq::redis::error: and a silent one times out at io_timeout") {
    const int port = delayq_test::free_port();
    delayq::redis::options o;
    o.name = "q";
    o.port = port;
    o.io_timeout = 300ms;
    delay_queue refused(o);
    CHECK_THROWS_AS(refused.put_after("a", "", 0ms), delayq::redis::error);
    CHECK_THROWS_AS(refused.take(1s), delayq::redis::error);
    // Out of reach: every job queue's "retry later" (delayq/job.hpp), by the Redis name too.
    CHECK_THROWS_AS(refused.put_after("a", "", 0ms), delayq::unavailable_error);
    CHECK_THROWS_AS(refused.take(1s), delayq::redis::connection_error);

    const delayq_test::silent_server hung;
    o.port = hung.port();
    delay_queue silent(o);
    const auto start = std::chrono::steady_clock::now();
    try {
        silent.put_after("a", "", 0ms);
        FAIL("no error from a server that never answers");
    } catch (const delayq::redis::error& e) {
        CHECK(std::string(e.what()).find("delayq::redis") != std::string::npos);
        CHECK(dynamic_cast<const delayq::unavailable_error*>(&e) != nullptr);  // timed out
    }
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 250ms);
    CHECK(took < 3s);
}

TEST_CASE("put_many then take_many then ack_many: batches keep the single calls' answers") {
    server srv;
    delay_queue q(opts(srv));
    std::vector<std::string> ids;
    for (int i = 0; i < 1200; ++i)
        ids.push_back("b" + std::to_string(i));  // more than one script call
    std::vector<delay_queue::put_request> reqs;
    for (const auto& id : ids) reqs.push_back({id, id, 0ms});
    reqs.push_back({ids[7], "duplicate in the batch", 0ms});
    const auto queued = q.put_many(reqs);
    REQUIRE(queued.size() == reqs.size());
    CHECK(std::count(queued.begin(), queued.end(), true) == 1200);
    CHECK_FALSE(queued.back());
    CHECK(q.size() == 1200);
    std::set<std::string> seen;
    std::set<std::uint64_t> tokens;
    while (seen.size() < ids.size()) {
        auto jobs = q.take_many(700, 1s);
        REQUIRE_FALSE(jobs.empty());
        CHECK(jobs.size() <= 500);
        for (const auto& j : jobs) {
            CHECK(j.payload == j.id);
            CHECK(seen.insert(j.id).second);
            CHECK(tokens.insert(j.token).second);
        }
        const auto acked = q.ack_many(jobs);
        CHECK(std::count(acked.begin(), acked.end(), true) == static_cast<long>(jobs.size()));
        const auto again = q.ack_many(jobs);
        CHECK(std::count(again.begin(), again.end(), true) == 0);
    }
    CHECK(q.size() == 0);
    CHECK(q.take_many(10, 0ms).empty());
}

TEST_CASE("take_many(0, ...) returns nothing at once and leases nothing") {
    server srv;
    delay_queue q(opts(srv)), other(opts(srv));
    REQUIRE(q.put("a", "", past));
    CHECK(q.take_many(0, 10s).empty());
    auto a = other.take(0ms);  // still waiting: anyone's
    REQUIRE(a);
    CHECK(a->id == "a");
    CHECK(a->attempts == 1);
    CHECK(other.ack(*a));
    const auto start = std::chrono::steady_clock::now();
    CHECK(q.take_many(0, 1h).empty());  // an empty queue: no wait either
    CHECK(std::chrono::steady_clock::now() - start < 30s);
}

// INFO commandstats counts the commands that scripts run too (PUBLISH among them).
TEST_CASE(
    "a take blocked on a paused queue with due jobs does not spin: one consume per max_block, and "
    "a put or a nack meanwhile publishes nothing",
    "[pause]") {
    server srv;
    auto o = opts(srv);
    o.max_block = 1s;
    delay_queue q(o), other(o);
    REQUIRE(other.put("due", "", past));
    auto held = other.take(0ms);  // a lease to nack while paused
    REQUIRE(held);
    REQUIRE(other.put("due-too", "", past));
    other.pause();
    CHECK(q.extend(*held, 30s));  // connects and loads the consume script before counting
    srv.command({"CONFIG", "RESETSTAT"});
    std::stop_source stop;  // ends a take that spins instead of waiting
    auto waiting = std::async(std::launch::async, [&] { return q.take(3500ms, stop.get_token()); });
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1; }));
    // Each would publish on a queue that is not paused: a job before the head, a nack due now.
    REQUIRE(other.put("first", "", past - 1h));
    CHECK(other.nack(*held, 0ms));
    if (waiting.wait_for(60s) != std::future_status::ready) {
        stop.request_stop();
        FAIL_CHECK("the take did not end at its max_wait");
    }
    CHECK_FALSE(waiting.get());
    const auto calls = [&](const std::string& cmd) {
        const auto v = srv.info_field("commandstats", "cmdstat_" + cmd + ":calls=");
        return v.empty() ? 0 : std::stoi(v);
    };
    CHECK(calls("publish") == 0);
    // The take's consumes, one per max_block (1 s) plus the first and the last (a spinning take
    // makes thousands), and the put and the nack.
    CHECK(calls("evalsha") <= 10);
    CHECK(calls("evalsha") >= 4);  // it does look now and then (max_block)
    other.resume();
    CHECK(calls("publish") == 1);  // the resume: the takes that wait look at once
    std::set<std::string> ids;
    while (auto j = q.take(0ms)) {
        ids.insert(j->id);
        CHECK(q.ack(*j));
    }
    CHECK(ids == std::set<std::string>{"due", "due-too", "first"});
}

TEST_CASE("a resume from another process wakes a take blocked on a paused queue", "[pause]") {
    server srv;
    // The other process, forked before this one has threads: it resumes when told to.
    std::array<int, 2> go{-1, -1};
    REQUIRE(::pipe(go.data()) == 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::close(go[1]);
        char c = 0;
        if (::read(go[0], &c, 1) != 1) ::_exit(3);
        try {
            delay_queue operator_(opts(srv));
            operator_.resume();
            ::_exit(operator_.paused() ? 1 : 0);
        } catch (...) {
            ::_exit(2);
        }
    }
    REQUIRE(pid > 0);
    ::close(go[0]);
    auto o = opts(srv);
    o.max_block = 1h;  // so that only the resume's message can wake the take
    delay_queue q(o);
    q.pause();
    REQUIRE(q.put("due", "p", past));
    auto taken = std::async(std::launch::async, [&] { return q.take(120s); });
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1; }));
    std::this_thread::sleep_for(300ms);
    CHECK(taken.wait_for(0s) == std::future_status::timeout);  // a due job, but paused
    CHECK(q.paused());
    REQUIRE(::write(go[1], "!", 1) == 1);
    ::close(go[1]);
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    REQUIRE(taken.wait_for(60s) == std::future_status::ready);  // not the max_block of an hour
    const auto j = taken.get();
    REQUIRE(j);
    CHECK(j->id == "due");
    CHECK(j->attempts == 1);
    CHECK_FALSE(q.paused());
    CHECK(q.ack(*j));
}

TEST_CASE("a worker acks and takes the next job in one script call") {
    server srv;
    auto o = opts(srv);
    delay_queue q(o);
    CHECK_FALSE(q.take(0ms));  // connects and loads the scripts before counting
    constexpr int jobs = 100;
    for (int i = 0; i < jobs; ++i) REQUIRE(q.put("j" + std::to_string(i), "p", past));
    srv.command({"CONFIG", "RESETSTAT"});
    {
        delayq::worker_options wo;
        wo.threads = 1;
        delayq::worker w(
            q, [](const delayq::job&) {}, wo);
        REQUIRE(eventually([&] { return w.counters().done == jobs; }));
    }
    const auto v = srv.info_field("commandstats", "cmdstat_evalsha:calls=");
    const int calls = v.empty() ? 0 : std::stoi(v);
    // One per job (its ack and the next take), the first take, and the idle take's looks at the
    // end: a take and an ack per job would be twice as many.
    CHECK(calls >= jobs);
    CHECK(calls <= jobs + 10);
    CHECK(q.size() == 0);
}

TEST_CASE("a job taken by ack_and_try_take leaves a waiting take awake for the next one") {
    server srv;
    auto o = opts(srv);
    o.max_block = 60s;  // a take that slept past a due job would sleep this long
    delay_queue q(o);
    REQUIRE(q.put("first", "p", past));
    auto first = q.take(5s);
    REQUIRE(first);
    const auto soon = std::chrono::system_clock::now() + 800ms;
    REQUIRE(q.put("a", "p", soon));
    REQUIRE(q.put("b", "p", soon + 1ms));
    std::promise<std::optional<delayq::job>> got;
    auto future = got.get_future();
    std::thread waiter([&] { got.set_value(q.take(30s)); });  // asleep until `soon`
    std::this_thread::sleep_until(soon + 100ms);
    auto r = q.ack_and_try_take(*first);  // takes a or b, whichever the waiter has not
    CHECK(r.acked);
    REQUIRE(future.wait_for(20s) == std::future_status::ready);
    waiter.join();
    auto other = future.get();
    REQUIRE(other.has_value());
    REQUIRE(r.next.has_value());
    CHECK(r.next->id != other->id);
    CHECK(q.ack(*r.next));
    CHECK(q.ack(*other));
}

TEST_CASE(
    "a sharded queue's ack_and_try_take takes from the acked job's shard, unless another shard's "
    "jobs came due first") {
    server srv;
    constexpr std::size_t shards = 4;
    auto o = opts(srv);
    o.max_block = 60s;  // what the object learns of an empty shard holds for the whole test
    delayq::redis::sharded_delay_queue q(o, shards);
    // The shard of an id is a hash of it (part of the key layout).
    const auto shard = [](const std::string& id) {
        return delayq::redis::detail::fnv1a(id) % shards;
    };
    std::vector<std::string> same;  // two ids in a's shard
    std::string other;              // one in another
    for (int i = 0; same.size() < 2 || other.empty(); ++i) {
        const std::string id = "j" + std::to_string(i);
        if (shard(id) == shard("a"))
            same.push_back(id);
        else if (other.empty())
            other = id;
    }
    for (const std::string& id : {std::string("a"), other, same[0], same[1]})
        REQUIRE(q.put(id, "p", past));
    std::map<std::string, delayq::job> held;
    for (int i = 0; i < 4; ++i) {
        auto j = q.take(5s);
        REQUIRE(j);
        held[j->id] = std::move(*j);
    }
    REQUIRE(held.size() == 4);
    CHECK(q.nack(held[other], 0ms));    // due now, in another shard, first
    CHECK(q.nack(held[same[0]], 0ms));  // due now, in a's shard, after it
    std::this_thread::sleep_for(20ms);  // (due at the server's next millisecond)

    // Another shard's job came due first: the ack leaves it to a take, which finds it.
    auto r = q.ack_and_try_take(held["a"]);
    CHECK(r.acked);
    CHECK_FALSE(r.next.has_value());
    auto first = q.take(5s);
    REQUIRE(first);
    CHECK(first->id == other);
    CHECK(q.nack(*first, 1h));  // that shard has nothing due now

    // Only a's shard has a due job: the ack takes it.
    auto mine = q.ack_and_try_take(held[same[1]]);
    CHECK(mine.acked);
    REQUIRE(mine.next.has_value());
    CHECK(mine.next->id == same[0]);
    auto last = q.ack_and_try_take(*mine.next);  // a's shard is empty now
    CHECK(last.acked);
    CHECK_FALSE(last.next.has_value());
    CHECK(q.size() == 1);  // `other`, an hour off
}
