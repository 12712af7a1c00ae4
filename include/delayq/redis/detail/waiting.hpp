// The waiting protocol: how the threads of a queue object wait for due jobs without polling the
// server. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. When nothing is due, take() waits on the queue's pub/sub channel (see "Wake-ups" in
// scripts.hpp): every script reports how far off its shard's next event is, and every script that
// makes it earlier publishes the new time, so the object knows, for each shard, a time before
// which nothing there is due (the hints). One thread, the reader, waits on the subscription with
// its own timer until the earliest of those times, and then runs the script (one thread per shard
// at a time, unless the last answer said more is due); the others sleep on a condition variable
// and are woken one at a time, as delay_queue's followers are, so a process needs one subscribed
// connection per queue object however many threads consume. After `max_block` without news a
// shard is looked at anyway: a safety net for messages lost while a connection was down. Every
// waiting object hears every message, so when a job comes due each idle object looks once and
// one of them gets it (the others learn the next due time); busy objects run nothing.
//
// A take that waits holds the subscription, not a link (connection.hpp), so it holds up no other
// call of the object. A shard whose script fails is set aside for a while (see set_aside()), so
// that a sharded queue goes on serving from the others.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../../detail/time.hpp"
#include "../types.hpp"
#include "cluster.hpp"
#include "connection.hpp"
#include "script_client.hpp"

namespace delayq::redis::detail {

// Where the threads of one queue object wait for due jobs; its mutex is the object's lock.
class waiting_room {
  public:
    using clock = std::chrono::steady_clock;

    explicit waiting_room(script_client& client) : client_(client), hints_(client.shards()) {}
    waiting_room(const waiting_room&) = delete;
    waiting_room& operator=(const waiting_room&) = delete;
    ~waiting_room() {
        for (int fd : poke_)
            if (fd >= 0) ::close(fd);
    }

    // The leader-follower wait of delay_queue, over the subscription: leases up to `want` due
    // jobs of one shard, waiting up to `max_wait` for the first. One thread, the reader, waits on
    // the subscription until the earliest time something may come due (or its own limit); the
    // others wait on cv_ until their limits, and are woken one at a time when there is something
    // for them (a backlog) or when the reader leaves its post. A thread whose script taught it an
    // earlier time than the reader waits for pokes the reader.
    std::vector<job> take(std::size_t want, milliseconds max_wait) {
        const auto limit =
            delayq::detail::saturating_add(clock::now(), std::max(max_wait, milliseconds::zero()));
        bool asked = false;  // this call has run a script: hints alone may now say "nothing due"
        std::unique_lock lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        for (;;) {
            const auto now = clock::now();
            bool patient = true;
            if (const auto s = pick(now, !asked, patient)) {
                hint& h = hints_[*s];
                ++h.takers;
                flight f{*s};
                depart(f);
                lk.unlock();
                consumed c;
                try {
                    c = client_.consume(*s, {}, want, patient);
                } catch (const error&) {
                    lk.lock();
                    arrive(f);
                    --h.takers;
                    set_aside(h, clock::now());
                    if (patient) throw;  // no other shard could serve this call
                    continue;            // the others may: an error only when none can
                } catch (...) {
                    lk.lock();
                    arrive(f);
                    --h.takers;
                    throw;
                }
                lk.lock();
                arrive(f);
                --h.takers;
                learn(*s, c.next, f.heard);
                asked = true;
                if (!c.jobs.empty()) return std::move(c.jobs);
                continue;
            }
            if (max_wait <= milliseconds::zero() || now >= limit) return {};
            if (reading_) {
                wait_until(lk, limit);
                continue;
            }
            if (sub_ == nullptr) {
                subscribe(lk);
                continue;
            }
            reading_ = true;
            reader_until_ = std::min(limit, wake_time(now));
            lk.unlock();
            heard_.clear();
            bool lost = false;
            try {
                sub_->wait(reader_until_, heard_, poke_[0]);
            } catch (const error&) {
                lost = true;  // a killed connection, a restarted server: subscribe again
            }
            lk.lock();
            reading_ = false;
            if (lost) sub_.reset();
            for (const auto& m : heard_) hear(m);
            if (waiting_ > 0) cv_.notify_one();  // the post is free: this thread may go and take
        }
    }

