// The chaos check's workers: what one process does with a queue, written once over
// delayq::job_queue. Every call is logged (chaos_log.hpp) before the worker acts on its result: a
// "-begin" line before the call, an "-end" line with the result after it, each fdatasync'd.
//
//   producer   put / put_after / put_many, delays from 0.5 s in the past to 1.5 s ahead, paced
//              so that the consumers keep up (flat out in the rounds with a limit); about one job
//              in 30 is poison (payload "poison"); series (put_every, every 300 ms, payload
//              "series", an id that begins with 'S'): a few as the round begins, then now and then
//   consumer   take / take_many (waiting or not); a poison job ends the process at once, after
//              its take is logged (_exit or SIGKILL to itself); the others are acked (some twice,
//              some after their lease ended, some after an extend() carried them past it), acked
//              in batches, nacked, or left to their lease. With --threads N, N threads do so over
//              one queue object (its connections shared as a multi-threaded service shares them),
//              each thread with a log of its own (consumer-I.J.tK.log for K > 0), so the judge
//              sees each thread as a process. With --worker, a delayq::worker runs the handler
//              below over the queue instead (--threads handlers at once, and its lease keeper),
//              each of its threads with a log of its own, every call of the worker logged by a
//              wrapper of the queue (logged_queue); SIGTERM stops the worker (it drains), then the
//              process closes its queue and exits, as for a deploy
//   canceller  reads the other processes' logs and cancels ids at random: leased ones, due ones
//              no take has named yet (what a consumer may keep for its next take), waiting ones,
//              and old ones (most already gone)
//   opener     opens a queue object, sometimes puts a job, asks size(), closes it; again and again
//   drainer    at the end: takes everything (poison jobs nacked until they are dead), acks it
//              (cancels a series' run: its ack would queue the next), until size() is 0
#pragma once

#include <cxxabi.h>
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <delayq/job_queue.hpp>
#include <delayq/worker.hpp>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

#include "chaos_backends.hpp"
#include "chaos_log.hpp"

namespace delayq_chaos {

/// How a worker process was started.
struct worker_args {
    std::string role;  ///< producer, consumer, canceller, opener, drainer
    int index = 0;
    int incarnation = 0;
    std::string locator;
    std::string log_dir;
    unsigned long long seed = 1;
    queue_settings qs;
    long long drain_ms = 30'000;  ///< drainer: give up after this long
    int threads = 1;              ///< consumer: threads over its one queue object
    bool run_worker = false;      ///< consumer: a delayq::worker runs the handler
};

/// The period of the producers' repeatable jobs (put_every).
inline constexpr long long series_period_ms = 300;

/// How many series each producer makes as the round begins (its first incarnation).
inline constexpr int start_series = 3;

/// A poison job's consumer ends with this status (or SIGKILL); a failed open with open_failed.
inline constexpr int poison_exit = 77;
inline constexpr int open_failed = 3;

/// Set by SIGTERM: the worker finishes the call it is in, closes its queue and exits with 0, as a
/// process stopped for a deploy does (closing is when SQLite may checkpoint and remove the WAL).
inline std::atomic<int> stop_requested{0};
static_assert(std::atomic<int>::is_always_lock_free);  // set by a signal handler

/// The exception's dynamic type, demangled (delayq::sqlite::busy_error, ...).
inline std::string class_of(const std::exception& e) {
    int status = 0;
    char* d = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
    std::string out = status == 0 && d ? d : typeid(e).name();
    std::free(d);
    return out;
}

/// A job queue that logs what a delayq::worker does with it, in the consumers' format: each
/// thread that calls it writes a log of its own (NAME.tK.log, made at its first call), so that
/// the judge sees each of the worker's threads as a process. Takes, acks, nacks, extends and
/// buries are logged; the rest is passed through.
template <class B>
class logged_queue {
    using inner = typename B::queue;
    using ms = std::chrono::milliseconds;

  public:
    using job = delayq::job_type_t<inner>;
    using put_request = delayq::put_request_t<inner>;

    /// `name`: the process's log name (role-I.J); `start`: the start line's fields but THREAD.
    logged_queue(std::shared_ptr<inner> q, std::string dir, std::string name, line start)
        : q_(std::move(q)),
          dir_(std::move(dir)),
          name_(std::move(name)),
          start_(std::move(start)) {}

