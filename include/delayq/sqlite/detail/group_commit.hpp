// Group commit for delayq::sqlite's writes. Part of <delayq/sqlite/delay_queue.hpp>.
//
// A durable put waits for an fsync (~0.3 ms here, far more on a disk); one fsync per put would
// cap a queue at a few thousand puts a second whatever the CPU. So concurrent callers share one:
// each appends its batch (one put, or a put_many) to a list and waits; one of them, the leader,
// takes everything listed (up to a cap), commits it in one transaction with one fsync, and wakes
// the others with their results. Callers that arrive during that commit form the next group, whose
// leader is one of them. A caller alone commits alone, at once: no timer, no waiting for company.
//
// Takes, acks and nacks go through it too: they need no fsync, but every transaction costs a few
// system calls (locks, one write per page changed), which a shared one pays once.
//
// Why the fsync is inside the commit, with the file's write lock held (synchronous=FULL), though
// the takes and acks in the group, and those of the next, then wait for the disk too. Two ways
// around that were measured and were no better end to end on this machine (4 producers, 4
// consumers; the figures move by ±30 % from run to run here): committing with
// synchronous=NORMAL and then an fdatasync of the WAL outside the lock, by whichever group had
// committed (1 400-2 100 jobs/s against 3 300-4 300: each producer started an fsync of its own
// as soon as it had committed, so fewer puts shared each); and puts in a group commit of their
// own whose leader does that fdatasync while it leads, so that the next puts wait and share the
// next one, takes and acks in another (3 100-3 500 against 3 700-3 800). With one writer per
// file, the transactions themselves are what bounds the flow here.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <vector>

namespace delayq::sqlite::detail {

template <class Item>
class group_commit {
  public:
    /// One caller's items and, once done, the error that its group's commit ended with.
    struct batch {
        std::span<Item> items;
        std::exception_ptr error;
        bool done = false;
        std::condition_variable wake{};  // its caller sleeps here: woken when done, or to lead
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
                leading_ = false;
                // The done ones return, and the oldest of the others (if any) leads the next
                // group: one wake-up each, none for the callers that still wait. Under m_: a
                // batch lives until its caller sees `done`.
                for (batch* g : group) {
                    g->error = error;
                    g->done = true;
                    if (g != &b) g->wake.notify_one();
                }
                if (!pending_.empty()) pending_.front()->wake.notify_one();
                continue;
            }
            b.wake.wait(lk);
        }
    }

  private:
    std::mutex m_;
    std::vector<batch*> pending_;  // waiting for a leader, oldest first
    bool leading_ = false;         // a group is being committed
};

/// Makes commits durable after the write lock is released: one fsync, by one of the waiting
/// callers, covers every commit made before it began; the commits made meanwhile share the next.
class sync_barrier {
  public:
    /// Under the writer's lock, right after a commit that must become durable: its number.
    std::uint64_t committed() {
        std::lock_guard lk(m_);
        return ++committed_;
    }

    /// Returns once commit `n` is durable, having run `sync()` (an fsync of everything written so
    /// far) itself if no other caller was at it; rethrows what its own sync() threw.
    template <class Sync>
    void wait(std::uint64_t n, Sync&& sync) {
        std::unique_lock lk(m_);
        while (synced_ < n) {
            if (syncing_) {
                cv_.wait(lk);
                continue;
            }
            syncing_ = true;
            const std::uint64_t upto = committed_;  // written before the fsync begins
            lk.unlock();
            std::exception_ptr error;
            try {
                sync();
            } catch (...) {
                error = std::current_exception();
            }
            lk.lock();
            syncing_ = false;
            if (!error) synced_ = std::max(synced_, upto);
            cv_.notify_all();  // done, or another caller tries again with a sync of its own
            if (error) std::rethrow_exception(error);
        }
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    std::uint64_t committed_ = 0;  // commits to make durable, numbered in commit order
    std::uint64_t synced_ = 0;     // every commit up to this one is durable
    bool syncing_ = false;         // a caller is in sync()
};

}  // namespace delayq::sqlite::detail
