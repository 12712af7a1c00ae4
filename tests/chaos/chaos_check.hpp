// The chaos check's judge: from the processes' logs (chaos_log.hpp) and the store's state at the
// end (what is still queued, what is dead, the file's integrity), every broken promise of "What
// every job queue promises" (SPEC.md), each with the log lines that show it.
//
// It must never call at-least-once delivery a violation. What a log can and cannot prove:
// - A process killed in the middle of a call leaves a "-begin" line without its "-end": the call
//   may or may not have happened. Such an open put proves nothing (the job may exist); an open ack
//   or cancel may have removed the job, so the job is not lost; an open take may have leased jobs
//   that no log names, so a delivery count from the logs is a lower bound.
// - Order between processes comes from CLOCK_MONOTONIC stamps: an end stamp is taken after the
//   call returned, a begin stamp before it started, so "begin stamp > end stamp" proves "began
//   after returned". Ties and overlaps prove nothing and are not reported.
// - Early is judged on CLOCK_REALTIME, the stores' clock (the Redis server runs on this machine):
//   a take's end stamp is later than the store's decision to hand the job out, so a stamp before
//   the job's due time proves the store handed it out early.
// - Ids are never put twice (each process incarnation makes its own), so every event of an id is
//   about one job.
// - A lease's end moves with each extend() that returned true: the store ran it at a moment
//   between its begin and end stamps, so the new end lies between begin + lease and end + lease
//   (less 1 ms: a store may read its clock in whole ms). The processes only ever extend by the
//   queue's lease or more, after the take, so an extend of unknown outcome can only have made a
//   lease longer: the take's lease end stays a lower bound, and no upper bound is judged after it.
// - A call's time runs from the `@` stamp of its end or fail line (taken right before the call) to
//   that line's own stamp (taken right after it, before the line is written): nothing but the
//   scheduler stands between the stamps and the call, and the slack allows for that.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chaos_log.hpp"

namespace delayq_chaos {

/// What the store held once every process was gone.
struct final_state {
    bool read = false;                      ///< the store could be read
    std::set<std::string> queued;           ///< waiting or leased
    std::map<std::string, long long> dead;  ///< dead letters: id -> attempts (-1: not recorded)
    std::string integrity;                  ///< "ok", a problem, or "" (no such check)
    std::vector<std::string> notes;         ///< anything the adapter wants said