    /// The log of the calling thread.
    log_writer& log() {
        thread_local std::map<const logged_queue*, log_writer*> mine;
        if (auto it = mine.find(this); it != mine.end()) return *it->second;
        std::lock_guard g(m_);
        const int k = static_cast<int>(logs_.size()) + 1;
        logs_.push_back(
            std::make_unique<log_writer>(dir_ + "/" + name_ + ".t" + std::to_string(k) + ".log"));
        log_writer& w = *logs_.back();
        line l = start_;
        w.write(l << k);
        mine[this] = &w;
        return w;
    }

    const auto& get_options() const noexcept { return q_->get_options(); }

    std::optional<job> take(ms wait, std::stop_token stop = {}) {
        log_writer& log = this->log();
        const long long seq = takes_++;
        log.write(line("take-begin") << seq << 1 << static_cast<long long>(wait.count()));
        std::optional<job> j;
        const stamp c = now();
        try {
            j = q_->take(wait, stop);
        } catch (const std::exception& x) {
            log.write(line("take-fail") << seq << began(c) << class_of(x) << x.what());
            throw;
        }
        const stamp e = now();
        std::vector<line> ls;
        ls.push_back(line("take-end") << seq << (j ? 1 : 0) << began(c));
        if (j)
            ls.push_back(line("job") << seq << std::string_view(j->id) << j->attempts
                                     << static_cast<unsigned long long>(j->token) << ns(j->deadline)
                                     << ns(j->lease_deadline));
        log.write(e, ls);
        return j;
    }
    // The worker takes one job at a time: take_many is a take, for the concept.
    std::vector<job> take_many(std::size_t n, ms wait, std::stop_token stop = {}) {
        std::vector<job> out;
        if (n > 0)
            if (auto j = take(wait, stop)) out.push_back(std::move(*j));
        return out;
    }

    bool ack(const job& j) {
        return settle("ack", j, {}, [&] { return q_->ack(j); });
    }
    bool nack(const job& j, ms retry) {
        return settle("nack", j, static_cast<long long>(retry.count()),
                      [&] { return q_->nack(j, retry); });
    }
    bool extend(const job& j, ms lease) {
        return settle("extend", j, static_cast<long long>(lease.count()),
                      [&] { return q_->extend(j, lease); });
    }
    bool bury(const job& j) {
        return settle("bury", j, {}, [&] { return q_->bury(j); });
    }
    // With a reason: logged as without one (the judge checks leases, not reasons).
    bool nack(const job& j, ms retry, std::string_view reason) {
        return settle("nack", j, static_cast<long long>(retry.count()),
                      [&] { return q_->nack(j, retry, reason); });
    }
    bool bury(const job& j, std::string_view reason) {
        return settle("bury", j, {}, [&] { return q_->bury(j, reason); });
    }
    std::vector<bool> ack_many(std::span<const job> js) {
        std::vector<bool> out;
        for (const auto& j : js) out.push_back(ack(j));
        return out;
    }

    // Not used by the worker: passed through.
    bool put(std::string_view id, std::string_view p, std::chrono::system_clock::time_point at) {
        return q_->put(id, p, at);
    }
    bool put_after(std::string_view id, std::string_view p, ms d) {
        return q_->put_after(id, p, d);
    }
    std::vector<bool> put_many(std::span<const put_request> rs) { return q_->put_many(rs); }
    bool put_every(std::string_view id, std::string_view p, ms period) {
        return q_->put_every(id, p, period);
    }
    bool put_cron(std::string_view id, std::string_view p, std::string_view expression) {
        return q_->put_cron(id, p, expression);
    }
    bool cancel(std::string_view id) { return q_->cancel(id); }
    bool reschedule(std::string_view id, ms d) { return q_->reschedule(id, d); }
    std::size_t size() { return q_->size(); }
    std::size_t dead_size() { return q_->dead_size(); }
    delayq::queue_stats stats() { return q_->stats(); }
    void pause() { q_->pause(); }
    void resume() { q_->resume(); }
    bool paused() { return q_->paused(); }
    std::optional<delayq::job_info> get(std::string_view id) { return q_->get(id); }
    std::vector<delayq::job_info> dead(std::size_t n, std::string_view after = {}) {
        return q_->dead(n, after);
    }
    std::vector<delayq::job_info> jobs(delayq::job_state state, std::size_t n,
                                       std::string_view after = {}) {
        return q_->jobs(state, n, after);
    }
    bool requeue_dead(std::string_view id, ms d) { return q_->requeue_dead(id, d); }
    std::size_t purge_dead(ms older_than) { return q_->purge_dead(older_than); }

