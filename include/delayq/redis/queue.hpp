// delayq::redis::delay_queue and sharded_delay_queue: the public API over the scripts, the router
// and the links. Part of <delayq/redis/delay_queue.hpp>, which is what users include.
//
// The idea. A queue object is a client of one queue shard (delay_queue) or of N shards, each its
// own hash tag and so its own Cluster slot (sharded_delay_queue). Everything the server does is in
// the scripts (detail/scripts.hpp), which the object runs through its script client
// (detail/script_client.hpp); what the object adds is how its threads wait without polling
// (detail/waiting.hpp). Every member below is a few lines that tie those together.
//
// No job is kept in the object's memory between calls: every take asks the server, and the
// server counts the attempt before take() returns. That is what lets a cancel from anywhere hold
// for every take that starts after it, and max_attempts bound a job that kills its consumer
// (docs/redis.md, "Prefetch, and why there is none").
//
// Threads. The puts and consumes (takes, acks, nacks) that threads of the process hand in for a
// shard while one is on its way go as one script call (delayq/detail/job_queue/combiner.hpp), and
// every command goes through a link (detail/connection.hpp), which sends what the threads send at
// the same time in one write. A take that waits holds the subscription, not a link, so it holds up
// no other call. The object's lock is its taker's (delayq/detail/job_queue/taker.hpp).
//
// Pausing is the server's state too, a key in each shard that the take script reads (scripts.hpp,
// "Pausing"): a paused shard answers a take as an empty one would, so the taker waits for the
// resume's wake-up message as for a put's, and needs nothing of its own for it.
//
// Limits (options.limits) are the server's too: the take script counts the shard's leases and
// recent grants and leases within the room they leave (scripts.hpp, "Limits"). A take held back
// is answered with the time a place frees, so the taker sleeps until then, or until a settlement
// by an object with limits publishes that a place freed (its own takes learn it from the
// settlement's answer, or a hint). A script sees one shard, so a sharded queue splits each limit
// into per-shard shares that add up to it (script_client::share()): the queue never exceeds the
// limit, and may lease less, when the jobs that wait are in shards whose share is full.
//
// Series (put_every, put_cron) are the server's too: the put script stores a run's schedule beside
// its payload, and whichever script ends a run queues the next (scripts.hpp, "Repeatable jobs"),
// so that the objects of every process that ack or bury runs make each next run once. The next
// run has the series' id, so it stays on its shard.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "../detail/job_queue/front.hpp"
#include "../detail/job_queue/repeat.hpp"
#include "detail/cluster.hpp"
#include "detail/script_client.hpp"
#include "detail/scripts.hpp"
#include "detail/waiting.hpp"
#include "types.hpp"

namespace delayq::redis {
namespace detail {

// Everything of delay_queue and sharded_delay_queue; they differ only in their shards.
class queue_base {
  public:
    queue_base(const queue_base&) = delete;
    queue_base& operator=(const queue_base&) = delete;

    const options& get_options() const noexcept { return client_.get_options(); }

    /// Queues `id` to be due at `deadline` (the caller's clock, taken as server time). False if
    /// `id` is already queued (waiting or leased); nothing changes then.
    bool put(std::string_view id, std::string_view payload,
             std::chrono::system_clock::time_point deadline) {
        front.id(id);
        return guarded([&]() -> bool {
            const std::string at = std::to_string(to_ms(deadline));
            const std::array<std::string_view, 4> args{id, payload, "a", at};
            return client_.put(client_.shard_of(id), args).front();
        });
    }

    /// Queues `id` to be due `delay` from now by the server's clock. False if already queued.
    bool put_after(std::string_view id, std::string_view payload, std::chrono::milliseconds delay) {
        front.id(id);
        return guarded([&]() -> bool {
            const std::string ms = std::to_string(clamp_delay(delay));
            const std::array<std::string_view, 4> args{id, payload, "r", ms};
            return client_.put(client_.shard_of(id), args).front();
        });
    }

