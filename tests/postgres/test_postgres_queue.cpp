// delayq::postgres::delay_queue beyond the contract suite: processes that start at once on a new
// server, a job that kills its consumer, a cancel from another process, a server killed and
// restarted, a failover to a promoted standby, the typed errors, the put inside the caller's
// transaction, an idle consumer's statements, a wake-up whose earlier job goes before it
// commits, extend's wake-up, many takes sharing one object, the upgrade of tables made before the
// last errors (in place, by openers racing, by a role that may not), last errors' bytes, and the
// dead letters' upkeep (requeue_dead's wake-up, purge_dead's batches, keep_dead's bound), and
// pausing (a pause and a resume from another process, a paused take that does not claim again
// and again, two queues of one schema, the put in the caller's transaction while paused, the
// paused table added to older tables with their grants), limits (takes of two objects racing
// under max_leased, the claim's lock in the claim's transaction, takes held back that do not claim
// again and again, a cancel that frees a place, the index and table added to older tables) and
// stats (at a million jobs), a page of jobs() on a table not analyzed yet, the names of the
// prepared statements, and repeatable jobs (the server's next run against the C++ one, racing
// settles of one run, the wake-up of a next run, the columns and function added to older tables).
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <delayq/detail/job_queue/repeat.hpp>
#include <delayq/postgres/delay_queue.hpp>
#include <fstream>
#include <latch>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "expect_error.hpp"
#include "pg_conn.hpp"
#include "pg_fixture.hpp"

using namespace std::chrono_literals;
using delayq::test::contains;
using delayq::test::message_of;
using delayq_pg_test::app_conn;
using delayq_pg_test::fresh_name;
using delayq_pg_test::opts;
using delayq_pg_test::server;
namespace pg = delayq::postgres;

namespace {

// Runs the helper with `args` (already quoted for the shell); its stdout, or the exit status.
struct helper_run {
    FILE* f;
    explicit helper_run(const std::string& args)
        : f(::popen((std::string(DELAYQ_PG_HELPER) + " " + args).c_str(), "r")) {}
    std::string output(int* status = nullptr) {
        std::string out;
        char buf[256];
        while (std::fgets(buf, sizeof buf, f)) out += buf;
        const int st = ::pclose(f);
        if (status) *status = st;
        return out;
    }
};

std::string quoted(const std::string& s) {
    return "'" + s + "'";
}

}  // namespace

TEST_CASE("postgres: processes that start at once on a new schema all succeed, nothing lost",
          "[postgres][processes]") {
    const std::string schema = "race_" + std::to_string(::getpid());
    const std::string name = fresh_name("race");
    constexpr int n = 8;
    std::vector<helper_run> runs;
    for (int i = 0; i < n; ++i)
        runs.emplace_back("put " + quoted(server().conninfo()) + " " + schema + " " + name +
                          " job" + std::to_string(i));
    for (auto& r : runs) {
        int status = 0;
        CHECK(r.output(&status) == "1\n");
        CHECK(status == 0);
    }
    auto o = opts(name);
    o.schema = schema;
    pg::delay_queue q(o);
    CHECK(q.size() == n);
}

TEST_CASE("postgres: a job that kills its consumer is dead-lettered after max_attempts deliveries",
          "[postgres][processes]") {
    const std::string name = fresh_name("poison");
    auto o = opts(name);
    o.lease = 300ms;
    o.max_attempts = 2;
    pg::delay_queue q(o);
    REQUIRE(q.put_after("poison", "boom", 0ms));
    std::vector<std::string> deliveries;
    for (int round = 0; round < 10 && q.dead_size() == 0; ++round) {
        auto out = helper_run("crash " + quoted(server().conninfo()) + " " + name + " 2").output();
        if (!out.empty()) deliveries.push_back(out);
    }
    REQUIRE(deliveries.size() == 2);
    CHECK(deliveries[0] == "poison 1\n");
    CHECK(deliveries[1] == "poison 2\n");
    CHECK(q.dead_size() == 1);
    CHECK(q.size() == 0);
    CHECK_FALSE(q.take(0ms));
}

TEST_CASE("postgres: a cancel from another process: no take after it hands the job out",
          "[postgres][processes]") {
    const std::string name = fresh_name("cancel");
    pg::delay_queue q(opts(name));
    REQUIRE(q.put_after("order-1", "x", 0ms));
    REQUIRE(q.put_after("order-2", "x", 0ms));
    auto held = q.take(5s);  // one leased, one waiting
    REQUIRE(held);
    const std::string other = held->id == "order-1" ? "order-2" : "order-1";
    CHECK(helper_run("cancel " + quoted(server().conninfo()) + " " + name + " " + other).output() ==
          "1\n");
    CHECK(helper_run("cancel " + quoted(server().conninfo()) + " " + name + " " + held->id)
              .output() == "1\n");
    CHECK_FALSE(q.take(300ms));
    CHECK_FALSE(q.ack(*held));
    CHECK(q.size() == 0);
}

TEST_CASE(
    "postgres: a server killed and restarted: calls fail with connection_error, then work, "
    "nothing lost, no lease honoured twice",
    "[postgres][restart]") {
    delayq_pg_test::pg_server srv;
    auto o = opts("restart", srv);
    o.io_timeout = 2s;
    pg::delay_queue q(o);
    for (int i = 0; i < 50; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "x", 0ms));
    auto held = q.take(5s);
    REQUIRE(held);

    // A take waiting on an empty queue of another name learns of the kill, within seconds.
    pg::delay_queue idle(opts("restart-idle", srv));
    std::atomic<int> outcome{0};  // 1: connection_error, 2: something else
    std::thread waiter([&] {
        try {
            idle.take(30s);
            outcome = 2;
        } catch (const pg::connection_error&) {
            outcome = 1;
        } catch (...) {
            outcome = 2;
        }
    });
    std::this_thread::sleep_for(300ms);  // most likely asleep listening by now; either way works
    srv.kill9();
    waiter.join();
    CHECK(outcome == 1);

    CHECK_THROWS_AS(q.put_after("during", "x", 0ms), pg::connection_error);
    CHECK_THROWS_AS(q.size(), pg::connection_error);
    CHECK_THROWS_AS(q.size(), delayq::unavailable_error);  // any backend's "retry later"
    CHECK_THROWS_AS(q.size(), delayq::queue_error);
    srv.start();
    // The retry of a put that failed returns true once (or false if the failed one was applied).
    bool put = false;
    for (int i = 0; i < 50 && !put; ++i) {
        try {
            put = q.put_after("during", "x", 0ms) || true;
        } catch (const pg::connection_error&) {
            std::this_thread::sleep_for(100ms);
        }
    }
    REQUIRE(put);
    CHECK(q.size() == 51);
    std::set<std::string> seen;
    // "during", due now, is due at the server's next millisecond: the takes wait for the jobs
    // expected (returning as soon as one is due), then look without waiting for any more.
    while (auto j = q.take(seen.size() < 50 ? 5s : 0ms)) {
        CHECK(j->id != held->id);  // its lease survived the crash
        CHECK(j->token != held->token);
        seen.insert(j->id);
        CHECK(q.ack(*j));
    }
    CHECK(seen.size() == 50);
    CHECK(q.ack(*held));
    CHECK_FALSE(q.ack(*held));
    CHECK(q.size() == 0);

    // The waiting take's object works again too.
    CHECK_FALSE(idle.take(0ms));
}

TEST_CASE(
    "postgres: a lease and an ack that returned outlive a crash of the server: the attempt stays "
    "counted and the acked job stays gone",
    "[postgres][restart]") {
    // kill -9 right after the calls return: a commit that returned before its WAL reached the
    // disk would be undone by the crash (the job dead after one delivery comes back with
    // attempts 1, the acked one comes back at all).
    delayq_pg_test::pg_server srv;
    auto o = opts("crash-after-lease", srv);
    o.max_attempts = 1;
    o.lease = 300ms;
    o.io_timeout = 2s;
    pg::delay_queue q(o);
    int undone = 0;
    std::string what;
    for (int round = 0; round < 3; ++round) {
        const std::string a = "a" + std::to_string(round), b = "b" + std::to_string(round);
        REQUIRE(q.put_after(a, "x", 0ms));
        REQUIRE(q.put_after(b, "x", 0ms));
        auto first = q.take(5s);
        auto second = q.take(5s);
        REQUIRE(first);
        REQUIRE(second);
        REQUIRE(q.ack(*second));  // `first` is left to its lease, its one attempt used
        srv.kill9();
        srv.start();
        std::this_thread::sleep_for(o.lease + 100ms);
        std::optional<delayq::job> again;
        for (int i = 0; i < 50; ++i) {
            try {
                again = q.take(500ms);
                break;
            } catch (const pg::connection_error&) {
                std::this_thread::sleep_for(100ms);
            }
        }
        if (again) {
            ++undone;
            what += "round " + std::to_string(round) + ": " + again->id +
                    " handed out again, attempts " + std::to_string(again->attempts) + "; ";
            q.ack(*again);
        }
    }
    INFO(what);
    CHECK(undone == 0);
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 3);
}

TEST_CASE(
    "postgres: a failover to a promoted standby: calls fail with connection_error, then work "
    "against the new primary, nothing acknowledged lost, no lease honoured twice",
    "[postgres][failover]") {
    // A primary with a synchronous standby (its commits wait for the standby's disk too), and a
    // conninfo that names both and wants the one that takes writes, as docs/postgres.md says.
    delayq_pg_test::pg_server primary;
    const auto standby = delayq_pg_test::pg_server::standby_of(primary, {"cluster_name=standby1"});
    primary.exec("ALTER SYSTEM SET synchronous_standby_names = 'standby1'");
    primary.exec("SELECT pg_reload_conf()");
    for (int i = 0;
         primary.query("SELECT string_agg(sync_state, ',') FROM pg_stat_replication") != "sync";
         ++i) {
        REQUIRE(i < 400);  // 20 s
        std::this_thread::sleep_for(50ms);
    }
    auto o = opts("failover", primary);
    o.conninfo = "host=127.0.0.1,127.0.0.1 port=" + std::to_string(primary.port()) + "," +
                 std::to_string(standby->port()) +
                 " user=postgres dbname=postgres target_session_attrs=read-write "
                 "connect_timeout=2";
    o.io_timeout = 2s;
    pg::delay_queue q(o);
    for (int i = 0; i < 20; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "x", 0ms));
    auto held = q.take(5s);
    REQUIRE(held);

    // A take waiting in another object learns of the failover.
    auto idle_options = o;
    idle_options.name = "failover-idle";
    pg::delay_queue idle(idle_options);
    std::atomic<int> outcome{0};  // 1: connection_error, 2: something else
    std::thread waiter([&] {
        try {
            idle.take(30s);
            outcome = 2;
        } catch (const pg::connection_error&) {
            outcome = 1;
        } catch (...) {
            outcome = 2;
        }
    });
    std::this_thread::sleep_for(300ms);
    primary.kill9();  // the primary's machine is gone
    waiter.join();
    CHECK(outcome == 1);
    // The standby is still read-only: no server takes writes, a retryable error.
    CHECK_THROWS_AS(q.put_after("during", "x", 0ms), pg::connection_error);

    standby->promote();
    bool put = false;
    for (int i = 0; i < 50 && !put; ++i) {
        try {
            put = q.put_after("during", "x", 0ms) || true;  // false: the failed try was applied
        } catch (const pg::connection_error&) {
            std::this_thread::sleep_for(100ms);
        }
    }
    REQUIRE(put);
    CHECK(q.size() == 21);  // every put that returned, on the new primary

    // The lease's commit waited for the standby (durable_leases, the default), so it holds on the
    // new primary and fences the job; with durable_leases false it may have been lost, and the
    // job comes again with another token. Either way, never both.
    std::set<std::string> seen;
    bool again = false;
    // "during", due now, is due at the server's next millisecond: the takes wait for it and for
    // the 20 jobs due at least (returning as soon as one is due), then look without waiting for
    // the held one.
    while (auto j = q.take(seen.size() < 20 || seen.count("during") == 0 ? 5s : 0ms)) {
        if (j->id == held->id) {
            again = true;
            CHECK(j->token != held->token);
        }
        seen.insert(j->id);
        CHECK(q.ack(*j));
    }
    const bool held_ack = q.ack(*held);
    CHECK(held_ack != again);
    CHECK(seen.size() == (again ? 21u : 20u));
    CHECK(q.size() == 0);
    CHECK_FALSE(idle.take(0ms));  // the waiting take's object works again too
}