    // The consume script for the calls that settle leases: the hints learn from it at once.
    consumed consume_and_learn(std::size_t s, std::span<const std::string_view> settle) {
        flight f{s};
        std::unique_lock lk(m_);
        if (generation_ != fork_generation()) forget_the_parent();
        depart(f);
        lk.unlock();
        consumed c;
        try {
            c = client_.consume(s, settle, 0);
        } catch (...) {
            lk.lock();
            arrive(f);
            throw;
        }
        lk.lock();
        arrive(f);
        learn(s, c.next, f.heard);
        return c;
    }

  private:
    // A consume script on its way, from its sending to its learn(): the earliest next event heard
    // for its shard meanwhile. Its answer may be older than what was heard (the script ran before
    // another client's put, whose message the reader handled before this answer came back), so
    // learn() keeps the earlier of the two: an answer must not move a shard's next event past
    // news that came after it (that job would come out up to max_block late).
    struct flight {
        std::size_t shard;
        clock::time_point heard = clock::time_point::max();
        flight* next = nullptr;
    };

    // Under m_: `f` is on its way, and arrive(f) ends that (f may be gone from the list: a child
    // after fork() starts without the parent's flights).
    void depart(flight& f) noexcept {
        f.next = flights_;
        flights_ = &f;
    }
    void arrive(flight& f) noexcept {
        for (flight** at = &flights_; *at != nullptr; at = &(*at)->next)
            if (*at == &f) {
                *at = f.next;
                return;
            }
    }

    // Under m_: shard `s`'s next event is `next_ms` away (+1 ms: the server rounds its now down,
    // so the distance may be short by less than a millisecond), and at most max_block; or at
    // `heard`, if that is earlier: a message heard while the answer was on its way (see flight).
    void learn(std::size_t s, long long next_ms, clock::time_point heard) {
        const auto now = clock::now();
        hint& h = hints_[s];
        h.failures = 0;  // it answered: no longer set aside
        h.aside_until = clock::time_point::min();
        const milliseconds max_block = client_.get_options().max_block;
        const milliseconds d =
            next_ms < 0 ? max_block
                        : std::min(milliseconds(next_ms + (next_ms > 0 ? 1 : 0)), max_block);
        h.next = std::min(now + d, heard);
        h.backlog = next_ms == 0;
        if (next_ms == 0)
            wake_one();  // more is due now: one more thread may take it
        else if (reading_ && h.next < reader_until_)
            poke();  // the reader would sleep past it
    }

    // Under m_: there is something to take (a backlog): one waiting thread takes it.
    void wake_one() {
        if (waiting_ > 0)
            cv_.notify_one();
        else if (reading_)
            poke();
    }

    // Under m_: what the object knows of one shard (see "The idea").
    struct hint {
        // Nothing is due here before `next`.
        clock::time_point next = clock::time_point::min();
        int takers = 0;        // threads running a consume script here now
        bool backlog = false;  // the last answer said more is due now: every thread may look
        // Consumes here that failed in a row; while there are any, the shard is set aside until
        // `aside_until` (see set_aside()).
        unsigned failures = 0;
        clock::time_point aside_until = clock::time_point::min();
    };

    // Under m_: brings the thread that reads the subscription back to look again.
    void poke() {
        if (poke_[1] >= 0)
            (void)!::write(poke_[1], "!", 1);  // full pipe: it is being poked already
    }

