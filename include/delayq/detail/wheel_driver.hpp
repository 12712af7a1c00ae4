// wheel_driver<Core>: the one worker thread of a threaded wheel (hashed_wheel_timer, and
// hierarchical_timing_wheel with own_thread), shared by both: it starts with the first schedule,
// loops "sleep until the next expiry, run what is due", and is joined by stop() or the destructor —
// unless they are called by one of its own tasks.
//
// Join policy. stop() from another thread joins the worker. stop() from a task (on the worker)
// cannot: it returns at once, and the worker ends by itself after that task. The destructor from a
// task detaches the worker instead of joining it. Whether the caller is the worker is decided
// before anything is locked: a task that stops the timer while another thread is inside stop(),
// joining, must not wait for that thread's lock.
#pragma once

#include <chrono>
#include <mutex>
#include <thread>

#include "timer_node.hpp"

namespace delayq::detail {

template <class Core, class Clock>
class wheel_driver {
  public:
    /// Starts the worker unless it runs already. Throws rejected_error once the core is stopped.
    void start(Core& core) {
        if (core.started()) return;
        core.start_worker(thread_, [](Core& c) {
            reduce_timer_slack();
            while (c.wait_for_work(Clock::time_point::max())) c.advance(Clock::now());
        });
    }

    /// After core.shut(): joins the worker; on the worker itself, only detaches it when the
    /// timer is being destroyed (`destroying`).
    void finish(Core& core, bool destroying) {
        if (core.on_worker()) {
            if (destroying) {
                std::lock_guard lk(join_m_);
                if (thread_.joinable()) thread_.detach();
            }
            return;
        }
        std::lock_guard lk(join_m_);
        if (thread_.joinable()) thread_.join();
    }

  private:
    std::mutex join_m_;   // one joiner at a time
    std::thread thread_;  // written by start() under the core's lock, before any stop
};

}  // namespace delayq::detail
