// delayq::sqlite::delay_queue beyond the shared contract (test_sqlite_contract.cpp): options, the
// file across reopening, other processes, group commit, every typed error, and pausing.
#include <fcntl.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <delayq/detail/job_queue/exception_copy.hpp>
#include <exception>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "child_processes.hpp"
#include "expect_error.hpp"
#include "sqlite_files.hpp"

using namespace std::chrono_literals;
using delayq::sqlite::delay_queue;
using delayq::test::contains;
using delayq::test::message_of;
using delayq_sqlite_test::channel;
using delayq_sqlite_test::child;
using delayq_sqlite_test::integrity;
using delayq_sqlite_test::opts;
using delayq_sqlite_test::temp_dir;
using delayq_sqlite_test::wait_for;

namespace {

const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

std::string numbered(const char* prefix, std::size_t n) {
    std::string s(prefix);
    s += std::to_string(n);
    return s;
}

// Runs the helper program with `args`; its first line of output. No Catch assertion here: tests
// call it from threads of their own, and Catch's assertions are for the test's thread.
std::string helper(const std::string& args) {
    const std::string cmd = std::string(DELAYQ_SQLITE_HELPER) + " " + args + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return "popen failed: " + cmd;
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
}

// Runs `sql` on `path` through a plain SQLite connection of its own.
void raw_exec(const std::string& path, const char* sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
    const std::string msg = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    INFO(msg);
    REQUIRE(rc == SQLITE_OK);
}

// The first column of the first row of `sql` on `path`, as text, through a connection of its own.
std::string raw_text(const std::string& path, const char* sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    std::string out;
    const auto first = [](void* to, int, char** values, char**) {
        if (values[0] != nullptr) *static_cast<std::string*>(to) = values[0];
        return 1;  // one row is enough
    };
    sqlite3_exec(db, sql, first, &out, nullptr);
    sqlite3_close(db);
    return out;
}

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_at(const std::string& path, long offset, const std::string& bytes) {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    REQUIRE(f);
    std::fseek(f, offset, SEEK_SET);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
}

}  // namespace

TEST_CASE("bad options and ids are std::invalid_argument naming the problem") {
    temp_dir dir;
    auto fails_with = [](delayq::sqlite::options bad, const std::string& word) {
        try {
            delay_queue q(std::move(bad));
        } catch (const std::invalid_argument& e) {
            return contains(e.what(), word);
        }
        return false;
    };
    delayq::sqlite::options o;
    CHECK(fails_with(o, "path"));
    o = opts(dir.file());
    o.lease = 0ms;
    CHECK(fails_with(o, "lease"));
    o = opts(dir.file());
    o.busy_timeout = -1ms;
    CHECK(fails_with(o, "busy_timeout"));
    o = opts(dir.file());
    o.foreign_changes = 0ms;
    CHECK(fails_with(o, "foreign_changes"));
    o = opts(dir.file());
    o.reclaim_batch = 0;
    CHECK(fails_with(o, "reclaim_batch"));
    o = opts(dir.file());
    o.commit_batch = 0;
    CHECK(fails_with(o, "commit_batch"));
    o = opts(dir.file());
    o.keep_dead = -1ms;
    CHECK(fails_with(o, "keep_dead"));
    delay_queue q(opts(dir.file()));
    CHECK(q.get_options().path == dir.file());
    CHECK_THROWS_AS(q.put_after("", "x", 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.cancel(""), std::invalid_argument);
}

TEST_CASE("the file is marked as a delayq queue and is in WAL mode") {
    temp_dir dir;
    { delay_queue q(opts(dir.file())); }
    const std::string bytes = read_all(dir.file());
    REQUIRE(bytes.size() >= 100);
    CHECK(bytes.compare(0, 16, std::string("SQLite format 3", 16)) == 0);
    CHECK(bytes[18] == 2);                                     // WAL (1 is the rollback journal)
    CHECK(bytes.substr(68, 4) == "dQuq");                      // application_id, big-endian
    CHECK(bytes.substr(60, 4) == std::string("\0\0\0\1", 4));  // user_version: format 1
}

TEST_CASE("a reopened file holds every pending job, and leases and tokens carry on") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.lease = 2s;
    delayq::job held;
    {
        delay_queue q(o);
        for (std::size_t i = 0; i < 100; ++i) REQUIRE(q.put(numbered("p", i), "x", past));
        REQUIRE(q.put_after("later", "y", 1h));
        auto j = q.take(5s);
        REQUIRE(j);
        held = *j;
    }
    delay_queue q(o);
    CHECK(q.size() == 101);
    std::size_t taken = 0;
    while (taken < 99) {
        auto some = q.take_many(50, 5s);
        REQUIRE_FALSE(some.empty());
        for (const auto& j : some) {
            CHECK(j.id != held.id);  // still leased by the holder before the reopen
        }
        taken += some.size();
        const auto acked = q.ack_many(some);
        CHECK(std::count(acked.begin(), acked.end(), true) == static_cast<long>(some.size()));
    }
    CHECK(taken == 99);
    auto again = q.take(30s);  // the held job, once its lease ended
    REQUIRE(again);
    CHECK(again->id == held.id);
    CHECK(again->attempts == 2);
    CHECK(again->token > held.token);  // a lease of the same job: a greater token
    CHECK_FALSE(q.ack(held));
    CHECK(q.ack(*again));
    CHECK(q.size() == 1);  // "later"
}

TEST_CASE("a reopened file keeps a lease that extend moved, and the row that bury made dead") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.lease = 1s;
    delayq::job a;
    {
        delay_queue q(o);
        REQUIRE(q.put("a", "pa", past));
        REQUIRE(q.put("b", "pb", past + 1ms));
        auto both = q.take_many(2, 5s);
        REQUIRE(both.size() == 2);
        a = both[0];
        CHECK(a.id == "a");
        CHECK(q.extend(a, 1h));
        CHECK(q.bury(both[1]));
    }
    delay_queue q(o);
    CHECK_FALSE(q.take(2s));  // past the first lease's end: "a" is still leased
    CHECK(q.size() == 1);
    CHECK(q.dead_size() == 1);
    CHECK(raw_text(dir.file(),
                   "SELECT CAST(id AS TEXT) || ':' || CAST(payload AS TEXT) || ':' || "
                   "attempts FROM dead") == "b:pb:1");
    CHECK(q.ack(a));  // the holder's token, which extend kept, across the reopen
}

TEST_CASE("a job's next lease has a greater token, even after the clock stepped back") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    REQUIRE(q.put("a", "x", past));
    REQUIRE(q.put("b", "x", past + 1ms));
    auto both = q.take_many(2, 5s);
    REQUIRE(both.size() == 2);
    CHECK(both[0].token != both[1].token);
    REQUIRE(q.nack(both[0], 0ms));
    auto again = q.take(5s);
    REQUIRE(again);
    CHECK(again->id == "a");
    CHECK(again->token > both[0].token);
    // As if its last lease were an hour ahead of the clock (a clock stepped back since): the
    // next token still grows.
    REQUIRE(q.nack(*again, 0ms));
    const long long ahead = static_cast<long long>(again->token) + 3'600'000LL * 1024;
    raw_exec(dir.file(),
             ("UPDATE jobs SET token = " + std::to_string(ahead) + " WHERE id = CAST('a' AS BLOB)")
                 .c_str());
    auto later = q.take(5s);
    REQUIRE(later);
    CHECK(later->id == "a");
    CHECK(later->token == static_cast<std::uint64_t>(ahead) + 1);
    CHECK_FALSE(q.ack(*again));
    CHECK(q.ack(*later));
    CHECK(q.ack(both[1]));
}

TEST_CASE("an ack leases nothing: another handle takes the next due job at once") {
    temp_dir dir;
    auto o = opts(dir.file());
    delay_queue q(o);
    delay_queue other(o);
    REQUIRE(q.put("a", "x", past));
    REQUIRE(q.put("b", "y", past + 1ms));
    auto a = q.take(5s);
    REQUIRE(a);
    CHECK(a->id == "a");
    CHECK(q.ack(*a));
    auto b = other.take(0ms);
    REQUIRE(b);
    CHECK(b->id == "b");
    CHECK(b->attempts == 1);
    CHECK(other.ack(*b));
}