TEST_CASE(
    "postgres: a job put with a delay, nacked or rescheduled is never handed out before the call "
    "plus the delay",
    "[postgres][time]") {
    // The server's clock judges, in whole ms; the test's server shares the test's clock, so a
    // hand-out before (call + delay) by that clock is early by the server's too.
    pg::delay_queue q(opts(fresh_name("early")));
    using sys = std::chrono::system_clock;
    int early = 0;
    for (int i = 0; i < 20; ++i) {
        const std::string id = "e" + std::to_string(i);
        auto called = sys::now();
        REQUIRE(q.put_after(id, "x", 15ms));
        auto j = q.take(5s);
        REQUIRE(j);
        if (sys::now() < called + 15ms) ++early;
        called = sys::now();
        REQUIRE(q.nack(*j, 15ms));
        j = q.take(5s);
        REQUIRE(j);
        if (sys::now() < called + 15ms) ++early;
        REQUIRE(q.ack(*j));
        REQUIRE(q.put_after(id, "x", 1h));
        called = sys::now();
        REQUIRE(q.reschedule(id, 15ms));
        j = q.take(5s);
        REQUIRE(j);
        if (sys::now() < called + 15ms) ++early;
        REQUIRE(q.ack(*j));
    }
    CHECK(early == 0);
}

