// The model-based fuzz driver shared by the two thread-free wheels: hashed_wheel and
// hierarchical_wheel, the cores of hashed_wheel_timer and hierarchical_timing_wheel without their
// worker thread.
//
// The model is a table of every task ever scheduled: its deadline, its state (pending, ran,
// cancelled) and the advance in which it was scheduled. After every operation:
// - pending() equals the number of model tasks still pending;
// - every held handle's pending()/expired()/cancelled() equals the model's state;
// - the clock also steps back (op 16), and a backward step makes nothing early or lost;
// - after an advance: every task that ran had deadline <= the time advanced to (never early);
//   every task scheduled before that advance has run if its deadline is at or before it (precise
//   wheels: not late at all), or at least one tick behind it (tick-rounded wheels; deadlines within
//   a tick of time_point::max() are "never");
//   the tasks of one advance ran in (deadline, schedule order), in both wheels;
// - cancel() returns true exactly for a pending task (one not started, also from a task of the same
//   pass), and that task never runs;
// - reschedule() moves exactly the pending tasks; periodic tasks (every missed-tick policy) run at
//   start + k * period as the model computes it, stay pending, and stop when cancelled, or after
//   the run whose successor would lie past time_point::max() (then they read expired()); a burst's
//   missed runs all happen in the advance that finds it late, right after its first run there;
// - stop() returns the still-pending tasks, earliest deadline first, and then every schedule
//   throws rejected_error, leaving the task untouched; so does a schedule at max_pending;
// - a task that throws reaches on_error, and the wheel carries on.
// Tasks are move-only and own a heap block, so ASan reports any task that is leaked or freed twice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <delayq/missed_tick.hpp>
#include <delayq/timeout.hpp>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "fuzz_common.hpp"

namespace delayq_fuzz {

enum class st : std::uint8_t { pending, ran, cancelled };

struct task_rec {
    time_point deadline;  // a periodic task's: its next run
    st state = st::pending;
    std::uint64_t born = 0;  // tasks born in advance k are checked for lateness after advance k+1
    bool throws = false;
    std::uint64_t seq = 0;  // schedule order (again at a reschedule or a periodic task's re-link)
    bool periodic = false;  // a periodic task stays pending until cancelled or its last run
    time_point start{};     // its grid: the k-th run is due at start + k * period
    rep period = 0;
    std::uint64_t k = 0;
    delayq::missed_tick policy = delayq::missed_tick::skip;
    delayq::timeout<mclock> keep;  // a burst's: a handle never dropped, to end a runaway burst
};

// A burst whose period is tiny beside a jump of the clock has billions of missed runs, all due in
// one advance: such a task cancels itself (through `keep`) after this many runs in a row.
inline constexpr std::size_t burst_cap = 64;

// The model's own arithmetic for a periodic task's next run after a run in a pass at `now`;
// nullopt past time_point::max() (that run was the last).
inline std::optional<time_point> model_next_run(task_rec& t, time_point now) {
    __extension__ typedef __int128 wide;
    const wide hi = std::numeric_limits<rep>::max();
    wide k = static_cast<wide>(t.k) + 1;  // 2^64 after a run late by the whole time line
    if (t.policy == delayq::missed_tick::delay) {
        if (static_cast<wide>(now.time_since_epoch().count()) + t.period > hi) return std::nullopt;
        t.start = sat_add(now, t.period);
        t.k = 0;
        return t.start;
    }
    if (t.policy == delayq::missed_tick::skip) {
        const wide late =
            static_cast<wide>(now.time_since_epoch().count()) - t.start.time_since_epoch().count();
        if (late >= 0) k = std::max<wide>(k, late / t.period + 1);
    }
    const wide v = static_cast<wide>(t.start.time_since_epoch().count()) + k * t.period;
    if (v > hi) return std::nullopt;
    t.k = static_cast<std::uint64_t>(k);
    return time_point{duration{static_cast<rep>(v)}};
}

struct ran_rec {
    std::uint64_t id;
    time_point deadline;
    std::uint64_t seq;
    bool rerun;  // a burst's missed run, right after the same task's run before it
};

struct world {
    std::vector<task_rec> tasks;
    std::vector<delayq::timeout<mclock>> handles;  // by task id; an empty handle once dropped
    std::vector<ran_rec> log;                      // what ran in the current advance
    std::size_t runs_in_a_row = 0;                 // of the task that ran last
    std::uint64_t next_seq = 0;
    std::uint64_t advances = 0;
    bool in_advance = false;
    time_point adv_now{};
    std::size_t errors_seen = 0;
    std::size_t errors_expected = 0;
    bool precise = false;

