// wheel_core<Clock, Ring, Face>: what both wheels share around their ring of buckets — the one
// lock, the node pool, schedule, cancel, running what is due, and stop. It has no thread: the Ring
// (a wheel_ring: hashed_wheel_ring or timing_wheel) says where nodes sit and which are due, and
// whoever drives it (the worker of wheel_driver.hpp, or the user's event loop) calls advance().
//
// The idea, in one pass. advance(now) takes the lock, asks the ring for every node due at `now`,
// puts them in the heap's order (due_batch.hpp) and marks each as "in the batch" (prev ==
// node_links::batch_mark()); then, without the lock, runs them one by one. Before each run it takes
// the lock to claim the node: a node cancelled meanwhile is no longer marked and is skipped. So a
// task stays cancellable until the moment it starts, in both wheels, and cancel() returning true
// always means the task never runs. Tasks scheduled by a task run in a later pass, so a pass does a
// bounded amount of work. A pass holds the core as an owner (timer_node.hpp): a task that destroys
// the timer ends the rest of the batch with the other tasks (stop()), and the pass frees the core
// as it ends, with nothing freed under it.
//
// Locking. One lock (a spin_lock: detail/spin_lock.hpp says why) guards the ring, the pool's
// allocation, the batch marks and the counts. Tasks run, and are destroyed, without it: a task may
// schedule, cancel, or stop the timer. A callable is moved into its node under the lock, so its
// move constructor must not call back into the timer. A pass that finds another thread's pass
// under way waits for it with turn_m_, which is never taken inside the lock.
//
// Cancel. A cancel counts the task out, marks its node cancelled and destroys the task at once, but
// leaves a node that sits in the ring linked, with the timer's reference, in a small array
// (doomed_). bury() unlinks them all, each node's neighbours fetched a few nodes ahead, and keeps
// their references (unlinked_) until let_go() drops them. So a cancel writes only its node, and the
// neighbours' misses, which the next locked instruction (the next schedule's lock) waited for,
// overlap by the dozen: a cancel followed by a schedule costs about three quarters of what it did
// (docs/performance.md, "Cancel + schedule"). No pass and no stop() meets a cancelled node, as each
// buries first; a staging lane that settles may move one into a bucket, where it stays linked until
// bury() unlinks it. A wheel with nothing pending says nothing is due (next_due()). A cancelled
// node still linked is what doomed() tells from a pending one, for a second cancel or a reschedule
// through another copy of the handle. When a cancelled node's block goes back to the pool, bounded
// in count and in time, is said where the arrays are declared (at the end of this class).
//
// Memory. A pass allocates nothing: room.hpp states the rule and how the types keep it (members
// that may allocate take a room_key; only the room_lock of a schedule or a reschedule makes one).
// This core says how much room, and when, where an exception is harmless (nothing is scheduled or
// moved then): a schedule makes the ring's room for its node (prepare()), and, as the pending
// count passes what the room holds, the ring's and the batch's for a pass over every node held
// (make_room()); a periodic task's schedule makes the ring's room for every move a pass gives it
// to its next run, at most one period after the pass (prepare_repeat()), and a reschedule of a
// running periodic task the room for the run it moves (prepare()). So a pass cannot fail for
// memory; the room is address space until a late pass touches it (room.hpp). stop() and the
// destructor sort what they take in the batch's room, and allocate nothing but the handles
// stop() returns.
//
// Lifecycle (as Netty's states, checked the same way by every operation, under the lock):
// running -> stopped. schedule() after stop() throws rejected_error before it touches the task;
// advance() after stop() does nothing; stop() a second time returns nothing.
//
// Waking a driver. As seastar's timer_set tells its loop when to re-arm, the core knows by when its
// driver will look again (`armed_`, set by look() under the lock in the same look at the ring; min:
// nobody is armed) and calls the driver's waker when a schedule's node comes out earlier than that.
// It calls it itself, after the lock, because a reschedule() through a handle never passes through
// the driver. The on_error policy stays here, not in the driver: a thread-free wheel's pass runs
// tasks too, and handles reach on_error through the core after the timer is gone (coro.hpp).
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
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "deadline_sort.hpp"
#include "due_batch.hpp"
#include "periodic.hpp"
#include "room.hpp"
#include "spin_lock.hpp"
#include "timer_node.hpp"
#include "wheel_ring.hpp"

