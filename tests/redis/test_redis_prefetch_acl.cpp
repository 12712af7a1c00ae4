// delayq::redis against a real redis-server: the job that an ack keeps for the next take()
// (options::prefetch) when that take never comes, and a Redis ACL user that holds exactly the
// permissions docs/redis.md lists (issue 26, items 6 and 15).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <future>
#include <string>
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

// Milliseconds from the server's now to the end of `id`'s lease (its score: the job is leased);
// -1 when it is not queued.
long long lease_left_ms(const redis_server& srv, const std::string& id) {
    const std::string score = srv.text({"ZSCORE", "dq:v3:{q}:events", id});
    if (score.empty()) return -1;
    return std::stoll(score) - srv.time_ms();
}

// A process that runs `args` and is killed (SIGKILL works on a stopped one too) and reaped on
// destruction.
struct child {
    pid_t pid = -1;
    explicit child(std::vector<std::string> args) {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        if (::posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ) != 0)
            throw std::runtime_error("cannot start " + args[0]);
    }
    child(const child&) = delete;
    child& operator=(const child&) = delete;
    // Waits until it stops itself (true) or ends (false).
    bool stopped() {
        int st = 0;
        while (::waitpid(pid, &st, WUNTRACED) < 0)
            if (errno != EINTR) return false;
        if (WIFSTOPPED(st)) return true;
        pid = -1;  // reaped
        return false;
    }
    ~child() {
        if (pid < 0) return;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
};

}  // namespace

// Issue 26, item 6: the kept job used to stay leased to its object for the whole lease (60 s
// here) unless that object called take() again or was destroyed.
TEST_CASE(
    "prefetch: a job an ack kept for a take() that never comes reaches another consumer "
    "within seconds, not after the lease") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    delay_queue idle(o), other(o);
    REQUIRE(idle.put("x", "", past));
    REQUIRE(idle.put("y", "py", past));
    auto x = idle.take(1s);
    REQUIRE(x);
    REQUIRE(x->id == "x");
    REQUIRE(idle.ack(*x));  // keeps y for idle's next take(), which never comes
    // The server's own lease on the kept job is short: it ends even if `idle` never calls again.
    CHECK(lease_left_ms(srv, "y") <= 5000);
    auto y = other.take(5s);
    REQUIRE(y);
    CHECK(y->id == "y");
    CHECK(y->payload == "py");
    CHECK(y->attempts == 1);  // the kept delivery was never handed out: not an attempt
    CHECK(other.ack(*y));
    CHECK(other.size() == 0);
    CHECK(other.dead_size() == 0);
}

// The same, with max_attempts = 1 and a 2 s lease: the kept delivery used to count, so the job
// went to the dead letters when that lease ended, never handed to any user code.
TEST_CASE(
    "prefetch with max_attempts = 1: a kept job that was never handed out is delivered, "
    "not dead-lettered") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 2s;
    o.max_attempts = 1;
    delay_queue idle(o), other(o);
    REQUIRE(idle.put("x", "", past));
    REQUIRE(idle.put("y", "py", past));
    auto x = idle.take(1s);
    REQUIRE(x);
    REQUIRE(idle.ack(*x));  // keeps y
    auto y = other.take(10s);
    CHECK(other.dead_size() == 0);
    REQUIRE(y);
    CHECK(y->id == "y");
    CHECK(y->attempts == 1);
    CHECK(other.ack(*y));
    CHECK(other.size() == 0);
    CHECK(other.dead_size() == 0);
}

TEST_CASE(
    "a consumer process stopped right after an ack: the job it kept reaches another "
    "consumer within seconds and is not dead-lettered") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("x", "", past));
    REQUIRE(q.put("y", "py", past));
    child frozen({DELAYQ_REDIS_PREFETCH_HELPER, std::to_string(srv.port()), "q", "60000", "1"});
    REQUIRE(frozen.stopped());  // it took x, acked it (keeping y) and stopped every thread
    CHECK(q.size() == 1);       // y, leased to the stopped process
    auto y = q.take(5s);
    REQUIRE(y);
    CHECK(y->id == "y");
    CHECK(y->attempts == 1);
    CHECK(q.ack(*y));
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 0);
}

