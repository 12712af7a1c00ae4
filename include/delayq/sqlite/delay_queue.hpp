// delayq::sqlite::delay_queue: a durable delay queue in one SQLite file, with no server. The job
// API that every job queue has (delayq::job_queue), for work that must survive a crash or a
// restart on one machine. See docs/sqlite.md.
//
// The idea. The jobs live in the file (detail/schema.hpp has the layout, detail/transitions.hpp
// what each call does to it), never wholesale in memory; the object holds one SQLite connection,
// which a mutex serializes, and what it knows about the next event: a time (system clock, ms)
// before which nothing in the file comes due or ends its lease. The reads that change nothing
// (size(), get(), dead()) use that connection under the mutex, outside the group commits below.
//
// Durability. A put that returned is in the file and fsynced (options::durable_puts). Every write
// goes through one of two group commits (the job queues' combiner, detail/job_queue/combiner.hpp),
// where the calls of concurrent threads share one transaction: puts, cancels, reschedules and
// requeue_dead (they decide whether and when a job runs) in one, whose leader commits its group
// and then fsyncs the WAL after releasing the file, so that the next group gathers meanwhile and
// shares the next fsync; the take's lease, ack, nack, extend, bury and purge_dead's batches in
// the other, which commits without waiting for the disk (synchronous=NORMAL in WAL mode) and never
// waits for an fsync: they survive a crash of the process, and a power cut may undo the last of
// them, which only means a redelivery (at-least-once), or dead letters purged again. A put group
// whose fsync fails has committed already: its calls throw, yet their jobs are in the file
// (docs/sqlite.md, "Durability").
//
// Delivery. take() leases its jobs in the file, their attempt counted and a fencing token given,
// in the transaction that hands them out: no job waits in the object's memory for a later take.
// So a cancel that returned true, through any object or process, is seen by every take that
// starts after it, and a job that kills its consumer has had its delivery counted (max_attempts
// bounds a crash loop). docs/sqlite.md, "Why no prefetch", has what keeping one would buy.
//
// Waiting without polling. take() waits in the job queues' one taker (detail/job_queue/
// taker.hpp), delay_queue's leader-follower pattern: one waiting thread, the leader, sleeps until
// the next event it knows of; the others sleep on a condition variable until the leader leaves. A
// put, nack, reschedule, extend (a shorter lease) or resume through this object that makes the
// next event earlier wakes the leader, so within a process nothing polls. Another process (or
// another object on the same file) cannot wake it: the leader looks at `PRAGMA data_version`, which
// changes when another connection commits, every options::foreign_changes while it waits, and at
// the file again when it changed. That read costs no I/O (it reads the WAL index in shared memory),
// so the default, 200 ms, costs an idle consumer five cheap checks a second; it is also the bound
// on how late a system clock stepped forward is noticed.
//
// Pausing. pause() writes a row of the file (detail/schema.hpp: 'paused' in meta), so it stops
// the takes of every object in every process, and outlives them; resume() writes it back. A
// take reads it in its own transaction, before it reclaims or leases anything, and a paused queue
// leases nothing: the transaction writes nothing, and its commit tells the taker that the next
// event is never, so the waiting takes sleep (no due job wakes them) until a resume: one through
// this object tells the taker the file's real next event in its commit, as a put does; one through
// another connection changes `PRAGMA data_version`, which the leader reads every foreign_changes
// (as for a put). The read costs a take nothing in the usual case: commit() keeps what the file
// said of the pause with the data_version it said it at, and while data_version has not changed
// (no other connection committed) the answer stands, so only a take after another connection's
// commit reads the row (one lookup by key in a one-page table, in the transaction it runs anyway).
//
// Limits (options::limits). A take of an object with limits counts the queue's leases in its own
// write transaction and leases what they leave (detail/transitions.hpp, "Limits"); every commit
// of that object tells the taker, as its next event, the later of the file's next event and the
// time a place may free: so a take that a limit holds back sleeps until then, woken sooner by
// this object's ack (whose commit says "due now" again) or, within foreign_changes, by another
// connection's commit, and never asks the file in a loop.
//
// Series (put_every, put_cron). The schedule is a column of the run's row (detail/schema.hpp), in
// the text every store reads (delayq/detail/job_queue/repeat.hpp), and the next run is a row that
// the transaction which acks the run, or moves it to the dead letters, inserts
// (detail/transitions.hpp, "Series"): a group commit's transaction, so the next run is never lost
// to a crash between the two, and the fencing token that refuses a late ack refuses its second
// next run too, through any object or process. Its due time reaches the waiting takes as a put's
// does: the commit that inserted it tells this object's taker the file's next event, and another
// connection's takes see the commit in data_version.
//
// Time. Due times and lease ends are milliseconds on std::chrono::system_clock, so that they mean
// the same after a reboot and in every process. A job is due once the system clock, rounded down
// to the ms, reaches its due time; delays are added to the clock rounded up: never early by the
// system clock. The leader sleeps on the steady clock, at most foreign_changes at a time, so a
// clock stepped forward hands out what became due within foreign_changes, and a clock stepped back
// holds jobs until it reaches their due times again.
#include "../detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
#include <utility>
#include <vector>

#include "../detail/epoch_ms.hpp"
#include "../detail/job_queue/combiner.hpp"
#include "../detail/job_queue/exception_copy.hpp"
#include "../detail/job_queue/front.hpp"
#include "../detail/job_queue/repeat.hpp"
#include "../detail/job_queue/taker.hpp"
#include "../detail/time.hpp"
#include "../job.hpp"
#include "detail/handle.hpp"
#include "detail/schema.hpp"
#include "detail/transitions.hpp"
#include "detail/wal_file.hpp"
#include "error.hpp"

