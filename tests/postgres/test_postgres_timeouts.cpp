// delayq::postgres::delay_queue under a server that does not answer: a first host that is silent
// (a dead machine, not a refused port), a stalled server (another session holds the queue's table
// locked, as a migration does), and connections that died while idle. The rule every case checks:
// a call returns or fails within io_timeout plus one connect, and a call that failed leaves
// nothing running on the server that changes the queue afterwards. And the takes that one failed
// claim answers: each gets an exception object of its own. And pause, resume and paused on a
// stalled server and on a stopped one.
#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <delayq/postgres/delay_queue.hpp>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "caught_apart.hpp"
#include "expect_error.hpp"
#include "pg_conn.hpp"
#include "pg_fixture.hpp"

using namespace std::chrono_literals;
using delayq_pg_test::fresh_name;
using delayq_pg_test::opts;
using delayq_pg_test::server;
using delayq_pg_test::silent_host;
namespace pg = delayq::postgres;
using steady = std::chrono::steady_clock;

namespace {

// A session of the test's own on the shared server: the one that holds the lock.
struct session : delayq_pg_test::app_conn {
    session() : app_conn(server().conninfo()) {}
    // ACCESS EXCLUSIVE on the jobs table until unlock(): every statement of every queue waits.
    void lock() {
        exec("BEGIN");
        exec("LOCK TABLE delayq.jobs IN ACCESS EXCLUSIVE MODE");
    }
    void unlock() { exec("ROLLBACK"); }
};

double seconds_since(steady::time_point t) {
    return std::chrono::duration<double>(steady::now() - t).count();
}

// Backends of the server with this application_name: all of them, and those running a statement.
int backends(const std::string& app, bool active_only) {
    return std::stoi(
        server().query("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                       "'" + (active_only ? " AND state = 'active'" : "")));
}

// Waits up to `limit` for `pred`; whether it held.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit) {
    const auto until = steady::now() + limit;
    for (;;) {
        if (pred()) return true;
        if (steady::now() >= until) return false;
        std::this_thread::sleep_for(20ms);
    }
}

// The job's row as the server has it: "attempts/leased", or "none".
std::string row_of(const std::string& queue, const std::string& id) {
    const auto s = server().query(
        "SELECT attempts::text || '/' || (token <> 0)::text FROM delayq.jobs WHERE queue = '" +
        queue + "' AND id = '" + id + "'::bytea");
    return s.empty() ? "none" : s;
}

// A queue with a short io_timeout, opened patiently: on a loaded machine its constructor (a
// connect, the catalogs read, every statement prepared) may take longer than the calls that the
// tests time, and opening is not what they check.
std::unique_ptr<pg::delay_queue> open_patiently(const pg::options& o) {
    for (int attempt = 1;; ++attempt) {
        try {
            return std::make_unique<pg::delay_queue>(o);
        } catch (const pg::connection_error&) {
            if (attempt == 20) throw;
        }
    }
}

}  // namespace

TEST_CASE(
    "postgres: a first host that never answers: the queue reaches the second within the "
    "per-host limit",
    "[postgres][timeouts][failover]") {
    silent_host dead;
    const std::string hosts = "host=127.0.0.1,127.0.0.1 port=" + std::to_string(dead.port) + "," +
                              std::to_string(server().port()) +
                              " user=postgres dbname=postgres target_session_attrs=read-write";
    SECTION("connect_timeout in the conninfo is each host's limit") {
        auto o = opts(fresh_name("silent"));
        o.conninfo = hosts + " connect_timeout=2";
        o.io_timeout = 6s;
        const auto start = steady::now();
        std::optional<pg::delay_queue> q;
        try {
            q.emplace(o);
        } catch (const std::exception& e) {
            FAIL("threw after " << seconds_since(start) << " s: " << e.what());
        }
        const double took = seconds_since(start);
        INFO("connected in " << took << " s");
        CHECK(took < 5.0);  // 2 s for the silent host; 6 s (io_timeout) would be the bug
        CHECK(q->put_after("a", "x", 0ms));
        auto j = q->take(5s);  // a listening connection too
        REQUIRE(j);
        CHECK(q->ack(*j));
        // The object's later connects try first the host that answered: the silent one was
        // tried once, by the first connect.
        CHECK(dead.connections() == 1);
    }
    SECTION("without connect_timeout, each host gets a share of io_timeout") {
        auto o = opts(fresh_name("silent"));
        o.conninfo = hosts;
        o.io_timeout = 3s;
        const auto start = steady::now();
        try {
            pg::delay_queue q(o);
            CHECK(q.size() == 0);
        } catch (const std::exception& e) {
            FAIL("threw after " << seconds_since(start) << " s: " << e.what());
        }
    }
    SECTION("every host silent: connection_error naming the hosts, within io_timeout") {
        silent_host dead2;
        auto o = opts(fresh_name("silent"));
        o.conninfo = "host=127.0.0.1,127.0.0.1 port=" + std::to_string(dead.port) + "," +
                     std::to_string(dead2.port) + " user=postgres dbname=postgres";
        o.io_timeout = 1s;
        const auto start = steady::now();
        const auto m =
            delayq::test::message_of<pg::connection_error>([&] { pg::delay_queue q(o); });
        INFO(m);
        CHECK(seconds_since(start) < 3.0);  // 1 s; seconds more would be broken
        CHECK(delayq::test::contains(m, std::to_string(dead2.port)));
    }
}

TEST_CASE(
    "postgres: a stalled server: every call fails within io_timeout plus a connect, leaves no "
    "statement running, and a put that threw is never applied",
    "[postgres][timeouts][stall]") {
    const std::string name = fresh_name("stall");
    const std::string app = "dq-stall-" + std::to_string(::getpid());
    auto o = opts(name);
    o.conninfo += " application_name=" + app;
    o.io_timeout = 500ms;
    o.connections = 4;
    const auto opened = open_patiently(o);
    pg::delay_queue& q = *opened;
    REQUIRE(q.size() == 0);

    session locker;
    locker.lock();
    constexpr int n = 24;
    std::vector<double> took(n);
    std::atomic<int> failed{0}, other{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i)
        ts.emplace_back([&, i] {
            const auto start = steady::now();
            try {
                q.put_after("s" + std::to_string(i), "x", 0ms);
                ++other;  // returned: the lock let it through?
            } catch (const pg::connection_error&) {
                ++failed;
            } catch (...) {
                ++other;
            }
            took[static_cast<std::size_t>(i)] = seconds_since(start);
        });
    for (auto& t : ts) t.join();
    const double slowest = *std::max_element(took.begin(), took.end());
    INFO("slowest call " << slowest << " s");
    CHECK(failed == n);
    CHECK(other == 0);
    // io_timeout 0.5 s plus a connect (0.5 s at most); 1.5 s more for a loaded machine.
    CHECK(slowest < 2.5);

    // While the lock is still held: nothing of the queue's runs on the server, and the object
    // holds no more backends than its connections and a listener.
    const bool idle = eventually([&] { return backends(app, true) == 0; }, 3s);
    INFO("active backends: " << backends(app, true) << ", all: " << backends(app, false));
    CHECK(idle);
    CHECK(eventually([&] { return backends(app, false) <= 5; }, 3s));

    locker.unlock();
    std::this_thread::sleep_for(300ms);  // a put left waiting would commit now
    CHECK(q.size() == 0);
    CHECK(q.put_after("s0", "x", 0ms));  // not queued: the failed put was not applied
}

TEST_CASE(
    "postgres: a take that timed out in a stall leases nothing afterwards: the job is handed "
    "out, not dead-lettered",
    "[postgres][timeouts][stall]") {
    const std::string name = fresh_name("stall-take");
    auto o = opts(name);
    o.io_timeout = 500ms;
    o.lease = 500ms;
    o.max_attempts = 2;
    const auto opened = open_patiently(o);
    pg::delay_queue& q = *opened;
    REQUIRE(q.put_after("job", "x", 0ms));
    for (int round = 0; round < 2; ++round) {
        INFO("stall " << round);
        {
            session locker;
            locker.lock();
            const auto start = steady::now();
            if (round == 0)
                CHECK_THROWS_AS(q.take(0ms), pg::connection_error);  // claims by itself
            else
                CHECK_THROWS_AS(q.take(300ms), pg::connection_error);  // the leader's claim
            CHECK(seconds_since(start) < 2.5);
            locker.unlock();
        }
        std::this_thread::sleep_for(300ms);  // a claim left waiting would lease the job now
        CHECK(row_of(name, "job") == "0/false");
    }
    std::this_thread::sleep_for(o.lease + 200ms);  // a lease granted to nobody would end
    auto j = q.take(2s);
    REQUIRE(j);  // handed out, its first delivery
    CHECK(j->attempts == 1u);
    CHECK(q.ack(*j));
    CHECK(q.dead_size() == 0);
}

TEST_CASE(
    "postgres: the takes of one failed claim each get an exception of their own, of the right "
    "type, with the message",
    "[postgres][timeouts][stall]") {
    // The leader of the waiting takes claims for all of them; the claim waits for a table lock
    // until the test cancels it (SQLSTATE 57014: connection_error). The first take claims alone;
    // the others, queued meanwhile, share the next claim. Each caller reads its exception's
    // what() over and over while the others let go of theirs: a shared exception (or a shared
    // message) is a data race that ThreadSanitizer reports.
    const std::string app = "dq-shared-" + std::to_string(::getpid());
    auto o = opts(fresh_name("shared"));
    o.conninfo += " application_name=" + app;
    o.io_timeout = 60s;  // the test cancels the claims: no timeout of the server's
    pg::delay_queue q(o);
    REQUIRE(q.size() == 0);
    constexpr int n = 6;

    struct caught : delayq::test::caught {
        std::string sqlstate;
    };
    // The claim of the object's that waits for the lock: "pid start", or "".
    const auto waiting_claim = [&] {
        return server().query(
            "SELECT pid::text || ' ' || query_start::text FROM pg_stat_activity WHERE "
            "application_name = '" +
            app + "' AND wait_event_type = 'Lock'");
    };
    bool grouped = false;
    for (int round = 0; round < 10 && !grouped; ++round) {
        INFO("round " << round);
        std::vector<caught> got(n);
        std::latch all_caught(n);
        std::atomic<int> entered{0}, done{0};
        const auto take = [&](int i) {
            caught& c = got[static_cast<std::size_t>(i)];
            bool arrived = false;
            try {
                ++entered;
                c.type = q.take(120s) ? "a job" : "nothing";
            } catch (const pg::error& e) {
                c.record(e, dynamic_cast<const pg::connection_error*>(&e) ? "connection_error"
                                                                          : "other error");
                c.sqlstate = e.sqlstate();
                ++done;
                all_caught.arrive_and_wait();
                arrived = true;
                c.read_apart(e);
            } catch (...) {
                c.type = "another exception";
            }
            if (!arrived) {
                ++done;
                all_caught.arrive_and_wait();
            }
        };
        session locker;
        locker.lock();
        std::vector<std::jthread> ts;  // joined however the round ends
        ts.emplace_back(take, 0);      // leads, and claims for itself alone
        REQUIRE(eventually([&] { return !waiting_claim().empty(); }, 60s));
        for (int i = 1; i < n; ++i) ts.emplace_back(take, i);
        while (entered < n) std::this_thread::yield();
        // Not a bound: a take late for the next claim only makes this round not count.
        std::this_thread::sleep_for(300ms);
        // Cancel each claim as it waits for the lock, until every take failed.
        int claims = 0;
        std::string last;
        const auto give_up = steady::now() + 120s;  // a hang guard, not a measure
        while (done < n && steady::now() < give_up) {
            const std::string w = waiting_claim();
            if (w.empty() || w == last) {
                std::this_thread::sleep_for(10ms);
                continue;
            }
            last = w;
            ++claims;
            server().query("SELECT pg_cancel_backend(" + w.substr(0, w.find(' ')) + ")");
        }
        for (auto& t : ts) t.join();
        locker.unlock();
        INFO("the " << n << " takes made " << claims << " claim(s)");
        grouped = claims < n;

        for (const caught& c : got) {
            INFO(c.type << ": " << c.message);
            REQUIRE(c.type == "connection_error");
            CHECK(c.sqlstate == "57014");
            CHECK(delayq::test::contains(c.message, "canceling statement due to user request"));
        }
        delayq::test::check_apart(got);
    }
    CHECK(grouped);
}

TEST_CASE("postgres: a connection that died while idle is replaced: the next call works",
          "[postgres][timeouts][idle]") {
    // Terminates the listening backend of `app` and waits until it is gone (a take that waits
    // may have listened anew by then, on another backend).
    const auto terminate_listener = [](const std::string& app) {
        const std::string pid =
            server().query("SELECT pid FROM pg_stat_activity WHERE application_name = '" + app +
                           "' AND query LIKE 'LISTEN%'");
        REQUIRE(!pid.empty());
        REQUIRE(server().query("SELECT pg_terminate_backend(" + pid + ")") == "t");
        REQUIRE(eventually(
            [&] {
                return server().query("SELECT count(*) FROM pg_stat_activity WHERE pid = " + pid) ==
                       "0";
            },
            5s));
    };
    SECTION("the listening connection terminated between takes") {
        const std::string app = "dq-idle-" + std::to_string(::getpid()) + "-1";
        auto o = opts(fresh_name("idle"));
        o.conninfo += " application_name=" + app;
        o.io_timeout = 2s;
        pg::delay_queue q(o);
        CHECK_FALSE(q.take(100ms));  // listens
        terminate_listener(app);
        REQUIRE(q.put_after("a", "x", 0ms));
        std::optional<delayq::job> j;
        try {
            j = q.take(2s);
        } catch (const std::exception& e) {
            FAIL("the take threw: " << e.what());
        }
        REQUIRE(j);
        CHECK(q.ack(*j));
    }
    SECTION("the listening connection terminated while a take waits") {
        const std::string app = "dq-idle-" + std::to_string(::getpid()) + "-2";
        auto o = opts(fresh_name("idle"));
        o.conninfo += " application_name=" + app;
        o.io_timeout = 2s;
        pg::delay_queue q(o);
        pg::delay_queue producer(opts(o.name));
        std::optional<delayq::job> j;
        std::string threw;
        std::jthread taker([&] {
            try {
                j = q.take(10s);
            } catch (const std::exception& e) {
                threw = e.what();
            }
        });
        REQUIRE(eventually(
            [&] {
                return server().query(
                           "SELECT count(*) FROM pg_stat_activity WHERE "
                           "application_name = '" +
                           app + "' AND query LIKE 'LISTEN%'") == "1";
            },
            5s));
        std::this_thread::sleep_for(100ms);
        terminate_listener(app);
        REQUIRE(producer.put_after("b", "x", 0ms));
        taker.join();
        CHECK(threw == "");
        REQUIRE(j);
        CHECK(q.ack(*j));
    }
    SECTION("the pooled connections terminated while idle") {
        const std::string app = "dq-idle-" + std::to_string(::getpid()) + "-3";
        auto o = opts(fresh_name("idle"));
        o.conninfo += " application_name=" + app;
        o.io_timeout = 2s;
        pg::delay_queue q(o);
        REQUIRE(q.size() == 0);
        REQUIRE(server().query("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = '" +
                               app + "'") == "1");
        REQUIRE(eventually([&] { return backends(app, false) == 0; }, 5s));
        try {
            CHECK(q.put_after("d", "x", 0ms));
            CHECK(q.size() == 1);
        } catch (const std::exception& e) {
            FAIL("a call after the terminate threw: " << e.what());
        }
    }
    SECTION("a fast restart of the server") {
        // The process's server: a restart keeps its port, and no other case runs meanwhile.
        auto o = opts(fresh_name("idle"));
        o.io_timeout = 2s;
        pg::delay_queue q(o);
        CHECK_FALSE(q.take(100ms));  // a pooled connection and a listening one, idle now
        server().stop();             // SIGINT: a fast shutdown; the backends say goodbye
        server().start();
        try {
            CHECK(q.size() == 0);
            REQUIRE(q.put_after("c", "x", 0ms));
            auto j = q.take(2s);
            REQUIRE(j);
            CHECK(q.ack(*j));
        } catch (const std::exception& e) {
            FAIL("a call after the restart threw: " << e.what());
        }
    }
}

TEST_CASE(
    "postgres: pause, resume and paused fail within io_timeout on a stalled server and on "
    "a stopped one, then work",
    "[postgres][timeouts][pause]") {
    const auto each_fails = [](pg::delay_queue& q, double limit) {
        const std::pair<const char*, std::function<void()>> calls[] = {
            {"pause", [&] { q.pause(); }}, {"resume", [&] { q.resume(); }}, {"paused", [&] {
                                                                                 (void)q.paused();
                                                                             }}};
        for (const auto& c : calls) {
            INFO(c.first);
            const auto start = steady::now();
            CHECK_THROWS_AS(c.second(), pg::connection_error);
            CHECK(seconds_since(start) < limit);
        }
    };
    SECTION("a lock on the paused table") {
        auto o = opts(fresh_name("stall-pause"));
        o.io_timeout = 500ms;
        o.connections = 1;  // the one the constructor prepared
        const auto opened = open_patiently(o);
        pg::delay_queue& q = *opened;
        session locker;
        locker.exec("BEGIN");
        locker.exec("LOCK TABLE delayq.paused IN ACCESS EXCLUSIVE MODE");
        each_fails(q, 2.5);  // io_timeout 0.5 s plus a connect; 1.5 s more for a loaded machine
        locker.unlock();
        q.pause();
        CHECK(q.paused());
        q.resume();
        CHECK_FALSE(q.paused());
    }
    SECTION("a server that is stopped") {
        delayq_pg_test::pg_server srv;
        auto o = opts(fresh_name("stopped-pause"), srv);
        o.io_timeout = 1s;
        pg::delay_queue q(o);
        srv.stop();
        each_fails(q, 4.0);  // io_timeout 1 s plus a connect (1 s); 2 s more for a loaded machine
        srv.start();
        q.pause();
        CHECK(q.paused());
        q.resume();
        CHECK_FALSE(q.paused());
    }
}
