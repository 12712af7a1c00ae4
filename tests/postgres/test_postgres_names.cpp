// delayq::postgres::delay_queue and the names and settings around it: a queue name that is not
// ASCII, put on a connection whose client_encoding is not UTF-8; the bytes a name may hold; schemas
// named by reserved words or capitals, and the reserved prefix pg_; the privilege a refused role
// lacks, named; a put in a transaction that is then PREPAREd (two-phase commit); and the probe for
// a connection pooler that does not keep sessions.
#include <libpq-fe.h>
#include <unistd.h>

#include <chrono>
#include <delayq/postgres/delay_queue.hpp>
#include <memory>
#include <optional>
#include <stdexcept>
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

// A connection of the queue's kind (detail::connection), with a limit of 10 s to connect.
std::unique_ptr<pg::detail::connection> connect_to(const std::string& conninfo) {
    return std::make_unique<pg::detail::connection>(conninfo, 10s,
                                                    std::chrono::steady_clock::now() + 10s);
}

}  // namespace

TEST_CASE(
    "postgres: a queue name that is not ASCII is one queue whatever the connections' "
    "client_encoding",
    "[postgres][names]") {
    // "café" in UTF-8, and a suffix of its own.
    const std::string name = "caf\xc3\xa9-" + fresh_name("enc");
    pg::delay_queue q(opts(name));

    SECTION("the put in the caller's transaction, on a LATIN1 connection") {
        app_conn app(server().conninfo() + " client_encoding=LATIN1");
        REQUIRE(std::string(pg_encoding_to_char(PQclientEncoding(app.c))) == "LATIN1");
        app.exec("BEGIN");
        CHECK(q.put_after_in_transaction(app.c, "order-1", "x", 0ms));
        app.exec("COMMIT");
        CHECK(q.size() == 1);
        const auto j = q.take(10s);
        REQUIRE(j);
        CHECK(j->id == "order-1");
        CHECK(q.ack(*j));
    }
    SECTION("the queue's own connections, LATIN1 by their conninfo") {
        auto o = opts(name);
        o.conninfo += " client_encoding=LATIN1";
        pg::delay_queue latin(o);
        CHECK(latin.put_after("order-2", "x", 0ms));
        CHECK(q.size() == 1);
        const auto j = q.take(10s);
        REQUIRE(j);
        CHECK(j->id == "order-2");
        CHECK(latin.ack(*j));
    }
    // Nothing went to another queue (the name's bytes read as LATIN1: "cafÃ©").
    CHECK(server().query("SELECT count(*) FROM delayq.jobs WHERE queue LIKE 'caf%'") == "0");
}

TEST_CASE("postgres: a queue name is UTF-8 without NUL, else std::invalid_argument at once",
          "[postgres][names]") {
    const char* bad[] = {
        "\xff",                  // never in UTF-8
        "caf\xe9",               // "café" in LATIN1
        "\xc3",                  // cut short
        "\xc0\xaf",              // overlong "/"
        "\xe0\x80\xaf",          // overlong, 3 bytes
        "\xed\xa0\x80",          // a UTF-16 surrogate
        "\xf4\x90\x80\x80",      // past U+10FFFF
        "\xf8\x88\x80\x80\x80",  // 5 bytes
    };
    for (const char* name : bad) {
        INFO(name);
        auto o = opts(name);
        const auto m = message_of<std::invalid_argument>([&] { pg::delay_queue q(o); });
        CHECK(contains(m, "UTF-8"));
    }
    auto o = opts("a");
    o.name = std::string("a\0b", 3);
    CHECK(contains(message_of<std::invalid_argument>([&] { pg::delay_queue q(o); }), "NUL"));

    // Any character of Unicode is a name: 2, 3 and 4 bytes.
    for (const std::string prefix : {"\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80",
                                     "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf"}) {
        pg::delay_queue q(opts(prefix + fresh_name("utf8")));
        CHECK(q.put_after("j", "x", 0ms));
        const auto j = q.take(10s);
        REQUIRE(j);
        CHECK(q.ack(*j));
    }
}

