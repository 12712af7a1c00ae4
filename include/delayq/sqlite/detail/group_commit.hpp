// Group commit for delayq::sqlite's writes. Part of <delayq/sqlite/delay_queue.hpp>.
//
// A durable put waits for an fsync (~0.3 ms here, far more on a disk); one fsync per put would
// cap a queue at a few thousand puts a second whatever the CPU. So concurrent callers share one:
// each appends its batch (one put, or a put_many) to a list and waits; one of them, the leader,
// takes everything listed (up to a cap), commits it in one transaction (one fsync for puts), wakes
// the others with their results. Callers that arrive during that commit form the next group, whose
// leader is one of them. A caller alone commits alone, at once: no timer, no waiting for company.
//
// delay_queue runs two: one for puts, cancels and reschedules, whose leader fsyncs after the
// commit, with the file's write lock released (so takes and acks commit during the fsync), and
// before it hands over, so that the puts that arrive meanwhile share the next fsync; and one for
// takes, acks and nacks, which need no fsync: every transaction costs a few system calls (locks,
// two writes per page changed), which a shared one pays once.
//
// Why two: with one, the takes and acks of a group, and of the next, waited for the puts' disk
// too, and consumers fell behind the producers. docs/sqlite.md has the measurements.
//
// A failed commit fails every batch of its group, each with an exception object of its own, made
// by the owner's copy function before the batches' callers are woken: callers that shared one
// would read it while another thread destroys it (delayq/detail/job_queue/exception_copy.hpp).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <span>
#include <vector>

namespace delayq::sqlite::detail {

template <class Item>
class group_commit {
  public:
    /// Makes one caller's own copy of a failure (never throws; may return its argument).
    using copy_fn = std::exception_ptr (*)(const std::exception_ptr&) noexcept;

    /// `copy` gives each batch of a failed group its own exception object.
    explicit group_commit(copy_fn copy) noexcept : copy_(copy) {}

    /// One caller's items and, once done, the error that its group's commit ended with.
    struct batch {
        std::span<Item> items;
        std::exception_ptr error;
        bool done = false;
    };

    /// Commits `b` with whatever else is waiting, through `commit(std::span<batch* const>)`, run
    /// by one of the waiting callers; returns once b's group is committed, or rethrows its
    /// error. At most `cap` items per group, but a batch is never split.
    template <class Commit>
    void submit(batch& b, std::size_t cap, Commit&& commit) {
        std::unique_lock lk(m_);
        pending_.push_back(&b);
        for (;;) {
            if (b.done) {
                if (b.error) std::rethrow_exception(b.error);
                return;
            }
            if (!leading_) {
                leading_ = true;
                std::vector<batch*> group;
                std::size_t n = 0, taken = 0;
                while (taken < pending_.size() &&
                       (group.empty() || n + pending_[taken]->items.size() <= cap)) {
                    n += pending_[taken]->items.size();
                    group.push_back(pending_[taken++]);
                }
                pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(taken));
                lk.unlock();
                std::exception_ptr error;
                try {
                    commit(std::span<batch* const>(group));
                } catch (...) {
                    error = std::current_exception();
                }
                lk.lock();
                for (batch* g : group) {
                    // The first batch keeps the original, each other one gets a copy.
                    g->error = error && g != group.front() ? copy_(error) : error;
                    g->done = true;
                }
                leading_ = false;
                // The done ones return; one of the others (if any) leads the next group.
                cv_.notify_all();
                continue;
            }
            cv_.wait(lk);
        }
    }

  private:
    copy_fn copy_;
    std::mutex m_;
    std::condition_variable cv_;
    std::vector<batch*> pending_;  // waiting for a leader, oldest first
    bool leading_ = false;         // a group is being committed
};

}  // namespace delayq::sqlite::detail
