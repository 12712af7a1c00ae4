// The file format of delayq::sqlite (format 1) and opening a file as a queue. Part of
// <delayq/sqlite/delay_queue.hpp>.
//
// Two homes. A queue in a file of its own (the default) is marked as a delayq queue by the file's
// header: `PRAGMA application_id` is 0x64517571 ("dQuq") and `PRAGMA user_version` the format
// number; its tables are jobs, dead, meta and grants. A file with another application id, or an
// SQLite file with tables of its own, is not such a queue and is left untouched; a file of a later
// format is refused, not guessed at. A queue in the application's own database
// (options::allow_other_tables), beside its tables, so that the application can put a job in its
// own transaction: there the header is the application's, so the queue's tables carry the prefix
// `delayq_` (delayq_jobs, delayq_dead, delayq_meta, delayq_grants, and their indexes and triggers),
// which keeps them apart from the application's, and the format number is the 'format' row of
// delayq_meta. A queue file of its own can be opened that way too; its tables keep their names.
// Either way the file is in WAL mode.
//
// clang-format off
//   jobs  id BLOB PRIMARY KEY, payload BLOB, due INTEGER, attempts INTEGER, token INTEGER,
//         lease_end INTEGER (NULL while waiting), last_error BLOB (NULL: none),
//         repeat TEXT (NULL: a one-off job)                                   -- WITHOUT ROWID
//         waiting: lease_end IS NULL; `due` is when it is due
//         leased:  lease_end is when the lease ends; `due` is when this delivery was due;
//                  `token` the lease's fencing token, `attempts` counts this delivery;
//                  a waiting job keeps the token of its last lease (the next one is greater)
//         (A file written by an earlier version may hold a negative token: a job an ack leased
//         ahead for its object's next take, for a short hold, its attempt not counted. Its lease
//         ends and is reclaimed like any other; no ack matches it.)
//         last_error: the reason of the last nack() or bury() that gave one (cut to
//         max_reason_size bytes), or lease_ended_reason; a put starts without one
//         repeat: the schedule of a series (put_every, put_cron), in the text of
//         delayq/detail/job_queue/repeat.hpp; the step that acks the run, or moves it to the
//         dead letters, queues the next run with the same id, payload and schedule
//         (transitions.hpp, "Series")
//   jobs_due    ON jobs(due)       WHERE lease_end IS NULL      -- the next due job: one seek
//   jobs_leases ON jobs(lease_end) WHERE lease_end IS NOT NULL  -- the next ended lease: one seek
//   dead  id BLOB PRIMARY KEY, payload BLOB, attempts INTEGER, died INTEGER,
//         last_error BLOB (the job's, as it died)                          -- past max_attempts
//   dead_died   ON dead(died, id)  -- dead(): the dead letters in the order they died, one seek;
//                                     purge_dead() and keep_dead: the oldest, one seek
//   meta  name TEXT PRIMARY KEY, value INTEGER: 'format', the format number (in files created
//         since the queue could share one); 'token', the fencing token counter of earlier
//         versions (tokens are now per job: transitions.hpp's lease_due()); 'paused', 1 while
//         the queue is paused (pause()), else 0 (no row: 0); 'queued' and 'dead', the rows of
//         jobs and of dead, kept by the triggers below (stats())
//   jobs_counted_in, jobs_counted_out   AFTER INSERT / AFTER DELETE ON jobs: 'queued' +1 / -1
//   dead_counted_in   BEFORE INSERT ON dead: 'dead' +1, unless the id is dead already (an
//                     INSERT OR REPLACE of it replaces a row: the count stays)
//   dead_counted_out  AFTER DELETE ON dead: 'dead' -1
//   grants  at INTEGER PRIMARY KEY (ms), n INTEGER: n leases made at `at` by objects with a rate
//           (options::limits); the takes that count them remove the rows older than their
//           period (transitions.hpp, "Limits")
// clang-format on
//
// Times are milliseconds since the system_clock epoch (1970), so that they mean the same after a
// reboot and in every process. A job is due once the system clock, rounded down to the
// millisecond, reaches `due`; new due times are rounded up, so nothing is ever early.
//
// Upgrades in place. A file written before last_error and dead_died existed is the same format:
// the queue adds the two columns (NULL in every row: no last error) and the index when it opens
// the file, in the transaction that checks it, so that one opener does it and the others see it
// done. It stays format 1 because every statement names its columns: a version that knows nothing
// of last_error reads and writes an upgraded file as before (its rows get no last error), and
// checks only the format number, never the columns. So with the 'paused' row of meta, added (0:
// running) to a file written before pause() existed: a missing row reads as running anyway, and
// the row is there so that the file shows its state to whoever reads it. A version without
// pause() never reads the row: its takes do not stop for a pause (docs/sqlite.md, "Pausing").
// So with the repeat column of jobs (the schedules of series), added as last_error was: a version
// that knows nothing of series never reads it, and inserts one-off jobs (NULL); but its ack of a
// run (or its move to the dead letters) queues no next run, so a series whose run is settled by
// such an object ends there. So with the counts and the grants (add_counts_and_grants()): a file
// without the triggers gets them, and its 'queued' and 'dead' rows are counted from its tables
// then, once (O(n), in the opening transaction); a file without the grants table gets it, empty. A
// version without them writes the upgraded file as before: the triggers are the file's, so they
// count its rows too, and it never reads the grants (its takes know no limits).
//
// Why triggers keep the counts, not the statements of the transitions: every writer of the file
// counts then, whatever it is: put_in_transaction() and cancel_in_transaction() on the
// application's connection, a version of delayq without stats(), an operator's DELETE. They cost
// each insert or delete of a row one update of a meta row (docs/performance.md has the
// figures). The dead count
// is taken before the insert because the move to the dead letters is an INSERT OR REPLACE (an id
// that died before dies again), whose replaced row fires no delete trigger (SQLite's
// recursive_triggers is off, on every connection of delayq).
//
// Why WITHOUT ROWID: every lookup is by id (put's duplicate check, ack, nack, cancel), and a
// rowid table would need a second b-tree (a unique index on id) beside the table itself. Why a
// dead table of its own: a dead job's id is free to be put again, as in the Redis backend; a dead
// job with the same id as a later one replaces the older dead entry.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "handle.hpp"