    /// Queues the series `id` (delayq/job.hpp): a run every `period`, the first one `period`
    /// from now by the server's clock; each run's ack, or its move to the dead letters, queues the
    /// next in the same script, the first slot in phase after the server's now (scripts.hpp,
    /// "Repeatable jobs"). False, changing nothing, if `id` is queued (a run of it, or any job).
    /// A period <= 0 is std::invalid_argument.
    bool put_every(std::string_view id, std::string_view payload,
                   std::chrono::milliseconds period) {
        front.id(id);
        return put_series(id, payload, front.every(period));
    }

    /// Queues the series `id` whose runs are due at the minutes that the five-field cron
    /// `expression` matches, in UTC (delayq/detail/cron.hpp): the first at the first after the
    /// server's now, each next one queued by the step that ends the run before it, at the first
    /// after that step. False, changing nothing, if `id` is queued. A bad expression (or one that
    /// never matches) is std::invalid_argument.
    bool put_cron(std::string_view id, std::string_view payload, std::string_view expression) {
        front.id(id);
        return put_series(id, payload, front.cron(expression));
    }

    using put_request = delayq::put_request;

    /// put_after for many jobs: one script call per shard and 500 jobs. Element i of the result
    /// is what put_after would have returned for jobs[i]; a duplicate id is refused.
    std::vector<bool> put_many(std::span<const put_request> jobs) {
        std::vector<std::string> ms(jobs.size());
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            front.id(jobs[i].id);
            ms[i] = std::to_string(clamp_delay(jobs[i].delay));
        }
        std::vector<std::string_view> args;
        return guarded([&] {
            return client_.by_shard(
                jobs.size(), [&](std::size_t i) { return jobs[i].id; },
                [&](std::size_t s, std::span<const std::size_t> idx) {
                    args.clear();
                    for (std::size_t i : idx)
                        args.insert(args.end(), {jobs[i].id, jobs[i].payload, "r", ms[i]});
                    return client_.put(s, args);
                });
        });
    }

    /// Removes a waiting or leased job. False if `id` is not queued. With limits, the cancel of a
    /// leased job wakes the takes that the limits hold back, in every process.
    bool cancel(std::string_view id) {
        front.id(id);
        return guarded([&] {
            const std::size_t s = client_.shard_of(id);
            const long long gone = client_.cancel(s, id);
            if (gone == 2) room_.hint(s);
            return gone != 0;
        });
    }

    /// Gives a waiting job a new due time, `delay` from now. False for an unknown or leased id.
    bool reschedule(std::string_view id, std::chrono::milliseconds delay) {
        front.id(id);
        const std::string ms = std::to_string(clamp_delay(delay));
        const std::array<std::string_view, 2> args{id, ms};
        return guarded([&] {
            return script_client::integer(client_.eval(client_.shard_of(id), s_reschedule, args)) ==
                   1;
        });
    }

    /// Leases the earliest due job, waiting up to `max_wait` for one (not at all when <= 0), and
    /// returns nothing as soon as `stop` is requested (a blocked take is woken).
    std::optional<job> take(std::chrono::milliseconds max_wait, const std::stop_token& stop = {}) {
        auto jobs = guarded([&] { return room_.take(1, max_wait, stop); });
        if (jobs.empty()) return std::nullopt;
        return std::move(jobs.front());
    }

    /// Leases up to `max_jobs` (at most max_take_many) due jobs of one shard, earliest first,
    /// waiting up to `max_wait` for the first (or until `stop` is requested). Every job has its own
    /// lease and token. `max_jobs` 0: nothing, at once.
    std::vector<job> take_many(std::size_t max_jobs, std::chrono::milliseconds max_wait,
                               const std::stop_token& stop = {}) {
        if (max_jobs == 0) return {};
        return guarded([&] { return room_.take(front.take_count(max_jobs), max_wait, stop); });
    }

    /// Done with the job: it is gone for good. False if the lease was lost (ended, or cancelled).
    bool ack(const job& j) {
        front.id(j.id);
        return settle(j, "a");
    }