    static long long ns(std::chrono::system_clock::time_point tp) {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(tp.time_since_epoch()).count();
    }

  private:
    // KIND-begin ID TOKEN [ARG], then KIND-end ID TOKEN 0|1 @MONO or KIND-fail (rethrown).
    template <class F>
    bool settle(const char* kind, const job& j, std::optional<long long> arg, F call) {
        log_writer& log = this->log();
        const std::string k = kind;
        line b(k + "-begin");
        b << std::string_view(j.id) << static_cast<unsigned long long>(j.token);
        if (arg) b << *arg;
        log.write(b);
        const stamp c = now();
        try {
            const bool ok = call();
            const stamp e = now();
            log.write(e, line(k + "-end")
                             << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                             << (ok ? 1 : 0) << began(c));
            return ok;
        } catch (const std::exception& x) {
            log.write(line(k + "-fail")
                      << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                      << began(c) << class_of(x) << x.what());
            throw;
        }
    }

    std::shared_ptr<inner> q_;
    std::string dir_, name_;
    line start_;
    std::mutex m_;
    std::vector<std::unique_ptr<log_writer>> logs_;
    std::atomic<long long> takes_{0};
};

template <class B>
class worker {
    using queue = typename B::queue;
    using job = delayq::job_type_t<queue>;
    using request = delayq::put_request_t<queue>;
    using ms = std::chrono::milliseconds;

  public:
    /// The process's worker (its main thread); `thread` > 0: another thread of a consumer, over
    /// the queue object `q`, with a log of its own.
    explicit worker(worker_args a, int thread = 0, std::shared_ptr<queue> q = nullptr)
        : a_(std::move(a)),
          name_(a_.role + "-" + std::to_string(a_.index) + "." + std::to_string(a_.incarnation) +
                (thread > 0 ? ".t" + std::to_string(thread) : "")),
          log_(a_.log_dir + "/" + name_ + ".log"),
          rng_(a_.seed ^ (0x9e3779b97f4a7c15ULL * static_cast<unsigned long long>(thread))),
          q_(std::move(q)) {
        log_.write(line("start") << a_.role << a_.index << a_.incarnation << ::getpid()
                                 << static_cast<long long>(a_.qs.call_timeout.count()) << thread);
    }

    int run() {
        if (a_.role == "opener") return open_and_close();
        if (!open()) return open_failed;
        if (a_.role == "drainer") return drain();
        if (a_.role == "consumer" && a_.run_worker) return run_worker();
        if (a_.role == "consumer" && a_.threads > 1) {
            std::vector<std::unique_ptr<worker>> others;
            std::vector<std::thread> ts;
            for (int t = 1; t < a_.threads; ++t) {
                others.push_back(std::make_unique<worker>(a_, t, q_));
                ts.emplace_back([w = others.back().get()] {
                    while (!stop_requested) w->consume();
                });
            }
            while (!stop_requested) consume();
            for (auto& t : ts) t.join();
            others.clear();  // their share of the queue object: close() destroys it
            close();
            return 0;
        }
        // A round's first producers make their series before anything else: a series made late
        // runs too few times before the round ends for the judge to hold its runs one against
        // the next.
        if (a_.role == "producer" && a_.incarnation == 0)
            for (int i = 0; i < start_series && !stop_requested; ++i) put_series();
        while (!stop_requested) {
            if (a_.role == "producer")
                produce();
            else if (a_.role == "consumer")
                consume();
            else if (a_.role == "canceller")
                cancel();
            else
                return 2;
        }
        close();
        return 0;
    }

  private:
    long long uniform(long long lo, long long hi) {  // [lo, hi]
        return std::uniform_int_distribution<long long>(lo, hi)(rng_);
    }
    bool chance(int percent) { return uniform(0, 99) < percent; }
    void pause(long long lo, long long hi) { std::this_thread::sleep_for(ms(uniform(lo, hi))); }

    // The first open of a round is not held up by an fdatasync: the processes race to create the
    // file, and should reach SQLite at the same moment.
    bool open() {
        log_.write(now(), {line("open-begin")}, opens_++ > 0);
        const stamp c = now();
        try {
            q_ = B::open(a_.locator, a_.qs);
        } catch (const std::exception& e) {
            log_.write(line("open-fail") << "-" << began(c) << class_of(e) << e.what());
            return false;
        }
        log_.write(line("open-end") << began(c));
        return true;
    }

