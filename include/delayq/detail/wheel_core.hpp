// wheel_core<Clock, Ring>: what both wheels share around their ring of buckets — the one lock, the
// node pool, schedule, cancel, running what is due, stop, and the sleep of whoever drives it. The
// Ring (hashed_wheel_ring or timing_wheel) only says where nodes sit and which are due; it has no
// lock and no thread. The driver (wheel_driver.hpp, or the user's event loop) calls advance().
//
// The idea, in one pass. advance(now) takes the lock, asks the ring for every node due at `now`,
// puts them in the heap's order (due_batch.hpp) and marks each as "in the batch" (prev ==
// run_marker()); then, without the lock, runs them one by one. Before each run it takes the lock
// to claim the node: a node cancelled meanwhile is no longer marked and is skipped. So a task stays
// cancellable until the moment it starts, in both wheels, and cancel() returning true always means
// the task never runs. Tasks scheduled by a task run in a later pass, so a pass does a bounded
// amount of work. A pass holds the core as an owner (timer_node.hpp): a task that destroys the
// timer ends the rest of the batch with the other tasks (stop()), and the pass frees the core as
// it ends, with nothing freed under it.
//
// Locking. One lock (a spin_lock: detail/spin_lock.hpp says why) guards the ring, the pool's
// allocation, the batch marks and the counts. Tasks run, and are destroyed, without it: a task may
// schedule, cancel, or stop the timer. A callable is moved into its node under the lock, so its
// move constructor must not call back into the timer. Sleeping needs a std::mutex: drivers and a
// pass waiting for another's turn sleep with sleep_m_, which is never taken inside the lock.
//
// Lifecycle (as Netty's states, checked the same way by every operation, under the lock):
// running -> stopped. schedule() after stop() throws rejected_error before it touches the task;
// advance() after stop() does nothing; stop() a second time returns nothing.
//
// Sleeping. A driver waits in wait_for_work() until the ring's next expiry. `wake_at_` is the
// latest time any waiter will wake by itself (time_point::min() when none sleeps); a schedule whose
// node comes out earlier than that notifies, any other schedule does not. With nothing pending a
// waiter sleeps without a deadline, so an idle timer never wakes. With spin_before_deadline = s, a
// waiter for a task's deadline d sleeps until d - s only, then waits on the CPU (yielding it) until
// d: the OS's wake-up latency (tens to hundreds of µs on a VM) is then paid before the deadline
// instead of after it, for at most s of CPU per wake-up. A notification (wake_drivers() counts them
// in wake_count_) ends the spin as it ends a sleep; a spin that lasts 2 s of real time without the
// deadline coming (a clock that does not move by itself, such as manual_clock) sleeps instead.
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../timeout.hpp"
#include "deadline_sort.hpp"
#include "due_batch.hpp"
#include "spin_lock.hpp"
#include "timer_node.hpp"
#include "wait.hpp"

namespace delayq::detail {

/// The address that marks a node as in the current batch (its prev).
inline node_links* run_marker() noexcept {
    static node_links marker{nullptr, nullptr};
    return &marker;
}

template <class Clock, class Ring>
class wheel_core final : public timer_core<Clock> {
  public:
    using node = timer_node<Clock>;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using on_error_fn = std::function<void(std::exception_ptr)>;

    /// What one advance() did: how many tasks ran, and whether the ring had anything to do (a
    /// bucket emptied, possibly of cancelled tasks only).
    struct pass {
        std::size_t ran = 0;
        bool worked = false;
    };

    /// `precise`: a task runs at its own deadline; else at its tick's boundary (the ring's grid).
    /// `spin`: how long before a task's deadline a waiting driver stops sleeping and spins (>= 0;
    /// see the top of this header); std::invalid_argument if negative.
    template <class... RingArgs>
    wheel_core(std::size_t max_pending, on_error_fn on_error, bool precise,
               std::chrono::nanoseconds spin, RingArgs&&... ring_args)
        : ring_(std::forward<RingArgs>(ring_args)...),
          max_pending_(max_pending),
          on_error_(std::move(on_error)),
          precise_(precise),
          spin_(valid_spin(spin)) {}

