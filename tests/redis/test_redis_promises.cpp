// delayq::redis against a real redis-server: the promises every job queue makes, from any object,
// thread or process (docs/redis.md, "What a take promises"), on the paths where an object once
// kept a job in memory for its next take(): a cancel from elsewhere, a consumer that dies right
// after a take, a cancel racing an ack on another thread. And the entries such an object left on
// a server, which this version reads as leases that end.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <delayq/redis/delay_queue.hpp>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq_test::opts;
using delayq_test::redis_server;

namespace {

// A deadline already due by any server clock on this machine.
const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

// Runs `consumer` in a child process (fork) and waits until it ends; true if SIGKILL ended it.
// The parent holds no queue object and no thread of its own meanwhile.
template <class F>
bool killed_in_child(F consumer) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        try {
            consumer();
        } catch (...) {
        }
        ::_exit(3);  // the consumer did not kill itself
    }
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return false;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
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

// Takes from `q` until `dead` jobs are dead-lettered; false if any take hands a job out first.
bool dead_without_delivery(delay_queue& q, std::size_t dead) {
    for (int i = 0; i < 100 && q.dead_size() < dead; ++i)
        if (q.take(200ms)) return false;
    return q.dead_size() == dead;
}

// The bucket hash that holds `id`'s fields (scripts.hpp's bucket(), in C++).
std::string bucket_of(const std::string& tag, const std::string& id) {
    std::uint64_t h = id.size();
    for (std::size_t i = 0; i < id.size(); i += 4) {
        for (std::size_t k = i; k < i + 4; ++k)
            h = h * 256 + (k < id.size() ? static_cast<unsigned char>(id[k]) : 0U);
        h %= 1048573;
    }
    return "dq:v3:" + tag + ":data:" + std::to_string(h % 1024);
}

}  // namespace

TEST_CASE("a job cancelled by another object after an ack is not handed out by the next take") {
    redis_server srv;
    delay_queue consumer(opts(srv)), admin(opts(srv));
    REQUIRE(consumer.put("a", "", past));
    REQUIRE(consumer.put("b", "", past));
    auto a = consumer.take(1s);
    REQUIRE(a);
    REQUIRE(a->id == "a");
    REQUIRE(consumer.ack(*a));
    REQUIRE(admin.cancel("b"));  // as another process would: b is gone
    auto next = consumer.take(0ms);
    CHECK_FALSE(next);  // a take that starts after the cancel never hands b out
    CHECK(consumer.size() == 0);
    CHECK(admin.size() == 0);
}

TEST_CASE("a job that kills its consumer right after take is dead-lettered after max_attempts") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 1s;
    o.max_attempts = 1;
    SECTION("its first take") {
        {
            delay_queue producer(o);
            REQUIRE(producer.put("poison", "", past));
        }
        CHECK(killed_in_child([&] {
            delay_queue q(o);
            if (auto j = q.take(5s)) ::kill(::getpid(), SIGKILL);  // user code crashes on it
        }));
    }
    SECTION("a take right after an ack of another job") {
        {
            delay_queue producer(o);
            REQUIRE(producer.put("good", "", past));
            REQUIRE(producer.put("poison", "", past));
        }
        CHECK(killed_in_child([&] {
            delay_queue q(o);
            auto good = q.take(5s);
            if (!good || good->id != "good" || !q.ack(*good)) return;
            if (auto j = q.take(5s)) ::kill(::getpid(), SIGKILL);
        }));
    }
    delay_queue q(o);
    CHECK(dead_without_delivery(q, 1));  // once its one lease ends
    CHECK(q.size() == 0);
}

TEST_CASE(
    "a cancel racing an ack on another thread of the same object: no later take hands "
    "the cancelled job out") {
    redis_server srv;
    delay_queue q(opts(srv));
    constexpr int rounds = 1000;
    int cancelled = 0, handed_after_cancel = 0;
    for (int i = 0; i < rounds; ++i) {
        const std::string a = "a" + std::to_string(i), b = "b" + std::to_string(i);
        REQUIRE(q.put(a, "", past));
        REQUIRE(q.put(b, "", past));
        auto ja = q.take(1s);
        REQUIRE(ja);
        REQUIRE(ja->id == a);
        std::atomic<bool> gone{false};
        std::thread canceller([&] { gone = q.cancel(b); });
        CHECK(q.ack(*ja));
        canceller.join();
        REQUIRE(gone);  // b was waiting (or leased): the cancel removes it either way
        ++cancelled;
        if (auto j = q.take(0ms)) {
            ++handed_after_cancel;
            (void)q.ack(*j);
        }
    }
    CHECK(cancelled == rounds);
    CHECK(handed_after_cancel == 0);
    CHECK(q.size() == 0);
}

