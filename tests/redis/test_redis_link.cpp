// The link that every queue object of a process shares to one server (connection.hpp), under
// what breaks it: connections reset again and again under load from many threads and objects, and
// a server that accepts a connection but never answers the login. Every call is counted in and
// out, and no bound on time here is one a loaded machine can miss: a call that should fail within
// its io_timeout is allowed a second more, a link that should recover is given seconds.
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>
#include <memory>
#include <optional>
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
using delayq::test::message_of;
using delayq_test::eventually;
using delayq_test::opts;
using delayq_test::redis_server;
using clk = std::chrono::steady_clock;

namespace {

std::chrono::milliseconds since(clk::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t);
}

// One call of `q` that went through, or false (its error kept in `why`).
bool goes_through(delay_queue& q, std::string* why = nullptr) {
    try {
        (void)q.size();
        return true;
    } catch (const delayq::redis::error& e) {
        if (why != nullptr) *why = e.what();
        return false;
    }
}

}  // namespace

TEST_CASE(
    "a shared connection reset again and again under load from many threads and objects serves "
    "every object again once the resets stop",
    "[link]") {
    // Seen under 64 threads over 8 objects with CLIENT KILL every 5 ms: at some point no call went
    // through again, on any object, nor on a new one (they share the connection), while the
    // server answered PING. The link's reader role had been handed to a call of a batch whose
    // write failed: that call returned, the role stayed with it, and nobody read or dropped the
    // dead connection again.
    const redis_server srv;
    // 128 threads, 4 rounds of 4 s of resets as fast as they go: at the commit before the fix,
    // the link was stuck after a round in 3 runs of 4 (it took 90 s runs of the seen load).
    constexpr int objects = 8, threads = 128, rounds = 4;
    constexpr std::array<std::chrono::milliseconds, 4> timeouts{1ms, 2ms, 3ms, 200ms};
    auto keeper_options = opts(srv);
    keeper_options.io_timeout = 2s;
    delay_queue keeper(keeper_options);  // holds the link across the rounds, as a long-lived object
    REQUIRE(goes_through(keeper));
    for (int round = 0; round < rounds; ++round) {
        std::vector<std::unique_ptr<delay_queue>> qs;
        for (int i = 0; i < objects; ++i) {
            auto o = opts(srv);
            o.io_timeout = timeouts[static_cast<std::size_t>(i) % timeouts.size()];
            qs.push_back(std::make_unique<delay_queue>(o));
        }
        std::atomic<bool> stop{false}, resets_over{false};
        std::atomic<long> started{0}, returned{0}, ok{0}, failed{0};
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
                delay_queue& q = *qs[static_cast<std::size_t>(t % objects)];
                const std::string prefix =
                    "r" + std::to_string(round) + "-t" + std::to_string(t) + "-";
                // Once the resets are over, the threads of the 1 to 3 ms objects leave: on a
                // loaded machine they fail most calls, one after the other without a pause, and
                // 96 such threads left the server's one thread too little CPU to answer the
                // 200 ms objects in time, for seconds (under ASan beside another test, past 10 s
                // once). Their objects are still checked below, one call each.
                const bool hasty = q.get_options().io_timeout < 200ms;
                for (long i = 0; !stop.load() && !(hasty && resets_over.load()); ++i) {
                    ++started;
                    try {
                        if (i % 4 == 0) {
                            (void)q.size();
                        } else {
                            (void)q.put_after(prefix + std::to_string(i), "", 1h);
                        }
                        ++ok;
                    } catch (const delayq::redis::error&) {
                        ++failed;
                    }
                    ++returned;
                }
            });
        // Another connection resets every normal client (the link's, this one excepted), one
        // CLIENT KILL after the other, for four seconds.
        std::thread killer([&] {
            redisContext* c = redisConnect("127.0.0.1", srv.port());
            const auto end = clk::now() + 4s;
            for (int i = 0; c != nullptr && c->err == 0 && clk::now() < end; ++i) {
                auto* r = redisCommand(c, "CLIENT KILL TYPE normal SKIPME yes");
                if (r != nullptr) freeReplyObject(static_cast<redisReply*>(r));
            }
            redisFree(c);
        });
        killer.join();
        resets_over = true;
        const long ok_at_last_kill = ok.load();
        // The load of the 200 ms objects goes on without kills: calls go through again, on the
        // shared connection (in well under a second; the bound is one a user would call stuck).
        const bool recovered_under_load =
            eventually([&] { return ok.load() > ok_at_last_kill + 100; }, 30s);
        stop = true;
        // Every call returns: none waits past its io_timeout (plus one connect).
        const bool all_returned =
            eventually([&] { return returned.load() == started.load(); }, 10s);
        if (!all_returned) {
            std::fprintf(stderr, "round %d: %ld calls started, %ld returned: a call hangs\n", round,
                         started.load(), returned.load());
            std::_Exit(1);  // the hung threads cannot be joined
        }
        for (auto& t : ts) t.join();
        INFO("round " << round << ": " << ok.load() << " calls went through, " << failed.load()
                      << " failed, " << ok_at_last_kill
                      << " of the first before the kills stopped");
        CHECK(started.load() == ok.load() + failed.load());
        CHECK(recovered_under_load);
        // Every object goes on, and so does a new one, and the one that held the link throughout.
        const auto by = clk::now() + 5s;
        bool all_go_on = recovered_under_load;
        for (std::size_t i = 0; i < qs.size(); ++i) {
            std::string why;
            const bool goes_on = eventually(
                [&] { return goes_through(*qs[i], &why); },
                std::max<std::chrono::milliseconds>(
                    100ms, std::chrono::duration_cast<std::chrono::milliseconds>(by - clk::now())));
            all_go_on = all_go_on && goes_on;
            INFO("object " << i << ", io_timeout " << qs[i]->get_options().io_timeout.count()
                           << " ms: " << why);
            CHECK(goes_on);
        }
        auto fresh_options = opts(srv);
        fresh_options.io_timeout = 2s;
        delay_queue fresh(fresh_options);
        std::string why;
        CHECK(goes_through(fresh, &why));
        CHECK(goes_through(keeper, &why));
        INFO(why);
        if (!why.empty()) FAIL_CHECK("after the kills: " << why);
        if (!all_go_on || !why.empty()) break;  // stuck: the later rounds would say no more
    }
}