    // Under m_: a message "<shard> <ms>": the shard's next event is that near now.
    void hear(std::string_view msg) {
        const auto space = msg.find(' ');
        std::size_t i = 0;
        long long ms = 0;
        if (space == std::string_view::npos ||
            std::from_chars(msg.data(), msg.data() + space, i).ec != std::errc() ||
            std::from_chars(msg.data() + space + 1, msg.data() + msg.size(), ms).ec !=
                std::errc() ||
            i >= hints_.size())
            return;  // not ours (a newer layout on the same channel): ignore it
        const auto at = clock::now() + milliseconds(ms + (ms > 0 ? 1 : 0));
        hints_[i].next = std::min(hints_[i].next, at);
        for (flight* f = flights_; f != nullptr; f = f->next)
            if (f->shard == i) f->heard = std::min(f->heard, at);
    }

    // Under m_: a consume on the shard of `h` failed (its node is down, the cluster is failing
    // over, a reply was lost). Its next event is still in the past, so without this every take
    // would pick it first, spend io_timeout there and throw, while the other shards' jobs wait. So
    // it is set aside for 100 ms, doubling with each failure in a row up to 2 s (a failover takes
    // seconds; a shard whose node comes back is looked at again within the last pause), and a
    // success (learn()) ends that.
    void set_aside(hint& h, clock::time_point now) {
        static constexpr milliseconds first(100), most(2000);
        const unsigned doublings = std::min(h.failures, 5U);
        ++h.failures;
        h.aside_until = now + std::min(first * (1U << doublings), most);
        if (reading_ && h.aside_until < reader_until_) poke();  // look at it again in time
    }

    // Under m_: the shard to look at now: one whose next event has come, and that no other
    // thread is looking at (unless it said more is due), earliest first. With `first`, the call
    // has not asked the server yet: then the earliest shard will do, due or not, looked at or not
    // (a put by another client just before this call may not have been heard yet). A shard set
    // aside (set_aside()) is skipped until its pause ends, and then tried by one thread at a
    // time. `patient` tells whether no other shard could serve the call: only then may the
    // script wait for a failing node (see router::call) and its failure end the call. When every
    // shard failed last time, nothing can serve: the one likeliest to answer is tried at once,
    // patiently, so that the caller gets a job or the error and not a wait.
    std::optional<std::size_t> pick(clock::time_point now, bool first, bool& patient) {
        const hint* best = nullptr;
        std::size_t serving = 0;  // shards whose last consume did not fail
        for (const auto& h : hints_) {
            if (h.failures == 0) ++serving;
            if (h.failures > 0 && (h.aside_until > now || h.takers > 0)) continue;
            // A thread woken for a due shard leaves it to the one already looking; a call that
            // has not asked yet asks anyway (nothing it sees tells it that nothing is due).
            if (!first && (h.next > now || (h.takers > 0 && !h.backlog))) continue;
            if (best == nullptr || h.next < best->next) best = &h;
        }
        if (serving == 0)
            for (const auto& h :
                 hints_)  // fewest failures in a row, then the earliest end of pause
                if (best == nullptr || h.failures < best->failures ||
                    (h.failures == best->failures && h.aside_until < best->aside_until))
                    best = &h;
        patient = best != nullptr && serving == (best->failures == 0 ? 1U : 0U);
        if (best == nullptr) return std::nullopt;
        return static_cast<std::size_t>(best - hints_.data());
    }

    // Under m_: when a waiting thread should look again: the earliest next event that has not
    // come yet, or the end of a shard's pause (a due shard that another thread is looking at
    // wakes us by notify instead).
    clock::time_point wake_time(clock::time_point now) const {
        auto t = clock::time_point::max();
        for (const auto& h : hints_) {
            const auto at = h.failures > 0 ? std::max(h.next, h.aside_until) : h.next;
            if (at > now) t = std::min(t, at);
        }
        return t;
    }