namespace delayq::detail {

/// What the core calls when a schedule makes its driver's next look too late: the driver looks
/// again. Called without the core's lock, from any thread; it must not call back into the core.
struct wheel_waker {
    virtual void wake() noexcept = 0;

  protected:
    ~wheel_waker() = default;
};

// Face: what the public class gives the core, so that detail/ names no public header:
// Face::handle, the handle made of a node and its core (timeout<Clock>), and Face::refuse(what),
// which throws the public rejected_error.
template <class Clock, wheel_ring<Clock> Ring, class Face>
class wheel_core final : public timer_core<Clock> {
  public:
    using handle = typename Face::handle;
    using node = timer_node<Clock>;
    using time_point = typename Clock::time_point;
    using duration = typename Clock::duration;
    using on_error_fn = std::function<void(std::exception_ptr)>;

    /// `precise`: a task runs at its own deadline; else at its tick's boundary (the ring's grid).
    /// The ring is made from `ring_args` (what its constructor throws, this throws).
    template <class... RingArgs>
    wheel_core(std::size_t max_pending, on_error_fn on_error, bool precise, RingArgs&&... ring_args)
        : ring_(std::forward<RingArgs>(ring_args)...),
          max_pending_(max_pending),
          on_error_(std::move(on_error)),
          precise_(precise) {}

    /// Schedules `task` at `deadline`. Throws rejected_error (task untouched) when stopped or
    /// full; std::bad_alloc, or what moving the task throws, and then nothing is scheduled.
    template <class F>
    handle schedule_at(F&& task, time_point deadline) {
        return insert<node_with<Clock, std::decay_t<F>>>(deadline, duration::zero(),
                                                         std::forward<F>(task));
    }

    /// Schedules `task` to run at `first`, then every `period` after it, `policy` saying what a
    /// late run does to the next (repeat_policy). As schedule_at(); std::invalid_argument for a
    /// period <= 0.
    template <class F>
    handle schedule_every(F&& task, time_point first, duration period, repeat_policy policy) {
        if (period <= duration::zero()) throw std::invalid_argument("delayq: period must be > 0");
        return insert<node_with<Clock, periodic_task<Clock, std::decay_t<F>>>>(
            first, period, periodic_part<Clock>{first, period, 0, policy}, std::forward<F>(task));
    }

    // Called only through a handle (timeout::cancel), whose reference outlives the call. A node in
    // the ring is counted out and marked at once, but stays linked, with the timer's reference,
    // until bury() (see "Cancel" above): a cancel writes its node only, whose miss overlaps the
    // lock's wait for our earlier stores.
    bool cancel(node& n) noexcept override {
        __builtin_prefetch(&n, 1);
        {
            std::lock_guard lk(lock_);
            switch (n.place()) {
                case node_place::out:
                    return stop_running_periodic(n);
                case node_place::batch:
                    n.prev = nullptr;  // the runner skips it and drops the batch's reference
                    break;
                case node_place::list:
                case node_place::window:
                    if (doomed_count_ != 0 && doomed(n)) return false;  // cancelled already
                    assert(doomed_count_ < max_doomed);
                    doomed_[doomed_count_++] = &n;
                    break;
            }
            --pending_;
            n.set_state(timer_state::cancelled);
            if (pending_ == 0) {
                bury_all();  // nothing pending: nothing held (see the arrays)
            } else if (doomed_count_ == max_doomed) {
                bury();
            }
        }
        n.destroy_task();  // outside the lock: a task's destructor may call back into the timer
        return true;
    }

    // on_error_ is immutable, and the core outlives the caller's handle: no lock.
    void report_error(std::exception_ptr e) noexcept override {
        detail::report_error(on_error_, std::move(e));
    }

