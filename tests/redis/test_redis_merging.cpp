// delayq::redis against a real redis-server: calls that threads of a process hand in for one
// queue shard while one is on its way go as one script call (delayq/detail/job_queue/combiner.hpp),
// and each still gets exactly its own answer: its own jobs, leased and counted, its own ack's
// verdict. The server is held with CLIENT PAUSE WRITE so that the calls pile up while the first
// waits.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "flow.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq::redis::job;
using delayq_test::opts;
using delayq_test::redis_server;

namespace {

const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

// EVALSHA calls the server has run since the last CONFIG RESETSTAT.
long long script_calls(const redis_server& srv) {
    const std::string v = srv.info_field("commandstats", "cmdstat_evalsha:calls=");
    return v.empty() ? 0 : std::stoll(v);
}

// Runs `calls[i]()` on a thread each while the server holds every write (scripts included), so
// that the first call waits in the server and the others hand theirs in meanwhile; lets the
// server go once every thread is about to call (and a little after). Returns the script calls
// the server ran for them.
long long while_paused(const redis_server& srv, std::vector<std::function<void()>> calls) {
    srv.command({"CONFIG", "RESETSTAT"});
    REQUIRE(srv.command({"CLIENT", "PAUSE", "10000", "WRITE"})->type == REDIS_REPLY_STATUS);
    std::atomic<std::size_t> ready{0};
    std::vector<std::thread> ts;
    for (auto& c : calls)
        ts.emplace_back([&ready, &c] {
            ++ready;
            c();
        });
    while (ready.load() < calls.size()) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(300ms);  // every thread is in its call by now, or nearly
    srv.command({"CLIENT", "UNPAUSE"});
    for (auto& t : ts) t.join();
    return script_calls(srv);
}

}  // namespace

TEST_CASE("eight threads' puts, handed in while one is on its way, go as one more script call") {
    redis_server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put("warm", "", past));  // the script loaded, the layout checked
    std::vector<std::function<void()>> calls;
    std::atomic<int> queued{0};
    for (int i = 0; i < 8; ++i)
        calls.emplace_back([&, i] {
            if (q.put("j" + std::to_string(i), "p" + std::to_string(i), past)) ++queued;
        });
    const long long scripts = while_paused(srv, calls);
    CHECK(queued == 8);
    CHECK(scripts <= 4);  // the first, then the seven together (a thread late to call: one more)
    CHECK(q.size() == 9);
    std::set<std::string> seen;
    while (auto j = q.take(0ms)) {
        CHECK(j->payload == (j->id == "warm" ? "" : "p" + j->id.substr(1)));
        seen.insert(j->id);
        CHECK(q.ack(*j));
    }
    CHECK(seen.size() == 9);
}

TEST_CASE(
    "takes and acks of many objects merged: each take gets its own jobs, leased and "
    "counted, each ack its own verdict") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    std::vector<std::unique_ptr<delay_queue>> objects;
    for (int i = 0; i < 8; ++i) objects.push_back(std::make_unique<delay_queue>(o));
    for (int i = 0; i < 8; ++i) REQUIRE(objects[0]->put("j" + std::to_string(i), "", past));
    // Four held jobs to ack (one of them with a token its holder lost), four waiting to be taken.
    std::vector<job> held;
    for (int i = 0; i < 4; ++i) {
        auto j = objects[0]->take(0ms);
        REQUIRE(j);
        held.push_back(*j);
    }
    held[3].token += 1000;  // not its lease: refused, whatever it is sent with
    std::vector<std::optional<job>> taken(4);
    std::vector<int> acked(4, -1);
    std::vector<std::function<void()>> calls;
    for (int i = 0; i < 4; ++i) {
        calls.emplace_back([&, i] { acked[i] = objects[i]->ack(held[i]) ? 1 : 0; });
        calls.emplace_back([&, i] { taken[i] = objects[4 + i]->take(0ms); });
    }
    const long long scripts = while_paused(srv, calls);
    CHECK(acked == std::vector<int>{1, 1, 1, 0});
    std::set<std::string> ids;
    for (const auto& j : taken) {
        REQUIRE(j);
        CHECK(j->attempts == 1);
        CHECK(j->lease_deadline - std::chrono::system_clock::now() > 30s);
        ids.insert(j->id);
    }
    CHECK(ids.size() == 4);  // four jobs, one each
    for (const auto& j : held) CHECK(ids.count(j.id) == 0);
    CHECK(scripts <= 5);             // fewer than the eight calls: they went together
    CHECK(objects[0]->size() == 5);  // four taken, and the one whose ack was refused
    for (int i = 0; i < 4; ++i) CHECK(objects[4 + i]->ack(*taken[i]));
    CHECK(objects[0]->ack(held[3]) == false);
    held[3].token -= 1000;
    CHECK(objects[0]->ack(held[3]));
    CHECK(objects[0]->size() == 0);
}