namespace delayq::sqlite::detail {

inline constexpr std::int32_t application_id = 0x64517571;  // "dQuq"
inline constexpr int format_version = 1;

/// Where the queue's tables are: the prefix of their names ("" in a file of its own, "delayq_"
/// beside an application's tables).
struct layout {
    std::string prefix;

    /// `sql` with {jobs}, {dead}, {meta} and {grants} replaced by the tables' names ({jobs}_due
    /// names an index).
    std::string operator()(std::string_view sql) const {
        std::string out;
        out.reserve(sql.size() + 32);
        for (std::size_t i = 0; i < sql.size();) {
            bool named = false;
            for (const std::string_view t : {"{jobs}", "{dead}", "{meta}", "{grants}"})
                if (sql.substr(i, t.size()) == t) {
                    out += prefix;
                    out += t.substr(1, t.size() - 2);
                    i += t.size();
                    named = true;
                    break;
                }
            if (!named) out += sql[i++];
        }
        return out;
    }
};

inline constexpr std::string_view shared_prefix = "delayq_";

// Run inside open_queue()'s write transaction, on a file found without the queue's tables.
inline constexpr std::string_view schema_sql =
    "CREATE TABLE {jobs}(id BLOB PRIMARY KEY NOT NULL, payload BLOB NOT NULL,"
    " due INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
    " token INTEGER NOT NULL DEFAULT 0, lease_end INTEGER, last_error BLOB, repeat TEXT)"
    " WITHOUT ROWID;"
    "CREATE INDEX {jobs}_due ON {jobs}(due) WHERE lease_end IS NULL;"
    "CREATE INDEX {jobs}_leases ON {jobs}(lease_end) WHERE lease_end IS NOT NULL;"
    "CREATE TABLE {dead}(id BLOB PRIMARY KEY NOT NULL, payload BLOB NOT NULL,"
    " attempts INTEGER NOT NULL, died INTEGER NOT NULL, last_error BLOB) WITHOUT ROWID;"
    "CREATE INDEX {dead}_died ON {dead}(died, id);"
    "CREATE TABLE {meta}(name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)"
    " WITHOUT ROWID;"
    // format_version; running
    "INSERT INTO {meta}(name, value) VALUES('token', 0), ('format', 1), ('paused', 0);";

// What a file of format 1 written before the last error was kept lacks (see "Upgrades in place"):
// the columns, added by upgrade(), and the index.
inline constexpr std::string_view dead_index_sql =
    "CREATE INDEX IF NOT EXISTS {dead}_died ON {dead}(died, id)";

// And what one written before pause() lacks: the 'paused' row, running.
inline constexpr std::string_view paused_row_sql =
    "INSERT OR IGNORE INTO {meta}(name, value) VALUES('paused', 0)";

// And what one written before stats() and limits lacks: the triggers that count the rows of
// jobs and dead into meta (the counts themselves are set by add_counts_and_grants(), from the
// tables), and the grants of the rate limit.
inline constexpr std::string_view counts_sql =
    "CREATE TRIGGER {jobs}_counted_in AFTER INSERT ON {jobs} BEGIN"
    " UPDATE {meta} SET value = value + 1 WHERE name = 'queued'; END;"
    "CREATE TRIGGER {jobs}_counted_out AFTER DELETE ON {jobs} BEGIN"
    " UPDATE {meta} SET value = value - 1 WHERE name = 'queued'; END;"
    "CREATE TRIGGER {dead}_counted_in BEFORE INSERT ON {dead} BEGIN"
    " UPDATE {meta} SET value = value + 1 - (SELECT count(*) FROM {dead} WHERE id = NEW.id)"
    " WHERE name = 'dead'; END;"
    "CREATE TRIGGER {dead}_counted_out AFTER DELETE ON {dead} BEGIN"
    " UPDATE {meta} SET value = value - 1 WHERE name = 'dead'; END;";
inline constexpr std::string_view recount_sql =
    "INSERT OR REPLACE INTO {meta}(name, value) VALUES"
    " ('queued', (SELECT count(*) FROM {jobs})), ('dead', (SELECT count(*) FROM {dead}))";
inline constexpr std::string_view grants_sql =
    "CREATE TABLE IF NOT EXISTS {grants}(at INTEGER PRIMARY KEY NOT NULL, n INTEGER NOT NULL)";

// And in a file of its own, its header.
inline constexpr const char* mark_sql =
    "PRAGMA application_id = 1683060081;"  // application_id, in decimal
    "PRAGMA user_version = 1;";            // format_version

// One integer from a query of one row (a pragma, a count).
inline long long query_integer(database& db, const char* sql) {
    statement s(db, sql);
    statement::use u(s);
    return u->step() ? u->integer(0) : 0;
}

// The database file as SQLite holds it open. The library never opens the file (or its WAL) itself
// while a connection may be open on it in the process: closing any descriptor of a file drops every
// POSIX lock the process holds on it, SQLite's among them, and another process would then take
// the file for unused (SQLite's "How To Corrupt An SQLite Database File", 2.2).
inline sqlite3_file* main_file(database& db) {
    sqlite3_file* f = nullptr;
    if (sqlite3_file_control(db.get(), "main", SQLITE_FCNTL_FILE_POINTER, &f) != SQLITE_OK ||
        f == nullptr || f->pMethods == nullptr)
        return nullptr;
    return f;
}

// Whether the file looks like SQLite at all: its first 16 bytes, read through SQLite's own
// descriptor. SQLite says SQLITE_NOTADB both for a file that never was a database and for one
// whose header was damaged; the magic string tells which (a delayq file with a damaged first page
// is corrupt, a text file is not a queue).
inline bool has_sqlite_header(database& db) {
    sqlite3_file* f = main_file(db);
    char head[16] = {};
    // A file shorter than that reads as SQLITE_IOERR_SHORT_READ.
    if (f == nullptr || f->pMethods->xRead(f, head, sizeof head, 0) != SQLITE_OK) return false;
    // The header string is "SQLite format 3" and its NUL: 16 bytes, the NUL included.
    constexpr char magic[] = "SQLite format 3";
    static_assert(sizeof magic == sizeof head);
    return std::memcmp(head, magic, sizeof head) == 0;
}

// The file's size in bytes; 0 if it does not exist. stat() opens no descriptor.
inline std::uint64_t file_size(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

// What the file's header and schema say, read in one transaction.
struct contents {
    long long app = 0, version = 0, objects = 0;  // application_id, user_version, schema objects
    long long shared_tables = 0;                  // tables named delayq_*
    long long shared_format = 0;                  // delayq_meta's 'format', if it has one
    bool empty() const noexcept { return app == 0 && version == 0 && objects == 0; }

    void read(database& db) {
        app = query_integer(db, "PRAGMA application_id");
        version = query_integer(db, "PRAGMA user_version");
        objects = query_integer(db, "SELECT count(*) FROM sqlite_schema");
        shared_tables = query_integer(db,
                                      "SELECT count(*) FROM sqlite_schema WHERE type = 'table' "
                                      "AND name IN ('delayq_jobs', 'delayq_dead', 'delayq_meta')");
        if (query_integer(db,
                          "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = "
                          "'delayq_meta'") == 1)
            shared_format = query_integer(
                db, "SELECT coalesce(max(value), 0) FROM delayq_meta WHERE name = 'format'");
    }
};

// BEGIN IMMEDIATE ... COMMIT on `db` for open_queue(): rolled back if left without commit().
class opening_transaction {
  public:
    explicit opening_transaction(database& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }
    ~opening_transaction() {
        if (open_) sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    }
    opening_transaction(const opening_transaction&) = delete;
    opening_transaction& operator=(const opening_transaction&) = delete;
    void commit() {
        db_.exec("COMMIT");
        open_ = false;
    }

  private:
    database& db_;
    bool open_ = true;
};

// Switches the file to WAL mode (recorded in the file: every later connection gets it too).
// The switch needs the file to itself for a moment, and SQLite answers SQLITE_BUSY at once,
// without its busy handler, when another connection holds the write lock: so this waits and
// retries, up to the connection's busy_timeout in all.
inline void use_wal(database& db) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto limit = std::chrono::milliseconds(db.busy_timeout_ms());
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
        std::string mode;
        char* msg = nullptr;
        const int rc = sqlite3_exec(
            db.get(), "PRAGMA journal_mode=WAL",
            [](void* out, int, char** v, char**) {
                *static_cast<std::string*>(out) = v[0] != nullptr ? v[0] : "";
                return 0;
            },
            &mode, &msg);
        const std::string why = msg != nullptr ? msg : sqlite3_errstr(rc);
        sqlite3_free(msg);
        if (rc == SQLITE_OK) {
            if (mode != "wal")
                db.fail(problem::other,
                        "cannot switch to WAL mode (journal_mode is '" + mode + "')");
            return;
        }
        const auto waited = clock::now() - start;
        if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
            db.fail(rc, sqlite3_system_errno(db.get()), "PRAGMA journal_mode=WAL", why.c_str());
        if (waited >= limit) {
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
            db.fail(problem::busy,
                    "cannot switch the file to WAL mode: other connections kept it busy for " +
                        std::to_string(ms) + " ms, past busy_timeout (" +
                        std::to_string(limit.count()) + " ms) (" + why + ")",
                    rc);
        }
        std::this_thread::sleep_for(std::min<clock::duration>(pause, limit - waited));
        pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
}

// In open_queue()'s write transaction, on a new queue or one found in the file: the grants
// table, and the triggers that count the rows with the counts they start from, unless the file has
// them. A count row gone (a file is anyone's to edit) is counted again too.
inline void add_counts_and_grants(database& db, const layout& where) {
    db.exec(where(grants_sql).c_str());
    const std::string triggers = where(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND name IN"
        " ('{jobs}_counted_in', '{jobs}_counted_out', '{dead}_counted_in', '{dead}_counted_out')");
    const long long found = query_integer(db, triggers.c_str());
    if (found != 4) {
        for (const std::string_view t :
             {"{jobs}_counted_in", "{jobs}_counted_out", "{dead}_counted_in", "{dead}_counted_out"})
            db.exec(("DROP TRIGGER IF EXISTS " + where(t)).c_str());
        db.exec(where(counts_sql).c_str());
    }
    const std::string rows = where("SELECT count(*) FROM {meta} WHERE name IN ('queued', 'dead')");
    if (found != 4 || query_integer(db, rows.c_str()) != 2) db.exec(where(recount_sql).c_str());
}

// Throws unless `version` is a format this version reads.
inline void check_format(database& db, long long version) {
    if (version > format_version)
        db.fail(problem::newer_version,
                "written by a newer delayq: queue format " + std::to_string(version) +
                    ", this version reads format " + std::to_string(format_version) +
                    " (upgrade delayq to open it)");
    if (version < format_version)
        db.fail(problem::corrupt,
                "the file is corrupt: a delayq queue of unknown format " + std::to_string(version));
}

// In open_queue()'s write transaction, on a queue found in the file: adds what an earlier version
// of format 1 did not write (the last_error columns, the repeat column of jobs, the dead letters'
// index, the 'paused' row; the counts and the grants are add_counts_and_grants()'s). Nothing when
// the file has them already. Adding a column rewrites no row (SQLite reads the missing value as
// NULL); the index is built once, from the dead letters the file holds.
inline void upgrade(database& db, const layout& where) {
    const auto add = [&](std::string_view table, std::string_view column, std::string_view type) {
        const std::string name = where(table);
        const std::string has = "SELECT count(*) FROM pragma_table_info('" + name +
                                "') WHERE name = '" + std::string(column) + "'";
        if (query_integer(db, has.c_str()) == 0)
            db.exec(("ALTER TABLE " + name + " ADD COLUMN " + std::string(column) + " " +
                     std::string(type))
                        .c_str());
    };
    add("{jobs}", "last_error", "BLOB");
    add("{dead}", "last_error", "BLOB");
    add("{jobs}", "repeat", "TEXT");
    db.exec(where(dead_index_sql).c_str());
    db.exec(where(paused_row_sql).c_str());
}

// Makes `db` a queue: checks what the file holds, creates the tables where there are none (or
// adds what an earlier version did not write: upgrade()), and turns on WAL. Returns where the
// tables are. `beside_others`: options::allow_other_tables. Throws the typed errors (not a queue, a
// newer format, read-only, ...).
//
// Several processes may create one file at the same moment: the header and the schema are read,
// and the tables created if there are none, in one write transaction, so that a peer's creation
// is seen whole or not at all, and only one process creates. The switch to WAL comes after it
// (it cannot be made inside a transaction): a file that is a queue but not yet in WAL mode is
// switched by whichever process gets there.
inline layout open_queue(database& db, bool beside_others) {
    if (sqlite3_db_readonly(db.get(), "main") == 1)
        db.fail(problem::read_only, "the file is read-only (opened without write permission)",
                SQLITE_READONLY);
    layout where;
    {
        std::optional<opening_transaction> t;
        contents c;
        try {
            t.emplace(db);
            c.read(db);
        } catch (...) {
            // The first read of a file that is not SQLite fails with SQLITE_NOTADB: say which
            // case.
            if (sqlite3_errcode(db.get()) == SQLITE_NOTADB) {
                t.reset();
                if (has_sqlite_header(db))
                    db.fail(problem::corrupt,
                            "the file is corrupt: its SQLite header is damaged (SQLITE_NOTADB)",
                            SQLITE_NOTADB);
                db.fail(problem::not_a_queue,
                        "not a delayq queue: the file is not an SQLite database (SQLITE_NOTADB)",
                        SQLITE_NOTADB);
            }
            throw;
        }
        // SQLite reads a file shorter than its header as an empty database, and would write one
        // over it: a short file of something else must stay as it is.
        if (c.empty() && file_size(db.path()) > 0 && !has_sqlite_header(db))
            db.fail(problem::not_a_queue, "not a delayq queue: the file is not an SQLite database");
        bool create = false;
        if (c.app == application_id) {  // a queue of its own
            check_format(db, c.version);
        } else if (c.empty() && !beside_others) {
            create = true;
        } else if (c.shared_format != 0) {  // a queue beside an application's tables
            if (!beside_others)
                db.fail(problem::not_a_queue,
                        "not a delayq queue of its own: the file holds a queue beside other "
                        "tables (open it with options::allow_other_tables)");
            check_format(db, c.shared_format);
            where.prefix = shared_prefix;
        } else if (!beside_others) {
            db.fail(problem::not_a_queue,
                    "not a delayq queue: an SQLite database of another application "
                    "(application_id " +
                        std::to_string(c.app) + ", " + std::to_string(c.objects) +
                        " schema objects)");
        } else if (c.shared_tables != 0) {
            db.fail(problem::not_a_queue,
                    "not a delayq queue: the file has tables named delayq_jobs, delayq_dead or "
                    "delayq_meta that are not a delayq queue's (no format in delayq_meta)");
        } else {  // the application's database, or an empty file: the queue moves in
            create = true;
            where.prefix = shared_prefix;
        }
        if (create) {
            db.exec(where(schema_sql).c_str());
            if (where.prefix.empty()) db.exec(mark_sql);
        } else {
            upgrade(db, where);
        }
        add_counts_and_grants(db, where);
        t->commit();
    }
    // WAL: readers never block the writer, and a commit appends to the log (one fsync, or none
    // with synchronous=NORMAL) instead of writing a rollback journal and the pages.
    use_wal(db);
    return where;
}

}  // namespace delayq::sqlite::detail
