// delayq::postgres::delay_queue: the job API that every job queue has (delayq::job_queue) on a
// PostgreSQL server, and a put that joins the application's own transaction, so that a job
// exists exactly when the application's write commits. See docs/postgres.md.
//
// The idea. The jobs are rows of one table (detail/schema.hpp has the layout); every call is one
// statement (purge_dead: one per batch), one round trip, in its own transaction, and every decision
// about time is made by the server's clock inside that statement: a job is due when the server says
// so, a lease ends when the server says so. Consumers claim due rows with FOR UPDATE SKIP LOCKED,
// so many consumers in many processes never take one job twice and never wait for one another.
//
// Waiting without polling. A take that finds nothing due learns, in the same statement, when the
// next row comes due (or its lease ends), and sleeps until then on a connection of its own that
// LISTENs on the queue's channel. A put, nack, reschedule or requeue_dead is followed, in the same
// round trip, by a wake-up in a transaction of its own (detail/schema.hpp, wake_sql): it sends
// NOTIFY unless another job, due earlier, already makes the sleeping consumers wake before this
// one; the server delivers it at commit, and the sleeping take wakes and claims. The wake-up looks
// after the write committed, not within it: a job that the write's own statement saw may be gone by
// its commit, and a consumer that looked in between would sleep past the new job. An extend that
// makes a lease end earlier NOTIFYs in its own statement, at its commit: always, so there is
// nothing to look at (detail/schema.hpp, extend_sql). An idle consumer sends no query at all while
// nothing is due.
//
// The takes of one object wait together, in the shared taker (detail/job_queue/taker.hpp): one
// of them, the leader, listens; the take that claims claims for every waiting take at once (up to
// max_claim jobs), handing the jobs out in the order the takes came. The object is its store
// (delay_queue::taker_store): a claim whose answer says when to look again (the next due row or the
// end of a lease just granted; at once when more is due; after a short backoff while other
// transactions hold due rows), and the listening connection as its wake source, whose loss
// forgets what was learned. What a claim learned holds until a notification comes or that time
// does: a take that arrives meanwhile sends nothing. So a claim that finds nothing is rare, and
// takes of many threads do not race each other for the same rows. A take that does not wait
// (max_wait <= 0) claims once, for itself.
//
// Pausing. A pause is a row of a small table (detail/schema.hpp, `paused`), and the claim reads it
// in its own statement, one probe of a key: a take pays no round trip for it. A paused claim
// leases nothing and says that nothing is due, so the waiting takes sleep on the listening
// connection until a notification, not until the next due job: a paused queue with due jobs
// costs no claims. The resume NOTIFYs in its own transaction, at its commit, and the wake-ups
// of puts are not sent while the queue is paused (wake_sql), since they would wake every consumer
// to find it paused.
//
// Limits (options::limits). The server keeps them, so that they hold across every process: a
// claim of an object with limits counts the queue's leases that have not ended (a range of a
// partial index of the leases, as long as the consumers hold leases) and the grants of the last
// period (a small table, trimmed as it is read), leases no more than the places left, and records
// its grant (detail/schema.hpp, claim_sql). Two such claims must not both see the last place: a
// statement sees what committed before it began, so the claim runs after a statement of its own
// that takes the queue's advisory lock, in one transaction and one round trip
// (detail/connection.hpp, exec_together), and begins after the last limited claim committed. Only
// objects with limits pay for it; the takes of the others keep their one statement. A claim that a
// limit holds back says when a place may come free (the first end of a lease, the oldest grant
// plus the period), not that a job is due now, which would have the takes claim again and again;
// and an ack, ack_many, nack, bury or cancel that ends a lease NOTIFYs the channel in its own
// statement, at its commit, so that the takes held back in every process claim again. An extend
// frees no place, except one that ends the lease sooner, which notifies already.
// cancel_in_transaction() does not notify (a NOTIFY would keep the caller's transaction from a
// two-phase commit): its place counts as taken until the takes held back look again, at the
// lease's end at the latest.
//
// Repeatable jobs (put_every, put_cron). A run of a series is a row like any other, with its
// schedule and the time it was due beside it (detail/schema.hpp, "The layout"). The statement
// that ends a run, an ack (ack_many), a nack of its last attempt, a bury, or a claim that buries
// a last lease that ended, makes its row the next run in the same statement (and moves a copy to
// the dead letters where the run died), due when the server's function next_run says, from the
// schedule, the run's due time and the server's clock. In place, not a delete and an insert: the
// series' id never lacks a row, so a cancel that waited for the ack finds the next run and ends
// the series. The fence is the run's: racing settles of one run (two objects, two processes) make
// one next run, and no crash can leave a run settled without its next. The next run is woken as a
// put is: after the commit of an ack, ack_many or bury that made one (and only then: a job of its
// own costs no second statement), by the wake-up that follows a nack already, and by a NOTIFY
// inside a claim that made one.
//
// Figures (stats()): one statement, counts over indexes, no counter row that every put would
// update and serialize on (detail/schema.hpp, stats_sql).
//
// A put in the caller's transaction. put_in_transaction() runs one statement on the caller's own
// connection, inside the caller's BEGIN: the job is a row of that transaction, there when it
// commits and never otherwise, and its NOTIFY is delivered at that commit (a rolled-back
// transaction wakes nobody). It notifies whenever it inserted: the object cannot look after the
// caller's commit, so it cannot tell whether a consumer must be woken. Except with notify::none:
// PostgreSQL cannot PREPARE a transaction that ran NOTIFY, so a transaction of a two-phase commit
// puts without one, and wake_consumers() sends it after COMMIT PREPARED. The queue's name goes as
// bytes that the server reads as UTF-8, since a text parameter is read in the caller's
// client_encoding (the queue's own connections speak UTF-8).
//
// Connections. The object holds a small pool of connections (options::connections) that its
// calls share, and the listening one once a take has waited. A connection that breaks, or misses
// io_timeout, is dropped: the call fails with connection_error and the next call connects
// afresh. Nothing is lost by that: a put that failed may have been applied, and retrying it
// returns false while the job is queued; an ack that failed may have been applied, and a lease is
// fenced by its token, so a job is never settled twice. A connection that died while idle (a
// restart, a terminated backend) is replaced before anything is sent on it, the listening one
// too (once per take), so the caller does not see it.
//
// Time limits. Every call returns or fails within io_timeout plus one connect (a take: its
// max_wait plus that; a purge_dead: that for each of its batches), whatever the server does, and a
// call that failed leaves nothing running on the server that can change the queue afterwards. The
// call's io_timeout starts when it starts: its wait for a free pooled connection counts (budget,
// acquire()), and a connect it makes (itself within io_timeout, host by host:
// detail/connection.hpp, "Many hosts") moves its deadline once. Each statement carries the server's
// own limit (statement_timeout), which ends before the call's deadline, so a stalled server (a lock
// held by a migration) aborts the statement itself, before its commit, and says so: not a claim
// that leases a job to nobody once the lock goes, nor a put applied after it threw, nor a backend
// left waiting for every retry (detail/connection.hpp, "Fencing", says why this and not a cancel
// request).
#include "../detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <libpq-fe.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../detail/epoch_ms.hpp"
#include "../detail/job_queue/exception_copy.hpp"
#include "../detail/job_queue/front.hpp"
#include "../detail/job_queue/repeat.hpp"
#include "../detail/job_queue/taker.hpp"
#include "../detail/time.hpp"
#include "../job.hpp"
#include "detail/connection.hpp"
#include "detail/schema.hpp"
#include "error.hpp"