TEST_CASE("a file of an earlier version: a job an ack kept comes back when its hold ends") {
    // Earlier versions had a prefetch: an ack could lease the next due job for its object's next
    // take, for a short hold, its attempt not counted and its token stored negated.
    temp_dir dir;
    auto o = opts(dir.file());
    o.max_attempts = 1;  // an uncounted delivery must not dead-letter it
    {
        delay_queue q(o);
        REQUIRE(q.put("ended", "x", past));
        REQUIRE(q.put("holding", "y", past + 1ms));
    }
    using namespace std::chrono;
    const long long now =
        duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
    const std::string sql = "UPDATE jobs SET lease_end = " + std::to_string(now - 1000) +
                            ", token = -7 WHERE id = CAST('ended' AS BLOB);"
                            "UPDATE jobs SET lease_end = " +
                            std::to_string(now + 2000) +
                            ", token = -8 WHERE id = CAST('holding' AS BLOB);"
                            "UPDATE meta SET value = 8 WHERE name = 'token'";
    raw_exec(dir.file(), sql.c_str());
    delay_queue q(o);
    auto first = q.take(0ms);  // its hold ended: reclaimed and leased again
    REQUIRE(first);
    CHECK(first->id == "ended");
    CHECK(first->attempts == 1);
    CHECK(first->token > 8);
    CHECK_FALSE(q.take(0ms));  // still held for the earlier version's object
    auto second = q.take(30s);
    REQUIRE(second);
    CHECK(second->id == "holding");
    CHECK(second->attempts == 1);
    CHECK(second->token > first->token);
    CHECK(std::chrono::system_clock::now() >=
          std::chrono::system_clock::time_point(std::chrono::milliseconds(now + 2000)));
    CHECK(q.ack(*first));
    CHECK(q.ack(*second));
    CHECK(q.size() == 0);
    CHECK(q.dead_size() == 0);
}

TEST_CASE("a put by another process wakes a waiting take") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));  // foreign_changes: 50 ms
    REQUIRE(q.put_after("late", "x", 1h));
    std::optional<delayq::job> got;
    std::thread taker([&] { got = q.take(30s); });
    std::this_thread::sleep_for(200ms);
    CHECK(helper("put " + dir.file() + " other 0") == "queued");
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "other");
    CHECK(got->payload == "from another process");
    CHECK(helper("put " + dir.file() + " late 0") == "refused");  // idempotent across processes
    CHECK(q.ack(*got));
}

TEST_CASE("concurrent puts share commits and every one is in the file") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.commit_batch = 7;  // groups of at most 7: several groups at once
    delay_queue q(o);
    constexpr std::size_t threads = 8, each = 100;
    std::vector<std::thread> ts;
    std::atomic<std::size_t> refused{0};
    for (std::size_t t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (std::size_t i = 0; i < each; ++i)
                if (!q.put_after(numbered(t % 2 ? "odd" : "even", t * each + i), "x", 1h))
                    ++refused;
        });
    for (auto& t : ts) t.join();
    CHECK(refused == 0);
    CHECK(q.size() == threads * each);
    delay_queue reopened(o);
    CHECK(reopened.size() == threads * each);
}

TEST_CASE("durable_puts = false queues the same way") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.durable_puts = false;
    delay_queue q(o);
    REQUIRE(q.put_after("a", "x", 0ms));
    CHECK_FALSE(q.put_after("a", "x", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(q.ack(*j));
}

TEST_CASE("far deadlines and delays saturate instead of overflowing") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    CHECK(q.put("max", "x", std::chrono::system_clock::time_point::max()));
    CHECK(q.put_after("long", "x", std::chrono::milliseconds::max()));
    CHECK(q.put("min", "x", std::chrono::system_clock::time_point::min()));  // due at once
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "min");
    CHECK_FALSE(q.take(0ms));
    CHECK(q.size() == 3);
}

TEST_CASE("errors: a file that is not a queue is not_a_queue_error and stays untouched") {
    temp_dir dir;
    SECTION("a text file") {
        const std::string path = dir.file("notes.txt");
        std::ofstream(path) << "dear diary, today I was opened as a queue\n";
        const std::string before = read_all(path);
        const auto msg =
            message_of<delayq::sqlite::not_a_queue_error>([&] { delay_queue q(opts(path)); });
        CHECK(contains(msg, path));
        CHECK(contains(msg, "not a delayq queue"));
        CHECK(read_all(path) == before);
    }
    SECTION("another application's SQLite database") {
        const std::string path = dir.file("app.db");
        raw_exec(path, "CREATE TABLE customers(name TEXT); INSERT INTO customers VALUES('ann')");
        const std::string before = read_all(path);
        const auto msg =
            message_of<delayq::sqlite::not_a_queue_error>([&] { delay_queue q(opts(path)); });
        CHECK(contains(msg, path));
        CHECK(contains(msg, "another application"));
        CHECK(read_all(path) == before);  // not even switched to WAL
    }
    SECTION("the family: not_a_queue_error is a delayq::sqlite::error and a queue_error") {
        const std::string path = dir.file("x");
        std::ofstream(path) << "x";
        CHECK_THROWS_AS(delay_queue(opts(path)), delayq::sqlite::error);
        CHECK_THROWS_AS(delay_queue(opts(path)), delayq::queue_error);
    }
}

TEST_CASE("errors: a file of a later format is newer_version_error") {
    temp_dir dir;
    { delay_queue q(opts(dir.file())); }
    raw_exec(dir.file(), "PRAGMA user_version = 2");
    const auto msg =
        message_of<delayq::sqlite::newer_version_error>([&] { delay_queue q(opts(dir.file())); });
    CHECK(contains(msg, dir.file()));
    CHECK(contains(msg, "newer delayq"));
    CHECK(contains(msg, "format 2"));
}

TEST_CASE("errors: a damaged file is corrupt_error") {
    temp_dir dir;
    {
        delay_queue q(opts(dir.file()));
        std::vector<delayq::put_request> reqs;
        std::vector<std::string> ids;
        for (std::size_t i = 0; i < 2000; ++i) ids.push_back(numbered("c", i));
        for (const auto& id : ids) reqs.push_back({id, "payload payload payload", 1h});
        q.put_many(reqs);
    }  // the last connection checkpoints the WAL into the file and removes it
    SECTION("its header") {
        write_at(dir.file(), 16, std::string("\x00\x03", 2));  // page size 3: impossible
        const auto msg =
            message_of<delayq::sqlite::corrupt_error>([&] { delay_queue q(opts(dir.file())); });
        CHECK(contains(msg, dir.file()));
        CHECK(contains(msg, "corrupt"));
    }
    SECTION("its pages") {
        // Page 1 (the schema) intact, the tables' pages overwritten.
        write_at(dir.file(), 4096, std::string(8 * 4096, '\x5a'));
        const auto msg = message_of<delayq::sqlite::corrupt_error>([&] {
            delay_queue q(opts(dir.file()));
            q.size();
            q.take(0ms);
        });
        CHECK(contains(msg, dir.file()));
        CHECK(contains(msg, "corrupt"));
    }
}

TEST_CASE("errors: a full disk is disk_full_error, and every put that returned is kept") {
    temp_dir dir;
    SECTION("options::max_size") {
        auto o = opts(dir.file());
        o.max_size = 64 * 1024;
        std::size_t queued = 0;
        const std::string payload(200, 'x');
        std::string msg;
        {
            delay_queue q(o);
            msg = message_of<delayq::sqlite::disk_full_error>([&] {
                for (;; ++queued)
                    if (!q.put_after(numbered("f", queued), payload, 1h))
                        throw std::logic_error("a new id was refused");
            });
            CHECK(q.size() == queued);  // the object stays usable
            REQUIRE(q.put_after("f0", "", 0ms) == false);
        }
        CHECK(queued > 10);
        CHECK(contains(msg, dir.file()));
        CHECK(contains(msg, "disk is full"));
        o.max_size = 0;
        delay_queue q(o);
        CHECK(q.size() == queued);
        CHECK(q.put_after("more", payload, 0ms));  // room again
    }
    SECTION("RLIMIT_FSIZE in another process") {
        const std::string out = helper("fill " + dir.file() + " 200000");
        INFO(out);
        REQUIRE(out.rfind("disk_full_error ", 0) == 0);
        const std::size_t queued = std::stoul(out.substr(16));
        CHECK(queued > 10);
        CHECK(contains(out, dir.file()));
        delay_queue q(opts(dir.file()));
        CHECK(q.size() == queued);
    }
}