    void close() {
        q_.reset();
        log_.write(line("close"));
    }

    // Unique across the round: each incarnation of each worker numbers its own.
    std::string new_id(bool poison) {
        std::string id = poison ? "x" : "";
        id += a_.role.substr(0, 1) + std::to_string(a_.index) + "." +
              std::to_string(a_.incarnation) + "." + std::to_string(seq_++);
        return id;
    }

    // A delay: mostly ahead, one in six in the past.
    long long delay_ms() { return chance(16) ? uniform(-500, -1) : uniform(0, 1500); }

    // ---- producer ------------------------------------------------------------------------------

    void produce() {
        // In the rounds without a limit, no faster than the consumers take: takes go in due
        // order, so a backlog of due jobs would hold every series' run back behind it, and the
        // series would run too seldom to be judged run against run. In the rounds with a limit of
        // jobs leased at once, as fast as before: a backlog is what makes the limit bind.
        if (a_.qs.max_leased > 0)
            pause(0, chance(5) ? 300 : 25);
        else
            pause(10, chance(5) ? 300 : 90);
        const int op = static_cast<int>(uniform(0, 99));
        if (op < 1) {
            put_series();
            return;
        }
        if (op < 70) {
            const bool poison = chance(3);
            const std::string id = new_id(poison);
            const long long d = delay_ms();
            const stamp s = now();
            if (op < 40) {  // relative
                const long long due = s.real + std::max(d, 0LL) * 1'000'000LL;
                log_.write(s, line("put-begin") << id << (poison ? 1 : 0) << due
                                                << ("after:" + std::to_string(d)));
                put_one(id, poison, [&] { return q_->put_after(id, payload(poison), ms(d)); });
            } else {  // absolute, on the system clock
                const long long due = s.real + d * 1'000'000LL;
                log_.write(s, line("put-begin")
                                  << id << (poison ? 1 : 0) << due << ("at:" + std::to_string(d)));
                const auto tp = std::chrono::system_clock::time_point(
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                        std::chrono::nanoseconds(due)));
                put_one(id, poison, [&] { return q_->put(id, payload(poison), tp); });
            }
            return;
        }
        const auto n = static_cast<std::size_t>(uniform(2, 8));
        std::vector<std::string> ids;
        std::vector<bool> poison;
        std::vector<long long> delays;
        std::vector<line> begins;
        const stamp s = now();
        for (std::size_t i = 0; i < n; ++i) {
            poison.push_back(chance(3));
            ids.push_back(new_id(poison.back()));
            delays.push_back(delay_ms());
            begins.push_back(line("put-begin")
                             << ids.back() << (poison.back() ? 1 : 0)
                             << s.real + std::max(delays.back(), 0LL) * 1'000'000LL
                             << ("many:" + std::to_string(delays.back())));
        }
        std::vector<request> rs;
        for (std::size_t i = 0; i < n; ++i) {
            request r{};
            r.id = ids[i];
            r.payload = payload(poison[i]);
            r.delay = ms(delays[i]);
            rs.push_back(r);
        }
        log_.write(s, begins);
        std::vector<line> ends;
        const stamp c = now();
        try {
            const std::vector<bool> ok = q_->put_many(rs);
            const stamp e = now();
            for (std::size_t i = 0; i < n; ++i)
                ends.push_back(line("put-end")
                               << ids[i] << (i < ok.size() && ok[i] ? 1 : 0) << began(c));
            log_.write(e, ends);
        } catch (const std::exception& x) {
            const stamp e = now();
            for (std::size_t i = 0; i < n; ++i)
                ends.push_back(line("put-fail") << ids[i] << began(c) << class_of(x) << x.what());
            log_.write(e, ends);
        }
    }

    static std::string_view payload(bool poison) { return poison ? "poison" : "work"; }

    // A repeatable job (put_every), its id marked by a leading 'S' (the judge checks a series
    // apart: its runs share the id): series-begin ID PERIOD_MS, series-end ID 0|1 or series-fail.
    void put_series() {
        const std::string id = "S" + new_id(false);
        const long long period = series_period_ms;
        log_.write(line("series-begin") << id << period);
        const stamp c = now();
        try {
            const bool ok = q_->put_every(id, "series", ms(period));
            const stamp e = now();
            log_.write(e, line("series-end") << id << (ok ? 1 : 0) << began(c));
        } catch (const std::exception& x) {
            log_.write(line("series-fail") << id << began(c) << class_of(x) << x.what());
        }
    }

