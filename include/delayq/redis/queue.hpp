// delayq::redis::delay_queue and sharded_delay_queue: the public API over the scripts, the router
// and the links. Part of <delayq/redis/delay_queue.hpp>, which is what users include.
//
// The idea. A queue object is a client of one queue shard (delay_queue) or of N shards, each its
// own hash tag and so its own Cluster slot (sharded_delay_queue). Everything the server does is in
// scripts.hpp; what the object adds is how its threads wait, and how few round trips they need.
//
// One round trip per job. Users write `while (auto j = q.take(t)) { work(*j); q.ack(*j); }`. The
// ack (not a nack) of a job that take() handed out also leases the next due job of its shard, in
// the same script call, and keeps it for the object's next take(), which then needs no round trip:
// the loop costs the consumer one call per job while jobs are due (BullMQ's worker does the same
// when it completes a job). A job kept that way is handed to no user code yet, so the server holds
// it for a short `hold`, min(400 ms, lease / 4), its attempt not counted (the "kept" state of
// scripts.hpp): an object that never calls again (stopped, killed, or done taking) cannot keep it
// any longer, and it is never dead-lettered for a delivery nobody saw. take() hands a kept job out
// only within a quarter of the hold after the ack was sent, min(100 ms, lease / 16); an ack or nack
// of it proves the hand-over by itself, and if none came within half that window the object's
// keeper thread extends it (scripts.hpp's "extend": the whole lease, the attempt counted), long
// before the hold ends. So a loop whose jobs take under 50 ms costs no extra call. The keeper also
// gives back (release) the kept jobs that no take() came for within the window, and the destructor
// the rest. The object keeps at most one per job that take() handed out and that is not yet acked
// or nacked (one per consumer thread in the loop above). `options::prefetch = false` turns it off;
// so does a lease under 16 ms.
//
// Waiting without polling. When nothing is due, take() waits on the queue's pub/sub channel (see
// "Wake-ups" in scripts.hpp): every script reports how far off its shard's next event is, and
// every script that makes it earlier publishes the new time, so the object knows, for each shard,
// a time before which nothing there is due. One thread, the reader, waits on the subscription with
// its own timer until the earliest of those times, and then runs the script (one thread per shard
// at a time, unless the last answer said more is due); the others sleep on a condition variable
// and are woken one at a time, as delay_queue's followers are, so a process needs one subscribed
// connection per queue object however many threads consume. After `max_block` without news a
// shard is looked at anyway: a safety net for messages lost while a connection was down. Every
// waiting object hears every message, so when a job comes due each idle object looks once and
// one of them gets it (the others learn the next due time); busy objects run nothing.
//
// Threads. Every command goes through a link (connection.hpp), which sends what the threads send
// at the same time in one write. A take that waits holds the subscription, not a link, so it
// holds up no other call.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../detail/time.hpp"
#include "cluster.hpp"
#include "connection.hpp"
#include "scripts.hpp"

