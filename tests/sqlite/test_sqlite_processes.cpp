// delayq::sqlite::delay_queue as production runs it: several processes (fork()ed from the test,
// not threads) on one file, created at once, opened and closed beside each other, killed with
// SIGKILL. What every test counts: a put that returned true is in the file afterwards.
// The children: child_processes.hpp.
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <delayq/worker.hpp>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "child_processes.hpp"
#include "expect_error.hpp"
#include "sqlite_files.hpp"

using namespace std::chrono_literals;
using delayq::sqlite::delay_queue;
using delayq::test::contains;
using delayq_sqlite_test::channel;
using delayq_sqlite_test::child;
using delayq_sqlite_test::integrity;
using delayq_sqlite_test::kill_9;
using delayq_sqlite_test::opts;
using delayq_sqlite_test::temp_dir;
using delayq_sqlite_test::wait_for;

namespace {

const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

// What a peer's creation leaves for an instant, and what `sqlite3 FILE 'PRAGMA
// journal_mode=WAL'` leaves for good: an SQLite file in WAL mode, its header written, no tables.
void make_empty_wal_database(const std::string& path) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
}

// How many of `ids` are queued in `path`: cancel() is true exactly for a queued id.
std::size_t still_queued(const std::string& path, const std::vector<std::string>& ids) {
    delay_queue q(opts(path));
    std::size_t n = 0;
    for (const auto& id : ids) n += q.cancel(id) ? 1 : 0;
    return n;
}

// The test's side beside a holder process: the ids of the puts it says returned until "ready";
// then this process opens and closes the file; then the rest, until "done"; then kill -9.
std::vector<std::string> beside_holder(const std::string& path, pid_t holder, channel& up,
                                       channel& down) {
    std::vector<std::string> returned;
    const auto until = [&](const std::string& word) {
        std::string line;
        while ((line = up.hear()) != word && !line.empty())
            if (line.rfind("put ", 0) == 0) returned.push_back(line.substr(4));
        return line == word;
    };
    const bool ready = until("ready");
    if (ready) delay_queue(opts(path)).size();  // opens and closes the file
    down.say("go");
    const bool done = ready && until("done");
    kill_9(holder);
    CHECK(done);
    return returned;
}

}  // namespace

TEST_CASE("processes: a queue keeps its puts when another process opens and closes the file") {
    temp_dir dir;
    const std::string path = dir.file();
    SECTION("a file the holder created") {}
    SECTION("a file that was an empty SQLite database") {
        make_empty_wal_database(path);
    }
    channel up, down;  // child -> test, test -> child
    const pid_t holder = child([&] {
        up.close_read();
        down.close_write();
        delay_queue q(opts(path));
        if (!q.put("held-0", "x", past)) return 2;
        up.say("put held-0");
        up.say("ready");
        if (down.hear() != "go") return 3;
        for (int i = 1; i < 10; ++i) {
            const std::string id = "held-" + std::to_string(i);
            if (q.put(id, "x", past)) up.say("put " + id);
        }
        up.say("done");
        for (;;) ::pause();  // killed with SIGKILL: no destructor runs, no checkpoint
    });
    up.close_write();
    down.close_read();
    const auto returned = beside_holder(path, holder, up, down);
    CHECK(returned.size() == 10);
    CHECK(integrity(path) == "ok");
    CHECK(still_queued(path, returned) == returned.size());
}