namespace delayq::postgres {

/// The options of delay_queue. Bad values make its constructor throw std::invalid_argument.
struct options {
    /// The server: a libpq connection string ("host=... port=... dbname=... user=...") or URI
    /// ("postgresql://..."); empty: libpq's defaults and PG* environment variables.
    std::string conninfo;
    /// The queue: 1 to 200 bytes of UTF-8 (any character but NUL), the same on every connection
    /// whatever its client_encoding; the database's encoding must hold its characters (a UTF8
    /// database holds them all).
    std::string name;
    /// The schema of the tables: 1 to 63 ASCII letters, digits and `_`, not beginning with `pg_`
    /// (PostgreSQL keeps those for itself), taken as written (quoted: `user` or `Jobs` is fine).
    std::string schema = "delayq";
    /// How long a taken job is invisible to other consumers before it is delivered again (> 0).
    std::chrono::milliseconds lease = std::chrono::seconds(30);
    /// The limit of one call (> 0): its wait for a free connection and its exchange with the
    /// server; a connect the call makes has io_timeout of its own (for all the conninfo's
    /// hosts: each gets connect_timeout if the conninfo gives one, else an equal share). The
    /// server's own limit on each statement (statement_timeout) ends a little before it.
    std::chrono::milliseconds io_timeout = std::chrono::seconds(5);
    /// Deliveries before a job that keeps failing goes to the dead letters (its last nack, or its
    /// last lease ending, moves it); 0: redeliver forever. 25 by default, as River and Sidekiq.
    unsigned max_attempts = 25;
    /// Connections the object's calls share at most (> 0); a call waits for a free one. A take
    /// that waits holds one more, which only listens.
    std::size_t connections = 4;
    /// A take's lease, an ack and a nack wait for the server's disk before they return (the
    /// default), as puts, cancels and reschedules always do: a crash of the server undoes
    /// nothing that returned. False: they commit with synchronous_commit off, on disk within the
    /// server's wal_writer_delay (200 ms by default), for less server CPU; a crash of the server
    /// (not of a consumer) may then undo the last of them: a job handed out again, even one
    /// whose ack returned true, its attempt not counted. See "Durability" in docs/postgres.md.
    bool durable_leases = true;
    /// How long a dead letter is kept (>= 0); 0: for ever, until purge_dead() removes it (the
    /// default). Set, every move to the dead letters (a nack of the last attempt, a bury, a take
    /// that finds a last lease ended) also removes, in the same statement, up to 100 of the
    /// queue's dead letters that died more than keep_dead ago, oldest first, through an index:
    /// the table stays bounded without a reaper, at the cost of that range to each death. Dead
    /// letters are removed only when others die: a queue whose jobs stopped dying keeps its last
    /// ones until purge_dead().
    std::chrono::milliseconds keep_dead{0};
    /// Limits on the queue's leases, kept by the server across every process (delayq::job_limits
    /// says what they mean; give every object of the queue the same). An object with limits
    /// claims under a lock of the queue's, so that two claims never both see the last place
    /// (transaction-level, an advisory lock: limited claims of one queue run one at a time, the
    /// takes of objects without limits do not wait for it), and its ack, ack_many, nack, bury and
    /// cancel of a lease NOTIFY the queue's channel, which wakes the takes that a limit holds back
    /// in every process. A take held back claims again when that comes, or when a lease ends or
    /// the period turns, no sooner.
    job_limits limits{};
};

/// Whether a put in the caller's transaction wakes the waiting consumers when that transaction
/// commits (see delay_queue::put_in_transaction).
enum class notify {
    at_commit,  ///< NOTIFY, delivered at the caller's commit (the default)
    /// No NOTIFY, so that the transaction may be PREPAREd (two-phase commit: PostgreSQL refuses to
    /// prepare a transaction that ran NOTIFY). The consumers learn of the job when they are woken
    /// otherwise: call delay_queue::wake_consumers() once the transaction committed.
    none
};

/// A durable delay queue on a PostgreSQL server; see docs/postgres.md. Every member may be
/// called from many threads at once, and many processes may share one queue.
class delay_queue {
  public:
    using job = delayq::job;                  ///< what take() hands out
    using put_request = delayq::put_request;  ///< one job of put_many()

    /// Connects, and creates the queue's tables on first use. Throws std::invalid_argument for
    /// bad options, and an error of this family when the server cannot hold the queue.
    explicit delay_queue(options o)
        : opt_(checked(std::move(o))),
          channel_(channel_of(opt_.schema, opt_.name)),
          lock_key_(lock_key_of(opt_.schema, opt_.name)),
          statements_(detail::statements(quoted_schema(), opt_.durable_leases,
                                         opt_.max_attempts > 0, opt_.keep_dead.count(),
                                         limit_settings_of(opt_, channel_))),
          put_in_transaction_sql_{detail::put_in_transaction_sql(quoted_schema(), true),
                                  detail::put_in_transaction_sql(quoted_schema(), false)},
          cancel_in_transaction_sql_(detail::cancel_in_transaction_sql(quoted_schema())) {
        // One connection now: the server is there, new enough, and holds the tables.
        auto c = acquire();
        release(std::move(c));
    }

    delay_queue(const delay_queue&) = delete;
    delay_queue& operator=(const delay_queue&) = delete;

    /// The options the queue was made with.
    const options& get_options() const noexcept { return opt_; }

    /// The channel the queue NOTIFYs when a job comes due before those the consumers wait for
    /// (an identifier of the form delayq_<16 hex digits>, from a hash of the schema and the name).
    const std::string& channel() const noexcept { return channel_; }

    /// Queues `id` to be due at `deadline` (the caller's clock, rounded up to the ms). False if
    /// `id` is already queued (waiting or leased); nothing changes then. Committed when it returns.
    bool put(std::string_view id, std::string_view payload,
             std::chrono::system_clock::time_point deadline) {
        front.id(id);
        return run_put(id, payload, delayq::detail::to_ms(deadline), false);
    }

    /// Queues `id` to be due `delay` from now (the server's clock). False if already queued.
    bool put_after(std::string_view id, std::string_view payload, std::chrono::milliseconds delay) {
        front.id(id);
        return run_put(id, payload, delayq::detail::clamp_delay(delay), true);
    }

    /// Queues the series `id` (see delayq::job_queue, repeatable jobs): its first run due `period`
    /// from now (the server's clock), and each next run queued by the statement that acks the run
    /// before it or moves it to the dead letters, due at the first slot of `period` after then, in
    /// phase with the first run (one catch-up run for a series that fell behind). False if `id`
    /// is queued; nothing changes then. Each run is an ordinary job of the series' id; cancel(id)
    /// ends the series. A period <= 0 is std::invalid_argument; one past delayq's end of time is
    /// that long. Committed when it returns.
    bool put_every(std::string_view id, std::string_view payload,
                   std::chrono::milliseconds period) {
        front.id(id);
        return run_put_repeat(id, payload, front.every(period), "put_every");
    }

    /// put_every() on a five-field cron expression, in UTC (delayq/detail/cron.hpp): each run due
    /// at the first minute after now (the server's clock) that the expression matches. A bad
    /// expression (or one that never matches) is std::invalid_argument, which says what is wrong.
    bool put_cron(std::string_view id, std::string_view payload, std::string_view expression) {
        front.id(id);
        return run_put_repeat(id, payload, front.cron(expression), "put_cron");
    }

