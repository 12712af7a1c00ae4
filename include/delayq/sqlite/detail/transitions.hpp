// The state machine of delayq::sqlite: what each call of the queue does to the rows of its file,
// inside the write transaction that a group commit runs, and the statements that do it. Part of
// <delayq/sqlite/delay_queue.hpp>.
//
// The states. A job's row (detail/schema.hpp has the layout) is waiting (lease_end IS NULL, due
// at `due`) or leased (until lease_end, under its fencing token); a dead job has left for the dead
// table. Each call of the queue is one op, one of these transitions:
//
// clang-format off
//   put          none                       -> waiting (refused while the id is queued)
//   cancel       waiting or leased          -> none
//   reschedule   waiting                    -> waiting, a new due time (refused if leased)
//   lease (take) waiting and due            -> leased, its attempt counted, a new token
//   ack          leased, this token, lease  -> none
//                not ended
//   nack         leased, this token, lease  -> waiting, due when asked; or dead, at max_attempts
//                not ended
//   extend       leased, this token, lease  -> leased, until the new end, the same token
//                not ended
//   bury         leased, this token, lease  -> dead
//                not ended
//   reclaim      leased, lease ended        -> waiting, due at the lease's end; or dead, at
//                                              max_attempts
// clang-format on
//
// and two reads of what they leave: the next event (the earliest due time of a waiting job or end
// of a lease), which tells the waiting takes how long they may sleep, and `PRAGMA data_version`,
// which tells them that another connection committed.
//
// Why a file of its own. delay_queue.hpp is the front and the glue: the calls users make, the two
// group commits that merge concurrent calls into one transaction, the wait of the takes. None of
// that decides what a transaction does to the file; this file does, and nothing else: it knows no
// threads, no group commit and no taker. So the rules of delivery (the fencing token, when a job
// dies, what a take reclaims first) are read in one place, beside the statements that carry them
// out, apart from the waiting and the merging, which change for reasons of their own. The caller
// holds the mutex of the connection around every call, and a write transaction (begin()) around the
// transitions and the read of the next event; `now` is the system clock in ms, rounded down, read
// once per transaction, so that all the ops of a group see the same time.
//
// Every statement is prepared once, when the queue opens (SQLITE_PREPARE_PERSISTENT), and reset
// after each use (statement::use), so that none holds a read snapshot between transactions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/epoch_ms.hpp"
#include "../../job.hpp"
#include "handle.hpp"
#include "schema.hpp"

namespace delayq::sqlite::detail {

// One change to the file, as the group commit runs it (delay_queue.hpp, "Durability"): every
// write of the queue goes through it, so that concurrent calls share transactions.
struct op {
    enum kind_t : unsigned char { put, cancel, reschedule, ack, nack, extend, bury, lease };
    kind_t kind;
    std::string_view id;
    std::string_view payload{};        // put
    long long due = 0;                 // put, reschedule, nack: the new due time
    long long token = 0;               // ack, nack, extend, bury: the lease's
    long long lease_ms = 0;            // extend: the new lease's length (ms, >= 0)
    std::size_t want = 0;              // lease: at most this many jobs
    std::vector<job>* jobs = nullptr;  // lease: the jobs leased
    bool ok = false;                   // the result: queued, removed, moved, settled
};

// The queue's transitions over one connection, with the statements they run. Not thread-safe:
// its owner serializes every call (delay_queue's db_m_).
class transitions {
  public:
    // What the transitions need of the queue's options.
    struct limits {
        std::chrono::milliseconds lease;  // how long a lease lasts (> 0)
        unsigned max_attempts;            // 0: redeliver forever; else dead after this many
        std::size_t reclaim_batch;        // ended leases reclaimed per take (> 0)
    };

    static constexpr long long never = std::numeric_limits<long long>::max();  // no next event

    // put's insert: prepared here, and run by put_in_transaction() on the application's
    // connection, so that both insert alike.
    static constexpr std::string_view insert_sql =
        "INSERT OR IGNORE INTO {jobs}(id, payload, due) VALUES(?1, ?2, ?3)";

    // Prepares every statement on `db`, whose tables are where `where` says.
    transitions(database& db, const layout& where, limits l) : st_(db, where), limits_(l) {}

    // BEGIN IMMEDIATE; rolled back unless committed.
    write_transaction begin() { return write_transaction(st_.begin, st_.commit, st_.rollback); }