TEST_CASE("postgres: a schema of another version is a schema_version_error", "[postgres][errors]") {
    const std::string schema = "v_" + std::to_string(::getpid());
    auto o = opts(fresh_name("version"));
    o.schema = schema;
    { pg::delay_queue q(o); }
    server().exec("UPDATE " + schema + ".meta SET value = 2 WHERE name = 'version'");
    const auto m = message_of<pg::schema_version_error>([&] { pg::delay_queue q(o); });
    CHECK(contains(m, "version 2"));
    CHECK(contains(m, "newer"));
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_CASE("postgres: a missing privilege is a permission_error naming it", "[postgres][errors]") {
    const std::string role = "nobody_" + std::to_string(::getpid());
    server().exec("CREATE ROLE " + role + " LOGIN");
    // No schema, and no right to create one in the database.
    auto o = opts(fresh_name("perm"));
    o.conninfo = server().conninfo(role);
    o.schema = "perm_" + std::to_string(::getpid());
    auto m = message_of<pg::permission_error>([&] { pg::delay_queue q(o); });
    CHECK(contains(m, "permission denied"));

    // The tables exist; the role may read them, not write.
    o.conninfo = server().conninfo();
    { pg::delay_queue q(o); }
    server().exec("GRANT USAGE ON SCHEMA " + o.schema + " TO " + role + "; GRANT SELECT ON ALL " +
                  "TABLES IN SCHEMA " + o.schema + " TO " + role);
    o.conninfo = server().conninfo(role);
    pg::delay_queue q(o);
    CHECK(q.size() == 0);
    m = message_of<pg::permission_error>([&] { q.put_after("a", "x", 0ms); });
    CHECK(contains(m, "permission denied for table jobs"));
    try {
        q.put_after("a", "x", 0ms);
    } catch (const pg::permission_error& e) {
        CHECK(e.sqlstate() == "42501");
    }
}

TEST_CASE("postgres: a server older than PostgreSQL 12 is refused", "[postgres][errors]") {
    const auto m =
        message_of<pg::server_version_error>([] { pg::detail::check_server_version(110022); });
    CHECK(contains(m, "PostgreSQL 11"));
    CHECK(contains(m, "needs PostgreSQL 12"));
    pg::detail::check_server_version(120000);  // accepted
}

TEST_CASE("postgres: bad options and ids are std::invalid_argument", "[postgres][errors]") {
    auto o = opts("x");
    o.name = "";
    CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    o = opts("x");
    o.schema = "Bad-Schema";
    CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    o = opts("x");
    o.lease = 0ms;
    CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    o = opts("x");
    o.io_timeout = 0ms;
    CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    o = opts("x");
    o.connections = 0;
    CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    o = opts("x");
    o.keep_dead = -1ms;
    CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    pg::delay_queue q(opts(fresh_name("ids")));
    CHECK_THROWS_AS(q.put_after("", "x", 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.put_after(std::string(1025, 'i'), "x", 0ms), std::invalid_argument);
    CHECK(q.put_after(std::string(1024, 'i'), "x", 0ms));
    CHECK_THROWS_AS(q.requeue_dead("", 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.requeue_dead(std::string(1025, 'i'), 0ms), std::invalid_argument);
    CHECK_FALSE(q.requeue_dead(std::string(1024, 'i'), 0ms));  // queued, not dead
}

TEST_CASE(
    "postgres: no server, or one that never answers, is a connection_error within "
    "io_timeout",
    "[postgres][errors]") {
    auto o = opts("x");
    o.conninfo = "host=127.0.0.1 port=" + std::to_string(delayq_test::free_port()) +
                 " user=postgres dbname=postgres";
    CHECK_THROWS_AS(pg::delay_queue(o), pg::connection_error);

    const delayq_pg_test::silent_host silent;
    o.conninfo = "host=127.0.0.1 port=" + std::to_string(silent.port) +
                 " user=postgres dbname=postgres sslmode=disable";
    o.io_timeout = 300ms;
    const auto start = std::chrono::steady_clock::now();
    const auto m = message_of<pg::connection_error>([&] { pg::delay_queue q(o); });
    CHECK(std::chrono::steady_clock::now() - start < 5s);  // 300 ms; seconds would be broken
    CHECK(contains(m, "io_timeout"));
}

TEST_CASE("postgres: a put in the caller's transaction exists exactly when it commits",
          "[postgres][transaction]") {
    const std::string name = fresh_name("tx");
    pg::delay_queue q(opts(name));
    app_conn app(server().conninfo());
    app_conn listener(server().conninfo());
    listener.exec(("LISTEN " + q.channel()).c_str());

    SECTION("rolled back: no job, no wake-up") {
        app.exec("BEGIN");
        CHECK(q.put_after_in_transaction(app.c, "order-1", "cancel", 0ms));
        CHECK_FALSE(q.put_after_in_transaction(app.c, "order-1", "again", 0ms));  // queued
        CHECK(q.size() == 0);  // not committed: nobody else sees it
        app.exec("ROLLBACK");
        CHECK(q.size() == 0);
        CHECK_FALSE(q.take(300ms));
        // Notifications come in commit order: after a later commit's, none came from the
        // rollback.
        app.exec("BEGIN");
        CHECK(q.put_after_in_transaction(app.c, "order-9", "x", 1h));
        app.exec("COMMIT");
        int n = 0;
        for (int i = 0; i < 100 && n == 0; ++i) {
            std::this_thread::sleep_for(50ms);
            listener.exec("SELECT 1");
            n = listener.notifications();
        }
        std::this_thread::sleep_for(200ms);
        listener.exec("SELECT 1");
        n += listener.notifications();
        CHECK(n == 1);
    }
    SECTION("committed: the job, and a waiting take is woken") {
        std::optional<delayq::job> got;
        std::thread taker([&] { got = q.take(30s); });
        std::this_thread::sleep_for(300ms);  // most likely asleep listening by now
        app.exec("BEGIN");
        CHECK(q.put_in_transaction(app.c, "order-2", "cancel",
                                   std::chrono::system_clock::now() - 1s));
        app.exec("COMMIT");
        taker.join();
        REQUIRE(got);
        CHECK(got->id == "order-2");
        CHECK(got->payload == "cancel");
        CHECK(q.ack(*got));
    }
    SECTION("one round trip on the caller's connection") {
        app.exec("BEGIN");
        char path[] = "/tmp/delayq-pg-trace-XXXXXX";
        const int fd = ::mkstemp(path);
        REQUIRE(fd >= 0);
        FILE* trace = ::fdopen(fd, "w");
        PQtrace(app.c, trace);
        CHECK(q.put_after_in_transaction(app.c, "order-3", "x", 30min));
        PQuntrace(app.c);
        std::fclose(trace);
        app.exec("COMMIT");
        std::ifstream in(path);
        int syncs = 0, sent = 0;
        for (std::string line; std::getline(in, line);) {
            if (line.find("\tF\t") == std::string::npos) continue;  // what the client sent
            ++sent;
            if (contains(line, "Sync")) ++syncs;
        }
        ::unlink(path);
        CHECK(sent > 0);
        CHECK(syncs == 1);  // one exchange: Parse, Bind, Describe, Execute, Sync
        CHECK(q.size() == 1);
    }
    SECTION("not inside a transaction block: std::invalid_argument") {
        CHECK_THROWS_AS(q.put_after_in_transaction(app.c, "x", "y", 0ms), std::invalid_argument);
        CHECK_THROWS_AS(q.put_after_in_transaction(nullptr, "x", "y", 0ms), std::invalid_argument);
    }
}

TEST_CASE("postgres: a cancel in the caller's transaction takes effect exactly when it commits",
          "[postgres][transaction]") {
    const std::string name = fresh_name("txc");
    pg::delay_queue q(opts(name));
    pg::delay_queue other(opts(name));
    app_conn app(server().conninfo());
    REQUIRE(q.put_after("order-1", "cancel unless paid", 0ms));
    REQUIRE(q.put_after("order-2", "cancel unless paid", 1h));

    // Rolled back: the job stays, as it was. While the transaction is open, no take hands out
    // the job it cancels (its row is locked), and none waits for it either.
    app.exec("BEGIN");
    CHECK(q.cancel_in_transaction(app.c, "order-1"));
    CHECK_FALSE(q.cancel_in_transaction(app.c, "order-1"));  // gone, as this transaction sees
    CHECK_FALSE(q.cancel_in_transaction(app.c, "never-put"));
    CHECK(other.size() == 2);  // not committed: nobody else sees it gone
    CHECK_FALSE(other.take(0ms));
    app.exec("ROLLBACK");
    auto j = other.take(5s);
    REQUIRE(j);
    CHECK(j->id == "order-1");

    // Committed: gone, the leased one too, and its holder's ack is refused.
    app.exec("BEGIN");
    CHECK(q.cancel_in_transaction(app.c, "order-1"));
    CHECK(q.cancel_in_transaction(app.c, "order-2"));
    app.exec("COMMIT");
    CHECK(q.size() == 0);
    CHECK_FALSE(q.get("order-1").has_value());
    CHECK_FALSE(other.ack(*j));

    // A job put in the same transaction is cancelled with it.
    app.exec("BEGIN");
    CHECK(q.put_after_in_transaction(app.c, "order-3", "x", 0ms));
    CHECK(q.cancel_in_transaction(app.c, "order-3"));
    app.exec("COMMIT");
    CHECK(q.size() == 0);
    CHECK_FALSE(q.take(300ms));

    // Not inside a transaction block: std::invalid_argument, naming the call.
    CHECK_THROWS_AS(q.cancel_in_transaction(nullptr, "x"), std::invalid_argument);
    const auto no_tx =
        message_of<std::invalid_argument>([&] { q.cancel_in_transaction(app.c, "x"); });
    CHECK(contains(no_tx, "cancel_in_transaction"));
    CHECK(contains(no_tx, "BEGIN"));
    app.exec("BEGIN");
    CHECK_THROWS_AS(q.cancel_in_transaction(app.c, ""), std::invalid_argument);
    app.exec("ROLLBACK");
}

TEST_CASE("postgres: an idle consumer sends no statement while nothing is due",
          "[postgres][idle]") {
    // A server of its own that logs every statement with the client's application_name.
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|"});
    auto o = opts("idle", srv);
    o.conninfo += " application_name=idle-consumer";
    pg::delay_queue consumer(o);
    pg::delay_queue producer(opts("idle", srv));
    const auto claims = [&] {
        std::ifstream in(srv.log());
        int n = 0;
        for (std::string line; std::getline(in, line);)
            if (line.rfind("idle-consumer|", 0) == 0 && contains(line, "execute dq4")) ++n;
        return n;
    };
    CHECK_FALSE(consumer.take(2s));  // an empty queue: one claim on entry, none while waiting
    CHECK(claims() == 1);

    // A job due in 1.5 s: the put wakes the consumer (one claim, which learns when it is due),
    // which sleeps until then (one more claim, which takes it).
    std::optional<delayq::job> got;
    std::thread taker([&] { got = consumer.take(30s); });
    std::this_thread::sleep_for(300ms);
    REQUIRE(producer.put_after("later", "x", 1500ms));
    taker.join();
    REQUIRE(got);
    CHECK(consumer.ack(*got));
    CHECK(claims() <= 4);  // entry, the put's wake-up, the due time (and at most one spurious)
}

namespace {

// Waits (up to 20 s, then fails the test) until `sql`, run as the superuser, returns "t": for
// steps of a test that must happen in an order the server shows (a statement waiting for a lock,
// a statement done).
void wait_for(const std::string& sql, const char* what) {
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (server().query(sql) != "t") {
        INFO(what);
        REQUIRE(std::chrono::steady_clock::now() < until);
        std::this_thread::sleep_for(5ms);
    }
}

}  // namespace

TEST_CASE(
    "postgres: a put whose earlier job is acked before the put commits still wakes an idle "
    "consumer",
    "[postgres][wake]") {
    // A put need not wake the consumers when an earlier job (here a lease that ends earlier)
    // already makes them wake before its job is due. But that earlier job may go (acked,
    // cancelled) before the put commits, and a consumer that looks in between sees neither: it
    // must still be woken, or the put's job waits for the consumer's max_wait.
    const std::string name = fresh_name("witness");
    auto o = opts(name);
    o.lease = 3s;
    pg::delay_queue holder(o);
    auto producer_options = opts(name);
    producer_options.conninfo += " application_name=witness-producer";
    pg::delay_queue producer(producer_options);
    auto consumer_options = opts(name);
    consumer_options.conninfo += " application_name=witness-consumer";
    pg::delay_queue consumer(consumer_options);

    REQUIRE(holder.put_after("earlier", "x", 0ms));
    auto earlier = holder.take(5s);  // leased: its lease ends in 3 s, before the put's job
    REQUIRE(earlier);

    // The application holds the put's key in an open transaction, so the put's statement, once
    // it has looked at the queue, waits for it.
    app_conn app(server().conninfo());
    app.exec("BEGIN");
    app.exec(
        ("INSERT INTO delayq.jobs(queue, id, payload, at) VALUES ('" + name + "', 'later', '', 0)")
            .c_str());
    std::atomic<bool> put{false};
    std::thread putter([&] { put = producer.put_after("later", "x", 3500ms); });
    wait_for(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = "
        "'witness-producer' AND wait_event_type = 'Lock')",
        "the put waits for the application's transaction");

    REQUIRE(holder.ack(*earlier));  // the earlier job goes before the put commits

    std::optional<delayq::job> got;
    std::thread taker([&] { got = consumer.take(15s); });
    // The consumer has looked (and found nothing: the put has not committed) and sleeps.
    wait_for(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = "
        "'witness-consumer' AND state = 'idle' AND query LIKE '%SKIP LOCKED%')",
        "the consumer has claimed once");
    app.exec("ROLLBACK");  // the put goes on and commits
    putter.join();
    CHECK(put);
    taker.join();
    REQUIRE(got);  // not after 15 s with nothing: woken, it took the job when it came due
    CHECK(got->id == "later");
    CHECK(consumer.ack(*got));
}

TEST_CASE(
    "postgres: extend notifies the consumers when it makes a lease end earlier, and only then",
    "[postgres][wake]") {
    // A consumer sleeps until the earliest `at` it saw, a lease's end among them: a lease made
    // shorter must wake it (the contract suite checks that it does), and a lease made longer, as
    // a worker's heartbeat does all the time, must not wake every consumer of the queue.
    const std::string name = fresh_name("extend");
    auto o = opts(name);
    o.lease = 60s;
    pg::delay_queue q(o);
    app_conn listener(server().conninfo());
    listener.exec("LISTEN " + q.channel());
    // The notifications that come within `within` (the first one ends the wait), and a little
    // after.
    const auto heard = [&](std::chrono::milliseconds within) {
        const auto until = std::chrono::steady_clock::now() + within;
        int n = 0;
        do {
            std::this_thread::sleep_for(50ms);
            listener.exec("SELECT 1");
            n += listener.notifications();
        } while (n == 0 && std::chrono::steady_clock::now() < until);
        std::this_thread::sleep_for(100ms);
        listener.exec("SELECT 1");
        return n + listener.notifications();
    };
    REQUIRE(q.put_after("x", "p", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    (void)heard(300ms);  // the put's
    CHECK(q.extend(*j, 120s));
    CHECK(heard(500ms) == 0);
    CHECK(q.extend(*j, 30s));
    CHECK(heard(5s) == 1);
    CHECK(q.extend(*j, 30s));  // as long again: it ends no earlier than it did
    CHECK(heard(500ms) == 0);
    CHECK(q.ack(*j));
}

TEST_CASE(
    "postgres: many takes on one object, some giving up while a claim is in flight: every job "
    "out once",
    "[postgres][stress]") {
    // The waiting takes of an object share the leader's claims (see take_jobs): jobs are handed
    // to whichever take the claim was for, a take whose wait ends keeps waiting for a claim that
    // counts it, and take(0) claims beside them. Another object stands for another process.
    const std::string name = fresh_name("stress");
    auto o = opts(name);
    o.connections = 3;
    pg::delay_queue q(o);
    pg::delay_queue other(o);
    constexpr int producers = 2, per = 300, total = producers * per;
    std::atomic<int> acked{0}, duplicates{0}, failed{0};
    std::mutex seen_m;
    std::set<std::string> seen;
    const auto settle = [&](pg::delay_queue& from, std::vector<delayq::job> js) {
        for (auto& j : js) {
            {
                std::lock_guard lk(seen_m);
                if (!seen.insert(j.id).second) ++duplicates;
            }
            if (from.ack(j))
                ++acked;
            else
                ++failed;
        }
    };
    std::vector<std::thread> ts;
    for (int p = 0; p < producers; ++p)
        ts.emplace_back([&, p] {
            for (int i = 0; i < per; ++i)  // no Catch assertions off the main thread
                if (!q.put_after("p" + std::to_string(p) + "-" + std::to_string(i), "x",
                                 std::chrono::milliseconds((i * 7 + p * 13) % 300)))
                    ++failed;
        });
    for (int c = 0; c < 6; ++c)
        ts.emplace_back([&, c] {
            // Bounded: a lost job fails the checks below instead of hanging the test.
            const auto until = std::chrono::steady_clock::now() + 60s;
            for (int round = 0; acked < total && std::chrono::steady_clock::now() < until;
                 ++round) {
                switch ((c + round) % 4) {
                    case 0:  // gives up soon, often while the leader's claim is out
                        if (auto j = q.take(std::chrono::milliseconds(round % 3))) settle(q, {*j});
                        break;
                    case 1:
                        settle(q, q.take_many(1 + round % 5, 50ms));
                        break;
                    case 2:
                        if (auto j = q.take(0ms)) settle(q, {*j});
                        break;
                    default:
                        settle(other, other.take_many(3, 20ms));
                }
            }
        });
    for (auto& t : ts) t.join();
    CHECK(acked == total);
    CHECK(duplicates == 0);
    CHECK(failed == 0);
    CHECK(seen.size() == static_cast<std::size_t>(total));
    CHECK(q.size() == 0);
}

TEST_CASE("postgres: the waiting takes of one object share one claim", "[postgres][idle]") {
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|"});
    auto o = opts("shared", srv);
    o.conninfo += " application_name=shared-consumer";
    pg::delay_queue consumer(o);
    const auto claims = [&] {
        std::ifstream in(srv.log());
        int n = 0;
        for (std::string line; std::getline(in, line);)
            if (line.rfind("shared-consumer|", 0) == 0 && contains(line, "execute dq4")) ++n;
        return n;
    };
    // One take waits on the empty queue (one claim), then three more arrive: the object knows
    // that nothing is due, so they send nothing and wait with the first.
    std::vector<std::thread> ts;
    std::atomic<int> got{0};
    ts.emplace_back([&] { got += consumer.take(2s) ? 1 : 0; });
    for (int i = 0; i < 50 && claims() == 0; ++i) std::this_thread::sleep_for(20ms);
    REQUIRE(claims() == 1);
    for (int i = 0; i < 3; ++i) ts.emplace_back([&] { got += consumer.take(1s) ? 1 : 0; });
    for (auto& t : ts) t.join();
    CHECK(got == 0);
    CHECK(claims() == 1);
}

namespace {

// The schema `schema` as a delayq made before the last errors left it: no last_error columns, no
// dead_died index, no paused table, no jobs_leased index and no grants table (dropped, as the
// upgrade would find them on a database of that version).
void make_old_layout(const std::string& schema) {
    server().exec("ALTER TABLE " + schema + ".jobs DROP COLUMN last_error; ALTER TABLE " + schema +
                  ".dead DROP COLUMN last_error; DROP INDEX " + schema + ".dead_died; DROP TABLE " +
                  schema + ".paused; DROP INDEX " + schema + ".jobs_leased; DROP TABLE " + schema +
                  ".grants");
}

// The schema `schema` as a delayq made before limits left it: no jobs_leased index, no grants
// table.
void make_unlimited_layout(const std::string& schema) {
    server().exec("DROP INDEX " + schema + ".jobs_leased; DROP TABLE " + schema + ".grants");
}

// Whether schema `schema` has the jobs_leased index and the grants table.
bool has_limit_layout(const std::string& schema) {
    return server().query("SELECT to_regclass('" + schema + ".jobs_leased') IS NOT NULL AND " +
                          "to_regclass('" + schema + ".grants') IS NOT NULL") == "t";
}

// The schema `schema` as a delayq made before pause() left it: no paused table.
void make_unpausable_layout(const std::string& schema) {
    server().exec("DROP TABLE " + schema + ".paused");
}

// Whether schema `schema` has the paused table.
bool has_paused_table(const std::string& schema) {
    return server().query("SELECT to_regclass('" + schema + ".paused') IS NOT NULL") == "t";
}

// Whether schema `schema` has both last_error columns, the dead_died index, the paused table, the
// jobs_leased index and the grants table.
bool has_new_layout(const std::string& schema) {
    return server().query(
               "SELECT (SELECT count(*) FROM information_schema.columns WHERE table_schema = '" +
               schema +
               "' AND table_name IN ('jobs', 'dead') AND column_name = 'last_error') = 2 AND "
               "EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = '" +
               schema + "' AND indexname = 'dead_died')") == "t" &&
           has_paused_table(schema) && has_limit_layout(schema);
}

}  // namespace

TEST_CASE(
    "postgres: tables made before the last errors are upgraded in place when a queue opens, "
    "keeping their jobs and dead letters",
    "[postgres][upgrade]") {
    const std::string schema = "up_" + std::to_string(::getpid());
    auto o = opts(fresh_name("upgrade"));
    o.schema = schema;
    o.max_attempts = 2;
    {
        pg::delay_queue q(o);
        REQUIRE(q.put_after("waiting", "w", 1h));
        REQUIRE(q.put_after("dead", "d", 0ms));
        auto j = q.take(5s);
        REQUIRE(j);
        REQUIRE(q.bury(*j));
        REQUIRE(q.put_after("leased", "l", 0ms));
        REQUIRE(q.take(5s));
    }
    CHECK(has_new_layout(schema));
    make_old_layout(schema);
    REQUIRE_FALSE(has_new_layout(schema));

    pg::delay_queue q(o);
    CHECK(has_new_layout(schema));
    CHECK(q.size() == 2);
    CHECK(q.dead_size() == 1);
    auto i = q.get("waiting");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->payload == "w");
    CHECK(i->last_error.empty());
    i = q.get("leased");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->attempts == 1);
    const auto dead = q.dead(10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].id == "dead");
    CHECK(dead[0].payload == "d");
    CHECK(dead[0].last_error.empty());  // buried before there was a last error to keep

    // The new calls work on the upgraded tables.
    REQUIRE(q.reschedule("waiting", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "waiting");
    REQUIRE(q.nack(*j, 0ms, "after the upgrade"));
    j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 0ms));  // its second delivery: to the dead letters, keeping the reason
    const auto page = q.dead(10, "dead");
    REQUIRE(page.size() == 1);
    CHECK(page[0].id == "waiting");
    CHECK(page[0].attempts == 2);
    CHECK(page[0].last_error == "after the upgrade");
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_CASE("postgres: queues that open at once on tables made before the last errors all succeed",
          "[postgres][upgrade]") {
    const std::string schema = "upr_" + std::to_string(::getpid());
    auto o = opts(fresh_name("upgrade-race"));
    o.schema = schema;
    {
        pg::delay_queue q(o);
        REQUIRE(q.put_after("kept", "p", 1h));
    }
    make_old_layout(schema);

    // Every opener finds the columns missing before any adds them: the application holds the
    // advisory lock that the upgrade takes, until all of them wait for it.
    app_conn app(server().conninfo());
    app.exec("BEGIN");
    app.exec("SELECT pg_advisory_xact_lock(" + std::to_string(pg::detail::schema_lock_key) + ")");
    constexpr int n = 3;
    std::vector<std::thread> openers;
    std::atomic<int> opened{0};
    std::vector<std::string> errors(n);
    for (int k = 0; k < n; ++k)
        openers.emplace_back([&, k] {
            try {
                auto mine = o;
                mine.io_timeout = 20s;
                pg::delay_queue q(mine);
                if (q.get("kept").has_value()) ++opened;
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(k)] = e.what();
            }
        });
    wait_for("SELECT count(*) = " + std::to_string(n) +
                 " FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
             "every opener waits for the upgrade's lock");
    app.exec("COMMIT");
    for (auto& t : openers) t.join();
    for (const auto& e : errors) CHECK(e.empty());
    CHECK(opened == n);
    CHECK(has_new_layout(schema));
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_CASE("postgres: a queue opened on up-to-date tables takes no lock on them",
          "[postgres][upgrade]") {
    // The upgrade's DDL would take ACCESS EXCLUSIVE on jobs and dead even when it had nothing to
    // add, stalling every process at each open: here it would wait for the application's reads.
    auto o = opts(fresh_name("no-lock"));
    { pg::delay_queue q(o); }
    app_conn app(server().conninfo());
    app.exec("BEGIN");
    app.exec("LOCK TABLE delayq.jobs, delayq.dead IN ACCESS SHARE MODE");
    o.io_timeout = 2s;
    pg::delay_queue q(o);
    CHECK(q.put_after("a", "x", 0ms));
    app.exec("COMMIT");
}

TEST_CASE("postgres: a last error is binary-safe, and get() and dead() check their ids",
          "[postgres][lookup]") {
    auto o = opts(fresh_name("reason"));
    o.max_attempts = 3;
    pg::delay_queue q(o);
    const std::string reason("a\0b\xff\r\n", 6);
    REQUIRE(q.put_after("nacked", "p", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 1h, reason));
    auto i = q.get("nacked");
    REQUIRE(i);
    CHECK(i->last_error == reason);

    REQUIRE(q.put_after("buried", "p", 0ms));
    j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, reason + reason));
    i = q.get("buried");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->last_error == reason + reason);

    // A lease that ended reads as waiting, due when it ended.
    o.lease = 100ms;
    pg::delay_queue short_lease(o);
    REQUIRE(short_lease.put_after("ended", "p", 0ms));
    j = short_lease.take(5s);
    REQUIRE(j);
    std::this_thread::sleep_for(300ms);
    i = q.get("ended");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->time == std::chrono::time_point_cast<std::chrono::milliseconds>(j->lease_deadline));
    CHECK(i->attempts == 1);

    CHECK_THROWS_AS(q.get(""), std::invalid_argument);
    CHECK_THROWS_AS(q.get(std::string(delayq::max_id_size + 1, 'i')), std::invalid_argument);
    CHECK_FALSE(q.get(std::string(delayq::max_id_size, 'i')));
    CHECK_THROWS_AS(q.dead(10, std::string(delayq::max_id_size + 1, 'i')), std::invalid_argument);
    CHECK(q.dead(10, std::string(delayq::max_id_size, 'i')).empty());
}