    /// put() inside the caller's transaction: `conn` is the application's own connection, inside
    /// its BEGIN, with any client_encoding. The job exists exactly when that transaction commits,
    /// and the consumers are woken then; a rollback leaves no job and wakes nobody. One round trip
    /// on `conn`. False if `id` is already queued (as the transaction sees it). Throws
    /// std::invalid_argument when `conn` is not inside a transaction block; an error of this
    /// family aborts the caller's transaction, as any failed statement does.
    ///
    /// Two-phase commit: the wake-up is a NOTIFY, and PostgreSQL refuses to PREPARE TRANSACTION
    /// a transaction that ran NOTIFY (the PREPARE fails and the whole transaction, the
    /// application's own writes too, is rolled back). A transaction to be prepared puts with
    /// notify::none, and calls wake_consumers() after COMMIT PREPARED.
    bool put_in_transaction(PGconn* conn, std::string_view id, std::string_view payload,
                            std::chrono::system_clock::time_point deadline,
                            notify n = notify::at_commit) {
        front.id(id);
        return run_put_in(conn, id, payload, delayq::detail::to_ms(deadline), false, n);
    }

    /// put_after() inside the caller's transaction (see put_in_transaction): due `delay` after
    /// the statement runs, by the server's clock.
    bool put_after_in_transaction(PGconn* conn, std::string_view id, std::string_view payload,
                                  std::chrono::milliseconds delay, notify n = notify::at_commit) {
        front.id(id);
        return run_put_in(conn, id, payload, delayq::detail::clamp_delay(delay), true, n);
    }

    /// Wakes the consumers of the queue, in every process, to look for due jobs at once: after a
    /// transaction that put jobs with notify::none committed (COMMIT PREPARED). One NOTIFY, on a
    /// connection of the object's; the same as `NOTIFY <channel()>` on any connection.
    void wake_consumers() {
        conn_ptr c = acquire();
        try {
            (void)c->exec_simple("NOTIFY " + channel_, "wake_consumers");
        } catch (...) {
            release(std::move(c));
            throw;
        }
        release(std::move(c));
    }

    /// put_after for many jobs, in one statement. Element i of the result is what put_after would
    /// have returned for jobs[i]; a duplicate id within the call is refused.
    std::vector<bool> put_many(std::span<const put_request> jobs) {
        std::vector<bool> out(jobs.size());
        if (jobs.empty()) return out;
        for (const auto& r : jobs) front.id(r.id);
        detail::params p;
        p.text(opt_.name)
            .bytes_array(jobs, [](const put_request& r) { return r.id; })
            .bytes_array(jobs, [](const put_request& r) { return r.payload; })
            .int8_array(jobs,
                        [](const put_request& r) { return delayq::detail::clamp_delay(r.delay); });
        detail::params w;
        w.text(opt_.name)
            .bytes_array(jobs, [](const put_request& r) { return r.id; })
            .text(channel_);
        const auto r = run_then(st_put_many, p, w, "put_many");
        // The server inserted the first job of each id it returns (the statement keeps the first
        // of several with one id).
        std::unordered_set<std::string_view> put;
        for (int i = 0; i < r.rows(); ++i) put.insert(r.bytes_view(i, 0));
        for (std::size_t i = 0; i < jobs.size(); ++i) out[i] = put.erase(jobs[i].id) == 1;
        return out;
    }

    /// Removes a waiting or leased job (the holder's ack or nack then returns false). False if
    /// `id` is not queued. Committed when it returns.
    bool cancel(std::string_view id) {
        front.id(id);
        detail::params p;
        p.text(opt_.name).bytes(id);
        const auto r = run(st_cancel, p, "cancel");
        return (limited() ? r.integer(0, 0) : r.changed()) == 1;  // (detail/schema.hpp)
    }

    /// cancel() inside the caller's transaction: `conn` is the application's own connection,
    /// inside its BEGIN, with any client_encoding. The job is gone exactly when that transaction
    /// commits; a rollback leaves it queued, as it was. One round trip on `conn`. True if `id` was
    /// queued (waiting or leased, as the transaction sees it). Until the transaction ends, the
    /// job's row is locked: takes skip it (none hands it out, in any process), and its holder's
    /// ack, nack or extend waits for the end of the transaction (up to io_timeout; false if it
    /// committed). Throws
    /// std::invalid_argument when `conn` is not inside a transaction block; an error of this
    /// family aborts the caller's transaction, as any failed statement does.
    bool cancel_in_transaction(PGconn* conn, std::string_view id) {
        front.id(id);
        detail::params p;
        p.bytes(opt_.name).bytes(id);
        return on_callers(conn, cancel_in_transaction_sql_, p, PGRES_COMMAND_OK,
                          "cancel_in_transaction")
                   .changed() == 1;
    }

    /// Gives a waiting job a new due time, `delay` from now. False for an unknown or leased id.
    bool reschedule(std::string_view id, std::chrono::milliseconds delay) {
        front.id(id);
        detail::params p;
        p.text(opt_.name).bytes(id).int8(delayq::detail::clamp_delay(delay));
        return run_then(st_reschedule, p, wake_params(id), "reschedule").changed() == 1;
    }

    /// Leases the earliest due job, waiting up to `max_wait` for one (not at all when <= 0), and
    /// returns nothing as soon as `stop` is requested (a blocked take is woken).
    std::optional<job> take(std::chrono::milliseconds max_wait, const std::stop_token& stop = {}) {
        auto jobs = taker_.take(1, max_wait, stop);
        if (jobs.empty()) return std::nullopt;
        return std::move(jobs.front());
    }

    /// Leases up to `max_jobs` (at most max_take_many) due jobs, earliest first, in one statement,
    /// waiting up to `max_wait` for the first (or until `stop` is requested). Every job has its own
    /// token. `max_jobs` 0: none, at once.
    std::vector<job> take_many(std::size_t max_jobs, std::chrono::milliseconds max_wait,
                               const std::stop_token& stop = {}) {
        if (max_jobs == 0) return {};  // asks for nothing: leases nothing, waits for nothing
        return taker_.take(front.take_count(max_jobs), max_wait, stop);
    }

    /// Done with the job: it is gone for good. False if the lease was lost (ended, or cancelled,
    /// or the job delivered again). A run of a series (put_every, put_cron) queues the next run in
    /// the same statement; a second one, only then, wakes the consumers for it, and its failure
    /// (a connection_error) leaves the ack applied.
    bool ack(const job& j) {
        front.id(j.id);
        // A run of a series queued its next run (column 1): woken as a put's.
        const auto r = run_waking(st_ack, ack_params(j), "ack", [&](const detail::result& a) {
            return std::vector<std::string_view>(a.integer(0, 1) > 0 ? 1 : 0, j.id);
        });
        return r.integer(0, 0) == 1;
    }

    /// ack(j), and then a take that does not wait: the next due job, leased by the take's rules
    /// (pause, limits, max_attempts, series, fencing), whether or not the ack held. The ack's
    /// statement and the claim's go in one round trip (libpq's pipeline mode; two with a libpq
    /// older than 14), each in its own transaction: the claim starts after the ack committed, so
    /// the place it freed is free. With limits they go apart, as ack() and take(0ms) do: the claim
    /// must follow the queue's lock in its transaction (see "Limits" at the top of this file).
    /// A failure of either throws, and the ack may have been applied: an ack() after it says.
    /// `next` is empty when no job is due for a take now.
    ack_take_result ack_and_try_take(const job& j) {
        front.id(j.id);
        ack_take_result out;
        if (limited()) {
            out.acked = ack(j);
            auto jobs = taker_.take(1, milliseconds::zero());
            if (!jobs.empty()) out.next = std::move(jobs.front());
            return out;
        }
        // The taker learns the table's next event from the claim, as from its own claims.
        taker_.learn_from(0, [&](steady::time_point& next) {
            auto answer = store_.answer_of(ack_then_claim(j, out.acked), 1);
            next = answer.next;
            if (!answer.jobs.empty()) out.next = std::move(answer.jobs.front());
            return 0;
        });
        return out;
    }