    void save(const std::string& path) const {
        std::ofstream out(path);
        out << "read " << (read ? 1 : 0) << '\n';
        for (const auto& id : queued) out << "queued " << id << '\n';
        for (const auto& [id, a] : dead) out << "dead " << id << ' ' << a << '\n';
        if (!integrity.empty()) out << "integrity " << integrity << '\n';
        for (const auto& n : notes) out << "note " << n << '\n';
    }
    static final_state load(const std::string& path) {
        final_state s;
        std::ifstream in(path);
        for (std::string l; std::getline(in, l);) {
            const auto sp = l.find(' ');
            const std::string k = l.substr(0, sp), rest = sp == l.npos ? "" : l.substr(sp + 1);
            if (k == "read") s.read = rest == "1";
            if (k == "queued") s.queued.insert(rest);
            if (k == "dead") {
                const auto sp2 = rest.rfind(' ');
                s.dead[rest.substr(0, sp2)] = std::stoll(rest.substr(sp2 + 1));
            }
            if (k == "integrity") s.integrity = rest;
            if (k == "note") s.notes.push_back(rest);
        }
        return s;
    }
};

/// What the processes were run with.
struct check_settings {
    unsigned max_attempts = 0;
    /// busy_timeout / io_timeout, for a process whose start line does not say its own.
    long long call_timeout_ms = 10'000;
    /// One connect: a call that found its connection broken may make one within its time, as
    /// the queues allow (the Redis and Postgres queues connect within io_timeout).
    long long connect_ms = 10'000;
    /// For a loaded machine: the scheduler, the log's own fdatasync, a page fault.
    long long slack_ms = 2'000;
    bool timing = true;        ///< the timing rule (late-failure, late-return) on
    long long max_leased = 0;  ///< every process's options.limits.max_leased (0: none)
    long long lease_ms = 0;    ///< the queues' lease (0: not known)
};

/// One broken promise and the events that show it.
struct violation {
    std::string kind;  ///< "lost", "ran-after-cancel", ...
    std::string id;    ///< the job, or "" for one that is about no job
    std::string what;  ///< in words
    std::vector<const event*> evidence;
};

struct report {
    std::vector<violation> violations;
    std::vector<std::string> notes;
    std::map<std::string, long long> counts;  ///< what happened, for the summary
};

namespace detail {

/// One call: its begin line, its end (or fail) line, and how it ended.
struct call {
    const event* begin = nullptr;
    const event* end = nullptr;  ///< the "-end" or "-fail" line; null: the process died in it
    bool failed = false;
    int result = -1;               ///< 0 / 1 from an "-end" line
    unsigned long long token = 0;  ///< ack, nack, extend, bury
    long long retry = 0;           ///< nack: ms
    long long lease = 0;           ///< extend: the lease asked for, ms
    bool open() const { return end == nullptr; }
    bool ok() const { return result == 1; }
};

struct delivery {
    const event* begin = nullptr;  ///< take-begin
    const event* line = nullptr;   ///< the job line (stamped when the take returned)
    long long attempts = 0, deadline = 0, lease = 0;
    unsigned long long token = 0;  ///< a fencing token: any 64-bit value, greater at each lease
};

struct history {
    std::vector<call> puts, cancels, acks, nacks, extends, buries;
    std::vector<delivery> deliveries;
    std::vector<const event*> dies;
    /// A delayq::worker that gave a settlement up (lease_lost) right after it failed: the
    /// failed call's line, the worker-lease-lost line, and how many times in a row it failed.
    struct give_up {
        const event* fail = nullptr;
        const event* lost = nullptr;
        long long fails = 0;
    };
    std::vector<give_up> gave_up;
    bool poison = false;
    long long due = 0;   ///< realtime ns before which it must not run (from put-begin)
    bool known = false;  ///< some put-begin names it
};

inline std::string key2(const std::string& a, const std::string& b) {
    return a + ' ' + b;
}

/// The limit of jobs leased at once (check_settings::max_leased), across every process: a lease
/// is surely held, by the store's clock, from its take's end stamp (the store made it before)
/// until the earliest of its lease's end as the take reported it (less 1 ms: a store reads its
/// clock in whole ms; an extend only makes it longer), the begin stamp of any ack, nack or bury
/// of its token, and the begin stamp of any cancel of its job that had not returned before the
/// take did. More than `limit` leases surely held at one moment is a violation.
template <class Jobs, class Add>
void over_limit(const Jobs& jobs, long long limit, report& r, Add& add) {
    constexpr long long store_ms = 1'000'000;
    struct held {
        long long from = 0, to = 0;
        const event *begin = nullptr, *line = nullptr;
        std::string id;
    };
    std::vector<held> leases;
    for (const auto& [id, h] : jobs)
        for (const auto& d : h.deliveries) {
            held l{d.line->real, d.lease - store_ms, d.begin, d.line, id};
            for (auto* v : {&h.acks, &h.nacks, &h.buries})
                for (const call& c : *v)
                    if (c.token == d.token) l.to = std::min(l.to, c.begin->real);
            for (const call& c : h.cancels)
                if (c.open() || c.end->real >= l.from) l.to = std::min(l.to, c.begin->real);
            if (l.from < l.to) leases.push_back(std::move(l));
        }
    // A sweep over the moments a surely-held lease begins (+1) or ends (-1), ends first at a tie.
    std::vector<std::pair<long long, long long>> points;  // (time, +1 / -1), index in `leases`
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < leases.size(); ++i) {
        points.emplace_back(leases[i].from, static_cast<long long>(i) + 1);
        points.emplace_back(leases[i].to, -static_cast<long long>(i) - 1);
    }
    std::sort(points.begin(), points.end());
    std::set<std::size_t> now;
    long long most = 0;
    bool reported = false;
    for (const auto& [t, w] : points) {
        if (w < 0) {
            now.erase(static_cast<std::size_t>(-w - 1));
            continue;
        }
        now.insert(static_cast<std::size_t>(w - 1));
        most = std::max(most, static_cast<long long>(now.size()));
        if (static_cast<long long>(now.size()) > limit && !reported) {
            reported = true;
            std::vector<const event*> ev;
            std::string ids;
            for (std::size_t i : now) {
                ev.insert(ev.end(), {leases[i].begin, leases[i].line});
                ids += (ids.empty() ? "" : ", ") + leases[i].id;
            }
            add("over-limit", "",
                std::to_string(now.size()) + " jobs surely leased at once (" + ids +
                    "), over the limit of " + std::to_string(limit),
                ev);
        }
    }
    r.counts["most leases surely held at once (limit " + std::to_string(limit) + ")"] = most;
}

/// A put_every() of the chaos: its begin and end lines, and whether it returned true.
struct series_calls {
    const event* begin = nullptr;
    const event* end = nullptr;
    long long period_ms = 0;
    bool ok = false;
};

/// None missing while a consumer lives: each run of a series is due at the first slot (the first
/// run's due time + k periods) after the moment the run before it ended, and the first run one
/// period after put_every(). A run ends with the ack or bury that returned true of one of its
/// deliveries, or with a nack that returned true of its max_attempts-th (to the dead letters); the
/// store ran that call at a moment between its begin and end stamps (by its clock, in whole ms), so
/// the next run's slot lies between the first slot after the begin stamp (less 1 ms) and the first
/// after the end stamp (plus 1 ms). Sooner is "series-run-too-soon" (the next run was there before
/// its predecessor ended), later "series-missing-run" (a slot skipped while the run before had
/// already ended).
///
/// A series' deliveries in the order of their fencing tokens (greater at each lease, the next run
/// keeping its predecessor's or taking a later one) are its runs one after another, each from its
/// attempt 1 on. What cannot be judged is counted, not guessed:
/// - a run with no such ending in the logs (its ack, bury or last nack threw or its process died
///   in it; its last lease ended and the store moved it to the dead letters; a redelivery no log
///   names): when it ended, no log says;
/// - a delivery after the ending and before the next attempt 1: a run between whose attempt 1 no
///   log names (a take that a process died in, or that threw after the store leased it);
/// - a run whose every delivery no log names, as many takes as max_attempts died or threw in the
///   round: it would have died of its last lease, at least max_attempts leases after its slot, and
///   queued the next run then; a skip that long is not judged when the round had that many such
///   takes;
/// - anything after a cancel of the series began (the drainer's, at the end, too);
/// - a first run whose put_every threw or whose process died in it (no moment to judge it from).
/// The earlier bound needs no ending at all but the one seen: a run between only makes the next
/// one later.
template <class Add>
void judge_next_runs(const std::string& id, const history& h, const series_calls& s,
                     long long open_takes, const check_settings& cs, report& r, Add& add) {
    constexpr long long store_ms = 1'000'000;
    const long long period = s.period_ms * 1'000'000LL;
    if (period <= 0 || h.deliveries.empty()) return;
    std::vector<const delivery*> order;
    for (const auto& d : h.deliveries) order.push_back(&d);
    std::sort(order.begin(), order.end(),
              [](const delivery* a, const delivery* b) { return a->token < b->token; });
    // Anything at or after a cancel that may have ended the series is not judged.
    const auto after_cancel = [&](const delivery& d) {
        return std::any_of(h.cancels.begin(), h.cancels.end(), [&](const call& c) {
            return c.result != 0 && c.begin->mono < d.line->mono;
        });
    };
    // A run whose every delivery no log names, due no sooner than `from`, would have ended no
    // sooner than max_attempts leases later (each lease ends before the next take): a next run
    // due that late may follow it.
    const long long max = cs.max_attempts;
    const auto maybe_unseen_run = [&](long long from, long long next) {
        return max > 0 && open_takes >= max &&
               next >= from + max * cs.lease_ms * 1'000'000LL - (max + 1) * store_ms;
    };
    // The first slot after `t` of a series whose run is due at `slot` (the store's next_run()).
    const auto slot_after = [&](long long slot, long long t) {
        return t < slot ? slot + period : slot + ((t - slot) / period + 1) * period;
    };
    const auto judge = [&](const delivery& next, long long lo, long long hi, bool upper,
                           const char* counted, std::vector<const event*> ev) {
        ev.insert(ev.end(), {next.begin, next.line});
        if (next.deadline < lo) {
            add("series-run-too-soon", id,
                "a series' run due " + std::to_string((lo - next.deadline) / 1'000'000) +
                    " ms before the first slot after the run before it ended (or one period after "
                    "put_every)",
                ev);
        } else if (upper && next.deadline > hi) {
            if (maybe_unseen_run(lo, next.deadline)) {
                r.counts["series: runs not judged (a run no log names may lie between)"]++;
                return;
            }
            add("series-missing-run", id,
                "a series' run due " + std::to_string((next.deadline - hi) / 1'000'000) +
                    " ms after the first slot after the run before it ended (or one period after "
                    "put_every): a slot skipped",
                ev);
        }
        if (upper) r.counts[counted]++;
    };

    // The first run: one period after put_every (its moment: between its stamps).
    const delivery& first = *order.front();
    if (first.attempts != 1 || after_cancel(first) || s.end == nullptr || !s.ok) {
        r.counts["series: first runs not judged"]++;
        if (first.attempts == 1 && !after_cancel(first))
            judge(first, s.begin->real + period - store_ms, 0, false, "", {s.begin, s.end});
    } else {
        judge(first, s.begin->real + period - store_ms, s.end->real + period + store_ms, true,
              "series: first runs judged", {s.begin, s.end});
    }

    // Each run against the one before it.
    std::size_t at = 0;  // the attempt 1 of the run being followed
    for (std::size_t i = 1; i < order.size(); ++i) {
        if (order[i]->attempts != 1) continue;
        const delivery& run = *order[at];
        const delivery& next = *order[i];
        const std::size_t from = at;
        at = i;
        if (after_cancel(next)) {
            r.counts["series: runs not judged (after a cancel)"]++;
            continue;
        }
        // The series' first delivery in the logs is a retry or a redelivery: its run's slot, from
        // which the next is counted, no log names.
        if (run.attempts != 1) {
            r.counts["series: runs not judged (a run no log names lies between)"]++;
            continue;
        }
        // The run's ending: the one settle of its deliveries that surely ended it.
        std::vector<const call*> endings;
        std::vector<const delivery*> of;  // the delivery each ending settled
        for (std::size_t j = from; j < i; ++j) {
            const delivery& d = *order[j];
            for (auto* v : {&h.acks, &h.buries})
                for (const call& c : *v)
                    if (c.token == d.token && c.ok()) endings.push_back(&c), of.push_back(&d);
            for (const call& c : h.nacks)
                if (c.token == d.token && c.ok() && max > 0 && d.attempts >= max)
                    endings.push_back(&c), of.push_back(&d);
        }
        if (endings.size() != 1) {
            r.counts["series: runs not judged (the run before ended unseen)"]++;
            continue;
        }
        const call& e = *endings.front();
        const long long lo = slot_after(run.deadline, e.begin->real - store_ms);
        const long long hi = slot_after(run.deadline, e.end->real + store_ms);
        // A delivery leased after the ending is of a run between whose attempt 1 no log names.
        const bool between =
            std::any_of(order.begin() + static_cast<std::ptrdiff_t>(from),
                        order.begin() + static_cast<std::ptrdiff_t>(i),
                        [&](const delivery* d) { return d->token > of[0]->token; });
        if (between) r.counts["series: runs not judged (a run no log names lies between)"]++;
        judge(next, lo, hi, !between, "series: runs judged against the run before",
              {run.begin, run.line, of[0]->begin, of[0]->line, e.begin, e.end});
    }
}

/// The repeatable jobs (ids that begin with 'S'), whose runs share the series' id: each run is
/// one series' slot, first delivered with attempts 1. Judged: no run handed out before its due
/// time (the store's clock); two runs of one series never due less than a period apart (each
/// run's next is queued once, by the step that ends it, at a slot after it); none missing while
/// a consumer lives (judge_next_runs()); a series that the producer made (put_every returned true)
/// and nobody cancelled before the drain is still there at the drain (a run of it is handed to the
/// drainer, which cancels it): a run's ack, death or lease's end never ended it.
template <class Add>
void judge_series(const std::map<std::string, series_calls>& series,
                  const std::map<std::string, history>& runs,
                  const std::map<int, std::string>& process_of, const event* drain_end,
                  long long open_takes, const check_settings& cs, report& r, Add& add) {
    constexpr long long store_ms = 1'000'000;
    const auto by_drainer = [&](const event* e) {
        const auto p = process_of.find(e->file);
        return p != process_of.end() && p->second.rfind("drainer", 0) == 0;
    };
    for (const auto& [id, h] : runs) {
        const auto s = series.find(id);
        if (s == series.end() || s->second.begin == nullptr) {
            if (!h.deliveries.empty())
                add("phantom", id, "a series' run that no process made",
                    {h.deliveries[0].begin, h.deliveries[0].line});
            continue;
        }
        const long long period = s->second.period_ms * 1'000'000LL;
        if (s->second.ok) r.counts["series made"]++;
        std::map<long long, const delivery*> first_of_run;  // a run's slot -> its attempt 1
        for (const auto& d : h.deliveries) {
            r.counts["series runs handed out"]++;
            if (d.line->real < d.deadline)
                add("early", id,
                    "a series' run handed out " +
                        std::to_string((d.deadline - d.line->real) / 1000) +
                        " us before its due time (the store's clock)",
                    {d.begin, d.line});
            // A run's first delivery is its attempt 1, due at the run's slot (a retry is due at
            // its retry_after, a redelivery at the lease's end: not another run).
            if (d.attempts == 1) first_of_run.emplace(d.deadline, &d);
        }
        const delivery* before = nullptr;
        for (const auto& [due, d] : first_of_run) {
            if (before != nullptr && due - before->deadline < period - store_ms)
                add("series-two-runs", id,
                    "two runs of a series due " +
                        std::to_string((due - before->deadline) / 1'000'000) +
                        " ms apart, less than its period of " +
                        std::to_string(s->second.period_ms) + " ms",
                    {before->begin, before->line, d->begin, d->line});
            before = d;
        }
        judge_next_runs(id, h, s->second, open_takes, cs, r, add);
        // Still there at the drain, unless a cancel (but the drainer's) may have ended it.
        bool cancelled = false;
        for (const call& c : h.cancels)
            cancelled |= !by_drainer(c.begin) && (c.ok() || c.open() || c.failed);
        const bool drained = drain_end != nullptr && drain_end->at(0) == "1";
        const bool at_drain = std::any_of(h.deliveries.begin(), h.deliveries.end(),
                                          [&](const delivery& d) { return by_drainer(d.line); });
        if (s->second.ok && drained && !cancelled && !at_drain) {
            std::vector<const event*> ev{s->second.begin, s->second.end};
            for (const auto& d : h.deliveries) ev.insert(ev.end(), {d.begin, d.line});
            add("series-ended", id,
                "a series that nobody cancelled had no run left when the queue was drained", ev);
        }
    }
}

}  // namespace detail