namespace delayq::redis {

/// The options of delay_queue and sharded_delay_queue. Bad values (an empty `name`, a name with
/// `{` or `}`, `lease` or `io_timeout` <= 0, `max_block` < 2 ms, `reclaim_batch` 0) make the
/// queue's constructor throw std::invalid_argument.
struct options {
    std::string host = "127.0.0.1";  ///< a server, or any node of a Redis Cluster
    int port = 6379;                 ///< its port
    std::string name;                ///< the queue; non-empty, no '{' or '}'
    /// How long a taken job is invisible to other consumers before it is delivered again (> 0).
    std::chrono::milliseconds lease = std::chrono::seconds(30);
    /// The limit of one round trip to the server (> 0); beyond it, delayq::redis::error.
    std::chrono::milliseconds io_timeout = std::chrono::seconds(5);
    unsigned max_attempts = 0;  ///< 0: redeliver forever; else dead-letter after this many
    /// The longest a waiting take goes without asking the server, >= 2 ms.
    std::chrono::milliseconds max_block = std::chrono::seconds(5);
    std::size_t reclaim_batch = 100;  ///< ended leases reclaimed per script call, > 0
    bool prefetch = true;             ///< ack also leases the next due job for the next take()
    /// The Redis ACL user to log in as (AUTH user password); empty: `default`, or no AUTH at all
    /// when `password` is empty too. docs/redis.md lists the permissions the user needs.
    std::string user;
    std::string password;  ///< its password (or the server's requirepass, with no user)
};

/// One delivery of a job, as take() hands it out: what ack() and nack() need to prove that the
/// caller still holds the lease.
struct job {
    std::string id;                                  ///< the id it was put with
    std::string payload;                             ///< its payload, binary-safe
    std::chrono::system_clock::time_point deadline;  ///< when this delivery was due (server clock)
    unsigned attempts = 0;                           ///< 1 at the first delivery
    /// Fencing token of this lease: greater at each lease of the job, unique within its shard
    /// only (see sharded_delay_queue).
    std::uint64_t token = 0;
    std::chrono::system_clock::time_point lease_deadline;  ///< the lease ends then (server clock)
};

namespace detail {

// Due times travel as milliseconds through Lua numbers (doubles): stay below 10^14 ms (year
// 5138), exact in a double and in every format the scripts use.
inline constexpr long long max_ms = 99'999'999'999'999LL;
inline constexpr std::size_t max_batch = 500;  // jobs per script call: no call stalls the server

inline long long to_ms(std::chrono::system_clock::time_point tp) {
    const long long ms =
        delayq::detail::saturating_ceil<milliseconds>(tp.time_since_epoch()).count();
    return std::clamp(ms, 0LL, max_ms);
}

// A script argument: the letter c, then n in decimal. (Appended rather than "c" + to_string(n):
// g++ 12 at -O2 warns, wrongly, of -Wrestrict inside that operator+, in users' builds too.)
inline std::string tagged(char c, long long n) {
    std::string s(1, c);
    s += std::to_string(n);
    return s;
}

inline std::chrono::system_clock::time_point from_ms(long long ms) {
    return std::chrono::system_clock::time_point(
        delayq::detail::saturating_ceil<std::chrono::system_clock::duration>(milliseconds(ms)));
}

inline long long clamp_delay(milliseconds d) {
    return std::clamp<long long>(d.count(), 0, max_ms);
}

// FNV-1a, 64 bits: which shard an id belongs to. Part of the key layout: never change it.
constexpr std::uint64_t fnv1a(std::string_view s) noexcept {
    std::uint64_t h = 14695981039346656037ULL;
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    return h;
}

// Everything of delay_queue and sharded_delay_queue; they differ only in their shards.
class queue_base {
  public:
    queue_base(const queue_base&) = delete;
    queue_base& operator=(const queue_base&) = delete;

    // Gives back the jobs that acks leased for a take() that never came: without this
    // they would wait for their hold to end. Best effort: if it fails, the hold ends anyway.
    ~queue_base() {
        std::vector<held> left;
        {
            std::lock_guard lk(m_);
            left.swap(stash_);
            stopping_ = true;
        }
        keeper_cv_.notify_all();
        if (keeper_.joinable()) keeper_.join();
        try {
            release(left);
        } catch (...) {  // the server is gone: the leases end by themselves
        }
        for (int fd : poke_)
            if (fd >= 0) ::close(fd);
    }

    const options& get_options() const noexcept { return opt_; }

    /// Queues `id` to be due at `deadline` (the caller's clock, taken as server time). False if
    /// `id` is already queued (waiting or leased); nothing changes then.
    bool put(std::string_view id, std::string_view payload,
             std::chrono::system_clock::time_point deadline) {
        check_id(id);
        const std::string at = std::to_string(to_ms(deadline));
        const std::array<std::string_view, 4> args{id, payload, "a", at};
        return put_args(shard_for(id), args).front();
    }

    /// Queues `id` to be due `delay` from now by the server's clock. False if already queued.
    bool put_after(std::string_view id, std::string_view payload, std::chrono::milliseconds delay) {
        check_id(id);
        const std::string ms = std::to_string(clamp_delay(delay));
        const std::array<std::string_view, 4> args{id, payload, "r", ms};
        return put_args(shard_for(id), args).front();
    }

    struct put_request {
        std::string_view id, payload;
        std::chrono::milliseconds delay{0};
    };

    /// put_after for many jobs: one script call per shard and 500 jobs. Element i of the result
    /// is what put_after would have returned for jobs[i]; a duplicate id is refused.
    std::vector<bool> put_many(std::span<const put_request> jobs) {
        std::vector<std::string> ms(jobs.size());
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            check_id(jobs[i].id);
            ms[i] = std::to_string(clamp_delay(jobs[i].delay));
        }
        std::vector<std::string_view> args;
        return by_shard(
            jobs.size(), [&](std::size_t i) { return jobs[i].id; },
            [&](shard& s, std::span<const std::size_t> idx) {
                args.clear();
                for (std::size_t i : idx)
                    args.insert(args.end(), {jobs[i].id, jobs[i].payload, "r", ms[i]});
                return put_args(s, args);
            });
    }

    /// Removes a waiting or leased job. False if `id` is not queued.
    bool cancel(std::string_view id) {
        check_id(id);
        shard& s = shard_for(id);
        {
            std::lock_guard lk(m_);  // a kept job that is cancelled must not be handed out
            std::erase_if(stash_, [&](const held& h) { return h.j.id == id; });
            std::erase_if(handed_, [&](const handed& h) { return h.id == id; });
        }
        const std::array<std::string_view, 1> args{id};
        return integer(eval(s, s_cancel, args)) == 1;
    }