    // In a write transaction: one op; o.ok (and for a lease *o.jobs) says what it did.
    void apply(op& o, long long now) {
        switch (o.kind) {
            case op::put: {
                statement::use u(st_.insert);
                o.ok = u->bind(o.id, o.payload, o.due).run() == 1;
                break;
            }
            case op::cancel: {
                statement::use u(st_.cancel);
                o.ok = u->bind(o.id).run() == 1;
                break;
            }
            case op::reschedule: {
                statement::use u(st_.reschedule);
                o.ok = u->bind(o.due, o.id).run() == 1;
                break;
            }
            case op::ack: {
                {
                    statement::use u(st_.ack);
                    o.ok = u->bind(o.id, o.token, now).run() == 1;
                }
                break;
            }
            case op::nack: {
                long long attempts = 0;
                {
                    statement::use u(st_.held);
                    if (!u->bind(o.id, o.token, now).step()) break;
                    attempts = u->integer(0);
                }
                o.ok = true;
                if (dies(attempts)) {
                    bury(o.id, now);
                } else {
                    statement::use u(st_.requeue_at);
                    u->bind(o.due, o.id).run();
                }
                break;
            }
            case op::extend: {
                // From the transaction's now, as a lease is granted (lease_due()).
                statement::use u(st_.extend);
                u->bind(o.id, o.token, now, std::min(now + o.lease_ms, delayq::detail::max_ms));
                o.ok = u->run() == 1;
                break;
            }
            case op::bury: {
                {
                    statement::use u(st_.held);
                    if (!u->bind(o.id, o.token, now).step()) break;
                }
                o.ok = true;
                bury(o.id, now);
                break;
            }
            case op::lease:
                lease_due(o, now);
                break;
        }
    }

    // In a write transaction, before its first lease: up to reclaim_batch ended leases, the
    // earliest ended first, go back to waiting, due at their lease's end (so before any job due
    // later, and due now: the take that reclaims them may lease them again at once), or to the
    // dead letters if that delivery was their max_attempts-th. Only takes need it: an ack or a
    // nack (an extend, a bury) refuses an ended lease by itself (lease_end > now).
    void reclaim(long long now) {
        std::vector<std::pair<std::string, long long>> ended;
        {
            statement::use u(st_.ended);
            u->bind(now, static_cast<long long>(limits_.reclaim_batch));
            while (u->step()) ended.emplace_back(u->blob(0), u->integer(1));
        }
        for (const auto& [id, attempts] : ended) {
            if (dies(attempts)) {
                bury(id, now);
            } else {
                statement::use u(st_.requeue_ended);
                u->bind(std::string_view(id)).run();
            }
        }
    }

    // In a write transaction: the next event, the earliest due time of a waiting job or end of a
    // lease (ms); never if the queue is empty.
    long long next_event() {
        long long next = never;
        statement::use u(st_.next);
        if (u->step()) {
            if (!u->is_null(0)) next = u->integer(0);
            if (!u->is_null(1)) next = std::min(next, u->integer(1));
        }
        return next;
    }

    // PRAGMA data_version: changes when another connection commits. No I/O (it reads the WAL
    // index in shared memory).
    std::optional<long long> data_version() {
        statement::use u(st_.data_version);
        if (!u->step()) return std::nullopt;
        return u->integer(0);
    }

    // Jobs queued (waiting plus leased), and jobs dead: O(n) counts of the rows.
    std::size_t count_jobs() { return count(st_.count_jobs); }
    std::size_t count_dead() { return count(st_.count_dead); }

  private:
    static constexpr long long token_scale = 1024;  // > max_take_many: see lease_due()
    static_assert(token_scale > static_cast<long long>(max_take_many));
    static_assert(delayq::detail::max_ms <=
                  std::numeric_limits<long long>::max() / token_scale - 1);

