// The combiner: calls of many threads, sent as one round trip or one transaction, each caller with
// its own answer and its own failure. Used by the Redis scripts (one script call for the puts, or
// the consumes, of one shard) and by SQLite's writes (one transaction, one fsync).
//
// The idea. A store call's fixed cost is a large part of what a one-job call costs: for a Redis
// script, reading and parsing the command, setting the script up, TIME, the reply; for SQLite, a
// transaction's locks and writes, and a durable put's fsync. So while a call of one kind is on its
// way, the calls of that kind that threads hand in meanwhile wait, and go together as the next
// call when it returns: four consumers' acks and takes in one consume call, four producers' puts
// in one put call or one transaction. Nothing about a job changes: each take still leases its own
// jobs, each counted as an attempt in that call, before any of them returns; each ack or put gets
// its own answer. A thread alone waits for nobody: its call goes at once.
//
// Who sends: flat combining. One call of a kind is on its way at a time. A thread that hands in
// a call when none is sends it, with the calls waiting (oldest first, up to max_batch jobs in
// all); the others wait on their own condition: answered, or told that it sends the next call.
// When a call returns, the oldest calls waiting that fit in one call go next, and the newest of
// them is told to send them. Until that thread has woken and taken its batch, a thread that hands
// in a call that fits with them (often the one whose call just returned: it is running already)
// sends in its place, at once, with those calls and its own, and the one told goes back to
// waiting, to be answered with the others. Why: the sender must be the youngest call of its batch
// (see "Time"), so a call handed in during that wake-up cannot be carried by the one told; left
// to wait, it would go a round trip later, in smaller batches (more script calls a job, more
// server time); sending in its place, it goes in the next call, which leaves without waiting for
// a thread to wake. So no thread serves others for longer than its own call takes, and the oldest
// call waiting always goes next: a stream of younger calls cannot starve it.
//
// Time. Every call keeps its own deadline (Redis: its io_timeout after it was handed in; SQLite
// calls have none: each lock wait has busy_timeout instead), and returns or
// fails by then: a call merged with others is never failed at an older call's deadline. So the
// call that sends a batch is its youngest (the one told to send is the newest of the calls it
// takes; one that sends in its place was handed in after all of them), and the batch's exchange
// with the server spends the sender's budget, which ends last; the older calls in it wait only
// until their own deadlines. (Every object that shares a combiner has the same io_timeout, so the
// newest call's deadline is the latest; a call whose deadline is later than its sender's, handed
// in a moment after it yet queued first, waits for the next call.) One whose deadline passes
// while it waits for its turn leaves the queue and fails unsent (nothing of it reached the
// server); one whose deadline passes while its batch is on its way gives up there, alone, with
// an error that says it may have run (as a call of the link does whose reply is late), and the
// sender drops its answer when it comes (the jobs leased for a take that gave up go to the takes
// still waiting, or back to the queue: redis/detail/script_client.hpp's consume()). A call that
// gives up is gone at once, so the sender copies the arguments of the calls it carries when it
// takes them into its batch, and touches none of them afterwards but under the combiner's lock,
// once it has claimed those still waiting for their answers.
//
// Sharing (Redis). Every queue object of the process that uses the same shard of the same queue on
// the same server as the same user, with the same options, shares one combiner for it
// (redis/detail/shared_in_process.hpp): a user who gives each thread its own object gets the
// merging that one shared object gets. A child process after fork() gets combiners of its own:
// the parent's may count calls of threads that the child does not have.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "handoff.hpp"

namespace delayq::detail::job_queue {

using steady = std::chrono::steady_clock;

// How a call handed in to a combiner learns its fate: answered (`done`), or its turn to send
// (`lead`, said only under the combiner's lock).
struct call_states {
    enum state : int { waiting, done, lead };
};

// One call handed in to a combiner: how many jobs (or settlements) it carries, its deadline, and
// its mailbox.
struct combined_call : call_states, handoff<call_states::state, call_states::lead> {
    std::size_t units = 1;
    steady::time_point start = steady::now();  // its budget begins here, merged or not
    steady::time_point deadline = steady::time_point::max();  // the caller's (max: none)