    /// ack(j), and in the same script call, on j's shard, a take that does not wait: the next due
    /// job of that shard, leased by the take's rules (pause, limits, max_attempts, series,
    /// fencing), whether or not the ack held. One round trip where ack() and take() make two;
    /// merged with other threads' consumes on the shard as an ack is. `next` is empty when that
    /// shard has no job due for a take now, and, on a sharded queue, when this object knows of
    /// another shard whose jobs came due earlier: take() looks at them all, in that order, so
    /// that a busy shard does not keep the consumers that settle its jobs.
    ack_take_result ack_and_try_take(const job& j) {
        front.id(j.id);
        const std::size_t s = client_.shard_of(j.id);
        const std::size_t take = client_.shards() > 1 && room_.other_shard_first(s) ? 0 : 1;
        return guarded([&] {
            consumed c = settle_and_take(j, "a", take);
            ack_take_result r;
            r.acked = c.ok.front();
            if (!c.jobs.empty()) r.next = std::move(c.jobs.front());
            return r;
        });
    }

    /// ack for many jobs, one script call per shard and 500 jobs; element i is what ack(jobs[i])
    /// would have returned.
    std::vector<bool> ack_many(std::span<const job> jobs) {
        for (const auto& j : jobs) front.id(j.id);
        std::vector<std::string> tokens(jobs.size());
        for (std::size_t i = 0; i < jobs.size(); ++i) tokens[i] = std::to_string(jobs[i].token);
        std::vector<std::string_view> args;
        return guarded([&] {
            return client_.by_shard(
                jobs.size(), [&](std::size_t i) { return jobs[i].id; },
                [&](std::size_t s, std::span<const std::size_t> idx) {
                    args.clear();
                    for (std::size_t i : idx) args.insert(args.end(), {"a", jobs[i].id, tokens[i]});
                    return room_.consume_and_learn(s, args).ok;
                });
        });
    }

    /// Back to the queue, due `retry_after` from now (or dead-lettered after max_attempts).
    /// False if the lease was lost.
    bool nack(const job& j, std::chrono::milliseconds retry_after) {
        front.id(j.id);
        return settle(j, tagged('n', clamp_delay(retry_after)));
    }

    /// nack(j, retry_after), and the job's last error (get(), dead()) becomes `reason`, cut to its
    /// first max_reason_size bytes (binary-safe); a dead letter that this nack makes keeps it.
    /// nack without a reason leaves the last error as it was. False if the lease was lost, and
    /// nothing changes then.
    bool nack(const job& j, std::chrono::milliseconds retry_after, std::string_view reason) {
        front.id(j.id);
        return settle(j, with_reason(tagged('n', clamp_delay(retry_after)), reason));
    }

    /// The lease of `j` now ends `lease` from now by the server's clock, longer or shorter; the
    /// token stays `j`'s. False if the lease was lost (ended, settled, or cancelled). A negative
    /// lease is std::invalid_argument.
    bool extend(const job& j, std::chrono::milliseconds lease) {
        front.id(j.id);
        front.not_negative(lease, "a lease");
        return settle(j, tagged('e', clamp_delay(lease)));
    }

    /// To the dead letters at once, whatever max_attempts says (a job that can never succeed).
    /// False if the lease was lost.
    bool bury(const job& j) {
        front.id(j.id);
        return settle(j, "d");
    }

    /// bury(j), and the dead letter's last error is `reason`, cut to its first max_reason_size
    /// bytes (binary-safe); bury without a reason keeps the job's last error. False if the lease
    /// was lost.
    bool bury(const job& j, std::string_view reason) {
        front.id(j.id);
        return settle(j, with_reason("d", reason));
    }

    /// The job `id` as the store holds it now: waiting (time: when it is due; a job whose lease
    /// ended is waiting, due at that lease end), leased (time: the lease end) or dead (time: when
    /// it died), with its attempts, payload and last error (empty if none). A dead letter whose id
    /// was put again reads as the queued job. Nothing if `id` is neither queued nor dead. One
    /// script call on the id's shard.
    std::optional<job_info> get(std::string_view id) {
        front.id(id);
        return guarded([&] { return client_.get(client_.shard_of(id), id); });
    }