TEST_CASE("postgres: a role that may use the tables but not alter them cannot upgrade them",
          "[postgres][upgrade][errors]") {
    const std::string role = "user_" + std::to_string(::getpid());
    const std::string schema = "upo_" + std::to_string(::getpid());
    server().exec("CREATE ROLE " + role + " LOGIN");
    auto o = opts(fresh_name("upgrade-owner"));
    o.schema = schema;
    { pg::delay_queue q(o); }  // the tables, the superuser's
    server().exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL " +
                  "TABLES IN SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL SEQUENCES " +
                  "IN SCHEMA " + schema + " TO " + role);
    make_old_layout(schema);
    auto as_role = o;
    as_role.conninfo = server().conninfo(role);
    const auto m = message_of<pg::permission_error>([&] { pg::delay_queue q(as_role); });
    INFO(m);
    CHECK(contains(m, "last_error"));
    CHECK(contains(m, "ownership"));
    CHECK(contains(m, "paused"));         // missing too, and made in the same statement
    CHECK_FALSE(has_new_layout(schema));  // nothing of it applied

    { pg::delay_queue q(o); }  // the owner upgrades
    pg::delay_queue q(as_role);
    REQUIRE(q.put_after("a", "p", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, "why"));
    CHECK(q.dead(1).at(0).last_error == "why");
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

namespace {

// `n` dead letters of queue `name` (ids `prefix`1, `prefix`2, ...), written straight into the
// table of schema delayq on `srv`, as if they died `age` ago, a millisecond apart.
void insert_dead(const std::string& name, const std::string& prefix, int n,
                 std::chrono::milliseconds age, delayq_pg_test::pg_server& srv = server()) {
    srv.exec("INSERT INTO delayq.dead(queue, id, payload, attempts, died) SELECT '" + name +
             "', convert_to('" + prefix +
             "' || g, 'UTF8'), 'p'::bytea, 1, floor(extract(epoch FROM clock_timestamp()) * "
             "1000)::bigint - " +
             std::to_string(age.count()) + " - g FROM generate_series(1, " + std::to_string(n) +
             ") g");
}

// How many dead letters of queue `name` have an id that begins with `prefix`.
int dead_with(const std::string& name, const std::string& prefix) {
    return std::stoi(server().query("SELECT count(*) FROM delayq.dead WHERE queue = '" + name +
                                    "' AND convert_from(id, 'UTF8') LIKE '" + prefix + "%'"));
}

}  // namespace

TEST_CASE("postgres: requeue_dead wakes a take waiting on another object of the queue",
          "[postgres][dead][wake]") {
    // The take's claim found the queue empty, so it sleeps until a notification: only
    // requeue_dead's wake-up, as a put's, can end its wait before max_wait.
    const std::string name = fresh_name("requeue-wake");
    auto o = opts(name);
    o.max_attempts = 1;
    pg::delay_queue other(o);
    o.conninfo += " application_name=requeue-consumer";
    pg::delay_queue consumer(o);
    for (const char* id : {"now", "later"}) {
        REQUIRE(other.put_after(id, "p", 0ms));
        auto j = other.take(5s);
        REQUIRE(j);
        REQUIRE(other.bury(*j, "why"));
    }
    for (const auto delay : {0ms, 300ms}) {
        std::optional<delayq::job> got;
        std::chrono::steady_clock::duration waited{};
        std::thread t([&] {
            const auto start = std::chrono::steady_clock::now();
            got = consumer.take(60s);
            waited = std::chrono::steady_clock::now() - start;
        });
        wait_for(
            "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = "
            "'requeue-consumer' AND query LIKE 'LISTEN%' AND state = 'idle'",
            "the take listens");
        std::this_thread::sleep_for(100ms);  // and sleeps, its claim having found nothing
        const auto requeued = std::chrono::steady_clock::now();
        REQUIRE(other.requeue_dead(delay == 0ms ? "now" : "later", delay));
        t.join();
        REQUIRE(got);
        CHECK(got->id == (delay == 0ms ? "now" : "later"));
        CHECK(got->attempts == 1);
        CHECK(waited < 10s);  // not the 30 s lease end of the job before, nor max_wait
        CHECK(std::chrono::steady_clock::now() - requeued >= delay);
        CHECK(consumer.get(got->id)->last_error == "why");
        CHECK(consumer.ack(*got));
    }
    CHECK(consumer.dead_size() == 0);
}

