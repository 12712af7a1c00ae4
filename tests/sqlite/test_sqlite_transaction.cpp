// delayq::sqlite::delay_queue in the application's own database: put_in_transaction() on the
// application's connection, so that a job exists exactly when the application's transaction
// commits, and options::allow_other_tables, which lets the queue's tables live beside the
// application's.
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
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
using delayq::test::message_of;
using delayq_sqlite_test::channel;
using delayq_sqlite_test::child;
using delayq_sqlite_test::integrity;
using delayq_sqlite_test::temp_dir;
using delayq_sqlite_test::wait_for;

namespace {

const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

// The application's own connection to its database, with a table of orders.
class app_db {
  public:
    explicit app_db(const std::string& path) {
        REQUIRE(sqlite3_open(path.c_str(), &db_) == SQLITE_OK);
        sqlite3_busy_timeout(db_, 10000);
        exec("CREATE TABLE IF NOT EXISTS orders(id TEXT PRIMARY KEY, total INTEGER)");
    }
    ~app_db() { sqlite3_close(db_); }
    app_db(const app_db&) = delete;
    app_db& operator=(const app_db&) = delete;

    sqlite3* get() const noexcept { return db_; }
    // SQLite's result code of `sql`.
    int run(const std::string& sql) {
        return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
    }
    void exec(const std::string& sql) {
        INFO(sql << ": " << sqlite3_errmsg(db_));
        REQUIRE(run(sql) == SQLITE_OK);
    }
    long long integer(const std::string& sql) {
        sqlite3_stmt* s = nullptr;
        REQUIRE(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) == SQLITE_OK);
        const long long v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
        sqlite3_finalize(s);
        return v;
    }

  private:
    sqlite3* db_ = nullptr;
};

delayq::sqlite::options beside(const std::string& path) {
    auto o = delayq_sqlite_test::opts(path);
    o.allow_other_tables = true;
    return o;
}

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("transaction: a rolled-back transaction leaves no job") {
    temp_dir dir;
    const std::string path = dir.file("app.db");
    app_db app(path);
    delay_queue q(beside(path));
    app.exec("BEGIN");
    app.exec("INSERT INTO orders VALUES('order-1', 100)");
    CHECK(q.put_after_in_transaction(app.get(), "order-1", "cancel unless paid", 0ms));
    CHECK_FALSE(q.put_in_transaction(app.get(), "order-1", "twice", past));  // same transaction
    app.exec("ROLLBACK");
    CHECK(q.size() == 0);
    CHECK_FALSE(q.take(300ms));
    CHECK(app.integer("SELECT count(*) FROM orders") == 0);
    CHECK(q.put_after("order-1", "the id is free", 0ms));  // nothing of it left
}

TEST_CASE("transaction: a committed transaction's job is taken, by a take already waiting too") {
    temp_dir dir;
    const std::string path = dir.file("app.db");
    app_db app(path);
    delay_queue q(beside(path));
    std::optional<delayq::job> got;
    std::atomic<bool> waiting{false};
    std::thread taker([&] {
        waiting = true;
        got = q.take(30s);
    });
    while (!waiting) std::this_thread::yield();
    delay_queue observer(beside(path));
    app.exec("BEGIN IMMEDIATE");
    app.exec("INSERT INTO orders VALUES('order-2', 250)");
    CHECK(q.put_in_transaction(app.get(), "order-2", "cancel unless paid", past));
    // Not yet committed: no other connection sees it. (Not q.size(): inside the transaction this
    // thread calls nothing of q but put_in_transaction; q's taker may be waiting for the lock.)
    CHECK(observer.size() == 0);
    app.exec("COMMIT");
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "order-2");
    CHECK(got->payload == "cancel unless paid");
    CHECK(got->attempts == 1);
    CHECK(q.ack(*got));
    // A queued id is refused, as by put().
    REQUIRE(q.put_after("order-3", "x", 1h));
    app.exec("SAVEPOINT s");
    CHECK_FALSE(q.put_after_in_transaction(app.get(), "order-3", "y", 0ms));
    CHECK(q.put_after_in_transaction(app.get(), "order-4", "y", 1h));
    app.exec("RELEASE s");
    CHECK(q.size() == 2);
}