TEST_CASE("processes: a second queue object on the file in the same process changes nothing") {
    temp_dir dir;
    const std::string path = dir.file();
    channel up, down;
    const pid_t holder = child([&] {
        up.close_read();
        down.close_write();
        delay_queue q(opts(path));
        if (!q.put("a-0", "x", past)) return 2;
        up.say("put a-0");
        {
            delay_queue second(opts(path));  // the same file, the same process
            if (!second.put("b-0", "x", past)) return 3;
            up.say("put b-0");
        }
        for (int i = 1; i < 5; ++i) {
            const std::string id = "a-" + std::to_string(i);
            if (q.put(id, "x", past)) up.say("put " + id);
        }
        up.say("ready");
        if (down.hear() != "go") return 4;  // another process has opened and closed it
        for (int i = 5; i < 10; ++i) {
            const std::string id = "a-" + std::to_string(i);
            if (q.put(id, "x", past)) up.say("put " + id);
        }
        up.say("done");
        for (;;) ::pause();
    });
    up.close_write();
    down.close_read();
    const auto returned = beside_holder(path, holder, up, down);
    CHECK(returned.size() == 11);
    CHECK(integrity(path) == "ok");
    CHECK(still_queued(path, returned) == returned.size());
}

TEST_CASE("processes: 8 processes create one new file at once, and every returned put is kept") {
    temp_dir dir;
    constexpr int rounds = 12, processes = 8, puts = 3;
    std::size_t failed = 0, returned_total = 0, lost = 0;
    std::vector<std::string> errors;
    for (int round = 0; round < rounds; ++round) {
        const std::string path = dir.file(("race-" + std::to_string(round) + ".db").c_str());
        channel start, up;
        std::vector<pid_t> pids;
        for (int p = 0; p < processes; ++p)
            pids.push_back(child([&, p] {
                start.close_write();
                up.close_read();
                start.wait_closed();  // every process starts at once
                try {
                    auto q = std::make_unique<delay_queue>(opts(path));
                    for (int i = 0; i < puts; ++i) {
                        const std::string id = "p" + std::to_string(p) + "-" + std::to_string(i);
                        if (q->put_after(id, "x", std::chrono::milliseconds(i)))
                            up.say("put " + id);
                        else
                            up.say("error refused " + id);
                    }
                    // Half leave as a crash would (no destructor, no checkpoint), half close
                    // the file while the others may still be writing.
                    if (p % 2 == 0) std::_Exit(0);
                } catch (const std::exception& e) {
                    up.say(std::string("error ") + e.what());
                }
                return 0;
            }));
        start.close_write();  // go
        up.close_write();
        std::vector<std::string> returned;
        for (const auto& l : up.hear_all()) {
            if (l.rfind("put ", 0) == 0) returned.push_back(l.substr(4));
            if (l.rfind("error ", 0) == 0) {
                ++failed;
                if (errors.size() < 5) errors.push_back(l);
            }
        }
        for (const pid_t pid : pids) wait_for(pid);
        returned_total += returned.size();
        INFO("round " << round);
        CHECK(integrity(path) == "ok");
        lost += returned.size() - still_queued(path, returned);
    }
    for (const auto& e : errors) UNSCOPED_INFO(e);
    CHECK(failed == 0);
    CHECK(lost == 0);
    CHECK(returned_total == static_cast<std::size_t>(rounds * processes * puts));
}

TEST_CASE("processes: a put into a WAL that was removed from under the queue does not return") {
    temp_dir dir;
    const std::string path = dir.file();
    delay_queue q(opts(path));
    REQUIRE(q.put("before", "x", past));
    // Not SQLite: what `rm` (or a program ignoring SQLite's locks) does to a live queue.
    REQUIRE(::unlink((path + "-wal").c_str()) == 0);
    const auto msg =
        delayq::test::message_of<delayq::sqlite::error>([&] { q.put("after", "x", past); });
    CHECK(contains(msg, path));
    CHECK(contains(msg, "removed"));
}