    /// Gives a waiting job a new due time, `delay` from now. False for an unknown or leased id.
    bool reschedule(std::string_view id, std::chrono::milliseconds delay) {
        check_id(id);
        const std::string ms = std::to_string(clamp_delay(delay));
        const std::array<std::string_view, 2> args{id, ms};
        return integer(eval(shard_for(id), s_reschedule, args)) == 1;
    }

    /// Leases the earliest due job, waiting up to `max_wait` for one (not at all when <= 0).
    std::optional<job> take(std::chrono::milliseconds max_wait) {
        auto jobs = take_jobs(1, max_wait);
        if (jobs.empty()) return std::nullopt;
        std::lock_guard lk(m_);
        ++in_hand_;
        return std::move(jobs.front());
    }

    /// Leases up to `max_jobs` (at most 500) due jobs of one shard, earliest first, waiting up to
    /// `max_wait` for the first. Every job has its own lease and token.
    std::vector<job> take_many(std::size_t max_jobs, std::chrono::milliseconds max_wait) {
        return take_jobs(std::clamp<std::size_t>(max_jobs, 1, max_batch), max_wait);
    }

    /// Done with the job: it is gone for good. False if the lease was lost (ended, or cancelled).
    bool ack(const job& j) { return settle_one(j, "a", prefetch_); }

    /// ack for many jobs, one script call per shard and 500 jobs; element i is what ack(jobs[i])
    /// would have returned. Leases nothing for later.
    std::vector<bool> ack_many(std::span<const job> jobs) {
        for (const auto& j : jobs) check_id(j.id);
        std::vector<std::string> tokens(jobs.size());
        for (std::size_t i = 0; i < jobs.size(); ++i) tokens[i] = std::to_string(jobs[i].token);
        std::vector<std::string_view> args;
        auto out = by_shard(
            jobs.size(), [&](std::size_t i) { return jobs[i].id; },
            [&](shard& s, std::span<const std::size_t> idx) {
                args.clear();
                for (std::size_t i : idx) args.insert(args.end(), {"a", jobs[i].id, tokens[i]});
                return consume_and_learn(s, args).ok;
            });
        std::lock_guard lk(m_);
        for (const auto& j : jobs) forget_handed(j);
        return out;
    }

    /// Back to the queue, due `retry_after` from now (or dead-lettered after max_attempts).
    /// False if the lease was lost.
    bool nack(const job& j, std::chrono::milliseconds retry_after) {
        // Leases nothing for later: the next due job may be this one again, and a nacked job is
        // for the others to try.
        return settle_one(j, tagged('n', clamp_delay(retry_after)), false);
    }

    /// Jobs queued: waiting plus leased (including those kept for this object's next take()).
    std::size_t size() {
        std::size_t n = 0;
        for (auto& s : shards_) n += static_cast<std::size_t>(integer(eval(s, s_size, {})));
        return n;
    }

    /// Jobs moved to the dead-letter hashes `dq:v2:{tag}:dead` (id -> payload).
    std::size_t dead_size() {
        std::size_t n = 0;
        for (auto& s : shards_) {
            const std::array<std::string_view, 2> args{"HLEN", s.keys[k_dead]};
            n += static_cast<std::size_t>(integer(router_.call(s.slot, args)));
        }
        return n;
    }

  protected:
    queue_base(options o, std::size_t shards, bool sharded)
        : opt_(std::move(o)),
          router_(endpoint{opt_.host, opt_.port, opt_.user, opt_.password}, opt_.io_timeout) {
        const std::string type =
            sharded ? "delayq::redis::sharded_delay_queue: " : "delayq::redis::delay_queue: ";
        const auto check = [&](bool ok, const char* what) {
            if (!ok) throw std::invalid_argument(type + what);
        };
        check(!opt_.name.empty(), "options.name is empty");
        check(opt_.name.find_first_of("{}") == std::string::npos,
              "options.name must not contain '{' or '}' (it is the hash tag)");
        check(opt_.lease > milliseconds::zero(), "options.lease must be > 0");
        check(opt_.io_timeout > milliseconds::zero(), "options.io_timeout must be > 0");
        check(opt_.max_block >= milliseconds(2), "options.max_block must be >= 2 ms");
        check(opt_.reclaim_batch > 0, "options.reclaim_batch must be > 0");
        check(opt_.port > 0 && opt_.port <= 65535, "options.port is out of range");
        check(shards > 0 && shards <= slot_count, "the number of shards must be in 1..16384");
        channel_ = "dq:v2:{" + opt_.name + (sharded ? "#*" : "") + "}:wake";
        shards_ = std::vector<shard>(shards);
        for (std::size_t i = 0; i < shards; ++i) {
            shard& s = shards_[i];
            s.index = std::to_string(i);
            const std::string prefix =
                "dq:v2:{" + opt_.name + (sharded ? "#" + s.index : "") + "}:";
            for (std::size_t k = 0; k < k_count; ++k) s.keys[k] = prefix + key_names[k];
            s.slot = slot_of(s.keys[0]);
        }
        lease_ms_ = std::to_string(opt_.lease.count());
        max_attempts_ = std::to_string(opt_.max_attempts);
        batch_ = std::to_string(opt_.reclaim_batch);
        hold_ = std::min(milliseconds(400), opt_.lease / 4);
        window_ = hold_ / 4;
        hold_ms_ = std::to_string(hold_.count());
        prefetch_ = opt_.prefetch && window_ >= milliseconds(1);
    }

