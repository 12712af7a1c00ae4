// delayq::redis against a real redis-server: what one call promises its caller, whatever the
// other threads and processes of the program do. A call merged with others (combiner.hpp) keeps its
// own deadline; a child process after fork() can use the objects its parent made; and what a call
// throws is a public type whose message a user reads (no internal type, no internal command).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "catch.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq::redis::job;
using delayq_test::opts;
using delayq_test::redis_server;
using steady = std::chrono::steady_clock;

namespace {

const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

std::chrono::milliseconds since(steady::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t);
}

// What one call did: whether it threw, what, and how long it took.
struct outcome {
    bool threw = false;
    std::string what;
    std::chrono::milliseconds took{0};
};

template <class F>
outcome timed(F&& f) {
    outcome o;
    const auto start = steady::now();
    try {
        f();
    } catch (const delayq::redis::error& e) {
        o.threw = true;
        o.what = e.what();
    }
    o.took = since(start);
    return o;
}

// Runs three calls of one kind on one shard while the server holds every write: `first` goes at
// once and waits in the server until its deadline passes; `older` hands its call in 50 ms later
// and waits for its turn; `younger` hands its call in 1.5 s after `first`, so that the two go
// together as the next call, `younger` 1.45 s younger than `older`. The server lets go 800 ms
// after `younger` began, well inside its io_timeout of 2 s. Returns what `younger` saw.
template <class First, class Older, class Younger>
outcome merged_late(const redis_server& srv, First first, Older older, Younger younger) {
    REQUIRE(srv.command({"CLIENT", "PAUSE", "20000", "WRITE"})->type == REDIS_REPLY_STATUS);
    const auto t0 = steady::now();
    std::thread a([&] { (void)timed(first); });
    std::this_thread::sleep_until(t0 + 50ms);
    std::thread c([&] { (void)timed(older); });
    std::this_thread::sleep_until(t0 + 1500ms);
    outcome young;
    std::thread b([&] { young = timed(younger); });
    std::this_thread::sleep_until(t0 + 2300ms);
    srv.command({"CLIENT", "UNPAUSE"});
    a.join();
    c.join();
    b.join();
    return young;
}

}  // namespace

TEST_CASE(
    "a put merged with an older one keeps its own deadline: it is answered, not told it timed "
    "out after a fraction of its io_timeout") {
    redis_server srv;
    auto o = opts(srv);
    o.io_timeout = 2000ms;
    delay_queue q(o);
    REQUIRE(q.put("warm", "", past));  // the script loaded, the layout checked
    bool queued = false;
    const outcome young = merged_late(
        srv, [&] { (void)q.put("first", "", past); }, [&] { (void)q.put("older", "", past); },
        [&] { queued = q.put("younger", "", past); });
    INFO("the younger put took " << young.took.count() << " ms: " << young.what);
    // Failing is allowed only at its own deadline, never one of an older call.
    if (young.threw) CHECK(young.took >= o.io_timeout);
    CHECK_FALSE(young.threw);  // the server answered 800 ms into its 2 s
    CHECK(queued);
    CHECK(q.put("younger", "", past) == false);  // queued, once
}

TEST_CASE(
    "a take merged with an older ack keeps its own deadline: it gets its job, which is not "
    "leased to nobody") {
    redis_server srv;
    auto o = opts(srv);
    o.io_timeout = 2000ms;
    o.lease = 60s;
    delay_queue q(o);
    REQUIRE(q.put("h1", "", past));
    REQUIRE(q.put("h2", "", past));
    std::vector<job> held;
    for (int i = 0; i < 2; ++i) {
        auto j = q.take(0ms);
        REQUIRE(j);
        held.push_back(*j);
    }
    REQUIRE(q.put("w", "", past));  // due: the younger take's
    std::optional<job> got;
    const outcome young = merged_late(
        srv, [&] { (void)q.ack(held[0]); }, [&] { (void)q.ack(held[1]); },
        [&] { got = q.take(0ms); });
    INFO("the younger take took " << young.took.count() << " ms: " << young.what);
    if (young.threw) CHECK(young.took >= o.io_timeout);
    CHECK_FALSE(young.threw);
    REQUIRE(got);
    CHECK(got->id == "w");
    CHECK(got->attempts == 1);
    CHECK(q.ack(*got));  // its lease is the taker's
}