TEST_CASE("transaction: the queue's tables beside the application's, only when asked") {
    temp_dir dir;
    const std::string path = dir.file("app.db");
    {
        app_db app(path);
        app.exec("PRAGMA application_id = 42; PRAGMA user_version = 7");
        app.exec("INSERT INTO orders VALUES('order-1', 100)");
    }
    const std::string before = read_all(path);
    const auto msg = message_of<delayq::sqlite::not_a_queue_error>(
        [&] { delay_queue q(delayq_sqlite_test::opts(path)); });
    CHECK(contains(msg, "another application"));
    CHECK(read_all(path) == before);  // the default refuses, and leaves the file as it was
    {
        delay_queue q(beside(path));
        CHECK(q.put("j", "x", past));
    }
    app_db app(path);
    CHECK(app.integer("PRAGMA application_id") == 42);  // the header stays the application's
    CHECK(app.integer("PRAGMA user_version") == 7);
    CHECK(app.integer("SELECT total FROM orders WHERE id = 'order-1'") == 100);
    CHECK(app.integer("SELECT count(*) FROM delayq_jobs") == 1);
    CHECK(app.integer("SELECT count(*) FROM sqlite_schema WHERE name IN ('jobs', 'dead', "
                      "'meta')") == 0);
    delay_queue q(beside(path));  // opened again
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "j");
    CHECK(q.ack(*j));
    // Opened as a queue of its own, the file is refused, saying how to open it.
    const auto own = message_of<delayq::sqlite::not_a_queue_error>(
        [&] { delay_queue other(delayq_sqlite_test::opts(path)); });
    CHECK(contains(own, "allow_other_tables"));
    // A table of the application with one of the queue's names is not taken for the queue's.
    const std::string clash = dir.file("clash.db");
    {
        app_db other(clash);
        other.exec("CREATE TABLE delayq_jobs(x)");
    }
    CHECK_THROWS_AS(delay_queue(beside(clash)), delayq::sqlite::not_a_queue_error);
    // A queue file of its own can be opened beside other tables too: its tables keep their names.
    const std::string own_file = dir.file("own.db");
    { delay_queue(delayq_sqlite_test::opts(own_file)).put("k", "x", past); }
    delay_queue shared(beside(own_file));
    CHECK(shared.size() == 1);
}

TEST_CASE("transaction: bad connections are std::invalid_argument") {
    temp_dir dir;
    const std::string path = dir.file("app.db");
    app_db app(path);
    delay_queue q(beside(path));
    CHECK_THROWS_AS(q.put_in_transaction(nullptr, "a", "x", past), std::invalid_argument);
    const auto no_tx =
        message_of<std::invalid_argument>([&] { q.put_in_transaction(app.get(), "a", "x", past); });
    CHECK(contains(no_tx, "no transaction"));
    app_db elsewhere(dir.file("other.db"));
    elsewhere.exec("BEGIN");
    const auto other = message_of<std::invalid_argument>(
        [&] { q.put_in_transaction(elsewhere.get(), "a", "x", past); });
    CHECK(contains(other, "not the queue's file"));
    elsewhere.exec("ROLLBACK");
    app.exec("BEGIN");
    CHECK_THROWS_AS(q.put_in_transaction(app.get(), "", "x", past), std::invalid_argument);
    app.exec("ROLLBACK");
    CHECK(q.size() == 0);
}

TEST_CASE("transaction: processes sharing the application's file keep every committed job") {
    temp_dir dir;
    const std::string path = dir.file("app.db");  // created by the processes, all at once
    constexpr int processes = 4, orders = 30;
    channel start, up;
    std::vector<pid_t> pids;
    for (int p = 0; p < processes; ++p)
        pids.push_back(child([&, p] {
            start.close_write();
            up.close_read();
            start.wait_closed();  // every process starts at once
            try {
                app_db app(path);
                delay_queue q(beside(path));
                for (int i = 0; i < orders; ++i) {
                    const std::string id = "order-" + std::to_string(p) + "-" + std::to_string(i);
                    app.exec("BEGIN IMMEDIATE");
                    app.exec("INSERT INTO orders VALUES('" + id + "', " + std::to_string(i) + ")");
                    if (!q.put_after_in_transaction(app.get(), id, "timeout", 1h))
                        up.say("error refused " + id);
                    if (i % 5 == 4) {
                        app.exec("ROLLBACK");
                        up.say("rolled-back " + id);
                    } else if (app.run("COMMIT") == SQLITE_OK) {
                        up.say("committed " + id);
                    } else {
                        up.say("error commit " + id);
                        app.run("ROLLBACK");
                    }
                }
                if (p % 2 == 0) std::_Exit(0);  // as a crash would: no close, no checkpoint
            } catch (const std::exception& e) {
                up.say(std::string("error ") + e.what());
            }
            return 0;
        }));
    start.close_write();
    up.close_write();
    std::vector<std::string> committed, rolled_back, errors;
    for (const auto& l : up.hear_all()) {
        if (l.rfind("committed ", 0) == 0) committed.push_back(l.substr(10));
        if (l.rfind("rolled-back ", 0) == 0) rolled_back.push_back(l.substr(12));
        if (l.rfind("error ", 0) == 0) errors.push_back(l);
    }
    for (const pid_t pid : pids) wait_for(pid);
    for (const auto& e : errors) UNSCOPED_INFO(e);
    CHECK(errors.empty());
    CHECK(committed.size() == processes * orders * 4 / 5);
    CHECK(integrity(path) == "ok");
    app_db app(path);
    delay_queue q(beside(path));
    CHECK(q.size() == committed.size());
    CHECK(app.integer("SELECT count(*) FROM orders") == static_cast<long long>(committed.size()));
    std::size_t kept = 0, stray = 0;
    for (const auto& id : committed) kept += q.cancel(id) ? 1 : 0;
    for (const auto& id : rolled_back) stray += q.cancel(id) ? 1 : 0;
    CHECK(kept == committed.size());
    CHECK(stray == 0);
}

