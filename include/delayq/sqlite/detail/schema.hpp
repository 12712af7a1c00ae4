// The file format of delayq::sqlite (format 1) and opening a file as a queue. Part of
// <delayq/sqlite/delay_queue.hpp>.
//
// The file. One SQLite database in WAL mode, marked as a delayq queue by its header:
// `PRAGMA application_id` is 0x64517571 ("dQuq") and `PRAGMA user_version` the format number. A
// file with another application id, or an SQLite file with tables of its own, is not a queue and is
// left untouched; a file of a later format is refused, not guessed at.
//
// clang-format off
//   jobs  id BLOB PRIMARY KEY, payload BLOB, due INTEGER, attempts INTEGER, token INTEGER,
//         lease_end INTEGER (NULL while waiting)                           -- WITHOUT ROWID
//         waiting: lease_end IS NULL; `due` is when it is due
//         leased:  lease_end is when the lease ends; `due` is when this delivery was due;
//                  `token` the lease's fencing token; negated while an ack keeps the job for
//                  its object's next take() (prefetch: a short hold, the attempt not counted)
//   jobs_due    ON jobs(due)       WHERE lease_end IS NULL      -- the next due job: one seek
//   jobs_leases ON jobs(lease_end) WHERE lease_end IS NOT NULL  -- the next ended lease: one seek
//   dead  id BLOB PRIMARY KEY, payload BLOB, attempts INTEGER, died INTEGER  -- past max_attempts
//   meta  name TEXT PRIMARY KEY, value INTEGER: 'token', the last fencing token handed out
// clang-format on
//
// Times are milliseconds since the system_clock epoch (1970), so that they mean the same after a
// reboot and in every process. A job is due once the system clock, rounded down to the
// millisecond, reaches `due`; new due times are rounded up, so nothing is ever early.
//
// Why WITHOUT ROWID: every lookup is by id (put's duplicate check, ack, nack, cancel), and a
// rowid table would need a second b-tree (a unique index on id) beside the table itself. Why a
// dead table of its own: a dead job's id is free to be put again, as in the Redis backend; a dead
// job with the same id as a later one replaces the older dead entry.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "handle.hpp"

namespace delayq::sqlite::detail {

inline constexpr std::int32_t application_id = 0x64517571;  // "dQuq"
inline constexpr int format_version = 1;

inline constexpr const char* schema_sql =
    "CREATE TABLE IF NOT EXISTS jobs(id BLOB PRIMARY KEY NOT NULL, payload BLOB NOT NULL,"
    " due INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
    " token INTEGER NOT NULL DEFAULT 0, lease_end INTEGER) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS jobs_due ON jobs(due) WHERE lease_end IS NULL;"
    "CREATE INDEX IF NOT EXISTS jobs_leases ON jobs(lease_end) WHERE lease_end IS NOT NULL;"
    "CREATE TABLE IF NOT EXISTS dead(id BLOB PRIMARY KEY NOT NULL, payload BLOB NOT NULL,"
    " attempts INTEGER NOT NULL, died INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)"
    " WITHOUT ROWID;"
    "INSERT OR IGNORE INTO meta(name, value) VALUES('token', 0);"
    "PRAGMA application_id = 1683060081;"  // application_id, in decimal
    "PRAGMA user_version = 1;";            // format_version

// One integer from a query of one row (a pragma, a count).
inline long long query_integer(database& db, const char* sql) {
    statement s(db, sql);
    statement::use u(s);
    return u->step() ? u->integer(0) : 0;
}

// Whether the file looks like SQLite at all: its first 16 bytes. SQLite says SQLITE_NOTADB both
// for a file that never was a database and for one whose header was damaged; the magic string
// tells which (a delayq file with a damaged first page is corrupt, a text file is not a queue).
inline bool has_sqlite_header(const std::string& path) {
    char head[16] = {};
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    const std::size_t n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
    // The header string is "SQLite format 3" and its NUL: 16 bytes, the NUL included.
    constexpr char magic[] = "SQLite format 3";
    static_assert(sizeof magic == sizeof head);
    return n == sizeof head && std::memcmp(head, magic, sizeof head) == 0;
}

// The file's size in bytes; 0 if it does not exist.
inline std::uint64_t file_size(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

// Makes `db` a queue: checks what the file holds, creates the tables in an empty one, and turns on
// WAL. Throws the typed errors (not a queue, a newer format, read-only, ...).
inline void open_queue(database& db) {
    if (sqlite3_db_readonly(db.get(), "main") == 1)
        db.fail(problem::read_only, "the file is read-only (opened without write permission)",
                SQLITE_READONLY);
    long long app = 0, version = 0, tables = 0;
    try {
        app = query_integer(db, "PRAGMA application_id");
        version = query_integer(db, "PRAGMA user_version");
        tables = query_integer(db, "SELECT count(*) FROM sqlite_schema");
    } catch (...) {
        // The first read of a file that is not SQLite fails with SQLITE_NOTADB: say which case.
        if (sqlite3_errcode(db.get()) == SQLITE_NOTADB) {
            if (has_sqlite_header(db.path()))
                db.fail(problem::corrupt,
                        "the file is corrupt: its SQLite header is damaged (SQLITE_NOTADB)",
                        SQLITE_NOTADB);
            db.fail(problem::not_a_queue,
                    "not a delayq queue: the file is not an SQLite database (SQLITE_NOTADB)",
                    SQLITE_NOTADB);
        }
        throw;
    }
    const bool empty = app == 0 && version == 0 && tables == 0;
    // SQLite reads a file shorter than its header as an empty database, and would write one
    // over it: a short file of something else must stay as it is.
    if (empty && file_size(db.path()) > 0 && !has_sqlite_header(db.path()))
        db.fail(problem::not_a_queue, "not a delayq queue: the file is not an SQLite database");
    if (!empty) {
        if (app != application_id)
            db.fail(
                problem::not_a_queue,
                "not a delayq queue: an SQLite database of another application (application_id " +
                    std::to_string(app) + ", " + std::to_string(tables) + " schema objects)");
        if (version > format_version)
            db.fail(problem::newer_version,
                    "written by a newer delayq: queue format " + std::to_string(version) +
                        ", this version reads format " + std::to_string(format_version) +
                        " (upgrade delayq to open it)");
        if (version < format_version)
            db.fail(problem::corrupt, "the file is corrupt: a delayq queue of unknown format " +
                                          std::to_string(version));
    }
    // WAL: readers never block the writer, and a commit appends to the log (one fsync, or none
    // with synchronous=NORMAL) instead of writing a rollback journal and the pages. It is
    // recorded in the file: every later connection gets it too.
    {
        statement s(db, "PRAGMA journal_mode=WAL");
        statement::use u(s);
        const std::string mode = u->step() ? u->blob(0) : std::string();
        if (mode != "wal")
            db.fail(problem::other, "cannot switch to WAL mode (journal_mode is '" + mode + "')");
    }
    if (empty) {
        // Two processes may create the file at once: the second finds the tables in place
        // (IF NOT EXISTS) once it has the write lock.
        db.exec("BEGIN IMMEDIATE");
        try {
            db.exec(schema_sql);
            db.exec("COMMIT");
        } catch (...) {
            sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
            throw;
        }
    }
}

}  // namespace delayq::sqlite::detail
