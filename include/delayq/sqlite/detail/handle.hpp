// RAII over SQLite's C API for delayq::sqlite: one connection (database), one prepared statement
// (statement), one write transaction (write_transaction). Part of <delayq/sqlite/delay_queue.hpp>.
//
// Errors. Every failure is thrown as the typed exception of delayq::sqlite's error family, by
// fail() through raise() (delayq/sqlite/error.hpp).
//
// Threads. A connection is opened with SQLITE_OPEN_NOMUTEX: its owner serializes every use of it
// (and of its statements) with a mutex of its own, which it needs anyway to keep a transaction's
// statements together.
#pragma once

#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../error.hpp"

namespace delayq::sqlite::detail {

/// The problem an SQLite result code (extended) stands for; `sys_errno` is the OS error behind an
/// I/O error, where SQLite knows it.
inline problem classify(int code, int sys_errno) noexcept {
    switch (code & 0xff) {
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
            return problem::busy;
        case SQLITE_FULL:
            return problem::disk_full;
        case SQLITE_CORRUPT:
            return problem::corrupt;
        case SQLITE_NOTADB:
            return problem::not_a_queue;
        case SQLITE_READONLY:
            return problem::read_only;
        case SQLITE_IOERR:
            // A write past RLIMIT_FSIZE (EFBIG) or beyond a quota (EDQUOT) is a full disk too;
            // SQLite reports it as SQLITE_FULL only when the write was short, not when it failed.
            if (sys_errno == ENOSPC || sys_errno == EFBIG || sys_errno == EDQUOT)
                return problem::disk_full;
            return problem::other;
        default:
            return problem::other;
    }
}

/// Whether a failed write may have run out of room: the file (or its WAL) is within 64 KiB of
/// the process's RLIMIT_FSIZE, or its file system has less than 1 MiB left for this user. SQLite
/// reports a write that failed with EFBIG or ENOSPC as a plain I/O error (SQLITE_IOERR_WRITE),
/// and the errno it keeps is not reliably that write's; so the error is named by the situation.
inline bool out_of_room(const std::string& path) {
    constexpr std::uint64_t margin = std::uint64_t{64} * 1024;
    rlimit lim{};
    if (::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
        for (const char* suffix : {"", "-wal", "-journal"}) {
            struct stat st {};
            if (::stat((path + suffix).c_str(), &st) == 0 &&
                static_cast<std::uint64_t>(st.st_size) + margin >= lim.rlim_cur)
                return true;
        }
    }
    const std::size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos
                                ? std::string(".")
                                : path.substr(0, std::max<std::size_t>(slash, 1));
    struct statvfs fs {};
    return ::statvfs(dir.c_str(), &fs) == 0 &&
           static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize < 16 * margin;
}

/// One SQLite connection to one file.
class database {
  public:
    database(const std::string& path, int flags) : path_(path) {
        const int rc = sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
        if (rc != SQLITE_OK) {
            // sqlite3_open_v2 hands back a connection even when it fails, for its message.
            std::string why = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
            sqlite3_close(db_);
            db_ = nullptr;
            fail(rc, 0, "cannot open it", why.c_str());
        }
        sqlite3_extended_result_codes(db_, 1);
    }
    ~database() { sqlite3_close_v2(db_); }
    database(const database&) = delete;
    database& operator=(const database&) = delete;

    sqlite3* get() const noexcept { return db_; }
    const std::string& path() const noexcept { return path_; }
    /// The busy timeout set by set_busy_timeout(), in ms.
    long long busy_timeout_ms() const noexcept { return busy_timeout_ms_; }

    /// Runs `sql` (no parameters, rows ignored).
    void exec(const char* sql) {
        char* msg = nullptr;
        const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &msg);
        if (rc != SQLITE_OK) {
            std::string why = msg ? msg : sqlite3_errstr(rc);
            sqlite3_free(msg);
            fail(rc, sqlite3_system_errno(db_), sql, why.c_str());
        }
    }

    /// Throws for `rc` if it is not SQLITE_OK, naming `doing`.
    void check(int rc, std::string_view doing) {
        if (rc != SQLITE_OK) fail(rc, sqlite3_system_errno(db_), doing, sqlite3_errmsg(db_));
    }

    /// How long a call waits for a lock that another connection holds (SQLite's busy handler).
    void set_busy_timeout(long long ms) {
        busy_timeout_ms_ = ms;
        check(sqlite3_busy_timeout(db_, static_cast<int>(ms)), "sqlite3_busy_timeout");
    }