TEST_CASE("an ack leases nothing: the next due job is any consumer's") {
    redis_server srv;
    delay_queue q(opts(srv)), other(opts(srv));
    REQUIRE(q.put("a", "", past));
    REQUIRE(q.put("b", "", past));
    auto a = q.take(1s);
    REQUIRE(a);
    REQUIRE(q.ack(*a));
    auto b = other.take(0ms);
    REQUIRE(b);
    CHECK(b->id == "b");
    CHECK(b->attempts == 1);
    CHECK(other.ack(*b));
}

TEST_CASE("a consumer process stopped right after an ack holds no other job") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("x", "", past));
    REQUIRE(q.put("y", "py", past));
    child frozen({DELAYQ_REDIS_STOP_HELPER, std::to_string(srv.port()), "q", "60000", "1"});
    REQUIRE(frozen.stopped());  // it took x, acked it and stopped every thread
    CHECK(q.size() == 1);       // y, waiting
    auto y = q.take(0ms);
    REQUIRE(y);
    CHECK(y->id == "y");
    CHECK(y->attempts == 1);
    CHECK(q.ack(*y));
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 0);
}

// An earlier version's ack could lease the next due job for its object's next take() (the
// `prefetch` option): "m" = "attempts:token:hold end:lease end", the attempt not counted, in
// `events` until the hold end. A server may still hold such entries after an upgrade.
TEST_CASE("a job an earlier version kept for its object is a lease that ends at its hold end") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 2;
    delay_queue q(o);
    const std::string events = "dq:v3:{q}:events";
    const auto keep = [&](const std::string& id, int attempts, long long hold_ms) {
        const long long now = srv.time_ms();
        const std::string hold_end = std::to_string(now + hold_ms);
        const std::string m =
            std::to_string(attempts) + ":77:" + hold_end + ":" + std::to_string(now + 60'000);
        REQUIRE(srv.command({"HSET", bucket_of("{q}", id), "m" + id, m})->integer == 1);
        REQUIRE(srv.command({"ZADD", events, hold_end, id})->integer == 0);
    };
    REQUIRE(q.put("never-handed-out", "p1", past));
    REQUIRE(q.put("nacked-once", "p2", past));
    REQUIRE(q.put("cancelled", "", past));
    keep("never-handed-out", 0, 1500);
    keep("nacked-once", 1, 1500);
    keep("cancelled", 0, 60'000);

    CHECK_FALSE(q.take(0ms));  // leased until their hold ends
    CHECK(q.size() == 3);
    CHECK_FALSE(q.reschedule("never-handed-out", 0ms));  // leased, as before
    CHECK(q.cancel("cancelled"));
    CHECK(q.size() == 2);

    std::vector<delayq::redis::job> got;
    for (int i = 0; i < 50 && got.size() < 2; ++i)
        if (auto j = q.take(200ms)) got.push_back(*j);
    REQUIRE(got.size() == 2);
    for (const auto& j : got) {
        if (j.id == "never-handed-out") {
            CHECK(j.payload == "p1");
            CHECK(j.attempts == 1);  // the kept delivery never reached user code
        } else {
            CHECK(j.id == "nacked-once");
            CHECK(j.payload == "p2");
            CHECK(j.attempts == 2);  // its last allowed attempt: delivered, not dead-lettered
        }
        CHECK(q.ack(j));
    }
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 0);
}

TEST_CASE("a kept entry of an earlier version past its last attempt is dead-lettered") {
    redis_server srv;
    auto o = opts(srv);
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("x", "px", past));
    const long long now = srv.time_ms();
    // Delivered once, nacked (max_attempts was higher then), then kept by an object that died.
    const std::string m = "1:5:" + std::to_string(now + 300) + ":" + std::to_string(now + 60'000);
    REQUIRE(srv.command({"HSET", bucket_of("{q}", "x"), "mx", m})->integer == 1);
    REQUIRE(srv.command({"ZADD", "dq:v3:{q}:events", std::to_string(now + 300), "x"})->integer ==
            0);
    CHECK(dead_without_delivery(q, 1));
    CHECK(srv.text({"HGET", "dq:v3:{q}:dead", "x"}) == "px");
    CHECK(q.size() == 0);
}