    /// Schedules `task` at `deadline`. Throws rejected_error (task untouched) when stopped or
    /// full; std::bad_alloc, or what moving the task throws, and then nothing is scheduled.
    template <class F>
    timeout<Clock> schedule_at(F&& task, time_point deadline) {
        return insert<node_with<Clock, std::decay_t<F>>>(deadline, std::forward<F>(task));
    }

    /// Schedules `task` to run at `first`, then every `period` after it, `policy` saying what a
    /// late run does to the next (missed_tick). As schedule_at(); std::invalid_argument for a
    /// period <= 0.
    template <class F>
    timeout<Clock> schedule_every(F&& task, time_point first, duration period, missed_tick policy) {
        if (period <= duration::zero()) throw std::invalid_argument("delayq: period must be > 0");
        return insert<node_with<Clock, periodic_task<Clock, std::decay_t<F>>>>(
            first, periodic_part<Clock>{first, period, 0, policy}, std::forward<F>(task));
    }

    // Called only through a handle (timeout::cancel), whose reference outlives the call: so the
    // timer's reference, dropped here, is never the last one. It is dropped first thing after the
    // lock is won, before the unlink writes to the neighbours: a locked read-modify-write waits
    // for every earlier store to reach the cache, and dropped after the unlink it waited for the
    // two neighbours' lines (78 % of a cancel's samples at 1M pending).
    bool cancel(node& n) noexcept override {
        __builtin_prefetch(&n, 1);  // its miss overlaps the lock's wait for our earlier stores
        {
            std::lock_guard lk(lock_);
            if (!n.linked()) return stop_running_periodic(n);
            if (n.prev == run_marker()) {
                n.prev = nullptr;  // the runner skips it and drops the batch's reference
            } else {
                [[maybe_unused]] const bool last = n.drop();  // the timer's reference
                assert(!last && "the calling handle holds a reference");
                ring_.unlink(&n);
            }
            --pending_;
            n.set_state(timer_state::cancelled);
        }
        n.destroy_task();  // outside the lock: a task's destructor may call back into the timer
        return true;
    }

    // on_error_ is immutable, and the core outlives the caller's handle: no lock.
    void report_error(std::exception_ptr e) noexcept override {
        detail::report_error(on_error_, std::move(e));
    }

    bool reschedule(node& n, time_point deadline) override {
        const std::uint64_t at = ring_.position(deadline);  // before the lock: see insert()
        bool wake;
        {
            std::lock_guard lk(lock_);
            if (!n.linked()) {
                // a periodic task now running: its next run moves (the runner re-links it)
                periodic_part<Clock>* running = running_periodic(n);
                if (!running) return false;
                restart(n, *running, deadline);
                running->moved = true;
                return true;
            }
            const auto where = ring_.prepare(deadline, at);  // may throw: nothing changed yet
            if (n.prev == run_marker()) {
                leave_batch(n);
            } else {
                ring_.unlink(&n);
            }
            if (periodic_part<Clock>* every = n.periodic()) {
                restart(n, *every, deadline);
            } else {
                n.store_deadline(deadline);
            }
            n.seq = seq_++;  // first in, first out among equal deadlines: in again now
            wake = link(&n, where, false);
        }
        if (wake) wake_drivers();
        return true;
    }

    std::size_t pending() const {
        std::lock_guard lk(lock_);
        return pending_;
    }

    std::optional<time_point> next_expiry() const {
        std::lock_guard lk(lock_);
        return next_due();
    }

    bool stopped() const {
        std::lock_guard lk(lock_);
        return stopped_;
    }