    // The combiner's, under its lock. Where the call is: in the queue (`leading` too: told to send,
    // not yet woken to do it); carried by another call's batch (member `slot` of it); being
    // answered.
    enum class spot { alone, queued, leading, carried, answering };
    spot at = spot::alone;
    combined_call* prev = nullptr;  // in the queue: the calls before and after it
    combined_call* next = nullptr;
    combined_call** slot = nullptr;  // carried: its place in the batch, nulled when it gives up
};

// Calls of one kind for one shard; `Call` derives from combined_call.
template <class Call>
class combiner {
  public:
    // How a call ended: answered (its result or failure is in it); unsent: its deadline passed
    // before it was sent; abandoned: its deadline passed while it was on its way (it may have
    // run). In the last two it is untouched: the caller makes its error.
    enum class fate { answered, unsent, abandoned };

    // The calls a sender carries with its own, oldest first. Until claim() a carried call may give
    // up and leave at any moment, so only the combiner's lock may look at them.
    class batch {
      public:
        std::size_t size() const noexcept { return members_.size(); }
        // From then on no member gives up: each waits for its answer (at(i)), or is gone already
        // (at(i) null).
        void claim() noexcept {
            std::lock_guard lk(*m_);
            for (combined_call* k : members_)
                if (k != nullptr) k->at = combined_call::spot::answering;
        }
        // After claim(): member i, or null if it gave up.
        Call* at(std::size_t i) const noexcept { return static_cast<Call*>(members_[i]); }

      private:
        friend class combiner;
        explicit batch(std::mutex& m) : m_(&m) {}
        std::mutex* m_;
        std::vector<combined_call*> members_;
    };

    // `most`: units in one call (a call with more goes alone).
    explicit combiner(std::size_t most) : most_(most) {}
    combiner(const combiner&) = delete;
    combiner& operator=(const combiner&) = delete;

    // Sends `c` in one call with others, or has another call carry it. When c's thread sends,
    // `carry(k)` is called, under the combiner's lock, for each call k that it takes into its batch
    // (oldest first): it copies what it needs of k (its arguments), or throws to leave k waiting
    // (out of memory). Then `send(c, b)`, on c's thread, sends c and the calls of b in one store
    // call, claims b (batch::claim) and answers each member still there: its result or failure,
    // then combined_call::signal(done), after which it touches that call no more. c's own answer is
    // put in c, unsignalled. `send` must not throw. Returns c's fate.
    template <class Carry, class Send>
    fate run(Call& c, Carry&& carry, Send&& send) {
        c.next = c.prev = nullptr;
        c.slot = nullptr;
        c.at = combined_call::spot::alone;
        batch b(m_);
        bool queued = false;
        {
            std::lock_guard lk(m_);
            if (lead_ != nullptr && c.units + lead_units_ <= most_ &&
                lead_->deadline <= c.deadline) {
                // The call told to send has not taken its batch yet: c, which can carry that
                // batch, sends in its place, and the call told waits with the others, to be
                // carried below.
                lead_->at = combined_call::spot::queued;
                lead_->take_back();
                lead_ = nullptr;
            } else if (!busy_) {
                busy_ = true;
            } else {
                enqueue(c);
                queued = true;
            }
            if (!queued && !take(c, b, carry)) {
                hand_on_locked();  // its time is up already: it is not sent
                return fate::unsent;
            }
        }
        if (queued)
            if (const std::optional<fate> f = wait(c, b, carry)) return *f;
        send(c, b);
        {
            std::lock_guard lk(m_);
            hand_on_locked();
        }
        return fate::answered;
    }