    std::size_t pending() const {
        return static_cast<std::size_t>(std::count_if(
            tasks.begin(), tasks.end(), [](const task_rec& t) { return t.state == st::pending; }));
    }
};

// What a task does when it runs. Move-only; owns a heap block. Runs inside the wheel's advance and
// may call back into it (cancel another task, schedule a child) through the world's hooks.
struct fuzz_task {
    world* w;
    std::uint64_t id;
    std::unique_ptr<int> block;
    std::int64_t cancel_target = -1;  // cancel this task's handle when run
    bool spawn = false;               // schedule a child when run
    rep child_delay = 0;

    void operator()();
};

struct hooks {
    std::function<void(std::uint64_t parent, std::int64_t target)> cancel;
    std::function<void(rep delay)> spawn;
};

inline hooks& the_hooks() {
    static hooks h;
    return h;
}

inline void fuzz_task::operator()() {
    FZ_CHECK(block && *block == static_cast<int>(id & 0x7fffffff));
    FZ_CHECK(w->in_advance);  // tasks run only inside advance, never inside schedule
    FZ_CHECK(w->tasks[id].state == st::pending);    // runs once, never after a cancel
    FZ_CHECK(w->tasks[id].deadline <= w->adv_now);  // never early
    task_rec& me = w->tasks[id];
    const bool rerun = !w->log.empty() && w->log.back().id == id;
    w->log.push_back(ran_rec{id, me.deadline, me.seq, rerun});
    w->runs_in_a_row = rerun ? w->runs_in_a_row + 1 : 1;
    if (!me.periodic) me.state = st::ran;
    const bool throws = me.throws;
    if (cancel_target >= 0) the_hooks().cancel(id, cancel_target);
    if (spawn) the_hooks().spawn(child_delay);
    task_rec& again = w->tasks[id];  // the hooks may have grown the table
    if (again.keep && again.state == st::pending && w->runs_in_a_row >= burst_cap) {
        FZ_CHECK(again.keep.cancel());  // from inside its run: it runs no more
        again.state = st::cancelled;
    }
    if (again.periodic && again.state == st::pending) {  // re-linked at its next run
        if (const std::optional<time_point> next = model_next_run(again, w->adv_now)) {
            again.deadline = *next;
            again.seq = w->next_seq++;
            // checked after this advance: a run due at it (a burst's) happens in it
            again.born = w->advances - 1;
        } else {
            again.state = st::ran;  // its last run
        }
    }
    if (throws) {
        ++w->errors_expected;
        throw std::runtime_error("fuzz task throws");
    }
}

// Late. Precise: the first advance at or after the deadline runs it (deadline <= now).
// Tick-rounded: deadline + tick <= now, with deadline + tick not overflowing (else "never").
inline bool must_have_run(time_point deadline, rep tick, time_point now, bool precise) {
    if (precise) return deadline <= now;
    rep sum;
    if (__builtin_add_overflow(deadline.time_since_epoch().count(), tick, &sum)) return false;
    return sum <= now.time_since_epoch().count();
}

// next_expiry(): nullopt exactly when nothing is pending; else never later than the earliest
// pending deadline (precise) or its tick boundary (tick-rounded: < deadline + tick), unless that is
// behind the clock already. So a driver that sleeps until next_expiry() is never late.
template <class Wheel>
void check_next_expiry(const Wheel& wh, const world& w, rep tick) {
    const auto ne = wh.next_expiry();
    FZ_CHECK(ne.has_value() == (w.pending() != 0));
    if (!ne) return;
    time_point earliest = time_point::max();
    for (const auto& t : w.tasks)
        if (t.state == st::pending) earliest = std::min(earliest, t.deadline);
    const time_point bound = w.precise ? earliest : sat_add(earliest, tick - 1);
    FZ_CHECK(*ne <= std::max(mclock::now(), bound));
}

// The driver. A adapts one wheel:
//   using wheel;
//   static std::unique_ptr<wheel> make(FuzzedDataProvider&, rep tick, std::size_t max_pending,
//                                      on_error, bool precise);
//   static void advance(wheel&, world&) (runs what is due at mclock::now());
//   static std::size_t pending(const wheel&);
//   static time_point usable_start(time_point, rep tick) (where the clock may start).
template <class A>
void run_wheel(FuzzedDataProvider& in) {
    using wheel = typename A::wheel;
    const time_point start = pick_start(in);
    const rep tick = in.ConsumeIntegralInRange<rep>(1, 1000);
    mclock::set(A::usable_start(start, tick));
    const std::size_t max_pending =
        in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<std::size_t>(1, 16);
    world w;
    auto on_error = [&w](std::exception_ptr e) {
        try {
            std::rethrow_exception(e);
        } catch (const std::runtime_error&) {
            ++w.errors_seen;
        }
    };
    const bool precise = in.ConsumeBool();
    w.precise = precise;
    std::unique_ptr<wheel> wh = A::make(in, tick, max_pending, on_error, precise);
    bool stopped = false;

    auto new_task = [&]() -> fuzz_task {
        const std::uint64_t id = w.tasks.size();
        return fuzz_task{&w, id, std::make_unique<int>(static_cast<int>(id & 0x7fffffff))};
    };
    // schedules t at deadline (via schedule_at, or schedule(delay) when `delay` is given)
    auto schedule = [&](fuzz_task t, time_point deadline, std::optional<rep> delay, bool throws) {
        const std::uint64_t id = t.id;
        const bool full = max_pending != 0 && w.pending() >= max_pending;
        try {
            delayq::timeout<mclock> h = delay ? wh->schedule(std::move(t), duration{*delay})
                                              : wh->schedule_at(std::move(t), deadline);
            FZ_CHECK(!stopped && !full);
            FZ_CHECK(h.deadline() == deadline);
            FZ_CHECK(h.pending());
            task_rec rec{};
            rec.deadline = deadline;
            rec.born = w.advances;
            rec.throws = throws;
            rec.seq = w.next_seq++;
            w.tasks.push_back(rec);
            w.handles.push_back(std::move(h));
        } catch (const delayq::rejected_error&) {
            FZ_CHECK(stopped || full);
            FZ_CHECK(t.block && *t.block == static_cast<int>(id & 0x7fffffff));  // left untouched
        }
    };
    the_hooks().cancel = [&](std::uint64_t, std::int64_t target) {
        auto& h = w.handles[static_cast<std::size_t>(target)];
        if (!h) return;
        task_rec& t = w.tasks[static_cast<std::size_t>(target)];
        const bool r = h.cancel();
        FZ_CHECK(r == (t.state == st::pending));  // cancellable until it starts
        if (r) {
            FZ_CHECK(t.state == st::pending);
            t.state = st::cancelled;
        }
    };
    the_hooks().spawn = [&](rep delay) {
        const time_point d = sat_add(mclock::now(), delay);
        schedule(new_task(), d, std::nullopt, false);
    };

    auto check_handle = [&](std::size_t i) {
        const auto& h = w.handles[i];
        if (!h) return;
        const st s = w.tasks[i].state;
        FZ_CHECK(h.pending() == (s == st::pending));
        FZ_CHECK(h.expired() == (s == st::ran));
        FZ_CHECK(h.cancelled() == (s == st::cancelled));
        FZ_CHECK(h.deadline() == w.tasks[i].deadline);
    };

    auto advance = [&] {
        ++w.advances;
        w.adv_now = mclock::now();
        w.in_advance = true;
        A::advance(*wh, w);
        w.in_advance = false;
        // the heap's order, among each task's first run of the advance; a burst's further runs
        // follow its first, on its grid
        const ran_rec* prev = nullptr;
        for (std::size_t i = 0; i < w.log.size(); ++i) {
            const ran_rec& b = w.log[i];
            if (b.rerun) {
                FZ_CHECK(w.tasks[b.id].policy == delayq::missed_tick::burst);
                FZ_CHECK(w.log[i - 1].deadline < b.deadline);
                continue;
            }
            if (prev)
                FZ_CHECK(prev->deadline < b.deadline ||
                         (prev->deadline == b.deadline && prev->seq < b.seq));
            prev = &b;
        }
        for (std::size_t i = 0; i < w.tasks.size(); ++i) {
            task_rec& t = w.tasks[i];
            if (t.state == st::pending && t.born < w.advances)
                FZ_CHECK(!must_have_run(t.deadline, tick, w.adv_now, precise));
        }
        FZ_CHECK(w.errors_seen == w.errors_expected);
        check_next_expiry(*wh, w, tick);
        w.log.clear();
    };

    while (in.remaining_bytes() > 0) {
        const int op = in.ConsumeIntegralInRange<int>(0, 18);
        auto pick_id = [&]() -> std::size_t {
            return in.ConsumeIntegralInRange<std::size_t>(0, w.tasks.size() - 1);
        };
        switch (op) {
            case 0:
            case 1:
            case 2:
            case 3:
            case 4: {  // schedule
                const bool by_delay = in.ConsumeBool();
                const time_point now = mclock::now();
                time_point d = pick_deadline(in, now, tick);
                std::optional<rep> delay;
                if (by_delay) {
                    // the delay that gives d, saturating, as schedule() computes it
                    const rep nd = now.time_since_epoch().count();
                    rep diff;
                    if (__builtin_sub_overflow(d.time_since_epoch().count(), nd, &diff))
                        diff = d > now ? std::numeric_limits<rep>::max()
                                       : std::numeric_limits<rep>::min();
                    delay = diff;
                    d = sat_add(now, diff);
                }
                const int flags = in.ConsumeIntegralInRange<int>(0, 15);
                fuzz_task t = new_task();
                const bool throws = flags == 1;
                if (flags == 2 && !w.tasks.empty())
                    t.cancel_target = static_cast<std::int64_t>(pick_id());
                if (flags == 3)
                    t.cancel_target = static_cast<std::int64_t>(w.tasks.size());  // itself
                if (flags == 4) {
                    t.spawn = true;
                    t.child_delay = in.ConsumeIntegralInRange<rep>(-2 * tick, 4 * tick);
                }
                schedule(std::move(t), d, delay, throws);
                break;
            }
            case 5:
            case 6:
            case 7:  // move the clock and advance
                mclock::advance(duration{pick_advance(in, tick)});
                advance();
                break;
            case 8:  // move the clock only
                mclock::advance(duration{pick_advance(in, tick)});
                break;
            case 9:  // advance only
                advance();
                break;
            case 10:
            case 11: {  // cancel, through the handle or a copy of it
                if (w.tasks.empty()) break;
                const std::size_t i = pick_id();
                if (!w.handles[i]) break;
                const bool expect = w.tasks[i].state == st::pending;
                const bool r = in.ConsumeBool() ? w.handles[i].cancel()
                                                : delayq::timeout<mclock>(w.handles[i]).cancel();
                FZ_CHECK(r == expect);
                if (r) w.tasks[i].state = st::cancelled;
                FZ_CHECK(!w.handles[i].cancel());  // a second cancel finds nothing
                break;
            }
            case 12: {  // drop a handle (the task stays scheduled)
                if (w.tasks.empty()) break;
                w.handles[pick_id()] = delayq::timeout<mclock>{};
                break;
            }
            case 13: {                                                 // stop()
                if (in.ConsumeIntegralInRange<int>(0, 3) != 0) break;  // mostly: the run goes on
                std::vector<delayq::timeout<mclock>> rest = wh->stop();
                std::vector<time_point> expect;
                for (auto& t : w.tasks) {
                    if (t.state == st::pending) {
                        expect.push_back(t.deadline);
                        t.state = st::cancelled;
                    }
                }
                std::sort(expect.begin(), expect.end());
                FZ_CHECK(rest.size() == expect.size());
                for (std::size_t i = 0; i < rest.size(); ++i) {
                    FZ_CHECK(rest[i].deadline() == expect[i]);
                    FZ_CHECK(rest[i].cancelled());
                    FZ_CHECK(!rest[i].cancel());
                }
                stopped = true;
                break;
            }
            case 14: {  // destroy the wheel (handles outlive it) and start a new one
                if (in.ConsumeIntegralInRange<int>(0, 3) != 0) break;
                wh.reset();
                for (auto& t : w.tasks)
                    if (t.state == st::pending) t.state = st::cancelled;
                for (std::size_t i = 0; i < w.handles.size(); ++i) {
                    check_handle(i);
                    FZ_CHECK(!w.handles[i].cancel());
                }
                wh = A::make(in, tick, max_pending, on_error, precise);
                stopped = false;
                break;
            }
            case 16: {  // the clock steps back (an NTP step; manual_clock::set), maybe advance
                const rep back = pick_advance(in, tick);
                mclock::set(
                    sat_add(mclock::now(), back == std::numeric_limits<rep>::min() ? 0 : -back));
                if (in.ConsumeBool()) advance();
                break;
            }
            case 17: {  // reschedule a task, through its handle
                if (w.tasks.empty()) break;
                const std::size_t i = pick_id();
                if (!w.handles[i]) break;
                task_rec& t = w.tasks[i];
                const time_point d = pick_deadline(in, mclock::now(), tick);
                const bool r = w.handles[i].reschedule_at(d);
                FZ_CHECK(r == (t.state == st::pending));  // outside a pass nothing is running
                if (r) {
                    t.deadline = d;
                    t.seq = w.next_seq++;
                    t.born = w.advances;
                    if (t.periodic) {
                        t.start = d;
                        t.k = 0;
                    }
                }
                FZ_CHECK(w.handles[i].deadline() == t.deadline);
                break;
            }
            case 18: {  // a periodic task
                const time_point first = pick_deadline(in, mclock::now(), tick);
                const rep period = in.ConsumeBool() ? in.ConsumeIntegralInRange<rep>(1, 4 * tick)
                                                    : in.ConsumeIntegralInRange<rep>(
                                                          1, std::numeric_limits<rep>::max());
                const auto policy =
                    static_cast<delayq::missed_tick>(in.ConsumeIntegralInRange<int>(0, 2));
                const int flags = in.ConsumeIntegralInRange<int>(0, 7);
                fuzz_task t = new_task();
                const std::uint64_t id = t.id;
                if (flags == 3) t.cancel_target = static_cast<std::int64_t>(id);  // stops itself
                if (flags == 4) {
                    t.spawn = true;
                    t.child_delay = in.ConsumeIntegralInRange<rep>(-2 * tick, 4 * tick);
                }
                const bool full = max_pending != 0 && w.pending() >= max_pending;
                try {
                    delayq::timeout<mclock> h =
                        wh->schedule_every_at(std::move(t), first, duration{period}, policy);
                    FZ_CHECK(!stopped && !full);
                    FZ_CHECK(h.deadline() == first && h.pending());
                    task_rec rec{};
                    rec.deadline = first;
                    rec.born = w.advances;
                    rec.throws = flags == 1;
                    rec.seq = w.next_seq++;
                    rec.periodic = true;
                    rec.start = first;
                    rec.period = period;
                    rec.policy = policy;
                    if (policy == delayq::missed_tick::burst) rec.keep = h;
                    w.tasks.push_back(rec);
                    w.handles.push_back(std::move(h));
                } catch (const delayq::rejected_error&) {
                    FZ_CHECK(stopped || full);
                    FZ_CHECK(t.block &&
                             *t.block == static_cast<int>(id & 0x7fffffff));  // left untouched
                }
                break;
            }
            default: {  // check a few handles
                for (int k = 0; k < 4 && !w.tasks.empty(); ++k) check_handle(pick_id());
                break;
            }
        }
        FZ_CHECK(A::pending(*wh) == w.pending());
    }
    for (std::size_t i = 0; i < w.handles.size(); ++i) check_handle(i);
    wh.reset();  // cancels and destroys what is pending
    for (std::size_t i = 0; i < w.handles.size(); ++i) FZ_CHECK(!w.handles[i].cancel());
    the_hooks() = hooks{};
}

}  // namespace delayq_fuzz