    /// Throws the typed exception for a failed call: the problem in delayq's words, then what
    /// was being done and SQLite's own words.
    [[noreturn]] void fail(int rc, int sys_errno, std::string_view doing, const char* why) {
        problem p = classify(rc, sys_errno);
        if (p == problem::other && (rc & 0xff) == SQLITE_IOERR && out_of_room(path_))
            p = problem::disk_full;
        std::string what;
        switch (p) {
            case problem::busy:
                what = "the file is locked by another connection for longer than busy_timeout (" +
                       std::to_string(busy_timeout_ms_) + " ms)";
                break;
            case problem::disk_full:
                what = "the disk is full (or the file reached its size limit)";
                break;
            case problem::corrupt:
                what = "the file is corrupt";
                break;
            case problem::read_only:
                what = "the file is read-only";
                break;
            case problem::not_a_queue:
                what = "not a delayq queue";
                break;
            default:
                what = "SQLite failed";
                break;
        }
        fail(p, what + " (in `" + std::string(doing) + "`: " + why + ")", rc);
    }
    [[noreturn]] void fail(problem p, const std::string& what, int rc = 0) {
        raise(p, "delayq::sqlite: " + path_ + ": " + what, rc);
    }

  private:
    std::string path_;
    sqlite3* db_ = nullptr;
    long long busy_timeout_ms_ = 0;
};

/// One prepared statement, reset after each use (see use()).
class statement {
  public:
    statement(database& db, std::string sql) : db_(&db), sql_(std::move(sql)) {
        const int rc =
            sqlite3_prepare_v3(db.get(), sql_.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &s_, nullptr);
        db.check(rc, sql_);
    }
    ~statement() { sqlite3_finalize(s_); }
    statement(const statement&) = delete;
    statement& operator=(const statement&) = delete;

    /// Binds parameters 1.. in order; each a long long, a string_view bound as a BLOB, or an
    /// optional string_view: a BLOB, or NULL when empty.
    template <class... Args>
    statement& bind(const Args&... args) {
        int i = 0;
        (bind_one(++i, args), ...);
        return *this;
    }

    /// The next row (true), or done (false).
    bool step() {
        const int rc = sqlite3_step(s_);
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        const int sys = sqlite3_system_errno(db_->get());
        const std::string why = sqlite3_errmsg(db_->get());
        sqlite3_reset(s_);
        db_->fail(rc, sys, sql_, why.c_str());
    }

    /// Steps to the end, for statements without rows; the rows changed.
    int run() {
        while (step()) {
        }
        return sqlite3_changes(db_->get());
    }

    long long integer(int col) const noexcept { return sqlite3_column_int64(s_, col); }
    bool is_null(int col) const noexcept { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
    std::string blob(int col) const {
        const void* p = sqlite3_column_blob(s_, col);
        const int n = sqlite3_column_bytes(s_, col);
        return p ? std::string(static_cast<const char*>(p), static_cast<std::size_t>(n))
                 : std::string();
    }

    /// Resets and unbinds on leaving scope, so that no statement holds a read snapshot (or a
    /// view into a blob) between uses.
    class use {
      public:
        explicit use(statement& s) noexcept : s_(s) {}
        ~use() {
            sqlite3_reset(s_.s_);
            sqlite3_clear_bindings(s_.s_);
        }
        use(const use&) = delete;
        use& operator=(const use&) = delete;
        statement* operator->() const noexcept { return &s_; }
        statement& operator*() const noexcept { return s_; }

      private:
        statement& s_;
    };

  private:
    void bind_one(int i, long long v) { db_->check(sqlite3_bind_int64(s_, i, v), sql_); }
    void bind_one(int i, std::string_view v) {
        // SQLITE_STATIC: the caller's bytes live until the statement is reset (use's scope).
        db_->check(sqlite3_bind_blob64(s_, i, v.empty() ? "" : v.data(), v.size(), SQLITE_STATIC),
                   sql_);
    }

    void bind_one(int i, const std::optional<std::string_view>& v) {
        if (v) return bind_one(i, *v);
        db_->check(sqlite3_bind_null(s_, i), sql_);
    }

    database* db_;
    std::string sql_;
    sqlite3_stmt* s_ = nullptr;
};

/// BEGIN IMMEDIATE ... COMMIT: a write transaction that takes the file's write lock at once (so
/// it never fails half-way to upgrade a read lock, which SQLite reports as busy without waiting),
/// rolled back if it is left without commit().
class write_transaction {
  public:
    write_transaction(statement& begin, statement& commit, statement& rollback)
        : commit_(commit), rollback_(rollback) {
        statement::use u(begin);
        u->run();
    }
    ~write_transaction() {
        if (open_) {
            statement::use u(rollback_);
            try {
                u->run();
            } catch (...) {  // SQLite has rolled back by itself after the error that got us here
            }
        }
    }
    write_transaction(const write_transaction&) = delete;
    write_transaction& operator=(const write_transaction&) = delete;

    void commit() {
        statement::use u(commit_);
        u->run();
        open_ = false;
    }

  private:
    statement& commit_;
    statement& rollback_;
    bool open_ = true;
};

}  // namespace delayq::sqlite::detail