TEST_CASE("postgres: purge_dead removes a backlog of many batches, and only what is old enough",
          "[postgres][dead]") {
    // A server of its own, which logs every statement: each batch is a statement of its own.
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|"});
    const std::string name = fresh_name("purge");
    auto o = opts(name, srv);
    o.conninfo += " application_name=purger";
    pg::delay_queue q(o);
    const std::string other = fresh_name("purge-other");
    { pg::delay_queue untouched(opts(other, srv)); }
    insert_dead(name, "old", 25000, 2h, srv);
    insert_dead(name, "young", 10, 0ms, srv);
    insert_dead(other, "old", 5, 2h, srv);
    REQUIRE(q.dead_size() == 25010);
    const auto batches = [&] {
        std::ifstream in(srv.log());
        int n = 0;
        for (std::string line; std::getline(in, line);)
            if (line.rfind("purger|", 0) == 0 && contains(line, "execute dq16")) ++n;
        return n;
    };

    CHECK(q.purge_dead(1h) == 25000);
    CHECK(batches() == 3);  // 10 000, 10 000, 5 000
    CHECK(q.dead_size() == 10);
    CHECK(q.dead(1).at(0).id.rfind("young", 0) == 0);
    CHECK(srv.query("SELECT count(*) FROM delayq.dead WHERE queue = '" + other + "'") == "5");
    CHECK(q.purge_dead(1h) == 0);
    CHECK(batches() == 4);

    // A backlog of exactly one batch takes a second statement, which finds nothing.
    insert_dead(name, "full", 10000, 2h, srv);
    CHECK(q.purge_dead(1h) == 10000);
    CHECK(batches() == 6);
    std::this_thread::sleep_for(20ms);
    CHECK(q.purge_dead(0ms) == 10);
    CHECK(q.dead_size() == 0);
}

TEST_CASE(
    "postgres: with keep_dead, each move to the dead letters removes up to 100 old ones, the "
    "queue's only",
    "[postgres][dead]") {
    const std::string name = fresh_name("keep");
    auto o = opts(name);
    o.max_attempts = 1;
    o.lease = 200ms;
    o.keep_dead = 1h;
    pg::delay_queue q(o);
    const std::string other = fresh_name("keep-other");
    auto kept = opts(other);  // keep_dead 0: for ever
    kept.max_attempts = 1;
    pg::delay_queue forever(kept);
    insert_dead(name, "old", 250, 2h);
    insert_dead(other, "old", 10, 2h);

    REQUIRE(q.put_after("nacked", "p", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 0ms, "last attempt"));
    CHECK(dead_with(name, "old") == 150);

    REQUIRE(q.put_after("buried", "p", 0ms));
    j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.bury(*j));
    CHECK(dead_with(name, "old") == 50);

    REQUIRE(q.put_after("crashed", "p", 0ms));
    j = q.take(5s);
    REQUIRE(j);
    std::this_thread::sleep_for(400ms);  // its last lease ends unsettled
    CHECK_FALSE(q.take(0ms));            // the claim moves it to the dead letters
    CHECK(dead_with(name, "old") == 0);
    auto i = q.get("crashed");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->last_error == std::string(delayq::lease_ended_reason));

    // Nacks that are not the last attempt, and takes that bury nothing, remove nothing.
    insert_dead(name, "old", 5, 2h);
    o.max_attempts = 2;
    pg::delay_queue twice(o);
    REQUIRE(twice.put_after("retried", "p", 0ms));
    j = twice.take(5s);
    REQUIRE(j);
    REQUIRE(twice.nack(*j, 0ms));
    CHECK(dead_with(name, "old") == 5);
    j = twice.take(5s);
    REQUIRE(j);
    REQUIRE(twice.nack(*j, 0ms));
    CHECK(dead_with(name, "old") == 0);

    // An old dead letter whose id dies again is replaced by the new death, not removed.
    insert_dead(name, "again", 1, 2h);
    REQUIRE(q.put_after("again1", "new", 0ms));
    j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, "second"));
    i = q.get("again1");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->payload == "new");
    CHECK(i->last_error == "second");
    CHECK(i->time > std::chrono::system_clock::now() - 1min);
    CHECK(q.dead_size() == 5);  // nacked, buried, crashed, retried, again1

    // Another queue's, and a queue without keep_dead: kept.
    REQUIRE(forever.put_after("dies", "p", 0ms));
    j = forever.take(5s);
    REQUIRE(j);
    REQUIRE(forever.bury(*j));
    CHECK(dead_with(other, "old") == 10);
}

TEST_CASE("postgres: keep_dead bounds the dead letters under a stream of deaths",
          "[postgres][dead]") {
    auto o = opts(fresh_name("keep-stream"));
    o.max_attempts = 1;
    o.keep_dead = 300ms;
    pg::delay_queue q(o);
    constexpr std::size_t per_round = 10;
    for (std::size_t round = 0; round < 4; ++round) {
        std::vector<std::string> ids;
        std::vector<delayq::put_request> puts;
        for (std::size_t k = 0; k < per_round; ++k)
            ids.push_back("r" + std::to_string(round) + "-" + std::to_string(k));
        for (const auto& id : ids) puts.push_back({id, "p", 0ms});
        REQUIRE(q.put_many(puts) == std::vector<bool>(per_round, true));
        std::vector<delayq::job> js;
        while (js.size() < per_round) {
            auto more = q.take_many(per_round - js.size(), 5s);
            REQUIRE_FALSE(more.empty());
            js.insert(js.end(), more.begin(), more.end());
        }
        for (const auto& j : js) REQUIRE(q.bury(j, "round " + std::to_string(round)));
        // The rounds before died 400 ms or more before this round's first death: it removed them.
        CHECK(q.dead_size() <= per_round);
        if (round > 0) CHECK_FALSE(q.get("r" + std::to_string(round - 1) + "-0"));
        std::this_thread::sleep_for(400ms);
    }
}