TEST_CASE("processes: opening waits out another connection's lock within busy_timeout") {
    temp_dir dir;
    const std::string path = dir.file();
    {
        delay_queue q(opts(path));
        REQUIRE(q.put("kept", "x", past));
    }
    // Back to a rollback journal, as a file left by a creator that died before its switch to
    // WAL, which the next open makes; another connection holds a lock on it meanwhile.
    sqlite3* other = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &other) == SQLITE_OK);
    REQUIRE(sqlite3_exec(other, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr) ==
            SQLITE_OK);
    const char* lock = GENERATE("BEGIN IMMEDIATE",                    // a writer
                                "BEGIN; SELECT count(*) FROM jobs");  // a reader
    INFO(lock);
    REQUIRE(sqlite3_exec(other, lock, nullptr, nullptr, nullptr) == SQLITE_OK);
    SECTION("a lock let go within busy_timeout") {
        std::thread let_go([&] {
            std::this_thread::sleep_for(300ms);
            sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
        });
        auto o = opts(path);
        o.busy_timeout = 20s;
        std::unique_ptr<delay_queue> q;
        try {
            q = std::make_unique<delay_queue>(o);
        } catch (const std::exception& e) {
            FAIL_CHECK(e.what());
        }
        let_go.join();
        if (q) CHECK(q->size() == 1);
    }
    SECTION("a lock held on: busy_error after busy_timeout, saying so") {
        auto o = opts(path);
        o.busy_timeout = 300ms;
        const auto start = std::chrono::steady_clock::now();
        const auto msg =
            delayq::test::message_of<delayq::sqlite::busy_error>([&] { delay_queue q(o); });
        CHECK(std::chrono::steady_clock::now() - start >= 300ms);
        CHECK(contains(msg, path));
        CHECK(contains(msg, "busy_timeout (300 ms)"));
        sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
    }
    sqlite3_close(other);
}

TEST_CASE("processes: a job cancelled by another process is not handed out by a later take") {
    temp_dir dir;
    const std::string path = dir.file();
    channel up, down;
    const pid_t admin = child([&] {  // started before this process opens the file
        up.close_read();
        down.close_write();
        delay_queue q(opts(path));
        for (std::string line; !(line = down.hear()).empty();)
            up.say(q.cancel(line) ? "cancelled" : "not queued");
        return 0;
    });
    up.close_write();
    down.close_read();
    {
        delay_queue consumer(opts(path));
        for (int round = 0; round < 3; ++round) {
            const std::string a = "a" + std::to_string(round), b = "b" + std::to_string(round);
            REQUIRE(consumer.put(a, "x", past));
            REQUIRE(consumer.put(b, "y", past + 1ms));
            auto j = consumer.take(5s);
            REQUIRE(j);
            CHECK(j->id == a);
            CHECK(consumer.ack(*j));  // where an ack also leased the next due job, b
            down.say(b);
            CHECK(up.hear() == "cancelled");
            auto after = consumer.take(0ms);  // starts after the cancel returned true
            CHECK_FALSE(after);
            if (after) consumer.ack(*after);
            CHECK(consumer.size() == 0);
        }
    }
    down.close_write();
    wait_for(admin);
}

TEST_CASE(
    "processes: a job that kills its consumer at once is dead after max_attempts deliveries") {
    temp_dir dir;
    const std::string path = dir.file();
    auto o = opts(path);
    o.lease = 1s;
    o.max_attempts = 1;
    {
        delay_queue q(o);
        REQUIRE(q.put("a", "fine", past));
        REQUIRE(q.put("poison", "kills its consumer", past + 1ms));
        REQUIRE(q.put("c", "fine", past + 2ms));
    }
    channel up;
    const pid_t consumer = child([&] {
        up.close_read();
        delay_queue q(o);
        while (auto j = q.take(5s)) {
            up.say("took " + j->id + " " + std::to_string(j->attempts));
            if (j->payload != "fine") ::raise(SIGKILL);  // the job crashes its process
            q.ack(*j);
        }
        return 0;
    });
    up.close_write();
    std::vector<std::string> took = up.hear_all();
    wait_for(consumer);
    CHECK(took == std::vector<std::string>{"took a 1", "took poison 1"});
    delay_queue q(o);
    std::vector<std::string> later;
    while (auto j = q.take(3s)) {  // the poison job's lease ends within a second
        later.push_back(j->id + " " + std::to_string(j->attempts));
        q.ack(*j);
    }
    CHECK(later == std::vector<std::string>{"c 1"});
    CHECK(q.dead_size() == 1);
    CHECK(q.size() == 0);
}