namespace delayq::sqlite {

/// The options of delay_queue. Bad values make its constructor throw std::invalid_argument.
struct options {
    std::string path;  ///< the queue's file; created (with its tables) if it does not exist
    /// How long a taken job is invisible to other consumers before it is delivered again (> 0).
    std::chrono::milliseconds lease = std::chrono::seconds(30);
    /// How long a call waits for a lock that another process holds (>= 0); then busy_error.
    std::chrono::milliseconds busy_timeout = std::chrono::seconds(5);
    /// Deliveries before a job that keeps failing goes to the dead letters (its last nack, or its
    /// last lease ending, moves it); 0: redeliver forever. 25 by default, as River and Sidekiq.
    unsigned max_attempts = 25;
    /// A put that returned is fsynced (on disk); false: in the OS's cache only, lost by a power
    /// cut (not by a crash of the process), for many more puts a second.
    bool durable_puts = true;
    /// At worst how late a waiting take sees a put by another process (or another object on the
    /// same file): how often it reads `PRAGMA data_version` while it waits (> 0).
    std::chrono::milliseconds foreign_changes = std::chrono::milliseconds(200);
    std::size_t reclaim_batch = 100;  ///< ended leases reclaimed per take, > 0
    std::size_t commit_batch = 1000;  ///< puts per group commit at most (a put_many is whole), > 0
    /// The file may grow to about this many bytes (0: as far as the disk allows); beyond it,
    /// puts throw disk_full_error. In whole pages of the file (4 KiB by default).
    std::uint64_t max_size = 0;
    /// false: the file holds the queue alone, and a file with tables of its own is refused
    /// (not_a_queue_error). true: the queue may live in the application's own database, beside its
    /// tables, so that put_in_transaction() can join the application's transactions; its tables
    /// are then named delayq_jobs, delayq_dead and delayq_meta, and the file's header
    /// (application_id, user_version) is left to the application. Either way the file is switched
    /// to WAL mode.
    bool allow_other_tables = false;
    /// How long a dead letter is kept (>= 0; 0: for ever, until purge_dead() or requeue_dead()).
    /// Set, every move to the dead letters (a nack of the max_attempts-th delivery, a bury, a
    /// take that finds that delivery's lease ended) also removes, in the transaction that makes
    /// the dead letter, up to 100 of those that died more than keep_dead before, the earliest
    /// first, so that the dead table holds about what died within keep_dead, without a thread
    /// that reaps it. Each death pays one seek into the index of the dead letters by time, and
    /// the rows it removes: about one per death in a steady stream of them, 100 at most. Those
    /// that grow older than keep_dead after the last death stay until the next one, and a
    /// backlog goes 100 per death: purge_dead(keep_dead) removes them at once.
    std::chrono::milliseconds keep_dead{0};
    /// Limits on the queue's leases, kept by the file across every object and process (see
    /// delayq::job_limits): a take of this object leases nothing while max_leased jobs of the
    /// queue are leased, or while `rate` leases were made in the last `period`, and waits (never
    /// fails) until the earliest of those leases ends or the period turns; an ack, nack, bury,
    /// cancel or shorter extend through this object wakes it at once, one through another object
    /// or process within foreign_changes. Each take (and each commit of this object) then counts,
    /// in its transaction: the leases not ended, up to max_leased, through an index; the grants of
    /// the period, one row per ms in which leases were made. A rate without a period > 0, or a
    /// period without a rate, is std::invalid_argument. None by default.
    job_limits limits{};
};

/// A durable delay queue in one SQLite file; see docs/sqlite.md. Every member may be called from
/// many threads at once, and several processes may open the same file.
class delay_queue {
  public:
    using job = delayq::job;                  ///< what take() hands out
    using put_request = delayq::put_request;  ///< one job of put_many()
    using job_info = delayq::job_info;        ///< what get(), dead() and jobs() tell

    /// Opens (or creates) the queue in `o.path`. Throws std::invalid_argument for bad options, and
    /// an error of this family when the file cannot be a queue (see the classes above).
    explicit delay_queue(options o)
        : opt_(checked(std::move(o))),
          db_(opt_.path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE),
          where_(set_up(db_, opt_)),
          machine_(
              db_, where_,
              {opt_.lease, opt_.max_attempts, opt_.reclaim_batch, opt_.keep_dead, opt_.limits}),
          insert_sql_(where_(detail::transitions::insert_sql)),
          cancel_sql_(where_(detail::transitions::cancel_sql)),
          file_name_(sqlite3_db_filename(db_.get(), "main")) {
        data_version_ = machine_.data_version().value_or(0);
    }

    delay_queue(const delay_queue&) = delete;
    delay_queue& operator=(const delay_queue&) = delete;

    /// The options the queue was opened with.
    const options& get_options() const noexcept { return opt_; }

    /// Queues `id` to be due at `deadline` (rounded up to the ms). False if `id` is already queued
    /// (waiting or leased); nothing changes then. Durable when it returns (durable_puts). If it
    /// throws, it may have been applied all the same: a commit whose fsync failed throws, and its
    /// job will be delivered unless the failing disk loses it; retrying is safe (false while the
    /// job is queued). Any other error rolled the put back.
    bool put(std::string_view id, std::string_view payload,
             std::chrono::system_clock::time_point deadline) {
        front.id(id);
        op o{op::put, id};
        o.payload = payload;
        o.due = delayq::detail::to_ms(deadline);
        return run_one(o);
    }

    /// Queues `id` to be due `delay` from now. False if already queued. Durable, and if it throws
    /// applied or not, as put().
    bool put_after(std::string_view id, std::string_view payload, std::chrono::milliseconds delay) {
        front.id(id);
        op o{op::put, id};
        o.payload = payload;
        o.due = due_after(delay);
        return run_one(o);
    }