    /// ack for many jobs, in one statement; element i is what ack(jobs[i]) would have returned.
    std::vector<bool> ack_many(std::span<const job> jobs) {
        std::vector<bool> out(jobs.size());
        if (jobs.empty()) return out;
        for (const auto& j : jobs) front.id(j.id);
        detail::params p;
        p.text(opt_.name)
            .bytes_array(jobs, [](const job& j) { return std::string_view(j.id); })
            .int8_array(jobs, [](const job& j) { return token_of(j); });
        // The rows acked (their positions), each with whether it was a run of a series, whose next
        // run it queued: those are woken as puts.
        const auto r = run_waking(st_ack_many, p, "ack_many", [&](const detail::result& a) {
            std::vector<std::string_view> ids;
            for (int i = 0; i < a.rows(); ++i)
                if (a.integer(i, 1) != 0)
                    ids.push_back(jobs[static_cast<std::size_t>(a.integer(i, 0) - 1)].id);
            return ids;
        });
        for (int i = 0; i < r.rows(); ++i)
            out[static_cast<std::size_t>(r.integer(i, 0) - 1)] = true;
        return out;
    }

    /// Back to the queue, due `retry_after` from now, or to the dead letters if this was its
    /// max_attempts-th delivery (a run of a series: its next run queued, as ack()'s). False if the
    /// lease was lost. The job keeps its last error.
    bool nack(const job& j, std::chrono::milliseconds retry_after) {
        return run_nack(j, retry_after, {}, false);
    }

    /// nack(j, retry_after), and the job's last error (get(), dead()) becomes `reason`, cut to
    /// its first max_reason_size bytes (binary-safe); a job this moves to the dead letters keeps
    /// it there. False if the lease was lost: nothing changes then.
    bool nack(const job& j, std::chrono::milliseconds retry_after, std::string_view reason) {
        return run_nack(j, retry_after, reason, true);
    }

    /// The lease of `j` now ends `lease` from now (the server's clock), longer or shorter; its
    /// token stays the holder's, for ack and nack. False if the lease was lost (ended, or
    /// cancelled, or the job delivered again or settled). A negative `lease` is
    /// std::invalid_argument.
    bool extend(const job& j, std::chrono::milliseconds lease) {
        front.id(j.id);
        front.not_negative(lease, "a lease");
        detail::params p;
        p.text(opt_.name)
            .bytes(j.id)
            .int8(token_of(j))
            .int8(delayq::detail::clamp_delay(lease))
            .text(channel_);  // a shorter lease wakes the consumers (detail/schema.hpp)
        return run(st_extend, p, "extend").integer(0, 0) == 1;
    }

    /// To the dead letters at once, as a nack of its max_attempts-th delivery: for a job that
    /// would only fail again (a run of a series: its next run queued, as ack()'s). False if the
    /// lease was lost. The job keeps its last error.
    bool bury(const job& j) { return run_bury(j, {}, false); }

    /// bury(j), and the dead letter's last error becomes `reason`, cut to its first
    /// max_reason_size bytes (binary-safe). False if the lease was lost: nothing changes then.
    bool bury(const job& j, std::string_view reason) { return run_bury(j, reason, true); }

    /// The job `id` as the queue holds it: queued (waiting or leased) or in the dead letters;
    /// nothing if neither. An id that is queued and also dead (put again after it died) is the
    /// queued job. A leased job whose lease ended (by the server's clock) is waiting, due when
    /// its lease ended: a take may hand it out again. One statement, a key lookup in each table.
    std::optional<job_info> get(std::string_view id) {
        front.id(id);
        detail::params p;
        p.text(opt_.name).bytes(id);
        const auto r = run(st_get, p, "get");
        if (r.rows() == 0) return std::nullopt;
        return info_of(r, 0);
    }

    /// The dead letters of the queue, in the order they died (then by id), oldest first: up to
    /// `max` (at most max_take_many) of those that follow the dead letter `after`, or from the
    /// first when `after` is empty; none when `after` is not a dead letter of the queue. Pages
    /// through them with the last id of one page as `after` of the next (a job that dies again
    /// meanwhile, put again after it died, moves to the end). `max` 0: none. One statement, a
    /// range of an index of the dead letters, however many there are.
    std::vector<job_info> dead(std::size_t max, std::string_view after = {}) {
        if (!after.empty()) front.id(after);
        const std::size_t n = front.take_count(max);
        if (n == 0) return {};
        detail::params p;
        p.text(opt_.name).bytes(after).int8(static_cast<long long>(n)).boolean(!after.empty());
        const auto r = run(st_dead_page, p, "dead");
        std::vector<job_info> out;
        out.reserve(static_cast<std::size_t>(r.rows()));
        for (int i = 0; i < r.rows(); ++i) out.push_back(info_of(r, i));
        return out;
    }

    /// The jobs of the queue in `state`, as dead() pages the dead letters: up to `max` (at most
    /// max_take_many) of those that follow the job `after` (empty: from the first); none when
    /// `after` is not in that state now, or for `max` 0. Waiting jobs (a leased job whose lease
    /// ended included, due when it ended, as get() says) come in the order of their due time,
    /// leased ones in the order their leases end (the server's clock), both then by id;
    /// job_state::dead is dead(max, after). One statement: a probe of the key for `after`, then
    /// one range of an index (of the jobs by time, stepping over the leases that hold, for the
    /// waiting ones; of the leases, for the leased ones), however many jobs there are.
    std::vector<job_info> jobs(job_state state, std::size_t max, std::string_view after = {}) {
        if (state == job_state::dead) return dead(max, after);
        if (!after.empty()) front.id(after);
        const std::size_t n = front.take_count(max);
        if (n == 0) return {};
        detail::params p;
        p.text(opt_.name).bytes(after).int8(static_cast<long long>(n)).boolean(!after.empty());
        const auto r =
            run(state == job_state::leased ? st_leased_page : st_waiting_page, p, "jobs");
        std::vector<job_info> out;
        out.reserve(static_cast<std::size_t>(r.rows()));
        for (int i = 0; i < r.rows(); ++i) out.push_back(info_of(r, i));
        return out;
    }

    /// Puts the dead letter `id` back in the queue, waiting, due `delay` from now (the server's
    /// clock, as put_after), its attempts from 0, its payload and last error kept; it leaves the
    /// dead letters, and waiting takes, of every object of the queue, are woken as by a put.
    /// False, changing nothing, when `id` is not a dead letter of the queue, or when it is queued
    /// too (put again after it died: the queued job keeps the id, the dead letter stays). One
    /// statement: the dead letter goes exactly when the job is inserted. A negative `delay` is
    /// std::invalid_argument.
    bool requeue_dead(std::string_view id, std::chrono::milliseconds delay) {
        front.id(id);
        front.not_negative(delay, "a delay");
        detail::params p;
        p.text(opt_.name).bytes(id).int8(delayq::detail::clamp_delay(delay));
        return run_then(st_requeue_dead, p, wake_params(id), "requeue_dead").integer(0, 0) == 1;
    }

    /// Removes the queue's dead letters that died more than `older_than` before now (the server's
    /// clock, read once at the start); returns how many. Oldest first, in statements of at most
    /// 10 000 dead letters each, each a range of an index and a transaction of its own within
    /// io_timeout, so that no statement holds the table's rows for long however many there are:
    /// the call as a whole may take longer than io_timeout, and what the statements of one that
    /// fails part way removed stays removed. Dead letters that another call holds at that moment
    /// (requeue_dead, a death that replaces one) are left. A negative `older_than` is
    /// std::invalid_argument.
    std::size_t purge_dead(std::chrono::milliseconds older_than) {
        front.not_negative(older_than, "an age");
        std::size_t removed = 0;
        long long time = delayq::detail::clamp_delay(older_than);
        bool cutoff = false;  // `time` is an age until the first batch says which cutoff it is
        for (;;) {
            detail::params p;
            p.text(opt_.name).int8(time).boolean(cutoff).int8(purge_batch);
            const auto r = run(st_purge_dead, p, "purge_dead");
            const long long n = r.integer(0, 0);
            removed += static_cast<std::size_t>(n);
            if (n < purge_batch) return removed;
            time = r.integer(0, 1);
            cutoff = true;
        }
    }