    bool reschedule(node& n, time_point deadline) override {
        __builtin_prefetch(&n, 1);  // as in cancel(): its miss overlaps the position and the lock
        const place at = ring_.position(deadline);  // before the lock: see insert()
        std::shared_ptr<wheel_waker> to_wake;
        {
            const room_lock lk(lock_);
            const node_place place = n.place();
            if (place == node_place::out) {
                // a periodic task now running: its next run moves (the runner re-links it, in a
                // pass: the room for that link is made here)
                periodic_part<Clock>* running = running_periodic(n);
                if (!running) return false;
                ring_.prepare(at, lk.key());  // may throw: nothing changed yet
                restart(n, *running, deadline);
                n.set(periodic_flag::moved, true);
                return true;
            }
            // cancelled, and still linked (the count first: no second look at the node's line)
            if (doomed_count_ != 0 && doomed(n)) return false;
            ring_.prepare(at, lk.key());  // may throw: nothing changed yet
            const bool in_batch = place == node_place::batch;
            if (!in_batch && deadline >= n.deadline && ring_.may_postpone(&n)) {
                // Later: only the deadline changes, and the pass that meets the node files it
                // again. No neighbour is touched, and no driver needs to wake earlier.
                move_deadline(n, deadline);
                return true;
            }
            if (in_batch) {
                leave_batch(n);
            } else {
                ring_.unlink(&n);
            }
            move_deadline(n, deadline);
            if (earlier_than_armed(ring_.relink(&n, at, armed_), n)) to_wake = waker_;
        }
        if (to_wake) to_wake->wake();
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

    /// Runs, on the calling thread, every task due at `now`, in the heap's order; returns how many
    /// ran. One thread advances at a time (another waits its turn); from inside a task, or after
    /// stop(), it does nothing.
    ///
    /// A pass, in four steps: take the turn and gather what is due into the batch (take_turn());
    /// for each node of the batch, claim it under the lock (claim()), then run it outside the lock
    /// (run()); and, however the pass ends, give the turn back (pass_end).
    std::size_t advance(time_point now) {
        if (!take_turn(now)) return 0;
        const pass_end end(*this);
        std::size_t ran = 0;
        node* to_free = nullptr;  // the last node ended, if its block is ours: see claim()
        for (std::size_t i = 0;; ++i) {
            const claimed c = claim(i, to_free);
            if (!c.n) break;
            if (c.skipped) {  // cancelled, by a handle or by stop(): the batch's reference goes
                if (c.n->drop()) to_free = c.n;
                continue;
            }
            ran += run(*c.n, c.every, now, to_free);
        }
        return ran;
    }

    /// Refuses further schedules and cancels every pending task (the current batch's too). With
    /// `Collect`, returns their handles, earliest deadline first (may throw std::bad_alloc, then
    /// nothing has changed); else (the destructors) releases them, allocating nothing. Idempotent.
    ///
    /// One way for every case: the nodes taken go, as records (deadline, node), into the room the
    /// passes had (due_batch::give_up(): a stopped wheel runs no more passes), are sorted there,
    /// and each task ends outside the lock, in that order. Cost: one walk over the ring's nodes
    /// under the lock (to unlink them, a bucket's lists in turn so that their cache misses
    /// overlap), a radix sort of the records that never reaches through a pointer, and one walk
    /// over the sorted records outside the lock (docs/performance.md, "stop").
    template <bool Collect>
    std::vector<handle> shut() noexcept(!Collect) {
        std::vector<handle> out;
        std::shared_ptr<wheel_waker> driver;  // told to look again, and so to see the stop
        typename due_batch<Clock>::room held;
        {
            std::lock_guard lk(lock_);
            if (stopped_) return out;
            if constexpr (Collect) out.reserve(pending_);  // may throw: nothing changed yet
            stopped_ = true;
            driver = std::move(waker_);
            held = take_everything();
        }
        if (driver) driver->wake();
        // Outside the lock, as a task's destructor may call back into the timer: the tasks end in
        // the order the handles come back, earliest deadline first (a coroutine resumed by the
        // end of its sleep may end others: coro.hpp). No one else writes the state of a node
        // stop() has taken: cancel() and the runner find it unlinked.
        sort_by_deadline(held.recs, held.scratch);
        const std::size_t n = held.recs.size();
        for (std::size_t i = 0; i < n; ++i) {
            if (i + 8 < n) __builtin_prefetch(held.recs[i + 8].n, 1);
            node* t = held.recs[i].n;
            t->next = nullptr;
            t->set_state(timer_state::cancelled);
            t->destroy_task();
        }
        for (const auto& r : held.recs) {
            if constexpr (Collect) {
                out.emplace_back(r.n, this);  // adopts its reference
            } else {
                timer_core<Clock>::release(*r.n);
            }
        }
        return out;
    }

    // ---- for a driver (wheel_driver.hpp) ----

    /// Under one lock: calls `decide(next, runs_a_task)` with when the next pass is due (nullopt:
    /// nothing pending) and whether a task is due then (not only a bucket to open); a time it
    /// returns is when the driver will look again by itself (time_point::max(): only when woken),
    /// and a schedule of anything earlier calls the waker. nullopt: it does not wait (something is
    /// due). False, without calling it, once stopped.
    template <class Decide>
    bool look(Decide&& decide) {
        std::lock_guard lk(lock_);
        if (stopped_) return false;
        if (const std::optional<time_point> until =
                decide(next_due(), ring_.next_expiry_runs_a_task()))
            armed_ = *until;
        return true;
    }

    /// The driver is awake again: no schedule needs to wake it until its next look().
    void disarm() noexcept {
        std::lock_guard lk(lock_);
        armed_ = time_point::min();
    }

    /// Installs the driver's waker (null: none). False, installing nothing, once stopped.
    bool set_waker(std::shared_ptr<wheel_waker> w) noexcept {
        std::lock_guard lk(lock_);
        if (stopped_) return false;
        waker_ = std::move(w);
        return true;
    }

  private:
    using place = typename Ring::place;

    ~wheel_core() override = default;  // by drop_owner() only

    // Schedules a Block (a node and its callable) built from args, due at `deadline`; a periodic
    // task's `period` (zero: runs once) says how far its later runs move it in a pass.
    template <class Block, class... A>
    handle insert(time_point deadline, duration period, A&&... args) {
        using fn = decltype(std::declval<Block&>().fn);
        static_assert(std::is_invocable_v<fn&>, "a task is a callable taking no arguments");
        static_assert(std::is_nothrow_destructible_v<fn>, "a task's destructor must not throw");
        // Where the deadline belongs depends on nothing the lock guards: working it out first
        // (a division or two) takes it off the locked part, which the next schedule waits for.
        const place at = ring_.position(deadline);
        node* n;
        std::shared_ptr<wheel_waker> to_wake;
        {
            const room_lock lk(lock_);
            if (stopped_) Face::refuse("delayq: timer is stopped");
            if (max_pending_ != 0 && pending_ >= max_pending_)
                Face::refuse("delayq: max_pending reached");
            // A pass never allocates: its room is made here (see "Memory" above).
            ring_.prepare(at, lk.key());
            if (period > duration::zero()) ring_.prepare_repeat(period, lk.key());
            if (pending_ + doomed_count_ >= room_) make_room(lk.key());
            void* mem = this->pool_.allocate(sizeof(Block), alignof(Block), lk.key());
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
            if (earlier_than_armed(ring_.link(n, at, armed_), *n)) to_wake = waker_;
        }
        if (to_wake) to_wake->wake();
        return handle(n, this);
    }

    // ---- a pass, step by step (advance()) ----

    // Step 1. Takes this thread's turn and gathers the batch (gather()); false, with no pass, when
    // stopped, when nothing is due, or from inside a task of the pass under way. Another thread's
    // pass under way is waited for on turn_m_, which is never taken inside the lock: the first
    // look takes it, the second counts this thread as a waiter and sleeps, and the end of that
    // pass (pass_end) wakes it under turn_m_, so that the wake-up cannot be missed.
    bool take_turn(time_point now) {
        std::unique_lock turn(turn_m_, std::defer_lock);
        for (;;) {
            {
                std::lock_guard lk(lock_);
                if (stopped_) return false;
                if (!advancing_) return gather(now);
                if (advancer_ == std::this_thread::get_id()) return false;  // from inside a task
                if (turn.owns_lock()) ++turn_waiters_;
            }
            if (!turn.owns_lock()) {
                turn.lock();  // then look again
                continue;
            }
            turn_cv_.wait(turn);
            std::lock_guard lk(lock_);
            --turn_waiters_;
        }
    }

    // What expire() hands a pass's due nodes to: marked as in the batch, added in running order.
    struct to_batch {
        due_batch<Clock>& b;
        void operator()(node* n) noexcept {
            n->prev = node_links::batch_mark();
            b.add(n);
        }
        void next_run() noexcept { b.next_run(); }
    };

    // Step 1, under the lock: buries the cancelled nodes (the ring's walks then meet pending ones
    // only), moves every node due at `now` into the batch, in running order, and opens the pass:
    // this thread advances, and the pass holds the core as an owner (a task may destroy the
    // timer). False if nothing is due: then no pass opens, and the blocks of the nodes just
    // buried go back at once, as a pass's end would give them.
    bool gather(time_point now) noexcept {
        bury();
        batch_.begin();
        if (ring_.expire(precise_ ? now : ring_.floor_to_grid(now), to_batch{batch_}) == 0) {
            let_go();
            return false;
        }
        batch_.finish();
        next_in_batch_ = 0;
        advancing_ = true;
        advancer_ = std::this_thread::get_id();
        this->add_owner();
        return true;
    }

    // What claim() found at a position of the batch: nothing (n null: the batch is done, or stop()
    // ended it), a node no longer marked as in the batch (skipped: cancelled or moved meanwhile),
    // or a task to run, `every` its repeat if it is periodic.
    struct claimed {
        node* n;
        bool skipped;
        periodic_part<Clock>* every;
    };

    // Step 2, under the lock, for the i-th node of the batch. First frees the block of the node
    // ended before it (`to_free`, set by the step before, outside the lock: its free waits for
    // this lock rather than taking one of its own). A node still marked is claimed: a one-shot
    // task is counted out and expired from now on (cancel() returns false), a periodic one is
    // running and still pending.
    claimed claim(std::size_t i, node*& to_free) noexcept {
        std::lock_guard lk(lock_);
        if (to_free) this->pool_.free_local(to_free, to_free->ops()->size, to_free->ops()->align);
        to_free = nullptr;
        if (i >= batch_.size()) return {nullptr, false, nullptr};  // stop() may end it early
        node* n = batch_.at(i);
        next_in_batch_ = i + 1;
        if (n->place() != node_place::batch) return {n, true, nullptr};
        n->prev = nullptr;
        if (n->is_periodic()) {
            n->set(periodic_flag::running, true);
            return {n, false, n->periodic()};
        }
        --pending_;
        n->set_state(timer_state::expired);
        return {n, false, nullptr};
    }

    // Step 3, outside the lock: runs a claimed task (what it throws goes to on_error); a periodic
    // one then runs its missed runs due at `now` too (a burst: back to back; each moves the task
    // one period on, and the run whose successor would lie past time_point::max() is its last, so
    // this ends even at the end of time) and moves to its next run (repeat()). A task that does
    // not run again is ended: destroyed, and the batch's reference dropped (the block, if that was
    // the last, is freed by the next claim()). Returns how many runs ran.
    std::size_t run(node& n, periodic_part<Clock>* every, time_point now, node*& to_free) noexcept {
        run_reporting(n, on_error_);
        std::size_t ran = 1;
        if (every) {
            std::shared_ptr<wheel_waker> to_wake;
            after_run next;
            while ((next = repeat(n, *every, now, to_wake)) == after_run::again) {
                run_reporting(n, on_error_);
                ++ran;
            }
            if (to_wake) to_wake->wake();
            if (next == after_run::relinked) return ran;  // the batch's reference is the ring's
        }
        n.destroy_task();
        if (n.drop()) to_free = &n;
        return ran;
    }

    // Step 4, however the pass ends (a task may even destroy the timer): under the lock, the batch
    // is done with and the turn given back, and the references to the nodes the pass's bury()
    // unlinked are dropped (so a cancelled node's block goes back by the end of the next pass:
    // "Cancel" above); then a thread waiting for its turn is woken, and the core is let go, last,
    // as that deletes it if the timer is gone.
    struct pass_end {
        wheel_core& c;
        explicit pass_end(wheel_core& core) noexcept : c(core) {}
        pass_end(const pass_end&) = delete;
        pass_end& operator=(const pass_end&) = delete;
        ~pass_end() {
            bool waiters;
            {
                std::lock_guard lk(c.lock_);
                c.batch_.clear();
                c.advancing_ = false;
                c.advancer_ = std::thread::id{};
                c.let_go();
                waiters = c.turn_waiters_ != 0;
            }
            if (waiters) {
                std::lock_guard tl(c.turn_m_);
                c.turn_cv_.notify_all();
            }
            c.drop_owner();
        }
    };

    // Under the lock: room for passes over twice the nodes pending (see "Memory" above). Throws
    // std::bad_alloc; then room_ stays what it was, and so does the room it counts. Cold: called
    // log2(N) times in a wheel's life, and kept out of the schedule's code.
    [[gnu::cold, gnu::noinline]] void make_room(room_key key) {
        const std::size_t to = std::max<std::size_t>(64, 2 * room_);
        ring_.reserve(to, key);
        batch_.reserve(to, key);
        room_ = to;
    }

    // Under the lock: the repeat of n if n is a periodic task that is running and will run again
    // (not cancelled during this run, nor counted out by a stop()); else null.
    // The flags are read first, from the node's header: a task that is not running may be
    // cancelled, its callable (where the repeat is) destroyed.
    periodic_part<Clock>* running_periodic(node& n) noexcept {
        if (!n.is_periodic() || !n.has(periodic_flag::running) || n.has(periodic_flag::stopping) ||
            stopped_)
            return nullptr;
        return n.periodic();
    }

    // Under the lock, for cancel() of a node out of the timer: a periodic task that is running
    // stops repeating (the runner ends it after this run). False for anything else.
    bool stop_running_periodic(node& n) noexcept {
        if (!running_periodic(n)) return false;
        n.set(periodic_flag::stopping, true);
        --pending_;
        n.set_state(timer_state::cancelled);
        return true;
    }

    // Under the lock: n, out of the ring or left in place, is due at `deadline` now (a periodic
    // task: its grid starts there), and last among equal deadlines: first in, first out counts
    // from the reschedule.
    void move_deadline(node& n, time_point deadline) noexcept {
        if (periodic_part<Clock>* every = n.periodic()) {
            restart(n, *every, deadline);
        } else {
            n.store_deadline(deadline);
        }
        n.seq = seq_++;
    }

    // A periodic task's grid starts again at `first` (reschedule), and its next run is there.
    static void restart(node& n, periodic_part<Clock>& every, time_point first) noexcept {
        restart_grid(every, first);
        n.store_deadline(first);
    }

    // What becomes of a periodic task after a run (repeat()).
    enum class after_run : std::uint8_t {
        relinked,  // in the ring at its next run: the batch's reference is the ring's now
        again,     // its next run is due in this pass too (a burst): the runner runs it now
        ended,     // the runner ends it and drops the batch's reference
    };

    // After a periodic task's run: keeps it running when its next run is due at `now` already
    // (repeat_policy::burst; not one that reschedule() moved there, which waits for the next pass
    // as any rescheduled task), else re-links it at its next run (in room made when it was
    // scheduled or rescheduled: no allocation), or ends it: cancelled during the run, the timer
    // stopped, or its last run (the next would lie past time_point::max()).
    after_run repeat(node& n, periodic_part<Clock>& every, time_point now,
                     std::shared_ptr<wheel_waker>& to_wake) noexcept {
        std::lock_guard lk(lock_);
        if (n.has(periodic_flag::stopping) || stopped_) {
            n.set(periodic_flag::running, false);
            n.set_state(timer_state::cancelled);  // stop() counted it out already; cancel() too
            return after_run::ended;
        }
        const bool moved = n.has(periodic_flag::moved);
        n.set(periodic_flag::moved, false);
        // Rescheduled during the run: the next run is where the reschedule put it, the policy
        // aside (a time <= now waits for the next pass all the same: see below). Else the grid's
        // next run (periodic.hpp).
        const std::optional<time_point> next = moved ? every.start : next_run(every, now);
        if (!next) {
            n.set(periodic_flag::running, false);
            --pending_;
            n.set_state(timer_state::expired);  // ran its last run
            return after_run::ended;
        }
        if (!moved && *next <= (precise_ ? now : ring_.floor_to_grid(now))) {
            n.store_deadline(*next);
            return after_run::again;  // still running: cancel() and stop() act as during a run
        }
        n.set(periodic_flag::running, false);
        n.store_deadline(*next);
        n.seq = seq_++;
        if (earlier_than_armed(ring_.relink(&n, ring_.position(*next), armed_), n))
            to_wake = waker_;
        return after_run::relinked;
    }

    // Under the lock, after n was linked (the ring's answer: whether n comes out before armed_):
    // whether the driver must be woken. It will look again, so a later schedule before n need not
    // wake it twice: armed_ becomes n's deadline. armed_ is time_point::max() also for a driver
    // asleep with no deadline at all (nothing was pending): a node due at time_point::max() itself
    // must wake that one, so that it sleeps on the clock until then (manual_clock can get there);
    // so max wakes whatever comes.
    bool earlier_than_armed(bool earlier, const node& n) noexcept {
        const bool wake = earlier || armed_ == time_point::max();
        if (wake) armed_ = n.deadline;
        return wake;
    }

    // Under the lock: whether n is a node cancel() left in the ring (in a list or a window, yet
    // cancelled: a node cancelled in the batch leaves it at once).
    static bool doomed(const node& n) noexcept {
        const auto s = n.status();
        return (s.place == node_place::list || s.place == node_place::window) &&
               s.state == timer_state::cancelled;
    }

    // Under the lock: unlinks the nodes cancel() left in the ring, each one's neighbours fetched
    // a few nodes ahead so that their misses overlap. The timer's references to them are dropped
    // at the next bury(), before its unlinks: a locked decrement waits for every earlier store,
    // and right after the unlinks it would wait for all their neighbours' lines. Until then the
    // reference keeps the block from a handle that lets go (a node still linked must not be
    // freed), and a node unlinked with it stays out of every list.
    void bury() noexcept {
        let_go();
        constexpr std::size_t ahead = 8;
        const std::size_t k = doomed_count_;
        for (std::size_t i = 0; i < k && i < ahead; ++i) ring_.prefetch_unlink(doomed_[i]);
        for (std::size_t i = 0; i < k; ++i) {
            if (i + ahead < k) ring_.prefetch_unlink(doomed_[i + ahead]);
            ring_.unlink(doomed_[i]);
            unlinked_[i] = doomed_[i];
        }
        unlinked_count_ = k;
        doomed_count_ = 0;
    }

    // Under the lock: bury(), and the references it kept dropped too (stop()).
    void bury_all() noexcept {
        bury();
        let_go();
    }

    // Under the lock: drops the timer's reference to each node the last bury() unlinked, and frees
    // those nobody else holds.
    void let_go() noexcept {
        for (std::size_t i = 0; i < unlinked_count_; ++i) {
            node* n = unlinked_[i];
            if (n->drop()) this->pool_.free_local(n, n->ops()->size, n->ops()->align);
        }
        unlinked_count_ = 0;
    }

    // Under the lock: when advance() will next have something to run. Nothing, when nothing is
    // pending, even if the ring still holds cancelled nodes (the next bury() takes them).
    std::optional<time_point> next_due() const {
        if (pending_ == 0) return std::nullopt;
        const std::optional<time_point> t = ring_.next_expiry();
        if (!t || precise_) return t;
        return ring_.ceil_to_grid(*t);
    }

    // Under the lock, for reschedule(): n, in the batch and not yet run, leaves it for the ring,
    // with a reference of the ring's own: the batch's array keeps it, and the runner skips it and
    // drops the batch's reference.
    void leave_batch(node& n) noexcept {
        n.prev = nullptr;
        n.acquire();
    }

    // Under the lock, for shut(): takes every pending node out of the ring and the batch, into
    // the batch's room, which it returns: records of nodes out of every list, each with one
    // reference (the ring's, or the batch's), states still pending (the caller sets them). The
    // room holds them all: it was made for every pending node.
    typename due_batch<Clock>::room take_everything() noexcept {
        bury_all();
        // A pass under way has claimed or skipped the nodes before next_in_batch_ (they may be
        // freed already); the rest leave the batch with its reference: the runner finds nothing
        // more to run. Of those, a node cancelled or moved to the ring meanwhile is not ours.
        typename due_batch<Clock>::room r =
            batch_.give_up(advancing_ ? next_in_batch_ : batch_.size());
        std::size_t kept = 0;
        for (std::size_t i = 0; i < r.recs.size(); ++i) {
            node* n = r.recs[i].n;
            if (n->place() != node_place::batch) {
                timer_core<Clock>::release(*n);
                continue;
            }
            n->prev = nullptr;
            r.recs[kept++] = deadline_rec<Clock>::of(n);
        }
        r.recs.set_size(kept);
        pending_ = 0;
        ring_.take_all([&r](node* n) { r.recs.push_back(deadline_rec<Clock>::of(n)); });
        return r;
    }

    mutable spin_lock lock_;  // the ring, the pool, the batch marks, the counts and the states
    Ring ring_;
    due_batch<Clock> batch_;          // the current pass's due nodes, while advancing_
    std::size_t next_in_batch_ = 0;   // the first one the runner has not claimed yet
    std::size_t pending_ = 0;         // in the ring, or in the batch and not yet claimed
    std::size_t room_ = 0;            // how many nodes the ring and a pass have room for
    std::size_t doomed_count_ = 0;    // in doomed_
    std::size_t unlinked_count_ = 0;  // in unlinked_
    std::uint32_t seq_ = 0;
    bool stopped_ = false;
    bool advancing_ = false;
    std::thread::id advancer_{};
    std::size_t turn_waiters_ = 0;
    std::mutex turn_m_;                     // what a pass waiting for another's to end sleeps with
    std::condition_variable turn_cv_;       // ... and where
    time_point armed_ = time_point::min();  // when the driver looks again by itself; min: never
    std::shared_ptr<wheel_waker> waker_;    // the driver's; null for a thread-free wheel
    const std::size_t max_pending_;
    const on_error_fn on_error_;
    const bool precise_;
    // Last, so that the members every schedule touches share their cache lines.
    //
    // When a cancelled node's block goes back to the pool (if no handle holds it too). cancel()
    // puts a node of the ring in doomed_; bury() unlinks it into unlinked_; let_go() drops the
    // timer's reference. bury() runs when doomed_ is full (the 64th cancel), when a pass begins,
    // when a cancel leaves nothing pending, and at stop(); let_go() at the next bury(), at the
    // end of a pass (or at its beginning when nothing is due), and, with bury(), when a cancel
    // leaves nothing pending or stop() comes. So the block of a node cancelled in the ring goes
    // back:
    //   in count: within 128 later cancels (two fillings of doomed_);
    //   in time: by the end of the next pass, which a threaded wheel's worker makes no later than
    //     the earliest deadline still pending (a thread-free wheel: the next advance() that finds
    //     anything due, or none), and at once when nothing is pending any more; at stop().
    // A wheel thus keeps at most 128 cancelled nodes, and none while nothing is pending. A node
    // cancelled in the batch is the runner's: it drops the batch's reference when it meets it.
    static constexpr std::size_t max_doomed = 64;
    node* doomed_[max_doomed];    // cancelled, still in the ring: bury() unlinks them
    node* unlinked_[max_doomed];  // unlinked by the last bury(), the timer's references kept
};

}  // namespace delayq::detail