    /// Runs, on the calling thread, every task due at `now`, in the heap's order. One thread
    /// advances at a time (another waits its turn); from inside a task, or after stop(), it does
    /// nothing.
    pass advance(time_point now) {
        pass p;
        std::unique_lock turn(sleep_m_, std::defer_lock);  // taken only to wait for another pass
        for (;;) {
            bool wait_turn = false;
            {
                std::lock_guard lk(lock_);
                if (stopped_) return p;
                if (!advancing_) {
                    batch_.begin(pending_);
                    struct to_batch {
                        due_batch<Clock>& b;
                        void operator()(node* n) {
                            n->prev = run_marker();
                            b.add(n);
                        }
                        void next_run() { b.next_run(); }
                    };
                    const std::size_t count = ring_.expire(
                        precise_ ? now : ring_.floor_to_grid(now), to_batch{batch_}, p.worked);
                    if (count == 0) return p;
                    batch_.finish();
                    next_in_batch_ = 0;
                    advancing_ = true;
                    advancer_ = std::this_thread::get_id();
                    this->add_owner();  // a task may destroy the timer: the pass keeps the core
                    break;
                }
                if (advancer_ == std::this_thread::get_id()) return p;  // from inside a task
                if (turn.owns_lock()) {
                    ++turn_waiters_;
                    wait_turn = true;
                }
            }
            if (!wait_turn) {
                turn.lock();  // then look again: the end of that pass cannot be missed
                continue;
            }
            turn_cv_.wait(turn);
            std::lock_guard lk(lock_);
            --turn_waiters_;
        }
        if (turn.owns_lock()) turn.unlock();
        struct end_of_pass {
            wheel_core& c;
            ~end_of_pass() {
                bool waiters;
                {
                    std::lock_guard lk(c.lock_);
                    c.batch_.clear();
                    c.advancing_ = false;
                    c.advancer_ = std::thread::id{};
                    waiters = c.turn_waiters_ != 0;
                }
                if (waiters) {
                    std::lock_guard sl(c.sleep_m_);
                    c.turn_cv_.notify_all();
                }
                c.drop_owner();  // last: it deletes the core if the timer is gone
            }
        } guard{*this};
        node* done = nullptr;  // the last node run, if its block is ours to free (at the next look)
        for (std::size_t i = 0;; ++i) {
            node* n;
            bool claimed;
            periodic_part<Clock>* every;
            {
                std::lock_guard lk(lock_);
                if (done) this->pool_.free_local(done, done->ops()->size, done->ops()->align);
                done = nullptr;
                if (i == batch_.size()) break;  // under the lock: stop() ends the batch early
                n = batch_.at(i);
                next_in_batch_ = i + 1;
                claimed = n->prev == run_marker();
                every = claimed ? n->periodic() : nullptr;
                if (every) {
                    n->prev = nullptr;
                    every->running = true;  // still pending: it runs again
                } else if (claimed) {
                    n->prev = nullptr;
                    --pending_;
                    n->set_state(timer_state::expired);
                }
            }
            if (!claimed) {  // cancelled, by a handle or by stop(): the batch's reference goes
                if (n->drop()) done = n;
                continue;
            }
            run_reporting(*n, on_error_);
            ++p.ran;
            if (every) {
                bool wake = false;
                std::exception_ptr error;
                after_run next;
                // A burst's missed runs are due at `now` too: they run here, back to back. Each
                // one moves the task one period on, and the run whose successor would lie past
                // time_point::max() is its last, so this ends even at the end of time.
                while ((next = repeat(*n, *every, now, wake, error)) == after_run::again) {
                    run_reporting(*n, on_error_);
                    ++p.ran;
                }
                if (wake) wake_drivers();
                if (error) report_error(std::move(error));
                if (next == after_run::relinked) continue;  // the batch's reference is the ring's
            }
            n->destroy_task();
            if (n->drop()) done = n;
        }
        return p;
    }