    /// put_after for many jobs, in one transaction. Element i of the result is what put_after
    /// would have returned for jobs[i]; a duplicate id within the call is refused. If it throws,
    /// all of them or none were applied (see put()).
    std::vector<bool> put_many(std::span<const put_request> jobs) {
        std::vector<op> ops;
        ops.reserve(jobs.size());
        for (const auto& r : jobs) {
            front.id(r.id);
            ops.push_back(op{op::put, r.id});
            ops.back().payload = r.payload;
            ops.back().due = due_after(r.delay);
        }
        return run_all(ops);
    }

    /// Starts a series: `id` runs every `period`, its first run due `period` from now (the clock
    /// rounded up, as put_after()). Each run is an ordinary job with the series' id and `payload`
    /// (take, ack, nack, get, ...); the ack of a run, or its move to the dead letters (the nack of
    /// its max_attempts-th delivery, a bury, its last lease ending), queues the next run in the
    /// same transaction: due a whole number of periods after the slot of the run before it (where
    /// the schedule put it, whatever a retry or a reschedule did), the first such time after
    /// that step, so a series whose consumers were away makes one catch-up run, then goes on in
    /// phase with its first run. Many objects and processes never make two next runs of one run,
    /// nor none: an ack that lost the run's lease is refused, as ever. A plain nack retries the
    /// run. cancel(id) ends the series (it removes the queued run); reschedule(id, ...) moves the
    /// waiting run only. False, and nothing changes, if `id` is queued (waiting or leased). A
    /// period <= 0 is std::invalid_argument. Durable, and if it throws applied or not, as put(). An
    /// object of an earlier delayq version on the file settles a run without queuing the next: the
    /// series ends there.
    bool put_every(std::string_view id, std::string_view payload,
                   std::chrono::milliseconds period) {
        front.id(id);
        const std::string schedule = front.every(period);
        op o{op::put, id};
        o.payload = payload;
        o.due = due_after(period);
        const std::string stored = delayq::detail::job_queue::with_slot(o.due, schedule);
        o.repeat = stored;
        return run_one(o);
    }

    /// Starts a series as put_every(), on a five-field cron expression in UTC (minute hour
    /// day-of-month month day-of-week, delayq/detail/cron.hpp): the first run is due at the first
    /// whole minute after now that matches, each next run at the first after the step that
    /// settles the run before (a missed minute is not made up). False if `id` is queued; a bad
    /// expression (or one that never matches) is std::invalid_argument saying what is wrong.
    bool put_cron(std::string_view id, std::string_view payload, std::string_view expression) {
        front.id(id);
        const std::string schedule = front.cron(expression);
        const long long now = delayq::detail::to_ms(std::chrono::system_clock::now());
        const std::optional<long long> due =
            delayq::detail::job_queue::next_run(schedule, now, now);
        if (!due) front.refuse("'" + std::string(expression) + "' never matches after now");
        op o{op::put, id};
        o.payload = payload;
        o.due = std::min(*due, max_ms);
        const std::string stored = delayq::detail::job_queue::with_slot(o.due, schedule);
        o.repeat = stored;
        return run_one(o);
    }

    /// put() inside the application's own transaction, on its own connection `conn`, which must
    /// be open on the queue's file (see options::allow_other_tables) with a transaction begun
    /// (`BEGIN`, or inside `SAVEPOINT`). The job exists exactly when that transaction commits:
    /// rolled back, there is no job. False if `id` is already queued (waiting or leased, or put
    /// earlier in the same transaction). Takers see a committed job within
    /// options::foreign_changes, as a put by another process. It is as durable as the
    /// application's commit (its connection's `synchronous`). Errors of the statement on `conn`
    /// are of this family; a std::invalid_argument for a null `conn`, one without a transaction,
    /// or one on another file. Only the thread that uses `conn` may call this with it, and while
    /// its transaction is open that thread calls no other member: they use this object's own
    /// connection, which another thread's write may hold while it waits for that transaction's
    /// lock (until busy_timeout).
    bool put_in_transaction(sqlite3* conn, std::string_view id, std::string_view payload,
                            std::chrono::system_clock::time_point deadline) {
        front.id(id);
        return insert_in(conn, id, payload, delayq::detail::to_ms(deadline));
    }

    /// put_in_transaction() of a job due `delay` from now (from this call, not from the commit).
    bool put_after_in_transaction(sqlite3* conn, std::string_view id, std::string_view payload,
                                  std::chrono::milliseconds delay) {
        front.id(id);
        return insert_in(conn, id, payload, due_after(delay));
    }

    /// Removes a waiting or leased job (the holder's ack or nack then returns false); the queued
    /// run of a series (put_every, put_cron) too, which ends the series. False if `id` is not
    /// queued. Durable when it returns (durable_puts); if it throws, it may have been
    /// applied, as put().
    bool cancel(std::string_view id) {
        front.id(id);
        op o{op::cancel, id};
        return run_one(o);
    }

    /// cancel() inside the application's own transaction, on its own connection `conn`, as
    /// put_in_transaction(): the job is gone exactly when that transaction commits; rolled back,
    /// it stays queued as it was. True if `id` was queued (waiting or leased, as the transaction
    /// sees it; a job put earlier in the same transaction too). A holder's ack or nack after the
    /// commit returns false. Its errors, and who may call it while the transaction is open, are
    /// put_in_transaction()'s.
    bool cancel_in_transaction(sqlite3* conn, std::string_view id) {
        front.id(id);
        return run_in(conn, cancel_sql_, "cancel_in_transaction",
                      [&](sqlite3_stmt* s) { return bind_id(s, id); });
    }