TEST_CASE(
    "transaction: a cancel in the application's transaction takes effect exactly when it "
    "commits") {
    temp_dir dir;
    const std::string path = dir.file("app.db");
    app_db app(path);
    delay_queue q(beside(path));
    REQUIRE(q.put("order-1", "cancel unless paid", past));
    REQUIRE(q.put_after("order-2", "cancel unless paid", 1h));

    // Rolled back: the job stays, as it was.
    app.exec("BEGIN");
    app.exec("INSERT INTO orders VALUES('order-1', 100)");
    CHECK(q.cancel_in_transaction(app.get(), "order-1"));
    CHECK_FALSE(q.cancel_in_transaction(app.get(), "order-1"));  // gone, as this transaction sees
    CHECK_FALSE(q.cancel_in_transaction(app.get(), "never-put"));
    app.exec("ROLLBACK");
    CHECK(q.size() == 2);
    auto j = q.take(5s);
    REQUIRE(j);
    CHECK(j->id == "order-1");

    // Committed: gone, the leased one too, and its holder's ack is refused.
    app.exec("BEGIN");
    app.exec("INSERT INTO orders VALUES('order-1', 100)");
    CHECK(q.cancel_in_transaction(app.get(), "order-1"));
    CHECK(q.cancel_in_transaction(app.get(), "order-2"));
    app.exec("COMMIT");
    CHECK(q.size() == 0);
    CHECK_FALSE(q.get("order-1").has_value());
    CHECK_FALSE(q.ack(*j));
    CHECK_FALSE(q.take(0ms));

    // A job put in the same transaction is cancelled with it: nothing is left at the commit.
    app.exec("BEGIN");
    CHECK(q.put_in_transaction(app.get(), "order-3", "x", past));
    CHECK(q.cancel_in_transaction(app.get(), "order-3"));
    app.exec("COMMIT");
    CHECK(q.size() == 0);
    CHECK(q.put("order-3", "the id is free", past));
}

TEST_CASE("transaction: a cancel in a transaction needs one, on the queue's file") {
    temp_dir dir;
    const std::string path = dir.file("app.db");
    app_db app(path);
    delay_queue q(beside(path));
    REQUIRE(q.put("a", "x", past));
    CHECK_THROWS_AS(q.cancel_in_transaction(nullptr, "a"), std::invalid_argument);
    const auto no_tx =
        message_of<std::invalid_argument>([&] { q.cancel_in_transaction(app.get(), "a"); });
    CHECK(contains(no_tx, "cancel_in_transaction"));
    CHECK(contains(no_tx, "no transaction"));
    app_db elsewhere(dir.file("other.db"));
    elsewhere.exec("BEGIN");
    const auto other =
        message_of<std::invalid_argument>([&] { q.cancel_in_transaction(elsewhere.get(), "a"); });
    CHECK(contains(other, "not the queue's file"));
    elsewhere.exec("ROLLBACK");
    app.exec("BEGIN");
    CHECK_THROWS_AS(q.cancel_in_transaction(app.get(), ""), std::invalid_argument);
    app.exec("ROLLBACK");
    CHECK(q.size() == 1);
}