    /// Up to `max` (at most max_take_many) dead letters, oldest first: ordered by the time they
    /// died (server ms), then by id; the first ones if `after` is empty, else those that follow
    /// the dead letter `after`, the last id of the previous page. Empty when none follow, when
    /// `after` is not a dead letter, or for `max` 0. A dead letter written by a version before
    /// this call existed is not listed (get() and dead_size() see it). One script call per
    /// shard, O(log n + max) each: the shard of `after` first, for where it stands in the order.
    std::vector<job_info> dead(std::size_t max, std::string_view after = {}) {
        if (!after.empty()) front.id(after);
        const std::size_t n = front.take_count(max);
        if (n == 0) return {};
        return guarded([&] { return dead_page(n, after); });
    }

    /// The jobs in `state`, as dead() pages the dead letters: up to `max` (at most max_take_many)
    /// of those that follow the job `after` (empty: from the first), none when `after` is not in
    /// that state now, or for `max` 0. Waiting jobs (a job whose lease ended included, due at
    /// that end, as get() says) come in the order of their due time, leased ones in the order
    /// their leases end (server ms), both then by id; job_state::dead is dead(max, after). One
    /// script call per shard, the shard of `after` first, each a range of a sorted set found in
    /// O(log^2 n) (`events` for the waiting jobs, stepping over the leases that hold; `leases`
    /// for the leased ones), never a scan. A job leased by a client of a version before this
    /// call existed is not listed as leased (scripts.hpp, "Leases").
    std::vector<job_info> jobs(job_state state, std::size_t max, std::string_view after = {}) {
        if (state == job_state::dead) return dead(max, after);
        if (!after.empty()) front.id(after);
        const std::size_t n = front.take_count(max);
        if (n == 0) return {};
        return guarded([&] {
            return merged_page(n, after, [&](std::size_t s, std::string_view from) {
                return client_.jobs(s, state, n, from);
            });
        });
    }

    /// The dead letter `id` back in the queue as a waiting job, due `delay` from now by the
    /// server's clock (never early), with its payload and its last error, attempts counted from 0;
    /// it is a dead letter no more. False, and nothing changes, if `id` is not a dead letter, or
    /// if it is queued too (put again after it died: the queued job keeps the id, the dead letter
    /// stays). A negative delay is std::invalid_argument. One script call on the id's shard, which
    /// wakes waiting takes as a put does.
    bool requeue_dead(std::string_view id, std::chrono::milliseconds delay) {
        front.id(id);
        front.not_negative(delay, "a delay");
        return guarded(
            [&] { return client_.requeue_dead(client_.shard_of(id), id, clamp_delay(delay)); });
    }

    /// Removes the dead letters that died more than `older_than` before now (the server's clock),
    /// oldest first; returns how many. purge_dead(0ms) removes all but those that died this
    /// millisecond. A negative `older_than` is std::invalid_argument. Script calls of at most
    /// 1000 dead letters each, so that none holds the server long, on every shard in turn (a
    /// shard's calls all by its first one's now): not atomic as a whole. Dead letters written by
    /// a version before this call existed (dead_size() counts them, dead() does not list them)
    /// are not removed.
    std::size_t purge_dead(std::chrono::milliseconds older_than) {
        front.not_negative(older_than, "an age");
        return guarded([&] {
            std::size_t n = 0;
            for (std::size_t s = 0; s < client_.shards(); ++s)
                n += client_.purge_dead(s, clamp_delay(older_than));
            return n;
        });
    }

    /// Pauses the queue for every object in every process: from now on a take leases nothing and
    /// waits (up to its max_wait, or until its stop token is requested) for a resume(), which
    /// wakes it. Every other call works as before, and a lease that ends still ends (its job waits
    /// for the resume). Idempotent. The state is kept in Redis, a `paused` key in each shard,
    /// which the take script reads (so a take whose script ran before the pause may still return
    /// its job). A sharded queue pauses its shards one after the other, not atomically: a take may
    /// lease from a shard not yet paused while this runs, and a pause that fails part way (its
    /// error thrown) leaves some shards paused and paused() true; calling it again completes it.
    /// One script call per shard, all within io_timeout.
    void pause() { (void)pause_every_shard("p"); }