    /// Gives a waiting job a new due time, `delay` from now (a series' waiting run: that run only;
    /// the one after it is reckoned from the new time). False for an unknown or leased id.
    /// Durable when it returns (durable_puts); if it throws, it may have been applied, as put().
    bool reschedule(std::string_view id, std::chrono::milliseconds delay) {
        front.id(id);
        op o{op::reschedule, id};
        o.due = due_after(delay);
        return run_one(o);
    }

    /// Leases the earliest due job, waiting up to `max_wait` for one (not at all when <= 0), and
    /// returns nothing as soon as `stop` is requested (a blocked take is woken).
    std::optional<job> take(std::chrono::milliseconds max_wait, const std::stop_token& stop = {}) {
        auto jobs = taker_.take(1, max_wait, stop);
        if (jobs.empty()) return std::nullopt;
        return std::move(jobs.front());
    }

    /// Leases up to `max_jobs` (at most max_take_many) due jobs, earliest first, in one
    /// transaction, waiting up to `max_wait` for the first (or until `stop` is requested). Every
    /// job has its own token. `max_jobs` 0 returns an empty vector at once: it leases nothing and
    /// does not wait.
    std::vector<job> take_many(std::size_t max_jobs, std::chrono::milliseconds max_wait,
                               const std::stop_token& stop = {}) {
        if (max_jobs == 0) return {};
        return taker_.take(front.take_count(max_jobs), max_wait, stop);
    }

    /// Done with the job: it is gone for good; a run of a series (put_every, put_cron) queues the
    /// series' next run in the same transaction. False if the lease was lost (ended, or
    /// cancelled, or the job delivered again): then it queues nothing.
    bool ack(const job& j) {
        front.id(j.id);
        op o{op::ack, j.id};
        o.token = token_of(j);
        return run_one(o);
    }

    /// ack(j), and in the same transaction (the group commit of the acks and takes), a take that
    /// does not wait: the next due job, leased by the take's rules (pause, limits, max_attempts,
    /// series, fencing), whether or not the ack held. One commit where ack() and take() make two.
    /// `next` is empty when no job is due for a take now.
    ack_take_result ack_and_try_take(const job& j) {
        front.id(j.id);
        std::vector<job> leased;
        std::array<op, 2> ops{op{op::ack, j.id}, op{op::lease, {}}};
        ops[0].token = token_of(j);
        ops[1].want = 1;
        ops[1].jobs = &leased;
        run(ops);  // in order: the ack frees its place under a limit before the lease
        ack_take_result r;
        r.acked = ops[0].ok;
        if (!leased.empty()) r.next = std::move(leased.front());
        return r;
    }

    /// ack for many jobs, in one transaction; element i is what ack(jobs[i]) would have returned
    /// (and each run of a series acked queues its next run).
    std::vector<bool> ack_many(std::span<const job> jobs) {
        std::vector<op> ops;
        ops.reserve(jobs.size());
        for (const auto& j : jobs) {
            front.id(j.id);
            ops.push_back(op{op::ack, j.id});
            ops.back().token = token_of(j);
        }
        return run_all(ops);
    }

    /// Back to the queue, due `retry_after` from now, or to the dead letters if this was its
    /// max_attempts-th delivery (a run of a series then queues the next run, as an ack does; a
    /// retry is the same run). False if the lease was lost. The job's last error stays as it
    /// was (see the nack with a reason).
    bool nack(const job& j, std::chrono::milliseconds retry_after) {
        return nack_for(j, retry_after, std::nullopt);
    }

    /// nack(j, retry_after), and the job's last error becomes `reason` (binary-safe; cut to its
    /// first max_reason_size bytes), which get() shows, and which a dead letter keeps if this
    /// nack moves it there. Refused with the nack if the lease was lost.
    bool nack(const job& j, std::chrono::milliseconds retry_after, std::string_view reason) {
        return nack_for(j, retry_after, cut(reason));
    }

    /// The lease of `j` now ends `lease` from now (the system clock), longer or shorter; its token
    /// stays the holder's, for ack and nack. False if the lease was lost (ended, or cancelled, or
    /// the job delivered again or settled). A negative `lease` is std::invalid_argument.
    bool extend(const job& j, std::chrono::milliseconds lease) {
        front.id(j.id);
        front.not_negative(lease, "a lease");
        op o{op::extend, j.id};
        o.token = token_of(j);
        o.lease_ms = delayq::detail::clamp_delay(lease);
        // A shorter lease may make the next event earlier: commit() tells the taker, as for a
        // nack, and another connection's takes see the commit in data_version.
        return run_one(o);
    }

    /// To the dead letters at once, as a nack of its max_attempts-th delivery: for a job that
    /// would only fail again (a run of a series: the series goes on, its next run queued in the
    /// same transaction; cancel() ends it). False if the lease was lost. The dead letter keeps the
    /// job's last error as it was (see the bury with a reason).
    bool bury(const job& j) { return bury_for(j, std::nullopt); }

    /// bury(j), and the dead letter's last error is `reason` (binary-safe; cut to its first
    /// max_reason_size bytes). Refused with the bury if the lease was lost.
    bool bury(const job& j, std::string_view reason) { return bury_for(j, cut(reason)); }

    /// The job `id` as the file holds it now: queued (waiting or leased), or in the dead letters;
    /// nothing if neither. An id both queued and dead (a dead job's id put again) is the queued
    /// job. job_info::time is its due time when waiting, its lease's end when leased, when it
    /// died when dead; a job whose lease has ended reads as waiting, due at that end (the next
    /// take reclaims it). A lookup by the file's key, whatever the queue's size. A bad id is
    /// std::invalid_argument, as in every call.
    std::optional<job_info> get(std::string_view id) {
        front.id(id);
        std::lock_guard g(db_m_);
        return machine_.find(id, now_ms());
    }