    template <class F>
    void put_one(const std::string& id, bool, F&& f) {
        const stamp c = now();
        try {
            const bool ok = f();
            const stamp e = now();
            log_.write(e, line("put-end") << id << (ok ? 1 : 0) << began(c));
        } catch (const std::exception& x) {
            log_.write(line("put-fail") << id << began(c) << class_of(x) << x.what());
        }
    }

    // ---- consumer ------------------------------------------------------------------------------

    // One take or take_many, logged with every job it handed out; empty if none (or it threw).
    std::vector<job> take(std::size_t want, long long wait) {
        const long long seq = takes_++;
        log_.write(line("take-begin") << seq << static_cast<long long>(want) << wait);
        std::vector<job> js;
        const stamp c = now();
        try {
            if (want == 1) {
                if (auto j = q_->take(ms(wait))) js.push_back(std::move(*j));
            } else {
                js = q_->take_many(want, ms(wait));
            }
        } catch (const std::exception& x) {
            log_.write(line("take-fail") << seq << began(c) << class_of(x) << x.what());
            return {};
        }
        const stamp e = now();
        std::vector<line> ls;
        ls.push_back(line("take-end") << seq << static_cast<long long>(js.size()) << began(c));
        for (const auto& j : js)
            ls.push_back(line("job") << seq << std::string_view(j.id) << j.attempts
                                     << static_cast<unsigned long long>(j.token) << ns(j.deadline)
                                     << ns(j.lease_deadline));
        log_.write(e, ls);
        return js;
    }

    static long long ns(std::chrono::system_clock::time_point tp) {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(tp.time_since_epoch()).count();
    }

    bool ack(const job& j) {
        log_.write(line("ack-begin")
                   << std::string_view(j.id) << static_cast<unsigned long long>(j.token));
        const stamp c = now();
        try {
            const bool ok = q_->ack(j);
            const stamp e = now();
            log_.write(e, line("ack-end")
                              << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                              << (ok ? 1 : 0) << began(c));
            return ok;
        } catch (const std::exception& x) {
            log_.write(line("ack-fail")
                       << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                       << began(c) << class_of(x) << x.what());
            return false;
        }
    }

    void ack_many(const std::vector<job>& js) {
        if (js.empty()) return;
        std::vector<line> begins;
        for (const auto& j : js)
            begins.push_back(line("ack-begin")
                             << std::string_view(j.id) << static_cast<unsigned long long>(j.token));
        log_.write(now(), begins);
        std::vector<line> ends;
        const stamp c = now();
        try {
            const std::vector<bool> ok = q_->ack_many(js);
            const stamp e = now();
            for (std::size_t i = 0; i < js.size(); ++i)
                ends.push_back(line("ack-end") << std::string_view(js[i].id)
                                               << static_cast<unsigned long long>(js[i].token)
                                               << (i < ok.size() && ok[i] ? 1 : 0) << began(c));
            log_.write(e, ends);
        } catch (const std::exception& x) {
            const stamp e = now();
            for (const auto& j : js)
                ends.push_back(line("ack-fail")
                               << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                               << began(c) << class_of(x) << x.what());
            log_.write(e, ends);
        }
    }

    void nack(const job& j, long long retry) {
        log_.write(line("nack-begin")
                   << std::string_view(j.id) << static_cast<unsigned long long>(j.token) << retry);
        const stamp c = now();
        try {
            const bool ok = q_->nack(j, ms(retry));
            const stamp e = now();
            log_.write(e, line("nack-end")
                              << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                              << (ok ? 1 : 0) << began(c));
        } catch (const std::exception& x) {
            log_.write(line("nack-fail")
                       << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                       << began(c) << class_of(x) << x.what());
        }
    }

    [[noreturn]] void die(const job& j) {
        log_.write(line("die") << std::string_view(j.id));
        if (chance(50)) ::_exit(poison_exit);
        ::kill(::getpid(), SIGKILL);
        ::_exit(poison_exit);
    }