TEST_CASE(
    "processes: a worker's handler keeps its lease past its end, and a worker killed "
    "with SIGKILL mid-handler has its job back one lease later") {
    temp_dir dir;
    const std::string path = dir.file();
    auto o = opts(path);
    o.lease = 500ms;
    {
        delay_queue q(o);
        REQUIRE(q.put("long", "x", past));
    }
    channel up;
    const pid_t holder = child([&] {
        up.close_read();
        delay_queue q(o);
        delayq::worker w(q, [&](const delayq::job& j) {
            up.say("started " + std::to_string(j.attempts));
            std::this_thread::sleep_for(std::chrono::hours(1));  // until the kill
        });
        std::this_thread::sleep_for(std::chrono::hours(1));
        return 0;
    });
    up.close_write();
    REQUIRE(up.hear() == "started 1");
    delay_queue q(o);
    CHECK_FALSE(q.take(5500ms));  // eleven leases: the worker extended it meanwhile
    kill_9(holder);
    const auto killed = std::chrono::steady_clock::now();
    auto j = q.take(60s);
    REQUIRE(j);  // its extensions stopped: the lease ends, at most one lease after the kill
    CHECK(j->attempts == 2);
    CHECK(std::chrono::steady_clock::now() - killed < 30s);  // not a timing: "never" is broken
    CHECK(q.ack(*j));
}

TEST_CASE("processes: two processes with max_leased 2 never hold more than 2 leases at once") {
    temp_dir dir;
    const std::string path = dir.file();
    auto o = opts(path);  // foreign_changes 50 ms: how late a process sees the other's acks
    o.limits = {.max_leased = 2, .rate = 0, .period = 0ms};
    constexpr int jobs = 60, processes = 2, threads = 3;
    {
        delay_queue q(o);
        for (int i = 0; i < jobs; ++i) REQUIRE(q.put("j" + std::to_string(i), "x", past));
    }
    // What the consumers of both processes share: the handlers running now, the most at once,
    // the jobs done. In memory shared across fork(), lock-free atomics.
    struct shared {
        std::atomic<int> running, most, done;
    };
    static_assert(std::atomic<int>::is_always_lock_free);
    void* m =
        ::mmap(nullptr, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    auto* sh = new (m) shared{{0}, {0}, {0}};
    std::vector<pid_t> pids;
    for (int p = 0; p < processes; ++p)
        pids.push_back(child([&] {
            delay_queue q(o);
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; ++t)
                ts.emplace_back([&] {
                    const auto give_up = std::chrono::steady_clock::now() + 60s;
                    while (sh->done < jobs && std::chrono::steady_clock::now() < give_up) {
                        auto j = q.take(100ms);
                        if (!j) continue;
                        // Between the lease and the ack: this lease is held at least as long.
                        const int now = ++sh->running;
                        int seen = sh->most.load();
                        while (now > seen && !sh->most.compare_exchange_weak(seen, now)) {
                        }
                        std::this_thread::sleep_for(5ms);
                        --sh->running;
                        if (q.ack(*j)) ++sh->done;
                    }
                });
            for (auto& t : ts) t.join();
            return sh->done >= jobs ? 0 : 1;
        }));
    // The file's own count of the leases, meanwhile, through a connection opened after the fork.
    std::size_t most_leased = 0;
    {
        delay_queue watcher(opts(path));
        const auto give_up = std::chrono::steady_clock::now() + 90s;
        while (sh->done < jobs && std::chrono::steady_clock::now() < give_up) {
            most_leased = std::max(most_leased, watcher.stats().leased);
            std::this_thread::sleep_for(2ms);
        }
    }
    for (const pid_t pid : pids) CHECK(wait_for(pid) == 0);
    CHECK(sh->done == jobs);
    CHECK(sh->most <= 2);
    CHECK(sh->most >= 1);
    CHECK(most_leased <= 2);
    CHECK(delay_queue(opts(path)).size() == 0);
    ::munmap(m, sizeof(shared));
}