    std::size_t shard_count() const noexcept { return shards_.size(); }

  private:
    using clock = std::chrono::steady_clock;

    struct shard {
        std::string index;                      // ARGV[2] of its scripts
        std::array<std::string, k_count> keys;  // KEYS, in scripts.hpp's order
        std::uint16_t slot = 0;
        // Under m_: nothing is due here before `next` (see "Waiting without polling").
        clock::time_point next = clock::time_point::min();
        int takers = 0;        // threads running a consume script here now
        bool backlog = false;  // the last answer said more is due now: every thread may look
        // Under m_: consumes here that failed in a row; while there are any, the shard is set
        // aside until `aside_until` (see set_aside()).
        unsigned failures = 0;
        clock::time_point aside_until = clock::time_point::min();
    };

    struct held {  // a job that an ack kept for the next take()
        job j;
        shard* from;
        clock::time_point sent;  // the ack was sent then: the server's hold began after that
    };

    struct handed {  // a kept job that take() handed out: its lease is to be extended
        std::string id;
        std::uint64_t token = 0;
        shard* from = nullptr;
        clock::time_point at;  // extend it then, unless an ack or nack of it came first
    };

    struct consumed {
        long long next = -1;  // ms until the shard's next event; 0: more is due; -1: empty
        std::vector<bool> ok;
        std::vector<job> jobs;
    };

    shard& shard_for(std::string_view id) noexcept {
        return shards_.size() == 1 ? shards_.front() : shards_[fnv1a(id) % shards_.size()];
    }

    static void check_id(std::string_view id) {
        if (id.empty())
            throw std::invalid_argument("delayq::redis::delay_queue: a job id must not be empty");
    }

    [[noreturn]] static void bad_reply(std::string_view what, const redisReply* r) {
        if (r->type == REDIS_REPLY_ERROR)
            throw error("delayq::redis: " + std::string(what) + ": " + std::string(text_of(r)));
        throw error("delayq::redis: " + std::string(what) + ": unexpected reply type " +
                    std::to_string(r->type));
    }

    static long long integer(const reply_ptr& r) {
        if (r->type != REDIS_REPLY_INTEGER) bad_reply("reply", r.get());
        return r->integer;
    }

    // SHA1s come from SCRIPT LOAD (no SHA-1 code here), once per object; they never change.
    std::string_view sha(const shard& s, script_id id, bool patient = true) {
        if (sha_ready_[id].load(std::memory_order_acquire)) return sha_[id];
        const std::array<std::string_view, 3> args{"SCRIPT", "LOAD", scripts[id]};
        auto r = router_.call(s.slot, args, patient);
        if (r->type != REDIS_REPLY_STRING) bad_reply("SCRIPT LOAD", r.get());
        std::lock_guard lk(sha_m_);
        if (!sha_ready_[id].load(std::memory_order_relaxed)) {
            sha_[id] = std::string(text_of(r.get()));
            sha_ready_[id].store(true, std::memory_order_release);
        }
        return sha_[id];
    }

    // Runs script `id` on shard `s` with ARGV = channel, shard number, `args`. A node that has
    // not seen the script (restarted, SCRIPT FLUSH, a new master) answers NOSCRIPT without running
    // anything; EVAL with the source then runs it and teaches it the script. `patient`: see
    // router::call.
    reply_ptr eval(shard& s, script_id id, std::span<const std::string_view> args,
                   bool patient = true) {
        std::vector<std::string_view> argv;
        argv.reserve(5 + k_count + args.size());
        argv.insert(argv.end(), {"EVALSHA", sha(s, id, patient), "5"});
        static_assert(k_count == 5);
        argv.insert(argv.end(), s.keys.begin(), s.keys.end());
        argv.insert(argv.end(), {std::string_view(channel_), std::string_view(s.index)});
        argv.insert(argv.end(), args.begin(), args.end());
        auto r = router_.call(s.slot, argv, patient);
        if (error_starts_with(r.get(), "NOSCRIPT")) {
            argv[0] = "EVAL";
            argv[1] = scripts[id];
            r = router_.call(s.slot, argv, patient);
        }
        if (r->type == REDIS_REPLY_ERROR)
            bad_reply(std::string(script_names[id]) + " script", r.get());
        return r;
    }