TEST_CASE("errors: a lock held past busy_timeout is busy_error, and then the queue works again") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.busy_timeout = 100ms;
    delay_queue q(o);
    REQUIRE(q.put("before", "x", past));
    sqlite3* other = nullptr;
    REQUIRE(sqlite3_open(dir.file().c_str(), &other) == SQLITE_OK);
    REQUIRE(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK);
    const auto msg = message_of<delayq::sqlite::busy_error>([&] { q.put_after("x", "y", 0ms); });
    CHECK(contains(msg, dir.file()));
    CHECK(contains(msg, "busy_timeout (100 ms)"));
    CHECK_THROWS_AS(q.take(0ms), delayq::sqlite::busy_error);
    CHECK_THROWS_AS(q.take(0ms), delayq::unavailable_error);  // any backend's "retry later"
    CHECK_THROWS_AS(q.take(0ms), delayq::queue_error);
    REQUIRE(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(other);
    CHECK(q.put_after("x", "y", 0ms));
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "before");
}

TEST_CASE(
    "errors: a failure copied for another caller is a new object of its type, with its code and "
    "a message of its own (delayq/detail/job_queue/exception_copy.hpp)") {
    const auto copy = [](const std::exception_ptr& e) {
        return delayq::detail::copy_for_caller<delayq::sqlite::error, delayq::sqlite::busy_error>(
            e, [](const auto& x) {
                return std::remove_cvref_t<decltype(x)>(std::string(x.what()), x.code());
            });
    };
    // The object and message an exception_ptr holds.
    const auto held = [](const std::exception_ptr& e) {
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            return std::pair<const void*, const char*>(&x, x.what());
        }
        return std::pair<const void*, const char*>(nullptr, nullptr);
    };
    const auto original =
        std::make_exception_ptr(delayq::sqlite::busy_error("the file is busy", SQLITE_BUSY));
    const auto c = copy(original);
    REQUIRE(c != nullptr);
    CHECK(c != original);
    CHECK(held(c).first != held(original).first);    // an object of its own
    CHECK(held(c).second != held(original).second);  // and a message of its own
    try {
        std::rethrow_exception(c);
    } catch (const std::exception& x) {
        CHECK(typeid(x) == typeid(delayq::sqlite::busy_error));
        CHECK(std::string(x.what()) == "the file is busy");
        CHECK(dynamic_cast<const delayq::sqlite::busy_error&>(x).code() == SQLITE_BUSY);
    }
    // Anything else is handed out as it is: null, a type not listed, a subclass of one (never
    // sliced into its base).
    CHECK(copy(nullptr) == nullptr);
    const auto other = std::make_exception_ptr(std::bad_alloc());
    CHECK(copy(other) == other);
    struct subclass : delayq::sqlite::busy_error {
        using busy_error::busy_error;
    };
    const auto sub = std::make_exception_ptr(subclass("sub", 5));
    CHECK(copy(sub) == sub);
    const auto not_std = std::make_exception_ptr(42);
    CHECK(copy(not_std) == not_std);
}

TEST_CASE("errors: a read-only file is read_only_error") {
    temp_dir dir;
    {
        delay_queue q(opts(dir.file()));
        REQUIRE(q.put("kept", "x", past));
    }
    REQUIRE(::chmod(dir.file().c_str(), 0444) == 0);
    REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);  // others may enter, not write
    if (::geteuid() != 0) {
        const auto msg =
            message_of<delayq::sqlite::read_only_error>([&] { delay_queue q(opts(dir.file())); });
        CHECK(contains(msg, dir.file()));
        CHECK(contains(msg, "read-only"));
    } else {
        // Root writes to a 0444 file regardless: the helper drops to user nobody first.
        const std::string out = helper("nobody " + dir.file());
        INFO(out);
        if (out.rfind("cannot become nobody", 0) == 0) {
            WARN("skipped: running as root and cannot switch to user nobody (" << out << ")");
        } else {
            CHECK(out.rfind("read_only_error ", 0) == 0);
            CHECK(contains(out, dir.file()));
            CHECK(contains(out, "read-only"));
        }
    }
    ::chmod(dir.file().c_str(), 0644);
    delay_queue q(opts(dir.file()));
    CHECK(q.size() == 1);  // nothing lost
}

namespace {

// A helper process whose output goes to `out`; killed with SIGKILL by kill().
class process {
  public:
    process(const std::vector<std::string>& args, const std::string& out) {
        std::vector<char*> argv;
        std::string exe = DELAYQ_SQLITE_HELPER;
        argv.push_back(exe.data());
        std::vector<std::string> copy = args;
        for (auto& a : copy) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        const int rc = ::posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) pid_ = -1;
    }
    ~process() { kill(); }
    process(const process&) = delete;
    process& operator=(const process&) = delete;
    bool started() const noexcept { return pid_ > 0; }
    void kill() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

  private:
    pid_t pid_ = -1;
};

// The second words of the lines of `path` that start with `word`.
std::multiset<std::string> lines(const std::string& path, const std::string& word) {
    std::multiset<std::string> out;
    std::ifstream in(path);
    std::string w, id;
    while (in >> w >> id)
        if (w == word) out.insert(id);
    return out;
}

}  // namespace

TEST_CASE("kill -9 of producers and consumers mid-flow: no returned put lost, no double ack") {
    temp_dir dir;
    const std::string path = dir.file();
    { delay_queue q(opts(path)); }  // created before the processes race to it
    const std::string log = dir.file("log.txt");
    for (int round = 0; round < 4; ++round) {
        std::vector<std::unique_ptr<process>> ps;
        const std::string prefix = numbered("r", static_cast<std::size_t>(round)) + "-";
        ps.push_back(std::make_unique<process>(
            std::vector<std::string>{"produce", path, prefix + "a", "400"}, log));
        ps.push_back(std::make_unique<process>(
            std::vector<std::string>{"produce", path, prefix + "b", "400"}, log));
        ps.push_back(
            std::make_unique<process>(std::vector<std::string>{"consume", path, "1000"}, log));
        ps.push_back(
            std::make_unique<process>(std::vector<std::string>{"consume", path, "1000"}, log));
        for (const auto& p : ps) REQUIRE(p->started());
        std::this_thread::sleep_for(std::chrono::milliseconds(300 + 150 * round));
        for (auto& p : ps) p->kill();  // mid-transaction, quite likely, for some of them
        INFO("round " << round);
        CHECK(integrity(path) == "ok");
    }
    // Drain what is left (the killed consumers' leases end within a second).
    auto o = opts(path);
    o.lease = 1s;
    delay_queue q(o);
    std::multiset<std::string> drained;
    std::size_t early = 0;
    while (auto j = q.take(3s)) {
        if (std::chrono::system_clock::now() < j->deadline) ++early;
        if (q.ack(*j)) drained.insert(j->id);
    }
    CHECK(q.size() == 0);
    CHECK(integrity(path) == "ok");

    const auto put = lines(log, "put");
    const auto acking = lines(log, "acking");
    auto acked = lines(log, "acked");
    acked.insert(drained.begin(), drained.end());
    CHECK(put.size() > 100);  // the test tested something
    CHECK(lines(log, "early").empty());
    CHECK(early == 0);
    std::size_t lost = 0, twice = 0;
    for (const auto& id : put)
        if (acked.count(id) == 0 && acking.count(id) == 0) ++lost;  // an ack may have been cut
    for (auto it = acked.begin(); it != acked.end(); it = acked.upper_bound(*it))
        if (acked.count(*it) > 1) ++twice;
    CHECK(lost == 0);
    CHECK(twice == 0);
}

namespace {

// Whether `table` of the file at `path` has a column `column`.
bool has_column(const std::string& path, const std::string& table, const char* column) {
    return raw_text(path, ("SELECT count(*) FROM pragma_table_info('" + table +
                           "') WHERE name = '" + column + "'")
                              .c_str()) == "1";
}

// Makes the queue in `path` (its tables named with `prefix`) as the layout before the last error
// wrote it: no last_error columns, no index of the dead letters.
void to_layout_without_last_error(const std::string& path, const std::string& prefix) {
    raw_exec(path,
             ("DROP INDEX " + prefix + "dead_died; ALTER TABLE " + prefix +
              "jobs DROP COLUMN last_error; ALTER TABLE " + prefix + "dead DROP COLUMN last_error")
                 .c_str());
    REQUIRE_FALSE(has_column(path, prefix + "jobs", "last_error"));
    REQUIRE_FALSE(has_column(path, prefix + "dead", "last_error"));
}

}  // namespace

