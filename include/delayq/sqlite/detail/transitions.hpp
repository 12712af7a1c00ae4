// The state machine of delayq::sqlite: what each call of the queue does to the rows of its file,
// inside the write transaction that a group commit runs, and the statements that do it. Part of
// <delayq/sqlite/delay_queue.hpp>.
//
// The states. A job's row (detail/schema.hpp has the layout) is waiting (lease_end IS NULL, due
// at `due`) or leased (until lease_end, under its fencing token); a dead job has left for the dead
// table. Each call of the queue is one op, one of these transitions:
//
// clang-format off
//   put          none                       -> waiting (refused while the id is queued); with a
//                                              schedule (put_every, put_cron): a series' run
//   cancel       waiting or leased          -> none
//   reschedule   waiting                    -> waiting, a new due time (refused if leased)
//   lease (take) waiting and due            -> leased, its attempt counted, a new token
//   ack          leased, this token, lease  -> none; a run of a series: its next run, waiting
//                not ended                     (see "Series")
//   nack         leased, this token, lease  -> waiting, due when asked; or dead, at max_attempts
//                not ended                     (and a series' next run); its reason, if it gives
//                                              one, the last error
//   extend       leased, this token, lease  -> leased, until the new end, the same token
//                not ended
//   bury         leased, this token, lease  -> dead (and a series' next run); its reason, if it
//                not ended                     gives one, the last error
//   reclaim      leased, lease ended        -> waiting, due at the lease's end; or dead, at
//                                              max_attempts, the last error lease_ended_reason
//                                              (and a series' next run)
//   requeue      dead, and the id not       -> waiting, due when asked, attempts 0, its payload
//                queued                        and last error kept (refused if queued)
//   purge        dead, died before a time   -> none, at most purge_batch per transaction
//   pause        the queue, running or      -> paused: every lease (and its reclaim) finds
//                paused                        nothing; every other transition goes on
//   resume       the queue, paused or       -> running
//                running
// clang-format on
//
// and the reads of what they leave: the next event (the earliest due time of a waiting job or end
// of a lease), which tells the waiting takes how long they may sleep; `PRAGMA data_version`,
// which tells them that another connection committed; and, for the application, one job by its
// id (find()), a page of the dead letters (dead_page()) and one of the waiting or the leased jobs
// (jobs_page()).
//
// The pause. Whether the queue is paused is the 'paused' row of {meta} (1: paused; 0, or no row:
// running), so that it is the file's, seen by every connection in every process, and outlives
// them. pause and resume write it; paused() reads it. The rule that a paused queue leases nothing
// is the caller's to apply, before its first lease and reclaim of a transaction (delay_queue's
// commit(), which may know the answer already and skip the read): a take that finds the queue
// paused writes nothing, so its empty transaction wakes no other connection.
//
// Keeping the dead letters bounded (limits::keep_dead). Every move to the dead letters also
// removes up to keep_dead_batch of those that died more than keep_dead before, the earliest
// first, in the same transaction: one seek into {dead}_died when none is that old, and about one
// row for each death in a steady stream of them, so the dead table stays bounded by what dies
// within keep_dead, with no thread that reaps it. The bound per death keeps a move cheap when
// keep_dead is first set on a file of many old dead letters: they go keep_dead_batch at a time,
// or at once with purge_dead.
//
// Series (put_every, put_cron). A run of a series is an ordinary job, with the series' id, whose
// row keeps the schedule and the run's slot (the repeat column: "<slot> <schedule>", the texts of
// delayq/detail/job_queue/repeat.hpp), the slot being where the schedule put the run, which a
// retry or a reschedule of it does not move, so that a series stays in phase.
// The statement that removes such a row for good (ack's delete, and bury()'s, which every move to
// the dead letters runs: a nack of the max_attempts-th delivery, a bury, a reclaim of a last
// lease) returns its schedule, due time, token and payload, and the same transaction inserts the
// next run (queue_next()): the id, payload and schedule, waiting, attempts 0, no last error, due at
// next_run(schedule, the run's slot, now), which is also its slot. One transaction, so every
// process sees the run settled with its successor queued or neither, and the fencing makes one
// settle win: a second ack of the run (another object, another process) finds the next run waiting,
// not leased under its token, and is refused, so there is never a second next run, nor none. A
// plain nack retries the run itself (its row stays), cancel removes the queued run (the series
// ends, since nothing settles it), reschedule moves the waiting run only. The next run keeps the
// token of the run before it, not a fresh job's 0, so that its lease's token is greater than every
// one the series gave (lease_due()) even if the clock stepped back: a late holder of the old run is
// refused. The id is then both dead and queued, after a run died: find() says the queued run, and
// the dead table's count is unchanged by the insert into jobs.
//
// The last error. A job's row keeps the reason of the last nack or bury that gave one, and the
// move to the dead letters copies it, so a dead letter says why it died: its consumer's words, or
// lease_ended_reason when its last lease ended unsettled (the consumer crashed or hung; it said
// nothing). A nack or bury without a reason leaves the last one: a plain retry after a failure
// that was explained must not erase the explanation. The reason is written by the statement
// that moves the job (coalesce() of the new reason, NULL for none, and the old), not by one of its
// own: a failed attempt writes its row once.
//
// Limits (limits::takes, options::limits). The store counts the queue's leases, not the object's,
// so a take counts them in its own write transaction, right before it leases, and leases at most
// what is left (room()): for max_leased N, the jobs whose lease has not ended (lease_end > now),
// counted through {jobs}_leases and at most N of them (a bounded count: a seek and N steps at
// most, never a scan of the queue); for a rate of N per period, the sum of the {grants} rows made
// within the period (a range of its key), after removing the older ones; and a lease by an object
// with a rate adds its count to the row of its ms. An object without limits neither counts nor
// records. What a limit holds back is a time, not a failure: held_until() is the time before
// which the object's takes lease nothing (the earliest end of a lease that counts, for
// max_leased; for the rate, the time the grants within the period fall below N: the oldest's
// time plus the period, when every object of the queue has the same rate), which delay_queue's
// commit() makes the next event, so that a held take sleeps until then, never spins on the due
// jobs it may not lease. Both limits set, the later of the two. An ack (or nack, bury, cancel, a
// shorter extend) frees a place sooner: its own commit tells its object's takes (its next event
// is due again), and another connection's commit reaches them through PRAGMA data_version.
//
// Stats (stats()). The counts of rows come from the 'queued' and 'dead' rows of {meta}, which the
// file's triggers keep (schema.hpp): no count of a table. The rest is read through the two
// partial indexes, in one read transaction so that every figure is of the same moment: leased,
// the leases not ended (a range of {jobs}_leases: O(leased), bounded by the consumers); the ended
// leases not reclaimed yet, due again since their end (the other end of that index, the same
// bound); the earliest due time of a waiting job (one seek into {jobs}_due) for the lag; and the
// waiting jobs that are due, counted by stepping two ranges of {jobs}_due at once, the due ones
// (due <= now) and the later ones, until one ends: the count is that range's, or the other's
// from the waiting rows (queued less the rows with a lease). So it costs twice the smaller of
// the due and the later jobs: little when a queue is nearly all backlog or nearly all future,
// most when it is half due, each step an index entry and its row (SQLite 3.40 does not use a
// partial index as covering; docs/performance.md has the figures). Nothing cheaper counts a range
// of a b-tree, and due-ness moves with the clock, so no count kept by the writes could say it.
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
#include "../../detail/job_queue/repeat.hpp"
#include "../../job.hpp"
#include "handle.hpp"
#include "schema.hpp"