    /// Ends a pause, whichever object or process paused: every shard's `paused` key goes, and the
    /// takes that wait, in every process, are woken by the wake-up message of each shard that
    /// holds a job. Idempotent. Shard by shard, not atomic (as pause()): one that fails part way
    /// leaves some shards paused, and paused() true; calling it again completes it. One script
    /// call per shard, all within io_timeout.
    void resume() { (void)pause_every_shard("r"); }

    /// Whether the queue is paused: true if any shard is (the shards of a sharded queue disagree
    /// only after a pause() or resume() that failed part way, or while one runs; takes lease only
    /// from the shards that are not). One script call per shard until one is paused, all within
    /// io_timeout.
    bool paused() { return pause_every_shard(""); }

    /// The queue's figures (delayq::queue_stats), by the server's clock: `waiting` (queued and not
    /// leased, a job whose lease ended included), `due_now` (those of them that are due), `leased`
    /// (their lease not ended), `dead` (dead_size()) and `lag` (how long the oldest due job has
    /// been due; a job whose lease ended is due since its lease end). One script call per shard,
    /// O(log n) each, never a scan; a sharded queue sums its shards (lag: the largest), each read
    /// at its own moment. Jobs leased by a client of a version before this call existed are
    /// counted as waiting, not due, until their lease ends (scripts.hpp, "Leases").
    queue_stats stats() {
        return guarded([&] {
            queue_stats all;
            for (std::size_t s = 0; s < client_.shards(); ++s) {
                const queue_stats one = client_.stats(s);
                all.waiting += one.waiting;
                all.due_now += one.due_now;
                all.leased += one.leased;
                all.dead += one.dead;
                all.lag = std::max(all.lag, one.lag);
            }
            return all;
        });
    }

    /// Jobs queued: waiting plus leased.
    std::size_t size() {
        return guarded([&] {
            std::size_t n = 0;
            for (std::size_t s = 0; s < client_.shards(); ++s) n += client_.size(s);
            return n;
        });
    }

    /// Jobs moved to the dead-letter hashes `dq:v3:{tag}:dead` (id -> payload), those of earlier
    /// versions too.
    std::size_t dead_size() {
        return guarded([&] {
            std::size_t n = 0;
            for (std::size_t s = 0; s < client_.shards(); ++s) n += client_.dead_size(s);
            return n;
        });
    }

  protected:
    queue_base(options o, std::size_t shards, bool sharded)
        : client_(checked(std::move(o), shards, sharded), shards, sharded), room_(client_) {}

    std::size_t shard_count() const noexcept { return client_.shards(); }

  private:
    // `o`, if it is good for a queue of `shards` shards; else std::invalid_argument.
    static options checked(options o, std::size_t shards, bool sharded) {
        const delayq::detail::job_queue::front who(sharded ? "delayq::redis::sharded_delay_queue"
                                                           : "delayq::redis::delay_queue");
        const auto check = [&](bool ok, const char* what) { who.option(ok, what); };
        check(!o.name.empty(), "options.name is empty");
        check(o.name.find_first_of("{}") == std::string::npos,
              "options.name must not contain '{' or '}' (it is the hash tag)");
        check(o.lease > milliseconds::zero(), "options.lease must be > 0");
        check(o.io_timeout > milliseconds::zero(), "options.io_timeout must be > 0");
        check(o.max_block >= milliseconds(2), "options.max_block must be >= 2 ms");
        check(o.reclaim_batch > 0, "options.reclaim_batch must be > 0");
        check(o.keep_dead >= milliseconds::zero(), "options.keep_dead must be >= 0");
        check(o.port > 0 && o.port <= 65535, "options.port is out of range");
        check(shards > 0 && shards <= slot_count, "the number of shards must be in 1..16384");
        who.limits(o.limits);
        // Each shard leases within its share of a limit (script_client::share()): a share of 0
        // would hold that shard's jobs for ever, so no limit may be smaller than the shard count.
        check(o.limits.max_leased == 0 || o.limits.max_leased >= shards,
              "options.limits.max_leased must be 0 or at least the number of shards (each shard "
              "leases within its own share of it)");
        check(o.limits.rate == 0 || o.limits.rate >= shards,
              "options.limits.rate must be 0 or at least the number of shards (each shard leases "
              "within its own share of it)");
        return o;
    }