TEST_CASE("postgres: a schema named by a reserved word or with capitals works; pg_ is refused",
          "[postgres][names]") {
    for (const std::string schema : {"user", "order", "group", "Mixed_Case", "1st"}) {
        INFO(schema);
        auto o = opts(fresh_name("schema"));
        o.schema = schema;
        o.max_attempts = 2;  // the claim's dead-letter branch names the schema too
        {
            pg::delay_queue q(o);
            CHECK(q.put_after("a", "x", 0ms));
            CHECK(q.put_many(std::vector<pg::delay_queue::put_request>{{"b", "y", 0ms}}) ==
                  std::vector<bool>{true});
            CHECK(q.reschedule("b", 0ms));
            CHECK(q.size() == 2);
            auto j = q.take(10s);
            REQUIRE(j);
            CHECK(q.nack(*j, 0ms));
            auto js = q.take_many(2, 10s);
            REQUIRE(!js.empty());
            CHECK(q.ack_many(js)[0]);
            while (q.size() > 0) {
                j = q.take(10s);
                REQUIRE(j);
                CHECK(q.ack(*j));
            }
            CHECK(q.put_after("d", "x", 1h));
            CHECK(q.cancel("d"));
            CHECK(q.dead_size() == 0);
            app_conn app(server().conninfo());
            app.exec("BEGIN");
            CHECK(q.put_after_in_transaction(app.c, "c", "z", 1h));
            app.exec("COMMIT");
            CHECK(q.size() == 1);
        }
        // The schema is the name as written, case kept.
        CHECK(server().query("SELECT count(*) FROM pg_namespace WHERE nspname = '" + schema +
                             "'") == "1");
        server().exec("DROP SCHEMA \"" + schema + "\" CASCADE");
    }
    for (const std::string& schema :
         {std::string("pg_jobs"), std::string("PG_jobs"), std::string("Bad-Schema"),
          std::string("a\"b"), std::string("a.b"), std::string(), std::string(64, 's'),
          std::string("sch\xc3\xa9ma")}) {
        INFO(schema);
        auto o = opts("x");
        o.schema = schema;
        CHECK_THROWS_AS(pg::delay_queue(o), std::invalid_argument);
    }
    auto o = opts("x");
    o.schema = "pg_jobs";
    CHECK(contains(message_of<std::invalid_argument>([&] { pg::delay_queue q(o); }), "pg_"));
    o.schema = std::string(63, 's');  // the longest identifier
    { pg::delay_queue q(o); }
    server().exec("DROP SCHEMA " + o.schema + " CASCADE");
}

TEST_CASE("postgres: a role that lacks a privilege on the schema is told which",
          "[postgres][errors][names]") {
    const std::string role = "lacking_" + std::to_string(::getpid());
    server().exec("CREATE ROLE " + role + " LOGIN");
    auto o = opts(fresh_name("perm"));
    o.schema = "held_" + std::to_string(::getpid());
    { pg::delay_queue q(o); }  // the tables, made by the superuser
    o.conninfo = server().conninfo(role);

    // No USAGE on the schema.
    auto m = message_of<pg::permission_error>([&] { pg::delay_queue q(o); });
    INFO(m);
    CHECK(contains(m, "USAGE on schema \"" + o.schema + "\""));
    CHECK(contains(m, role));
    CHECK_FALSE(contains(m, "database"));

    // USAGE, but no SELECT on meta.
    server().exec("GRANT USAGE ON SCHEMA " + o.schema + " TO " + role);
    m = message_of<pg::permission_error>([&] { pg::delay_queue q(o); });
    INFO(m);
    CHECK(contains(m, "SELECT on table \"" + o.schema + "\".meta"));
    CHECK_FALSE(contains(m, "database"));
    try {
        pg::delay_queue q(o);
    } catch (const pg::permission_error& e) {
        CHECK(e.sqlstate() == "42501");
    }

    // Both: the object works as far as the role may.
    server().exec("GRANT SELECT ON " + o.schema + ".meta TO " + role);
    pg::delay_queue q(o);
    CHECK(contains(message_of<pg::permission_error>([&] { q.put_after("a", "x", 0ms); }),
                   "permission denied for table jobs"));

    // A schema made ahead, where the role may create tables but not schemas: the tables are
    // made in it.
    const std::string ahead = "ahead_" + std::to_string(::getpid());
    server().exec("CREATE SCHEMA " + ahead + "; GRANT USAGE, CREATE ON SCHEMA " + ahead + " TO " +
                  role);
    o.schema = ahead;
    {
        pg::delay_queue mine(o);
        CHECK(mine.put_after("a", "x", 0ms));
        CHECK(mine.size() == 1);
    }
    // No schema, and no right to create one: the creation's privilege is named.
    o.schema = "absent_" + std::to_string(::getpid());
    m = message_of<pg::permission_error>([&] { pg::delay_queue q(o); });
    CHECK(contains(m, "CREATE on the database"));
    server().exec("DROP SCHEMA " + ahead + " CASCADE");
}