  private:
    // Waits for c's turn or answer, until its deadline (then it gives up: unsent while it waits
    // for its turn, abandoned while carried). An answer or a give-up is its fate; nullopt: c
    // sends, with `b` taken.
    template <class Carry>
    std::optional<fate> wait(Call& c, batch& b, Carry& carry) noexcept {
        for (;;) {
            if (c.await_until(c.deadline) == combined_call::done) return fate::answered;
            // Told to send, or out of time, or its lead taken back: where is it now?
            std::unique_lock lk(m_);
            const bool late = steady::now() >= c.deadline;
            switch (c.at) {
                case combined_call::spot::leading:  // its turn (said under m_, so said already)
                    c.take_back();
                    lead_ = nullptr;
                    unlink(c);
                    c.at = combined_call::spot::alone;
                    if (late || !take(c, b, carry)) {  // its turn came too late: it is not sent
                        hand_on_locked();
                        return fate::unsent;
                    }
                    return std::nullopt;
                case combined_call::spot::queued:
                    if (!late) break;  // another thread sent in its place: it waits on
                    unlink(c);
                    c.at = combined_call::spot::alone;
                    return fate::unsent;
                case combined_call::spot::carried:
                    if (!late) break;   // on its way, sent by another
                    *c.slot = nullptr;  // its sender will find it gone
                    c.at = combined_call::spot::alone;
                    return fate::abandoned;
                case combined_call::spot::answering:  // its answer is on its way: it waits for it
                    lk.unlock();
                    c.await(combined_call::done);
                    return fate::answered;
                case combined_call::spot::alone:
                    break;
            }
        }
    }

    // Under m_: c (alone, not in the queue) is to send: it takes into `b` the calls waiting,
    // oldest first, as many as fit with it in one call, but those out of time (they leave by
    // themselves) or younger than c. False, with nothing taken, when c itself is out of time.
    template <class Carry>
    bool take(Call& c, batch& b, Carry& carry) noexcept {
        const auto now = steady::now();
        if (now >= c.deadline) return false;
        std::size_t units = c.units;
        try {
            for (combined_call* k = head_; k != nullptr && units + k->units <= most_;) {
                combined_call* const after = k->next;
                if (k->deadline > now && k->deadline <= c.deadline) {
                    b.members_.push_back(nullptr);
                    try {
                        carry(static_cast<Call&>(*k));
                    } catch (...) {
                        b.members_.pop_back();
                        throw;
                    }
                    b.members_.back() = k;
                    unlink(*k);
                    k->at = combined_call::spot::carried;
                    units += k->units;
                }
                k = after;
            }
        } catch (...) {  // out of memory: the batch is what it holds so far
        }
        for (combined_call*& k : b.members_) k->slot = &k;  // the array is final now
        return true;
    }

    // Under m_: a call's sender is done with it, or the call told to send gave up. The next batch
    // is the oldest calls waiting, as many as fit in one call, and the newest of them is told to
    // send it (its deadline is the latest, so its budget serves every call it carries); with none
    // waiting, no call is on its way. Said under m_, so that whoever finds the call `leading`
    // knows that the signal has been given (and may take it back).
    void hand_on_locked() noexcept {
        combined_call* after = nullptr;
        std::size_t units = 0;
        for (combined_call* k = head_;
             k != nullptr && (after == nullptr || units + k->units <= most_); k = k->next) {
            units += k->units;
            after = k;
        }
        lead_ = after;
        lead_units_ = units;
        busy_ = after != nullptr;
        if (after == nullptr) return;
        after->at = combined_call::spot::leading;
        after->signal(combined_call::lead);
    }

    // Under m_: `c` joins the queue, newest last.
    void enqueue(combined_call& c) noexcept {
        c.at = combined_call::spot::queued;
        c.prev = tail_;
        c.next = nullptr;
        (tail_ != nullptr ? tail_->next : head_) = &c;
        tail_ = &c;
    }

    // Under m_: `c` leaves the queue.
    void unlink(combined_call& c) noexcept {
        (c.prev != nullptr ? c.prev->next : head_) = c.next;
        (c.next != nullptr ? c.next->prev : tail_) = c.prev;
        c.prev = c.next = nullptr;
    }

    std::mutex m_;
    combined_call* head_ = nullptr;  // under m_: the calls waiting, oldest first
    combined_call* tail_ = nullptr;
    bool busy_ = false;  // under m_: a call is on its way, or lead_ is told to send the next
    combined_call* lead_ = nullptr;  // under m_: told to send, not yet woken to take its batch
    std::size_t lead_units_ = 0;     // under m_: the units of lead_ and the calls before it
    std::size_t most_;
};

}  // namespace delayq::detail::job_queue
