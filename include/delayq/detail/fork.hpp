// Which fork() generation of the process this is: what was made, or last used, in an earlier
// generation belongs to the parent. A child process gets the parent's memory but none of its
// threads, so a lock, a waiting thread's place or a socket mid-call that the parent left there is
// not the child's to use; the structures that a child may use (the Redis client's links, the job
// queues' takers) compare the generation they last served with this one and start afresh when it
// changed.
#pragma once

#include <pthread.h>

#include <atomic>

namespace delayq::detail {

/// Forks of this process so far, counted in the child (pthread_atfork).
inline std::atomic<unsigned>& fork_count() noexcept {
    static std::atomic<unsigned> n{0};
    return n;
}

/// The current fork generation: 0 in the process that started, one more in each child.
inline unsigned fork_generation() noexcept {
    static const bool counting = [] {
        ::pthread_atfork(nullptr, nullptr,
                         [] { fork_count().fetch_add(1, std::memory_order_relaxed); });
        return true;
    }();
    (void)counting;
    return fork_count().load(std::memory_order_relaxed);
}

}  // namespace delayq::detail