    // Every statement the queue runs, prepared once (SQLITE_PREPARE_PERSISTENT).
    struct statements {
        statements(database& db, const layout& n)
            : begin(db, "BEGIN IMMEDIATE"),
              commit(db, "COMMIT"),
              rollback(db, "ROLLBACK"),
              insert(db, n(insert_sql)),
              cancel(db, n("DELETE FROM {jobs} WHERE id = ?1")),
              reschedule(db, n("UPDATE {jobs} SET due = ?1 WHERE id = ?2 AND lease_end IS NULL")),
              ended(db,
                    n("SELECT id, attempts FROM {jobs} WHERE lease_end <= ?1 ORDER BY lease_end "
                      "LIMIT ?2")),
              requeue_ended(db, n("UPDATE {jobs} SET due = lease_end, lease_end = NULL WHERE "
                                  "id = ?1")),
              bury_copy(db,
                        n("INSERT OR REPLACE INTO {dead}(id, payload, attempts, died) SELECT id, "
                          "payload, attempts, ?2 FROM {jobs} WHERE id = ?1")),
              bury_delete(db, n("DELETE FROM {jobs} WHERE id = ?1")),
              due(db, n("SELECT id, payload, due, attempts, token FROM {jobs} WHERE lease_end IS "
                        "NULL AND due "
                        "<= ?1 ORDER BY due LIMIT ?2")),
              lease(db,
                    n("UPDATE {jobs} SET lease_end = ?1, token = ?2, attempts = attempts + 1 WHERE "
                      "id = ?3")),
              next(db, n("SELECT (SELECT min(due) FROM {jobs} WHERE lease_end IS NULL), (SELECT "
                         "min(lease_end) FROM {jobs} WHERE lease_end IS NOT NULL)")),
              ack(db, n("DELETE FROM {jobs} WHERE id = ?1 AND token = ?2 AND lease_end > ?3")),
              held(
                  db,
                  n("SELECT attempts FROM {jobs} WHERE id = ?1 AND token = ?2 AND lease_end > ?3")),
              requeue_at(db, n("UPDATE {jobs} SET due = ?1, lease_end = NULL WHERE id = ?2")),
              extend(db, n("UPDATE {jobs} SET lease_end = ?4 WHERE id = ?1 AND token = ?2 AND "
                           "lease_end > ?3")),
              count_jobs(db, n("SELECT count(*) FROM {jobs}")),
              count_dead(db, n("SELECT count(*) FROM {dead}")),
              data_version(db, "PRAGMA data_version") {}

        statement begin, commit, rollback, insert, cancel, reschedule, ended, requeue_ended,
            bury_copy, bury_delete, due, lease, next, ack, held, requeue_at, extend, count_jobs,
            count_dead, data_version;
    };

    // Whether a job whose delivery was its `attempts`-th goes to the dead letters when that
    // delivery fails (a nack, or its lease ended).
    [[nodiscard]] bool dies(long long attempts) const noexcept {
        return limits_.max_attempts > 0 && attempts >= limits_.max_attempts;
    }

    // In a write transaction: the job `id` goes to the dead letters.
    void bury(std::string_view id, long long now) {
        {
            statement::use u(st_.bury_copy);
            u->bind(id, now).run();
        }
        statement::use u(st_.bury_delete);
        u->bind(id).run();
    }

    // In a write transaction: leases up to o.want due jobs, earliest first, each with a new
    // token, into *o.jobs; the attempt is counted in the same transaction, before any user code
    // sees the job.
    //
    // The fencing token. What it must be: greater at each lease of a job than at the one before,
    // so that a holder whose lease ended is refused (ack and nack match the token exactly); the
    // jobs of one take_many have distinct ones. A job's row keeps its last token while it waits
    // again, so the new one is the greater of that + 1 and the time of the lease (ms, times 1024,
    // plus the job's place in this transaction, < max_take_many): no counter in the file, whose
    // page every lease would write.
    void lease_due(op& o, long long now) {
        std::vector<job>& out = *o.jobs;
        std::vector<long long> dues, tokens;
        {
            statement::use u(st_.due);
            u->bind(now, static_cast<long long>(o.want));
            while (u->step()) {
                job j;
                j.id = u->blob(0);
                j.payload = u->blob(1);
                dues.push_back(u->integer(2));
                j.attempts = static_cast<unsigned>(u->integer(3) + 1);
                tokens.push_back(u->integer(4));
                out.push_back(std::move(j));
            }
        }
        o.ok = !out.empty();
        if (out.empty()) return;
        // Due times stay below max_ms, and so does the lease's end (delayq/detail/epoch_ms.hpp).
        const long long lease_end = std::min(now + limits_.lease.count(), delayq::detail::max_ms);
        for (std::size_t i = 0; i < out.size(); ++i) {
            job& j = out[i];
            const long long token =
                std::max(tokens[i] + 1, now * token_scale + static_cast<long long>(i));
            j.token = static_cast<std::uint64_t>(token);
            j.deadline = delayq::detail::from_ms(dues[i]);
            j.lease_deadline = delayq::detail::from_ms(lease_end);
            statement::use u(st_.lease);
            u->bind(lease_end, token, std::string_view(j.id)).run();
        }
    }

    std::size_t count(statement& s) {
        statement::use u(s);
        return u->step() ? static_cast<std::size_t>(u->integer(0)) : 0;
    }

    statements st_;
    limits limits_;
};

}  // namespace delayq::sqlite::detail