    // Runs `f`, a call to the server, and returns what it returns. What reaches the user is a
    // public type: the layers below throw types of their own (detail::unsent_error: nothing was
    // sent, which the router acts on), which become delayq::redis::connection_error (or error)
    // here, with the message a user reads (user_message()).
    // (A vector<bool>'s element is a proxy into the vector: `f` returns bool, not that.)
    template <class F>
    static auto guarded(F&& f) -> decltype(f()) {
        static_assert(!std::is_same_v<decltype(f()), std::vector<bool>::reference>);
        try {
            return f();
        } catch (const layout_error&) {
            throw;
        } catch (const connection_error& e) {
            if (typeid(e) == typeid(connection_error)) throw;
            throw connection_error(user_message(e.what()));
        } catch (const error& e) {
            if (typeid(e) == typeid(error)) throw;
            throw error(user_message(e.what()));
        }
    }

    // A failure to reach a server, as a user reads it, whichever command met it: "delayq::redis:
    // cannot connect to redis at 127.0.0.1:6379: Connection refused" (below, the message names
    // the command, perhaps one the user never sent: "delayq::redis: CLUSTER SLOTS: cannot connect
    // to 127.0.0.1:6379: Connection refused"). Any other message is kept as it is.
    static std::string user_message(std::string_view what) {
        for (const std::string_view marker : {"cannot connect to ", "connecting to "}) {
            const auto at = what.find(marker);
            if (at == std::string_view::npos) continue;
            const std::string_view rest = what.substr(at + marker.size());
            const auto space = rest.find(' ');  // "host:port: why" or "host:port timed out ..."
            std::string_view address = rest.substr(0, space);
            std::string_view why = space == std::string_view::npos ? "" : rest.substr(space + 1);
            if (address.ends_with(':')) address.remove_suffix(1);
            std::string out = "delayq::redis: cannot connect to redis at ";
            out.append(address);
            if (!why.empty()) out.append(": ").append(why);
            return out;
        }
        return std::string(what);
    }

    static constexpr delayq::detail::job_queue::front front{"delayq::redis::delay_queue"};

    // The put script's series mode (scripts.hpp): its first run and its schedule, `schedule`.
    bool put_series(std::string_view id, std::string_view payload, const std::string& schedule) {
        return guarded([&]() -> bool {
            const std::array<std::string_view, 4> args{id, payload, "s", schedule};
            return client_.put(client_.shard_of(id), args).front();
        });
    }

    // Settles `j` by the consume script (`how`: see scripts.hpp); false if the lease was lost.
    bool settle(const job& j, std::string_view how) {
        return guarded([&]() -> bool { return settle_and_take(j, how, 0).ok.front(); });
    }

    // One consume call on j's shard that settles j (`how`) and then leases up to `take` due jobs
    // without waiting.
    consumed settle_and_take(const job& j, std::string_view how, std::size_t take) {
        const std::string token = std::to_string(j.token);
        const std::array<std::string_view, 3> args{how, j.id, token};
        return room_.consume_and_learn(client_.shard_of(j.id), args, take);
    }

    // The pause script on the shards in turn (`how`: "p" pause, "r" resume, "" look; see
    // scripts.hpp), within one io_timeout for them all; whether a shard is paused. A look stops at
    // the first paused shard.
    bool pause_every_shard(std::string_view how) {
        return guarded([&] {
            const budget b = budget::from_now(get_options().io_timeout);
            bool any = false;
            for (std::size_t s = 0; s < client_.shards() && !(any && how.empty()); ++s)
                any = client_.pause(s, how, b) || any;
            return any;
        });
    }

    // `how` (a nack's or a burial's) with `reason` as the job's last error (scripts.hpp).
    static std::string with_reason(std::string how, std::string_view reason) {
        how.push_back('/');
        how.append(reason.substr(0, max_reason_size));
        return how;
    }