namespace delayq::sqlite::detail {

// One change to the file, as the group commit runs it (delay_queue.hpp, "Durability"): every
// write of the queue goes through it, so that concurrent calls share transactions.
struct op {
    enum kind_t : unsigned char {
        put,
        cancel,
        reschedule,
        ack,
        nack,
        extend,
        bury,
        lease,
        requeue,
        purge,
        pause,
        resume
    };
    kind_t kind;
    std::string_view id;
    std::string_view payload{};                // put
    std::optional<std::string_view> repeat{};  // put: the series' schedule; none: a one-off job
    long long due = 0;                         // put, reschedule, nack, requeue: the new due time
                                               // purge: the dead letters that died before it go
    long long token = 0;                       // ack, nack, extend, bury: the lease's
    long long lease_ms = 0;                    // extend: the new lease's length (ms, >= 0)
    std::size_t want = 0;                      // lease: at most this many jobs
    std::optional<std::string_view> reason{};  // nack, bury: the new last error; none keeps it
    std::vector<job>* jobs = nullptr;          // lease: the jobs leased
    std::size_t removed = 0;                   // purge: the dead letters it removed
    bool ok = false;                           // the result: queued, removed, moved, settled
};

// The queue's transitions over one connection, with the statements they run. Not thread-safe:
// its owner serializes every call (delay_queue's db_m_).
class transitions {
  public:
    // What the transitions need of the queue's options.
    struct limits {
        std::chrono::milliseconds lease;      // how long a lease lasts (> 0)
        unsigned max_attempts;                // 0: redeliver forever; else dead after this many
        std::size_t reclaim_batch;            // ended leases reclaimed per take (> 0)
        std::chrono::milliseconds keep_dead;  // 0: dead letters kept for ever; else how long
        job_limits takes;                     // the object's limits on leases (see "Limits")
    };