    // Under lk, as the one reading thread: (re)subscribes; everything said before the
    // subscription is lost, so every shard is looked at again.
    void subscribe(std::unique_lock<std::mutex>& lk) {
        if (poke_[0] < 0) {  // the pipe that brings the reader back (see poke())
            std::array<int, 2> fds{-1, -1};
            if (::pipe(fds.data()) != 0)
                throw error("delayq::redis: cannot make a pipe for the waiting consumers");
            for (int fd : fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
            poke_ = fds;
        }
        reading_ = true;
        reader_until_ = clock::time_point::max();
        lk.unlock();
        std::unique_ptr<subscriber> sub;
        std::exception_ptr failed;
        router& route = client_.route();
        const milliseconds io_timeout = client_.get_options().io_timeout;
        // A SUBSCRIBE is harmless to repeat, so whatever befalls the connection (refused, or the
        // node died before it answered) it is tried again, as the router retries a command that
        // did not run, within io_timeout. In a cluster every node hears every PUBLISH: each try
        // goes to the node of the next shard, so that one node down does not stop the waiting.
        const auto give_up = clock::now() + io_timeout;
        milliseconds pause(10);
        for (std::size_t attempt = 0;; ++attempt) {
            std::optional<endpoint> at;
            try {
                at = route.node_of(client_.slot(attempt % hints_.size()));
            } catch (const error&) {  // no node of the cluster answered (yet): try again
                failed = std::current_exception();
            } catch (...) {
                failed = std::current_exception();
                break;
            }
            if (at) {
                try {
                    sub = std::make_unique<subscriber>(*at, io_timeout, client_.channel());
                    break;
                } catch (const io_failure&) {  // the connection: try again
                    failed = std::current_exception();
                } catch (...) {  // a refusal (SUBSCRIBE not allowed), out of memory: final
                    failed = std::current_exception();
                    break;
                }
            }
            const auto now = clock::now();
            if (now >= give_up) break;
            if (route.clustered()) route.invalidate();  // the map may name a dead node
            std::this_thread::sleep_for(std::min<clock::duration>(pause, give_up - now));
            pause = std::min(pause * 2, milliseconds(100));
        }
        if (sub != nullptr) failed = nullptr;
        lk.lock();
        reading_ = false;
        cv_.notify_all();
        if (failed) std::rethrow_exception(failed);
        sub_ = std::move(sub);
        for (auto& h : hints_) h.next = std::min(h.next, clock::now());
    }

    // Under m_, in a child process after fork(): the reader's post, the waiting threads and the
    // takers are the parent's threads, which the child does not have, and the subscription and the
    // pipe are the parent's too (a child that read them would take the parent's messages). The
    // child's copies of their descriptors are closed; the parent's stay open. The condition
    // variable is made anew over the old one, not destroyed: the parent's threads that waited on
    // it are counted in it, and would be waited for, forever, by its destruction (glibc), or
    // take the child's notifications.
    void forget_the_parent() noexcept {
        new (&cv_) std::condition_variable;
        reading_ = false;
        waiting_ = 0;
        for (auto& h : hints_) {
            h.takers = 0;
            h.next = clock::time_point::min();  // look again: what the parent knew may be old
        }
        flights_ = nullptr;
        sub_.reset();
        heard_.clear();
        for (int& fd : poke_)
            if (fd >= 0) {
                ::close(fd);
                fd = -1;
            }
        generation_ = fork_generation();
    }

    void wait_until(std::unique_lock<std::mutex>& lk, clock::time_point t) {
        ++waiting_;
        cv_.wait_until(lk, t);
        --waiting_;
    }

    script_client& client_;
    std::mutex m_;  // the hints, the reader's post
    std::condition_variable cv_;
    std::vector<hint> hints_;          // one per shard
    flight* flights_ = nullptr;        // the consume scripts on their way (see flight)
    std::unique_ptr<subscriber> sub_;  // used by the reading thread only
    std::vector<std::string> heard_;   // likewise
    bool reading_ = false;
    clock::time_point reader_until_;           // when the reader looks again by itself
    std::array<int, 2> poke_{-1, -1};          // a pipe: a byte in it brings the reader back
    int waiting_ = 0;                          // threads in wait_until()
    unsigned generation_ = fork_generation();  // the fork generation this was last used in
};

}  // namespace delayq::redis::detail