TEST_CASE("a file of the layout before the last error upgrades in place and keeps its jobs") {
    temp_dir dir;
    auto o = opts(dir.file());
    std::string prefix;
    SECTION("a queue in a file of its own") {}
    SECTION("a queue beside the application's tables") {
        o.allow_other_tables = true;
        prefix = "delayq_";
    }
    o.lease = 1h;
    delayq::job held;
    const auto later =
        std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now() + 1h);
    {
        delay_queue q(o);
        REQUIRE(q.put("held", "ph", past));
        REQUIRE(q.put("buried", std::string("pb\0", 3), past + 1ms));
        REQUIRE(q.put("waiting", "pw", later));
        auto both = q.take_many(2, 5s);
        REQUIRE(both.size() == 2);
        held = both[0];
        REQUIRE(held.id == "held");
        REQUIRE(q.bury(both[1]));
    }
    to_layout_without_last_error(dir.file(), prefix);

    delay_queue q(o);
    CHECK(has_column(dir.file(), prefix + "jobs", "last_error"));
    CHECK(has_column(dir.file(), prefix + "dead", "last_error"));
    CHECK(raw_text(dir.file(), ("SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND "
                                "name = '" +
                                prefix + "dead_died'")
                                   .c_str()) == "1");
    // The same format: a version without the last error opens the upgraded file too.
    if (prefix.empty()) {
        CHECK(raw_text(dir.file(), "PRAGMA user_version") == "1");
    } else {
        CHECK(raw_text(dir.file(), "SELECT value FROM delayq_meta WHERE name = 'format'") == "1");
    }
    CHECK(q.size() == 2);
    CHECK(q.dead_size() == 1);

    auto i = q.get("waiting");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->time == later);
    CHECK(i->attempts == 0);
    CHECK(i->payload == "pw");
    CHECK(i->last_error.empty());
    i = q.get("held");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->time == held.lease_deadline);
    CHECK(i->attempts == 1);
    const auto dead = q.dead(10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].id == "buried");
    CHECK(dead[0].state == delayq::job_state::dead);
    CHECK(dead[0].payload == std::string("pb\0", 3));
    CHECK(dead[0].attempts == 1);
    CHECK(dead[0].last_error.empty());
    CHECK(q.dead(10, "buried").empty());

    REQUIRE(q.nack(held, 0ms, "failed after the upgrade"));  // the lease from before it
    i = q.get("held");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->last_error == "failed after the upgrade");
    auto again = q.take(5s);
    REQUIRE(again);
    REQUIRE(again->id == "held");
    REQUIRE(q.bury(*again));  // without a reason: the dead letter keeps the last one
    const auto both = q.dead(10);
    REQUIRE(both.size() == 2);
    CHECK(both[0].id == "buried");
    CHECK(both[1].id == "held");
    CHECK(both[1].last_error == "failed after the upgrade");
    CHECK(q.get("held")->state == delayq::job_state::dead);

    // Opened again: nothing left to add, and nothing changes.
    delay_queue reopened(o);
    CHECK(reopened.dead(10).size() == 2);
    CHECK(reopened.get("held")->last_error == "failed after the upgrade");
    CHECK(integrity(dir.file()) == "ok");
}

TEST_CASE("an upgraded file keeps working with the statements of the version before it") {
    // What a version without the last error runs on the file (it names its columns): its put,
    // its move to the dead letters. Its rows just have no last error.
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    REQUIRE(q.put("a", "x", past));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 1h, "new version's reason"));
    raw_exec(dir.file(),
             "INSERT OR IGNORE INTO jobs(id, payload, due) VALUES(CAST('b' AS BLOB), "
             "CAST('y' AS BLOB), 0);"
             "INSERT OR REPLACE INTO dead(id, payload, attempts, died) SELECT id, payload, "
             "attempts, 5 FROM jobs WHERE id = CAST('a' AS BLOB);"
             "DELETE FROM jobs WHERE id = CAST('a' AS BLOB)");
    auto b = q.get("b");
    REQUIRE(b);
    CHECK(b->state == delayq::job_state::waiting);
    CHECK(b->last_error.empty());
    auto a = q.get("a");
    REQUIRE(a);
    CHECK(a->state == delayq::job_state::dead);
    CHECK(a->last_error.empty());
    CHECK(a->time == std::chrono::system_clock::time_point(5ms));
}

TEST_CASE("a reason is binary-safe, cut to max_reason_size bytes, and kept by the dead letter") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.max_attempts = 2;
    delay_queue q(o);
    REQUIRE(q.put("a", "x", past));
    REQUIRE(q.put_after("b", "y", 1h));
    const std::string nul("bad\0byte\xff", 9);
    auto a = q.take(5s);
    REQUIRE(a);
    REQUIRE(a->id == "a");
    REQUIRE(q.nack(*a, 0ms, nul));
    auto i = q.get("a");
    REQUIRE(i);
    CHECK(i->last_error == nul);

    // Exactly max_reason_size bytes are kept whole; past them, cut, a NUL within kept.
    std::string longest(delayq::max_reason_size, 'r');
    longest[10] = '\0';
    a = q.take(5s);
    REQUIRE(a);
    REQUIRE(a->id == "a");
    REQUIRE(q.nack(*a, 0ms, longest + "cut"));  // its second delivery: to the dead letters
    CHECK(q.size() == 1);
    i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->attempts == 2);
    CHECK(i->last_error == longest);

    REQUIRE(q.reschedule("b", 0ms));
    auto b = q.take(5s);
    REQUIRE(b);
    REQUIRE(b->id == "b");
    REQUIRE(q.bury(*b, nul + nul));
    CHECK(q.get("b")->last_error == nul + nul);
    const auto dead = q.dead(10);
    REQUIRE(dead.size() == 2);
    CHECK(dead[0].last_error == longest);
    CHECK(dead[1].last_error == nul + nul);

    // A put of a dead job's id starts without a last error; the dead letter keeps its own.
    REQUIRE(q.put("a", "again", past));
    i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->last_error.empty());
    CHECK(q.dead(1)[0].last_error == longest);
}

TEST_CASE("get() of a lease that ended reads as waiting, due at the lease's end") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.lease = 100ms;
    delay_queue q(o);
    REQUIRE(q.put("a", "x", past));
    auto j = q.take(5s);
    REQUIRE(j);
    auto i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::leased);
    CHECK(i->time == j->lease_deadline);
    std::this_thread::sleep_for(200ms);
    i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->time == j->lease_deadline);
    CHECK(i->attempts == 1);
}

TEST_CASE("dead() pages by the time of death then by id, at most max_take_many at a time") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    // 600 dead letters: three in each of 200 milliseconds, ids that sort against that time.
    raw_exec(dir.file(),
             "WITH RECURSIVE n(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM n WHERE k < 599) "
             "INSERT INTO dead(id, payload, attempts, died) SELECT CAST(printf('%03d', 599 - k) "
             "AS BLOB), CAST('p' AS BLOB), 1, 1000 + k / 3 FROM n");
    CHECK(q.dead_size() == 600);
    const auto first = q.dead(3);
    REQUIRE(first.size() == 3);
    CHECK(first[0].id == "597");  // died at 1000 ms, the least id of the three first
    CHECK(first[1].id == "598");
    CHECK(first[2].id == "599");
    CHECK(first[0].time == std::chrono::system_clock::time_point(1000ms));
    CHECK(q.dead(1, "598")[0].id == "599");
    CHECK(q.dead(1, "599")[0].id == "594");  // the next millisecond's least
    CHECK(q.dead(1000).size() == delayq::max_take_many);
    std::size_t seen = 0;
    std::string after;
    for (auto page = q.dead(1000); !page.empty(); page = q.dead(1000, after)) {
        seen += page.size();
        after = page.back().id;
    }
    CHECK(seen == 600);
    CHECK(after == "002");  // the last millisecond's greatest
}