    /// The dead letters in the order they died (then by id), oldest first: up to `max` (at most
    /// max_take_many) of those after the dead letter `after`, or from the first when `after` is
    /// empty. Page through them all with `after` the last id of the page before; empty at the end,
    /// when `max` is 0, and when `after` is not a dead letter. A seek into the file's index of
    /// the dead letters, and `max` steps along it: no page reads them all. A non-empty `after`
    /// that is not an id (longer than max_id_size) is std::invalid_argument.
    std::vector<job_info> dead(std::size_t max, std::string_view after = {}) {
        if (!after.empty()) front.id(after);
        if (max == 0) return {};
        std::lock_guard g(db_m_);
        return machine_.dead_page(front.take_count(max), after);
    }

    /// The jobs in `state`, as dead() pages the dead letters: up to `max` (at most max_take_many)
    /// of those after the job `after` (empty: from the first); empty at the end, when `max` is 0,
    /// and when `after` is not in that state now. Waiting jobs come in the order of their due
    /// time (a job whose lease has ended is waiting, due at that end, as get() says), leased ones
    /// in the order their leases end, both then by id; job_state::dead is dead(max, after). Each
    /// page is one read transaction: a lookup of `after` by its key, then a seek into the
    /// index of the due times and into that of the leases (the ended ones, for the waiting jobs),
    /// and at most `max` steps along each: no page reads them all. A non-empty `after` that is not
    /// an id is std::invalid_argument.
    std::vector<job_info> jobs(job_state state, std::size_t max, std::string_view after = {}) {
        if (state == job_state::dead) return dead(max, after);
        if (!after.empty()) front.id(after);
        if (max == 0) return {};
        std::lock_guard g(db_m_);
        detail::write_transaction t = machine_.begin_read();
        auto page = machine_.jobs_page(state, front.take_count(max), after, now_ms());
        t.commit();
        return page;
    }

    /// Puts the dead letter `id` back in the queue as a waiting job, due `delay` from now (the
    /// clock rounded up: never early, as put_after()), its attempts from 0, its payload and last
    /// error kept; it leaves the dead letters, in the same transaction. False, and nothing
    /// changes, if `id` is not a dead letter, or if it is queued as well (a dead job's id put
    /// again: the queued job keeps the id, and the dead letter stays). A waiting take gets it as
    /// it gets a put, through this object or another on the file. Durable when it returns
    /// (durable_puts); if it throws, it may have been applied, as put(). A negative delay is
    /// std::invalid_argument. A dead run of a series comes back as a one-off job (the dead letters
    /// keep no schedule), and only once its series has ended: while the series goes on, its next
    /// run holds the id.
    bool requeue_dead(std::string_view id, std::chrono::milliseconds delay) {
        front.id(id);
        front.not_negative(delay, "a delay");
        op o{op::requeue, id};
        o.due = due_after(delay);
        return run_one(o);
    }

    /// Removes the dead letters that died more than `older_than` before now (0: all that died
    /// before this call); how many. In transactions of at most 10 000 dead letters each, the
    /// oldest first through the index of the dead letters by time, until one finds fewer: other
    /// writers, of this process or another, wait for one of them at most, never for the whole
    /// purge. So it is not atomic: if it throws, the transactions before have removed theirs. A
    /// negative `older_than` is std::invalid_argument. See also options::keep_dead.
    std::size_t purge_dead(std::chrono::milliseconds older_than) {
        front.not_negative(older_than, "an age");
        // One bound for every transaction, so that the deaths meanwhile never keep it going.
        const long long before = detail::transitions::died_before(now_ms(), older_than);
        std::size_t removed = 0;
        for (;;) {
            op o{op::purge, {}};
            o.due = before;
            run_one(o);
            removed += o.removed;
            if (o.removed < detail::transitions::purge_batch) return removed;
        }
    }

    /// Pauses the queue, in the file: from when it returns, no take of any object on the file, in
    /// any process, leases a job (nor reclaims an ended lease) until resume(). A take then waits
    /// (up to its max_wait, or until its stop request) for the resume, which wakes it; every
    /// other call works as before, and a lease that ends still ends (an ack of it is refused; the
    /// first take after the resume hands it out again, or moves it to the dead letters). A pause
    /// of a paused queue changes nothing. Durable when it returns (durable_puts); its errors are
    /// a put's (busy_error after busy_timeout, ...), and if it throws it may have been applied,
    /// as put(): retrying is safe. Objects of an earlier delayq version on the file do not see it
    /// (docs/sqlite.md, "Pausing").
    void pause() {
        op o{op::pause, {}};
        run_one(o);
    }

    /// Ends the pause, in the file: the takes of every object on it, in every process, lease
    /// again; those waiting now are woken (through this object at once, through another within
    /// its options::foreign_changes, as by a put). A resume of a running queue changes nothing.
    /// Durable when it returns, with a put's errors, as pause().
    void resume() {
        op o{op::resume, {}};
        run_one(o);
    }

    /// Whether the queue is paused, as the file says now (one lookup by key).
    bool paused() {
        std::lock_guard g(db_m_);
        return machine_.paused();
    }

