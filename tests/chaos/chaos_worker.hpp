// The chaos check's workers: what one process does with a queue, written once over
// delayq::job_queue. Every call is logged (chaos_log.hpp) before the worker acts on its result: a
// "-begin" line before the call, an "-end" line with the result after it, each fdatasync'd.
//
//   producer   put / put_after / put_many, delays from 0.5 s in the past to 1.5 s ahead; about one
//              job in 30 is poison (payload "poison")
//   consumer   take / take_many (waiting or not); a poison job ends the process at once, after
//              its take is logged (_exit or SIGKILL to itself); the others are acked (some twice,
//              some after their lease ended), acked in batches, nacked, or left to their lease.
//              With --threads N, N threads do so over one queue object (its connections shared
//              as a multi-threaded service shares them), each thread with a log of its own
//              (consumer-I.J.tK.log for K > 0), so the judge sees each thread as a process
//   canceller  reads the other processes' logs and cancels ids at random: leased ones, due ones
//              no take has named yet (what a consumer may keep for its next take), waiting ones,
//              and old ones (most already gone)
//   opener     opens a queue object, sometimes puts a job, asks size(), closes it; again and again
//   drainer    at the end: takes everything (poison jobs nacked until they are dead), acks it,
//              until size() is 0
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
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
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
};

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
        pause(0, chance(5) ? 300 : 25);
        const int op = static_cast<int>(uniform(0, 99));
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
            // Work: mostly short; some long enough for a cancel to land; a few past the lease.
            const int w = static_cast<int>(uniform(0, 99));
            if (w < 4)
                pause(lease + lease / 4, lease + lease / 2);
            else if (w < 24)
                pause(50, lease / 2);
            else
                pause(0, 20);
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
        log_.write(line("cancel-begin") << *id);
        const stamp c = now();
        try {
            const bool ok = q_->cancel(*id);
            const stamp e = now();
            log_.write(e, line("cancel-end") << *id << (ok ? 1 : 0) << began(c));
            if (ok) v.gone.insert(*id);
        } catch (const std::exception& x) {
            log_.write(line("cancel-fail") << *id << began(c) << class_of(x) << x.what());
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