TEST_CASE(
    "a take that gives up inside a merged call: its jobs go to the takes still waiting, the rest "
    "back to the queue at once, their attempts not counted, nothing leased to nobody") {
    redis_server srv;
    auto o = opts(srv);
    o.io_timeout = 5000ms;
    o.lease = 30s;
    o.max_attempts = 1;  // a job leased to nobody would be buried at its lease end, never run
    delay_queue q(o);
    REQUIRE(q.put("h", "", past));
    const auto held = q.take(0ms);
    REQUIRE(held);
    for (const char* id : {"a", "b", "c"}) REQUIRE(q.put(id, "", past));
    // The server holds every write. `held`'s ack goes at once and waits there until its deadline
    // (5 s). Three takes of one job each wait for their turn: `older` handed in at 1 s, `middle`
    // at 2.5 s, `younger` at 4 s. When the ack fails the three go together, sent by `younger`; at
    // 6 s, while they wait in the server, `older`'s deadline passes and it gives up. The server
    // lets go at 6.75 s, inside `middle`'s 7.5 s: the script leases three jobs, for two takers.
    REQUIRE(srv.command({"CLIENT", "PAUSE", "30000", "WRITE"})->type == REDIS_REPLY_STATUS);
    const auto t0 = steady::now();
    std::thread first([&] { (void)timed([&] { (void)q.ack(*held); }); });
    struct taker {
        outcome out;
        std::optional<job> got;
        std::thread t;
    };
    std::array<taker, 3> takes;  // older, middle, younger
    for (std::size_t i = 0; i < takes.size(); ++i) {
        std::this_thread::sleep_until(t0 + 1000ms + 1500ms * static_cast<int>(i));
        taker& k = takes[i];
        k.t = std::thread([&q, p = &k] { p->out = timed([&] { p->got = q.take(0ms); }); });
    }
    std::this_thread::sleep_until(t0 + 6750ms);
    srv.command({"CLIENT", "UNPAUSE"});
    first.join();
    for (taker& k : takes) k.t.join();
    std::string report;
    const char* names[] = {"older", "middle", "younger"};
    for (std::size_t i = 0; i < takes.size(); ++i)
        report += std::string("\n") + names[i] +
                  " take: " + std::to_string(takes[i].out.took.count()) + " ms, " +
                  (takes[i].got ? "got " + takes[i].got->id : "got none") + " " + takes[i].out.what;
    INFO(report);
    // What the test is about: the older take gave up inside the merged call, the others did not.
    REQUIRE(takes[0].out.threw);
    REQUIRE(takes[0].out.what.find("sent in with others") != std::string::npos);
    std::set<std::string> ids;
    for (std::size_t i = 1; i < takes.size(); ++i) {
        REQUIRE_FALSE(takes[i].out.threw);
        REQUIRE(takes[i].got);  // the middle one's share did not go to the older one
        CHECK(takes[i].got->attempts == 1);
        ids.insert(takes[i].got->id);
    }
    // The third job was leased for the take that gave up: it is due again now, not at the end of
    // a 30 s lease, and this is its first delivery.
    const auto third = q.take(5s);
    REQUIRE(third);
    CHECK(third->attempts == 1);
    ids.insert(third->id);
    CHECK(ids == std::set<std::string>{"a", "b", "c"});
    CHECK(q.ack(*third));
    for (std::size_t i = 1; i < takes.size(); ++i) CHECK(q.ack(*takes[i].got));
    CHECK_FALSE(q.take(0ms));  // nothing else due ("h" is acked or leased)
}

TEST_CASE(
    "fork(): a child's put and waiting take, on an object its parent made and was using, "
    "return") {
    redis_server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("warm", "", 1h));
    std::atomic<bool> stop{false};
    // One thread puts in a loop; two wait for jobs that never come due while the parent runs
    // (one on the subscription, the other for its turn there).
    std::thread putter([&] {
        for (int i = 0; !stop; ++i) {
            try {
                (void)q.put_after("p" + std::to_string(i), "", 1h);
            } catch (const delayq::redis::error&) {
            }
        }
    });
    std::vector<std::thread> takers;
    for (int t = 0; t < 2; ++t)
        takers.emplace_back([&] {
            while (!stop) {
                try {
                    if (auto j = q.take(300ms)) (void)q.nack(*j, 0ms);  // the child's: back
                } catch (const delayq::redis::error&) {
                }
            }
        });
    REQUIRE(delayq_test::eventually([&] { return srv.waiting_objects() == 1; }));
    // Every put of the parent now waits in the server: one is on its way when the child is made.
    REQUIRE(srv.command({"CLIENT", "PAUSE", "1500", "WRITE"})->type == REDIS_REPLY_STATUS);
    std::this_thread::sleep_for(200ms);
    const pid_t pid = ::fork();
    if (pid == 0) {
        int code = 0;
        try {
            if (!q.put_after("child", "payload", 300ms)) {
                code = 1;
            } else {
                auto j = q.take(60s);  // woken by the subscription, not at its limit
                code = !j ? 3 : j->id != "child" ? 4 : q.ack(*j) ? 0 : 5;
            }
        } catch (...) {
            code = 2;
        }
        q.~delay_queue();  // and it can let go of the object (the child never leaves this scope)
        ::_exit(code);
    }
    REQUIRE(pid > 0);
    stop = true;  // the child's job is for the child
    // The child's put waits out the pause (1.5 s), then its job is due 300 ms later.
    int st = 0;
    pid_t done = 0;
    const auto give_up = steady::now() + 20s;
    while ((done = ::waitpid(pid, &st, WNOHANG)) == 0 && steady::now() < give_up)
        std::this_thread::sleep_for(10ms);
    if (done == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
    }
    putter.join();
    for (auto& t : takers) t.join();
    INFO("the child " << (done == 0 ? "hung and was killed" : "exited"));
    REQUIRE(done == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK(q.put_after("after", "", 1h));  // the parent's object goes on
}