    /// Refuses further schedules and cancels every pending task (the current batch's too). With
    /// `Collect`, returns their handles, earliest deadline first (may throw std::bad_alloc, then
    /// nothing has changed); else (the destructors) releases them and does not throw. Idempotent.
    ///
    /// Cost: one walk over the ring's nodes under the lock (to unlink them, a bucket's lanes in
    /// turn so that their cache misses overlap), a radix sort of (deadline, node) records, and one
    /// pass over the sorted records outside the lock (to end each task). With 1M pending: 64-196 ms
    /// here, against 600-760 ms for three walks one node after the other and a std::stable_sort
    /// of the handles comparing through their nodes (~0.45 s of it).
    template <bool Collect>
    std::vector<timeout<Clock>> shut() noexcept(!Collect) {
        std::vector<timeout<Clock>> out;
        deadline_recs<Clock> held;    // every node taken, with its deadline
        bool no_room = false;         // the destructor, out of memory: no room for `held`
        node_links* chain = nullptr;  // then every node taken, through its own links
        std::size_t chained = 0;
        {
            std::lock_guard lk(lock_);
            if (stopped_) return out;
            try {
                held.resize(pending_);  // filled below; no push_back can fail under the lock
                if constexpr (Collect) out.reserve(pending_);
            } catch (...) {
                if constexpr (Collect) throw;
                no_room = true;
            }
            stopped_ = true;
            if (no_room) {
                take_everything([&](node* n) {
                    n->next = chain;
                    chain = n;
                    ++chained;
                });
            } else {
                std::size_t taken = 0;  // pending_ counted each node taken (and a running periodic)
                take_everything([&](node* n) { held[taken++] = deadline_rec<Clock>::of(n); });
                while (held.size() > taken) held.pop_back();
            }
        }
        wake_drivers();
        // Outside the lock, as a task's destructor may call back into the timer: the tasks end in
        // the order the handles come back, earliest deadline first (a coroutine resumed by the
        // end of its sleep may end others: coro.hpp). No one else writes the state of a node
        // stop() has taken: cancel() and the runner find it unlinked.
        if (no_room) {  // the same order, sorted in place through the links: nothing to allocate
            for (node_links* l = sort_chain<Clock>(chain, chained); l;) {
                node* n = node::of(l);
                l = l->next;
                n->next = nullptr;
                n->set_state(timer_state::cancelled);
                n->destroy_task();
                timer_core<Clock>::release(*n);
            }
            return out;
        }
        deadline_recs<Clock> scratch;
        sort_by_deadline_or_in_place(held, scratch);
        for (std::size_t i = 0; i < held.size(); ++i) {
            if (i + 8 < held.size()) __builtin_prefetch(held[i + 8].n, 1);
            node* n = held[i].n;
            n->next = nullptr;
            n->set_state(timer_state::cancelled);
            n->destroy_task();
        }
        for (const auto& r : held) {
            if constexpr (Collect) {
                out.emplace_back(r.n, this);  // adopts its reference
            } else {
                timer_core<Clock>::release(*r.n);
            }
        }
        return out;
    }

    // ---- for drivers ----

    /// Waits until the ring has something due (its next expiry has come on Clock), `limit` has
    /// come, a schedule makes the next expiry earlier, or stop. False once stopped.
    bool wait_for_work(time_point limit) {
        std::unique_lock sl(sleep_m_);  // held from the check to the wait: see wake_drivers()
        bool may_spin = spin_ > std::chrono::nanoseconds::zero();
        for (;;) {
            time_point until;
            bool deadline;
            bool spin = false;  // now is within spin_ of a task's deadline
            std::size_t seen = 0;
            {
                std::lock_guard lk(lock_);
                if (stopped_) return false;
                const std::optional<time_point> next = next_due();
                const time_point now = Clock::now();
                if ((next && *next <= now) || limit <= now) return true;
                until = next ? std::min(*next, limit) : limit;
                deadline = next || limit != time_point::max();
                if (may_spin && next && until == *next && ring_.next_expiry_runs_a_task()) {
                    const time_point early = spin_start(until);
                    if (early <= now) {
                        spin = true;
                    } else {
                        until = early;  // sleep until then, and spin the rest
                    }
                }
                ++sleepers_;  // a spinner too: a schedule before `until` must end its spin
                wake_at_ = std::max(wake_at_, until);
                if (spin) seen = wake_count_.load(std::memory_order_acquire);
            }
            if (spin) {
                sl.unlock();  // a spinner holds nothing: wake_drivers() must not wait for it
                if (!spin_until(until, seen))
                    may_spin = false;  // the clock did not get there: sleep
                sl.lock();
                std::lock_guard lk(lock_);
                if (--sleepers_ == 0) wake_at_ = time_point::min();
                continue;
            }
            if (deadline) {
                detail::wait_until_deadline<Clock>(cv_, sl, until);
            } else {
                detail::wait(cv_, sl);  // nothing pending: no deadline, no wake-up
            }
            {
                std::lock_guard lk(lock_);
                if (--sleepers_ == 0) wake_at_ = time_point::min();
            }
            wakeups_.fetch_add(1, std::memory_order_relaxed);
        }
    }

