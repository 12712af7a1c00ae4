// The Redis rows of docs/misuse.md: bad options, bad ids, an unreachable server, a payload larger
// than the server accepts. Each fails with a typed exception that names the problem, in bounded
// time, and leaves the queue object usable.
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <stdexcept>
#include <string>

#include "catch.hpp"
#include "expect_error.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;

using delayq::test::contains;
using delayq::test::message_of;

namespace {

delayq::redis::options opts(int port, std::string name = "misuse") {
    delayq::redis::options o;
    o.port = port;
    o.name = std::move(name);
    return o;
}

}  // namespace

TEST_CASE("redis misuse: empty name") {
    CHECK(
        contains(message_of<std::invalid_argument>([] { delay_queue q(opts(6379, "")); }), "name"));
}

TEST_CASE("redis misuse: name with braces") {
    for (const char* n : {"a{b", "a}b", "{x}", "}"}) {
        const std::string m =
            message_of<std::invalid_argument>([&] { delay_queue q(opts(6379, n)); });
        CHECK(contains(m, "name"));
        CHECK(contains(m, "{"));
    }
}

TEST_CASE("redis misuse: bad lease, io_timeout or port") {
    auto o = opts(6379);
    o.lease = 0ms;
    CHECK(contains(message_of<std::invalid_argument>([&] { delay_queue q(o); }), "lease"));
    o = opts(6379);
    o.lease = -5s;
    CHECK(contains(message_of<std::invalid_argument>([&] { delay_queue q(o); }), "lease"));
    o = opts(6379);
    o.io_timeout = 0ms;
    CHECK(contains(message_of<std::invalid_argument>([&] { delay_queue q(o); }), "io_timeout"));
    for (int port : {0, -1, 65536}) {
        o = opts(port);
        CHECK(contains(message_of<std::invalid_argument>([&] { delay_queue q(o); }), "port"));
    }
}

TEST_CASE("redis misuse: empty job id") {
    delay_queue q(opts(6379));  // checked before any I/O: no server needed
    CHECK(contains(message_of<std::invalid_argument>(
                       [&] { q.put("", "p", std::chrono::system_clock::now()); }),
                   "id"));
    CHECK(contains(message_of<std::invalid_argument>([&] { q.put_after("", "p", 0ms); }), "id"));
    CHECK(contains(message_of<std::invalid_argument>([&] { q.cancel(""); }), "id"));
}

TEST_CASE("redis misuse: unreachable host") {
    SECTION("nobody listens on the port") {
        auto o = opts(delayq_test::free_port());
        o.io_timeout = 500ms;
        delay_queue q(o);  // does not connect yet
        const auto t0 = std::chrono::steady_clock::now();
        const std::string m = message_of<delayq::redis::error>([&] { q.put_after("a", "p", 0ms); });
        CHECK_FALSE(m.empty());
        CHECK(std::chrono::steady_clock::now() - t0 < 5s);
        CHECK_THROWS_AS(q.size(), delayq::redis::error);  // still an error, still no hang
        CHECK_THROWS_AS(q.take(50ms), delayq::redis::error);
    }
    SECTION("a host that never answers") {
        auto o = opts(6379);
        o.host =
            "10.255.255.1";  // unroutable: connect() times out (or fails at once without a route)
        o.io_timeout = 300ms;
        delay_queue q(o);
        const auto t0 = std::chrono::steady_clock::now();
        CHECK_THROWS_AS(q.put_after("a", "p", 0ms), delayq::redis::error);
        CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // bounded by io_timeout, not a hang
    }
}

TEST_CASE("redis misuse: payload larger than the server's proto-max-bulk-len", "[limits]") {
    // The server closes the connection after "ERR Protocol error"; that connection used to go back
    // to the pool, so the next call failed too ("Connection reset by peer"). Fixed in the header
    // (a protocol error marks the connection broken): the next call reconnects.
    delayq_test::redis_server server({"--proto-max-bulk-len", "1mb"});
    delay_queue q(opts(server.port()));
    const std::string big(2 * 1024 * 1024, 'x');
    const std::string m = message_of<delayq::redis::error>([&] { q.put_after("big", big, 0ms); });
    INFO(m);
    // the server's words ("ERR Protocol error: invalid bulk length"), or, when the server's reset
    // of the connection wins the race with that reply, the connection error
    CHECK((contains(m, "bulk length") || contains(m, "reset") || contains(m, "Broken pipe")));
    CHECK(q.size() == 0);  // nothing half-queued, and the very next call works
    CHECK(q.put_after("small", "p", 0ms));
    auto j = q.take(1s);
    REQUIRE(j);
    CHECK(j->id == "small");
    CHECK(q.ack(*j));
    CHECK(q.size() == 0);
}