    reply_ptr eval(shard& s, script_id id, std::initializer_list<std::string_view> args) {
        return eval(s, id, std::span<const std::string_view>(args.begin(), args.size()));
    }

    std::vector<bool> put_args(shard& s, std::span<const std::string_view> args) {
        auto r = eval(s, s_put, args);
        if (r->type != REDIS_REPLY_ARRAY || r->elements != args.size() / 4)
            bad_reply("put", r.get());
        std::vector<bool> out(r->elements);
        for (std::size_t i = 0; i < r->elements; ++i) out[i] = r->element[i]->integer == 1;
        return out;
    }

    // Calls `run(shard, indices)` for the items of each shard, at most max_batch at a time, and
    // puts the answers back in the items' order.
    template <class IdOf, class Run>
    std::vector<bool> by_shard(std::size_t n, IdOf id_of, Run run) {
        std::vector<bool> out(n);
        std::vector<std::vector<std::size_t>> groups(shards_.size());
        for (std::size_t i = 0; i < n; ++i)
            groups[static_cast<std::size_t>(&shard_for(id_of(i)) - shards_.data())].push_back(i);
        for (std::size_t g = 0; g < groups.size(); ++g)
            for (std::size_t at = 0; at < groups[g].size(); at += max_batch) {
                const std::span<const std::size_t> idx(groups[g].data() + at,
                                                       std::min(max_batch, groups[g].size() - at));
                const std::vector<bool> got = run(shards_[g], idx);
                if (got.size() != idx.size())
                    throw error("delayq::redis: a batch's reply has the wrong length");
                for (std::size_t k = 0; k < idx.size(); ++k) out[idx[k]] = got[k];
            }
        return out;
    }