    /// The queue's figures, of one moment (one read transaction): `waiting`, the queued jobs
    /// whose lease has not begun or has ended (a job whose lease ran out is due again, since its
    /// end, until a take reclaims it); `due_now`, those of them that are due; `leased`, the
    /// leases not ended; `dead`, the dead letters; `lag`, how long the earliest due of them has
    /// been due (0 when none is). The cost: the counts of jobs and dead letters are rows of the
    /// file kept by its triggers (one lookup each); leased and the ended leases are ranges of the
    /// index of the leases (O(leased), bounded by the consumers); the lag is one seek into the
    /// index of the due times; due_now steps the due and the later part of that index side by side
    /// until one ends, so it costs twice the smaller of the two: nothing more at a million jobs
    /// than at ten thousand when nearly all are due or nearly all later, and most when half of
    /// them are due (docs/performance.md has the figures). It holds this object's
    /// connection meanwhile, not the file (a read transaction blocks no writer in WAL mode): an
    /// exporter that reads the stats of a large queue often may want an object of its own.
    queue_stats stats() {
        std::lock_guard g(db_m_);
        detail::write_transaction t = machine_.begin_read();
        const queue_stats s = machine_.stats(now_ms());
        t.commit();
        return s;
    }

    /// Jobs queued: waiting plus leased. Counts the file's rows: O(n).
    std::size_t size() {
        std::lock_guard g(db_m_);
        return machine_.count_jobs();
    }

    /// Jobs moved to the dead letters (the `dead` table: id, payload, attempts, when, last error)
    /// after max_attempts deliveries, or by bury(). Counts the file's rows: O(n); dead() reads
    /// them.
    std::size_t dead_size() {
        std::lock_guard g(db_m_);
        return machine_.count_dead();
    }

  private:
    using steady = std::chrono::steady_clock;
    using milliseconds = std::chrono::milliseconds;

    // Due times stay below max_ms (10^14 ms, year 5138), as in the Redis backend: a lease end
    // added to one never overflows (delayq/detail/epoch_ms.hpp).
    static constexpr long long max_ms = delayq::detail::max_ms;
    static constexpr long long never = detail::transitions::never;
    static constexpr delayq::detail::job_queue::front front{"delayq::sqlite::delay_queue"};

    using op = detail::op;  // one change to the file (detail/transitions.hpp)

    // One caller's ops handed to a group commit, and the error its group's commit ended with.
    struct write_call : delayq::detail::job_queue::combined_call {
        std::span<op> ops;
        std::exception_ptr error;
    };
    using group_commit = delayq::detail::job_queue::combiner<write_call>;

    // One caller's own copy of the failure of a group commit that several callers share: of the
    // same type, with a message of its own (delayq/detail/job_queue/exception_copy.hpp).
    static std::exception_ptr copy_error(const std::exception_ptr& e) noexcept {
        return delayq::detail::copy_for_caller<error, not_a_queue_error, newer_version_error,
                                               corrupt_error, disk_full_error, busy_error,
                                               read_only_error>(e, [](const auto& x) {
            return std::remove_cvref_t<decltype(x)>(std::string(x.what()), x.code());
        });
    }

    static options checked(options o) {
        const auto check = [](bool ok, const char* what) { front.option(ok, what); };
        check(!o.path.empty(), "options.path is empty");
        check(o.lease > milliseconds::zero(), "options.lease must be > 0");
        check(o.lease.count() <= max_ms, "options.lease is too long");
        check(o.busy_timeout >= milliseconds::zero(), "options.busy_timeout must be >= 0");
        check(o.busy_timeout.count() <= std::numeric_limits<int>::max(),
              "options.busy_timeout is too long");
        check(o.foreign_changes > milliseconds::zero(), "options.foreign_changes must be > 0");
        check(o.reclaim_batch > 0, "options.reclaim_batch must be > 0");
        check(o.commit_batch > 0, "options.commit_batch must be > 0");
        check(o.keep_dead >= milliseconds::zero(), "options.keep_dead must be >= 0");
        front.limits(o.limits);
        return o;
    }

    // Makes the newly opened `db` a queue with o's settings, before any statement is prepared.
    static detail::layout set_up(detail::database& db, const options& o) {
        db.set_busy_timeout(o.busy_timeout.count());
        detail::layout where = detail::open_queue(db, o.allow_other_tables);
        db.exec("PRAGMA synchronous=NORMAL");
        // The WAL is reused from its start after each checkpoint but keeps the size it grew to
        // (a put_many of a million jobs): cut it back to 64 MiB then.
        db.exec("PRAGMA journal_size_limit=67108864");
        if (o.max_size > 0) {
            const auto page =
                static_cast<std::uint64_t>(detail::query_integer(db, "PRAGMA page_size"));
            const std::uint64_t pages = std::max<std::uint64_t>(o.max_size / page, 1);
            db.exec(("PRAGMA max_page_count=" + std::to_string(pages)).c_str());
        }
        return where;
    }

    // A reason as the file keeps it: its first max_reason_size bytes.
    static std::string_view cut(std::string_view reason) noexcept {
        return reason.substr(0, max_reason_size);
    }

    bool nack_for(const job& j, milliseconds retry_after, std::optional<std::string_view> reason) {
        front.id(j.id);
        op o{op::nack, j.id};
        o.token = token_of(j);
        o.due = due_after(retry_after);
        o.reason = reason;
        return run_one(o);
    }

    bool bury_for(const job& j, std::optional<std::string_view> reason) {
        front.id(j.id);
        op o{op::bury, j.id};
        o.token = token_of(j);
        o.reason = reason;
        return run_one(o);
    }

    static long long token_of(const job& j) noexcept {
        return static_cast<long long>(std::min<std::uint64_t>(j.token, never));
    }

    // The system clock in ms, rounded down: what is due now.
    static long long now_ms() {
        using namespace std::chrono;
        return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
    }
    // Due `delay` from now: the clock rounded up, plus the delay; never early.
    static long long due_after(milliseconds delay) {
        return std::min(delayq::detail::to_ms(std::chrono::system_clock::now()) +
                            delayq::detail::clamp_delay(delay),
                        max_ms);
    }