TEST_CASE(
    "a login that never completes holds each call up to its own io_timeout only, and a call whose "
    "deadline passed is never written afterwards",
    "[link]") {
    // Seen: a server with a password stopped with SIGSTOP (the kernel still accepts connections,
    // the login never completes), two objects on the shared connection: a put with io_timeout
    // 400 ms returned after 1 799 ms, and was written 1.4 s after its deadline, once the server
    // went on: the connect of the batch it was in was timed by the other object's 4 s.
    const redis_server srv;
    REQUIRE(srv.text({"CONFIG", "SET", "requirepass", "pw"}) == "OK");
    using delayq::redis::detail::budget;
    using delayq::redis::detail::command;
    delayq::redis::detail::link l({"127.0.0.1", srv.port(), "", "pw"}, 5s);
    const auto set = [&](std::string_view key, std::chrono::milliseconds io_timeout) {
        const std::array<std::string_view, 3> args{"SET", key, "1"};
        return std::string(delayq::redis::detail::text_of(
            l.call(command(args), budget::from_now(io_timeout)).get()));
    };
    struct resume {  // the server goes on whatever the checks say
        pid_t pid;
        ~resume() { ::kill(pid, SIGCONT); }
    } const guard{srv.pid()};
    REQUIRE(::kill(srv.pid(), SIGSTOP) == 0);

    // `first` connects (its login hangs) while `patient` and `hasty` are handed in behind it.
    std::atomic<bool> hasty_done{false};
    std::string first_error, patient_error, hasty_error, patient_reply, hasty_reply;
    std::chrono::milliseconds hasty_took{0};
    std::thread first([&] {
        try {
            (void)set("first", 300ms);
        } catch (const delayq::redis::error& e) {
            first_error = e.what();
        }
    });
    std::this_thread::sleep_for(50ms);
    std::thread patient([&] {
        try {
            patient_reply = set("patient", 8s);
        } catch (const delayq::redis::error& e) {
            patient_error = e.what();
        }
    });
    std::thread hasty([&] {
        const auto start = clk::now();
        try {
            hasty_reply = set("hasty", 400ms);
        } catch (const delayq::redis::error& e) {
            hasty_error = e.what();
        }
        hasty_took = since(start);
        hasty_done = true;
    });
    // The server goes on once the hasty call returned (or 2.5 s on, if it did not by then).
    (void)eventually([&] { return hasty_done.load(); }, 2500ms);
    REQUIRE(::kill(srv.pid(), SIGCONT) == 0);
    first.join();
    hasty.join();
    patient.join();
    INFO("first: " << first_error << "; hasty, after " << hasty_took.count()
                   << " ms: " << hasty_error << hasty_reply << "; patient: " << patient_error);
    CHECK(!first_error.empty());
    CHECK(!hasty_error.empty());
    CHECK(hasty_took < 400ms + 1s);  // its own io_timeout, not the patient's
    CHECK(patient_reply == "OK");    // the patient call went through once the server went on
    // Neither call that gave up was written later.
    redisContext* c = redisConnect("127.0.0.1", srv.port());
    REQUIRE(c != nullptr);
    auto* r = static_cast<redisReply*>(redisCommand(c, "AUTH pw"));
    if (r != nullptr) freeReplyObject(r);
    r = static_cast<redisReply*>(redisCommand(c, "EXISTS first hasty patient"));
    REQUIRE(r != nullptr);
    CHECK(r->integer == 1);
    freeReplyObject(r);
    redisFree(c);
}

