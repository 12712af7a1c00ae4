// Calls of many threads, sent as one script call. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. The consume and put scripts (scripts.hpp) serve any number of jobs in one call, and a
// call's fixed cost is a large part of what a one-job call costs the server: reading and parsing
// the command, setting the script up, TIME, the look at the head of `events`, the reply. So while
// a call of one kind for one queue shard is on its way, the calls of that kind that threads hand
// in meanwhile wait, and go together as the next call when it returns: four consumers' acks and
// takes in one consume call, four producers' puts in one put call. Nothing about a job changes:
// each take still leases its own jobs, each counted as an attempt in that call, before any of
// them returns; each ack or put gets its own answer. A thread alone waits for nobody: its call
// goes at once, as before.
//
// Who sends: flat combining. A thread that hands in a call when fewer than `depth` calls of that
// kind are on their way sends it, with the calls waiting (oldest first, up to max_batch jobs in
// all); the others wait on their own condition, each woken once: answered, or told that it sends
// the next call. So no thread serves others for longer than its own call takes, and a thread hands
// off no more than it did to the link alone.
//
// Time. Every call keeps its own deadline, its io_timeout after it was handed in, and returns or
// fails by then: a call merged with others is never failed at an older call's deadline. So the
// call that sends a batch is its youngest (when a call returns, the oldest calls waiting that fit
// in one call go next, sent by the newest of them), and the batch's exchange with the server
// spends the sender's budget, which ends last; the older calls in it wait only until their own
// deadlines. One whose deadline passes while it waits for its turn leaves the queue and fails
// unsent (nothing of it reached the server); one whose deadline passes while its batch is on its
// way gives up there, alone, with an error that says it may have run (as a call of the link does
// whose reply is late), and the sender drops its answer when it comes (the jobs leased for a take
// that gave up go to the takes still waiting, or back to the queue: script_client.hpp's
// consume()). A call that gives up is gone at once, so the sender copies the arguments of the
// calls it carries when it takes them into its batch, and touches none of them afterwards but
// under the merger's lock, once it has claimed those still waiting for their answers.
//
// Sharing. Every queue object of the process that uses the same shard of the same queue on the
// same server as the same user, with the same options, shares one merger for it
// (shared_in_process.hpp, keyed by all of those): a user who gives each thread its own object gets
// the merging that one shared object gets. A child process after fork() gets mergers of its own:
// the parent's may count calls of threads that the child does not have (script_client.hpp asks
// for them again in a child).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "shared_in_process.hpp"

namespace delayq::redis::detail {

// One call handed in to a merger: how many jobs (or settlements) it carries, its deadline, and how
// it learns its fate (combined: answered, or its turn to send).
struct merged_call : combined {
    std::size_t units = 1;
    steady::time_point start = steady::now();  // its budget begins here, merged or not
    steady::time_point deadline = steady::time_point::max();  // the caller's: start + io_timeout

    // The merger's, under its lock. Where the call is: in the queue; told to send (the signal is
    // on its way); carried by another call's batch (member `slot` of it); being answered.
    enum class spot { alone, queued, leading, carried, answering };
    spot at = spot::alone;
    merged_call* prev = nullptr;  // in the queue: the calls before and after it
    merged_call* next = nullptr;
    merged_call** slot = nullptr;  // carried: its place in the batch, nulled when it gives up
};

// Calls of one kind for one shard; `Call` derives from merged_call.
template <class Call>
class merger {
  public:
    // How a call ended: answered (its result or failure is in it); unsent: its deadline passed
    // before it was sent; abandoned: its deadline passed while it was on its way (it may have
    // run). In the last two it is untouched: the caller makes its error.
    enum class fate { answered, unsent, abandoned };

    // The calls a sender carries with its own, oldest first. Until claim() a carried call may give
    // up and leave at any moment, so only the merger's lock may look at them.
    class batch {
      public:
        std::size_t size() const noexcept { return members_.size(); }
        // From then on no member gives up: each waits for its answer (at(i)), or is gone already
        // (at(i) null).
        void claim() noexcept {
            std::lock_guard lk(*m_);
            for (merged_call* k : members_)
                if (k != nullptr) k->at = merged_call::spot::answering;
        }
        // After claim(): member i, or null if it gave up.
        Call* at(std::size_t i) const noexcept { return static_cast<Call*>(members_[i]); }

      private:
        friend class merger;
        explicit batch(std::mutex& m) : m_(&m) {}
        std::mutex* m_;
        std::vector<merged_call*> members_;
    };

    // `depth`: calls of this kind on their way at a time; `most`: units in one call (a call
    // with more goes alone).
    merger(std::size_t depth, std::size_t most) : depth_(depth), most_(most) {}
    merger(const merger&) = delete;
    merger& operator=(const merger&) = delete;

