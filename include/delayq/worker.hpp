// delayq::worker: runs a handler over any job queue (delayq::job_queue), on threads of its own:
// the loop that every user of a job queue would otherwise write again, with retries, lease
// extension and a shutdown that loses nothing.
//
//     delayq::worker w(queue, [](const delayq::job& j) { cancel_order(j.payload); });
//     ...                       // runs until
//     w.stop();                 // (or its destructor): the running handlers finish first
//
// What a handler's end means. It returns: the job is acked (done, if the ack held); on a queue
// that has ack_and_try_take (delayq::acks_and_takes: every delayq backend), that ack leases the
// next due job in the same round trip, and the thread runs it without a take (it takes, waiting,
// when none was due). It throws delayq::retry_in(d): nacked, due again d from now. It throws
// delayq::dead_letter(reason): to the dead letters at once (bury). It throws anything else:
// nacked with the retry policy's delay for its attempt, and what() as the reason; the queue's
// max_attempts then moves a job that keeps failing to the dead letters (a nack of its last attempt
// does). The reason is kept in the store as the job's last error, which get() and dead() show.
// Each of these is one call to the queue, fenced by the job's token, so a worker whose lease was
// lost changes nothing.
//
// Leases. A handler may run longer than the queue's lease: while it runs, its job's lease is
// extended by a lease every third of a lease (one thread of the worker does that for every
// running handler, so a short job costs no call). An extension that the queue refuses means the
// lease was lost (the job may be running elsewhere now): the handler's stop token is requested,
// and whatever the handler then does, this worker does not settle the job. An extension that
// fails (the store unreachable) is tried again until the lease would have ended.
//
// Stopping. stop() takes no new jobs (the takes blocked on an empty queue return at once: they
// wait on a stop token), waits up to drain_timeout for the running handlers, then requests their
// stop tokens and waits for them to return. A handler asked to stop did not finish: its job goes
// back to the queue, due now (a nack), whatever the handler returned. So nothing is lost: a job
// is acked only by a handler that finished, and a job whose worker died (a crash, SIGKILL) comes
// back when its lease ends, because its extensions stop.
//
// Errors of the queue (delayq::unavailable_error and the rest of delayq::queue_error) never end a
// worker: a take that fails is tried again after a pause (100 ms, doubling to 5 s, cut short by
// stop()), a settlement that fails is tried again while the lease holds; each failure goes to the
// `call_failed` hook.
//
// Threads. `threads` threads take and run handlers, and one more keeps the leases; each takes one
// job at a time, so at most `threads` handlers run at once. Hooks run on those threads; a hook
// that throws is ignored.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "job.hpp"
#include "job_queue.hpp"
#include "retry_policy.hpp"

namespace delayq {

/// Thrown by a handler: the job failed, and its next attempt is due `delay` from now (instead of
/// the retry policy's delay). The queue's max_attempts still applies.
class retry_in : public std::runtime_error {
  public:
    /// Retry after `delay` (negative: at once), for `reason`: the job's last error (see
    /// job_info). Without one, the job keeps the last error it had.
    explicit retry_in(std::chrono::milliseconds delay, const std::string& reason = {})
        : std::runtime_error(reason.empty() ? "retry_in" : reason),
          delay_(std::max(delay, std::chrono::milliseconds::zero())),
          keeps_error_(reason.empty()) {}

    /// How long the job waits before its next attempt.
    std::chrono::milliseconds delay() const noexcept { return delay_; }

    /// Whether it was thrown without a reason (the job's last error stays as it was).
    bool keeps_error() const noexcept { return keeps_error_; }