// (Two pauses here: the queue's, which the scripts read, and CLIENT PAUSE, which holds the server
// so that the calls pile up: while_paused().)
TEST_CASE(
    "takes and acks merged on a paused queue: each ack its own verdict, the takes lease nothing",
    "[pause]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    std::vector<std::unique_ptr<delay_queue>> objects;
    for (int i = 0; i < 8; ++i) objects.push_back(std::make_unique<delay_queue>(o));
    for (int i = 0; i < 8; ++i) REQUIRE(objects[0]->put("j" + std::to_string(i), "", past));
    std::vector<job> held;
    for (int i = 0; i < 4; ++i) {
        auto j = objects[0]->take(0ms);
        REQUIRE(j);
        held.push_back(*j);
    }
    held[3].token += 1000;  // not its lease: refused, whatever it is sent with
    objects[7]->pause();
    std::vector<std::optional<job>> taken(4);
    std::vector<int> acked(4, -1);
    std::vector<std::function<void()>> calls;
    for (int i = 0; i < 4; ++i) {
        calls.emplace_back([&, i] { acked[i] = objects[i]->ack(held[i]) ? 1 : 0; });
        calls.emplace_back([&, i] { taken[i] = objects[4 + i]->take(0ms); });
    }
    const long long scripts = while_paused(srv, calls);
    CHECK(acked == std::vector<int>{1, 1, 1, 0});
    for (const auto& j : taken) CHECK_FALSE(j.has_value());
    CHECK(scripts <= 5);             // fewer than the eight calls: they went together
    CHECK(objects[0]->size() == 5);  // the four waiting, and the one whose ack was refused
    objects[0]->resume();
    std::set<std::string> ids;
    while (auto j = objects[1]->take(0ms)) {
        CHECK(j->attempts == 1);  // the paused takes counted no attempt
        ids.insert(j->id);
        CHECK(objects[1]->ack(*j));
    }
    CHECK(ids.size() == 4);
    held[3].token -= 1000;
    CHECK(objects[0]->ack(held[3]));
    CHECK(objects[0]->size() == 0);
}

