// delayq::redis::delay_queue when things die: consumers, connections, the server itself; and many
// producers and consumers at once.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "flow.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq_test::eventually;
using delayq_test::opts;
using delayq_test::redis_server;

namespace {

// A child process whose stdout we read; killed and reaped on destruction.
struct child {
    pid_t pid = -1;
    int out = -1;
    explicit child(std::vector<std::string> args) {
        int fds[2];
        if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
        posix_spawn_file_actions_addclose(&fa, fds[0]);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        const int rc = ::posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        ::close(fds[1]);
        out = fds[0];
        if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
    }
    // One line of output, or "" when none came within `limit`.
    std::string line(std::chrono::milliseconds limit) {
        std::string s;
        const auto end = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < end) {
            pollfd p{out, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            char c;
            if (::read(out, &c, 1) != 1) break;
            if (c == '\n') return s;
            s += c;
        }
        return "";
    }
    void kill9() {
        if (pid < 0) return;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
    }
    ~child() {
        kill9();
        ::close(out);
    }
};

}  // namespace

TEST_CASE(
    "a consumer killed with SIGKILL mid-lease: its job is delivered again when the lease ends") {
    redis_server srv;
    delay_queue q(opts(srv));
    REQUIRE(q.put_after("victim", "p", 0ms));
    // A lease of 2 s: the take(0ms) below comes within it, on a loaded machine too.
    child consumer({DELAYQ_REDIS_CONSUMER_HELPER, std::to_string(srv.port()), "q", "2000"});
    REQUIRE(consumer.line(10s) == "victim");
    consumer.kill9();
    CHECK_FALSE(q.take(0ms));  // leased to the dead consumer until its lease ends
    auto j = q.take(10s);
    REQUIRE(j);
    CHECK(j->id == "victim");
    CHECK(j->attempts == 2);
    CHECK(q.ack(*j));
}

TEST_CASE(
    "redis-server killed with SIGKILL after N acknowledged puts keeps all N (appendfsync always)") {
    redis_server srv({"--appendfsync", "always"});
    delay_queue q(opts(srv));
    constexpr int n = 200;
    for (int i = 0; i < n; ++i)
        REQUIRE(q.put_after("j" + std::to_string(i), std::to_string(i), i % 2 ? 0ms : 1h));
    srv.kill9();
    CHECK_THROWS_AS(q.size(), delayq::redis::error);  // a clear error, not a hang or a wrong answer
    srv.restart();
    // The object reconnects by itself; a server still loading is retried within io_timeout.
    CHECK(q.size() == n);
    CHECK_FALSE(q.put_after("j0", "dup", 0ms));
    int taken = 0;
    while (auto j = q.take(0ms)) {
        CHECK(q.ack(*j));
        ++taken;
    }
    CHECK(taken == n / 2);
}

TEST_CASE(
    "CLIENT KILL of a waiting consumer's subscription: it reconnects and still gets the job") {
    redis_server srv;
    delay_queue consumer(opts(srv));
    auto taken = std::async(std::launch::async, [&] { return consumer.take(20s); });
    // The id of the connection that listens for wake-ups, or "" if there is none.
    const auto listener = [&] {
        const std::string list = srv.text({"CLIENT", "LIST"});
        const auto line = list.find("cmd=subscribe");
        if (line == std::string::npos) return std::string();
        const auto id_at = list.rfind("id=", line);
        return list.substr(id_at + 3, list.find(' ', id_at) - id_at - 3);
    };
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1; }));
    const std::string id = listener();
    REQUIRE_FALSE(id.empty());
    REQUIRE(srv.command({"CLIENT", "KILL", "ID", id})->integer == 1);
    REQUIRE(eventually(
        [&] { return srv.waiting_objects() == 1 && listener() != id && !listener().empty(); }));
    delay_queue producer(opts(srv));
    REQUIRE(producer.put_after("after-kill", "", 0ms));
    REQUIRE(taken.wait_for(10s) == std::future_status::ready);
    auto j = taken.get();
    REQUIRE(j);
    CHECK(j->id == "after-kill");
}

TEST_CASE("4 producers x 4 consumers with random delays and nacks: every job acked exactly once") {
    redis_server srv;
    delay_queue q(opts(srv));  // one object shared by every thread, as the contract allows
    const auto r = delayq_test::run_flow(q, {});
    for (const auto& f : r.failures) FAIL_CHECK(f);
    CHECK(r.all_acked_once());
    CHECK(r.nacks > 0);
    CHECK(q.size() == 0);
}