  private:
    std::chrono::milliseconds delay_;
    bool keeps_error_;
};

/// Thrown by a handler: the job can never succeed (a malformed payload, an order that no longer
/// exists), so it goes to the dead letters at once, whatever attempt it is.
class dead_letter : public std::runtime_error {
  public:
    /// To the dead letters, for `reason` (its what(), and the dead letter's last error).
    explicit dead_letter(const std::string& reason) : std::runtime_error(reason) {}
};

/// What a worker calls when something happens to a job; any of them may be empty. They run on the
/// worker's threads, so they must be safe to call from several at once; one that throws is
/// ignored.
struct worker_hooks {
    /// The handler failed and the job will be tried again `delay` from now.
    std::function<void(const job&, std::chrono::milliseconds delay, std::string_view reason)>
        retrying{};
    /// The job went to the dead letters (dead_letter, or its last attempt failed).
    std::function<void(const job&, std::string_view reason)> dead_lettered{};
    /// The job's lease was lost while its handler ran (it may be delivered to another consumer);
    /// this worker did not settle it.
    std::function<void(const job&)> lease_lost{};
    /// The handler threw (anything but retry_in and dead_letter): what() of what it threw.
    std::function<void(const job&, std::string_view what)> handler_error{};
    /// A call to the queue failed (a take, a settlement, an extension): the error's what(). The
    /// worker goes on: the call is tried again.
    std::function<void(std::string_view what)> call_failed{};
};

/// How a worker runs.
struct worker_options {
    std::size_t threads = 1;       ///< handlers that run at once (each on its own thread), >= 1
    delayq::retry_policy retry{};  ///< the delay after a handler throws
    /// How long stop() waits for running handlers before it requests their stop tokens, >= 0.
    std::chrono::milliseconds drain_timeout = std::chrono::seconds(30);
    /// The lease that each extension gives a running job, > 0; 0 (the default): the queue's own
    /// lease (its options' `lease`). A job is extended every third of it.
    std::chrono::milliseconds lease{0};
    worker_hooks hooks{};  ///< what to tell the application
};

/// A worker's counts since it started.
struct worker_counters {
    std::uint64_t done = 0;          ///< handlers that returned, whose ack held
    std::uint64_t retried = 0;       ///< jobs nacked for another attempt
    std::uint64_t dead = 0;          ///< jobs this worker moved to the dead letters
    std::uint64_t lease_lost = 0;    ///< jobs whose lease was lost while their handler ran
    std::uint64_t released = 0;      ///< jobs given back unfinished by stop()
    std::uint64_t failed_calls = 0;  ///< calls to the queue that failed (and were tried again)
    std::size_t in_flight = 0;       ///< handlers running now
    std::chrono::nanoseconds handler_time{0};  ///< time spent in handlers, all threads together
};

/// Runs a handler over the jobs of a queue Q, on threads of its own (see the top of this file).
/// Q's members must be safe to call from several threads at once (every delayq job queue's are),
/// and `queue` must outlive the worker.
template <job_queue Q>
class worker {
  public:
    using job_type = job_type_t<Q>;  ///< what the queue hands out (delayq::job)
    static_assert(std::is_convertible_v<const job_type&, const job&>,
                  "delayq::worker: the queue's job type must be delayq::job");

    /// Starts `options.threads` threads that run `handler` (`void(const job&)`, or
    /// `void(const job&, std::stop_token)`) over the jobs of `queue`. Throws std::invalid_argument
    /// for bad options (threads 0, a negative drain_timeout or lease, a bad retry policy).
    template <class Handler>
    requires std::invocable<Handler&, const job_type&> ||
        std::invocable<Handler&, const job_type&, std::stop_token>
        worker(Q& queue, Handler handler, worker_options options = {})
        : q_(queue), opt_(checked(std::move(options))), lease_(lease_of(queue, opt_)) {
        if constexpr (std::invocable<Handler&, const job_type&, std::stop_token>)
            handler_ = std::move(handler);
        else
            handler_ = [h = std::move(handler)](const job_type& j, const std::stop_token&) mutable {
                h(j);
            };
        slots_ = std::vector<slot>(opt_.threads);
        try {
            keeper_ = std::thread([this] { keep_leases(); });
            threads_.reserve(opt_.threads);
            for (std::size_t i = 0; i < opt_.threads; ++i) {
                {
                    std::lock_guard lk(m_);
                    ++running_;  // before it runs: stop() waits for it
                }
                try {
                    threads_.emplace_back([this, i] { run(slots_[i]); });
                } catch (...) {
                    std::lock_guard lk(m_);
                    --running_;
                    throw;
                }
            }
        } catch (...) {
            stop();
            throw;
        }
    }

    worker(const worker&) = delete;
    worker& operator=(const worker&) = delete;

    /// Stops (see stop()). Destroying a worker from its own thread (a handler, a hook) cannot wait
    /// for that thread: std::terminate.
    ~worker() {
        try {
            stop();
        } catch (...) {
            std::terminate();
        }
    }