    // Sends `c` in one call with others, or has another call carry it. When c's thread sends,
    // `carry(k)` is called, under the merger's lock, for each call k that it takes into its batch
    // (oldest first): it copies what it needs of k (its arguments), or throws to leave k waiting
    // (out of memory). Then `send(c, b)`, on c's thread, sends c and the calls of b in one script
    // call, claims b (batch::claim) and answers each member still there: its result or failure,
    // then combined::signal(done), after which it touches that call no more. c's own answer is
    // put in c, unsignalled. `send` must not throw. Returns c's fate.
    template <class Carry, class Send>
    fate run(Call& c, Carry&& carry, Send&& send) {
        c.next = c.prev = nullptr;
        c.slot = nullptr;
        bool queued = false;
        {
            std::lock_guard lk(m_);
            if (on_way_ < depth_) {
                ++on_way_;
                c.at = merged_call::spot::leading;
            } else {
                enqueue(c);
                queued = true;
            }
        }
        if (queued)
            if (const std::optional<fate> f = wait(c)) return *f;
        if (steady::now() >= c.deadline) {  // its turn came too late: it is not sent
            hand_on();
            return fate::unsent;
        }
        batch b(m_);
        {
            std::lock_guard lk(m_);
            c.at = merged_call::spot::alone;
            const auto now = steady::now();
            std::size_t units = c.units;
            try {
                for (merged_call* k = head_; k != nullptr && units + k->units <= most_;) {
                    merged_call* const after = k->next;
                    // One whose time is up leaves by itself; one younger than c (handed in after
                    // c was told to send) waits for a sender whose budget ends no earlier.
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
                        k->at = merged_call::spot::carried;
                        units += k->units;
                    }
                    k = after;
                }
            } catch (...) {  // out of memory: the batch is what it holds so far
            }
            for (merged_call*& k : b.members_) k->slot = &k;  // the array is final now
        }
        send(c, b);
        hand_on();
        return fate::answered;
    }

  private:
    // Waits for c's turn or answer, until its deadline: an answer is its fate; nullopt: it sends.
    std::optional<fate> wait(Call& c) noexcept {
        switch (c.await_until(c.deadline)) {
            case combined::done:
                return fate::answered;
            case combined::lead:
                return std::nullopt;
            case combined::waiting:
                break;
        }
        std::unique_lock lk(m_);
        switch (c.at) {
            case merged_call::spot::queued:  // not sent
                unlink(c);
                c.at = merged_call::spot::alone;
                return fate::unsent;
            case merged_call::spot::carried:  // on its way: its sender will find it gone
                *c.slot = nullptr;
                c.at = merged_call::spot::alone;
                return fate::abandoned;
            default:  // leading, answering: the signal is on its way
                lk.unlock();
                return c.await() == combined::done ? std::optional<fate>(fate::answered)
                                                   : std::nullopt;
        }
    }

    // A call's sender is done with it: the next batch is the oldest calls waiting, as many as
    // fit in one call, and the newest of them sends it (its deadline is the latest, so its budget
    // serves every call it carries); or, with none waiting, one call fewer is on its way. The
    // oldest call waiting always goes next: a stream of younger calls cannot starve it.
    void hand_on() noexcept {
        merged_call* after = nullptr;
        {
            std::lock_guard lk(m_);
            std::size_t units = 0;
            for (merged_call* k = head_;
                 k != nullptr && (after == nullptr || units + k->units <= most_); k = k->next) {
                units += k->units;
                after = k;
            }
            if (after == nullptr) {
                --on_way_;
            } else {
                unlink(*after);
                after->at = merged_call::spot::leading;
            }
        }
        if (after != nullptr) after->signal(combined::lead);
    }

    // Under m_: `c` joins the queue, newest last.
    void enqueue(merged_call& c) noexcept {
        c.at = merged_call::spot::queued;
        c.prev = tail_;
        c.next = nullptr;
        (tail_ != nullptr ? tail_->next : head_) = &c;
        tail_ = &c;
    }

    // Under m_: `c` leaves the queue.
    void unlink(merged_call& c) noexcept {
        (c.prev != nullptr ? c.prev->next : head_) = c.next;
        (c.next != nullptr ? c.next->prev : tail_) = c.prev;
        c.prev = c.next = nullptr;
    }

    std::mutex m_;
    merged_call* head_ = nullptr;  // under m_: the calls waiting, oldest first
    merged_call* tail_ = nullptr;
    std::size_t on_way_ = 0;  // under m_: batches being sent (each by the thread of its sender)
    std::size_t depth_, most_;
};

}  // namespace delayq::redis::detail