TEST_CASE("nacks and burials with reasons merged: each job keeps its own last error", "[lookup]") {
    redis_server srv;
    auto o = opts(srv);
    o.lease = 60s;
    o.max_attempts = 2;
    delay_queue q(o);
    for (int i = 0; i < 8; ++i) REQUIRE(q.put("j" + std::to_string(i), "", past));
    std::vector<job> held;
    for (int i = 0; i < 8; ++i) {
        auto j = q.take(0ms);
        REQUIRE(j);
        held.push_back(*j);
    }
    // Reasons with a NUL and a slash, of several lengths; every third without a reason.
    const auto reason_of = [](int i) {
        std::string r("why\0/", 5);
        r.append(static_cast<std::size_t>(i) * 7, static_cast<char>('a' + i));
        return r;
    };
    std::vector<int> settled(8, -1);
    std::vector<std::function<void()>> calls;
    for (int i = 0; i < 8; ++i)
        calls.emplace_back([&, i] {
            const auto& j = held[static_cast<std::size_t>(i)];
            bool ok = false;
            if (i % 3 == 2)
                ok = q.nack(j, 1h);
            else if (i % 2 == 0)
                ok = q.nack(j, 1h, reason_of(i));
            else
                ok = q.bury(j, reason_of(i));
            settled[static_cast<std::size_t>(i)] = ok ? 1 : 0;
        });
    const long long scripts = while_paused(srv, calls);
    CHECK(settled == std::vector<int>(8, 1));
    CHECK(scripts <= 4);  // fewer than the eight calls: they went together
    for (int i = 0; i < 8; ++i) {
        INFO(i);
        const auto info = q.get("j" + std::to_string(i));
        REQUIRE(info);
        CHECK(info->attempts == 1);
        if (i % 3 == 2) {
            CHECK(info->state == delayq::job_state::waiting);
            CHECK(info->last_error.empty());
        } else {
            CHECK(info->state ==
                  (i % 2 == 0 ? delayq::job_state::waiting : delayq::job_state::dead));
            CHECK(info->last_error == reason_of(i));
        }
    }
}

TEST_CASE(
    "objects with different options do not merge their calls: each take has its own "
    "lease") {
    redis_server srv;
    auto short_lease = opts(srv), long_lease = opts(srv);
    short_lease.lease = 2s;
    long_lease.lease = 60s;
    delay_queue a(short_lease), b(long_lease);
    REQUIRE(a.put("x", "", past));
    REQUIRE(a.put("y", "", past));
    REQUIRE(b.size() == 2);  // b's scripts loaded too
    std::optional<job> ja, jb;
    (void)while_paused(srv, {[&] { ja = a.take(0ms); }, [&] { jb = b.take(0ms); }});
    REQUIRE(ja);
    REQUIRE(jb);
    const auto now = std::chrono::system_clock::now();
    CHECK(ja->lease_deadline - now < 10s);
    CHECK(jb->lease_deadline - now > 30s);
    CHECK(a.ack(*ja));
    CHECK(b.ack(*jb));
}

TEST_CASE(
    "acks queued behind a call to a server that stopped answering fail within their own "
    "io_timeout") {
    redis_server srv;
    auto o = opts(srv);
    o.io_timeout = 1000ms;
    delay_queue q(o);
    constexpr int threads = 8;
    std::vector<job> held;
    for (int i = 0; i < threads; ++i) REQUIRE(q.put("j" + std::to_string(i), "", past));
    for (int i = 0; i < threads; ++i) {
        auto j = q.take(0ms);
        REQUIRE(j);
        held.push_back(*j);
    }
    REQUIRE(::kill(srv.pid(), SIGSTOP) == 0);  // it accepts what is sent, and answers nothing
    std::vector<std::chrono::milliseconds> took(threads);
    std::vector<std::string> said(threads);
    std::atomic<int> ready{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            ++ready;
            while (ready.load() < threads) std::this_thread::yield();
            const auto start = std::chrono::steady_clock::now();
            try {
                (void)q.ack(held[static_cast<std::size_t>(t)]);
            } catch (const delayq::redis::error& e) {
                said[static_cast<std::size_t>(t)] = e.what();
            }
            took[static_cast<std::size_t>(t)] =
                std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - start);
        });
    for (auto& t : ts) t.join();
    REQUIRE(::kill(srv.pid(), SIGCONT) == 0);
    for (std::size_t t = 0; t < threads; ++t) {
        INFO("thread " << t << " took " << took[t].count() << " ms: " << said[t]);
        CHECK(said[t].find("io_timeout 1000 ms") != std::string::npos);
        CHECK(took[t] < 2 * o.io_timeout);  // not a second io_timeout behind the first call
    }
}