TEST_CASE("postgres: with keep_dead, a death that waits for its dead letter holds no other",
          "[postgres][dead]") {
    // Two ids put again after they died long ago, dying at once: were each death to take old dead
    // letters before it waits for its own, each could hold what the other waits for.
    const std::string name = fresh_name("keep-wait");
    auto o = opts(name);
    o.max_attempts = 1;
    o.keep_dead = 1h;
    o.io_timeout = 20s;
    o.conninfo += " application_name=keep-dier";
    pg::delay_queue q(o);
    insert_dead(name, "x", 1, 2h);
    insert_dead(name, "y", 1, 2h);
    REQUIRE(q.put_after("x1", "again", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    const std::string dead_row = "SELECT 1 FROM delayq.dead WHERE queue = '" + name +
                                 "' AND id = convert_to('%', 'UTF8') FOR UPDATE";
    const auto locking = [&](const char* id, const char* how) {
        std::string sql = dead_row;
        return sql.replace(sql.find('%'), 1, id) + how;
    };
    app_conn other(server().conninfo());  // another death's hold on x1's dead letter
    other.exec("BEGIN");
    other.exec(locking("x1", ""));
    bool buried = false;
    std::thread t([&] { buried = q.bury(*j, "died again"); });
    wait_for(
        "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'keep-dier' AND "
        "wait_event_type = 'Lock'",
        "the death waits for x1's dead letter");
    CHECK(other.try_exec(locking("y1", " NOWAIT")).empty());  // not held by the waiting death
    other.exec("COMMIT");
    t.join();
    CHECK(buried);
    const auto i = q.get("x1");
    REQUIRE(i);
    CHECK(i->last_error == "died again");
    CHECK(dead_with(name, "y") == 0);  // removed once the death went on
}

TEST_CASE("postgres: requeue_dead during a death of the same id puts back the new dead letter",
          "[postgres][dead]") {
    // The requeue waits for the death's job row, as the death takes it first, then its dead
    // letter; it then finds the dead letter that death wrote.
    const std::string name = fresh_name("requeue-race");
    auto o = opts(name);
    o.max_attempts = 1;
    o.io_timeout = 20s;
    pg::delay_queue q(o);
    auto od = o;
    od.conninfo += " application_name=race-dier";
    pg::delay_queue dier(od);
    auto orq = o;
    orq.conninfo += " application_name=race-requeuer";
    pg::delay_queue requeuer(orq);
    REQUIRE(q.put_after("z", "first", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.bury(*j, "first death"));
    REQUIRE(q.put_after("z", "second", 0ms));
    j = q.take(5s);
    REQUIRE(j);

    app_conn other(server().conninfo());  // holds z's dead letter, so that the death waits
    other.exec("BEGIN");
    other.exec("SELECT 1 FROM delayq.dead WHERE queue = '" + name +
               "' AND id = 'z'::bytea FOR UPDATE");
    bool buried = false, requeued = false;
    std::thread death([&] { buried = dier.bury(*j, "second death"); });
    wait_for(
        "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'race-dier' AND "
        "wait_event_type = 'Lock'",
        "the death waits for z's dead letter");
    std::thread requeue([&] { requeued = requeuer.requeue_dead("z", 0ms); });
    wait_for(
        "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'race-requeuer' AND "
        "wait_event_type = 'Lock'",
        "the requeue waits for the death");
    other.exec("COMMIT");
    death.join();
    requeue.join();
    CHECK(buried);
    CHECK(requeued);
    const auto i = q.get("z");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->payload == "second");
    CHECK(i->last_error == "second death");
    CHECK(i->attempts == 0);
    CHECK(q.dead_size() == 0);
}

TEST_CASE(
    "postgres: a pause from another process stops the takes here, and its resume wakes a "
    "blocked take",
    "[postgres][pause][wake]") {
    const std::string name = fresh_name("pause-process");
    auto o = opts(name);
    o.conninfo += " application_name=pause-consumer";
    pg::delay_queue consumer(o);
    REQUIRE(consumer.put_after("due", "p", 0ms));
    const std::string args = quoted(server().conninfo()) + " " + quoted(name);
    int status = -1;
    CHECK(helper_run("pause " + args).output(&status) == "1\n");
    REQUIRE(status == 0);
    CHECK(consumer.paused());
    CHECK_FALSE(consumer.take(0ms));

    std::optional<delayq::job> got;
    std::atomic<bool> returned{false};  // `got` itself is read only after the join
    std::chrono::steady_clock::duration waited{};
    std::thread t([&] {
        const auto start = std::chrono::steady_clock::now();
        got = consumer.take(60s);
        waited = std::chrono::steady_clock::now() - start;
        returned = true;
    });
    wait_for(
        "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'pause-consumer' AND "
        "query LIKE 'LISTEN%' AND state = 'idle'",
        "the take listens");
    // And claims, finds the queue paused, and sleeps: the claim's transaction is over.
    wait_for(
        "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'pause-consumer' AND "
        "state <> 'idle'",
        "the take's claim is done");
    std::this_thread::sleep_for(200ms);
    CHECK_FALSE(returned);
    CHECK(helper_run("resume " + args).output(&status) == "0\n");
    REQUIRE(status == 0);
    t.join();
    REQUIRE(got);  // woken by the resume's notification, not after max_wait
    CHECK(got->id == "due");
    CHECK(got->attempts == 1);
    CHECK(waited < 30s);
    CHECK_FALSE(consumer.paused());
    CHECK(consumer.ack(*got));
}

TEST_CASE("postgres: a paused take with due jobs claims once, not again and again",
          "[postgres][pause][idle]") {
    // A server of its own that logs every statement with the client's application_name.
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|"});
    auto o = opts("paused-idle", srv);
    o.conninfo += " application_name=paused-consumer";
    pg::delay_queue consumer(o);
    pg::delay_queue producer(opts("paused-idle", srv));
    const auto claims = [&] {
        std::ifstream in(srv.log());
        int n = 0;
        for (std::string line; std::getline(in, line);)
            if (line.rfind("paused-consumer|", 0) == 0 && contains(line, "execute dq4")) ++n;
        return n;
    };
    REQUIRE(producer.put_after("due", "p", 0ms));
    producer.pause();
    // Due jobs on a paused queue: one claim on entry, which learns that only a resume can wake
    // it; then nothing, however long it waits, even when a put of a due job comes meanwhile
    // (its wake-up is not sent while the queue is paused).
    std::atomic<bool> put{false};  // checked after the join: Catch asserts on the test's thread
    std::thread putter([&] {
        std::this_thread::sleep_for(1s);
        put = producer.put_after("also-due", "p", 0ms);
    });
    CHECK_FALSE(consumer.take(3s));
    putter.join();
    REQUIRE(put);
    CHECK(claims() == 1);
    CHECK(consumer.take_many(10, 0ms).empty());  // a take that does not wait claims once
    CHECK(claims() == 2);

    producer.resume();
    auto got = consumer.take_many(10, 5s);
    CHECK(got.size() == 2);
    for (const auto& j : got) CHECK(consumer.ack(j));
}

TEST_CASE("postgres: two queues of one schema are paused and resumed apart", "[postgres][pause]") {
    pg::delay_queue a(opts(fresh_name("pause-a")));
    pg::delay_queue b(opts(fresh_name("pause-b")));
    REQUIRE(a.put_after("x", "p", 0ms));
    REQUIRE(b.put_after("x", "p", 0ms));
    a.pause();
    CHECK(a.paused());
    CHECK_FALSE(b.paused());
    CHECK_FALSE(a.take(0ms));
    auto j = b.take(5s);
    REQUIRE(j);
    CHECK(b.ack(*j));

    b.pause();
    a.resume();
    CHECK_FALSE(a.paused());
    CHECK(b.paused());
    REQUIRE(b.put_after("y", "p", 0ms));
    CHECK_FALSE(b.take(0ms));
    j = a.take(5s);
    REQUIRE(j);
    CHECK(a.ack(*j));
    b.resume();
    CHECK_FALSE(b.paused());
    j = b.take(5s);
    REQUIRE(j);
    CHECK(j->id == "y");
    CHECK(b.ack(*j));
}

TEST_CASE("postgres: the put in the caller's transaction works while the queue is paused",
          "[postgres][pause][transaction]") {
    const std::string name = fresh_name("pause-tx");
    pg::delay_queue q(opts(name));
    q.pause();
    app_conn app(server().conninfo());
    app.exec("BEGIN");
    CHECK(q.put_after_in_transaction(app.c, "tx", "p", 0ms));
    app.exec("COMMIT");
    CHECK(q.size() == 1);
    auto i = q.get("tx");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK_FALSE(q.take(0ms));
    CHECK_FALSE(q.take(300ms));  // its notification wakes the take, which finds the queue paused
    q.resume();
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "tx");
    CHECK(q.ack(*j));
}

TEST_CASE(
    "postgres: tables made before pause() get the paused table when a queue opens, with "
    "the grants of the jobs table",
    "[postgres][pause][upgrade]") {
    const std::string role = "pauser_" + std::to_string(::getpid());
    const std::string schema = "upp_" + std::to_string(::getpid());
    server().exec("CREATE ROLE " + role + " LOGIN");
    auto o = opts(fresh_name("upgrade-pause"));
    o.schema = schema;
    {
        pg::delay_queue q(o);  // the tables, the superuser's
        REQUIRE(q.put_after("kept", "p", 0ms));
    }
    server().exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL " +
                  "TABLES IN SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL SEQUENCES " +
                  "IN SCHEMA " + schema + " TO " + role);
    make_unpausable_layout(schema);
    REQUIRE_FALSE(has_paused_table(schema));

    // A role that may use the tables but not create one in the schema: told what it lacks.
    auto as_role = o;
    as_role.conninfo = server().conninfo(role);
    const auto m = message_of<pg::permission_error>([&] { pg::delay_queue q(as_role); });
    INFO(m);
    CHECK(contains(m, "paused"));
    CHECK(contains(m, "CREATE on schema"));
    CHECK_FALSE(contains(m, "ownership"));  // the last errors are there: not asked for
    CHECK_FALSE(has_paused_table(schema));

    {
        pg::delay_queue q(o);  // the owner upgrades
        CHECK(has_new_layout(schema));
        CHECK_FALSE(q.paused());
        CHECK(q.size() == 1);
    }
    // The role granted the use of the tables may use the new one: take, pause, resume.
    pg::delay_queue q(as_role);
    q.pause();
    CHECK(q.paused());
    CHECK_FALSE(q.take(0ms));
    q.resume();
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "kept");
    CHECK(q.ack(*j));
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_CASE("postgres: takes of two objects racing under max_leased 2 never hold more than 2 leases",
          "[postgres][limits][stress]") {
    // Two objects stand for two processes (their own connections), each with takes on several
    // threads, waiting and not: the claims of both run at once on the server, and each must count
    // the leases that the other's last claim made. A lease counts here from the moment its take
    // returned until its ack is sent, inside the time the server holds it: more than 2 here is
    // more than 2 on the server.
    const std::string name = fresh_name("limit-race");
    auto o = opts(name);
    o.lease = 60s;
    o.limits.max_leased = 2;
    pg::delay_queue a(o);
    pg::delay_queue b(o);
    constexpr int total = 400;
    for (int i = 0; i < total; ++i) REQUIRE(a.put_after("j" + std::to_string(i), "p", 0ms));
    std::atomic<int> held{0}, most{0}, acked{0}, failed{0};
    std::vector<std::thread> ts;
    for (int c = 0; c < 8; ++c)
        ts.emplace_back([&, c] {
            pg::delay_queue& q = c % 2 == 0 ? a : b;
            const auto until = std::chrono::steady_clock::now() + 90s;
            for (int round = 0; acked < total && std::chrono::steady_clock::now() < until;
                 ++round) {
                std::vector<delayq::job> js;
                try {
                    js = (c + round) % 3 == 0 ? q.take_many(3, 0ms) : q.take_many(2, 20ms);
                } catch (const std::exception&) {
                    ++failed;
                    continue;
                }
                const int now = held += static_cast<int>(js.size());
                for (int seen = most.load();
                     now > seen && !most.compare_exchange_weak(seen, now);) {
                }
                for (const auto& j : js) {
                    --held;  // before the ack: the server holds the lease until it commits
                    if (q.ack(j))
                        ++acked;
                    else
                        ++failed;
                }
            }
        });
    for (auto& t : ts) t.join();
    CHECK(failed == 0);
    CHECK(acked == total);
    CHECK(most <= 2);
    CHECK(most >= 1);
    CHECK(a.size() == 0);
}

TEST_CASE(
    "postgres: an object with limits locks the queue in its claim's transaction, and one without "
    "sends no lock",
    "[postgres][limits]") {
    // The lock must be taken by a statement of its own before the claim, in the claim's
    // transaction: in the same statement it would not refresh what the claim counts, in another
    // transaction it would not hold while the claim runs.
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|%v|"});
    auto o = opts("lock", srv);
    o.conninfo += " application_name=limited";
    o.limits.max_leased = 1;
    pg::delay_queue limited(o);
    auto u = opts("lock", srv);
    u.conninfo += " application_name=unlimited";
    pg::delay_queue unlimited(u);
    REQUIRE(unlimited.put_after("a", "p", 0ms));
    REQUIRE(unlimited.put_after("b", "p", 0ms));
    auto j = limited.take(5s);
    REQUIRE(j);
    CHECK_FALSE(limited.take(0ms));  // one leased: the limit holds it back
    auto k = unlimited.take(0ms);    // an object without limits leases whatever is due
    REQUIRE(k);

    // Each logged statement of `app`, in order: (virtual transaction, statement name).
    const auto executed = [&](const std::string& app) {
        std::vector<std::pair<std::string, std::string>> out;
        std::ifstream in(srv.log());
        for (std::string line; std::getline(in, line);) {
            if (line.rfind(app + "|", 0) != 0) continue;
            const auto at = line.find("execute dq");
            if (at == std::string::npos) continue;
            const auto bar = line.find('|', app.size() + 1);
            const auto name = line.substr(at + 8, line.find(':', at) - at - 8);
            out.emplace_back(line.substr(app.size() + 1, bar - app.size() - 1), name);
        }
        return out;
    };
    const auto mine = executed("limited");
    int claims = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
        if (mine[i].second != "dq4") continue;
        ++claims;
        REQUIRE(i > 0);
        CHECK(mine[i - 1].second == "dq20");        // the lock just before
        CHECK(mine[i - 1].first == mine[i].first);  // in the same transaction
        CHECK(contains(mine[i].first, "/"));        // (a virtual transaction id)
    }
    CHECK(claims == 2);
    int theirs = 0;
    for (const auto& e : executed("unlimited")) {
        CHECK(e.second != "dq20");
        if (e.second == "dq4") ++theirs;
    }
    CHECK(theirs == 1);
    CHECK(limited.ack(*j));
    CHECK(unlimited.ack(*k));
}

TEST_CASE("postgres: the prepared statements are named dq0 to dqN in the order of their index",
          "[postgres][names]") {
    // Logs, pg_stat_statements and the tests find the statements by these names; a new one takes
    // the next number, and none is renumbered.
    const auto st = pg::detail::statements(
        "\"delayq\"", true, true, 0,
        {.max_leased = 2, .rate = 3, .period = 1000, .channel = "delayq_0123456789abcdef"});
    REQUIRE(st.size() == pg::detail::st_count);
    for (std::size_t i = 0; i < st.size(); ++i) CHECK(st[i].name == "dq" + std::to_string(i));
    CHECK(std::string(st[pg::detail::st_claim].name) == "dq4");
    CHECK(std::string(st[pg::detail::st_limit_lock].name) == "dq20");
    CHECK(std::string(st[pg::detail::st_stats].name) == "dq21");
    CHECK(std::string(st[pg::detail::st_put_repeat].name) == "dq22");
}

TEST_CASE(
    "postgres: a take that a limit holds back claims once, not again and again, and a cancel "
    "from an object with limits frees its place",
    "[postgres][limits][idle]") {
    // A claim held back must say when a place may come free (a lease's end, the period's turn),
    // not that a due job waits now: the taker trusts "due now" and would claim at once, again and
    // again, for as long as the limit holds.
    delayq_pg_test::pg_server srv({"log_statement=all", "log_line_prefix=%a|"});
    const auto claims = [&](const std::string& app) {
        std::ifstream in(srv.log());
        int n = 0;
        for (std::string line; std::getline(in, line);)
            if (line.rfind(app + "|", 0) == 0 && contains(line, "execute dq4:")) ++n;
        return n;
    };
    {
        auto o = opts("held-leased", srv);
        o.lease = 60s;
        o.limits.max_leased = 1;
        pg::delay_queue holder(o);
        o.conninfo += " application_name=held-leased";
        pg::delay_queue consumer(o);
        REQUIRE(holder.put_after("a", "p", 0ms));
        REQUIRE(holder.put_after("b", "p", 0ms));
        auto j = holder.take(5s);
        REQUIRE(j);
        CHECK_FALSE(consumer.take(2s));
        CHECK(claims("held-leased") <= 2);  // on entry (and at most one spurious)

        // The holder's cancel of its lease (no ack, nack or bury) frees the place, and wakes the
        // held take: not at the lease's end, a minute on.
        std::optional<delayq::job> got;
        std::thread taker([&] { got = consumer.take(40s); });
        std::this_thread::sleep_for(300ms);
        const auto start = std::chrono::steady_clock::now();
        CHECK(holder.cancel(j->id));
        taker.join();
        CHECK(std::chrono::steady_clock::now() - start < 20s);
        REQUIRE(got);
        CHECK(got->id == "b");
        CHECK(consumer.ack(*got));
    }
    {
        auto o = opts("held-rate", srv);
        o.limits.rate = 1;
        o.limits.period = 30s;
        o.conninfo += " application_name=held-rate";
        pg::delay_queue consumer(o);
        REQUIRE(consumer.put_after("a", "p", 0ms));
        REQUIRE(consumer.put_after("b", "p", 0ms));
        auto j = consumer.take(5s);
        REQUIRE(j);
        CHECK(consumer.ack(*j));  // acked: the rate still counts its lease
        const int before = claims("held-rate");
        CHECK_FALSE(consumer.take(2s));
        CHECK(claims("held-rate") - before <= 2);
    }
}