    // The consume script: settles `settle` ((how, id, token)*), then leases up to `take` jobs
    // (with `keep`, kept for hold_ only: see "One round trip per job"). The caller passes what it
    // says about the shard's next event to learn(). `patient`: see router::call.
    consumed consume(shard& s, std::span<const std::string_view> settle, std::size_t take,
                     bool keep = false, bool patient = true) {
        std::vector<std::string_view> args;
        args.reserve(5 + settle.size());
        const std::string count = std::to_string(take);
        args.insert(args.end(), {std::string_view(lease_ms_), std::string_view(max_attempts_),
                                 std::string_view(batch_), std::string_view(count),
                                 keep ? std::string_view(hold_ms_) : std::string_view("0")});
        args.insert(args.end(), settle.begin(), settle.end());
        auto r = eval(s, s_consume, args, patient);
        const std::size_t k = settle.size() / 3;
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 + k) bad_reply("consume", r.get());
        consumed c;
        c.next = r->element[0]->integer;
        c.ok.resize(k);
        for (std::size_t i = 0; i < k; ++i) c.ok[i] = r->element[1 + i]->integer == 1;
        const auto n = static_cast<std::size_t>(r->element[1 + k]->integer);
        if (r->elements != 2 + k + 6 * n) bad_reply("consume", r.get());
        c.jobs.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            redisReply* const* e = r->element + 2 + k + 6 * i;
            job& j = c.jobs[i];
            j.id = text_of(e[0]);
            j.payload = text_of(e[1]);
            j.deadline = from_ms(e[2]->integer);
            j.attempts = static_cast<unsigned>(e[3]->integer);
            j.token = static_cast<std::uint64_t>(e[4]->integer);
            j.lease_deadline = from_ms(e[5]->integer);
        }
        return c;
    }

    // consume() for the calls that keep nothing: the hints learn from it at once.
    consumed consume_and_learn(shard& s, std::span<const std::string_view> settle) {
        consumed c = consume(s, settle, 0);
        std::lock_guard lk(m_);
        learn(s, c.next);
        return c;
    }

    // Under m_: the shard's next event is `next_ms` away (+1 ms: the server rounds its now down,
    // so the distance may be short by less than a millisecond), and at most max_block.
    void learn(shard& s, long long next_ms) {
        const auto now = clock::now();
        s.failures = 0;  // it answered: no longer set aside
        s.aside_until = clock::time_point::min();
        const milliseconds d =
            next_ms < 0 ? opt_.max_block
                        : std::min(milliseconds(next_ms + (next_ms > 0 ? 1 : 0)), opt_.max_block);
        s.next = now + d;
        s.backlog = next_ms == 0;
        if (next_ms == 0)
            wake_one();  // more is due now: one more thread may take it
        else if (reading_ && s.next < reader_until_)
            poke();  // the reader would sleep past it
    }

    // Under m_: brings the thread that reads the subscription back to look again.
    void poke() {
        if (poke_[1] >= 0)
            (void)!::write(poke_[1], "!", 1);  // full pipe: it is being poked already
    }

    // Under m_: there is something to take (a kept job, a backlog): one waiting thread takes it.
    void wake_one() {
        if (waiting_ > 0)
            cv_.notify_one();
        else if (reading_)
            poke();
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
            i >= shards_.size())
            return;  // not ours (a newer layout on the same channel): ignore it
        shards_[i].next =
            std::min(shards_[i].next, clock::now() + milliseconds(ms + (ms > 0 ? 1 : 0)));
    }

    // Under m_: a consume on `s` failed (its node is down, the cluster is failing over, a reply
    // was lost). Its next event is still in the past, so without this every take would pick it
    // first, spend io_timeout there and throw, while the other shards' jobs wait. So it is set
    // aside for 100 ms, doubling with each failure in a row up to 2 s (a failover takes seconds;
    // a shard whose node comes back is looked at again within the last pause), and a success
    // (learn()) ends that.
    void set_aside(shard& s, clock::time_point now) {
        static constexpr milliseconds first(100), most(2000);
        const unsigned doublings = std::min(s.failures, 5U);
        ++s.failures;
        s.aside_until = now + std::min(first * (1U << doublings), most);
        if (reading_ && s.aside_until < reader_until_) poke();  // look at it again in time
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
    shard* pick(clock::time_point now, bool first, bool& patient) {
        shard* best = nullptr;
        std::size_t serving = 0;  // shards whose last consume did not fail
        for (auto& s : shards_) {
            if (s.failures == 0) ++serving;
            if (s.failures > 0 && (s.aside_until > now || s.takers > 0)) continue;
            // A thread woken for a due shard leaves it to the one already looking; a call that
            // has not asked yet asks anyway (nothing it sees tells it that nothing is due).
            if (!first && (s.next > now || (s.takers > 0 && !s.backlog))) continue;
            if (best == nullptr || s.next < best->next) best = &s;
        }
        if (serving == 0)
            for (auto& s : shards_)  // fewest failures in a row, then the earliest end of pause
                if (best == nullptr || s.failures < best->failures ||
                    (s.failures == best->failures && s.aside_until < best->aside_until))
                    best = &s;
        patient = best != nullptr && serving == (best->failures == 0 ? 1U : 0U);
        return best;
    }

    // Under m_: when a waiting thread should look again: the earliest next event that has not
    // come yet, or the end of a shard's pause (a due shard that another thread is looking at
    // wakes us by notify instead).
    clock::time_point wake_time(clock::time_point now) const {
        auto t = clock::time_point::max();
        for (const auto& s : shards_) {
            const auto at = s.failures > 0 ? std::max(s.next, s.aside_until) : s.next;
            if (at > now) t = std::min(t, at);
        }
        return t;
    }

    bool settle_one(const job& j, const std::string& how, bool prefetch) {
        check_id(j.id);
        shard& s = shard_for(j.id);
        bool fetch = false;
        {
            std::lock_guard lk(m_);
            fetch = prefetch && in_hand_ > stash_.size() && start_keeper();
            if (in_hand_ > 0) --in_hand_;
        }
        const std::string token = std::to_string(j.token);
        const std::array<std::string_view, 3> args{how, j.id, token};
        const auto sent = clock::now();
        consumed c = consume(s, args, fetch ? 1 : 0, fetch);
        std::lock_guard lk(m_);
        learn(s, c.next);
        forget_handed(j);  // settled (or lost): nothing to extend
        if (!c.jobs.empty()) {
            stash_.push_back(held{std::move(c.jobs.front()), &s, sent});
            wake_one();  // a thread waiting in take() may have it
            wake_keeper(sent + window_);
        }
        return c.ok.front();
    }

    // Under m_: the keeper thread runs (started now if need be); false if it cannot be started,
    // and then nothing is kept.
    bool start_keeper() {
        if (keeper_.joinable()) return true;
        if (stopping_) return false;
        try {
            keeper_ = std::thread([this] { keep(); });
        } catch (const std::system_error&) {
            return false;
        }
        return true;
    }

    // Under m_: the keeper has something to do at `t`.
    void wake_keeper(clock::time_point t) {
        if (t < keeper_until_) keeper_cv_.notify_one();
    }

    // Under m_: `j` was acked or nacked: the ack or nack proved the hand-over by itself.
    void forget_handed(const job& j) {
        std::erase_if(handed_, [&](const handed& h) { return h.token == j.token && h.id == j.id; });
    }

    // The keeper thread: extends the kept jobs that take() handed out and that no ack or nack
    // settled within half the window, and gives back the kept jobs that no take() came for within
    // the window. Failures are left alone: a hold that is not extended or given back ends by itself
    // (the holder of an unextended job then finds its lease lost, as after any lost lease).
    void keep() noexcept {
        std::unique_lock lk(m_);
        std::vector<handed> extend;
        std::vector<held> stale;
        while (!stopping_) {
            try {
                const auto now = clock::now();
                auto next = clock::time_point::max();
                extend.reserve(handed_.size());  // the moves below then cannot throw
                stale.reserve(stash_.size());
                std::erase_if(handed_, [&](handed& h) {
                    if (h.at > now) {
                        next = std::min(next, h.at);
                        return false;
                    }
                    extend.push_back(std::move(h));
                    return true;
                });
                std::erase_if(stash_, [&](held& h) {
                    if (h.sent + window_ > now) {
                        next = std::min(next, h.sent + window_);
                        return false;
                    }
                    stale.push_back(std::move(h));
                    return true;
                });
                if (extend.empty() && stale.empty()) {
                    keeper_until_ = next;
                    if (next == clock::time_point::max())
                        keeper_cv_.wait(lk);
                    else
                        keeper_cv_.wait_until(lk, next);
                    keeper_until_ = clock::time_point::min();  // awake: it looks again anyway
                    continue;
                }
                lk.unlock();
                extend_all(extend);
                release(stale);
            } catch (...) {  // the server is gone, or no memory: the holds end by themselves
            }
            extend.clear();
            stale.clear();
            if (!lk.owns_lock()) lk.lock();
        }
    }

    // Makes the leases of handed-out kept jobs whole, one script call per shard.
    void extend_all(const std::vector<handed>& hs) {
        for (auto& s : shards_) {
            std::vector<std::string> tokens;
            for (const auto& h : hs)
                if (h.from == &s) tokens.push_back(std::to_string(h.token));
            if (tokens.empty()) continue;
            std::vector<std::string_view> args;
            std::size_t k = 0;
            for (const auto& h : hs)
                if (h.from == &s) args.insert(args.end(), {"x", h.id, tokens[k++]});
            consume_and_learn(s, args);
        }
    }

    // Gives kept jobs back to their shards, as they were before an ack leased them.
    void release(std::vector<held>& hs) {
        for (auto& s : shards_) {
            std::vector<std::string> ms, tokens;
            std::vector<std::string_view> args;
            for (const auto& h : hs)
                if (h.from == &s) {
                    ms.push_back(tagged('r', to_ms(h.j.deadline)));
                    tokens.push_back(std::to_string(h.j.token));
                }
            if (ms.empty()) continue;
            std::size_t k = 0;
            for (const auto& h : hs)
                if (h.from == &s) {
                    args.insert(args.end(), {ms[k], h.j.id, tokens[k]});
                    ++k;
                }
            consume_and_learn(s, args);
        }
    }

    // Under lk: up to `want` kept jobs that are still fresh; stale ones go back to the queue.
    // The keeper extends the ones handed out, unless an ack or nack of them comes first.
    std::vector<job> from_stash(std::unique_lock<std::mutex>& lk, std::size_t want) {
        std::vector<job> out;
        if (stash_.empty()) return out;
        const auto now = clock::now();
        std::vector<held> stale;
        std::vector<handed> extend;
        out.reserve(std::min(want, stash_.size()));  // the moves below then cannot throw
        stale.reserve(stash_.size());
        extend.reserve(out.capacity());
        std::erase_if(stash_, [&](held& h) {
            if (now - h.sent >= window_) {
                stale.push_back(std::move(h));
                return true;
            }
            if (out.size() >= want) return false;
            extend.push_back(handed{{}, h.j.token, h.from, std::max(now, h.sent + window_ / 2)});
            out.push_back(std::move(h.j));
            return true;
        });
        for (std::size_t i = 0; i < out.size(); ++i) {
            extend[i].id = out[i].id;
            wake_keeper(extend[i].at);
        }
        handed_.insert(handed_.end(), std::make_move_iterator(extend.begin()),
                       std::make_move_iterator(extend.end()));
        if (!stale.empty()) {
            lk.unlock();
            try {
                release(stale);
            } catch (const error&) {  // their leases end by themselves
            }
            lk.lock();
        }
        return out;
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
        // A SUBSCRIBE is harmless to repeat, so whatever befalls the connection (refused, or the
        // node died before it answered) it is tried again, as the router retries a command that
        // did not run, within io_timeout. In a cluster every node hears every PUBLISH: each try
        // goes to the node of the next shard, so that one node down does not stop the waiting.
        const auto give_up = clock::now() + opt_.io_timeout;
        milliseconds pause(10);
        for (std::size_t attempt = 0;; ++attempt) {
            std::optional<endpoint> at;
            try {
                at = router_.node_of(shards_[attempt % shards_.size()].slot);
            } catch (const error&) {  // no node of the cluster answered (yet): try again
                failed = std::current_exception();
            } catch (...) {
                failed = std::current_exception();
                break;
            }
            if (at) {
                try {
                    sub = std::make_unique<subscriber>(*at, opt_.io_timeout, channel_);
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
            if (router_.clustered()) router_.invalidate();  // the map may name a dead node
            std::this_thread::sleep_for(std::min<clock::duration>(pause, give_up - now));
            pause = std::min(pause * 2, milliseconds(100));
        }
        if (sub != nullptr) failed = nullptr;
        lk.lock();
        reading_ = false;
        cv_.notify_all();
        if (failed) std::rethrow_exception(failed);
        sub_ = std::move(sub);
        for (auto& s : shards_) s.next = std::min(s.next, clock::now());
    }

    void wait_until(std::unique_lock<std::mutex>& lk, clock::time_point t) {
        ++waiting_;
        cv_.wait_until(lk, t);
        --waiting_;
    }

    // The leader-follower wait of delay_queue, over the subscription. One thread, the reader,
    // waits on the subscription until the earliest time something may come due (or its own
    // limit); the others wait on cv_ until their limits, and are woken one at a time when there
    // is something for them (a kept job, a backlog) or when the reader leaves its post. A thread
    // whose script taught it an earlier time than the reader waits for pokes the reader.
    std::vector<job> take_jobs(std::size_t want, std::chrono::milliseconds max_wait) {
        const auto limit =
            delayq::detail::saturating_add(clock::now(), std::max(max_wait, milliseconds::zero()));
        bool asked = false;  // this call has run a script: hints alone may now say "nothing due"
        std::unique_lock lk(m_);
        for (;;) {
            if (auto kept = from_stash(lk, want); !kept.empty()) return kept;
            const auto now = clock::now();
            bool patient = true;
            if (shard* s = pick(now, !asked, patient)) {
                ++s->takers;
                lk.unlock();
                consumed c;
                try {
                    c = consume(*s, {}, want, false, patient);
                } catch (const error&) {
                    lk.lock();
                    --s->takers;
                    set_aside(*s, clock::now());
                    if (patient) throw;  // no other shard could serve this call
                    continue;            // the others may: an error only when none can
                } catch (...) {
                    lk.lock();
                    --s->takers;
                    throw;
                }
                lk.lock();
                --s->takers;
                learn(*s, c.next);
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

    options opt_;
    router router_;
    std::vector<shard> shards_;
    std::string channel_, lease_ms_, max_attempts_, batch_;
    milliseconds hold_{};    // how long the server keeps a job an ack kept (see "One round trip")
    milliseconds window_{};  // how long after its ack take() may hand out a kept job
    std::string hold_ms_;
    bool prefetch_ = false;  // options::prefetch, unless the lease is too short for a window
    std::mutex sha_m_;
    std::array<std::string, s_count> sha_;
    std::array<std::atomic<bool>, s_count> sha_ready_{};

    std::mutex m_;  // the hints, the kept jobs, the subscription's reader
    std::condition_variable cv_;
    std::unique_ptr<subscriber> sub_;  // used by the reading thread only
    std::vector<std::string> heard_;   // likewise
    bool reading_ = false;
    clock::time_point reader_until_;   // when the reader looks again by itself
    std::array<int, 2> poke_{-1, -1};  // a pipe: a byte in it brings the reader back
    int waiting_ = 0;                  // threads in wait_until()
    std::vector<held> stash_;
    std::size_t in_hand_ = 0;     // jobs take() handed out, not yet acked or nacked
    std::vector<handed> handed_;  // kept jobs take() handed out, to extend
    std::condition_variable keeper_cv_;
    clock::time_point keeper_until_ = clock::time_point::max();  // when the keeper wakes by itself
    bool stopping_ = false;                                      // the destructor has begun
    std::thread keeper_;  // last: it starts after, and is joined before, everything it uses
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
/// spreads over its masters: a job's shard is a hash of its id (put, cancel and reschedule by id
/// work as in delay_queue), and consumers take from every shard. Deadline order holds within a
/// shard; across shards a take picks the shard whose next job is due first by what the object
/// knows, so a job may come out before an earlier one of another shard that fell due at about the
/// same time (see docs/redis.md, "Sharded queue").
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