TEST_CASE("a child process forked while a call of its parent is on its way makes its own calls") {
    redis_server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put("warm", "", past));
    srv.command({"CLIENT", "PAUSE", "1500", "WRITE"});
    std::thread on_its_way([&] { CHECK(q.put("parent", "", past)); });
    std::this_thread::sleep_for(200ms);  // the parent's put waits in the server
    const pid_t pid = ::fork();
    if (pid == 0) {
        try {
            delay_queue child(opts(srv));  // the same queue, options and server as the parent's
            ::_exit(child.put("child", "", past) ? 0 : 1);
        } catch (...) {
            ::_exit(2);
        }
    }
    on_its_way.join();
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK(q.size() == 3);
}

TEST_CASE(
    "four producers and four consumers, each with an object of its own: every job acked "
    "exactly once") {
    redis_server srv;
    std::vector<std::unique_ptr<delay_queue>> objects;
    for (int i = 0; i < 8; ++i) objects.push_back(std::make_unique<delay_queue>(opts(srv)));
    const auto r = delayq_test::run_flow_with(
        [&](int t) -> delay_queue& { return *objects[static_cast<std::size_t>(t)]; }, {});
    for (const auto& f : r.failures) FAIL_CHECK(f);
    CHECK(r.all_acked_once());
    CHECK(objects[0]->size() == 0);
}

// The combiner alone, with a stand-in for the server, so that its hand-overs (a call told to send,
// another thread sending in its place, calls giving up while they wait and while carried) happen
// thousands of times a second, under TSan too.
TEST_CASE(
    "the combiner under a storm of short deadlines: every batch is sent by its youngest call, and "
    "each call is answered once, or gives up by itself at its own deadline") {
    using delayq::redis::detail::combined_call;
    using delayq::redis::detail::combiner;
    using clock = std::chrono::steady_clock;
    struct test_call : combined_call {
        int answers = 0;  // signalled done by a sender (or its own, for the sender)
    };
    combiner<test_call> m(4);  // four calls at most in one
    std::atomic<long> sent{0}, carried{0}, answered{0}, unsent{0}, abandoned{0};
    std::atomic<long> younger_carried{0}, twice{0}, late{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; ++t)
        ts.emplace_back([&, t] {
            std::minstd_rand rnd(static_cast<unsigned>(t + 1));
            while (!stop) {
                test_call c;
                c.deadline = c.start + std::chrono::microseconds(200 + rnd() % 3000);
                const auto exchange = std::chrono::microseconds(rnd() % 1500);
                const auto f = m.run(
                    c,
                    [&](const test_call& k) {
                        if (k.deadline > c.deadline) ++younger_carried;
                    },
                    [&](test_call& me, combiner<test_call>::batch& b) noexcept {
                        ++sent;
                        std::this_thread::sleep_for(exchange);  // the server
                        b.claim();
                        ++me.answers;
                        for (std::size_t i = 0; i < b.size(); ++i)
                            if (test_call* k = b.at(i)) {
                                ++carried;
                                ++k->answers;
                                k->signal(combined_call::done);
                            }
                    });
                const auto now = clock::now();
                switch (f) {
                    case combiner<test_call>::fate::answered:
                        ++answered;
                        if (c.answers != 1) ++twice;
                        break;
                    case combiner<test_call>::fate::unsent:
                        ++unsent;
                        if (c.answers != 0) ++twice;
                        break;
                    case combiner<test_call>::fate::abandoned:
                        ++abandoned;
                        if (c.answers != 0) ++twice;
                        // It gave up at its own deadline, not an older call's.
                        if (now < c.deadline) ++late;
                        break;
                }
            }
        });
    std::this_thread::sleep_for(1500ms);
    stop = true;
    for (auto& t : ts) t.join();
    INFO(sent << " sent, " << carried << " carried, " << answered << " answered, " << unsent
              << " unsent, " << abandoned << " abandoned");
    CHECK(sent > 0);
    CHECK(carried > 0);  // calls were merged
    CHECK(answered == sent + carried);
    CHECK(younger_carried == 0);  // a batch's exchange spends its youngest call's budget
    CHECK(twice == 0);
    CHECK(late == 0);
}