    /// Starts `worker` running `loop` unless a worker runs already. Throws rejected_error once
    /// stopped, or what starting a thread throws (then no worker runs).
    template <class Loop>
    void start_worker(std::thread& worker, Loop loop) {
        std::lock_guard lk(lock_);
        if (stopped_) throw rejected_error("delayq: timer is stopped");
        if (started_.load(std::memory_order_relaxed)) return;
        this->add_owner();  // the worker's
        try {
            worker = std::thread([this, loop = std::move(loop)]() mutable {
                worker_id_.store(std::this_thread::get_id(), std::memory_order_release);
                loop(*this);
                this->drop_owner();
            });
        } catch (...) {
            this->drop_owner();
            throw;
        }
        started_.store(true, std::memory_order_release);
    }

    /// Whether the calling thread is running a pass (so: inside a task).
    bool advancing_here() const {
        std::lock_guard lk(lock_);
        return advancing_ && advancer_ == std::this_thread::get_id();
    }

    bool started() const noexcept { return started_.load(std::memory_order_acquire); }
    bool on_worker() const noexcept {
        return worker_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
    }
    std::size_t wakeups() const noexcept { return wakeups_.load(std::memory_order_relaxed); }

    /// How many drivers sleep (or spin) in wait_for_work() now (introspection for tests).
    std::size_t drivers_asleep() const {
        std::lock_guard lk(lock_);
        return sleepers_;
    }

    /// Calls f(ring) under the lock (introspection for tests).
    template <class F>
    decltype(auto) with_ring(F f) const {
        std::lock_guard lk(lock_);
        return f(ring_);
    }

  private:
    ~wheel_core() override = default;  // by drop_owner() only

    // Schedules a Block (a node and its callable) built from args, due at `deadline`.
    template <class Block, class... A>
    timeout<Clock> insert(time_point deadline, A&&... args) {
        using fn = decltype(std::declval<Block&>().fn);
        static_assert(std::is_invocable_v<fn&>, "a task is a callable taking no arguments");
        static_assert(std::is_nothrow_destructible_v<fn>, "a task's destructor must not throw");
        // Where the deadline belongs depends on nothing the lock guards: working it out first
        // (a division or two) takes it off the locked part, which the next schedule waits for.
        const std::uint64_t at = ring_.position(deadline);
        node* n;
        bool wake;
        {
            std::lock_guard lk(lock_);
            if (stopped_) throw rejected_error("delayq: timer is stopped");
            if (max_pending_ != 0 && pending_ >= max_pending_)
                throw rejected_error("delayq: max_pending reached");
            const auto where = ring_.prepare(deadline, at);
            void* mem = this->pool_.allocate(sizeof(Block), alignof(Block));
            Block* b;
            try {
                b = ::new (mem) Block(std::forward<A>(args)...);
            } catch (...) {
                this->pool_.free_local(mem, sizeof(Block), alignof(Block));
                throw;
            }
            b->init(&Block::table, deadline, seq_++, 2);  // the timer's reference and the handle's
            n = b;
            ++pending_;
            wake = link(n, where, true);
        }
        if (wake) wake_drivers();
        return timeout<Clock>(n, this);
    }

    // Under the lock: the repeat of n if n is a periodic task that is running and will run again
    // (not cancelled during this run, nor counted out by a stop()); else null.
    periodic_part<Clock>* running_periodic(node& n) noexcept {
        periodic_part<Clock>* every = n.periodic();
        if (!every || !every->running || every->stopping || stopped_) return nullptr;
        return every;
    }

    // Under the lock, for cancel() of a node out of the timer: a periodic task that is running
    // stops repeating (the runner ends it after this run). False for anything else.
    bool stop_running_periodic(node& n) noexcept {
        periodic_part<Clock>* every = running_periodic(n);
        if (!every) return false;
        every->stopping = true;
        --pending_;
        n.set_state(timer_state::cancelled);
        return true;
    }

    // A periodic task's grid starts again at `first` (reschedule).
    static void restart(node& n, periodic_part<Clock>& every, time_point first) noexcept {
        every.start = first;
        every.k = 0;
        n.store_deadline(first);
    }

