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
// the next call (the oldest waiting one is, when a call returns). So no thread serves others for
// longer than its own call takes, and a thread hands off no more than it did to the link alone.
//
// Time. A call merged with others keeps its own io_timeout: the call that carries it spends the
// budget of the oldest call in it (script_client.hpp), and a call whose time ran out while it
// waited for its turn is not sent but fails, as the link fails one handed in behind a hung call.
//
// Sharing. Every queue object of the process that uses the same shard of the same queue on the
// same server as the same user, with the same options, shares one merger for it
// (shared_in_process.hpp, keyed by all of those): a user who gives each thread its own object gets
// the merging that one shared object gets. A child process after fork() gets mergers of its own.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "shared_in_process.hpp"

namespace delayq::redis::detail {

// One call handed in to a merger: how many jobs (or settlements) it carries, and how it learns
// its fate (combined: answered, or its turn to send).
struct merged_call : combined {
    std::size_t units = 1;
    steady::time_point start = steady::now();  // its budget begins here, merged or not
    merged_call* next = nullptr;  // the merger's: the next call waiting, or in the batch
};

// Calls of one kind for one shard; `Call` derives from merged_call. Nothing here allocates, so
// nothing here can fail between a call handed in and its answer.
template <class Call>
class merger {
  public:
    // `depth`: calls of this kind on their way at a time; `most`: units in one call (a call
    // with more goes alone).
    merger(std::size_t depth, std::size_t most) : depth_(depth), most_(most) {}
    merger(const merger&) = delete;
    merger& operator=(const merger&) = delete;

    // Sends `c` in one call with others. `send(first)`, on one thread, sends the calls of the
    // batch that begins at `first` (c; each call's `next` is the one after it, the last one's
    // null) in one script call and answers every one of them: its result, then
    // combined::signal(done), after which it touches that call no more. It must not throw.
    // Returns once c is answered.
    template <class Send>
    void run(Call& c, Send&& send) {
        c.next = nullptr;
        bool queued = false;
        {
            std::lock_guard lk(m_);
            if (on_way_ < depth_) {
                ++on_way_;
            } else {
                (tail_ != nullptr ? tail_->next : head_) = &c;
                tail_ = &c;
                queued = true;
            }
        }
        if (queued && c.await() == combined::done) return;
        // c's thread sends: c, then the calls waiting, oldest first.
        {
            std::lock_guard lk(m_);
            std::size_t units = c.units;
            merged_call* last = &c;
            while (head_ != nullptr && units + head_->units <= most_) {
                units += head_->units;
                last->next = head_;
                last = head_;
                pop();
            }
            last->next = nullptr;
        }
        send(c);
        Call* after = nullptr;  // sends the next call
        {
            std::lock_guard lk(m_);
            if (head_ == nullptr) {
                --on_way_;
            } else {
                after = static_cast<Call*>(head_);
                pop();
            }
        }
        if (after != nullptr) after->signal(combined::lead);
    }

  private:
    // Under m_: the oldest waiting call leaves the queue.
    void pop() noexcept {
        head_ = head_->next;
        if (head_ == nullptr) tail_ = nullptr;
    }

    std::mutex m_;
    merged_call* head_ = nullptr;  // under m_: the calls waiting, oldest first (through `next`)
    merged_call* tail_ = nullptr;
    std::size_t on_way_ = 0;  // under m_: calls being sent (each by the thread of its first call)
    std::size_t depth_, most_;
};

}  // namespace delayq::redis::detail