    // put_in_transaction(): the insert of put(), run on the application's connection.
    bool insert_in(sqlite3* conn, std::string_view id, std::string_view payload, long long due) {
        return run_in(conn, insert_sql_, "put_in_transaction", [&](sqlite3_stmt* s) {
            int rc = bind_id(s, id);
            if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob64(s, 2, payload.empty() ? "" : payload.data(),
                                         payload.size(), SQLITE_STATIC);
            if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, due);
            return rc;
        });
    }

    static int bind_id(sqlite3_stmt* s, std::string_view id) {
        return sqlite3_bind_blob64(s, 1, id.data(), id.size(), SQLITE_STATIC);
    }

    // Runs `sql` (one row changed or none), its parameters bound by `bind`, on the application's
    // connection `conn` inside its open transaction, for the member `call`: whether it changed a
    // row.
    template <class Bind>
    bool run_in(sqlite3* conn, const std::string& sql, const char* call, Bind bind) {
        const auto bad = [&](const std::string& what) {
            throw std::invalid_argument(std::string("delayq::sqlite::delay_queue::") + call + ": " +
                                        what);
        };
        if (conn == nullptr) bad("the connection is null");
        if (sqlite3_get_autocommit(conn) != 0)
            bad("no transaction is open on the connection (BEGIN one first)");
        if (!same_file(conn))
            bad("the connection's main database is not the queue's file (" + file_name_ + ")");
        sqlite3_stmt* s = nullptr;
        int rc = sqlite3_prepare_v3(conn, sql.c_str(), -1, 0, &s, nullptr);
        if (rc == SQLITE_OK) rc = bind(s);
        if (rc == SQLITE_OK) rc = sqlite3_step(s);
        const bool changed = rc == SQLITE_DONE && sqlite3_changes(conn) == 1;
        if (rc != SQLITE_DONE) {
            const int sys = sqlite3_system_errno(conn);
            const std::string why = sqlite3_errmsg(conn);
            sqlite3_finalize(s);
            db_.fail(detail::classify(rc, sys),
                     std::string(call) + " failed on the application's connection (" + why + ")",
                     rc);
        }
        sqlite3_finalize(s);
        return changed;
    }

    // Whether `conn`'s main database is the queue's file. stat() opens no descriptor.
    bool same_file(sqlite3* conn) const {
        const char* name = sqlite3_db_filename(conn, "main");
        if (name == nullptr || *name == '\0') return false;
        if (file_name_ == name) return true;
        struct stat a {
        }, b{};
        return ::stat(name, &a) == 0 && ::stat(file_name_.c_str(), &b) == 0 &&
               a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    }

    bool run_one(op& o) {
        run(std::span<op>(&o, 1));
        return o.ok;
    }

    std::vector<bool> run_all(std::span<op> ops) {
        if (!ops.empty()) run(ops);
        std::vector<bool> out(ops.size());
        for (std::size_t i = 0; i < ops.size(); ++i) out[i] = ops[i].ok;
        return out;
    }

    // Runs `ops` in one transaction, shared with the ops of the calls that run at the same time;
    // returns once the puts, cancels and reschedules among them are on disk (durable_puts).
    // A failed commit fails every call of its group, each with an exception object of its own,
    // made before its caller is woken (delayq/detail/job_queue/exception_copy.hpp).
    void run(std::span<op> ops) {
        write_call c;
        c.units = ops.size();
        c.ops = ops;
        const auto k = ops.front().kind;
        const bool durable = k == op::put || k == op::cancel || k == op::reschedule ||
                             k == op::requeue || k == op::pause || k == op::resume;
        // A call has no deadline (each lock wait has busy_timeout), so a carried call never gives
        // up and its ops need no copy.
        (durable ? puts_ : writes_)
            .run(
                c, [](write_call&) noexcept {},
                [&](write_call& me, group_commit::batch& b) noexcept {
                    b.claim();
                    std::vector<write_call*> group;
                    std::exception_ptr error;
                    try {
                        group.reserve(b.size() + 1);
                        for (std::size_t i = 0; i < b.size(); ++i)
                            if (b.at(i) != nullptr) group.push_back(b.at(i));
                        group.push_back(&me);
                        commit(group);
                        if (durable && opt_.durable_puts) sync_wal();
                    } catch (...) {
                        error = std::current_exception();
                    }
                    for (std::size_t i = 0; i < b.size(); ++i)
                        if (write_call* k = b.at(i)) {
                            if (error) k->error = copy_error(error);
                            k->signal(write_call::done);
                        }
                    me.error = error;
                });
        if (c.error) std::rethrow_exception(c.error);
    }

    // An fsync of the WAL, which holds every commit so far (a checkpoint fsyncs what it copies
    // into the main file before the WAL is reused). Run by the puts' group leader, one at a time,
    // outside db_m_ but the first time (detail/wal_file.hpp): other transactions commit meanwhile.
    void sync_wal() {
        if (!wal_.ready()) {
            std::lock_guard g(db_m_);
            wal_.sync(db_);
            return;
        }
        wal_.sync(db_);
    }