    // When a periodic task's next run is due, after a run that a pass started at `now`; nullopt
    // when it would lie past time_point::max() (that run was the last). Moves the task's grid (k,
    // or start for missed_tick::delay). Only a burst, or a reschedule during the run, gives a
    // time <= now: skip and delay always land after `now`.
    static std::optional<time_point> next_run(periodic_part<Clock>& every,
                                              time_point now) noexcept {
        if (every.moved) {  // rescheduled during the run
            every.moved = false;
            return every.start;
        }
        constexpr wide_rep end = time_point::max().time_since_epoch().count();
        const wide_rep p = every.period.count();
        const wide_rep s = every.start.time_since_epoch().count();
        const wide_rep t = now.time_since_epoch().count();
        // In 128 bits: k may be 2^64 (the run after one late by the whole time line), and
        // s + k * p still fits (p < 2^63).
        wide_rep k = static_cast<wide_rep>(every.k) + 1;
        switch (every.policy) {
            case missed_tick::burst:
                break;
            case missed_tick::skip: {
                if (t >= s) k = std::max(k, (t - s) / p + 1);
                break;
            }
            case missed_tick::delay:
                if (t + p > end) return std::nullopt;
                every.start = time_point{duration{static_cast<typename duration::rep>(t + p)}};
                every.k = 0;
                return every.start;
        }
        const wide_rep next = s + k * p;
        if (next > end) return std::nullopt;
        every.k = static_cast<std::uint64_t>(k);  // < 2^64: k * p <= end - s < 2^64
        return time_point{duration{static_cast<typename duration::rep>(next)}};
    }

    // What becomes of a periodic task after a run (repeat()).
    enum class after_run : std::uint8_t {
        relinked,  // in the ring at its next run: the batch's reference is the ring's now
        again,     // its next run is due in this pass too (a burst): the runner runs it now
        ended,     // the runner ends it and drops the batch's reference
    };

    // After a periodic task's run: keeps it running when its next run is due at `now` already
    // (missed_tick::burst; not one that reschedule() moved there, which waits for the next pass as
    // any rescheduled task), else re-links it at its next run, or ends it: cancelled during the
    // run, the timer stopped, its last run (the next would lie past time_point::max()), or no
    // room to re-link it.
    after_run repeat(node& n, periodic_part<Clock>& every, time_point now, bool& wake,
                     std::exception_ptr& error) noexcept {
        std::lock_guard lk(lock_);
        if (every.stopping || stopped_) {
            every.running = false;
            n.set_state(timer_state::cancelled);  // stop() counted it out already; cancel() too
            return after_run::ended;
        }
        const bool moved = every.moved;
        const std::optional<time_point> next = next_run(every, now);
        if (!next) {
            every.running = false;
            --pending_;
            n.set_state(timer_state::expired);  // ran its last run
            return after_run::ended;
        }
        if (!moved && *next <= (precise_ ? now : ring_.floor_to_grid(now))) {
            n.store_deadline(*next);
            return after_run::again;  // still running: cancel() and stop() act as during a run
        }
        every.running = false;
        try {
            const auto where = ring_.prepare(*next, ring_.position(*next));
            n.store_deadline(*next);
            n.seq = seq_++;
            wake = link(&n, where, false);
            return after_run::relinked;
        } catch (...) {
            error = std::current_exception();  // out of memory: the task ends, on_error hears why
            --pending_;
            n.set_state(timer_state::cancelled);
            return after_run::ended;
        }
    }

    // Under the lock: links n (its deadline set) at `where` (ring_.prepare()). True if a sleeping
    // driver must be woken: n comes out before it would wake by itself. The sleepers will look
    // again, so a later schedule before n need not notify twice. `fresh`: a new schedule (which the
    // hashed ring stages), not a node moved by reschedule() or a periodic task's next run (which
    // it links at once: staging them measured 1.5x slower reschedules). wake_at_ is
    // time_point::max() also for a driver asleep with no deadline at all (nothing was pending):
    // a node due at time_point::max() itself must wake that one, so that it sleeps on the clock
    // until then (manual_clock can get there); so max wakes whatever comes.
    bool link(node* n, std::uint64_t where, bool fresh) noexcept {
        const bool wake = ring_.link(n, where, wake_at_, fresh) || wake_at_ == time_point::max();
        if (wake) wake_at_ = n->deadline;
        return wake;
    }

    // Under the lock: when advance() will next have something to run.
    std::optional<time_point> next_due() const {
        const std::optional<time_point> t = ring_.next_expiry();
        if (!t || precise_) return t;
        return ring_.ceil_to_grid(*t);
    }

