// A scope in which a held lock is let go: the takers of the job queues run a claim, a wait on
// their store or a commit without their own lock, and must hold it again however that scope is
// left (a return, an exception).
#pragma once

#include <mutex>

namespace delayq::detail::job_queue {

// Unlocks `lk` while it lives, and locks it again however the scope is left.
class unlocked {
  public:
    explicit unlocked(std::unique_lock<std::mutex>& lk) : lk_(lk) { lk_.unlock(); }
    ~unlocked() { lk_.lock(); }
    unlocked(const unlocked&) = delete;
    unlocked& operator=(const unlocked&) = delete;
    unlocked(unlocked&&) = delete;
    unlocked& operator=(unlocked&&) = delete;

  private:
    std::unique_lock<std::mutex>& lk_;
};

}  // namespace delayq::detail::job_queue
