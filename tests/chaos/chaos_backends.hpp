// The chaos check's backends: one small adapter per job queue, all that the harness knows of it.
// The workers (chaos_worker.hpp) speak only delayq::job_queue; an adapter B adds
//
//   using queue = Q;                         // satisfies delayq::job_queue
//   static constexpr const char* name;       // what --backend names
//   class store {                            // a fresh store for one round, made by the
//     store(const std::string& dir,             orchestrator: a new file path (not created: the
//           bool server_kills);                 workers race to create it), a new server; the
//     std::string locator() const;              locator is one word the workers open it by;
//     final_state inspect();                    inspect() reads what is left once all are gone;
//     void kill_server();                       optional: kill -9 of the server and a start
//                                               again on the same data (--server-kills);
//     static constexpr const char* stall_how;   optional: the store held up for `d`, then free
//     void stall(std::chrono::milliseconds d);  again (--server-stalls; run on a thread of its
//                                               own, never beside kill_server or
//                                               kill_connections; throws if it cannot);
//     long long kill_connections();             optional: every client connection killed, the
//   };                                          number killed (--connection-kills)
//   static std::unique_ptr<Q> open(const std::string& locator, const queue_settings&);
//
// and joins `backends` at the bottom. A backend whose library is not built is left out by its
// DELAYQ_CHAOS_<NAME> macro (tests/chaos/CMakeLists.txt).
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "chaos_check.hpp"

#ifdef DELAYQ_CHAOS_SQLITE
#include <sqlite3.h>

#include <delayq/sqlite/delay_queue.hpp>
#endif
#ifdef DELAYQ_CHAOS_REDIS
#include <delayq/redis/delay_queue.hpp>

#include "redis_server.hpp"
#endif
#ifdef DELAYQ_CHAOS_POSTGRES
#include <libpq-fe.h>

#include <delayq/postgres/delay_queue.hpp>

#include "pg_server.hpp"
#endif

namespace delayq_chaos {

/// The options every worker of a round opens its queue with.
struct queue_settings {
    std::chrono::milliseconds lease{500};
    unsigned max_attempts = 3;
    std::chrono::milliseconds call_timeout{10'000};  ///< busy_timeout, io_timeout
    std::size_t max_leased = 0;                      ///< options.limits.max_leased (0: none)
};

#ifdef DELAYQ_CHAOS_SQLITE
struct sqlite_backend {
    using queue = delayq::sqlite::delay_queue;
    static constexpr const char* name = "sqlite";

    class store {
      public:
        // No server: a store whose server the chaos kills (--server-kills) has kill_server().
        store(const std::string& dir, bool) : path_(dir + "/queue.db") {}
        std::string locator() const { return path_; }

        // No server to stall either: the analogue is another process (the orchestrator) holding
        // the file's write lock, BEGIN EXCLUSIVE, for `d`. Every write waits (up to busy_timeout);
        // readers go on (WAL). SQLite has no connections to kill.
        static constexpr const char* stall_how = "begin-exclusive";
        void stall(std::chrono::milliseconds d) const {
            sqlite3* db = nullptr;
            const auto fail = [&](const std::string& what) {
                const std::string m = what + ": " + sqlite3_errmsg(db);
                sqlite3_close(db);
                throw std::runtime_error(m);
            };
            if (sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK)
                fail("cannot open the file");
            sqlite3_busy_timeout(db, 10'000);
            if (sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) != SQLITE_OK)
                fail("BEGIN EXCLUSIVE");
            std::this_thread::sleep_for(d);
            if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) fail("COMMIT");
            sqlite3_close(db);
        }

        // Through SQLite itself, once no queue has the file open: the jobs left, the dead
        // letters with their attempts, and `PRAGMA integrity_check`.
        final_state inspect() const {
            final_state s;
            sqlite3* db = nullptr;
            if (sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
                s.notes.push_back(std::string("cannot open the file: ") + sqlite3_errmsg(db));
                sqlite3_close(db);
                return s;
            }
            sqlite3_busy_timeout(db, 10'000);
            bool ok = true;
            const auto each = [&](const char* sql, auto&& row) {
                sqlite3_stmt* st = nullptr;
                if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
                    s.notes.push_back(std::string(sql) + ": " + sqlite3_errmsg(db));
                    ok = false;
                    return;
                }
                int rc;
                while ((rc = sqlite3_step(st)) == SQLITE_ROW) row(st);
                if (rc != SQLITE_DONE) {
                    s.notes.push_back(std::string(sql) + ": " + sqlite3_errmsg(db));
                    ok = false;
                }
                sqlite3_finalize(st);
            };
            const auto text = [](sqlite3_stmt* st, int i) {
                const auto* p = static_cast<const char*>(sqlite3_column_blob(st, i));
                return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(st, i)))
                         : std::string();
            };
            std::string integrity;
            each("PRAGMA integrity_check", [&](sqlite3_stmt* st) {
                integrity += (integrity.empty() ? "" : "; ") + text(st, 0);
            });
            s.integrity = integrity.empty() ? "no answer" : integrity;
            each("SELECT id FROM jobs", [&](sqlite3_stmt* st) { s.queued.insert(text(st, 0)); });
            each("SELECT id, attempts FROM dead",
                 [&](sqlite3_stmt* st) { s.dead[text(st, 0)] = sqlite3_column_int64(st, 1); });
            sqlite3_close(db);
            s.read = ok;
            return s;
        }