TEST_CASE("postgres: a transaction that put a job can be PREPAREd when the put does not notify",
          "[postgres][transaction]") {
    // A server of its own: two-phase commit is off unless max_prepared_transactions says so.
    delayq_pg_test::pg_server s({"max_prepared_transactions=4"});
    auto o = opts(fresh_name("2pc"), s);
    pg::delay_queue q(o);
    app_conn app(s.conninfo());
    app.exec("CREATE TABLE orders(id integer PRIMARY KEY)");

    // The default put notifies at commit; PostgreSQL refuses to PREPARE such a transaction and
    // rolls it back, the application's own writes with it.
    app.exec("BEGIN");
    app.exec("INSERT INTO orders VALUES (1)");
    CHECK(q.put_after_in_transaction(app.c, "order-1", "x", 0ms));
    const std::string err = app.try_exec("PREPARE TRANSACTION 'order-1'");
    INFO(err);
    CHECK(contains(err, "NOTIFY"));
    CHECK(s.query("SELECT count(*) FROM orders") == "0");
    CHECK(q.size() == 0);

    // pg::notify::none: no NOTIFY; the transaction prepares, commits, and wake_consumers() wakes
    // a take that waits.
    std::optional<delayq::job> got;
    std::thread taker([&] { got = q.take(60s); });
    app.exec("BEGIN");
    app.exec("INSERT INTO orders VALUES (2)");
    CHECK(q.put_after_in_transaction(app.c, "order-2", "y", 0ms, pg::notify::none));
    CHECK(q.put_in_transaction(app.c, "order-3", "z", std::chrono::system_clock::now() + 1h,
                               pg::notify::none));
    CHECK_FALSE(q.put_after_in_transaction(app.c, "order-2", "again", 0ms, pg::notify::none));
    app.exec("PREPARE TRANSACTION 'order-2'");
    CHECK(q.size() == 0);  // prepared, not committed
    app.exec("COMMIT PREPARED 'order-2'");
    CHECK(s.query("SELECT count(*) FROM orders") == "1");
    CHECK(q.size() == 2);
    q.wake_consumers();
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "order-2");
    CHECK(q.ack(*got));
}

TEST_CASE("postgres: the probe for a pooler that does not keep sessions", "[postgres][names]") {
    // Without a pooler, every connection is answered by a server process of its own: the probe
    // passes. Answered by the first connection's process, as a pooler in transaction mode
    // answers, it throws the pooler's message.
    const auto a = connect_to(server().conninfo());
    const auto b = connect_to(server().conninfo());
    const long long pid = pg::detail::set_up_session(*a);
    CHECK(pid == PQbackendPID(a->get()));  // the server itself answers
    pg::detail::check_own_session(*b, pid);
    const auto m =
        message_of<pg::error>([&] { pg::detail::check_own_session(*b, PQbackendPID(b->get())); });
    CHECK(contains(m, "transaction or statement mode"));
    CHECK(contains(m, "session mode"));
}