TEST_CASE("get() and dead() refuse a bad id as every call does") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    const std::string too_long(delayq::max_id_size + 1, 'x');
    CHECK_THROWS_AS(q.get(""), std::invalid_argument);
    CHECK_THROWS_AS(q.get(too_long), std::invalid_argument);
    CHECK_THROWS_AS(q.dead(10, too_long), std::invalid_argument);
    CHECK_THROWS_AS(q.requeue_dead("", 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.requeue_dead(too_long, 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q.purge_dead(-1ms), std::invalid_argument);
    CHECK_FALSE(q.get(std::string(delayq::max_id_size, 'x')));
    CHECK(q.dead(10).empty());
    delayq::job forged;
    CHECK_THROWS_AS(q.nack(forged, 0ms, "why"), std::invalid_argument);
    CHECK_THROWS_AS(q.bury(forged, "why"), std::invalid_argument);
    try {
        (void)q.get("");
    } catch (const std::invalid_argument& e) {
        CHECK(contains(e.what(), "delayq::sqlite::delay_queue"));
    }
}

namespace {

// Makes `id` of the queue in `q` a dead letter: put, taken, buried. The queue's max_attempts is
// beside the point (a bury dies at once).
void make_dead(delay_queue& q, const std::string& id, std::string_view reason = "buried") {
    REQUIRE(q.put(id, "p-" + id, past));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(j->id == id);
    REQUIRE(q.bury(*j, reason));
}

// Inserts `n` dead letters straight into the file, ids old0.., dying at 1000 ms + k (1970).
void insert_old_dead(const std::string& path, std::size_t n) {
    raw_exec(path, ("WITH RECURSIVE n(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM n WHERE k < " +
                    std::to_string(n - 1) +
                    ") INSERT INTO dead(id, payload, attempts, died) SELECT CAST('old' || k AS "
                    "BLOB), CAST('p' AS BLOB), 1, 1000 + k FROM n")
                       .c_str());
}

}  // namespace

TEST_CASE("requeue_dead wakes a take waiting on this handle or on another one") {
    temp_dir dir;
    auto o = opts(dir.file());  // foreign_changes: 50 ms
    delay_queue q(o);
    delay_queue other(o);
    make_dead(q, "a", "why");
    REQUIRE(q.put_after("late", "x", 1h));  // the waiting take knows of nothing sooner
    std::optional<delayq::job> got;
    std::thread taker([&] { got = q.take(30s); });
    std::this_thread::sleep_for(200ms);
    const auto asked = std::chrono::steady_clock::now();
    SECTION("requeued through another handle on the file") {
        REQUIRE(other.requeue_dead("a", 0ms));
    }
    SECTION("requeued through the waiting take's own handle") {
        REQUIRE(q.requeue_dead("a", 0ms));
    }
    taker.join();
    CHECK(std::chrono::steady_clock::now() - asked < 10s);
    REQUIRE(got);
    CHECK(got->id == "a");
    CHECK(got->payload == "p-a");
    CHECK(got->attempts == 1);
    CHECK(q.get("a")->last_error == "why");
    CHECK(q.dead_size() == 0);
    CHECK(q.ack(*got));
}

TEST_CASE("a requeued dead letter's next lease has a greater token than any before it") {
    // The dead table keeps no token: the requeue gives the row one above every token of the ms
    // it died in (or of now, if later), so that the holder of its last lease is refused.
    temp_dir dir;
    auto o = opts(dir.file());
    o.max_attempts = 1;
    delay_queue q(o);
    REQUIRE(q.put("a", "x", past));
    auto first = q.take(5s);
    REQUIRE(first);
    REQUIRE(q.nack(*first, 0ms, "once"));
    REQUIRE(q.get("a")->state == delayq::job_state::dead);
    SECTION("leased and requeued by the clock as it is") {}
    SECTION("its last lease an hour ahead of the clock (a clock stepped back since)") {
        first->token += 3'600'000ULL * 1024;
        raw_exec(dir.file(), "UPDATE dead SET died = died + 3600000");
    }
    REQUIRE(q.requeue_dead("a", 0ms));
    auto second = q.take(5s);
    REQUIRE(second);
    CHECK(second->id == "a");
    CHECK(second->token > first->token);
    CHECK_FALSE(q.ack(*first));
    CHECK(q.ack(*second));
}

TEST_CASE("requeue_dead is due no earlier than its delay, and durable as a put") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    make_dead(q, "a");
    const auto before = std::chrono::system_clock::now();
    REQUIRE(q.requeue_dead("a", 300ms));
    const auto i = q.get("a");
    REQUIRE(i);
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->time >= before + 300ms);
    CHECK_FALSE(q.take(0ms));
    // Another connection sees it committed.
    CHECK(raw_text(dir.file(), "SELECT count(*) FROM dead") == "0");
    CHECK(raw_text(dir.file(), "SELECT attempts FROM jobs WHERE id = CAST('a' AS BLOB)") == "0");
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(std::chrono::system_clock::now() >= i->time);
    CHECK(q.ack(*j));
}

TEST_CASE("purge_dead of more than one batch removes every old dead letter and counts them") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    insert_old_dead(dir.file(), 25000);  // two and a half transactions of 10 000
    make_dead(q, "recent1");
    make_dead(q, "recent2");
    REQUIRE(q.dead_size() == 25002);
    CHECK(q.purge_dead(1h) == 25000);
    CHECK(q.dead_size() == 2);
    const auto left = q.dead(10);
    REQUIRE(left.size() == 2);
    CHECK(left[0].id == "recent1");
    CHECK(left[1].id == "recent2");
    CHECK(q.purge_dead(1h) == 0);
    CHECK(integrity(dir.file()) == "ok");

    // A purge of exactly whole batches ends with one that finds none.
    insert_old_dead(dir.file(), 20000);
    CHECK(q.purge_dead(1h) == 20000);
    CHECK(q.dead_size() == 2);
}

TEST_CASE("keep_dead removes old dead letters at each death, a bounded number at a time") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.max_attempts = 1;
    o.lease = 300ms;
    o.keep_dead = 300ms;
    delay_queue q(o);
    insert_old_dead(dir.file(), 250);
    REQUIRE(q.dead_size() == 250);

    // A nack of the last attempt: the 100 earliest go, and the new dead letter stays.
    REQUIRE(q.put("nacked", "x", past));
    auto j = q.take(5s);
    REQUIRE(j);
    REQUIRE(q.nack(*j, 0ms, "last"));
    CHECK(q.dead_size() == 151);
    CHECK(q.dead(1)[0].id == "old100");
    CHECK(q.get("nacked")->state == delayq::job_state::dead);

    // A bury: 100 more.
    make_dead(q, "buried");
    CHECK(q.dead_size() == 52);

    // A take that finds the last lease ended: the rest.
    REQUIRE(q.put("ended", "x", past));
    j = q.take(5s);
    REQUIRE(j);
    std::this_thread::sleep_for(700ms);
    CHECK_FALSE(q.take(0ms));  // reclaims it: dead, its lease ended
    CHECK(q.get("ended")->last_error == std::string(delayq::lease_ended_reason));
    // "nacked" and "buried" died more than keep_dead before "ended" did.
    CHECK(q.dead_size() == 1);

    // A stream of deaths: the table holds about what died within keep_dead, never all of them.
    std::size_t most = 0;
    for (std::size_t k = 0; k < 100; ++k) {
        make_dead(q, numbered("s", k));
        most = std::max(most, q.dead_size());
        std::this_thread::sleep_for(10ms);
    }
    CHECK(most <= 40);  // at most 31 deaths 10 ms apart within 300 ms, and some slack
    CHECK(q.dead_size() >= 1);
    CHECK(q.get("s99")->state == delayq::job_state::dead);
    CHECK_FALSE(q.get("s0"));
}

TEST_CASE("keep_dead 0 keeps every dead letter") {
    temp_dir dir;
    auto o = opts(dir.file());
    delay_queue q(o);
    insert_old_dead(dir.file(), 150);
    make_dead(q, "a");
    CHECK(q.dead_size() == 151);
}

// Pausing: the pause is the file's, so another process sees it, and its resume wakes a take here.

TEST_CASE("pause: another process's pause stops this process's takes, its resume wakes one") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));  // foreign_changes: 50 ms
    REQUIRE(q.put("due", "x", past));
    CHECK(helper("pause " + dir.file()) == "paused");
    CHECK(q.paused());
    CHECK_FALSE(q.take(0ms));
    CHECK(q.size() == 1);
    std::atomic<bool> returned{false};
    std::optional<delayq::job> got;
    std::thread taker([&] {
        got = q.take(120s);
        returned = true;
    });
    std::this_thread::sleep_for(500ms);  // a due job, a paused queue: the take waits
    CHECK_FALSE(returned);
    CHECK(helper("resume " + dir.file()) == "running");
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "due");
    CHECK(got->attempts == 1);  // the paused takes leased nothing
    CHECK_FALSE(q.paused());
    CHECK(q.ack(*got));
}