    // extend(), logged; false if it was refused or threw.
    bool extend(const job& j, long long lease) {
        log_.write(line("extend-begin")
                   << std::string_view(j.id) << static_cast<unsigned long long>(j.token) << lease);
        const stamp c = now();
        try {
            const bool ok = q_->extend(j, ms(lease));
            const stamp e = now();
            log_.write(e, line("extend-end")
                              << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                              << (ok ? 1 : 0) << began(c));
            return ok;
        } catch (const std::exception& x) {
            log_.write(line("extend-fail")
                       << std::string_view(j.id) << static_cast<unsigned long long>(j.token)
                       << began(c) << class_of(x) << x.what());
            return false;
        }
    }

    void consume() {
        const bool many = chance(35);
        const auto want = many ? static_cast<std::size_t>(uniform(2, 8)) : std::size_t{1};
        const long long wait = chance(10) ? 0 : uniform(50, 500);
        std::vector<job> js = take(want, wait);
        for (const auto& j : js)
            if (j.payload == "poison") die(j);
        std::vector<job> batch;
        const long long lease = a_.qs.lease.count();
        for (const auto& j : js) {
            // Work: mostly short; some long enough for a cancel to land; a few past the lease;
            // some past the lease after an extend() (never a shorter lease than the queue's, and a
            // second extend never shorter than the first, which it follows: the judge counts on
            // extends only moving a lease later). A holder whose extend was refused or threw
            // leaves the job alone, as delayq::worker does.
            const int w = static_cast<int>(uniform(0, 99));
            if (w < 4) {
                pause(lease + lease / 4, lease + lease / 2);
            } else if (w < 12) {
                pause(lease / 4, lease / 2);
                const long long first = uniform(lease, 2 * lease);
                if (!extend(j, first)) continue;
                pause(lease / 2 + lease / 4, lease + lease / 4);
                if (chance(30)) {
                    if (!extend(j, uniform(first, 2 * lease))) continue;
                    pause(lease / 2, lease);
                }
            } else if (w < 28) {
                pause(50, lease / 2);
            } else {
                pause(0, 20);
            }
            const int how = static_cast<int>(uniform(0, 99));
            if (how < 60) {
                ack(j);
            } else if (how < 68) {
                ack(j);
                ack(j);  // a second ack of the same delivery must be refused
            } else if (how < 83) {
                batch.push_back(j);
            } else if (how < 95) {
                nack(j, uniform(0, 400));
            }  // else: left to its lease, as a consumer that lost track of it
        }
        ack_many(batch);
    }

    // ---- a consumer that runs delayq::worker ---------------------------------------------------