    /// No new takes (blocked ones return at once); waits up to drain_timeout for the running
    /// handlers, then requests their stop tokens and waits for them to return; their jobs go back
    /// to the queue. Returns once every thread of the worker has ended. Safe to call more than
    /// once, and from several threads; from a handler or a hook (the worker's own threads, which
    /// it would wait for) it throws std::logic_error.
    void stop() {
        const auto self = std::this_thread::get_id();
        if (keeper_.get_id() == self ||
            std::any_of(threads_.begin(), threads_.end(),
                        [&](const std::thread& t) { return t.get_id() == self; }))
            throw std::logic_error("delayq::worker::stop() called from the worker's own thread");
        std::lock_guard stopping(stop_mutex_);
        if (stopped_) return;
        taking_.request_stop();
        {
            std::unique_lock lk(m_);
            if (!cv_.wait_for(lk, opt_.drain_timeout, [&] { return running_ == 0; })) {
                for (auto& s : slots_)
                    if (s.current) {
                        s.asked_to_stop = true;
                        s.source.request_stop();
                    }
            }
        }
        for (auto& t : threads_)
            if (t.joinable()) t.join();
        {
            std::lock_guard lk(m_);
            keeper_stop_ = true;
        }
        cv_.notify_all();
        if (keeper_.joinable()) keeper_.join();
        stopped_ = true;
    }

    /// The counts so far.
    worker_counters counters() const {
        std::lock_guard lk(m_);
        worker_counters c = counts_;
        c.in_flight = in_flight_;
        return c;
    }

  private:
    using clock = std::chrono::steady_clock;
    using milliseconds = std::chrono::milliseconds;

    // One thread's job while its handler runs, as the lease keeper sees it (under m_).
    struct slot {
        const job_type* current = nullptr;  // the running job, owned by the thread's run()
        clock::time_point extend_at;        // when the keeper extends its lease next
        std::chrono::system_clock::time_point lease_end;  // by what this worker knows
        std::stop_source source;     // the handler's; a new one after one was requested
        bool lost = false;           // an extension was refused: not ours to settle
        bool asked_to_stop = false;  // stop() requested the handler's stop token
        bool extending = false;      // the keeper is calling extend() for it now
    };

    static worker_options checked(worker_options o) {
        if (o.threads == 0) throw std::invalid_argument("delayq::worker: threads must be >= 1");
        if (o.drain_timeout < milliseconds::zero())
            throw std::invalid_argument("delayq::worker: drain_timeout must not be negative");
        if (o.lease < milliseconds::zero())
            throw std::invalid_argument("delayq::worker: lease must not be negative");
        o.retry.check();
        return o;
    }

    static milliseconds lease_of(Q& q, const worker_options& o) {
        if (o.lease > milliseconds::zero()) return o.lease;
        return std::chrono::duration_cast<milliseconds>(q.get_options().lease);
    }

    // Calls a hook, ignoring what it throws.
    template <class Hook, class... Args>
    static void tell(const Hook& hook, Args&&... args) noexcept {
        if (!hook) return;
        try {
            hook(std::forward<Args>(args)...);
        } catch (...) {
        }
    }

    void failed(std::string_view what) {
        {
            std::lock_guard lk(m_);
            ++counts_.failed_calls;
        }
        tell(opt_.hooks.call_failed, what);
    }

    // Sleeps `d`, or less if stop() is called.
    void pause(milliseconds d) {
        // (Before the lock: a stop already requested runs the callback here, at once.)
        std::stop_callback wake(taking_.get_token(), [&] {
            std::lock_guard inner(m_);
            cv_.notify_all();
        });
        std::unique_lock lk(m_);
        cv_.wait_for(lk, d, [&] { return taking_.stop_requested(); });
    }

    // One thread: take, run, settle, until stop().
    void run(slot& s) {
        const std::stop_token stop = taking_.get_token();
        milliseconds backoff(100);
        while (!stop.stop_requested()) {
            std::optional<job_type> j;
            try {
                j = q_.take(std::chrono::hours(1), stop);
                backoff = milliseconds(100);
            } catch (const std::exception& e) {
                failed(e.what());
                pause(backoff);
                backoff = std::min(backoff * 2, milliseconds(5000));
                continue;
            } catch (...) {
                failed("unknown exception");
                pause(backoff);
                backoff = std::min(backoff * 2, milliseconds(5000));
                continue;
            }
            // A job whose ack leased the next one hands that one on: no take for it.
            while (j) j = handle(s, *j);
        }
        std::lock_guard lk(m_);
        --running_;
        cv_.notify_all();
    }