TEST_CASE("pause: this process's pause stops another process's takes, its resume wakes one") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    q.pause();
    REQUIRE(q.put("due", "x", past));
    CHECK(helper("paused " + dir.file()) == "paused");
    CHECK(helper("take " + dir.file() + " 0") == "nothing");
    CHECK(helper("take " + dir.file() + " 300") == "nothing");  // waited, then nothing
    CHECK(q.size() == 1);
    CHECK(q.get("due")->attempts == 0);
    std::atomic<bool> returned{false};
    std::string out;
    std::thread other([&] {
        out = helper("take " + dir.file() + " 120000");
        returned = true;
    });
    std::this_thread::sleep_for(1s);  // the other process is in its take, blocked
    CHECK_FALSE(returned);
    q.resume();
    other.join();
    CHECK(out == "took due 1");  // woken by the resume, not timed out: it acked
    CHECK(q.size() == 0);
}

namespace {

// Counts the write transactions (BEGIN ...) of the connections opened while it is installed:
// every connection opened in the process then traces its statements here.
std::atomic<int> begins{0};

int count_begin(unsigned, void*, void*, void* sql) {
    if (std::string_view(static_cast<const char*>(sql)).rfind("BEGIN", 0) == 0) ++begins;
    return 0;
}

int trace_begins(sqlite3* db, char**, const sqlite3_api_routines*) {
    return sqlite3_trace_v2(db, SQLITE_TRACE_STMT, count_begin, nullptr);
}

// The queue on `path` whose connection counts its transactions in `begins`.
std::unique_ptr<delay_queue> counted_queue(const delayq::sqlite::options& o) {
    using entry = void (*)();
    const auto e = reinterpret_cast<entry>(trace_begins);
    REQUIRE(sqlite3_auto_extension(e) == SQLITE_OK);
    struct cancel {
        entry e;
        ~cancel() { sqlite3_cancel_auto_extension(e); }
    } c{e};
    return std::make_unique<delay_queue>(o);
}

}  // namespace

TEST_CASE("pause: a take waiting on a paused queue with a due job runs no transaction") {
    temp_dir dir;
    // foreign_changes 50 ms: the waiting take rechecks data_version 20 times a second.
    auto o = opts(dir.file());
    auto q = counted_queue(o);
    delay_queue other(o);
    SECTION("paused through the same object") {
        q->pause();
    }
    SECTION("paused through another object on the file") {
        other.pause();
    }
    REQUIRE(other.put("due", "x", past));  // due, and a foreign change for q
    const int before = begins;
    std::atomic<bool> returned{false};
    std::optional<delayq::job> got;
    std::thread taker([&] {
        got = q->take(120s);
        returned = true;
    });
    // A take looks at the file once as it starts (another process may have put something).
    for (int i = 0; i < 6000 && begins == before; ++i) std::this_thread::sleep_for(10ms);
    CHECK(begins == before + 1);
    // Then twenty rechecks, which find no change: a take that spun on the due job would run a
    // transaction for each of them, or thousands.
    std::this_thread::sleep_for(1s);
    CHECK(begins == before + 1);
    CHECK_FALSE(returned);
    other.resume();
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "due");
    CHECK(q->ack(*got));
}

TEST_CASE("pause: a file of the layout before pause() gets its row, and pauses and resumes") {
    temp_dir dir;
    auto o = opts(dir.file());
    std::string prefix;
    SECTION("a queue in a file of its own") {}
    SECTION("a queue beside the application's tables") {
        o.allow_other_tables = true;
        prefix = "delayq_";
    }
    const std::string row = "SELECT value FROM " + prefix + "meta WHERE name = 'paused'";
    {
        delay_queue q(o);
        REQUIRE(q.put("a", "x", past));
        REQUIRE(q.put("b", "y", past + 1ms));
        CHECK(raw_text(dir.file(), row.c_str()) == "0");
    }
    raw_exec(dir.file(), ("DELETE FROM " + prefix + "meta WHERE name = 'paused'").c_str());
    REQUIRE(raw_text(dir.file(),
                     ("SELECT count(*) FROM " + prefix + "meta WHERE name = 'paused'").c_str()) ==
            "0");

    delay_queue q(o);
    CHECK(raw_text(dir.file(), row.c_str()) == "0");  // added in place, running
    CHECK_FALSE(q.paused());
    auto a = q.take(5s);
    REQUIRE(a);
    CHECK(a->id == "a");
    q.pause();
    CHECK(raw_text(dir.file(), row.c_str()) == "1");
    CHECK_FALSE(q.take(0ms));
    {
        delay_queue reopened(o);  // the pause is the file's: it outlives the objects
        CHECK(reopened.paused());
        CHECK_FALSE(reopened.take(0ms));
    }
    CHECK(q.ack(*a));  // settling works while paused
    q.resume();
    CHECK(raw_text(dir.file(), row.c_str()) == "0");
    auto b = q.take(5s);
    REQUIRE(b);
    CHECK(b->id == "b");
    CHECK(q.ack(*b));

    // The row gone under an open object (a file is anyone's to edit): running, and pause()
    // writes it again.
    raw_exec(dir.file(), ("DELETE FROM " + prefix + "meta WHERE name = 'paused'").c_str());
    CHECK_FALSE(q.paused());
    REQUIRE(q.put("c", "z", past));
    q.pause();
    CHECK(raw_text(dir.file(), row.c_str()) == "1");
    CHECK_FALSE(q.take(0ms));
    q.resume();
    auto c = q.take(5s);
    REQUIRE(c);
    CHECK(q.ack(*c));
    CHECK(integrity(dir.file()) == "ok");
}

TEST_CASE("pause: pause and resume on a file locked past busy_timeout are busy_error") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.busy_timeout = 100ms;
    delay_queue q(o);
    REQUIRE(q.put("due", "x", past));
    sqlite3* other = nullptr;
    REQUIRE(sqlite3_open(dir.file().c_str(), &other) == SQLITE_OK);
    REQUIRE(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK);
    const auto msg = message_of<delayq::sqlite::busy_error>([&] { q.pause(); });
    CHECK(contains(msg, dir.file()));
    CHECK(contains(msg, "busy_timeout (100 ms)"));
    CHECK_THROWS_AS(q.resume(), delayq::unavailable_error);
    CHECK_FALSE(q.paused());  // a reader is not locked out (WAL), and nothing was paused
    REQUIRE(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(other);
    q.pause();
    CHECK(q.paused());
    CHECK_FALSE(q.take(0ms));
    q.resume();
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(q.ack(*j));
}

namespace {

// The figures of `q`'s stats() as one string, so that a failed check shows them all.
std::string figures(delay_queue& q) {
    const auto s = q.stats();
    return "waiting " + std::to_string(s.waiting) + ", due " + std::to_string(s.due_now) +
           ", leased " + std::to_string(s.leased) + ", dead " + std::to_string(s.dead);
}

// What a file of the layout before limits and stats lacks: the grants table, the triggers that
// count the rows, and the count rows of meta.
void to_layout_without_counts(const std::string& path, const std::string& prefix) {
    std::string sql = "DROP TABLE " + prefix + "grants;";
    for (const char* t :
         {"jobs_counted_in", "jobs_counted_out", "dead_counted_in", "dead_counted_out"})
        sql += "DROP TRIGGER " + prefix + t + ";";
    sql += "DELETE FROM " + prefix + "meta WHERE name IN ('queued', 'dead')";
    raw_exec(path, sql.c_str());
    REQUIRE(raw_text(path, "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'") == "0");
}

}  // namespace

TEST_CASE("limits: a file of the layout before limits and stats gets the grants and the counts") {
    temp_dir dir;
    auto o = opts(dir.file());
    std::string prefix;
    SECTION("a queue in a file of its own") {}
    SECTION("a queue beside the application's tables") {
        o.allow_other_tables = true;
        prefix = "delayq_";
    }
    o.lease = 1h;
    {
        delay_queue q(o);
        for (std::size_t i = 0; i < 5; ++i) REQUIRE(q.put(numbered("j", i), "x", past));
        REQUIRE(q.put("later", "x", std::chrono::system_clock::now() + 1h));
        auto held = q.take(5s);  // leased across the upgrade
        REQUIRE(held);
        auto buried = q.take(5s);
        REQUIRE(buried);
        REQUIRE(q.bury(*buried));
    }
    to_layout_without_counts(dir.file(), prefix);

    o.limits = {.max_leased = 3, .rate = 1, .period = 1h};
    delay_queue q(o);
    CHECK(raw_text(dir.file(), ("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND "
                                "name = '" +
                                prefix + "grants'")
                                   .c_str()) == "1");
    CHECK(raw_text(dir.file(), "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'") == "4");
    // Counted from the tables as it opened: 5 queued (1 leased), 1 dead.
    CHECK(figures(q) == "waiting 4, due 3, leased 1, dead 1");
    auto one = q.take(5s);  // the rate's one lease of the hour
    REQUIRE(one);
    CHECK(raw_text(dir.file(), ("SELECT sum(n) FROM " + prefix + "grants").c_str()) == "1");
    CHECK_FALSE(q.take(0ms));
    CHECK(figures(q) == "waiting 3, due 2, leased 2, dead 1");
    {
        // Another object without the rate: max_leased 3 lets it lease one more, then none.
        auto other = o;
        other.limits = {.max_leased = 3, .rate = 0, .period = 0ms};
        delay_queue p(other);
        auto third = p.take(5s);
        REQUIRE(third);
        CHECK_FALSE(p.take(0ms));
        CHECK(p.ack(*third));
        // Opened again: nothing left to add, and the counts go on from the file's.
        CHECK(figures(p) == "waiting 2, due 1, leased 2, dead 1");
    }
    CHECK(q.ack(*one));
    CHECK(figures(q) == "waiting 2, due 1, leased 1, dead 1");
    CHECK(integrity(dir.file()) == "ok");
}