      private:
        std::string path_;
    };

    static std::unique_ptr<queue> open(const std::string& locator, const queue_settings& qs) {
        delayq::sqlite::options o;
        o.path = locator;
        o.lease = qs.lease;
        o.max_attempts = qs.max_attempts;
        o.limits.max_leased = qs.max_leased;
        o.busy_timeout = qs.call_timeout;
        return std::make_unique<queue>(o);
    }
};
#endif

#ifdef DELAYQ_CHAOS_REDIS
struct redis_backend {
    using queue = delayq::redis::delay_queue;
    static constexpr const char* name = "redis";

    // A new redis-server for each round (tests/redis/redis_server.hpp: AOF on, killed with the
    // orchestrator); the queue is "chaos". With server kills, the AOF is fsynced before every
    // reply (appendfsync always, what a deployment that must not lose a returned put runs).
    class store {
      public:
        store(const std::string&, bool server_kills)
            : server_(server_kills ? std::vector<std::string>{"--appendfsync", "always"}
                                   : std::vector<std::string>{}) {}
        std::string locator() const { return std::to_string(server_.port()) + "/chaos"; }

        /// kill -9 of the server, then a start on the same port, reading its AOF back.
        void kill_server() { server_.restart(); }

        /// The server stopped (SIGSTOP) for `d`, then continued (SIGCONT): connections stay
        /// open, the kernel still accepts new ones, nothing answers.
        static constexpr const char* stall_how = "sigstop";
        void stall(std::chrono::milliseconds d) const {
            const pid_t pid = server_.pid();
            if (pid <= 0 || ::kill(pid, SIGSTOP) != 0)
                throw std::runtime_error("cannot stop the redis-server");
            std::this_thread::sleep_for(d);
            ::kill(pid, SIGCONT);
        }

        /// CLIENT KILL of every normal and pub/sub connection but the harness's own.
        long long kill_connections() const {
            long long n = 0;
            for (const auto& cmd :
                 {std::vector<std::string>{"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"},
                  std::vector<std::string>{"CLIENT", "KILL", "TYPE", "pubsub"}}) {
                auto r = server_.command(cmd);
                if (r->type != REDIS_REPLY_INTEGER)
                    throw std::runtime_error("CLIENT KILL: " +
                                             (r->str ? std::string(r->str, r->len) : "no count"));
                n += r->integer;
            }
            return n;
        }

        // The queue's keys, whatever their layout version: `dq:<v>:{chaos}:events` holds every
        // queued job (waiting or leased), `...:dead` the dead letters (no attempts recorded).
        final_state inspect() const {
            final_state s;
            try {
                for (const auto& key : server_.keys("*{chaos}*")) {
                    const auto ends = [&](const char* tail) {
                        const std::string t = tail;
                        return key.size() > t.size() &&
                               key.compare(key.size() - t.size(), t.size(), t) == 0;
                    };
                    if (ends(":events"))
                        for (auto& id : server_.list({"ZRANGE", key, "0", "-1"}))
                            s.queued.insert(id);
                    if (ends(":dead"))
                        for (auto& id : server_.list({"HKEYS", key})) s.dead[id] = -1;
                }
                s.read = true;
            } catch (const std::exception& e) {
                s.notes.push_back(std::string("cannot read the server: ") + e.what());
            }
            return s;
        }

      private:
        delayq_test::redis_server server_;
    };

    static std::unique_ptr<queue> open(const std::string& locator, const queue_settings& qs) {
        delayq::redis::options o;
        o.port = std::stoi(locator.substr(0, locator.find('/')));
        o.name = locator.substr(locator.find('/') + 1);
        o.lease = qs.lease;
        o.max_attempts = qs.max_attempts;
        o.limits.max_leased = qs.max_leased;
        o.io_timeout = qs.call_timeout;
        return std::make_unique<queue>(o);
    }
};
#endif

#ifdef DELAYQ_CHAOS_POSTGRES
struct postgres_backend {
    using queue = delayq::postgres::delay_queue;
    static constexpr const char* name = "postgres";

    // A new PostgreSQL server for each round (tests/postgres/pg_server.hpp: initdb in a temporary
    // directory, Debian's default settings, killed with the orchestrator); the queue is "chaos",
    // its tables created by whichever worker comes first. The locator is the port.
    class store {
      public:
        store(const std::string&, bool) {}
        std::string locator() const { return std::to_string(server_.port()); }

