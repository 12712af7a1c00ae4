// The taker: how the threads of one job-queue object wait for due jobs, the same for every store.
//
// The idea, Java's DelayQueue over a store. The object knows, for each lane of its store (a Redis
// shard; the one table of SQLite and PostgreSQL), a time before which nothing there is due: the
// lane's `next`. A take claims from a lane whose `next` has come; when none has, one waiting take,
// the leader, sleeps on the store's wake source until the earliest `next` or its own limit, and
// the others, the followers, sleep on a condition variable and are woken one at a time. So a
// process asks its store only when something may be due, however many threads take.
//
// What moves `next`:
// - a claim's answer (learn): the lane's next event as the store saw it, and also every news heard
//   while that answer was on its way (a claim's `floor`): an answer must not move a lane's `next`
//   past a put that came after it, or that job would wait for the next recheck;
// - news (hint): a put in this process, a message from the store's wake source (Redis PUBLISH,
//   PostgreSQL NOTIFY) lowers `next`, never raises it;
// - forgetting: when wakes may have been missed (the wake source opened anew, a recheck found a
//   foreign change, a child after fork()), every lane is looked at again.
//
// The store (the `store` concept below) claims, says when a lane's next event is, and, if it has
// one, waits on its wake source. The rest is here, once:
// - (I1) at most one leader; only the leader opens and waits on the wake source;
// - (I2) a take that a claim in flight counts never leaves before the answer, so no job is ever
//   leased to a take that has gone;
// - (I3) no wake is lost: every wake is a change of state under m_, and a leader asleep past it is
//   interrupted (a byte in a pipe its wait polls, or a notify);
// - (I4) every take that a failed claim answers gets an exception object of its own;
// - (I5) a take past its limit (and a take that does not wait) claims only from a lane that is due
//   and unclaimed, and each answer moves its lane past now unless the store says more is due now:
//   it returns within max_wait plus a few claims plus one opening of the wake source, each
//   bounded by the store's own timeout;
// - (I6) nobody holds the leader's post across a claim: a claim on a hung lane never stops the wake
//   source from being read;
// - (I7) a child after fork() starts with no leader, no followers, no claims in flight, every lane
//   unknown, and never touches the parent's descriptors.
//
// Lanes. A lane whose claim failed is set aside for a while (set_aside()), so that a sharded queue
// goes on serving from the others; with one lane, the failure is the caller's at once.
//
// Claiming for all (a store whose claim is one statement per round trip, PostgreSQL): the take
// that claims claims for every other waiting take too, in the order they came, and hands each its
// jobs. The others (Redis, SQLite) merge concurrent claims below the taker instead.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <stop_token>
#include <system_error>
#include <utility>
#include <vector>

#include "../../job.hpp"
#include "../fork.hpp"
#include "../time.hpp"
#include "../wait.hpp"
#include "unlocked.hpp"