    // A delayq::worker over the queue (logged_queue logs its calls, a log per thread) with
    // --threads handlers, until SIGTERM: then stop() (it drains), close, exit 0. Its handler runs
    // mostly short, sometimes past the lease (the worker extends it), then returns (ack), throws
    // (a nack, retry policy 10 ms doubling to 200 ms), throws dead_letter (bury) or retry_in; a
    // poison job ends the process in the middle of its handler.
    int run_worker() {
        using wjob = typename logged_queue<B>::job;
        logged_queue<B> lq(q_, a_.log_dir, name_,
                           line("start") << a_.role << a_.index << a_.incarnation << ::getpid()
                                         << static_cast<long long>(a_.qs.call_timeout.count()));
        const long long lease = a_.qs.lease.count();
        const auto tag = [](line l, const wjob& j) {
            return std::move(l << std::string_view(j.id)
                               << static_cast<unsigned long long>(j.token));
        };
        delayq::worker_options o;
        o.threads = static_cast<std::size_t>(std::max(1, a_.threads));
        o.retry = delayq::retry_policy{ms(10), ms(200), delayq::jitter::full};
        // Some stops find handlers running past it: their stop tokens are asked, and the worker
        // gives their jobs back (a nack, due now).
        o.drain_timeout = ms(uniform(0, 2 * lease));
        o.hooks.retrying = [&](const delayq::job& j, ms d, std::string_view why) {
            lq.log().write(tag(line("worker-retry"), j)
                           << static_cast<long long>(d.count()) << why);
        };
        o.hooks.dead_lettered = [&](const delayq::job& j, std::string_view why) {
            lq.log().write(tag(line("worker-dead"), j) << why);
        };
        o.hooks.lease_lost = [&](const delayq::job& j) {
            lq.log().write(tag(line("worker-lease-lost"), j));
        };
        o.hooks.call_failed = [&](std::string_view what) {
            lq.log().write(line("worker-call-failed") << what);
        };
        const auto handler = [&](const wjob& j, std::stop_token stop) {
            log_writer& log = lq.log();
            thread_local std::mt19937_64 rng(
                a_.seed ^ std::hash<std::thread::id>{}(std::this_thread::get_id()));
            const auto pick = [&](long long lo, long long hi) {
                return std::uniform_int_distribution<long long>(lo, hi)(rng);
            };
            log.write(tag(line("handler-begin"), j));
            if (j.payload == "poison") {
                log.write(line("die") << std::string_view(j.id));
                if (pick(0, 1) == 0) ::_exit(poison_exit);
                ::kill(::getpid(), SIGKILL);
                ::_exit(poison_exit);
            }
            const int w = static_cast<int>(pick(0, 99));
            const long long work = w < 25   ? pick(lease + lease / 5, 3 * lease)
                                   : w < 45 ? pick(50, lease / 2)
                                            : pick(0, 20);
            const auto until = std::chrono::steady_clock::now() + ms(work);
            while (!stop.stop_requested()) {
                const auto left = until - std::chrono::steady_clock::now();
                if (left <= left.zero()) break;
                std::this_thread::sleep_for(
                    std::min<std::chrono::steady_clock::duration>(left, ms(10)));
            }
            const int how = static_cast<int>(pick(0, 99));
            const char* what = stop.stop_requested() ? "stopped"
                               : how < 60            ? "return"
                               : how < 78            ? "throw"
                               : how < 90            ? "dead-letter"
                                                     : "retry-in";
            const bool past = now().real > logged_queue<B>::ns(j.lease_deadline);
            log.write(tag(line("handler-end"), j) << what << (past ? 1 : 0));
            const std::string_view h = what;
            if (h == "throw") throw std::runtime_error("the handler failed");
            if (h == "dead-letter") throw delayq::dead_letter("the job can never succeed");
            if (h == "retry-in") throw delayq::retry_in(ms(pick(0, 300)));
        };
        {
            delayq::worker<logged_queue<B>> wk(lq, handler, o);
            while (!stop_requested) std::this_thread::sleep_for(ms(10));
            log_.write(line("worker-stop-begin"));
            wk.stop();
            const auto n = wk.counters();
            log_.write(line("worker-stop-end")
                       << static_cast<unsigned long long>(n.done) << n.retried << n.dead
                       << n.lease_lost << n.released);
        }
        close();
        return 0;
    }

    // ---- canceller -----------------------------------------------------------------------------

    // What the other processes' logs said so far: read incrementally.
    struct view {
        std::map<std::string, std::size_t> offsets;  // log file -> bytes read
        std::map<std::string, long long> begun_due;  // put-begin seen, put-end not yet
        std::map<std::string, long long> put;        // put returned true -> due (realtime ns)
        std::map<std::string, long long> taken;      // id -> realtime ns of its last delivery
        std::set<std::string> gone;                  // acked or cancelled (true)
        std::vector<std::string> all;                // every id put, in order
    };

    void refresh(view& v) {
        DIR* d = ::opendir(a_.log_dir.c_str());
        if (!d) return;
        std::vector<std::string> files;
        while (dirent* e = ::readdir(d)) {
            const std::string n = e->d_name;
            if (n.size() > 4 && n.compare(n.size() - 4, 4, ".log") == 0 && n != name_ + ".log")
                files.push_back(a_.log_dir + "/" + n);
        }
        ::closedir(d);
        for (const auto& f : files) {
            std::ifstream in(f, std::ios::binary);
            std::size_t& off = v.offsets[f];
            in.seekg(static_cast<std::streamoff>(off));
            std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
            const std::size_t last = text.rfind('\n');
            if (last == std::string::npos) continue;
            off += last + 1;
            std::size_t pos = 0;
            while (pos <= last) {
                const std::size_t nl = text.find('\n', pos);
                event e;
                if (parse_line(text.substr(pos, nl - pos), e)) {
                    const std::string& id = e.at(0);
                    if (e.kind == "put-begin") {
                        v.begun_due[id] = e.num(2);
                    } else if (e.kind == "put-end" && e.at(1) == "1") {
                        v.put[id] = v.begun_due[id];
                        v.begun_due.erase(id);
                        v.all.push_back(id);
                    } else if (e.kind == "job") {
                        v.taken[e.at(1)] = e.real;
                    } else if ((e.kind == "ack-end" && e.at(2) == "1") ||
                               (e.kind == "cancel-end" && e.at(1) == "1")) {
                        v.gone.insert(id);
                    }
                }
                pos = nl + 1;
            }
        }
    }