TEST_CASE("stats: the file's counts follow every writer of its rows") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.durable_puts = false;
    o.lease = 1h;
    o.max_attempts = 2;
    delay_queue q(o);
    constexpr std::size_t jobs = 6000;  // 4000 due, 2000 later, in put_many()s of 500
    std::vector<std::string> ids;
    for (std::size_t i = 0; i < jobs; ++i) ids.push_back(numbered("job-", i));
    for (std::size_t at = 0; at < jobs; at += 500) {
        std::vector<delayq::put_request> batch;
        for (std::size_t i = at; i < at + 500; ++i)
            batch.push_back({ids[i], "p", i % 3 == 2 ? std::chrono::milliseconds(1h) : 0ms});
        for (const bool b : q.put_many(batch)) REQUIRE(b);
    }
    CHECK_FALSE(q.put(ids[0], "again", past));  // refused: counts nothing
    CHECK(figures(q) == "waiting 6000, due 4000, leased 0, dead 0");

    auto leased = q.take_many(500, 5s);
    REQUIRE(leased.size() == 500);
    for (std::size_t i = 0; i < 100; ++i) REQUIRE(q.ack(leased[i]));
    for (std::size_t i = 100; i < 150; ++i) REQUIRE(q.bury(leased[i]));
    for (std::size_t i = 150; i < 200; ++i) REQUIRE(q.nack(leased[i], 1h));
    for (std::size_t i = 200; i < 210; ++i) REQUIRE(q.cancel(leased[i].id));
    CHECK_FALSE(q.ack(leased[0]));  // refused: counts nothing
    // 6000 - 100 acked - 50 buried - 10 cancelled = 5840 queued; 290 leased; 50 due again
    // later (nacked): 4000 - 500 due taken = 3500 due.
    CHECK(figures(q) == "waiting 5550, due 3500, leased 290, dead 50");

    // A dead letter's id dies again: its dead letter is replaced, not counted twice.
    REQUIRE(q.put(leased[100].id, "p", past));
    REQUIRE(q.requeue_dead(leased[101].id, 0ms));
    std::size_t again = 0;
    while (again < 2) {
        auto j = q.take(5s);
        REQUIRE(j);
        if (j->id == leased[100].id || j->id == leased[101].id) {
            REQUIRE(q.bury(*j));
            ++again;
        } else {
            REQUIRE(q.ack(*j));
        }
    }
    CHECK(q.stats().dead == 50);
    std::this_thread::sleep_for(5ms);  // purge_dead(0ms): those that died before it
    CHECK(q.purge_dead(0ms) == 50);

    // What another writer does: a statement of a version without stats (the move to the dead
    // letters), a put in the application's transaction, an operator's delete.
    raw_exec(dir.file(),
             "INSERT OR IGNORE INTO jobs(id, payload, due) VALUES(CAST('raw' AS BLOB), CAST('p' "
             "AS BLOB), 0);"
             "INSERT OR REPLACE INTO dead(id, payload, attempts, died) SELECT id, payload, "
             "attempts, 5 FROM jobs WHERE id = CAST('raw' AS BLOB);"
             "DELETE FROM jobs WHERE id = CAST('raw' AS BLOB);"
             "DELETE FROM jobs WHERE id = CAST('job-5999' AS BLOB)");
    sqlite3* app = nullptr;
    REQUIRE(sqlite3_open(dir.file().c_str(), &app) == SQLITE_OK);
    REQUIRE(sqlite3_exec(app, "BEGIN", nullptr, nullptr, nullptr) == SQLITE_OK);
    CHECK(q.put_in_transaction(app, "in-app", "p", past));
    REQUIRE(sqlite3_exec(app, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(app);

    const auto s = q.stats();
    CHECK(s.dead == 1);
    CHECK(s.dead == q.dead_size());
    CHECK(s.waiting + s.leased == q.size());  // the counts kept against a count of the rows
    delay_queue reopened(o);
    const auto r = reopened.stats();
    CHECK(r.waiting == s.waiting);
    CHECK(r.dead == s.dead);
    CHECK(r.leased == s.leased);
    CHECK(integrity(dir.file()) == "ok");
}

TEST_CASE("stats: due_now whichever part of the waiting jobs is the smaller, and the lag") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.durable_puts = false;
    delay_queue q(o);
    const std::size_t due = GENERATE(0U, 1U, 300U, 1000U);
    const std::size_t later = GENERATE(0U, 1U, 300U);
    INFO(due << " due, " << later << " later");
    const auto early = std::chrono::system_clock::now() - 10s;
    for (std::size_t i = 0; i < due; ++i)
        REQUIRE(q.put(numbered("due-", i), "p", early + std::chrono::milliseconds(i)));
    for (std::size_t i = 0; i < later; ++i)
        REQUIRE(q.put_after(numbered("later-", i), "p", 1h + std::chrono::milliseconds(i)));
    const auto s = q.stats();
    CHECK(s.waiting == due + later);
    CHECK(s.due_now == due);
    CHECK(s.leased == 0);
    if (due == 0) {
        CHECK(s.lag == 0ms);
    } else {
        CHECK(s.lag >= 9s);  // since the earliest due time, 10 s ago (less rounding)
        CHECK(s.lag < 70s);
    }
}

TEST_CASE("limits: a take held back by max_leased asks the file no more until an ack") {
    temp_dir dir;
    auto o = opts(dir.file());  // foreign_changes 50 ms: the leader rechecks 20 times a second
    o.lease = 1h;
    o.limits = {.max_leased = 1, .rate = 0, .period = 0ms};
    auto q = counted_queue(o);
    REQUIRE(q->put("a", "x", past));
    REQUIRE(q->put("b", "x", past));
    auto held = q->take(5s);
    REQUIRE(held);
    const int before = begins;
    std::atomic<bool> returned{false};
    std::optional<delayq::job> got;
    std::thread taker([&] {
        got = q->take(120s);
        returned = true;
    });
    for (int i = 0; i < 6000 && begins == before; ++i) std::this_thread::sleep_for(10ms);
    CHECK(begins == before + 1);  // the take's first look, held back
    // Then twenty rechecks, which find no change: a take that spun on the due job it may not
    // lease would run a transaction for each of them, or thousands.
    std::this_thread::sleep_for(1s);
    CHECK(begins == before + 1);
    CHECK_FALSE(returned);
    CHECK(q->ack(*held));  // wakes it: a place is free
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "b");
    CHECK(q->ack(*got));
}

TEST_CASE("limits: a take held back by a rate sleeps until the period turns, then leases") {
    temp_dir dir;
    auto o = opts(dir.file());
    o.limits = {.max_leased = 0, .rate = 1, .period = 2s};
    auto q = counted_queue(o);
    REQUIRE(q->put("a", "x", past));
    REQUIRE(q->put("b", "x", past));
    auto first = q->take(5s);
    REQUIRE(first);
    CHECK(q->ack(*first));  // an ack frees no place of a rate
    const int before = begins;
    std::atomic<bool> returned{false};
    std::optional<delayq::job> got;
    std::thread taker([&] {
        got = q->take(120s);
        returned = true;
    });
    std::this_thread::sleep_for(1s);
    CHECK(begins == before + 1);  // its first look only, within the period
    CHECK_FALSE(returned);
    taker.join();
    REQUIRE(got);
    const auto leased_at = [&](const delayq::job& j) { return j.lease_deadline - o.lease; };
    CHECK(leased_at(*got) - leased_at(*first) >= 2s);
    CHECK(begins <= before + 4);  // and one more, when the period turned (a few at worst)
    CHECK(q->ack(*got));
}