TEST_CASE("a put of an object with a short io_timeout is not held up by another object's connect",
          "[link]") {
    // The same, as the objects of a program meet it: three objects on the shared connection, the
    // server stopped while the connection is made; the first object's connect times out, and
    // the other two objects' puts wait for the next one.
    const redis_server srv;
    REQUIRE(srv.text({"CONFIG", "SET", "requirepass", "pw"}) == "OK");
    auto first_options = opts(srv), patient_options = opts(srv), hasty_options = opts(srv);
    first_options.password = patient_options.password = hasty_options.password = "pw";
    first_options.io_timeout = 300ms;
    patient_options.io_timeout = 8s;
    hasty_options.io_timeout = 400ms;
    delay_queue first(first_options), patient(patient_options), hasty(hasty_options);
    struct resume {
        pid_t pid;
        ~resume() { ::kill(pid, SIGCONT); }
    } const guard{srv.pid()};
    REQUIRE(::kill(srv.pid(), SIGSTOP) == 0);
    std::thread f([&] {
        try {
            (void)first.put_after("first", "", 1h);
        } catch (const delayq::redis::error&) {
        }
    });
    std::this_thread::sleep_for(50ms);  // the first call connects
    std::optional<bool> patient_put;
    std::string patient_error;
    std::thread p([&] {
        try {
            patient_put = patient.put_after("patient", "", 1h);
        } catch (const delayq::redis::error& e) {
            patient_error = e.what();
        }
    });
    const auto start = clk::now();
    std::string hasty_error;
    try {
        (void)hasty.put_after("hasty", "", 1h);
    } catch (const delayq::redis::error& e) {
        hasty_error = e.what();
    }
    const auto took = since(start);
    REQUIRE(::kill(srv.pid(), SIGCONT) == 0);
    f.join();
    p.join();
    INFO("hasty, after " << took.count() << " ms: " << hasty_error
                         << "; patient: " << patient_error);
    CHECK(!hasty_error.empty());
    CHECK(took < 400ms + 1s);
    CHECK(patient_put == std::optional<bool>(true));
    CHECK(patient.size() == 1);  // neither the first put nor the hasty one was written
}

TEST_CASE("a call that times out says so, naming the command and io_timeout", "[errors]") {
    // Issue 10, item 13: the message was hiredis's errno text, "Resource temporarily unavailable".
    const delayq_test::silent_server hung;
    auto o = delayq_test::queue_options(hung.port());
    o.io_timeout = 300ms;
    delay_queue silent(o);
    const std::string m = message_of<delayq::redis::error>([&] { silent.put_after("a", "", 0ms); });
    INFO(m);
    CHECK(contains(m, "timed out after 3"));  // the time it waited: 300 ms, or a little more
    CHECK(contains(m, "(io_timeout 300 ms)"));
    CHECK_FALSE(contains(m, "Resource temporarily unavailable"));
    const bool names_a_command = contains(m, "EVALSHA") || contains(m, "SCRIPT LOAD") ||
                                 contains(m, "CLUSTER") || contains(m, "HELLO");
    CHECK(names_a_command);
}