TEST_CASE(
    "a server that cannot be reached is a public error that names its address and no internal "
    "command") {
    const int port = delayq_test::free_port();  // nobody listens there
    delayq::redis::options o;
    o.port = port;
    o.name = "q";
    o.io_timeout = 1000ms;
    delay_queue q(o);
    const std::string at = "127.0.0.1:" + std::to_string(port);
    const auto check = [&](const char* call, auto&& f) {
        INFO(call);
        bool threw = false;
        try {
            f();
        } catch (const delayq::redis::error& e) {
            threw = true;
            const std::string what = e.what();
            const std::string type = typeid(e).name();
            INFO(type << ": " << what);
            CHECK(type.find("detail") == std::string::npos);
            CHECK(what.find("cannot connect to redis at " + at) != std::string::npos);
            for (const char* internal : {"CLUSTER", "SLOTS", "EVALSHA", "SCRIPT", "SUBSCRIBE"})
                CHECK(what.find(internal) == std::string::npos);
        }
        CHECK(threw);
    };
    check("put", [&] { (void)q.put("a", "", past); });
    check("take", [&] { (void)q.take(100ms); });
    check("size", [&] { (void)q.size(); });
}

TEST_CASE(
    "calls that give up inside merged calls while the server stalls return within their own "
    "io_timeout, and no job is acked twice") {
    redis_server srv;
    auto o = opts(srv);
    o.io_timeout = 300ms;
    o.lease = 60s;  // no redelivery during the test: a job acked twice would be a job handed twice
    delay_queue q(o);
    std::vector<std::string> ids;
    for (int i = 0; i < 300; ++i) ids.push_back("j" + std::to_string(i));
    std::vector<delayq::redis::put_request> jobs;
    for (const auto& id : ids) jobs.push_back({id, "", 0ms});
    for (bool queued : q.put_many(jobs)) REQUIRE(queued);
    std::atomic<bool> stop{false};
    std::atomic<long long> slowest{0};
    std::atomic<int> answered{0}, failed{0}, abandoned{0};  // gave up inside a merged call
    std::mutex m;
    std::set<std::string> acked;
    std::vector<std::string> twice;
    const auto call = [&](auto&& f) {
        const auto start = steady::now();
        try {
            f();
            ++answered;
        } catch (const delayq::redis::error& e) {
            ++failed;
            const std::string what = e.what();
            if (what.find("sent in with others") != std::string::npos) ++abandoned;
        }
        const long long took = since(start).count();
        for (long long s = slowest.load(); took > s && !slowest.compare_exchange_weak(s, took);) {
        }
    };
    std::vector<std::thread> ts;
    for (int t = 0; t < 6; ++t)
        ts.emplace_back([&] {
            while (!stop) {
                std::optional<job> j;
                call([&] { j = q.take(0ms); });
                if (!j) continue;
                call([&] {
                    if (!q.ack(*j)) return;
                    std::lock_guard lk(m);
                    if (!acked.insert(j->id).second) twice.push_back(j->id);
                });
            }
        });
    for (int t = 0; t < 2; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; !stop; ++i)
                call([&] {
                    (void)q.put_after("p" + std::to_string(t) + "-" + std::to_string(i), "", 1h);
                });
        });
    // The server stalls again and again, each time for longer than io_timeout.
    const auto end = steady::now() + 3s;
    while (steady::now() < end) {
        srv.command({"CLIENT", "PAUSE", "400", "WRITE"});
        std::this_thread::sleep_for(550ms);
    }
    stop = true;
    for (auto& t : ts) t.join();
    INFO(answered << " calls answered, " << failed << " failed (" << abandoned
                  << " inside a merged call), the slowest took " << slowest << " ms");
    CHECK(answered > 0);
    CHECK(failed > 0);
    CHECK(slowest < (o.io_timeout + 2s).count());
    CHECK(twice.empty());
}