    std::optional<std::string> pick(view& v) {
        const long long t = now().real;
        const long long lease = a_.qs.lease.count() * 1'000'000LL;
        std::vector<std::string> leased, due, waiting;
        for (const auto& [id, at] : v.taken)
            if (at > t - lease && !v.gone.count(id)) leased.push_back(id);
        for (const auto& [id, d] : v.put) {
            if (v.gone.count(id) || v.taken.count(id)) continue;
            (d <= t + 30'000'000LL ? due : waiting).push_back(id);
        }
        const int c = static_cast<int>(uniform(0, 99));
        const auto one = [&](const std::vector<std::string>& from) -> std::optional<std::string> {
            if (from.empty()) return std::nullopt;
            return from[static_cast<std::size_t>(
                uniform(0, static_cast<long long>(from.size()) - 1))];
        };
        std::optional<std::string> id;
        if (c < 35)
            id = one(leased);
        else if (c < 75)
            id = one(due);
        else if (c < 90)
            id = one(waiting);
        if (!id) id = one(v.all);
        return id;
    }

    void cancel() {
        static view v;
        pause(5, 50);
        refresh(v);
        const auto id = pick(v);
        if (!id) return;
        if (cancel_one(*id)) v.gone.insert(*id);
    }

    // cancel(), logged; whether it returned true.
    bool cancel_one(const std::string& id) {
        log_.write(line("cancel-begin") << id);
        const stamp c = now();
        try {
            const bool ok = q_->cancel(id);
            const stamp e = now();
            log_.write(e, line("cancel-end") << id << (ok ? 1 : 0) << began(c));
            return ok;
        } catch (const std::exception& x) {
            log_.write(line("cancel-fail") << id << began(c) << class_of(x) << x.what());
            return false;
        }
    }

    // ---- opener --------------------------------------------------------------------------------

    int open_and_close() {
        for (bool first = true; !stop_requested; first = false) {
            if (!first) pause(20, 250);
            if (!open()) return open_failed;
            if (chance(50)) {
                const bool poison = chance(3);
                const std::string id = new_id(poison);
                const long long d = delay_ms();
                const stamp s = now();
                log_.write(s, line("put-begin") << id << (poison ? 1 : 0)
                                                << s.real + std::max(d, 0LL) * 1'000'000LL
                                                << ("after:" + std::to_string(d)));
                put_one(id, poison, [&] { return q_->put_after(id, payload(poison), ms(d)); });
            }
            (void)size();
            close();
        }
        return 0;
    }

    // size(), logged; empty if it threw.
    std::optional<std::size_t> size() {
        log_.write(line("size-begin") << "-");
        const stamp c = now();
        try {
            const std::size_t n = q_->size();
            const stamp e = now();
            log_.write(e, line("size-end")
                              << "-" << static_cast<unsigned long long>(n) << began(c));
            return n;
        } catch (const std::exception& x) {
            log_.write(line("size-fail") << "-" << began(c) << class_of(x) << x.what());
            return std::nullopt;
        }
    }

    // ---- drainer -------------------------------------------------------------------------------

    int drain() {
        const auto give_up = std::chrono::steady_clock::now() + ms(a_.drain_ms);
        while (std::chrono::steady_clock::now() < give_up) {
            std::vector<job> js = take(50, 200);
            if (js.empty()) {
                try {
                    if (size() == std::optional<std::size_t>(0)) {
                        // What the queue itself counts, for the checker to hold the store's
                        // inspection against.
                        log_.write(line("drain-end")
                                   << 1 << static_cast<long long>(q_->dead_size()));
                        return 0;
                    }
                } catch (const std::exception& x) {
                    log_.write(line("size-fail") << "-" << class_of(x) << x.what());
                }
                continue;
            }
            std::vector<job> done;
            for (const auto& j : js) {
                if (j.payload == "poison")
                    nack(j, 0);  // each nack ends an attempt, as a crash would
                else if (j.payload == "series")
                    cancel_one(j.id);  // an ack would queue the next run: the queue never empties
                else
                    done.push_back(j);
            }
            ack_many(done);
        }
        log_.write(line("drain-end") << 0);
        return 0;
    }

    worker_args a_;
    std::string name_;
    log_writer log_;
    std::mt19937_64 rng_;
    std::shared_ptr<queue> q_;
    long long seq_ = 0;
    long long takes_ = 0;
    long long opens_ = 0;
};

}  // namespace delayq_chaos