// The link (connection.hpp) carries the calls of many threads over one connection and keeps
// several batches in flight. Whatever the interleaving, each call must get its own replies, in
// order, and a failure must answer every call in flight (none hangs, none gets another's reply:
// the first pipelining link, after a failed write, could read calls' replies from a fresh
// connection).
TEST_CASE("a link shared by eight threads: every call gets its own replies, in order", "[link]") {
    const redis_server srv;
    delayq::redis::detail::link l({"127.0.0.1", srv.port(), "", ""}, 2000ms);
    constexpr int threads = 8, calls = 1500;
    std::atomic<int> wrong{0}, done{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; i < calls; ++i) {
                const std::string a = std::to_string(t) + ":" + std::to_string(i);
                const std::string b = a + ":second", c = a + ":third";
                if (i % 3 == 0) {  // one call of three commands, back to back
                    const std::array<std::string_view, 2> e1{"ECHO", a}, e2{"ECHO", b},
                        e3{"ECHO", c};
                    const std::array<delayq::redis::detail::command, 3> cmds{e1, e2, e3};
                    auto rs = l.call(cmds);
                    if (rs.size() != 3 || delayq::redis::detail::text_of(rs[0].get()) != a ||
                        delayq::redis::detail::text_of(rs[1].get()) != b ||
                        delayq::redis::detail::text_of(rs[2].get()) != c)
                        ++wrong;
                } else {
                    const std::array<std::string_view, 2> e{"ECHO", a};
                    auto r = l.call(delayq::redis::detail::command(e));
                    if (delayq::redis::detail::text_of(r.get()) != a) ++wrong;
                }
                ++done;
            }
        });
    for (auto& t : ts) t.join();
    CHECK(wrong.load() == 0);
    CHECK(done.load() == threads * calls);
}

TEST_CASE(
    "a server killed under a busy link: every call in flight fails, none hangs, and the "
    "link connects afresh after a restart",
    "[link]") {
    redis_server srv;
    delayq::redis::detail::link l({"127.0.0.1", srv.port(), "", ""}, 2000ms);
    constexpr int threads = 8;
    std::atomic<bool> stop{false};
    std::atomic<int> ok{0}, failed{0}, wrong{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; !stop.load(); ++i) {
                const std::string a = std::to_string(t) + ":" + std::to_string(i);
                const std::array<std::string_view, 2> e{"ECHO", a};
                try {
                    auto r = l.call(delayq::redis::detail::command(e));
                    if (delayq::redis::detail::text_of(r.get()) != a) ++wrong;
                    ++ok;
                } catch (const delayq::redis::error&) {
                    ++failed;
                }
            }
        });
    REQUIRE(eventually([&] { return ok.load() > 2000; }, 10s));
    srv.kill9();
    // Every thread now fails (refused, or reset mid-call): none is stuck on a reply.
    const int failed_at_kill = failed.load();
    CHECK(eventually([&] { return failed.load() >= failed_at_kill + 2 * threads; }, 10s));
    srv.restart();
    const int ok_at_restart = ok.load();
    CHECK(eventually([&] { return ok.load() > ok_at_restart + 1000; }, 20s));
    stop = true;
    for (auto& t : ts) t.join();
    CHECK(wrong.load() == 0);
}

// A write to a connection the server has reset raises SIGPIPE, whose default action ends the
// process: a Redis node that dies while a call is being written must cost the caller an error,
// not its process. (Seen in CI: the test above died of SIGPIPE.) The server here accepts each
// connection and closes it at once; each call writes 4 MiB into it, more than one write() takes:
// the first write is taken, the peer answers it with a reset, and the next write raises SIGPIPE.
TEST_CASE("a write into a connection the server reset is an error, not SIGPIPE", "[link]") {
    const delayq_test::scripted_server resetter;
    delayq::redis::detail::link l({"127.0.0.1", resetter.port(), "", ""}, 2000ms);
    const std::string big(std::size_t{4} << 20, 'x');
    const std::array<std::string_view, 3> set{"SET", "k", big};
    int failed = 0;
    for (int i = 0; i < 20; ++i) {
        try {
            l.call(delayq::redis::detail::command(set));
        } catch (const delayq::redis::error&) {
            ++failed;
        }
    }
    CHECK(failed == 20);
}
