// The `delayq` command (tools/delayq.cpp) against one backend's store: this file is built once per
// backend (DELAYQ_COMMAND_TEST_SQLITE, _REDIS, _POSTGRES), each binary on a store of its own. The
// command runs as a process, as an operator runs it; the library sets up and checks what it sees.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "catch.hpp"

#if defined(DELAYQ_COMMAND_TEST_SQLITE)
#include "../sqlite/sqlite_files.hpp"
#elif defined(DELAYQ_COMMAND_TEST_REDIS)
#include "../redis/redis_server.hpp"
#elif defined(DELAYQ_COMMAND_TEST_POSTGRES)
#include "../postgres/pg_fixture.hpp"
#endif

namespace {

using namespace std::chrono_literals;

struct result {
    int status = -1;
    std::string out;  // stdout and stderr together
};

result delayq_command(const std::string& args) {
    result r;
    const std::string cmd = std::string(DELAYQ_COMMAND) + " " + args + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
    const int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

// For the shell: a PostgreSQL URL has '&' and '?'.
std::string quoted(const std::string& url) {
    return "'" + url + "'";
}

bool has(const result& r, const std::string& s) {
    return r.out.find(s) != std::string::npos;
}

// The store under test: a URL for the command, and a queue object on the same queue.
#if defined(DELAYQ_COMMAND_TEST_SQLITE)
struct store {
    delayq_sqlite_test::temp_dir dir;
    std::unique_ptr<delayq::sqlite::delay_queue> q =
        std::make_unique<delayq::sqlite::delay_queue>(delayq_sqlite_test::opts(dir.file()));
    std::string url() const { return "sqlite:" + dir.file(); }
    std::string unreachable() const { return "sqlite:" + dir.file("missing.db"); }
};
#elif defined(DELAYQ_COMMAND_TEST_REDIS)
struct store {
    delayq_test::redis_server server;
    std::unique_ptr<delayq::redis::delay_queue> q = std::make_unique<delayq::redis::delay_queue>(
        delayq_test::queue_options(server.port(), "orders"));
    std::string url() const {
        return "redis://127.0.0.1:" + std::to_string(server.port()) + "/orders";
    }
    std::string unreachable() const {
        return "redis://127.0.0.1:" + std::to_string(delayq_test::free_port()) + "/orders";
    }
};
#elif defined(DELAYQ_COMMAND_TEST_POSTGRES)
struct store {
    std::string name = delayq_pg_test::fresh_name("command");
    std::unique_ptr<delayq::postgres::delay_queue> q =
        std::make_unique<delayq::postgres::delay_queue>(delayq_pg_test::opts(name));
    std::string url() const {
        return "postgresql://postgres@127.0.0.1:" +
               std::to_string(delayq_pg_test::server().port()) +
               "/postgres?connect_timeout=5&queue=" + name;
    }
    std::string unreachable() const {
        return "postgresql://postgres@127.0.0.1:" + std::to_string(delayq_test::free_port()) +
               "/postgres?queue=" + name;
    }
};
#endif

}  // namespace

TEST_CASE("delayq command: put, get, stats and cancel") {
    store s;
    const std::string u = quoted(s.url());
    auto r = delayq_command(u + " put order-42 hello --in 1h");
    CHECK(r.status == 0);
    CHECK(has(r, "queued"));
    r = delayq_command(u + " put order-42 again --in 1h");
    CHECK(r.status == 1);  // already queued
    REQUIRE(s.q->size() == 1);

    r = delayq_command(u + " get order-42 --json");
    CHECK(r.status == 0);
    CHECK(has(r, "\"state\":\"waiting\""));
    CHECK(has(r, "\"payload\":\"hello\""));
    r = delayq_command(u + " get order-42");
    CHECK(r.status == 0);
    CHECK(has(r, "state       waiting"));
    r = delayq_command(u + " get nobody");
    CHECK(r.status == 1);

    r = delayq_command(u + " stats --json");
    CHECK(r.status == 0);
    CHECK(has(r, "\"waiting\":1,\"due_now\":0,\"leased\":0,\"dead\":0,\"lag_ms\":0"));
    r = delayq_command(u + " stats");
    CHECK(r.status == 0);
    CHECK(has(r, "waiting  1"));

    r = delayq_command(u + " cancel order-42");
    CHECK(r.status == 0);
    CHECK(s.q->size() == 0);
    r = delayq_command(u + " cancel order-42");
    CHECK(r.status == 1);
}

TEST_CASE("delayq command: dead letters, requeue and purge") {
    store s;
    const std::string u = quoted(s.url());
    REQUIRE(s.q->put_after("bad", "p", 0ms));
    auto j = s.q->take(5s);
    REQUIRE(j.has_value());
    REQUIRE(s.q->bury(*j, "the card was declined"));

    auto r = delayq_command(u + " dead --json");
    CHECK(r.status == 0);
    CHECK(has(r, "\"id\":\"bad\""));
    CHECK(has(r, "\"state\":\"dead\""));
    CHECK(has(r, "the card was declined"));
    r = delayq_command(u + " list --state dead");
    CHECK(r.status == 0);
    CHECK(has(r, "bad"));
    r = delayq_command(u + " list --state asleep");
    CHECK(r.status == 2);
    r = delayq_command(u + " dead --state waiting");
    CHECK(r.status == 2);

    r = delayq_command(u + " requeue bad");
    CHECK(r.status == 0);
    CHECK(s.q->dead_size() == 0);
    r = delayq_command(u + " requeue bad");
    CHECK(r.status == 1);  // not dead any more
    auto again = s.q->take(5s);
    REQUIRE(again.has_value());
    CHECK(again->id == "bad");
    REQUIRE(s.q->bury(*again, "still declined"));

    r = delayq_command(u + " purge --older-than 1h");
    CHECK(r.status == 0);
    CHECK(has(r, "purged 0"));
    std::this_thread::sleep_for(20ms);
    r = delayq_command(u + " purge --older-than 0s --json");
    CHECK(r.status == 0);
    CHECK(has(r, "{\"purged\":1}"));
    CHECK(s.q->dead_size() == 0);
}

TEST_CASE("delayq command: list pages the waiting and the leased jobs") {
    store s;
    const std::string u = quoted(s.url());
    const auto now = std::chrono::system_clock::now();
    REQUIRE(s.q->put("later", "p2", now + 2h));
    REQUIRE(s.q->put("soon", "p1", now + 1h));
    REQUIRE(s.q->put("now", "p0", now - 1s));

    auto r = delayq_command(u + " list --state waiting --json");
    CHECK(r.status == 0);
    const auto soon = r.out.find("\"id\":\"soon\"");
    CHECK(r.out.find("\"id\":\"now\"") < soon);
    CHECK(soon < r.out.find("\"id\":\"later\""));
    CHECK(has(r, "\"state\":\"waiting\""));
    CHECK(has(r, "\"payload\":\"p1\""));
    r = delayq_command(u + " list --max 2");  // waiting, by default
    CHECK(r.status == 0);
    CHECK(has(r, "  now  "));
    CHECK(has(r, "(more: --after soon)"));
    CHECK_FALSE(has(r, "later"));
    r = delayq_command(u + " list --state waiting --after soon");
    CHECK(r.status == 0);
    CHECK(has(r, "later"));
    CHECK_FALSE(has(r, "soon"));

    auto j = s.q->take(5s);
    REQUIRE(j.has_value());
    REQUIRE(j->id == "now");
    r = delayq_command(u + " list --state leased --json");
    CHECK(r.status == 0);
    CHECK(has(r, "\"id\":\"now\""));
    CHECK(has(r, "\"state\":\"leased\""));
    CHECK_FALSE(has(r, "soon"));
    r = delayq_command(u + " list --state waiting");
    CHECK(r.status == 0);
    CHECK_FALSE(has(r, "  now  "));
    r = delayq_command(u + " list --state leased --after soon --json");
    CHECK(r.status == 0);
    CHECK(has(r, "[]"));
}

TEST_CASE("delayq command: pause and resume are seen by the queue's objects") {
    store s;
    const std::string u = quoted(s.url());
    auto r = delayq_command(u + " pause");
    CHECK(r.status == 0);
    CHECK(s.q->paused());
    r = delayq_command(u + " resume --json");
    CHECK(r.status == 0);
    CHECK(has(r, "{\"ok\":true}"));
    CHECK_FALSE(s.q->paused());
}

TEST_CASE("delayq command: bad command lines and an unreachable store say so") {
    store s;
    const std::string u = quoted(s.url());
    CHECK(delayq_command(u).status == 2);
    CHECK(delayq_command(u + " frobnicate").status == 2);
    CHECK(delayq_command(u + " put a b --in soon").status == 2);
    CHECK(delayq_command(u + " get").status == 2);
    CHECK(delayq_command(u + " purge").status == 2);
    CHECK(delayq_command("mysql://x/y stats").status == 2);
    auto r = delayq_command(quoted(s.unreachable()) + " stats --timeout 2s");
    CHECK(r.status == 3);
    CHECK(has(r, "delayq: "));
    CHECK(r.out.find('\n') == r.out.size() - 1);  // one line
}

TEST_CASE("delayq command: put --every and --cron queue a series") {
    store s;
    const std::string u = quoted(s.url());
    auto r = delayq_command(u + " put beat p --every 1h");
    CHECK(r.status == 0);
    r = delayq_command(u + " put nightly p --cron '0 3 * * *'");
    CHECK(r.status == 0);
    CHECK(s.q->size() == 2);
    auto info = s.q->get("nightly");
    REQUIRE(info.has_value());
    CHECK(info->state == delayq::job_state::waiting);
    CHECK(delayq_command(u + " put beat p --every 1h").status == 1);  // queued already
    CHECK(delayq_command(u + " put x p --every 0s").status == 2);
    CHECK(delayq_command(u + " put x p --cron '0 25 * * *'").status == 2);
    CHECK(delayq_command(u + " put x p --every 1h --in 1s").status == 2);
    CHECK(delayq_command(u + " cancel beat").status == 0);
    CHECK(delayq_command(u + " cancel nightly").status == 0);
    CHECK(s.q->size() == 0);
}