    // Wakes every driver sleeping in wait_for_work(). A sleeper holds sleep_m_ from the moment it
    // looks at the ring until it waits, so taking sleep_m_ here means the wake-up either comes
    // before it looks (it sees the change) or reaches it asleep.
    void wake_drivers() {
        wake_count_.fetch_add(1, std::memory_order_release);  // ends a spin (spin_until())
        std::lock_guard sl(sleep_m_);
        cv_.notify_all();
    }

    static std::chrono::nanoseconds valid_spin(std::chrono::nanoseconds s) {
        if (s < std::chrono::nanoseconds::zero())
            throw std::invalid_argument("delayq: spin_before_deadline must be >= 0");
        return s;
    }

    // When a driver waiting for deadline d starts to spin: d - spin_ (saturating).
    time_point spin_start(time_point d) const noexcept {
        const auto s = std::chrono::duration_cast<duration>(spin_);
        return d < time_point::min() + s ? time_point::min() : d - s;
    }

    // Spins, yielding the CPU, until Clock reaches `until` or wake_count_ moves on from `seen`
    // (read under the lock, so that no wake-up after the look at the ring is missed): true; or
    // for 2 s of real time without either (false: the clock does not move by itself).
    bool spin_until(time_point until, std::size_t seen) const noexcept {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        for (unsigned i = 0;; ++i) {
            if (Clock::now() >= until || wake_count_.load(std::memory_order_acquire) != seen)
                return true;
            if ((i & 1023) == 1023 && std::chrono::steady_clock::now() >= give_up) return false;
            std::this_thread::yield();
        }
    }

    // Under the lock, for reschedule(): n, in the batch and not yet run, leaves it for the ring,
    // and comes with a reference for the ring. Left in the batch's array, the runner skips it and
    // drops the batch's reference (the ring gets one of its own); taken out of the batch's chain
    // (out of memory, the chain runs through the node's links, which the ring is about to take), it
    // brings the batch's reference.
    void leave_batch(node& n) noexcept {
        n.prev = nullptr;
        if (!batch_.remove(&n)) n.acquire();
    }

    // Under the lock: unlinks every pending node and hands each to take(node*), which owns one
    // reference to it (the ring's, or the batch's) and may reuse its links. States are still
    // pending: take sets them.
    template <class Take>
    void take_everything(Take&& take) noexcept {
        if (advancing_) {
            // Nodes before next_in_batch_ are claimed or skipped (and may be freed already). The
            // rest leave the batch, its reference with them: the runner never looks at them again,
            // so their links are the taker's (out of memory, the batch is chained through them).
            batch_.take_from(next_in_batch_, [&](node* n) {
                if (n->prev != run_marker()) {  // cancelled, or moved to the ring meanwhile
                    timer_core<Clock>::release(*n);
                    return;
                }
                n->prev = nullptr;
                take(n);
            });
        }
        pending_ = 0;
        ring_.take_all(take);
    }

    mutable spin_lock lock_;  // the ring, the pool, the batch marks, the counts and the states
    std::mutex sleep_m_;      // what drivers and waiting passes sleep with (cv_, turn_cv_)
    Ring ring_;
    due_batch<Clock> batch_;         // the current pass's due nodes, while advancing_
    std::size_t next_in_batch_ = 0;  // the first one the runner has not claimed yet
    std::size_t pending_ = 0;        // in the ring, or in the batch and not yet claimed
    std::uint32_t seq_ = 0;
    bool stopped_ = false;
    bool advancing_ = false;
    std::thread::id advancer_{};
    std::size_t turn_waiters_ = 0;
    std::condition_variable turn_cv_;  // an advance waits here for another's to end
    std::condition_variable cv_;       // drivers sleep here
    time_point wake_at_ =
        time_point::min();  // the latest a sleeper wakes by itself; min: none sleeps
    std::size_t sleepers_ = 0;
    const std::size_t max_pending_;
    const on_error_fn on_error_;
    const bool precise_;
    const std::chrono::nanoseconds spin_;     // spin_before_deadline
    std::atomic<std::size_t> wake_count_{0};  // wake_drivers() calls: ends a spin
    std::atomic<bool> started_{false};
    std::atomic<std::thread::id> worker_id_{};
    std::atomic<std::size_t> wakeups_{0};
};

}  // namespace delayq::detail