    // What the handler's end asks for.
    struct outcome {
        enum kind_t { ack, retry, bury } kind = ack;
        milliseconds delay{0};
        std::string reason;
        bool error = false;        // the handler threw something of its own
        bool keeps_error = false;  // the job's last error is not `reason`'s to replace
    };

    outcome call_handler(const job_type& j, const std::stop_token& token) {
        try {
            handler_(j, token);
            return {};
        } catch (const retry_in& r) {
            return {outcome::retry, r.delay(), r.what(), false, r.keeps_error()};
        } catch (const dead_letter& d) {
            return {outcome::bury, milliseconds::zero(), d.what()};
        } catch (const std::exception& e) {
            return {outcome::retry, opt_.retry.delay(j.attempts, random()), e.what(), true};
        } catch (...) {
            return {outcome::retry, opt_.retry.delay(j.attempts, random()),
                    "an exception not derived from std::exception", true};
        }
    }

    // Runs the handler on `j` and settles it; returns the next job if the ack leased one
    // (ack_and_try_take).
    std::optional<job_type> handle(slot& s, const job_type& j) {
        std::stop_token token;
        {
            std::lock_guard lk(m_);
            if (s.source.stop_requested()) s.source = std::stop_source();
            s.current = &j;
            s.lost = s.asked_to_stop = false;
            s.extend_at = clock::now() + every_;
            s.lease_end = j.lease_deadline;
            token = s.source.get_token();
            ++in_flight_;
        }
        // No notify: the keeper wakes at least every lease / 3, which is when this job's first
        // extension is due.
        const auto started = clock::now();
        outcome o = call_handler(j, token);
        const auto took = clock::now() - started;
        bool lost = false, asked_to_stop = false;
        std::chrono::system_clock::time_point lease_end;  // as extended: settle()'s limit
        {
            std::unique_lock lk(m_);
            cv_.wait(lk, [&] { return !s.extending; });  // no extension of a settled job
            s.current = nullptr;
            lost = s.lost;
            asked_to_stop = s.asked_to_stop;
            lease_end = s.lease_end;
            --in_flight_;
            counts_.handler_time += took;
        }
        if (o.error) tell(opt_.hooks.handler_error, static_cast<const job&>(j), o.reason);
        if (lost) {
            {
                std::lock_guard lk(m_);
                ++counts_.lease_lost;
            }
            tell(opt_.hooks.lease_lost, static_cast<const job&>(j));
            return std::nullopt;
        }
        if (asked_to_stop) {
            o = {outcome::retry, milliseconds::zero(), "stopped by delayq::worker::stop()", false,
                 true};  // not the job's failure: its last error stays
            if (settle(lease_end, [&] { return nack(j, o); })) count(&worker_counters::released);
            return std::nullopt;
        }
        std::optional<job_type> next;
        switch (o.kind) {
            case outcome::ack:
                if (ack(lease_end, j, next))
                    count(&worker_counters::done);
                else
                    lease_was_lost(j);
                return next;
            case outcome::bury:
                if (settle(lease_end, [&] { return q_.bury(j, o.reason); })) {
                    count(&worker_counters::dead);
                    tell(opt_.hooks.dead_lettered, static_cast<const job&>(j), o.reason);
                } else {
                    lease_was_lost(j);
                }
                return std::nullopt;
            case outcome::retry:
                if (!settle(lease_end, [&] { return nack(j, o); })) {
                    lease_was_lost(j);
                } else if (const unsigned max = q_.get_options().max_attempts;
                           max > 0 && j.attempts >= max) {
                    count(&worker_counters::dead);
                    tell(opt_.hooks.dead_lettered, static_cast<const job&>(j), o.reason);
                } else {
                    count(&worker_counters::retried);
                    tell(opt_.hooks.retrying, static_cast<const job&>(j), o.delay, o.reason);
                }
                return std::nullopt;
        }
        return std::nullopt;
    }

    // Acks `j` as settle() does; where the queue can (delayq::acks_and_takes) and stop() has not
    // been called, the first try also leases the next due job (`next`) in the same round trip, so
    // that this thread needs no take for it. A first try that throws may or may not have been
    // applied: the retries are plain acks, which the token fences (an ack that was applied is
    // refused, as any retried settlement), and the job it may have leased comes back at its lease
    // end, as any lease nobody settles.
    bool ack(std::chrono::system_clock::time_point lease_end, const job_type& j,
             std::optional<job_type>& next) {
        if constexpr (acks_and_takes<Q>) {
            bool first = !taking_.stop_requested();
            return settle(lease_end, [&] {
                if (!std::exchange(first, false)) return q_.ack(j);
                ack_take_result r = q_.ack_and_try_take(j);
                next = std::move(r.next);
                return r.acked;
            });
        } else {
            return settle(lease_end, [&] { return q_.ack(j); });
        }
    }