/// Judges `logs` (logs[i] are the events of the process whose name is names[i]) and `end`.
inline report check(const std::vector<std::vector<event>>& logs, const final_state& end,
                    const check_settings& cs) {
    using detail::call;
    report r;
    std::map<std::string, detail::history> jobs;
    std::map<int, std::string> process_of;  // log -> its process ("role index incarnation")
    std::map<std::string, detail::series_calls> series;  // put_every calls, by the series' id
    long long open_takes = 0;  // takes a process died in, or that threw: deliveries nobody logged
    const event* drain_end = nullptr;  // the drainer's "drain-end 1 DEAD"
    std::vector<const event*> crashes, failures;
    std::vector<std::pair<const event*, const event*>> late;  // the begin and end of a late call
    long long over_max = LLONG_MIN;    // the longest a call ran over its timeout (+ its wait), ns
    const event* over_call = nullptr;  // the end of that call
    long long off_min = 0, off_max = 0;
    bool any = false;
    const long long allowance = (cs.connect_ms + cs.slack_ms) * 1'000'000LL;

    // One report per kind and job (a job that never dies would otherwise fill the report), but
    // every failed call and crash.
    std::set<std::string> reported;
    const auto add = [&](std::string kind, std::string id, std::string what,
                         std::vector<const event*> ev) {
        if (kind != "call-failed" && kind != "late-failure" && kind != "late-return" &&
            kind != "process-crashed" && !id.empty() && !reported.insert(kind + ' ' + id).second)
            return;
        std::sort(ev.begin(), ev.end(),
                  [](const event* a, const event* b) { return a->mono < b->mono; });
        r.violations.push_back({std::move(kind), std::move(id), std::move(what), std::move(ev)});
    };

    // Disturbances of the store, from the orchestrator's log: server kills (--server-kills,
    // "server-kill" to "server-up"), stalls (--server-stalls, "stall-begin" to "stall-end") and
    // connection kills (--connection-kills, "connection-kill" to "connection-kill-end"). A call
    // that fails from a disturbance's start to the latest moment a call that was running at its
    // end may fail (its end + timeout + one connect + slack) is what a caller must expect and
    // retry; so is each process's first failure after a kill of the server or of the
    // connections (a connection that broke fails the call that first uses it, however late).
    // Such a failure is no violation; its call counts as one of unknown outcome, like any other
    // failed call. How long it took is still judged (below).
    struct disturbance {
        long long from = 0, to = LLONG_MAX;  // CLOCK_MONOTONIC
        const char* what = "";
        bool breaks = false;  // breaks connections: each process's first failure after is excused
    };
    std::vector<disturbance> troubles;
    const long long grace = cs.call_timeout_ms * 1'000'000LL + allowance;
    for (const auto& log : logs)
        for (const auto& e : log) {
            const auto close = [&](const char* what) {
                for (auto it = troubles.rbegin(); it != troubles.rend(); ++it)
                    if (std::string(it->what) == what) {
                        if (it->to == LLONG_MAX) it->to = e.mono + grace;
                        return;
                    }
            };
            if (e.kind == "server-kill")
                troubles.push_back({e.mono, LLONG_MAX, "server kill", true});
            if (e.kind == "server-up") close("server kill");
            if (e.kind == "stall-begin") troubles.push_back({e.mono, LLONG_MAX, "stall", false});
            if (e.kind == "stall-end" || e.kind == "stall-error") close("stall");
            if (e.kind == "connection-kill")
                troubles.push_back({e.mono, LLONG_MAX, "connection kill", true});
            if (e.kind == "connection-kill-end" || e.kind == "connection-kill-error")
                close("connection kill");
            if (e.kind == "stall-error" || e.kind == "connection-kill-error")
                r.notes.push_back("the orchestrator: " + e.text);
        }
    std::sort(troubles.begin(), troubles.end(),
              [](const auto& a, const auto& b) { return a.from < b.from; });

    for (const auto& log : logs) {
        std::set<std::size_t> excused;  // the kills whose first failure in this process was excused
        // What disturbance e failed because of (see above), or null.
        const auto excuse = [&](const event& e) -> const char* {
            const char* during = nullptr;
            for (const auto& t : troubles)
                if (t.from <= e.mono && e.mono <= t.to) during = t.what;
            if (during) return during;
            for (std::size_t k = troubles.size(); k-- > 0;)
                if (troubles[k].breaks && troubles[k].from <= e.mono)
                    return excused.insert(k).second ? troubles[k].what : nullptr;
            return nullptr;
        };
        // This process's calls' timeout (its start line), and the calls already timed: the lines
        // of one put_many or ack_many share their stamps, and are one call.
        long long timeout = cs.call_timeout_ms * 1'000'000LL;
        std::set<long long> timed;
        // Times the call from `b` (its begin line) to `e` (its end or fail line); `wait`: what a
        // take may wait on top of its timeout, ns.
        const auto time_call = [&](const event* b, const event& e, long long wait) {
            if (!timed.insert(e.mono).second) return;
            const long long start = e.call_start() != 0 ? e.call_start() : b->mono;
            const long long over = e.mono - start - timeout - wait;
            r.counts["calls"]++;
            if (e.kind.ends_with("-fail")) r.counts["failed calls"]++;
            if (over > over_max) over_max = over, over_call = &e;
            if (over > allowance) {
                r.counts["late calls"]++;
                if (cs.timing) late.emplace_back(b, &e);
            }
        };
        const event* opening = nullptr;  // an open-begin not yet ended
        const event* sizing = nullptr;   // a size-begin not yet ended
        // Calls begun in this process and not yet ended, by what names them.
        std::map<std::string, call> puts, cancels, acks, nacks, extends, buries;
        std::map<std::string, const event*> takes;  // seq -> take-begin
        std::map<std::string, const event*> take_ends;
        // The last line of an ack, nack or bury of each lease ("ID TOKEN"), for worker-lease-lost.
        std::map<std::string, const event*> last_settle;
        std::map<std::string, long long> settle_fails;  // failures in a row, by the same key
        long long job_lines_due = 0;  // job lines the last take-end announced and not yet seen
        // The call `k` of `open` ended with `e`; an "-end" line's result is its field `at`.
        const auto finish = [&](std::map<std::string, call>& open, const std::string& k,
                                const event& e, bool failed, std::size_t at,
                                std::vector<call>& into) {
            auto it = open.find(k);
            if (it == open.end()) return;
            call c = it->second;
            open.erase(it);
            c.end = &e;
            c.failed = failed;
            if (!failed) c.result = static_cast<int>(e.num(at));
            time_call(c.begin, e, 0);
            into.push_back(c);
        };
        for (const auto& e : log) {
            if (!any) off_min = off_max = e.real - e.mono, any = true;
            off_min = std::min(off_min, e.real - e.mono);
            off_max = std::max(off_max, e.real - e.mono);
            const std::string& k = e.kind;
            if (k == "start" && e.num(4) > 0) timeout = e.num(4) * 1'000'000LL;
            if (k == "start") process_of[e.file] = e.at(0) + ' ' + e.at(1) + ' ' + e.at(2);
            if (k != "job" && job_lines_due > 0) {
                // The process died in the middle of writing a take's lines (a write cut short by
                // SIGKILL): deliveries that no line names, as from a take it died in.
                ++open_takes;
                job_lines_due = 0;
            }
            if (k == "series-begin") {
                series[e.at(0)].begin = &e;
                series[e.at(0)].period_ms = e.num(1);
            } else if (k == "series-end" || k == "series-fail") {
                series[e.at(0)].end = &e;
                series[e.at(0)].ok = k == "series-end" && e.at(1) == "1";
            }
            if (k == "put-begin") {
                auto& h = jobs[e.at(0)];
                h.known = true;
                h.poison = e.at(1) == "1";
                h.due = e.num(2);
                puts[e.at(0)] = call{&e};
                r.counts["puts begun"]++;
            } else if (k == "put-end" || k == "put-fail") {
                finish(puts, e.at(0), e, k == "put-fail", 1, jobs[e.at(0)].puts);
            } else if (k == "cancel-begin") {
                cancels[e.at(0)] = call{&e};
            } else if (k == "cancel-end" || k == "cancel-fail") {
                finish(cancels, e.at(0), e, k == "cancel-fail", 1, jobs[e.at(0)].cancels);
            } else if (k == "ack-begin") {
                call c{&e};
                c.token = e.unum(1);
                acks[detail::key2(e.at(0), e.at(1))] = c;
            } else if (k == "ack-end" || k == "ack-fail") {
                finish(acks, detail::key2(e.at(0), e.at(1)), e, k == "ack-fail", 2,
                       jobs[e.at(0)].acks);
            } else if (k == "nack-begin") {
                call c{&e};
                c.token = e.unum(1);
                c.retry = e.num(2);
                nacks[detail::key2(e.at(0), e.at(1))] = c;
            } else if (k == "nack-end" || k == "nack-fail") {
                finish(nacks, detail::key2(e.at(0), e.at(1)), e, k == "nack-fail", 2,
                       jobs[e.at(0)].nacks);
            } else if (k == "extend-begin") {
                call c{&e};
                c.token = e.unum(1);
                c.lease = e.num(2);
                extends[detail::key2(e.at(0), e.at(1))] = c;
            } else if (k == "extend-end" || k == "extend-fail") {
                finish(extends, detail::key2(e.at(0), e.at(1)), e, k == "extend-fail", 2,
                       jobs[e.at(0)].extends);
            } else if (k == "bury-begin") {
                call c{&e};
                c.token = e.unum(1);
                buries[detail::key2(e.at(0), e.at(1))] = c;
            } else if (k == "bury-end" || k == "bury-fail") {
                finish(buries, detail::key2(e.at(0), e.at(1)), e, k == "bury-fail", 2,
                       jobs[e.at(0)].buries);
            } else if (k == "worker-retry") {
                r.counts["worker: retries (handler threw)"]++;
            } else if (k == "worker-dead") {
                r.counts["worker: dead letters (dead_letter or last attempt)"]++;
            } else if (k == "worker-lease-lost") {
                r.counts["worker: leases lost"]++;
                const auto it = last_settle.find(detail::key2(e.at(0), e.at(1)));
                if (it != last_settle.end() && it->second->kind.ends_with("-fail"))
                    jobs[e.at(0)].gave_up.push_back(
                        {it->second, &e, settle_fails[detail::key2(e.at(0), e.at(1))]});
            } else if (k == "handler-end") {
                r.counts["worker: handlers ended, " + e.at(2)]++;
                if (e.num(3) > 0) r.counts["worker: handlers that ran past their first lease"]++;
            } else if (k == "take-begin") {
                takes[e.at(0)] = &e;
            } else if (k == "take-end" || k == "take-fail") {
                auto it = takes.find(e.at(0));
                if (it != takes.end()) {
                    time_call(it->second, e, std::max(0LL, it->second->num(2)) * 1'000'000LL);
                    if (k == "take-fail") {
                        ++open_takes;
                        takes.erase(it);
                    } else {
                        take_ends[e.at(0)] = it->second;
                        takes.erase(it);
                        job_lines_due = e.num(1);
                    }
                }
            } else if (k == "job") {
                --job_lines_due;
                auto it = take_ends.find(e.at(0));
                detail::delivery d;
                d.begin = it != take_ends.end() ? it->second : nullptr;
                d.line = &e;
                d.attempts = e.num(2);
                d.token = e.unum(3);
                d.deadline = e.num(4);
                d.lease = e.num(5);
                if (d.begin != nullptr) jobs[e.at(1)].deliveries.push_back(d);
                r.counts["deliveries"]++;
            } else if (k == "die") {
                jobs[e.at(0)].dies.push_back(&e);
                r.counts["poison deaths"]++;
            } else if (k == "drain-end") {
                if (e.at(0) == "1") drain_end = &e;
            } else if (k == "crash") {
                crashes.push_back(&e);
            } else if (k == "kill") {
                r.counts["kills (SIGKILL)"]++;
            } else if (k == "stop") {
                r.counts["stops (SIGTERM)"]++;
            } else if (k == "server-kill") {
                r.counts["server kills (SIGKILL)"]++;
            } else if (k == "stall-begin") {
                r.counts["stalls"]++;
            } else if (k == "connection-kill-end") {
                r.counts["connection kills"]++;
                r.counts["connections killed"] += e.num(0);
            } else if (k == "open-begin") {
                opening = &e;
            } else if ((k == "open-end" || k == "open-fail") && opening != nullptr) {
                time_call(opening, e, 0);
                opening = nullptr;
            } else if (k == "size-begin") {
                sizing = &e;
            } else if ((k == "size-end" || k == "size-fail") && sizing != nullptr) {
                time_call(sizing, e, 0);
                sizing = nullptr;
            }
            if (k.starts_with("ack-") || k.starts_with("nack-") || k.starts_with("bury-")) {
                const std::string key = detail::key2(e.at(0), e.at(1));
                last_settle[key] = &e;
                if (k.ends_with("-fail")) ++settle_fails[key];
                if (k.ends_with("-end")) settle_fails[key] = 0;
            }
            if (k.size() > 5 && k.compare(k.size() - 5, 5, "-fail") == 0) {
                if (const char* why = excuse(e))
                    r.counts[std::string("calls failed by a ") + why]++;
                else
                    failures.push_back(&e);
            }
        }
        // What the process was in the middle of when it died.
        for (auto& [key, c] : puts) jobs[key].puts.push_back(c);
        for (auto& [key, c] : cancels) jobs[key].cancels.push_back(c);
        for (auto& [key, c] : acks) jobs[key.substr(0, key.find(' '))].acks.push_back(c);
        for (auto& [key, c] : nacks) jobs[key.substr(0, key.find(' '))].nacks.push_back(c);
        for (auto& [key, c] : extends) jobs[key.substr(0, key.find(' '))].extends.push_back(c);
        for (auto& [key, c] : buries) jobs[key.substr(0, key.find(' '))].buries.push_back(c);
        open_takes += static_cast<long long>(takes.size()) + (job_lines_due > 0 ? 1 : 0);
    }
    r.counts["takes a process died in or that threw"] = open_takes;

    for (const event* e : failures) add("call-failed", e->at(0), "a call threw", {e});
    for (const auto& [b, e] : late) {
        const long long took = e->mono - (e->call_start() != 0 ? e->call_start() : b->mono);
        const bool failed = e->kind.ends_with("-fail");
        add(failed ? "late-failure" : "late-return", e->at(0),
            std::string(failed ? "failed" : "returned") + " after " +
                std::to_string(took / 1'000'000) +
                " ms: longer than its timeout (plus its wait) + one connect (" +
                std::to_string(cs.connect_ms) + " ms) + " + std::to_string(cs.slack_ms) + " ms",
            {b, e});
    }
    if (over_max != LLONG_MIN) {
        r.counts["max call time over its timeout, ms"] = std::max(0LL, over_max / 1'000'000);
        if (over_max > 0)
            r.notes.push_back("the call longest over its timeout ended with: " + over_call->text);
    }
    for (const event* e : crashes) add("process-crashed", e->at(0), "a process died unasked", {e});
    if (!end.read)
        add("store-unreadable", "", "the store's state at the end could not be read", {});
    if (!end.integrity.empty() && end.integrity != "ok")
        add("integrity", "", "the store's integrity check: " + end.integrity, {});
    if (off_max - off_min > 50'000'000)
        r.notes.push_back("the system clock moved against CLOCK_MONOTONIC by " +
                          std::to_string((off_max - off_min) / 1'000'000) +
                          " ms during the run: an early delivery near a step may be a false one");
    const bool drained = drain_end != nullptr;
    if (!drained)
        r.notes.push_back("the drain did not empty the queue: jobs left are counted as queued");
    else if (end.read && !drain_end->at(1).empty() &&
             drain_end->num(1) != static_cast<long long>(end.dead.size()))
        add("store-unreadable", "",
            "the store's inspection found " + std::to_string(end.dead.size()) +
                " dead letters, the queue's dead_size() said " + drain_end->at(1),
            {drain_end});

    // Every lease counts against the limit, a series' runs' too; then a series is judged apart
    // (its runs share its id), and the rules of one job per id see the others.
    if (cs.max_leased > 0) detail::over_limit(jobs, cs.max_leased, r, add);
    std::map<std::string, detail::history> runs;
    for (auto it = jobs.begin(); it != jobs.end();)
        if (!it->first.empty() && it->first[0] == 'S') {
            runs.insert(jobs.extract(it++));
        } else {
            ++it;
        }
    detail::judge_series(series, runs, process_of, drain_end, open_takes, cs, r, add);

    const unsigned max = cs.max_attempts;
    for (auto& [id, h] : jobs) {
        std::vector<const event*> all;  // every line about the job, for the evidence
        for (auto* v : {&h.puts, &h.cancels, &h.acks, &h.nacks, &h.extends, &h.buries})
            for (const call& c : *v) {
                all.push_back(c.begin);
                if (c.end) all.push_back(c.end);
            }
        for (const auto& d : h.deliveries) all.insert(all.end(), {d.begin, d.line});
        all.insert(all.end(), h.dies.begin(), h.dies.end());
        std::sort(h.deliveries.begin(), h.deliveries.end(),
                  [](const auto& a, const auto& b) { return a.token < b.token; });

        const bool put_ok =
            std::any_of(h.puts.begin(), h.puts.end(), [](const call& c) { return c.ok(); });
        const bool queued = end.queued.count(id) != 0;
        const auto dead_it = end.dead.find(id);
        const bool dead = dead_it != end.dead.end();
        if (put_ok) r.counts["puts returned true"]++;
        if (put_ok && h.poison) r.counts["poison puts returned true"]++;
        if (dead) r.counts["dead at the end"]++;
        if (queued) r.counts["queued at the end"]++;

        for (const call& c : h.puts)
            if (c.result == 0)
                add("put-refused", id, "a put of an id never put before returned false",
                    {c.begin, c.end});
        if (!h.known && (queued || dead || !h.deliveries.empty()))
            add("phantom", id, "a job that no process put", all);

        // Removed by a call that returned true, or may have been by one a process died in.
        bool maybe_removed = false;
        for (const call& c : h.acks) maybe_removed |= c.ok() || c.open() || c.failed;
        for (const call& c : h.cancels) maybe_removed |= c.ok() || c.open() || c.failed;
        if (put_ok && end.read && !maybe_removed && !queued && !dead)
            add("lost", id,
                "its put returned true; it was never acked or cancelled, is not dead and not "
                "queued",
                all);

        // The calls that need the lease and returned true: ack, nack, bury (which let it go)
        // and extend (which keeps it).
        std::vector<const call*> acked, settled, buried;
        for (const call& c : h.acks)
            if (c.ok()) acked.push_back(&c), settled.push_back(&c);
        for (const call& c : h.nacks)
            if (c.ok()) settled.push_back(&c);
        for (const call& c : h.buries)
            if (c.ok()) buried.push_back(&c), settled.push_back(&c);
        for (const call& c : h.extends)
            if (c.ok()) settled.push_back(&c);
        r.counts["acks returned true"] += static_cast<long long>(acked.size());
        r.counts["buries returned true"] += static_cast<long long>(buried.size());
        for (const call& c : h.extends) {
            if (c.ok()) r.counts["extends returned true"]++;
            if (c.result == 0) r.counts["extends returned false"]++;
        }
        if (acked.size() > 1) add("acked-twice", id, "two acks returned true", all);

        // cancel() returned true after the put returned: nothing may hand it out or settle it
        // afterwards, and it must be gone at the end.
        for (const call& c : h.cancels) {
            if (!c.ok()) continue;
            r.counts["cancels returned true"]++;
            const bool put_before = std::any_of(h.puts.begin(), h.puts.end(), [&](const call& p) {
                return p.ok() && p.end->mono < c.begin->mono;
            });
            if (!put_before) continue;
            for (const auto& d : h.deliveries)
                if (d.begin->mono > c.end->mono)
                    add("ran-after-cancel", id,
                        "handed out by a take that began after cancel() returned true",
                        {h.puts.front().begin, h.puts.front().end, c.begin, c.end, d.begin,
                         d.line});
            for (const call* s : settled)
                if (s->begin->mono > c.end->mono)
                    add("settled-after-cancel", id,
                        "an ack, nack, extend or bury that began after cancel() returned true "
                        "returned true",
                        {c.begin, c.end, s->begin, s->end});
            if (queued || dead)
                add("cancelled-came-back", id,
                    std::string("cancel() returned true, yet it is ") +
                        (queued ? "queued" : "dead") + " at the end",
                    all);
        }
        if (!acked.empty()) {
            const call& a = *acked.front();
            for (const auto& d : h.deliveries)
                if (d.begin->mono > a.end->mono)
                    add("acked-came-back", id,
                        "handed out by a take that began after ack() returned true",
                        {a.begin, a.end, d.begin, d.line});
            if (queued || dead)
                add("acked-came-back", id,
                    std::string("ack() returned true, yet it is ") + (queued ? "queued" : "dead") +
                        " at the end",
                    all);
        }

        for (const call* b : buried) {
            for (const auto& d : h.deliveries)
                if (d.begin->mono > b->end->mono)
                    add("buried-came-back", id,
                        "handed out by a take that began after bury() returned true",
                        {b->begin, b->end, d.begin, d.line});
            if (end.read && (queued || !dead))
                add("buried-came-back", id,
                    std::string("bury() returned true, yet it is ") +
                        (queued ? "queued" : "not among the dead letters") + " at the end",
                    all);
        }

        // Fencing: a call that needs the lease and returned true must hold the newest lease.
        for (const call* s : settled)
            for (const auto& d : h.deliveries)
                if (d.token > s->token && d.line->mono < s->begin->mono)
                    add("fencing", id,
                        "an ack, nack, extend or bury with token " + std::to_string(s->token) +
                            " returned true after a newer lease (token " + std::to_string(d.token) +
                            ") had been handed out",
                        {d.begin, d.line, s->begin, s->end});

        // What the logs prove of a lease's end, by the store's clock, as its extends moved it.
        // The chaos never shortens a lease (an extend asks for the queue's lease or more, after
        // the take), so an extend of unknown outcome can only have made it longer.
        // - At least: the take's lease end, or a successful extend's begin stamp + its lease (the
        //   store read its clock after the call began; - 1 ms: it reads it in whole ms).
        // - At most, for a call that began at `before` (mono): the take's lease end, or a
        //   successful extend's end stamp + its lease, of the extends begun before; none if an
        //   extend of unknown outcome began before.
        constexpr long long store_ms = 1'000'000;
        const auto lease_at_least = [&](const detail::delivery& d, const call* x) {
            return std::max(d.lease, x->begin->real - store_ms + x->lease * 1'000'000LL);
        };
        // (Not `h` itself: clang 14 cannot capture a structured binding.)
        const auto& extends = h.extends;
        const auto lease_at_most = [&](const detail::delivery& d, const call& c) {
            long long most = d.lease;
            for (const call& x : extends) {
                if (&x == &c || x.token != d.token || x.begin->mono >= c.begin->mono ||
                    x.result == 0)
                    continue;
                if (!x.ok()) return LLONG_MAX;
                most = std::max(most, x.end->real + x.lease * 1'000'000LL);
            }
            return most;
        };

        // A call that needs the lease and began after it ended (by the store's clock) must be
        // refused.
        for (const call* s : settled)
            for (const auto& d : h.deliveries)
                if (const long long most = lease_at_most(d, *s);
                    d.token == s->token && s->begin->real >= most)
                    add("settled-after-lease", id,
                        "an ack, nack, extend or bury that began " +
                            std::to_string((s->begin->real - most) / 1000) +
                            " us after its lease ended (as its take and extends reported) "
                            "returned true",
                        {d.begin, d.line, s->begin, s->end});

        // A lease that held is not refused: a call that ended before the lease could have
        // ended (its take's lease, or a successful extend's) returns true, unless something let
        // it go first (an ack, nack or bury of it not refused, a cancel not refused).
        for (const auto& d : h.deliveries)
            for (auto* v : {&h.acks, &h.nacks, &h.extends, &h.buries})
                for (const call& c : *v) {
                    if (c.token != d.token || c.result != 0) continue;
                    long long least = d.lease;
                    const call* by = nullptr;
                    for (const call& x : h.extends)
                        if (x.token == d.token && x.ok() && x.end->mono < c.begin->mono &&
                            lease_at_least(d, &x) > least)
                            least = lease_at_least(d, &x), by = &x;
                    if (c.end->real >= least) continue;
                    bool let_go = false;
                    for (auto* w : {&h.acks, &h.nacks, &h.buries})
                        for (const call& o : *w)
                            let_go |= &o != &c && o.token == d.token && o.result != 0 &&
                                      o.begin->mono < c.end->mono;
                    for (const call& o : h.cancels)
                        let_go |= o.result != 0 && o.begin->mono < c.end->mono;
                    if (let_go) continue;
                    std::vector<const event*> ev{d.begin, d.line, c.begin, c.end};
                    if (by) ev.insert(ev.end(), {by->begin, by->end});
                    add("refused-while-held", id,
                        c.begin->kind.substr(0, c.begin->kind.find('-')) + " returned false " +
                            std::to_string((least - c.end->real) / 1000) +
                            " us before its lease could have ended (" +
                            (by ? "as an extend that returned true made it" : "as its take said") +
                            "), with nothing that let it go",
                        ev);
                }

        // A worker tries a settlement that failed again while the lease holds: after the n-th
        // failure in a row it waits min(50 ms * 2^(n-1), 1 s), and gives up if the lease would
        // have ended by then. One that it gave up (lease_lost) right after a failure, when the
        // lease still held longer than that wait, as its take or an extend that returned true
        // before the failure proves, left a job it could still settle to come back at its
        // lease's end.
        for (const auto& [fail, lost, fails] : h.gave_up)
            for (const auto& d : h.deliveries) {
                if (d.token != fail->unum(1)) continue;
                long long least = d.lease;
                const call* by = nullptr;
                for (const call& x : h.extends)
                    if (x.token == d.token && x.ok() && x.end->mono < fail->mono &&
                        lease_at_least(d, &x) > least)
                        least = lease_at_least(d, &x), by = &x;
                long long wait = 50'000'000LL;  // ns
                for (long long n = 1; n < fails && wait < 1'000'000'000LL; ++n) wait *= 2;
                wait = std::min(wait, 1'000'000'000LL);
                if (lost->real + wait + store_ms >= least) continue;
                std::vector<const event*> ev{d.begin, d.line, fail, lost};
                if (by) ev.insert(ev.end(), {by->begin, by->end});
                add("worker-gave-up", id,
                    "the worker gave a failed " + fail->kind.substr(0, fail->kind.find('-')) +
                        " up (lease_lost) " + std::to_string((least - lost->real) / 1'000'000) +
                        " ms before its lease could have ended (" +
                        (by ? "as an extend that returned true made it" : "as its take said") +
                        "), without trying it again",
                    ev);
            }

        // The worker settles nothing whose lease it saw refused (its handler may still run).
        const auto same_process = [&](const event& a, const event& b) {
            const auto pa = process_of.find(a.file), pb = process_of.find(b.file);
            if (pa == process_of.end() || pb == process_of.end()) return a.file == b.file;
            return pa->second == pb->second;
        };
        for (const call& x : h.extends) {
            if (x.result != 0) continue;
            for (auto* v : {&h.acks, &h.nacks, &h.buries})
                for (const call& c : *v)
                    if (c.token == x.token && same_process(*c.begin, *x.begin) &&
                        c.begin->mono > x.end->mono)
                        add("settled-lost-lease", id,
                            "settled by its holder after an extend of its lease was refused",
                            {x.begin, x.end, c.begin});
        }

        // Deliveries: one lease at a time, each an attempt, never early.
        std::set<unsigned long long> doubled;  // leases already reported as handed out twice
        for (std::size_t i = 0; i < h.deliveries.size(); ++i) {
            const auto& d = h.deliveries[i];
            if (d.line->real < d.deadline)
                add("early", id,
                    "handed out " + std::to_string((d.deadline - d.line->real) / 1000) +
                        " us before its deadline (the store's clock)",
                    {d.begin, d.line});
            if (h.known && d.line->real < h.due)
                add("early", id,
                    "handed out " + std::to_string((h.due - d.line->real) / 1000) +
                        " us before the due time it was put with",
                    all);
            for (const call& n : h.nacks)
                if (n.ok() && n.token < d.token && d.begin->mono > n.end->mono &&
                    d.line->real < n.begin->real + n.retry * 1'000'000LL)
                    add("early", id, "handed out again before its nack's retry_after passed",
                        {n.begin, n.end, d.begin, d.line});
            if (max > 0 && d.attempts > static_cast<long long>(max))
                add("too-many-deliveries", id,
                    "delivered with attempts " + std::to_string(d.attempts) + " > max_attempts " +
                        std::to_string(max),
                    all);
            if (i > 0) {
                const auto& p = h.deliveries[i - 1];
                if (p.token == d.token)
                    add("attempt-not-counted", id,
                        "one lease (token " + std::to_string(d.token) + ") handed out twice", all);
                else if (d.attempts <= p.attempts)
                    add("attempt-not-counted", id,
                        "a later lease (token " + std::to_string(d.token) + ") has attempts " +
                            std::to_string(d.attempts) + ", not more than the earlier's " +
                            std::to_string(p.attempts),
                        all);
            }
            for (std::size_t j = 0; j < i; ++j) {
                const auto& p = h.deliveries[j];
                if (p.token == d.token || d.line->real >= p.lease) continue;
                bool let_go = false;  // the earlier holder settled before this take returned
                for (auto* v : {&h.acks, &h.nacks})
                    for (const call& c : *v)
                        let_go |= c.token == p.token && c.begin->mono < d.line->mono;
                if (!let_go && !doubled.count(p.token)) {
                    doubled.insert(p.token);
                    add("double-lease", id,
                        "handed out again " + std::to_string((p.lease - d.line->real) / 1000) +
                            " us before the end of the lease an earlier take reported (token " +
                            std::to_string(p.token) + "), which no ack or nack had let go",
                        {p.begin, p.line, d.begin, d.line});
                }
            }
            // An extended lease is not handed to a second holder: an extend of an earlier lease
            // that returned true ran at a moment T >= its begin stamp (store's clock), when that
            // lease still held, so nothing newer had been handed out, and it made the lease end
            // at T + its lease. A later lease handed out (its take's end stamp) before the begin
            // stamp + the lease broke one or the other, unless the holder let it go (an ack, nack
            // or bury not refused, begun before the take returned). A holder killed meanwhile
            // changes nothing: its lease ends when the extend said.
            for (std::size_t j = 0; j < i; ++j) {
                const auto& p = h.deliveries[j];
                if (p.token == d.token || doubled.count(p.token)) continue;
                for (const call& x : h.extends) {
                    if (x.token != p.token || !x.ok()) continue;
                    const long long least = lease_at_least(p, &x);
                    if (d.line->real >= least) continue;
                    bool let_go = false;
                    for (auto* v : {&h.acks, &h.nacks, &h.buries})
                        for (const call& c : *v)
                            let_go |=
                                c.token == p.token && c.result != 0 && c.begin->mono < d.line->mono;
                    if (let_go) continue;
                    doubled.insert(p.token);
                    add("double-lease-extended", id,
                        "handed out again " + std::to_string((least - d.line->real) / 1000) +
                            " us before the end of a lease that an extend (" +
                            std::to_string(x.lease) + " ms, returned true) had moved (token " +
                            std::to_string(p.token) + "), which no ack, nack or bury had let go",
                        {p.begin, p.line, x.begin, x.end, d.begin, d.line});
                    break;
                }
            }
        }
        if (max > 0 && h.deliveries.size() > max)
            add("too-many-deliveries", id,
                std::to_string(h.deliveries.size()) + " deliveries logged, max_attempts " +
                    std::to_string(max),
                all);

        // bury() sends a job to the dead letters before max_attempts: a job whose bury returned
        // true, or may have been applied (it threw, or its process died in it), may be dead
        // after fewer attempts.
        const bool maybe_buried = std::any_of(h.buries.begin(), h.buries.end(), [](const call& c) {
            return c.ok() || c.open() || c.failed;
        });
        if (dead && maybe_buried) r.counts["dead by bury()"]++;
        if (dead && max > 0 && !maybe_buried) {
            long long seen = 0;
            for (const auto& d : h.deliveries) seen = std::max(seen, d.attempts);
            const long long recorded = dead_it->second;
            if (recorded >= 0 && recorded != static_cast<long long>(max))
                add(recorded < static_cast<long long>(max) ? "dead-too-early"
                                                           : "too-many-deliveries",
                    id,
                    "dead letter records " + std::to_string(recorded) + " attempts, max_attempts " +
                        std::to_string(max),
                    all);
            else if (static_cast<long long>(max) - seen > open_takes)
                add("dead-too-early", id,
                    "dead after " + std::to_string(seen) + " logged attempts (max_attempts " +
                        std::to_string(max) + "), more missing than takes went unlogged (" +
                        std::to_string(open_takes) + ")",
                    all);
        }
        if (h.poison && put_ok && drained && queued)
            add("poison-not-dead", id, "a poison job still queued after the queue was drained",
                all);
        if (h.poison && dead) r.counts["poison jobs dead"]++;
    }
    return r;
}

/// Prints `r`: a summary, then each violation with its evidence (at most `per_kind` of each kind
/// in full). `names[i]` names log i.
inline void print(std::FILE* out, const report& r, const std::vector<std::string>& names,
                  std::size_t per_kind = 5) {
    for (const auto& [what, n] : r.counts) std::fprintf(out, "  %-40s %lld\n", what.c_str(), n);
    for (const auto& n : r.notes) std::fprintf(out, "  note: %s\n", n.c_str());
    std::map<std::string, std::size_t> kinds;
    for (const auto& v : r.violations) ++kinds[v.kind];
    std::fprintf(out, "  violations: %zu\n", r.violations.size());
    for (const auto& [k, n] : kinds) std::fprintf(out, "    %-28s %zu\n", k.c_str(), n);
    std::map<std::string, std::size_t> shown;
    for (const auto& v : r.violations) {
        if (shown[v.kind]++ >= per_kind) continue;
        std::fprintf(out, "  VIOLATION %s %s: %s\n", v.kind.c_str(), v.id.c_str(), v.what.c_str());
        for (const event* e : v.evidence) {
            const std::string& name =
                e->file >= 0 && static_cast<std::size_t>(e->file) < names.size() ? names[e->file]
                                                                                 : "?";
            std::fprintf(out, "      %s:%zu: %s\n", name.c_str(), e->no, e->text.c_str());
        }
    }
}

}  // namespace delayq_chaos