TEST_CASE(
    "postgres: the settles of an object with limits notify when they end a lease, and only then",
    "[postgres][limits][wake]") {
    // A take that max_leased holds back, in any process, sleeps until a lease ends: an ack,
    // ack_many, nack, bury or cancel of a lease (by an object with limits) must wake it, and one
    // that ended nothing must not wake every consumer of the queue.
    const std::string name = fresh_name("settle-notify");
    auto o = opts(name);
    o.lease = 60s;
    o.limits.max_leased = 10;
    pg::delay_queue q(o);
    app_conn listener(server().conninfo());
    listener.exec("LISTEN " + q.channel());
    const auto heard = [&](std::chrono::milliseconds within) {  // as in the extend test
        const auto until = std::chrono::steady_clock::now() + within;
        int n = 0;
        do {
            std::this_thread::sleep_for(50ms);
            listener.exec("SELECT 1");
            n += listener.notifications();
        } while (n == 0 && std::chrono::steady_clock::now() < until);
        std::this_thread::sleep_for(100ms);
        listener.exec("SELECT 1");
        return n + listener.notifications();
    };
    for (int i = 0; i < 5; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "p", 0ms));
    auto js = q.take_many(5, 5s);
    REQUIRE(js.size() == 5);
    (void)heard(300ms);  // the puts'
    CHECK(q.ack_many(std::span(js.data(), 2)) == std::vector<bool>{true, true});
    CHECK(heard(5s) == 1);  // one for the call
    CHECK(q.ack_many(std::span(js.data(), 2)) == std::vector<bool>{false, false});
    CHECK(heard(500ms) == 0);
    CHECK(q.ack(js[2]));
    CHECK(heard(5s) == 1);
    CHECK_FALSE(q.ack(js[2]));
    CHECK(heard(500ms) == 0);
    CHECK(q.bury(js[3], "no"));
    CHECK(heard(5s) == 1);
    CHECK(q.nack(js[4], 1h));
    CHECK(heard(5s) >= 1);
    CHECK_FALSE(q.nack(js[4], 1h));
    CHECK(heard(500ms) == 0);
    CHECK(q.cancel("j4"));  // waiting, not leased: no place came free
    CHECK(heard(500ms) == 0);
    CHECK_FALSE(q.cancel("j4"));
    CHECK(heard(500ms) == 0);
}

