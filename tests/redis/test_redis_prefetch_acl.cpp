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

// Milliseconds from the server's now to the end of `id`'s lease; -1 when it is not leased.
long long lease_left_ms(const redis_server& srv, const std::string& id) {
    const std::string score = srv.text({"ZSCORE", "dq:v2:{q}:leased", id});
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