namespace delayq::detail::job_queue {

/// What one claim on a lane found: the jobs it leased, and a time before which nothing in the lane
/// is due or ends (time_point::max(): nothing is queued; a time not after now: more is due now).
template <class Clock>
struct claimed {
    std::vector<job> jobs;
    typename Clock::time_point next = Clock::time_point::max();
};

/// News from a store's wake source: lane `lane` may have something due at `at`.
template <class Clock>
struct news {
    std::size_t lane = 0;
    typename Clock::time_point at;
};

/// What the taker needs of a store. Every member but the noexcept ones runs without the taker's
/// lock, and is bounded by the store's own timeout.
template <class S>
concept store = requires(S& s, const S& cs, std::size_t n, bool patient,
                         const std::exception_ptr& e) {
    typename S::clock;
    { S::external_wake } -> std::convertible_to<bool>;     // a wake source outside the process
    { S::claim_for_all } -> std::convertible_to<bool>;     // the claimer claims for every take
    { S::look_on_entry } -> std::convertible_to<bool>;     // a take asks before it trusts `next`
    { S::claim_cap } -> std::convertible_to<std::size_t>;  // the most jobs of one claim
    { S::wake_losses_per_take } -> std::convertible_to<unsigned>;
    { cs.lanes() } -> std::convertible_to<std::size_t>;
    { s.claim(n, n, patient) } -> std::same_as<claimed<typename S::clock>>;
    { cs.recheck_every() } -> std::convertible_to<typename S::clock::duration>;
    { s.changed_elsewhere() } -> std::convertible_to<bool>;
    { S::copy_error(e) }
    noexcept->std::same_as<std::exception_ptr>;
    { S::lane_failure(e) }
    noexcept->std::convertible_to<bool>;
    { s.drop_inherited() }
    noexcept;
};

/// A store with a wake source outside the process: open_wake() (re)opens it, throwing when it
/// cannot; wait_wake(until, poke, heard, may_lose) waits until `until`, news (appended to
/// `heard`) or a byte in the pipe `poke`, and returns false when the source was lost (or throws
/// that loss when !may_lose).
template <class S>
concept waking_store = store<S> &&
    requires(S& s, typename S::clock::time_point t, std::vector<news<typename S::clock>>& heard) {
    s.open_wake();
    { s.wait_wake(t, 0, heard, true) } -> std::convertible_to<bool>;
};

template <store S>
requires(!S::external_wake || waking_store<S>) class taker {
  public:
    using clock = typename S::clock;
    using time_point = typename clock::time_point;

    explicit taker(S& s) : s_(s), lanes_(s.lanes()) {}
    taker(const taker&) = delete;
    taker& operator=(const taker&) = delete;
    ~taker() { close_pipe(); }

    // Leases up to `want` due jobs of one lane, waiting up to `max_wait` for the first; none
    // after max_wait, or once `stop` is requested (the take is woken: a follower by its condition
    // variable, the leader by a poke). Throws the store's errors (to this take alone, or to every
    // take of a failed claim for all, each its own copy).
    std::vector<job> take(std::size_t want, std::chrono::milliseconds max_wait,
                          const std::stop_token& stop = {}) {
        const bool waits = max_wait > std::chrono::milliseconds::zero();
        const time_point limit = waits ? saturating_add(clock::now(), max_wait) : clock::now();
        // Before the lock: a stop requested already runs the callback here, which takes it.
        std::optional<std::stop_callback<waker>> on_stop;
        if (stop.stop_possible()) on_stop.emplace(stop, waker{this});
        std::unique_lock lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        request me;
        me.want = want;
        pending_.push_back(&me);
        struct leave {  // however the take ends, it no longer waits (I2: never while in a claim)
            taker& t;
            request& me;
            ~leave() {
                if (!me.done) t.finish(me);
            }
        } guard{*this, me};
        bool asked = !S::look_on_entry && waits;  // whether `next` may say "nothing due" yet
        unsigned losses = 0;                      // of the wake source, in this take
        for (;;) {
            if (me.done) {
                if (me.error) std::rethrow_exception(me.error);
                return std::move(me.jobs);
            }
            if (me.in_claim) {  // another take claims for this one (I2)
                detail::wait(cv_, lk);
                continue;
            }
            if (stop.stop_requested()) return {};
            const time_point now = clock::now();
            if constexpr (S::external_wake) {
                // A waiting take listens before it looks: opening the wake source forgets every
                // lane, so a claim made before it would be made again at once, and news sent
                // between the two would be lost.
                if (waits && !wake_open_ && now < limit) {
                    if (leader_ == nullptr) {
                        leader_ = &me;
                        open(lk);
                    } else {  // another take opens it
                        follow(lk, me, limit);
                    }
                    continue;
                }
            }
            bool patient = true;
            if (const auto l = pick(now, !asked, patient)) {
                claim(lk, me, *l, patient, waits);
                asked = true;
                continue;
            }
            if (!waits || now >= limit) {
                // A follower woken to take the post at the moment its time ran out hands it on.
                if (leader_ == nullptr && followers_ > 0) cv_.notify_one();
                return {};
            }
            if (leader_ != nullptr) {
                follow(lk, me, limit);
                continue;
            }
            lead(lk, me, limit, now, losses);
        }
    }

    // Runs `call(next)`, a store call that says when `lane`'s next event is (settling leases, say)
    // without the lock, and learns what it said, as from a claim.
    template <class F>
    auto learn_from(std::size_t lane, F&& call) {
        std::unique_lock lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        flight f{lane};
        depart(f);
        struct arrival {
            taker& t;
            flight& f;
            ~arrival() { t.arrive(f); }
        } guard{*this, f};
        time_point next = time_point::max();
        auto r = [&] {
            unlocked u(lk);
            return std::forward<F>(call)(next);
        }();
        learn_locked(lane, next, f.floor);
        return r;
    }

    // Whether a take now would rather claim from a lane other than `lane`: one that is due, that
    // a take may claim (no claim in flight there, or more due than those claim) and that is not
    // set aside, whose `next` is earlier than `lane`'s (pick()'s order). A store call that leases
    // from `lane` alone, beside the takes (ack_and_try_take on a sharded queue: the acked job's
    // shard), asks first and leaves the lease to a take when this is true: else a busy lane would
    // keep the consumers that settle its jobs while the jobs of lanes due earlier wait.
    bool other_lane_first(std::size_t lane) noexcept {
        std::lock_guard lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        if (lane >= lanes_.size()) return false;
        const time_point now = clock::now();
        const time_point mine = lanes_[lane].next;
        for (std::size_t l = 0; l < lanes_.size(); ++l)
            if (l != lane && lanes_[l].next < mine && claimable(lanes_[l], now)) return true;
        return false;
    }

    // `lane` may have something due at `at` (news from a write in this process).
    void hint(std::size_t lane, time_point at) noexcept {
        std::lock_guard lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        hear(lane, at);
        if (leader_waiting_) {
            if (at < leader_until_) interrupt();
        } else if (at <= clock::now() && followers_ > 0) {
            cv_.notify_one();
        }
    }

    // `lane`'s next event is `at`, as its store says now: for a store whose answers reach the
    // taker in the order the store gave them (SQLite's commits, under its own lock), so that the
    // last one is the truth and may move `next` later.
    void learn(std::size_t lane, time_point at) noexcept {
        std::lock_guard lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        for (flight* f = flights_; f != nullptr; f = f->next)
            if (f->lane == lane) f->floor = std::min(f->floor, at);
        learn_locked(lane, at, time_point::max());
    }

  private:
    // A take's stop callback: wakes every waiting take of the object (only the stopped one
    // leaves; the others find nothing new and sleep again), and the leader.
    struct waker {
        taker* t;
        void operator()() const noexcept {
            std::lock_guard lk(t->m_);
            t->cv_.notify_all();
            if (t->leader_waiting_) t->interrupt();
        }
    };

    // One waiting take (on its caller's stack): what it asks for and what it got.
    struct request {
        std::size_t want = 0;
        std::vector<job> jobs;
        bool in_claim = false;   // a claim in flight counts it: it waits for the answer
        bool following = false;  // counted in followers_: asleep, free to be woken for work
        bool done = false;       // jobs (or error) are its answer
        std::exception_ptr error;
    };

    // What the object knows of one lane.
    struct lane_state {
        time_point next = time_point::min();  // nothing here is due before
        int takers = 0;                       // claims in flight here
        bool backlog = false;                 // the last answer said more is due now
        // Claims here that failed in a row; while there are any, the lane is set aside until
        // `aside_until` (see set_aside()).
        unsigned failures = 0;
        time_point aside_until = time_point::min();
    };

    // A store call on its way whose answer will be learned: the earliest news heard for its lane
    // meanwhile (its floor).
    struct flight {
        std::size_t lane;
        time_point floor = time_point::max();
        flight* next = nullptr;
    };

    // Under m_: claims from lane `l` for `me`, and, for a store that claims for all, for every
    // other waiting take that is not in a claim, in the order they came, up to claim_cap.
    void claim(std::unique_lock<std::mutex>& lk, request& me, std::size_t l, bool patient,
               bool waits) {
        // The other takes this claim answers (a claim for all; else none, and nothing allocated).
        std::vector<request*> others;
        std::size_t total = me.want;
        if constexpr (S::claim_for_all) {
            if (waits)
                for (request* r : pending_)
                    if (r != &me && !r->in_claim && total < S::claim_cap) {
                        others.push_back(r);
                        total += r->want;
                        if (r->following) {  // no longer free: a wake for work must go elsewhere
                            r->following = false;
                            --followers_;
                        }
                    }
        }
        me.in_claim = true;
        for (request* r : others) r->in_claim = true;
        lane_state& lane = lanes_[l];
        ++lane.takers;
        // Another lane is due too and nobody claims it: one more take may (I3; else a follower
        // sleeps to its limit while that lane's jobs wait). Each such claimer wakes the next.
        if (followers_ > 0) {
            const time_point now = clock::now();
            for (const auto& other : lanes_)
                if (other.takers == 0 && other.next <= now &&
                    (other.failures == 0 || other.aside_until <= now)) {
                    cv_.notify_one();
                    break;
                }
        }
        flight f{l};
        depart(f);
        claimed<clock> got;
        std::exception_ptr failed;
        {
            unlocked u(lk);
            try {
                got = s_.claim(l, std::min(total, S::claim_cap), patient);
            } catch (...) {
                failed = std::current_exception();
            }
        }
        arrive(f);
        --lane.takers;
        me.in_claim = false;
        for (request* r : others) r->in_claim = false;
        if (failed) {
            set_aside(lane, clock::now());
            if (!others.empty()) cv_.notify_all();
            if (!patient && S::lane_failure(failed)) return;  // another lane may serve
            for (request* r : others) {                       // (I4) made before anyone wakes
                r->error = S::copy_error(failed);
                finish(*r);
            }
            std::rethrow_exception(failed);
        }
        learn_locked(l, got.next, f.floor);
        if (others.empty()) {  // the claim's jobs are the claimer's: no copy
            me.jobs = std::move(got.jobs);
            if (!me.jobs.empty()) finish(me);
            return;
        }
        // The claimer first, then the others in the order they came, each up to its want.
        std::size_t next = 0;
        const auto hand = [&](request& r) {
            while (next < got.jobs.size() && r.jobs.size() < r.want)
                r.jobs.push_back(std::move(got.jobs[next++]));
            if (!r.jobs.empty()) finish(r);
        };
        hand(me);
        for (request* r : others) hand(*r);
        cv_.notify_all();
    }

    // Under m_: `me` sleeps as a follower until woken or `limit`.
    void follow(std::unique_lock<std::mutex>& lk, request& me, time_point limit) {
        ++followers_;
        me.following = true;
        wait_until<clock>(cv_, lk, limit);
        if (me.following) {
            me.following = false;
            --followers_;
        } else if (followers_ > 0) {
            // Taken into a claim while asleep: a wake meant for a free follower may have come
            // here (one condition variable for both); pass it on.
            cv_.notify_one();
        }
    }

    // Under m_, as the leader (leader_ is free): waits on the wake source (or, for a store
    // without one, on leader_cv_) until something may be due, a wake, or `limit`; then gives up
    // the post (I6) and, when its time has come, asks the store whether another process changed it.
    void lead(std::unique_lock<std::mutex>& lk, request& me, time_point limit, time_point now,
              unsigned& losses) {
        leader_ = &me;
        if constexpr (S::external_wake) {
            if (!wake_open_) {
                open(lk);
                return;
            }
            leader_until_ = std::min(limit, wake_time(now));
            leader_waiting_ = true;
            heard_.clear();
            bool alive = true;
            try {
                unlocked u(lk);
                alive =
                    s_.wait_wake(leader_until_, poke_[0], heard_, losses < S::wake_losses_per_take);
                drain_pipe();
            } catch (...) {  // the wake source's last loss in this take: the caller's
                leader_waiting_ = false;
                leader_ = nullptr;
                wake_open_ = false;
                if (followers_ > 0) cv_.notify_one();
                throw;
            }
            leader_waiting_ = false;
            leader_ = nullptr;
            for (const auto& n : heard_) hear(n.lane, n.at);
            if (!alive) {
                wake_open_ = false;
                ++losses;
                forget_all();
            }
        } else {
            leader_until_ = std::min({limit, wake_time(now), recheck_at()});
            leader_waiting_ = true;
            wait_until<clock>(leader_cv_, lk, leader_until_);
            leader_waiting_ = false;
            leader_ = nullptr;
        }
        recheck(lk);
        if (followers_ > 0) cv_.notify_one();  // the post is free
    }

    // Under m_, as the leader: (re)opens the wake source; what was said before it opened is lost,
    // so every lane is looked at again. Gives up the post either way.
    void open(std::unique_lock<std::mutex>& lk) {
        struct hand_on {  // the others may try for themselves
            taker& t;
            ~hand_on() {
                t.leader_ = nullptr;
                t.cv_.notify_all();
            }
        } guard{*this};
        make_pipe();
        {
            unlocked u(lk);
            s_.open_wake();
        }
        wake_open_ = true;
        forget_all();
    }

    // Under m_: when the leader asks the store whether another process changed it.
    time_point recheck_at() const { return saturating_add(checked_, s_.recheck_every()); }

    void recheck(std::unique_lock<std::mutex>& lk) {
        const time_point now = clock::now();
        if (now < recheck_at()) return;
        checked_ = now;       // before unlocking: one thread asks
        bool changed = true;  // a look that failed: claim, and let the claim say what is wrong
        try {
            unlocked u(lk);
            changed = s_.changed_elsewhere();
        } catch (...) {
        }
        if (changed) forget_all();
    }

    // Under m_: what a store said of lane `l`'s next event (`at`), and the news heard while that
    // answer was on its way (`floor`), which it must not override (I3).
    void learn_locked(std::size_t l, time_point at, time_point floor) noexcept {
        const time_point now = clock::now();
        lane_state& lane = lanes_[l];
        lane.failures = 0;  // it answered: no longer set aside
        lane.aside_until = time_point::min();
        lane.next = std::min(at, floor);
        // The answer's own word, not the news': news of a job due now lets one take look (next),
        // an answer that more is due lets every take look (more claims in flight on the lane).
        lane.backlog = at <= now;
        if (lane.backlog)
            wake_one();  // more is due now: one more take may claim it
        else if (leader_waiting_ && lane.next < leader_until_)
            interrupt();  // the leader would sleep past it
    }

    // Under m_: news for lane `l`: something may be due at `at`.
    void hear(std::size_t l, time_point at) noexcept {
        if (l >= lanes_.size()) return;
        lanes_[l].next = std::min(lanes_[l].next, at);
        for (flight* f = flights_; f != nullptr; f = f->next)
            if (f->lane == l) f->floor = std::min(f->floor, at);
    }

    // Under m_: every lane is looked at again (a wake may have been missed).
    void forget_all() noexcept {
        const time_point now = clock::now();
        for (auto& lane : lanes_) lane.next = std::min(lane.next, now);
    }

    // Under m_: there is something to claim: one waiting take claims it.
    void wake_one() noexcept {
        if (followers_ > 0)
            cv_.notify_one();
        else if (leader_waiting_)
            interrupt();
    }

    // Under m_: brings the leader back from its wait.
    void interrupt() noexcept {
        if constexpr (S::external_wake) {
            if (poke_[1] >= 0) (void)!::write(poke_[1], "!", 1);  // full: poked already
        } else {
            leader_cv_.notify_one();
        }
    }

    // Under m_: a claim on `lane` failed (its node is down, a failover, a lost reply). Its `next`
    // is still in the past, so without this every take would pick it first, spend the store's
    // timeout there and throw, while the other lanes' jobs wait. So it is set aside for 100 ms,
    // doubling with each failure in a row up to 2 s (a failover takes seconds), and an answer
    // (learn_locked()) ends that.
    void set_aside(lane_state& lane, time_point now) noexcept {
        static constexpr std::chrono::milliseconds first(100), most(2000);
        const unsigned doublings = std::min(lane.failures, 5U);
        ++lane.failures;
        lane.aside_until = saturating_add(now, std::min(first * (1U << doublings), most));
        if (leader_waiting_ && lane.aside_until < leader_until_) interrupt();
    }

    // Under m_: the lane to claim from now: one whose `next` has come and that no claim is in
    // flight on (unless it said more is due), earliest first. With `first`, the take has not asked
    // yet: the earliest lane will do, due or not, claimed or not (a put by another process just
    // before this take may not have been heard yet). A lane set aside is skipped until its pause
    // ends, then tried by one take at a time. `patient` tells whether no other lane could serve
    // the take: only then may the claim wait for a failing node, and its failure end the take.
    // When every lane failed last time, the one likeliest to answer is tried at once, patiently.
    std::optional<std::size_t> pick(time_point now, bool first, bool& patient) const noexcept {
        const lane_state* best = nullptr;
        std::size_t serving = 0;  // lanes whose last claim did not fail
        for (const auto& lane : lanes_) {
            if (lane.failures == 0) ++serving;
            if (first ? held_aside(lane, now) : !claimable(lane, now)) continue;
            if (best == nullptr || lane.next < best->next) best = &lane;
        }
        if (serving == 0)
            for (const auto& lane : lanes_)  // fewest failures in a row, then the earliest end
                if (best == nullptr || lane.failures < best->failures ||
                    (lane.failures == best->failures && lane.aside_until < best->aside_until))
                    best = &lane;
        patient = best != nullptr && serving == (best->failures == 0 ? 1U : 0U);
        if (best == nullptr) return std::nullopt;
        return static_cast<std::size_t>(best - lanes_.data());
    }

    // A lane set aside after failures, until its pause ends; then one take at a time tries it.
    static bool held_aside(const lane_state& lane, time_point now) noexcept {
        return lane.failures > 0 && (lane.aside_until > now || lane.takers > 0);
    }

    // A lane that a take may claim from now (pick()'s rule once the take has asked): its `next`
    // has come, no claim is in flight on it (or the last said more is due), and it is not held
    // aside.
    static bool claimable(const lane_state& lane, time_point now) noexcept {
        return !held_aside(lane, now) && lane.next <= now && (lane.takers == 0 || lane.backlog);
    }

    // Under m_: when the leader should look again: the earliest `next` that has not come yet, or
    // the end of a lane's pause (a due lane that a claim is in flight on wakes it instead).
    time_point wake_time(time_point now) const noexcept {
        auto t = time_point::max();
        for (const auto& lane : lanes_) {
            const auto at = lane.failures > 0 ? std::max(lane.next, lane.aside_until) : lane.next;
            if (at > now) t = std::min(t, at);
        }
        return t;
    }

    // Under m_: `r` is answered and no longer waits.
    void finish(request& r) noexcept {
        r.done = true;
        std::erase(pending_, &r);
        // A claim for all answered the leader asleep on the wake source: its jobs are leased, so
        // it must not sleep on to its limit.
        if (&r == leader_ && leader_waiting_) interrupt();
    }

    // Under m_: `f` is on its way, and arrive(f) ends that (f may be gone from the list: a child
    // after fork() starts without the parent's flights).
    void depart(flight& f) noexcept {
        f.next = flights_;
        flights_ = &f;
    }
    void arrive(flight& f) noexcept {
        for (flight** at = &flights_; *at != nullptr; at = &(*at)->next)
            if (*at == &f) {
                *at = f.next;
                return;
            }
    }

    // Under m_: the pipe whose byte brings the leader back from wait_wake().
    void make_pipe() {
        if (poke_[0] >= 0) return;
        std::array<int, 2> fds{-1, -1};
        if (::pipe(fds.data()) != 0)
            throw std::system_error(errno, std::generic_category(),
                                    "delayq: cannot make a pipe for the waiting takes");
        for (int fd : fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        poke_ = fds;
    }
    void drain_pipe() noexcept {
        std::array<char, 64> sink{};
        while (poke_[0] >= 0 && ::read(poke_[0], sink.data(), sink.size()) > 0) {
        }
    }
    void close_pipe() noexcept {
        for (int& fd : poke_)
            if (fd >= 0) {
                ::close(fd);
                fd = -1;
            }
    }

    // Under m_, in a child process after fork() (I7): the leader, the followers and the claims in
    // flight are the parent's threads, which the child does not have; the wake source and the
    // pipe are the parent's too (a child that read them would take the parent's news). The
    // child's copies of the descriptors are closed; the parent's stay open. The condition
    // variables are made anew over the old ones, not destroyed: the parent's threads that waited
    // on them are counted in them, and their destruction would wait for those (glibc).
    void forget_the_parent() noexcept {
        new (&cv_) std::condition_variable;
        new (&leader_cv_) std::condition_variable;
        leader_ = nullptr;
        leader_waiting_ = false;
        followers_ = 0;
        pending_.clear();
        flights_ = nullptr;
        for (auto& lane : lanes_) lane = lane_state{};
        wake_open_ = false;
        heard_.clear();
        close_pipe();
        s_.drop_inherited();
        generation_ = fork_generation();
    }

    S& s_;
    std::mutex m_;
    std::condition_variable cv_;         // the followers, and the takes in a claim for all
    std::condition_variable leader_cv_;  // the leader of a store without a wake source
    std::vector<lane_state> lanes_;
    std::vector<request*> pending_;  // the waiting takes, in the order they came
    flight* flights_ = nullptr;      // the store calls on their way (see flight)
    const request* leader_ = nullptr;
    bool leader_waiting_ = false;
    time_point leader_until_ = time_point::max();
    int followers_ = 0;
    bool wake_open_ = false;
    std::vector<news<clock>> heard_;     // the leader's
    std::array<int, 2> poke_{-1, -1};    // a pipe: a byte in it brings the leader back
    time_point checked_ = clock::now();  // the last recheck
    unsigned generation_ = fork_generation();
};

}  // namespace delayq::detail::job_queue