    // A group commit's leader, under db_m_: one transaction for the whole group (never fsynced
    // here: see run()); then what it learned about the next event, and about the pause.
    void commit(std::span<write_call* const> group) {
        std::lock_guard g(db_m_);
        detail::write_transaction t = machine_.begin();
        const long long now = now_ms();
        // Read inside the write transaction: no other connection commits before ours, so a later
        // change of it means a commit that this transaction did not see.
        const std::optional<long long> version = machine_.data_version();
        // Whether the queue is paused, in this transaction: known already if no other connection
        // committed since this object last learned it, else read by the first lease that asks.
        std::optional<bool> paused;
        if (version && pause_seen_ && pause_seen_->version == *version)
            paused = pause_seen_->paused;
        bool reclaimed = false;
        for (write_call* c : group)
            for (op& o : c->ops) {
                if (o.kind == op::lease) {
                    if (!paused) paused = machine_.paused();
                    if (*paused) continue;  // leases nothing: no jobs, o.ok false
                    if (!reclaimed) {       // ended leases first, once per group
                        machine_.reclaim(now);
                        reclaimed = true;
                    }
                }
                machine_.apply(o, now);
                if (o.kind == op::pause || o.kind == op::resume) paused = o.kind == op::pause;
            }
        // Paused, nothing is due until a resume: the takes wait for that, not for a due time.
        long long next = paused.value_or(false) ? never : machine_.next_event();
        // Held back by a limit, nothing is due for this object's takes until a place may free:
        // they sleep until then (or a wake: this commit tells them of an ack at once), and never
        // spin on due jobs that they may not lease. Read by every commit of the object, so that
        // a put's does not say "due now" while the limit holds, nor an ack's "held" once it freed
        // a place.
        if (next != never && machine_.limited()) next = std::max(next, machine_.held_until(now));
        pause_seen_.reset();  // what this transaction knows holds once it has committed
        t.commit();
        data_version_ = version.value_or(0);
        if (version && paused) pause_seen_ = pause_seen{*version, *paused};

        // Under db_m_, so that the taker learns these in the order of the commits: the last is
        // the truth, and may move the next event later (an ack) as well as earlier (a put).
        next_ms_ = next;
        taker_.learn(0, steady_at(next));
    }

    // The steady time at which the system clock reaches `ms` (as now_ms() reads it).
    static steady::time_point steady_at(long long ms) {
        if (ms == never) return steady::time_point::max();
        return delayq::detail::saturating_add(steady::now(),
                                              milliseconds(std::max(ms - now_ms(), 0LL)));
    }

    // Whether another connection committed since this object last looked at the file, or the
    // system clock has reached the next event this object knows of (it was stepped forward: the
    // taker counts on the steady clock).
    bool foreign_changed() {
        std::lock_guard g(db_m_);
        if (next_ms_ <= now_ms()) return true;
        const std::optional<long long> v = machine_.data_version();
        if (!v || *v == data_version_) return false;
        data_version_ = *v;
        return true;
    }

    // What the taker (delayq/detail/job_queue/taker.hpp) needs of the file: one lane, no wake
    // source outside the process (commit() tells it of this object's writes), and a look at
    // PRAGMA data_version every foreign_changes for another connection's. A pause needs nothing
    // more of it: commit() says that nothing comes due (next event never), so the leader sleeps
    // until a resume's commit, or a foreign change, makes it look again.
    struct taker_store {
        delay_queue& q;

        using clock = steady;
        static constexpr bool external_wake = false;
        static constexpr bool claim_for_all = false;  // the combiner merges concurrent leases
        static constexpr bool look_on_entry = true;   // another process may have put something
        static constexpr std::size_t claim_cap = max_take_many;
        static constexpr unsigned wake_losses_per_take = 0;

        static std::size_t lanes() noexcept { return 1; }

        // The lease op of a take; its commit() has told the taker the next event already.
        delayq::detail::job_queue::claimed<clock> claim(std::size_t, std::size_t want, bool) {
            delayq::detail::job_queue::claimed<clock> out;
            op o{op::lease, {}};
            o.want = want;
            o.jobs = &out.jobs;
            q.run_one(o);
            return out;
        }

        [[nodiscard]] milliseconds recheck_every() const noexcept { return q.opt_.foreign_changes; }

        // Another connection committed, or the system clock reached the next event that this
        // object knows of (a clock stepped forward: the taker's times are steady).
        bool changed_elsewhere() { return q.foreign_changed(); }

        static std::exception_ptr copy_error(const std::exception_ptr& e) noexcept {
            return delay_queue::copy_error(e);
        }
        static bool lane_failure(const std::exception_ptr&) noexcept { return false; }
        // SQLite connections must not cross fork(): docs/sqlite.md.
        static void drop_inherited() noexcept {}
    };

    options opt_;
    // Guards db_, machine_, data_version_, pause_seen_ and next_ms_; taken before the taker's m_,
    // never after.
    std::mutex db_m_;
    detail::database db_;
    detail::layout where_;  // the names of the queue's tables
    // What each op does to the file, with the statements that do it (the state machine).
    detail::transitions machine_;
    std::string insert_sql_;      // put_in_transaction's, prepared on the application's connection
    std::string cancel_sql_;      // cancel_in_transaction's, likewise
    std::string file_name_;       // the file's full name, as SQLite gives it
    long long data_version_ = 0;  // PRAGMA data_version when this object last read the file
    // What the file said of the pause, at which PRAGMA data_version: it holds while that has not
    // changed (no other connection committed since), so commit() need not read it again.
    struct pause_seen {
        long long version;
        bool paused;
    };
    std::optional<pause_seen> pause_seen_;  // under db_m_
    detail::wal_file wal_;  // what sync_wal() fsyncs; used by one sync_wal() at a time

    // Two group commits. Puts, cancels, reschedules and requeues (they decide whether and when a
    // job runs): the leader commits, then fsyncs the WAL with the file's write lock released (so
    // takes and acks commit during the fsync) and before it hands on, so that the puts that arrive
    // meanwhile share the next fsync. The other writes (takes, acks, nacks) need no fsync, and with
    // one group commit they waited for the puts' disk too: consumers fell behind the producers
    // (docs/sqlite.md has the measurements).
    group_commit puts_{opt_.commit_batch};
    group_commit writes_{opt_.commit_batch};

    long long next_ms_ = 0;  // under db_m_: nothing in the file is due or ends before (ms)
    taker_store store_{*this};
    delayq::detail::job_queue::taker<taker_store> taker_{store_};  // the waiting takes
};

}  // namespace delayq::sqlite