    /// Jobs queued: waiting plus leased. Counts rows: O(n).
    std::size_t size() { return count(st_size, "size"); }

    /// Jobs moved to the dead letters (the `dead` table) after max_attempts deliveries, or by
    /// bury().
    std::size_t dead_size() { return count(st_dead_size, "dead_size"); }

    /// Pauses the queue's takes, in every object of every process (the server keeps it, per
    /// queue name): from when it returns, a take leases nothing and waits, up to its max_wait or
    /// until its stop request, for a resume(). Every other call works as before; a lease that
    /// ends still ends (its job is handed out again after the resume). A take whose statement
    /// started before the pause committed may still lease. Idempotent; committed when it
    /// returns. A delayq older than pause() ignores it (docs/postgres.md, "Pausing").
    void pause() {
        detail::params p;
        p.text(opt_.name);
        (void)run(st_pause, p, "pause");
    }

    /// Ends a pause (see pause()), and wakes the takes waiting on the queue in every process, by
    /// a NOTIFY sent in the same transaction. Idempotent: on a queue that is not paused it
    /// changes nothing and wakes nobody.
    void resume() {
        detail::params p;
        p.text(opt_.name).text(channel_);
        (void)run(st_resume, p, "resume");
    }

    /// Whether the queue is paused (by any object, in any process), as the server says now.
    bool paused() {
        detail::params p;
        p.text(opt_.name);
        return run(st_paused, p, "paused").integer(0, 0) == 1;  // a boolean: one byte
    }

    /// The queue's figures at one moment, as the server sees them: one statement, so one
    /// snapshot, on the server's clock. `waiting`: the jobs neither leased nor dead, due or not (a
    /// job whose lease ended is waiting, and due since its lease ended); `due_now`: those due;
    /// `leased`: the jobs whose lease has not ended; `dead`: the dead letters; `lag`: how long the
    /// oldest due job has been due (0 when none is). The cost: a read of the queue's part of an
    /// index of the jobs (an index-only scan, which reads the table too for pages changed since
    /// the last vacuum), of the leases (as many as the consumers hold) and of the dead letters;
    /// no counter that every put would update. So it grows with the queue: about 0.2 s at a
    /// million jobs (0.05 s once a vacuum has marked the pages all-visible), a few ms at ten
    /// thousand; for a dashboard or a metrics scrape, not for every take.
    queue_stats stats() {
        detail::params p;
        p.text(opt_.name);
        const auto r = run(st_stats, p, "stats");
        const auto n = [&](int col) {
            return static_cast<std::size_t>(std::max(r.integer(0, col), 0LL));
        };
        queue_stats out;
        out.waiting = n(0);
        out.due_now = n(1);
        out.leased = n(2);
        out.dead = n(3);
        out.lag = milliseconds(std::max(r.integer(0, 4), 0LL));
        return out;
    }

  private:
    using steady = std::chrono::steady_clock;
    using milliseconds = std::chrono::milliseconds;
    using conn_ptr = std::unique_ptr<detail::connection>;

    static constexpr delayq::detail::job_queue::front front{"delayq::postgres::delay_queue"};
    static constexpr std::size_t max_claim = 1000;   // jobs per claim for all takes: one statement
    static constexpr long long purge_batch = 10000;  // dead letters per statement of purge_dead

    // The statements every connection prepares (detail/schema.hpp), by their index.
    using enum detail::statement_index;

    static options checked(options o) {
        const auto check = [](bool ok, const char* what) { front.option(ok, what); };
        check(!o.name.empty(), "options.name is empty");
        check(o.name.size() <= 200, "options.name is longer than 200 bytes");
        check(o.name.find('\0') == std::string::npos, "options.name contains a NUL byte");
        check(valid_utf8(o.name),
              "options.name is not valid UTF-8 (a queue's name is text: UTF-8, any character "
              "but NUL)");
        const auto ident = [](const std::string& s) {
            if (s.empty() || s.size() > 63) return false;
            return std::all_of(s.begin(), s.end(), [](char c) {
                return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '_';
            });
        };
        check(ident(o.schema),
              "options.schema must be 1 to 63 ASCII letters, digits and _ (taken as written)");
        check(!(o.schema.size() >= 3 && (o.schema[0] | 0x20) == 'p' &&
                (o.schema[1] | 0x20) == 'g' && o.schema[2] == '_'),
              "options.schema must not begin with pg_: PostgreSQL keeps those names for itself");
        check(o.lease > milliseconds::zero(), "options.lease must be > 0");
        check(o.lease.count() <= delayq::detail::max_ms, "options.lease is too long");
        check(o.io_timeout > milliseconds::zero(), "options.io_timeout must be > 0");
        check(o.io_timeout <= milliseconds(std::numeric_limits<int>::max()),
              "options.io_timeout is too long");
        check(o.connections > 0, "options.connections must be > 0");
        check(o.keep_dead >= milliseconds::zero(), "options.keep_dead must be >= 0");
        check(o.keep_dead.count() <= delayq::detail::max_ms, "options.keep_dead is too long");
        check(o.conninfo.find('\0') == std::string::npos, "options.conninfo contains a NUL byte");
        front.limits(o.limits);
        check(o.limits.max_leased <= max_limit, "options.limits.max_leased is too large");
        check(o.limits.rate <= max_limit, "options.limits.rate is too large");
        check(o.limits.period.count() <= delayq::detail::max_ms,
              "options.limits.period is too long");
        return o;
    }

    // Whether `s` is UTF-8 as PostgreSQL reads it: no overlong forms, no UTF-16 surrogates,
    // nothing past U+10FFFF.
    static bool valid_utf8(std::string_view s) noexcept {
        for (std::size_t i = 0; i < s.size();) {
            const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
            const unsigned char c = b(0);
            std::size_t n;
            unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
            if (c < 0x80) {
                ++i;
                continue;
            } else if (c >= 0xc2 && c <= 0xdf) {
                n = 2;
            } else if (c >= 0xe0 && c <= 0xef) {
                n = 3;
                if (c == 0xe0) lo = 0xa0;  // overlong
                if (c == 0xed) hi = 0x9f;  // surrogates
            } else if (c >= 0xf0 && c <= 0xf4) {
                n = 4;
                if (c == 0xf0) lo = 0x90;  // overlong
                if (c == 0xf4) hi = 0x8f;  // past U+10FFFF
            } else {
                return false;
            }
            if (s.size() - i < n || b(1) < lo || b(1) > hi) return false;
            for (std::size_t k = 2; k < n; ++k)
                if (b(k) < 0x80 || b(k) > 0xbf) return false;
            i += n;
        }
        return true;
    }

    // The largest max_leased or rate: beyond it, a limit means nothing (and would overflow the
    // server's bigint arithmetic).
    static constexpr std::size_t max_limit = std::size_t(1) << 40;

    // Whether the object has limits: its claims take the queue's lock, its settles NOTIFY.
    bool limited() const noexcept { return opt_.limits.max_leased > 0 || opt_.limits.rate > 0; }

    // The limits as the statements are built for them (detail/schema.hpp, limit_settings).
    static detail::limit_settings limit_settings_of(const options& o, const std::string& channel) {
        detail::limit_settings l;
        l.max_leased = static_cast<long long>(o.limits.max_leased);
        l.rate = static_cast<long long>(o.limits.rate);
        l.period = o.limits.period.count();
        l.channel = channel;
        return l;
    }