TEST_CASE("series: a file of the layout before series gets the repeat column and runs one") {
    temp_dir dir;
    auto o = opts(dir.file());
    std::string prefix;
    SECTION("a queue in a file of its own") {}
    SECTION("a queue beside the application's tables") {
        o.allow_other_tables = true;
        prefix = "delayq_";
    }
    o.lease = 1h;
    delayq::job held;
    {
        delay_queue q(o);
        REQUIRE(q.put("held", "ph", past));
        REQUIRE(q.put("waiting", "pw", std::chrono::system_clock::now() + 1h));
        auto j = q.take(5s);
        REQUIRE(j);
        held = *j;
    }
    raw_exec(dir.file(), ("ALTER TABLE " + prefix + "jobs DROP COLUMN repeat").c_str());
    REQUIRE_FALSE(has_column(dir.file(), prefix + "jobs", "repeat"));

    delay_queue q(o);
    CHECK(has_column(dir.file(), prefix + "jobs", "repeat"));
    CHECK(q.size() == 2);
    // The rows from before are one-off jobs: their ack queues nothing.
    CHECK(q.ack(held));
    CHECK(q.size() == 1);
    CHECK_FALSE(q.get("held"));
    REQUIRE(q.put_every("series", "ps", 50ms));
    auto run = q.take(5s);
    REQUIRE(run);
    CHECK(run->id == "series");
    CHECK(q.ack(*run));
    auto next = q.get("series");
    REQUIRE(next);
    CHECK(next->state == delayq::job_state::waiting);
    CHECK(next->time > run->deadline);
    CHECK(next->payload == "ps");
    CHECK(q.size() == 2);
    // Opened again: nothing left to add, and the series goes on.
    delay_queue reopened(o);
    auto again = reopened.take(5s);
    REQUIRE(again);
    CHECK(again->id == "series");
    CHECK(reopened.ack(*again));
    CHECK(reopened.size() == 2);
    CHECK(integrity(dir.file()) == "ok");
}

TEST_CASE("series: the schedule is text in the file, and one this version cannot read ends it") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    REQUIRE(q.put_every("every", "x", 1500ms));
    REQUIRE(q.put_cron("cron", "x", "*/5 * * * *"));
    REQUIRE(q.put("once", "x", past));
    // "<slot> <schedule>": the slot is the run's due time until a retry or reschedule moves it.
    CHECK(raw_text(dir.file(),
                   "SELECT typeof(repeat) || ' ' || (repeat = due || ' e1500') FROM jobs "
                   "WHERE id = CAST('every' AS BLOB)") == "text 1");
    CHECK(raw_text(dir.file(),
                   "SELECT substr(repeat, instr(repeat, ' ') + 1, 1) FROM jobs WHERE id = "
                   "CAST('cron' AS BLOB)") == "c");
    CHECK(raw_text(dir.file(), "SELECT count(*) FROM jobs WHERE repeat IS NULL") == "1");
    // A later version's schedule: the ack settles the run and queues nothing after it.
    raw_exec(dir.file(),
             "UPDATE jobs SET repeat = '0 z1', due = 0 WHERE id = CAST('every' AS BLOB)");
    auto runs = q.take_many(2, 5s);
    REQUIRE(runs.size() == 2);
    for (const auto& j : runs) CHECK(q.ack(j));
    CHECK(q.size() == 1);  // the cron series, waiting
    CHECK_FALSE(q.get("every"));
    CHECK_FALSE(q.get("once"));
    auto cron = q.get("cron");
    REQUIRE(cron);
    CHECK(cron->time.time_since_epoch() % std::chrono::minutes(5) == 0ms);
}

TEST_CASE("series: the next run's leases have greater tokens than the run before it") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    REQUIRE(q.put_every("s", "x", 20ms));
    std::uint64_t last = 0;
    for (int i = 0; i < 3; ++i) {
        auto run = q.take(5s);
        REQUIRE(run);
        CHECK(run->token > last);
        CHECK(run->attempts == 1);
        last = run->token;
        CHECK(q.ack(*run));
        CHECK_FALSE(q.ack(*run));  // the next run is waiting: the old token settles nothing
        CHECK_FALSE(q.nack(*run, 0ms));
        CHECK_FALSE(q.bury(*run));
    }
    CHECK(q.size() == 1);
    CHECK(q.dead_size() == 0);
}

TEST_CASE("series: ack_many of runs of several series queues the next run of each") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    const std::vector<std::string> ids{"s0", "s1", "s2", "s3"};
    for (const auto& id : ids) REQUIRE(q.put_every(id, "p" + id, 50ms));
    REQUIRE(q.put("once", "x", past));
    std::this_thread::sleep_for(100ms);
    auto runs = q.take_many(10, 5s);
    // The one-off job is due first; the first runs were due at about the same time.
    while (runs.size() < ids.size() + 1) {
        auto more = q.take_many(10, 5s);
        REQUIRE_FALSE(more.empty());
        runs.insert(runs.end(), more.begin(), more.end());
    }
    REQUIRE(runs.size() == ids.size() + 1);
    const auto acked = q.ack_many(runs);
    CHECK(std::count(acked.begin(), acked.end(), true) == 5);
    CHECK(q.size() == ids.size());
    CHECK_FALSE(q.get("once"));
    for (const auto& j : runs) {
        if (j.id == "once") continue;
        auto next = q.get(j.id);
        REQUIRE(next);
        CHECK(next->state == delayq::job_state::waiting);
        CHECK(next->attempts == 0);
        CHECK(next->payload == "p" + j.id);
        CHECK(next->time > j.deadline);
        CHECK((next->time - j.deadline) % 50ms == 0ms);
    }
    // Acked again in one call (a stale batch): refused, nothing more queued.
    const auto again = q.ack_many(runs);
    CHECK(std::count(again.begin(), again.end(), true) == 0);
    CHECK(q.size() == ids.size());
}

TEST_CASE("series: two processes ack the same run at once: one ack holds, one next run") {
    temp_dir dir;
    const std::string path = dir.file();
    channel up, down;
    // Started before this process opens the file (fork() holding no connection): it acks the run
    // whose token it is told, when told, and says whether its ack held.
    const pid_t peer = child([&] {
        up.close_read();
        down.close_write();
        delay_queue q(opts(path));
        for (std::string line; !(line = down.hear()).empty();) {
            delayq::job j;
            j.id = "s";
            j.token = std::stoull(line);
            up.say(q.ack(j) ? "acked" : "refused");
        }
        return 0;
    });
    up.close_write();
    down.close_read();
    {
        delay_queue q(opts(path));
        REQUIRE(q.put_every("s", "x", 10ms));
        int mine = 0, theirs = 0;
        for (int round = 0; round < 20; ++round) {
            auto run = q.take(5s);
            REQUIRE(run);
            REQUIRE(run->id == "s");
            down.say(std::to_string(run->token));
            const bool held = q.ack(*run);
            const std::string answer = up.hear();
            REQUIRE((answer == "acked" || answer == "refused"));
            CHECK(held != (answer == "acked"));  // exactly one of the two
            mine += held ? 1 : 0;
            theirs += answer == "acked" ? 1 : 0;
            CHECK(q.size() == 1);  // one next run, whichever ack held
            auto next = q.get("s");
            REQUIRE(next);
            CHECK(next->state == delayq::job_state::waiting);
            CHECK(next->attempts == 0);
        }
        CHECK(mine + theirs == 20);
        CHECK(q.dead_size() == 0);
    }
    down.close_write();
    CHECK(wait_for(peer) == 0);
    CHECK(integrity(path) == "ok");
}

TEST_CASE("series: a run's next run wakes a take waiting on another object") {
    temp_dir dir;
    delay_queue q(opts(dir.file()));
    delay_queue other(opts(dir.file()));
    REQUIRE(q.put_every("s", "x", 200ms));
    auto run = q.take(5s);
    REQUIRE(run);
    std::optional<delayq::job> got;
    std::thread taker([&] { got = other.take(60s); });
    std::this_thread::sleep_for(100ms);
    CHECK(q.ack(*run));
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "s");
    CHECK(got->deadline > run->deadline);
    CHECK(other.ack(*got));
    CHECK(q.cancel("s"));
    CHECK(q.size() == 0);
}