    // A nack of `j` for the outcome `o`, with o's reason as the job's last error unless it keeps
    // the one it had.
    bool nack(const job_type& j, const outcome& o) {
        return o.keeps_error ? q_.nack(j, o.delay) : q_.nack(j, o.delay, o.reason);
    }

    void count(std::uint64_t worker_counters::*which) {
        std::lock_guard lk(m_);
        ++(counts_.*which);
    }

    void lease_was_lost(const job_type& j) {
        count(&worker_counters::lease_lost);
        tell(opt_.hooks.lease_lost, static_cast<const job&>(j));
    }

    // Runs `call` (an ack, a nack, a bury) and returns what it returned; a call that throws is
    // tried again, after a pause, while the job's lease may still hold: until `lease_end`, the
    // lease as the keeper last extended it, not as the take gave it (after that the job comes back
    // anyway, and the call could only be refused). False if it was never applied.
    template <class Call>
    bool settle(std::chrono::system_clock::time_point lease_end, Call call) {
        milliseconds backoff(50);
        for (;;) {
            try {
                return call();
            } catch (const std::exception& e) {
                failed(e.what());
            } catch (...) {
                failed("unknown exception");
            }
            if (std::chrono::system_clock::now() + backoff >= lease_end) return false;
            std::this_thread::sleep_for(backoff);
            backoff = std::min(backoff * 2, milliseconds(1000));
        }
    }

    // The lease keeper's thread: extends the lease of every running job a third of a lease after
    // the last, until stop().
    void keep_leases() {
        std::unique_lock lk(m_);
        while (!keeper_stop_) {
            auto wake = clock::now() + every_;
            for (auto& s : slots_) {
                if (!s.current || s.lost) continue;
                const auto now = clock::now();
                if (s.extend_at > now) {
                    wake = std::min(wake, s.extend_at);
                    continue;
                }
                // The call goes without the lock; the job stays while `extending` is set.
                s.extending = true;
                const job_type& j = *s.current;
                lk.unlock();
                std::optional<bool> held;
                std::string error;
                // The new lease ends `lease_` after the store's now, which is after this: an
                // end counted from here is never later than the store's.
                const auto asked = std::chrono::system_clock::now();
                try {
                    held = q_.extend(j, lease_);
                } catch (const std::exception& e) {
                    error = e.what();
                } catch (...) {
                    error = "unknown exception";
                }
                const auto then = std::chrono::system_clock::now();
                if (!error.empty()) failed(error);
                lk.lock();
                s.extending = false;
                if (held.value_or(false)) {
                    s.lease_end = asked + lease_;
                    s.extend_at = clock::now() + every_;
                } else if (held || then >= s.lease_end) {
                    // Refused, or failing until the lease may have ended: it is not ours.
                    s.lost = true;
                    s.source.request_stop();
                } else {
                    s.extend_at =
                        clock::now() + std::clamp(lease_ / 10, milliseconds(1), milliseconds(1000));
                }
                cv_.notify_all();     // a thread may wait to settle this job
                wake = clock::now();  // look again: time passed during the call
            }
            cv_.wait_until(lk, wake);
        }
    }

    static std::uint64_t random() {
        thread_local std::mt19937_64 gen{std::random_device{}()};
        return gen();
    }

    Q& q_;
    const worker_options opt_;
    const milliseconds lease_;
    const milliseconds every_ = std::max(lease_ / 3, milliseconds(1));  // between extensions
    std::function<void(const job_type&, const std::stop_token&)> handler_;

    mutable std::mutex m_;  // everything below but the threads
    std::condition_variable cv_;
    std::vector<slot> slots_;
    std::size_t running_ = 0;  // threads in run()
    std::size_t in_flight_ = 0;
    worker_counters counts_;
    bool keeper_stop_ = false;

    std::stop_source taking_;  // stop(): no new takes
    std::mutex stop_mutex_;
    bool stopped_ = false;
    std::thread keeper_;
    std::vector<std::thread> threads_;
};

}  // namespace delayq