    // The schema as an identifier in the statements: quoted.
    std::string quoted_schema() const { return detail::quote_ident(opt_.schema); }

    static long long token_of(const job& j) noexcept {
        return static_cast<long long>(
            std::min<std::uint64_t>(j.token, std::numeric_limits<long long>::max()));
    }

    // The queue's NOTIFY channel: a short name (an identifier is at most 63 bytes) from a hash of
    // the schema and the queue. Two queues that hash alike only wake each other's consumers.
    static std::string channel_of(const std::string& schema, const std::string& name) {
        const std::uint64_t h = hash_of(schema, name);
        static const char hex[] = "0123456789abcdef";
        std::string out = "delayq_";
        for (int i = 60; i >= 0; i -= 4) out += hex[(h >> i) & 0xf];
        return out;
    }

    // FNV-1a, 64 bits, of the schema and the queue's name: the queue's channel and lock key.
    static std::uint64_t hash_of(const std::string& schema, const std::string& name) {
        std::uint64_t h = 1469598103934665603ULL;
        const auto mix = [&h](std::string_view s) {
            for (const unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
        };
        mix(schema);
        mix(std::string_view("\0", 1));
        mix(name);
        return h;
    }

    // The key of the advisory lock that serializes the limited claims of the queue
    // (detail/schema.hpp, limit_lock_sql): the channel's hash, shifted to fit a bigint. A key that
    // another queue (or the application's own advisory locks) happens to share costs only waits:
    // its claims, or its lock, and these take turns.
    static long long lock_key_of(const std::string& schema, const std::string& name) {
        return static_cast<long long>(hash_of(schema, name) >> 1);
    }

    // The time one call has (see "Time limits" at the top of this file): io_timeout from its
    // start for its exchanges with the server, its wait for a pooled connection included, plus
    // the time of the first connect it makes (itself at most io_timeout). A second connect in the
    // same call has only what is left.
    struct budget {
        steady::time_point deadline;
        bool connected = false;  // a connect's time was added
    };
    budget call_budget() const {
        return {delayq::detail::saturating_add(steady::now(), opt_.io_timeout)};
    }

    // A connection of the pool, connected, checked and prepared if it is new; its exchanges end
    // by the budget's deadline. The wait for a free one counts against the budget.
    conn_ptr acquire() {
        budget b = call_budget();
        return acquire(b);
    }
    conn_ptr acquire(budget& b) {
        {
            std::unique_lock lk(pool_m_);
            if (!pool_cv_.wait_until(lk, b.deadline,
                                     [&] { return !idle_.empty() || open_ < opt_.connections; }))
                detail::raise(detail::problem::connection,
                              "waiting for a connection: all " + std::to_string(opt_.connections) +
                                  " of the object's connections stayed busy for io_timeout (" +
                                  std::to_string(opt_.io_timeout.count()) + " ms)",
                              "");
            while (!idle_.empty()) {
                conn_ptr c = std::move(idle_.back());
                idle_.pop_back();
                if (c->alive()) {
                    c->set_deadline(b.deadline);
                    return c;
                }
                --open_;  // closed while idle (a restart): connect afresh instead of failing
            }
            ++open_;
        }
        try {
            auto c = connect(true, b);
            c->set_deadline(b.deadline);
            return c;
        } catch (...) {
            std::lock_guard lk(pool_m_);
            --open_;
            pool_cv_.notify_one();
            throw;
        }
    }

    // Back to the pool, or dropped if it broke.
    void release(conn_ptr c) {
        std::lock_guard lk(pool_m_);
        if (c && !c->broken())
            idle_.push_back(std::move(c));
        else
            --open_;
        pool_cv_.notify_one();
    }

    // A new connection, within io_timeout (or what is left of `b` if the call connected
    // already); the call's deadline moves by the time it took.
    conn_ptr connect(bool prepare) {
        budget b = call_budget();
        return connect(prepare, b);
    }
    conn_ptr connect(bool prepare, budget& b) {
        const auto start = steady::now();
        auto c = std::make_unique<detail::connection>(
            opt_.conninfo, opt_.io_timeout,
            b.connected ? b.deadline : delayq::detail::saturating_add(start, opt_.io_timeout),
            &last_host_);
        struct extend {  // however the connect ends: the call has had its connect
            budget& b;
            steady::time_point start;
            ~extend() {
                if (!b.connected) b.deadline += steady::now() - start;
                b.connected = true;
            }
        } e{b, start};
        detail::check_server_version(c->server_version());
        if (!prepare) return c;
        {
            std::lock_guard lk(schema_m_);
            if (!schema_checked_) {
                detail::ensure_schema(*c, opt_.schema);
                schema_checked_ = true;
            }
        }
        const long long pid = detail::set_up_session(*c);
        if (pid != PQbackendPID(c->get())) {
            // Something between speaks for the server: a pooler. Once per object, the probe for
            // one that does not keep a session per connection (detail/schema.hpp).
            std::lock_guard lk(schema_m_);
            if (!pooler_checked_) {
                detail::check_own_session(*connect(false), pid);
                pooler_checked_ = true;
            }
        }
        for (const auto& st : statements_) c->prepare(st.name, st.sql, st.types);
        return c;
    }

    // Runs `f` with a pooled connection, which goes back to the pool (or is dropped, if it broke)
    // however `f` ends.
    template <class F>
    auto with_connection(F f, budget& b) {
        conn_ptr c = acquire(b);
        struct give_back {
            delay_queue& q;
            conn_ptr& c;
            ~give_back() { q.release(std::move(c)); }
        } g{*this, c};
        return f(*c);
    }

    // Runs statement `st` on a pooled connection.
    detail::result run(int st, const detail::params& p, const char* doing) {
        budget b = call_budget();
        return run(st, p, doing, b);
    }
    detail::result run(int st, const detail::params& p, const char* doing, budget& b) {
        return with_connection(
            [&](detail::connection& c) { return c.exec(statements_[st].name, p, doing); }, b);
    }

    // Runs statement `st`, then the wake-up with `wake` in a transaction of its own, in one
    // round trip on a pooled connection; returns `st`'s result.
    detail::result run_then(int st, const detail::params& p, const detail::params& wake,
                            const char* doing) {
        budget b = call_budget();
        return with_connection(
            [&](detail::connection& c) {
                return c.exec_then(statements_[st].name, p, statements_[st_wake].name, wake, doing)
                    .first;
            },
            b);
    }

    // Runs statement `st` on a pooled connection and then, on the same one, the wake-up (wake_sql)
    // for the ids that `woken(its result)` names, if any: after a step that may queue the next run
    // of a series (ack, ack_many, bury), which is woken as a put is, after the commit, and which
    // most such steps (no series) do not queue: they pay no second statement, where run_then
    // would. With limits there is none: the step's own NOTIFY woke the consumers (ack_sql).
    template <class F>
    detail::result run_waking(int st, const detail::params& p, const char* doing, F woken) {
        budget b = call_budget();
        return with_connection(
            [&](detail::connection& c) {
                detail::result r = c.exec(statements_[st].name, p, doing);
                if (limited()) return r;
                const std::vector<std::string_view> ids = woken(r);
                // (detail::st_wake, not st_wake: g++ 12 fails on a using-enum name in a template)
                if (!ids.empty())
                    (void)c.exec(statements_[detail::st_wake].name, wake_params(ids), doing);
                return r;
            },
            b);
    }

    bool run_put_repeat(std::string_view id, std::string_view payload, const std::string& text,
                        const char* doing) {
        detail::params p;
        p.text(opt_.name).bytes(id).bytes(payload).text(text);
        return run_then(st_put_repeat, p, wake_params(id), doing).changed() == 1;
    }

    // The ack statement's parameters, for `j`.
    detail::params ack_params(const job& j) const {
        detail::params p;
        p.text(opt_.name).bytes(j.id).int8(token_of(j));
        return p;
    }

    // The wake-up's parameters for one job, or for the jobs `ids`.
    detail::params wake_params(std::string_view id) const {
        const std::array<std::string_view, 1> ids{id};
        return wake_params(ids);
    }
    detail::params wake_params(std::span<const std::string_view> ids) const {
        detail::params w;
        w.text(opt_.name).bytes_array(ids, [](std::string_view v) { return v; }).text(channel_);
        return w;
    }

    bool run_put(std::string_view id, std::string_view payload, long long at, bool delay) {
        detail::params p;
        p.text(opt_.name).bytes(id).bytes(payload).int8(at).boolean(delay);
        return run_then(st_put, p, wake_params(id), "put").changed() == 1;
    }

    bool run_put_in(PGconn* conn, std::string_view id, std::string_view payload, long long at,
                    bool delay, notify n) {
        // The name as bytes, read as UTF-8 by the server: a text parameter would be read in the
        // caller's client_encoding, and a name that is not ASCII would name another queue.
        detail::params p;
        p.bytes(opt_.name).bytes(id).bytes(payload).int8(at).boolean(delay);
        const bool notifies = n != notify::none;
        if (notifies) p.text(channel_);
        return on_callers(conn, put_in_transaction_sql_[notifies ? 0 : 1], p, PGRES_TUPLES_OK,
                          "put_in_transaction")
                   .integer(0, 0) == 1;
    }

    // Runs `sql` on the caller's connection `conn`, which must be inside a transaction block
    // that has not failed, for the member `call`: its result (of status `want`), or an error of
    // this family (the caller's transaction is then aborted, as by any failed statement).
    detail::result on_callers(PGconn* conn, const std::string& sql, const detail::params& p,
                              ExecStatusType want, const std::string& call) {
        if (conn == nullptr)
            throw std::invalid_argument("delayq::postgres::delay_queue: the connection is null");
        switch (PQtransactionStatus(conn)) {
            case PQTRANS_INTRANS:
                break;
            case PQTRANS_IDLE:
                throw std::invalid_argument("delayq::postgres::delay_queue: " + call +
                                            " needs a connection inside a transaction block "
                                            "(BEGIN first)");
            case PQTRANS_INERROR:
                detail::raise(detail::problem::other,
                              call + ": the caller's transaction has failed already (ROLLBACK it)",
                              "25P02");
            case PQTRANS_ACTIVE:
                throw std::invalid_argument("delayq::postgres::delay_queue: " + call +
                                            ": the connection is busy with another command");
            default:
                detail::raise(detail::problem::connection, call + ": the connection is broken", "");
        }
        const auto v = p.pointers();
        // The caller's connection, as the caller set it up (blocking or not, its own timeouts):
        // one unnamed statement, parsed, bound and run in one round trip.
        PGresult* r = PQexecParams(conn, sql.c_str(), p.count(), p.types(), v.values.data(),
                                   v.lengths.data(), v.formats.data(), 1);
        if (r == nullptr || PQresultStatus(r) != want) {
            const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
            const std::string sqlstate = state ? state : "";
            std::string m = r ? PQresultErrorMessage(r) : PQerrorMessage(conn);
            PQclear(r);
            while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
            const auto problem = PQstatus(conn) != CONNECTION_OK ? detail::problem::connection
                                                                 : detail::classify(sqlstate);
            detail::raise(problem, call + ": " + m, sqlstate);
        }
        return detail::result(r);
    }

    bool run_nack(const job& j, milliseconds retry_after, std::string_view reason, bool given) {
        front.id(j.id);
        detail::params p;
        p.text(opt_.name)
            .bytes(j.id)
            .int8(token_of(j))
            .int8(delayq::detail::clamp_delay(retry_after))
            .int8(opt_.max_attempts)
            .bytes(reason.substr(0, max_reason_size))
            .boolean(given);
        // With limits, the nack NOTIFYs in its own statement (a place came free): no wake-up.
        if (limited()) return run(st_nack, p, "nack").integer(0, 0) == 1;
        return run_then(st_nack, p, wake_params(j.id), "nack").integer(0, 0) == 1;
    }

    bool run_bury(const job& j, std::string_view reason, bool given) {
        front.id(j.id);
        detail::params p;
        p.text(opt_.name)
            .bytes(j.id)
            .int8(token_of(j))
            .bytes(reason.substr(0, max_reason_size))
            .boolean(given);
        // A run of a series queued its next run (column 1): woken as a put's.
        return run_waking(st_bury, p, "bury", [&](const detail::result& a) {
                   return std::vector<std::string_view>(a.integer(0, 1) > 0 ? 1 : 0, j.id);
               }).integer(0, 0) == 1;
    }

    // Row `i` of get's or dead's answer (detail/schema.hpp, info_columns_sql).
    static job_info info_of(const detail::result& r, int i) {
        static constexpr job_state states[] = {job_state::waiting, job_state::leased,
                                               job_state::dead};
        job_info out;
        out.id = r.bytes(i, 0);
        out.state = states[std::clamp(r.integer(i, 1), 0LL, 2LL)];
        out.time = delayq::detail::from_ms(r.integer(i, 2));
        out.attempts = static_cast<unsigned>(r.integer(i, 3));
        out.payload = r.bytes(i, 4);
        if (!r.is_null(i, 5)) out.last_error = r.bytes(i, 5);
        return out;
    }

    std::size_t count(int st, const char* doing) {
        detail::params p;
        p.text(opt_.name);
        return static_cast<std::size_t>(run(st, p, doing).integer(0, 0));
    }

    // What one claim statement found.
    struct claimed {
        std::vector<job> jobs;
        std::optional<long long> next;  // the next `at` among the rows not claimed
        long long buried = 0;           // jobs moved to the dead letters
        long long now = 0;              // the server's clock
        steady::time_point seen;        // when the answer came
    };

    // The claim statement's parameters, for `want` jobs.
    detail::params claim_params(std::size_t want) const {
        detail::params p;
        p.text(opt_.name)
            .int8(static_cast<long long>(want))
            .int8(opt_.lease.count())
            .int8(opt_.max_attempts)
            .text(channel_);  // for a run of a series it buries (detail/schema.hpp, claim_sql)
        return p;
    }

    claimed claim(std::size_t want, budget& b) {
        const detail::params p = claim_params(want);
        // With limits: the queue's lock, then the claim, in one transaction and one round trip.
        detail::params lock;
        lock.int8(lock_key_);
        const auto r = limited()
                           ? with_connection(
                                 [&](detail::connection& c) {
                                     return c.exec_together(statements_[st_limit_lock].name, lock,
                                                            statements_[st_claim].name, p, "take");
                                 },
                                 b)
                           : run(st_claim, p, "take", b);
        return read_claim(r);
    }

    // What the claim statement's result `r` says.
    static claimed read_claim(const detail::result& r) {
        claimed out;
        out.seen = steady::now();
        for (int i = 0; i < r.rows(); ++i) {
            if (r.is_null(i, 0)) {  // the trailer
                if (!r.is_null(i, 2)) out.next = r.integer(i, 2);
                out.buried = r.integer(i, 3);
                out.now = r.integer(i, 5);
                continue;
            }
            job j;
            j.id = r.bytes(i, 0);
            j.payload = r.bytes(i, 1);
            j.deadline = delayq::detail::from_ms(r.integer(i, 2));
            j.attempts = static_cast<unsigned>(r.integer(i, 3));
            j.token = static_cast<std::uint64_t>(r.integer(i, 4));
            j.lease_deadline = delayq::detail::from_ms(r.integer(i, 5));
            out.jobs.push_back(std::move(j));
        }
        return out;
    }

    // ack_and_try_take's round trip (without limits): the ack's statement, then the claim of one
    // job, pipelined on a pooled connection; whether the ack held (`acked`), and what the claim
    // found.
    claimed ack_then_claim(const job& j, bool& acked) {
        const detail::params a = ack_params(j);
        const detail::params c = claim_params(1);
        budget b = call_budget();
        return with_connection(
            [&](detail::connection& conn) {
                auto both =
                    conn.exec_then(statements_[detail::st_ack].name, a,
                                   statements_[detail::st_claim].name, c, "ack_and_try_take");
                acked = both.first.integer(0, 0) == 1;
                // A run of a series queued its next run: woken as a put's (as ack()).
                if (both.first.integer(0, 1) > 0)
                    (void)conn.exec(statements_[detail::st_wake].name, wake_params(j.id),
                                    "ack_and_try_take");
                return read_claim(both.second);
            },
            b);
    }

    // The queue as the shared taker's store (detail/job_queue/taker.hpp; see the top of this
    // file): one lane, the table; a claim for every waiting take at once; LISTEN as the wake
    // source.
    struct taker_store {
        using clock = steady;
        using time_point = steady::time_point;
        using answer = delayq::detail::job_queue::claimed<steady>;
        using news = delayq::detail::job_queue::news<steady>;

        static constexpr bool external_wake = true;  // NOTIFY on channel_
        // One statement per round trip and nothing that merges concurrent claims below: the take
        // that claims claims for all.
        static constexpr bool claim_for_all = true;
        // Every put, nack, reschedule and requeue_dead NOTIFYs when it makes a job due earlier than
        // the object knows (wake_sql), and so does an extend that makes a lease end earlier, so
        // what a claim learned holds while the listener lives: a take that comes meanwhile sends
        // nothing.
        static constexpr bool look_on_entry = false;
        static constexpr std::size_t claim_cap = max_claim;
        // The listening connection may die once in a take (a restart, a terminated backend) and
        // is replaced without the caller knowing; a second time, the caller hears of it.
        static constexpr unsigned wake_losses_per_take = 1;

        explicit taker_store(delay_queue& owner) : q(owner) {}

        std::size_t lanes() const noexcept { return 1; }
        // No recheck: a notification is never missed while the listener lives, and its loss
        // forgets what was learned.
        steady::duration recheck_every() const noexcept { return steady::duration::max(); }
        bool changed_elsewhere() noexcept { return false; }

        // One claim statement, with a budget of its own, for `n` jobs; its trailer says when to
        // look again.
        answer claim(std::size_t /*lane*/, std::size_t n, bool /*patient*/) {
            budget b = q.call_budget();
            return answer_of(q.claim(n, b), n);
        }

        // What a claim for `n` jobs that found `c` tells the taker (also ack_and_try_take's).
        answer answer_of(claimed c, std::size_t n) {
            // The leases just granted end: the earliest event the trailer leaves out (with limits,
            // it counts them already, and may say later: detail/schema.hpp, claim_sql).
            if (!c.jobs.empty() && !q.limited())
                c.next = std::min(c.next.value_or(delayq::detail::max_ms),
                                  std::min(c.now + q.opt_.lease.count(), delayq::detail::max_ms));
            answer out;
            if (c.buried > 0 || (c.next && *c.next <= c.now && c.jobs.size() == n)) {
                out.next = c.seen;  // dead-lettered what was due, or more is due than was asked for
            } else if (!c.next) {
                out.next = time_point::max();  // nothing queued: only a notification wakes
                reset_backoff();
            } else if (*c.next <= c.now) {
                // Due rows that other transactions hold (being claimed, acked): look again
                // shortly, backing off, until they settle.
                out.next = c.seen + next_backoff();
            } else {
                out.next = delayq::detail::saturating_add(c.seen, milliseconds(*c.next - c.now));
                reset_backoff();
            }
            out.jobs = std::move(c.jobs);
            return out;
        }

        // The leader's (I1 in taker.hpp: never two at once): a new listening connection, with a
        // budget of its own.
        void open_wake() {
            listener.reset();
            budget b = q.call_budget();
            auto c = q.connect(false, b);
            c->exec_simple("LISTEN " + q.channel_, "take (LISTEN)");
            listener = std::move(c);
        }

        // The leader's: waits for a notification until `until`, or until the taker pokes. A
        // listener that died (while idle, or now) is a loss: dropped, and, if the taker may lose
        // it, false (it listens anew and forgets); else the caller's error.
        bool wait_wake(time_point until, int poke, std::vector<news>& heard, bool may_lose) {
            try {
                if (!listener || !listener->alive(true))
                    detail::raise(detail::problem::connection,
                                  "take: the listening connection died (for the second time in "
                                  "this take)",
                                  "");
                if (listener->wait_notification(until, poke))
                    heard.push_back({0, time_point::min()});
                return true;
            } catch (const connection_error&) {
                listener.reset();
                if (may_lose) return false;
                throw;
            }
        }

        // One waiting take's own copy of the failure of a claim made for several: of the same
        // type, with a message of its own (delayq/detail/job_queue/exception_copy.hpp).
        static std::exception_ptr copy_error(const std::exception_ptr& e) noexcept {
            return delayq::detail::copy_for_caller<error, connection_error, schema_version_error,
                                                   permission_error, server_version_error>(
                e, [](const auto& x) {
                    return std::remove_cvref_t<decltype(x)>(std::string(x.what()), x.sqlstate());
                });
        }
        static bool lane_failure(const std::exception_ptr&) noexcept { return false; }  // one lane

        // A child after fork() (unsupported for this queue: the pool's connections are the
        // parent's too). The listener is the parent's: PQfinish would send Terminate on the
        // parent's socket, and libpq frees a connection only that way, so it is leaked, not
        // closed.
        void drop_inherited() noexcept { (void)listener.release(); }

      private:
        delay_queue& q;
        conn_ptr listener;  // LISTENs on channel_; the leader's alone (open_wake, wait_wake)

        // The wait for due rows that others hold: 1 ms, doubling up to 250 ms while they stay
        // held. Claims run at once (a take that does not wait beside the takes' claim): its own
        // lock.
        milliseconds next_backoff() {
            std::lock_guard lk(backoff_m_);
            const milliseconds b = backoff_;
            backoff_ = std::min(backoff_ * 2, milliseconds(250));
            return b;
        }
        void reset_backoff() {
            std::lock_guard lk(backoff_m_);
            backoff_ = milliseconds(1);
        }

        std::mutex backoff_m_;
        milliseconds backoff_{1};
    };

    options opt_;
    std::string channel_;
    long long lock_key_;                                  // of the limited claims (lock_key_of)
    std::vector<detail::prepared_statement> statements_;  // by statement_index
    std::string put_in_transaction_sql_[2];               // notifying, not notifying
    std::string cancel_in_transaction_sql_;

    std::mutex pool_m_;
    std::condition_variable pool_cv_;
    std::vector<conn_ptr> idle_;  // connected and prepared, free
    std::size_t open_ = 0;        // connections that exist, idle or in use

    std::atomic<std::size_t> last_host_{0};  // of the conninfo's hosts, the one that answered last

    std::mutex schema_m_;
    bool schema_checked_ = false;
    bool pooler_checked_ = false;  // the probe for a pooler ran (or was not needed)

    // The waiting takes (see the top of this file): the store the taker waits on, then the taker.
    taker_store store_{*this};
    delayq::detail::job_queue::taker<taker_store> taker_{store_};
};

}  // namespace delayq::postgres