    // The most dead letters that one purge op removes: a transaction that holds the file's write
    // lock for tens of milliseconds at most; purge_dead() runs as many as it needs.
    static constexpr std::size_t purge_batch = 10000;
    // The most dead letters older than keep_dead that one move to the dead letters removes.
    static constexpr std::size_t keep_dead_batch = 100;

    static constexpr long long never = std::numeric_limits<long long>::max();  // no next event

    // put's insert: prepared here, and run by put_in_transaction() on the application's
    // connection, so that both insert alike. ?4 is the schedule of a series (put_every,
    // put_cron), as text; put_in_transaction() leaves it unbound, which SQLite reads as NULL (a
    // one-off job).
    static constexpr std::string_view insert_sql =
        "INSERT OR IGNORE INTO {jobs}(id, payload, due, repeat) VALUES(?1, ?2, ?3, "
        "CAST(?4 AS TEXT))";

    // cancel's delete: prepared here, and run by cancel_in_transaction() on the application's
    // connection.
    static constexpr std::string_view cancel_sql = "DELETE FROM {jobs} WHERE id = ?1";

    // Prepares every statement on `db`, whose tables are where `where` says.
    transitions(database& db, const layout& where, limits l) : st_(db, where), limits_(l) {}

    // BEGIN IMMEDIATE; rolled back unless committed.
    write_transaction begin() { return write_transaction(st_.begin, st_.commit, st_.rollback); }

    // In a write transaction: one op; o.ok (and for a lease *o.jobs) says what it did.
    void apply(op& o, long long now) {
        switch (o.kind) {
            case op::put: {
                statement::use u(st_.insert);
                o.ok = u->bind(o.id, o.payload, o.due, o.repeat).run() == 1;
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
                std::optional<settled_run> settled;
                {
                    statement::use u(st_.ack);
                    o.ok = u->bind(o.id, o.token, now).step();
                    if (o.ok) settled = run_of(st_.ack);
                    u->run();
                }
                if (settled) queue_next(o.id, *settled, now);
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
                    bury(o.id, now, o.reason);
                } else {
                    statement::use u(st_.requeue_at);
                    u->bind(o.due, o.id, o.reason).run();
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
                bury(o.id, now, o.reason);
                break;
            }
            case op::lease: {
                o.want = room(o.want, now);
                if (o.want == 0) break;  // a limit holds it back: o.ok false, no jobs
                lease_due(o, now);
                if (limits_.takes.rate > 0 && !o.jobs->empty()) {
                    statement::use u(st_.grant);
                    u->bind(now, static_cast<long long>(o.jobs->size())).run();
                }
                break;
            }
            case op::requeue: {
                // Refused (no row inserted) when the id is not dead, and when it is queued: the
                // queued job keeps its id, and the dead letter stays.
                {
                    statement::use u(st_.requeue_copy);
                    o.ok = u->bind(o.id, o.due, now, token_scale).run() == 1;
                }
                if (o.ok) {
                    statement::use u(st_.requeue_delete);
                    u->bind(o.id).run();
                }
                break;
            }
            case op::purge:
                o.removed = remove_dead(o.due, purge_batch);
                o.ok = o.removed > 0;
                break;
            case op::pause:
            case op::resume: {
                statement::use u(st_.set_paused);
                u->bind(o.kind == op::pause ? 1LL : 0LL).run();
                o.ok = true;
                break;
            }
        }
    }