TEST_CASE("a kept job that take() hands out holds the whole lease, and its attempt counts") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    o.max_attempts = 1;
    delay_queue q(o), other(o);
    for (const char* id : {"x", "y", "z"}) REQUIRE(q.put(id, "", past));
    auto x = q.take(1s);
    REQUIRE(x);
    REQUIRE(q.ack(*x));  // keeps y
    auto y = q.take(0ms);
    REQUIRE(y);
    CHECK(y->id == "y");
    CHECK(y->attempts == 1);
    // Handed to user code: the object makes the server's lease the whole lease, by itself.
    CHECK(eventually([&] { return lease_left_ms(srv, "y") > 30'000; }));
    CHECK(y->lease_deadline - std::chrono::system_clock::now() > 30s);
    auto z = other.take(2s);  // y is leased for good: z is the one other gets
    REQUIRE(z);
    CHECK(z->id == "z");
    CHECK_FALSE(other.take(0ms));
    CHECK(other.nack(*z, 0ms));  // its one attempt: dead
    CHECK(q.ack(*y));
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 1);
}

TEST_CASE("a kept job that take() hands out and user code nacks at once counts its attempt") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("x", "", past));
    REQUIRE(q.put("y", "", past));
    auto x = q.take(1s);
    REQUIRE(x);
    REQUIRE(q.ack(*x));  // keeps y
    auto y = q.take(0ms);
    REQUIRE(y);
    CHECK(y->attempts == 1);
    CHECK(q.nack(*y, 0ms));  // the nack itself proves the hand-over: dead at once
    CHECK(q.dead_size() == 1);
    CHECK(q.size() == 0);
    CHECK_FALSE(q.ack(*y));
}

namespace {

// Every command the queue sends, and every command its scripts run (Redis 7 checks those against
// the user too): docs/redis.md, "ACL", lists the same.
const std::vector<std::string> acl_commands{
    "+evalsha", "+eval",   "+script|load", "+subscribe", "+hlen", "+cluster|slots", "+asking",
    "+time",    "+zrange", "+exists",      "+zadd",      "+zrem", "+zscore",        "+zcard",
    "+hget",    "+hmget",  "+hset",        "+hsetnx",    "+hdel", "+incrby",        "+publish"};

// Creates the ACL user `dq` (password s3cret) that holds exactly the documented permissions.
void add_queue_user(const redis_server& srv) {
    std::vector<std::string> cmd{"ACL", "SETUSER", "dq",       "reset",
                                 "on",  ">s3cret", "~dq:v3:*", "&dq:v3:*"};
    cmd.insert(cmd.end(), acl_commands.begin(), acl_commands.end());
    auto r = srv.command(cmd);
    REQUIRE(r->type == REDIS_REPLY_STATUS);
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

// Issue 26, item 15: the list docs/redis.md gave lacked every command the scripts run, so such a
// user's first put failed with "The user executing the script can't run this command".
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

    // put, reschedule, take, ack (which keeps the next job), nack, dead letters, cancel.
    REQUIRE(q.put("a", "", past));
    REQUIRE(q.put("b", "pb", past));
    REQUIRE(q.put_after("c", "", 1h));
    CHECK(q.reschedule("c", 2h));
    auto a = q.take(1s);
    REQUIRE(a);
    CHECK(q.ack(*a));  // keeps b
    auto b = q.take(0ms);
    REQUIRE(b);
    CHECK(b->id == "b");
    CHECK(q.nack(*b, 0ms));
    auto b2 = q.take(1s);
    REQUIRE(b2);
    CHECK(b2->attempts == 2);
    CHECK(q.nack(*b2, 0ms));  // its last attempt: dead
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

    CHECK(q.size() == 0);
    CHECK(sh.size() == 0);
    CHECK(q.dead_size() == 1);
    CHECK(connections_of(srv, "dq") >= 3);       // each object's link, the subscription
    CHECK(connections_of(srv, "default") == 1);  // CLIENT LIST's own
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