TEST_CASE(
    "postgres: tables made before limits get the jobs_leased index and the grants table when a "
    "queue opens, with the grants of the jobs table",
    "[postgres][limits][upgrade]") {
    const std::string role = "limiter_" + std::to_string(::getpid());
    const std::string schema = "upl_" + std::to_string(::getpid());
    server().exec("CREATE ROLE " + role + " LOGIN");
    auto o = opts(fresh_name("upgrade-limits"));
    o.schema = schema;
    o.lease = 60s;
    {
        pg::delay_queue q(o);  // the tables, the superuser's
        REQUIRE(q.put_after("leased", "p", 0ms));
        REQUIRE(q.take(5s));
        REQUIRE(q.put_after("kept", "p", 0ms));
    }
    server().exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL " +
                  "TABLES IN SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL SEQUENCES " +
                  "IN SCHEMA " + schema + " TO " + role);
    make_unlimited_layout(schema);
    REQUIRE_FALSE(has_limit_layout(schema));

    // A role that may use the tables, but neither owns them nor may create in the schema: told
    // what it lacks, and nothing of it applied.
    auto as_role = o;
    as_role.conninfo = server().conninfo(role);
    as_role.limits = {.max_leased = 1, .rate = 5, .period = 10s};
    const auto m = message_of<pg::permission_error>([&] { pg::delay_queue q(as_role); });
    INFO(m);
    CHECK(contains(m, "jobs_leased"));
    CHECK(contains(m, "grants"));
    CHECK(contains(m, "ownership"));
    CHECK(contains(m, "CREATE on schema"));
    CHECK_FALSE(contains(m, "paused"));  // there: not asked for
    CHECK_FALSE(has_limit_layout(schema));

    {
        pg::delay_queue q(o);  // the owner upgrades
        CHECK(has_new_layout(schema));
        CHECK(q.size() == 2);
        CHECK(q.stats().leased == 1);  // the lease made before the index is in it
    }
    // The role granted the use of the tables may lease under the limits, which read and write the
    // new table: the lease made before the upgrade counts.
    pg::delay_queue q(as_role);
    CHECK_FALSE(q.take(0ms));
    server().exec("UPDATE " + schema + ".jobs SET at = 0 WHERE token <> 0");  // its lease ends
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK_FALSE(q.take(0ms));  // one leased again: "kept" waits
    CHECK(q.ack(*j));
    j = q.take(5s);
    REQUIRE(j);
    CHECK(q.ack(*j));
    CHECK(q.size() == 0);
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_CASE("postgres: stats at a million jobs", "[.][postgres][stats][perf]") {
    // The cost of stats() (see its comment): a read of the queue's range of jobs_at. Hidden: a
    // million rows take seconds to write.
    const std::string name = fresh_name("stats-big");
    pg::delay_queue q(opts(name));
    server().exec("INSERT INTO delayq.jobs(queue, id, payload, at) SELECT '" + name +
                  "', convert_to('j' || g, 'UTF8'), 'p'::bytea, floor(extract(epoch FROM "
                  "clock_timestamp()) * 1000)::bigint - 1000 + (g % 2) * 3600000 FROM "
                  "generate_series(1, 1000000) g");
    const auto leased = q.take_many(100, 0ms);
    REQUIRE(leased.size() == 100);
    for (int i = 0; i < 3; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const auto s = q.stats();
        const auto took = std::chrono::steady_clock::now() - start;
        WARN("stats() at 1 000 000 jobs: "
             << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
        CHECK(s.waiting == 1000000 - 100);
        CHECK(s.due_now == 500000 - 100);
        CHECK(s.leased == 100);
        CHECK(s.lag >= 900ms);
        CHECK(took < 1s);
    }
    server().exec("DELETE FROM delayq.jobs WHERE queue = '" + name + "'");
}

TEST_CASE("postgres: the server's next run is the C++ next_run, for many schedules and times",
          "[postgres][repeat]") {
    using delayq::detail::job_queue::cron_text;
    using delayq::detail::job_queue::next_run;
    { pg::delay_queue q(opts(fresh_name("next-run"))); }  // schema delayq, with the function
    std::vector<std::string> texts;
    for (const char* e :
         {"* * * * *",     "0 3 * * *",         "*/15 * * * *",
          "0 0 29 2 *",    "0 9 1 * MON",       "30 23 31 * *",
          "0 0 * * 0",     "5 4 * * SUN",       "0 12 13 * FRI",
          "59 23 31 12 *", "0 0 1 1 *",         "*/7 */5 */3 */2 *",
          "0 0 29 2 1",    "0 0 30 * *",        "15,45 8-18/2 * JAN-MAR,OCT mon-fri",
          "0 0 * * 7",     "1-59/2 0 1,15 * *", "0 0 29 2 */2",
          "0 22 * * 1-5",  "59 23 * 2 *",       "0 0 31 * 2",
          "0 12 * 2,3 *"})
        texts.push_back(cron_text(e));
    // Texts that no put writes, which the server must read as C++ reads them: refused, or masks
    // made by hand (bits past a mask's width, the day bits that mean nothing, huge numbers).
    for (const char* t : {"",
                          "c",
                          "x12",
                          "c1:2:3",
                          "c::::::",
                          "c1:0:1:2:2:0:1",
                          "c1:0:1:0:4:1:2",
                          "c1:0:1:0:4:2:2",
                          "c1:0:1:1073741824:4:2:0",
                          "c10995116277769:0:1:4294967294:8190:127:3",
                          "c10995116277770:0:1:4294967294:8190:127:3",
                          "c0:1:1:4294967295:8191:255:3",
                          "c1:0:1:4294967294:8190:127:3x",
                          "c99999999999999999999999:0:1:2:4:0:3",
                          "e",
                          "e0",
                          "e12a",
                          "e0005",
                          "e300",
                          "e86400000",
                          "e86400000000"})
        texts.emplace_back(t);
    std::vector<long long> times = {0,
                                    59'999,
                                    60'000,
                                    951'782'400'000,     // 2000-02-29
                                    1'709'164'799'999,   // 2024-02-28T23:59:59.999
                                    1'709'164'800'000,   // 2024-02-29
                                    1'735'689'599'999,   // 2024-12-31T23:59:59.999
                                    4'035'398'400'000,   // 2097-11-15
                                    4'102'444'799'999};  // 2099-12-31T23:59:59.999
    std::mt19937_64 rng(20261207);
    for (int i = 0; i < 30; ++i) times.push_back(static_cast<long long>(rng() % 4'102'444'800'000));
    // One query for every case: (its number, text, due, now), due before now and after it.
    std::string values;
    std::vector<std::string> want;
    for (const auto& t : texts)
        for (const long long now : times)
            for (const long long due : {now - 12'345, now + 777}) {
                values += (values.empty() ? "(" : ", (") + std::to_string(want.size()) + ", '" + t +
                          "', " + std::to_string(due) + "::bigint, " + std::to_string(now) +
                          "::bigint)";
                const auto n = next_run(t, due, now);
                want.push_back(n ? std::to_string(*n) : "-");
            }
    const std::string got = server().query(
        "SELECT string_agg(coalesce(delayq.next_run(x.t, x.d, x.n)::text, '-'), ',' ORDER BY "
        "x.i) FROM (VALUES " +
        values + ") x(i, t, d, n)");
    std::vector<std::string> gots;
    std::stringstream in(got);
    for (std::string v; std::getline(in, v, ',');) gots.push_back(v);
    REQUIRE(gots.size() == want.size());
    std::vector<std::size_t> differ;
    for (std::size_t i = 0; i < want.size(); ++i)
        if (gots[i] != want[i]) differ.push_back(i);
    INFO(differ.size() << " cases differ; the first: case " << (differ.empty() ? 0 : differ[0]));
    CHECK(differ.empty());

    // Through put_cron: the first run is the C++ next run after the server's now, which lies
    // between the client's clock before the call and after it (one machine, one clock).
    pg::delay_queue q(opts(fresh_name("first-run")));
    const auto ms = [] {
        return std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
            .count();
    };
    int k = 0;
    for (const char* e : {"* * * * *", "0 3 * * *", "0 0 29 2 *", "0 9 1 * MON", "*/7 */5 * * *",
                          "59 23 31 12 *"}) {
        const std::string id = "cron" + std::to_string(++k);
        const long long before = ms();
        REQUIRE(q.put_cron(id, "p", e));
        const long long after = ms();
        const auto i = q.get(id);
        REQUIRE(i);
        const long long at =
            std::chrono::duration_cast<std::chrono::milliseconds>(i->time.time_since_epoch())
                .count();
        INFO(e);
        CHECK(at >= *next_run(cron_text(e), 0, before - 1));
        CHECK(at <= *next_run(cron_text(e), 0, after + 1));
        CHECK(at % 60'000 == 0);
    }
}

TEST_CASE("postgres: racing settles of one run, on two objects, queue one next run",
          "[postgres][repeat][stress]") {
    const std::string name = fresh_name("repeat-race");
    pg::delay_queue a(opts(name)), b(opts(name));
    REQUIRE(a.put_every("r", "p", 20ms));
    std::size_t dead = 0;
    for (int i = 0; i < 30; ++i) {
        auto run = a.take(10s);
        REQUIRE(run);
        CHECK(run->id == "r");
        // Both settle the same lease at once: ack and ack, ack and ack_many, ack and bury.
        const int how = i % 3;
        std::latch go(2);
        std::atomic<int> held{0}, errors{0}, buried{0};
        const auto settle = [&](pg::delay_queue& q, int kind) {
            go.arrive_and_wait();
            try {
                bool ok = false;
                if (kind == 0) ok = q.ack(*run);
                if (kind == 1) ok = q.ack_many(std::span<const delayq::job>(&*run, 1)).at(0);
                if (kind == 2) ok = q.bury(*run, "raced");
                if (ok) ++held;
                if (ok && kind == 2) ++buried;
            } catch (const std::exception&) {
                ++errors;
            }
        };
        std::thread t1([&] { settle(a, 0); });
        std::thread t2([&] { settle(b, how); });
        t1.join();
        t2.join();
        CHECK(errors == 0);
        CHECK(held == 1);
        dead += static_cast<std::size_t>(buried.load());
        // One next run, waiting, from attempt 0, whichever settle held.
        CHECK(a.size() == 1);
        const auto info = a.get("r");
        REQUIRE(info);
        CHECK(info->state == delayq::job_state::waiting);
        CHECK(info->attempts == 0);
        CHECK(info->time > run->deadline);
        CHECK(info->payload == "p");
    }
    CHECK(a.dead_size() == (dead > 0 ? 1u : 0u));  // the id's dead letter: the latest death
    CHECK(a.cancel("r"));
    CHECK(a.size() == 0);
}

TEST_CASE("postgres: a cancel racing the ack of a run ends the series",
          "[postgres][repeat][stress]") {
    // The ack makes the run its next run in place: a cancel that waited for the ack finds the next
    // run, never a row that is gone while a new one goes on.
    const std::string name = fresh_name("repeat-cancel");
    pg::delay_queue a(opts(name)), b(opts(name));
    for (int i = 0; i < 20; ++i) {
        const std::string id = "c" + std::to_string(i);
        REQUIRE(a.put_every(id, "p", 10ms));
        auto run = a.take(10s);
        REQUIRE(run);
        std::latch go(2);
        std::atomic<int> cancelled{0}, errors{0};
        std::thread acker([&] {
            go.arrive_and_wait();
            try {
                (void)a.ack(*run);
            } catch (const std::exception&) {
                ++errors;
            }
        });
        std::thread canceller([&] {
            go.arrive_and_wait();
            try {
                if (b.cancel(id)) ++cancelled;
            } catch (const std::exception&) {
                ++errors;
            }
        });
        acker.join();
        canceller.join();
        CHECK(errors == 0);
        CHECK(cancelled == 1);
        CHECK_FALSE(a.get(id).has_value());
    }
    CHECK(a.size() == 0);
}

TEST_CASE(
    "postgres: the next run that an ack, ack_many or bury queues wakes a take waiting on another "
    "object",
    "[postgres][repeat][idle]") {
    // The other object's take saw only the run's lease, which ends in a minute, and sleeps until
    // then: only the next run's wake-up makes it take that run within its 10 s.
    for (int how = 0; how < 3; ++how) {
        auto o = opts(fresh_name("repeat-wake"));
        o.lease = 60s;
        pg::delay_queue a(o), b(o);
        REQUIRE(a.put_every("w", "p", 200ms));
        auto run = a.take(10s);
        REQUIRE(run);
        std::optional<delayq::job> got;
        std::atomic<bool> failed{false};
        std::thread t([&] {
            try {
                got = b.take(10s);
            } catch (const std::exception&) {
                failed = true;
            }
        });
        std::this_thread::sleep_for(500ms);  // b claims, and sleeps until the lease ends
        bool ok = false;
        if (how == 0) ok = a.ack(*run);
        if (how == 1) ok = a.ack_many(std::span<const delayq::job>(&*run, 1)).at(0);
        if (how == 2) ok = a.bury(*run, "why");
        t.join();
        INFO("settled by " << (how == 0 ? "ack" : how == 1 ? "ack_many" : "bury"));
        CHECK(ok);
        CHECK_FALSE(failed);
        REQUIRE(got);
        CHECK(got->id == "w");
        CHECK(got->deadline > run->deadline);
    }
}

namespace {

// The schema `schema` as a delayq made before repeatable jobs left it: no repeat and due columns,
// no function next_run.
void make_unrepeatable_layout(const std::string& schema) {
    server().exec("ALTER TABLE " + schema + ".jobs DROP COLUMN repeat, DROP COLUMN due; " +
                  "DROP FUNCTION " + schema + ".next_run(text, bigint, bigint)");
}

// Whether schema `schema` has the repeat and due columns and the function next_run.
bool has_repeat_layout(const std::string& schema) {
    return server().query(
               "SELECT (SELECT count(*) FROM information_schema.columns WHERE "
               "table_schema = '" +
               schema +
               "' AND table_name = 'jobs' AND column_name IN ('repeat', 'due')) = 2 "
               "AND to_regprocedure('" +
               schema + ".next_run(text, bigint, bigint)') IS NOT NULL") == "t";
}

// While it lives, the functions that role postgres creates are not executable by PUBLIC (as a
// database whose administrator took that default away).
struct no_public_execute {
    no_public_execute() {
        server().exec(
            "ALTER DEFAULT PRIVILEGES FOR ROLE postgres REVOKE EXECUTE ON FUNCTIONS FROM "
            "PUBLIC");
    }
    ~no_public_execute() {
        try {
            server().exec(
                "ALTER DEFAULT PRIVILEGES FOR ROLE postgres GRANT EXECUTE ON FUNCTIONS TO PUBLIC");
        } catch (...) {
        }
    }
    no_public_execute(const no_public_execute&) = delete;
    no_public_execute& operator=(const no_public_execute&) = delete;
};

}  // namespace

TEST_CASE(
    "postgres: tables made before repeatable jobs get the repeat columns and next_run when a "
    "queue opens, with EXECUTE for the roles of the jobs table",
    "[postgres][repeat][upgrade]") {
    const std::string role = "repeater_" + std::to_string(::getpid());
    const std::string schema = "uprep_" + std::to_string(::getpid());
    server().exec("CREATE ROLE " + role + " LOGIN");
    auto o = opts(fresh_name("upgrade-repeat"));
    o.schema = schema;
    {
        pg::delay_queue q(o);  // the tables, the superuser's
        REQUIRE(q.put_after("kept", "p", 0ms));
    }
    server().exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL " +
                  "TABLES IN SCHEMA " + schema + " TO " + role + "; GRANT ALL ON ALL SEQUENCES " +
                  "IN SCHEMA " + schema + " TO " + role);
    make_unrepeatable_layout(schema);
    REQUIRE_FALSE(has_repeat_layout(schema));

    // A role that may use the tables, but neither owns them nor may create in the schema: told
    // what it lacks, and nothing of it applied.
    auto as_role = o;
    as_role.conninfo = server().conninfo(role);
    const auto m = message_of<pg::permission_error>([&] { pg::delay_queue q(as_role); });
    INFO(m);
    CHECK(contains(m, "repeat"));
    CHECK(contains(m, "next_run"));
    CHECK(contains(m, "ownership"));
    CHECK(contains(m, "CREATE on schema"));
    CHECK_FALSE(contains(m, "paused"));  // there: not asked for
    CHECK_FALSE(has_repeat_layout(schema));

    {
        // The owner upgrades, in a database where PUBLIC does not get EXECUTE on new functions:
        // the role that uses the jobs table gets it, or its acks would fail.
        const no_public_execute guard;
        pg::delay_queue q(o);
        CHECK(has_repeat_layout(schema));
        CHECK(q.size() == 1);
    }
    CHECK(server().query("SELECT has_function_privilege('" + role + "', '" + schema +
                         ".next_run(text, bigint, bigint)', 'EXECUTE')") == "t");
    pg::delay_queue q(as_role);
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "kept");  // the job made before the upgrade: a job of its own
    CHECK(q.ack(*j));
    CHECK(q.size() == 0);
    REQUIRE(q.put_every("series", "p", 100ms));
    j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "series");
    CHECK(q.ack(*j));
    const auto next = q.get("series");
    REQUIRE(next);
    CHECK(next->state == delayq::job_state::waiting);
    CHECK(next->time > j->deadline);
    server().exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_CASE("postgres: a page of jobs() reads about a page of the index, on a table not analyzed",
          "[postgres][lookup]") {
    // On a small table that autovacuum has not analyzed yet, the planner once chose to read the
    // whole range of the index and sort it, rather than the index's order sorted incrementally:
    // a page of 100 read every one of 5 000 jobs. The range is now bounded by the page's last
    // due time, whatever the plan.
    const std::string name = fresh_name();
    pg::delay_queue q(opts(name));
    std::vector<std::string> ids;
    std::vector<delayq::put_request> batch;
    for (int i = 0; i < 5000; ++i) ids.push_back("job-" + std::to_string(i));
    for (int i = 0; i < 5000; ++i) batch.push_back({ids[i], "p", std::chrono::minutes(60 + i)});
    for (std::size_t at = 0; at < batch.size(); at += 500)
        REQUIRE(q.put_many(std::span(batch).subspan(at, 500)).size() == 500);
    REQUIRE(q.jobs(delayq::job_state::waiting, 100).size() == 100);

    app_conn c(server().conninfo());
    c.exec(pg::detail::session_sql);
    for (const bool leased : {false, true}) {
        c.exec("DEALLOCATE ALL");
        c.exec("PREPARE p(text, bytea, int8, bool) AS " +
               pg::detail::jobs_page_sql("\"delayq\"", leased));
        // From the first, and after a job in the middle (waiting only: none is leased).
        for (const std::string& after : {std::string(), std::string("job-2500")}) {
            const std::string sql =
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE "
                "p('" +
                name + "', '" + after + "'::bytea, 100, " + (after.empty() ? "false" : "true") +
                ")";
            PGresult* r = PQexec(c.c, sql.c_str());
            REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
            std::string plan;
            long most = 0;  // the most rows any scan of the plan read
            for (int i = 0; i < PQntuples(r); ++i) {
                const std::string line = PQgetvalue(r, i, 0);
                plan += line + "\n";
                const auto at = line.find("actual rows=");
                if (at != std::string::npos && line.find("Scan") != std::string::npos)
                    most = std::max(most, std::stol(line.substr(at + 12)));
            }
            PQclear(r);
            INFO(plan);
            CHECK(most <= 200);
        }
    }
}