    // Whether the queue is paused: the 'paused' row of {meta}, one lookup by its key. In a write
    // transaction (a take's, before its first lease), or on its own (paused()).
    bool paused() {
        statement::use u(st_.paused);
        return u->step() && u->integer(0) != 0;
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
                bury(id, now, lease_ended_reason);
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

    // Whether this object has limits on its takes (limits::takes).
    [[nodiscard]] bool limited() const noexcept {
        return limits_.takes.max_leased > 0 || limits_.takes.rate > 0;
    }

    // In a write transaction, for an object with limits: the time (ms) before which its takes
    // lease nothing because of them (see "Limits"); 0 when they may lease now.
    long long held_until(long long now) {
        const job_limits& l = limits_.takes;
        long long until = 0;
        if (l.max_leased > 0 && leased_upto(now, l.max_leased) >= l.max_leased) {
            statement::use u(st_.first_lease_end);
            if (u->bind(now).step() && !u->is_null(0)) until = u->integer(0);
        }
        if (l.rate > 0) {
            const long long period = delayq::detail::clamp_delay(l.period);
            const long long rate = static_cast<long long>(l.rate);
            long long sum = granted_since(now - period);
            if (sum >= rate) {
                // The grants leave the window oldest first: the place frees when the sum of
                // those left falls below the rate (at the oldest's, when every object has this
                // rate).
                statement::use u(st_.grants_window);
                u->bind(now - period);
                while (u->step()) {
                    sum -= u->integer(1);
                    if (sum < rate) {
                        until = std::max(until,
                                         std::min(u->integer(0) + period, delayq::detail::max_ms));
                        break;
                    }
                }
            }
        }
        return until;
    }

    // In a read transaction (begin_read()): the queue's figures at `now` (see "Stats").
    queue_stats stats(long long now) {
        queue_stats out;
        long long queued = 0;
        {
            statement::use u(st_.counts);
            if (u->step()) {
                queued = std::max(u->integer(0), 0LL);
                out.dead = static_cast<std::size_t>(std::max(u->integer(1), 0LL));
            }
        }
        long long leased = 0, ended = 0, oldest = never;
        {
            statement::use u(st_.leases_at);
            if (u->bind(now).step()) {
                leased = u->integer(0);
                ended = u->integer(1);
                if (!u->is_null(2)) oldest = u->integer(2);  // the earliest ended lease
            }
        }
        {
            statement::use u(st_.first_due);
            if (u->step() && !u->is_null(0) && u->integer(0) <= now)
                oldest = std::min(oldest, u->integer(0));
        }
        // The waiting rows (queued less every row with a lease, ended or not), and how many of
        // them are due: the shorter of the two ranges of {jobs}_due, stepped side by side.
        const long long rows = std::max(queued - leased - ended, 0LL);
        long long due = 0;
        {
            statement::use a(st_.due_side), b(st_.later_side);
            a->bind(now);
            b->bind(now);
            long long in_a = 0, in_b = 0;
            for (;;) {
                if (!a->step()) {
                    due = in_a;
                    break;
                }
                ++in_a;
                if (!b->step()) {
                    due = rows - in_b;
                    break;
                }
                ++in_b;
            }
        }
        due = std::clamp(due, 0LL, rows);
        out.leased = static_cast<std::size_t>(leased);
        out.waiting = static_cast<std::size_t>(std::max(queued - leased, 0LL));
        out.due_now = static_cast<std::size_t>(due + ended);
        if (oldest != never) out.lag = std::chrono::milliseconds(now - oldest);
        return out;
    }

    // BEGIN (deferred): a read transaction, for stats(); rolled back unless committed.
    write_transaction begin_read() {
        return write_transaction(st_.begin_read, st_.commit, st_.rollback);
    }

    // PRAGMA data_version: changes when another connection commits. No I/O (it reads the WAL
    // index in shared memory).
    std::optional<long long> data_version() {
        statement::use u(st_.data_version);
        if (!u->step()) return std::nullopt;
        return u->integer(0);
    }

    // The job `id` as the file holds it at `now`: queued (waiting or leased), else dead, else
    // none. One statement, so one snapshot: a job that moves meanwhile is seen on one side.
    std::optional<job_info> find(std::string_view id, long long now) {
        statement::use u(st_.find);
        u->bind(id);
        if (!u->step()) return std::nullopt;
        job_info i;
        i.id = std::string(id);
        const long long lease_end = u->is_null(2) ? never : u->integer(2);
        if (u->integer(0) == 1) {
            i.state = job_state::dead;
            i.time = delayq::detail::from_ms(u->integer(1));
        } else if (lease_end == never) {
            i.time = delayq::detail::from_ms(u->integer(1));
        } else {
            // A lease that ended is reclaimed by the next take, due at its end: say so already.
            i.state = lease_end > now ? job_state::leased : job_state::waiting;
            i.time = delayq::detail::from_ms(lease_end);
        }
        i.attempts = static_cast<unsigned>(u->integer(3));
        i.payload = u->blob(4);
        i.last_error = u->blob(5);
        return i;
    }

    // Up to `want` dead letters in the order they died (then by id), the first after the dead
    // letter `after` (empty: from the first); none if `after` is not dead. A seek into
    // {dead}_died, then at most `want` steps along it, each with its row's lookup.
    std::vector<job_info> dead_page(std::size_t want, std::string_view after) {
        std::vector<job_info> out;
        statement& s = after.empty() ? st_.dead_first : st_.dead_after;
        statement::use u(s);
        if (after.empty()) {
            u->bind(static_cast<long long>(want));
        } else {
            u->bind(after, static_cast<long long>(want));
        }
        while (u->step()) out.push_back(row_info(*u, job_state::dead));
        return out;
    }

    // Up to `want` jobs in `state` (waiting or leased) at `now`, in the order of their time (due
    // time; the lease's end, for a lease that holds or one that ended), then by id, the first
    // after the job `after` (empty: from the first); none if `after` is not in that state. Called
    // in a read transaction (begin_read()), so that the lookup of `after` and the ranges see one
    // moment. The waiting jobs are two ranges, the waiting rows of {jobs}_due and the ended leases
    // of {jobs}_leases (due again since their end, as find() and stats() read them), merged here;
    // the leased ones, the other end of {jobs}_leases. Each is a seek and at most `want` steps.
    std::vector<job_info> jobs_page(job_state state, std::size_t want, std::string_view after,
                                    long long now) {
        // The place that the page follows: (time, id), before every job when `after` is empty.
        long long time = std::numeric_limits<long long>::min();
        if (!after.empty()) {
            const std::optional<job_info> a = find(after, now);
            if (!a || a->state != state) return {};
            time = delayq::detail::to_ms(a->time);
        } else if (state == job_state::leased) {
            time = now + 1;  // from the leases that end after now: (now + 1, '') precedes them
        }
        const auto n = static_cast<long long>(want);
        std::vector<job_info> out;
        if (state == job_state::leased) {
            statement::use u(st_.leased_page);
            u->bind(time, after, n);
            while (u->step()) out.push_back(row_info(*u, job_state::leased));
            return out;
        }
        statement::use w(st_.waiting_page), e(st_.ended_page);
        w->bind(time, after, n);
        e->bind(now, time, after, n);
        // The merge of two ordered ranges, each at most `want` long.
        bool in_w = w->step(), in_e = e->step();
        while (out.size() < want && (in_w || in_e)) {
            const bool from_w = in_w && (!in_e || std::pair(w->integer(1), w->blob(0)) <
                                                      std::pair(e->integer(1), e->blob(0)));
            statement& s = from_w ? *w : *e;
            out.push_back(row_info(s, job_state::waiting));
            (from_w ? in_w : in_e) = s.step();
        }
        return out;
    }

    // The time (ms) before which a dead letter died more than `age` before `now`. An age beyond
    // max_ms (year 5138) is no older than that: no subtraction overflows.
    static long long died_before(long long now, std::chrono::milliseconds age) noexcept {
        return now - delayq::detail::clamp_delay(age);
    }

    // The job of the row that `s` stepped to (id, time, attempts, payload, last error), in `state`.
    static job_info row_info(statement& s, job_state state) {
        job_info i;
        i.id = s.blob(0);
        i.state = state;
        i.time = delayq::detail::from_ms(s.integer(1));
        i.attempts = static_cast<unsigned>(s.integer(2));
        i.payload = s.blob(3);
        i.last_error = s.blob(4);
        return i;
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
              cancel(db, n(cancel_sql)),
              reschedule(db, n("UPDATE {jobs} SET due = ?1 WHERE id = ?2 AND lease_end IS NULL")),
              ended(db,
                    n("SELECT id, attempts FROM {jobs} WHERE lease_end <= ?1 ORDER BY lease_end "
                      "LIMIT ?2")),
              requeue_ended(db, n("UPDATE {jobs} SET due = lease_end, lease_end = NULL WHERE "
                                  "id = ?1")),
              bury_copy(db, n("INSERT OR REPLACE INTO {dead}(id, payload, attempts, died, "
                              "last_error) SELECT id, payload, attempts, ?2, coalesce(?3, "
                              "last_error) FROM {jobs} WHERE id = ?1")),
              bury_delete(db, n(std::string("DELETE FROM {jobs} WHERE id = ?1 RETURNING ") +
                                std::string(settled_sql))),
              due(db, n("SELECT id, payload, due, attempts, token FROM {jobs} WHERE lease_end IS "
                        "NULL AND due "
                        "<= ?1 ORDER BY due LIMIT ?2")),
              lease(db,
                    n("UPDATE {jobs} SET lease_end = ?1, token = ?2, attempts = attempts + 1 WHERE "
                      "id = ?3")),
              next(db, n("SELECT (SELECT min(due) FROM {jobs} WHERE lease_end IS NULL), (SELECT "
                         "min(lease_end) FROM {jobs} WHERE lease_end IS NOT NULL)")),
              ack(db, n(std::string("DELETE FROM {jobs} WHERE id = ?1 AND token = ?2 AND "
                                    "lease_end > ?3 RETURNING ") +
                        std::string(settled_sql))),
              next_run(db, n("INSERT INTO {jobs}(id, payload, due, token, repeat) VALUES(?1, ?2, "
                             "?3, ?4, CAST(?5 AS TEXT))")),
              held(
                  db,
                  n("SELECT attempts FROM {jobs} WHERE id = ?1 AND token = ?2 AND lease_end > ?3")),
              requeue_at(db, n("UPDATE {jobs} SET due = ?1, lease_end = NULL, last_error = "
                               "coalesce(?3, last_error) WHERE id = ?2")),
              extend(db, n("UPDATE {jobs} SET lease_end = ?4 WHERE id = ?1 AND token = ?2 AND "
                           "lease_end > ?3")),
              // Two lookups by primary key; the queued row first, if the id is both.
              find(db, n("SELECT 0, due, lease_end, attempts, payload, last_error FROM {jobs} "
                         "WHERE id = ?1 UNION ALL SELECT 1, died, NULL, attempts, payload, "
                         "last_error FROM {dead} WHERE id = ?1 ORDER BY 1 LIMIT 1")),
              dead_first(db, n("SELECT id, died, attempts, payload, last_error FROM {dead} ORDER "
                               "BY died, id LIMIT ?1")),
              // A row-value range on {dead}_died, from the lookup of `after` by its key.
              dead_after(db, n("SELECT id, died, attempts, payload, last_error FROM {dead} WHERE "
                               "(died, id) > (SELECT died, id FROM {dead} WHERE id = ?1) ORDER BY "
                               "died, id LIMIT ?2")),
              // Three row-value ranges, each of one partial index (whose entries are (time, id):
              // the key is in every entry of an index of a WITHOUT ROWID table), for jobs_page():
              // the waiting rows by due time, the ended leases and the leases that hold by end.
              waiting_page(db, n("SELECT id, due, attempts, payload, last_error FROM {jobs} WHERE "
                                 "lease_end IS NULL AND (due, id) > (?1, ?2) ORDER BY due, id "
                                 "LIMIT ?3")),
              ended_page(db, n("SELECT id, lease_end, attempts, payload, last_error FROM {jobs} "
                               "WHERE lease_end IS NOT NULL AND lease_end <= ?1 AND (lease_end, "
                               "id) > (?2, ?3) ORDER BY lease_end, id LIMIT ?4")),
              leased_page(db, n("SELECT id, lease_end, attempts, payload, last_error FROM {jobs} "
                                "WHERE lease_end IS NOT NULL AND (lease_end, id) > (?1, ?2) "
                                "ORDER BY lease_end, id LIMIT ?3")),
              // The token: the dead table keeps none, and the next lease's must be greater than
              // every one the job had. Each was given at or before it died, from the ms of its
              // lease (lease_due()), so the top of the ms of now or of its death (if the clock
              // stepped back) is above them all.
              requeue_copy(db,
                           n("INSERT OR IGNORE INTO {jobs}(id, payload, due, attempts, token, "
                             "last_error) SELECT id, payload, ?2, 0, (max(died, ?3) + 1) * ?4 - 1, "
                             "last_error FROM {dead} WHERE id = ?1")),
              requeue_delete(db, n("DELETE FROM {dead} WHERE id = ?1")),
              // The earliest dead letters through {dead}_died (a covering range on died), each
              // removed by its key.
              remove_dead(db, n("DELETE FROM {dead} WHERE id IN (SELECT id FROM {dead} WHERE "
                                "died < ?1 ORDER BY died, id LIMIT ?2)")),
              count_jobs(db, n("SELECT count(*) FROM {jobs}")),
              count_dead(db, n("SELECT count(*) FROM {dead}")),
              data_version(db, "PRAGMA data_version"),
              // Limits: a bounded count of the leases not ended, through {jobs}_leases; the
              // earliest of them; the grants within a period (a range of their key).
              leased_upto(db, n("SELECT count(*) FROM (SELECT 1 FROM {jobs} WHERE lease_end > ?1 "
                                "LIMIT ?2)")),
              first_lease_end(db, n("SELECT min(lease_end) FROM {jobs} WHERE lease_end > ?1")),
              trim_grants(db, n("DELETE FROM {grants} WHERE at <= ?1")),
              grants_sum(db, n("SELECT coalesce(sum(n), 0) FROM {grants} WHERE at > ?1")),
              grants_window(db, n("SELECT at, n FROM {grants} WHERE at > ?1 ORDER BY at")),
              grant(db, n("INSERT INTO {grants}(at, n) VALUES(?1, ?2) ON CONFLICT(at) DO UPDATE "
                          "SET n = n + excluded.n")),
              // Stats: the counts the triggers keep; the leases not ended and those ended, the
              // earliest ended (the two ends of {jobs}_leases, covering); the earliest due time;
              // the two ranges of {jobs}_due.
              begin_read(db, "BEGIN"),
              counts(db, n("SELECT (SELECT value FROM {meta} WHERE name = 'queued'), (SELECT "
                           "value FROM {meta} WHERE name = 'dead')")),
              leases_at(db, n("SELECT (SELECT count(*) FROM {jobs} WHERE lease_end > ?1), (SELECT "
                              "count(*) FROM {jobs} WHERE lease_end <= ?1), (SELECT "
                              "min(lease_end) FROM {jobs} WHERE lease_end IS NOT NULL AND "
                              "lease_end <= ?1)")),
              first_due(db, n("SELECT min(due) FROM {jobs} WHERE lease_end IS NULL")),
              due_side(db, n("SELECT 1 FROM {jobs} WHERE lease_end IS NULL AND due <= ?1")),
              later_side(db, n("SELECT 1 FROM {jobs} WHERE lease_end IS NULL AND due > ?1")),
              paused(db, n("SELECT value FROM {meta} WHERE name = 'paused'")),
              // A replace, not an update: it needs no row to be there (open_queue() adds one to a
              // file of an earlier version, but a file is anyone's to edit).
              set_paused(db, n("INSERT OR REPLACE INTO {meta}(name, value) VALUES('paused', ?1)")) {
        }

        statement begin, commit, rollback, insert, cancel, reschedule, ended, requeue_ended,
            bury_copy, bury_delete, due, lease, next, ack, next_run, held, requeue_at, extend, find,
            dead_first, dead_after, waiting_page, ended_page, leased_page, requeue_copy,
            requeue_delete, remove_dead, count_jobs, count_dead, data_version, leased_upto,
            first_lease_end, trim_grants, grants_sum, grants_window, grant, begin_read, counts,
            leases_at, first_due, due_side, later_side, paused, set_paused;
    };

    // What a delete of a row returns for queue_next(): its schedule, due time and token, and its
    // payload only when it has a schedule, so that settling a one-off job copies no payload out.
    static constexpr std::string_view settled_sql =
        "repeat, due, token, CASE WHEN repeat IS NULL THEN NULL ELSE payload END";

    // A run of a series that a statement removed: what its next run is made of.
    struct settled_run {
        std::string repeat, payload;
        long long due = 0, token = 0;
    };

    // The row that a delete ... RETURNING settled_sql stepped to, if it was a run of a series.
    static std::optional<settled_run> run_of(const statement& s) {
        if (s.is_null(0)) return std::nullopt;
        return settled_run{s.blob(0), s.blob(3), s.integer(1), s.integer(2)};
    }

    // In a write transaction, right after the run `r` of the series `id` left the jobs: queues
    // the next run (see "Series"). A schedule that next_run() cannot read (written by a later
    // version of delayq, in a text this one does not know) ends the series: no next run, rather
    // than one due at a time this version would have to guess.
    void queue_next(std::string_view id, const settled_run& r, long long now) {
        namespace jq = delayq::detail::job_queue;
        const std::optional<jq::slotted> s = jq::slot_of(r.repeat);
        if (!s) return;
        const std::optional<long long> due = jq::next_run(s->text, s->slot, now);
        if (!due) return;
        const long long at = std::min(*due, delayq::detail::max_ms);
        const std::string stored = jq::with_slot(at, s->text);
        statement::use u(st_.next_run);
        u->bind(id, std::string_view(r.payload), at, r.token, std::string_view(stored)).run();
    }

    // Whether a job whose delivery was its `attempts`-th goes to the dead letters when that
    // delivery fails (a nack, or its lease ended).
    [[nodiscard]] bool dies(long long attempts) const noexcept {
        return limits_.max_attempts > 0 && attempts >= limits_.max_attempts;
    }

    // In a write transaction: the job `id` goes to the dead letters, with `reason` as its last
    // error (none: the one it had), and a run of a series queues the next run; with keep_dead, up
    // to keep_dead_batch of those older than it go (see "Keeping the dead letters bounded" above).
    void bury(std::string_view id, long long now, std::optional<std::string_view> reason) {
        {
            statement::use u(st_.bury_copy);
            u->bind(id, now, reason).run();
        }
        std::optional<settled_run> settled;
        {
            statement::use u(st_.bury_delete);
            if (u->bind(id).step()) settled = run_of(st_.bury_delete);
            u->run();
        }
        if (settled) queue_next(id, *settled, now);
        if (limits_.keep_dead > std::chrono::milliseconds::zero())
            remove_dead(died_before(now, limits_.keep_dead), keep_dead_batch);
    }

    // In a write transaction: up to `max` of the dead letters that died before `before` (ms), the
    // earliest first; how many it removed.
    std::size_t remove_dead(long long before, std::size_t max) {
        statement::use u(st_.remove_dead);
        return static_cast<std::size_t>(u->bind(before, static_cast<long long>(max)).run());
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

    // In a write transaction before a lease: how many of `want` jobs the object's limits let it
    // lease now (see "Limits"); trims the grants older than its period.
    std::size_t room(std::size_t want, long long now) {
        const job_limits& l = limits_.takes;
        if (l.max_leased > 0) want = std::min(want, l.max_leased - leased_upto(now, l.max_leased));
        if (l.rate > 0 && want > 0) {
            const long long since = now - delayq::detail::clamp_delay(l.period);
            {
                statement::use u(st_.trim_grants);
                u->bind(since).run();
            }
            const auto sum = static_cast<std::size_t>(std::max(granted_since(since), 0LL));
            want = std::min(want, l.rate - std::min(sum, l.rate));
        }
        return want;
    }

    // The jobs whose lease has not ended at `now`, counted up to `max`.
    std::size_t leased_upto(long long now, std::size_t max) {
        statement::use u(st_.leased_upto);
        u->bind(now, static_cast<long long>(std::min<std::size_t>(
                         max, static_cast<std::size_t>(std::numeric_limits<long long>::max()))));
        return u->step() ? static_cast<std::size_t>(u->integer(0)) : 0;
    }

    // The leases granted after `since` (ms) by objects with a rate.
    long long granted_since(long long since) {
        statement::use u(st_.grants_sum);
        return u->bind(since).step() ? u->integer(0) : 0;
    }

    std::size_t count(statement& s) {
        statement::use u(s);
        return u->step() ? static_cast<std::size_t>(u->integer(0)) : 0;
    }

    statements st_;
    limits limits_;
};

}  // namespace delayq::sqlite::detail