        /// kill -9 of the postmaster and its backends, then a start on the same data folder and
        /// port (crash recovery from the WAL).
        void kill_server() {
            server_.kill9();
            server_.start();
        }

        /// What a migration does: another connection takes the queue's tables in ACCESS
        /// EXCLUSIVE mode, holds them for `d` and commits. Every statement on them waits.
        static constexpr const char* stall_how = "lock-table";
        void stall(std::chrono::milliseconds d) const {
            PGconn* c = PQconnectdb(server_.conninfo().c_str());
            const auto exec = [&](const char* sql) {
                PGresult* r = PQexec(c, sql);
                const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
                PQclear(r);
                if (!ok) {
                    const std::string m = std::string(sql) + ": " + PQerrorMessage(c);
                    PQfinish(c);
                    throw std::runtime_error(m);
                }
            };
            if (PQstatus(c) != CONNECTION_OK) {
                const std::string m = std::string("cannot connect: ") + PQerrorMessage(c);
                PQfinish(c);
                throw std::runtime_error(m);
            }
            exec("SET lock_timeout = '10s'");
            exec("BEGIN");
            exec("LOCK TABLE delayq.jobs, delayq.dead IN ACCESS EXCLUSIVE MODE");
            std::this_thread::sleep_for(d);
            exec("COMMIT");
            PQfinish(c);
        }

        /// pg_terminate_backend() of every client backend of the queue's database but the
        /// harness's own.
        long long kill_connections() const {
            PGconn* c = PQconnectdb(server_.conninfo().c_str());
            // "PID ... is not a PostgreSQL backend process": one that ended meanwhile.
            PQsetNoticeProcessor(
                c, [](void*, const char*) {}, nullptr);
            std::string out, err;
            if (PQstatus(c) != CONNECTION_OK) {
                err = PQerrorMessage(c);
            } else {
                PGresult* r =
                    PQexec(c,
                           "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM "
                           "pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = "
                           "current_database() AND backend_type = 'client backend'");
                if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
                    out = PQgetvalue(r, 0, 0);
                else
                    err = PQresultErrorMessage(r);
                PQclear(r);
            }
            PQfinish(c);
            if (!err.empty()) throw std::runtime_error("pg_terminate_backend: " + err);
            return std::stoll(out);
        }

        // The rows left in the queue's tables, read through libpq.
        final_state inspect() const {
            final_state s;
            PGconn* c = PQconnectdb(server_.conninfo().c_str());
            const auto rows = [&](const char* sql, auto&& row) {
                PGresult* r = PQexec(c, sql);
                const bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
                if (!ok) s.notes.push_back(std::string(sql) + ": " + PQresultErrorMessage(r));
                for (int i = 0; ok && i < PQntuples(r); ++i) row(r, i);
                PQclear(r);
                return ok;
            };
            if (PQstatus(c) != CONNECTION_OK) {
                s.notes.push_back(std::string("cannot connect: ") + PQerrorMessage(c));
            } else {
                const bool a =
                    rows("SELECT convert_from(id, 'UTF8') FROM delayq.jobs WHERE queue = 'chaos'",
                         [&](PGresult* r, int i) { s.queued.insert(PQgetvalue(r, i, 0)); });
                const bool b = rows(
                    "SELECT convert_from(id, 'UTF8'), attempts FROM delayq.dead WHERE queue = "
                    "'chaos'",
                    [&](PGresult* r, int i) {
                        s.dead[PQgetvalue(r, i, 0)] = std::atoll(PQgetvalue(r, i, 1));
                    });
                s.read = a && b;
            }
            PQfinish(c);
            return s;
        }

      private:
        delayq_pg_test::pg_server server_;
    };

    static std::unique_ptr<queue> open(const std::string& locator, const queue_settings& qs) {
        delayq::postgres::options o;
        o.conninfo = "host=127.0.0.1 port=" + locator + " user=postgres dbname=postgres";
        o.name = "chaos";
        o.lease = qs.lease;
        o.max_attempts = qs.max_attempts;
        o.limits.max_leased = qs.max_leased;
        o.io_timeout = qs.call_timeout;
        return std::make_unique<queue>(o);
    }
};
#endif

/// Every backend this build can check, in the order `--backend all` runs them (a new backend
/// adds its line).
using backends = decltype(std::tuple_cat(
#ifdef DELAYQ_CHAOS_SQLITE
    std::tuple<sqlite_backend>{},
#endif
#ifdef DELAYQ_CHAOS_REDIS
    std::tuple<redis_backend>{},
#endif
#ifdef DELAYQ_CHAOS_POSTGRES
    std::tuple<postgres_backend>{},
#endif
    std::tuple<>{}));

}  // namespace delayq_chaos