    // dead(n, after) for n in 1..max_take_many (merged_page()).
    std::vector<job_info> dead_page(std::size_t n, std::string_view after) {
        return merged_page(n, after, [&](std::size_t s, std::string_view from) {
            return client_.dead(s, n, from);
        });
    }

    // A page of n in 1..max_take_many after the job `after`, of every shard's pages that
    // `page(shard, from)` gets (script_client::dead, jobs). Every shard's page follows the place
    // of `after` (in its own shard) in the order of the whole queue; the n first of their union,
    // in that order, are the queue's page.
    template <class Page>
    std::vector<job_info> merged_page(std::size_t n, std::string_view after, Page page_of) {
        const std::size_t first = after.empty() ? 0 : client_.shard_of(after);
        std::string from;
        if (!after.empty()) from.append("i").append(after);
        script_client::job_page page = page_of(first, from);
        if (!after.empty() && page.place.empty()) return {};
        std::vector<job_info> all = std::move(page.jobs);
        if (client_.shards() == 1) return all;
        from.clear();
        if (!page.place.empty()) from.append("p").append(page.place);
        for (std::size_t s = 0; s < client_.shards(); ++s) {
            if (s == first) continue;
            script_client::job_page more = page_of(s, from);
            all.insert(all.end(), std::make_move_iterator(more.jobs.begin()),
                       std::make_move_iterator(more.jobs.end()));
        }
        std::sort(all.begin(), all.end(), [](const job_info& a, const job_info& b) {
            return a.time != b.time ? a.time < b.time : a.id < b.id;
        });
        if (all.size() > n) all.erase(all.begin() + static_cast<std::ptrdiff_t>(n), all.end());
        return all;
    }

    // In this order: the room uses the client.
    script_client client_;
    waiting_room room_;
};

}  // namespace detail

/// One named delay queue in Redis, shared by many producers and consumers on many machines; see
/// docs/redis.md. Every member may be called from many threads at once.
class delay_queue : public detail::queue_base {
  public:
    /// A handle on the queue `o.name` of the server (or cluster) at `o.host:o.port`. Throws
    /// std::invalid_argument for bad options (see `options`; also a port outside 1..65535).
    explicit delay_queue(options o) : queue_base(std::move(o), 1, false) {}
};

/// One logical queue over `shards` hash tags `{name#0}` .. `{name#N-1}`, which a Redis Cluster
/// spreads over its masters: a job's shard is a hash of its id (put, cancel, reschedule and get
/// by id work as in delay_queue, and so does requeue_dead), and consumers take from every shard;
/// dead() merges the shards' dead letters into one order, and purge_dead() purges every shard.
/// Deadline order holds within a shard; across shards a take picks the shard whose next job is due
/// first by what the object knows, so a job may come out before an earlier one of another shard
/// that fell due at about the same time (see docs/redis.md, "Sharded queue"). stats() sums the
/// shards. Limits (options.limits) are split into shares, one per shard, that add up to each
/// limit (n / shards, one more for the first n % shards): a shard's script sees its own keys
/// only, so each shard keeps its share, the queue never goes beyond the limit, and a take may be
/// held back while the shard of the due jobs is full and another is not. A limit below the
/// number of shards is refused (std::invalid_argument): a share of 0 would never hand out its
/// shard's jobs.
///
/// A shard that fails (its master down, a failover) is set aside, 100 ms doubling to 2 s, while
/// take() goes on with the others; take() throws only when no shard can serve it. Fencing tokens
/// come from one counter per shard: each lease of a job gets a greater one, which is what fencing
/// needs, but two shards can hand out the same token (use the pair id, token where something must
/// be unique across the queue). A queue-wide counter would be one key that every take of every
/// shard must reach, on one node: the bottleneck that sharding removes.
class sharded_delay_queue : public detail::queue_base {
  public:
    /// As delay_queue(o), over `shards` hash tags, in 1..16384 (else std::invalid_argument).
    sharded_delay_queue(options o, std::size_t shards) : queue_base(std::move(o), shards, true) {}
    /// How many shards (hash tags) the queue spans.
    std::size_t shards() const noexcept { return shard_count(); }
};

}  // namespace delayq::redis
