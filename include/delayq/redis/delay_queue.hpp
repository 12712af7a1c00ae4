// delayq::redis::delay_queue: a named delay queue shared through Redis (or Valkey) by many
// producers and consumers on many machines. Needs hiredis (0.14 or 1.x) and Redis >= 6.0 (fractional
// BZPOPMIN timeouts) or Valkey.
//
// Keys. Every key of queue `name` is `dq:v1:{name}:<part>`; the hash tag `{name}` keeps them in one
// Redis Cluster slot so each script may touch all of them, and `v1` lets a later layout coexist.
//   due     zset  id -> due time (server ms)        jobs waiting to become due
//   leased  zset  id -> lease end (server ms)       jobs handed to a consumer
//   data    hash  id -> payload                     every queued job, waiting or leased
//   meta    hash  id -> "attempts:token"            only jobs delivered at least once
//   seq     string                                  the fencing-token counter
//   wake    zset  one member                        what a blocked consumer waits on
//   dead    hash  id -> payload                     jobs that ran out of max_attempts
// A waiting job costs one zset entry and one hash entry; meta appears only after a delivery.
//
// Scripts. Every state change is one Lua script run with EVALSHA, so no crash between steps can
// lose or duplicate a job (Sidekiq's and Redisson's losses came from multi-step moves). A NOSCRIPT
// reply (the script cache is empty after a server restart or SCRIPT FLUSH) reloads the script and
// retries once. Scripts read the server's clock (TIME) and nothing else: a client's clock never
// decides whether a job is due. Relative delays travel as delays; an absolute put deadline is taken
// as is, as server time (rounded up to the millisecond, never early by the server's clock).
// Due-ness rounds the server time down, new due times round it up: never early.
//
// Leases and fencing. `take` moves the job from `due` to `leased` with a lease end and a fresh
// token from `seq`; ack and nack succeed only while the lease holds and the token is the current
// one, so a consumer that stalled past its lease (and whose job went to someone else) is refused.
// Expired leases are reclaimed inside `take`, at most `reclaim_batch` per call so one call never
// stalls the server, back to `due` (or to `dead` after max_attempts deliveries).
//
// Blocking take. When nothing is due the take script reports how far away the next due time (or
// lease end) is, by the server's clock. The consumer then waits with BZPOPMIN on `wake`, which any
// state change that creates a new head (put, nack, reschedule) or leaves more work due (take) fills,
// so one waiting consumer wakes per event with no polling. Redis rounds blocking timeouts to its
// cron tick (1000/hz ms, 100 ms by default), far too coarse for a due time, so when the consumer
// waits for a known due time it keeps its own timer (poll on the socket, steady clock, a relative
// interval only) and ends the block itself with CLIENT UNBLOCK from a second connection. With
// nothing pending it blocks for at most `max_block` (a lost wake-up is bounded by it) and then
// runs the take script again: two commands per `max_block` while idle. Timeouts are never below
// 2 ms (Redis < 7.0.8 reads a tiny timeout as "forever"). Every idle consumer waits for the same
// head, so when it comes due they all look; one gets it, the others wait for the next.
//
// Batches. put_many, take_many and ack_many run the same scripts over up to 500 jobs per call: a
// round trip costs far more than a job's share of script time, so they are the way to throughput.
//
// Threads and connections. A hiredis context is not thread-safe, so the object keeps a pool of
// connections: a call borrows one, gives it back afterwards, and drops it after an I/O error so the
// next call connects afresh (with its timeouts set again: hiredis 0.14's reconnect forgets them).
// A take blocked on one thread holds only its own connection.
#pragma once

#if __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
#else
#include <hiredis.h>  // hiredis 1.0's pkg-config file points inside include/hiredis
#endif
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../detail/time.hpp"

namespace delayq::redis {

/// A server or connection problem: the message carries the server's own words.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct options {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string name;                                       // the queue; non-empty, no '{' or '}'
    std::chrono::milliseconds lease = std::chrono::seconds(30);
    std::chrono::milliseconds io_timeout = std::chrono::seconds(5);
    unsigned max_attempts = 0;                              // 0: redeliver forever; else dead-letter after this many
    std::chrono::milliseconds max_block = std::chrono::seconds(5);  // longest idle block, >= 2 ms
    std::size_t reclaim_batch = 100;                        // expired leases reclaimed per take, > 0
};

struct job {
    std::string id, payload;
    std::chrono::system_clock::time_point deadline;        // when this delivery was due (server clock)
    unsigned attempts = 0;                                  // 1 at the first delivery
    std::uint64_t token = 0;                                // fencing token of this lease
    std::chrono::system_clock::time_point lease_deadline;  // the lease ends then (server clock)
};

namespace detail {

using std::chrono::milliseconds;

// Scores travel through Lua numbers, which Redis prints with %.14g: stay below 10^14 ms (year 5138).
inline constexpr long long max_ms = 99'999'999'999'999LL;
inline constexpr milliseconds min_block{2};

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

inline timeval to_timeval(milliseconds d) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(d.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((d.count() % 1000) * 1000);
    return tv;
}

inline bool error_starts_with(const redisReply* r, std::string_view prefix) {
    return r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).substr(0, prefix.size()) == prefix;
}

inline long long to_ms(std::chrono::system_clock::time_point tp) {
    const long long ms = delayq::detail::saturating_ceil<milliseconds>(tp.time_since_epoch()).count();
    return ms < 0 ? 0 : (ms > max_ms ? max_ms : ms);
}

inline std::chrono::system_clock::time_point from_ms(long long ms) {
    return std::chrono::system_clock::time_point(
        delayq::detail::saturating_ceil<std::chrono::system_clock::duration>(milliseconds(ms)));
}

inline long long clamp_delay(milliseconds d) {
    return d.count() < 0 ? 0 : (d.count() > max_ms ? max_ms : d.count());
}

// One hiredis context. Any I/O error leaves hiredis's context unusable, so it marks itself broken
// and the pool throws it away.
class connection {
public:
    connection(const std::string& host, int port, milliseconds io_timeout) : io_timeout_(io_timeout) {
        ctx_ = redisConnectWithTimeout(host.c_str(), port, to_timeval(io_timeout));
        if (ctx_ == nullptr) throw error("delayq::redis: cannot allocate a connection");
        if (ctx_->err != 0) {
            std::string msg = "delayq::redis: cannot connect to " + host + ":" + std::to_string(port) + ": " + ctx_->errstr;
            redisFree(ctx_);
            throw error(msg);
        }
        redisSetTimeout(ctx_, to_timeval(io_timeout));
        redisEnableKeepAlive(ctx_);
    }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;
    ~connection() { redisFree(ctx_); }

    bool broken() const noexcept { return broken_; }
    void discard() noexcept { broken_ = true; }
    redisContext* ctx() noexcept { return ctx_; }
    milliseconds io_timeout() const noexcept { return io_timeout_; }

    [[noreturn]] void fail(std::string_view what) {
        broken_ = true;
        // A read or write that ran into the socket timeout: hiredis reports errno's text
        // ("Resource temporarily unavailable"), which does not say what happened.
        const bool timed_out = ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
        throw error("delayq::redis: " + std::string(what) +
                    (timed_out ? " timed out after " + std::to_string(io_timeout_.count()) + " ms (io_timeout)"
                               : ": " + (ctx_->err != 0 ? std::string(ctx_->errstr) : std::string("connection lost"))));
    }

    // Sends one command and reads its reply; an error reply is returned, not thrown.
    reply_ptr command(std::span<const std::string_view> args) {
        send(args);
        return receive(name_of(args));
    }

    // "EVALSHA", or "SCRIPT LOAD" for the commands that have subcommands: what an error names.
    static std::string name_of(std::span<const std::string_view> args) {
        std::string n(args[0]);
        if (args.size() > 1 && (n == "SCRIPT" || n == "CLIENT")) n.append(" ").append(args[1]);
        return n;
    }

    // Sends one command without reading its reply (the blocking take reads it later).
    void send(std::span<const std::string_view> args) {
        argv_.clear();
        len_.clear();
        for (auto a : args) {
            argv_.push_back(a.data());
            len_.push_back(a.size());
        }
        if (redisAppendCommandArgv(ctx_, static_cast<int>(args.size()), argv_.data(), len_.data()) != REDIS_OK)
            fail(name_of(args));
        int done = 0;
        while (done == 0)
            if (redisBufferWrite(ctx_, &done) != REDIS_OK) fail(name_of(args));
    }

    reply_ptr receive(std::string_view what) {
        void* r = nullptr;
        if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) fail(what);
        reply_ptr reply(static_cast<redisReply*>(r));
        // The server closes the connection right after a protocol error (e.g. a payload beyond
        // proto-max-bulk-len): do not hand it to the next call.
        if (error_starts_with(reply.get(), "ERR Protocol error")) broken_ = true;
        return reply;
    }

    void set_timeout(milliseconds d) {
        if (redisSetTimeout(ctx_, to_timeval(d)) != REDIS_OK) fail("setting the socket timeout");
    }

    long long client_id = -1;  // CLIENT ID, fetched when this connection first blocks

private:
    redisContext* ctx_ = nullptr;
    milliseconds io_timeout_;
    bool broken_ = false;
    std::vector<const char*> argv_;  // reused: a connection serves one call at a time
    std::vector<std::size_t> len_;
};

enum script_id : std::size_t { s_put, s_take, s_settle, s_cancel, s_reschedule, s_count };

// The scripts' common opening: `now` (server time rounded down: is it due yet?), `later` (rounded
// up: new due times are never early), and the wake rule: a blocked consumer sleeps until the head's
// due time, so only a new, earlier head needs to wake one.
#define DELAYQ_REDIS_PRELUDE                                                        \
    "if redis.replicate_commands then redis.replicate_commands() end\n"             \
    "local t = redis.call('TIME')\n"                                                \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"       \
    "local later = tonumber(t[1]) * 1000 + math.ceil(tonumber(t[2]) / 1000)\n"      \
    "local function due_at(ms) return math.min(later + ms, 99999999999999) end\n"   \
    "local function head_score(z)\n"                                                \
    "  local h = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')\n"                      \
    "  return h[2] and tonumber(h[2])\n"                                            \
    "end\n"                                                                         \
    "local function wake_if_earlier(w, old, first)\n"                               \
    "  if first and (not old or first < old) then redis.call('ZADD', w, 0, 'w') end\n" \
    "end\n"

// KEYS due data wake; ARGV (id payload mode ms)*, mode 'a': ms is a due time, 'r': a delay.
// Returns one 1 (queued) or 0 (already queued) per job.
inline constexpr const char* put_lua = DELAYQ_REDIS_PRELUDE R"lua(
local old, first, out = head_score(KEYS[1]), nil, {}
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[2], id, ARGV[i + 1]) == 0 then
    out[#out + 1] = 0
  else
    local at = tonumber(ARGV[i + 3])
    if ARGV[i + 2] == 'r' then at = due_at(at) end
    redis.call('ZADD', KEYS[1], at, id)
    if not first or at < first then first = at end
    out[#out + 1] = 1
  end
end
wake_if_earlier(KEYS[3], old, first)
return out
)lua";

// KEYS due leased data meta wake dead seq; ARGV lease_ms max_attempts reclaim_batch max_jobs
// Returns {1, n, (id, payload, due, attempts, token, lease_end)*n} or {0, ms to the next event | -1}.
inline constexpr const char* take_lua = DELAYQ_REDIS_PRELUDE R"lua(
local due, leased, data, meta, wake, dead, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local max_attempts = tonumber(ARGV[2])
local function attempts_of(id)
  local m = redis.call('HGET', meta, id)
  if not m then return 0 end
  return tonumber(string.match(m, '^(%d+)'))
end
local expired = redis.call('ZRANGEBYSCORE', leased, '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
for i = 1, #expired, 2 do
  local id = expired[i]
  redis.call('ZREM', leased, id)
  if max_attempts > 0 and attempts_of(id) >= max_attempts then
    redis.call('HSET', dead, id, redis.call('HGET', data, id) or '')
    redis.call('HDEL', data, id)
    redis.call('HDEL', meta, id)
  else
    redis.call('ZADD', due, expired[i + 1], id)
  end
end
local heads = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
if #heads == 0 then
  local nd, nl = head_score(due), head_score(leased)
  local nxt = nd
  if nl and (not nxt or nl < nxt) then nxt = nl end
  if not nxt then return {0, -1} end
  return {0, nxt - now}
end
local n = #heads / 2
local token = redis.call('INCRBY', seq, n) - n
local lease_end = math.min(now + tonumber(ARGV[1]), 99999999999999)
local out = {1, n}
for i = 1, #heads, 2 do
  local id = heads[i]
  token = token + 1
  local attempts = attempts_of(id) + 1
  redis.call('ZREM', due, id)
  -- %d, not `..`: Lua prints numbers with %.14g, so 10^14 would become '1e+14' and never match
  redis.call('HSET', meta, id, string.format('%d:%d', attempts, token))
  redis.call('ZADD', leased, lease_end, id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', data, id) or ''
  out[#out + 1] = tonumber(heads[i + 1])
  out[#out + 1] = attempts
  out[#out + 1] = token
  out[#out + 1] = lease_end
end
-- Hand the watch on: the consumer that watched the head has taken it, and whatever is still
-- pending (a later job, or at least the lease just handed out) needs a new watcher.
redis.call('ZADD', wake, 0, 'w')
return out
)lua";

// KEYS due leased data meta wake dead; ARGV how('ack' | retry delay ms) max_attempts (id token)*
// Returns one 1 (settled) or 0 (the lease ended or is someone else's) per job.
inline constexpr const char* settle_lua = DELAYQ_REDIS_PRELUDE R"lua(
local due, leased, data, meta, wake, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local how, max_attempts = ARGV[1], tonumber(ARGV[2])
local old, first, out = head_score(due), nil, {}
for i = 3, #ARGV, 2 do
  local id, ok = ARGV[i], 0
  local lease_end = redis.call('ZSCORE', leased, id)
  local m = lease_end and tonumber(lease_end) > now and redis.call('HGET', meta, id)
  if m and string.match(m, ':(%d+)$') == ARGV[i + 1] then
    ok = 1
    redis.call('ZREM', leased, id)
    if how == 'ack' then
      redis.call('HDEL', data, id)
      redis.call('HDEL', meta, id)
    elseif max_attempts > 0 and tonumber(string.match(m, '^(%d+)')) >= max_attempts then
      redis.call('HSET', dead, id, redis.call('HGET', data, id) or '')
      redis.call('HDEL', data, id)
      redis.call('HDEL', meta, id)
    else
      local at = due_at(tonumber(how))
      redis.call('ZADD', due, at, id)
      if not first or at < first then first = at end
    end
  end
  out[#out + 1] = ok
end
wake_if_earlier(wake, old, first)
return out
)lua";

// KEYS due leased data meta; ARGV id
inline constexpr const char* cancel_lua = R"lua(
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
)lua";

// KEYS due wake; ARGV id delay_ms
inline constexpr const char* reschedule_lua = DELAYQ_REDIS_PRELUDE R"lua(
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local old, at = head_score(KEYS[1]), due_at(tonumber(ARGV[2]))
redis.call('ZADD', KEYS[1], at, ARGV[1])
wake_if_earlier(KEYS[2], old, at)
return 1
)lua";

#undef DELAYQ_REDIS_PRELUDE

inline constexpr std::array<const char*, s_count> scripts{put_lua, take_lua, settle_lua, cancel_lua, reschedule_lua};

}  // namespace detail

class delay_queue {
public:
    explicit delay_queue(options o) : opt_(std::move(o)) {
        if (opt_.name.empty()) throw std::invalid_argument("delayq::redis::delay_queue: options.name is empty");
        if (opt_.name.find_first_of("{}") != std::string::npos)
            throw std::invalid_argument("delayq::redis::delay_queue: options.name must not contain '{' or '}' (it is the hash tag)");
        if (opt_.lease <= std::chrono::milliseconds::zero())
            throw std::invalid_argument("delayq::redis::delay_queue: options.lease must be > 0");
        if (opt_.io_timeout <= std::chrono::milliseconds::zero())
            throw std::invalid_argument("delayq::redis::delay_queue: options.io_timeout must be > 0");
        if (opt_.max_block < detail::min_block)
            throw std::invalid_argument("delayq::redis::delay_queue: options.max_block must be >= 2 ms");
        if (opt_.reclaim_batch == 0)
            throw std::invalid_argument("delayq::redis::delay_queue: options.reclaim_batch must be > 0");
        if (opt_.port <= 0 || opt_.port > 65535)
            throw std::invalid_argument("delayq::redis::delay_queue: options.port is out of range");
        const std::string prefix = "dq:v1:{" + opt_.name + "}:";
        for (std::size_t i = 0; i < k_count; ++i) keys_[i] = prefix + key_names[i];
        lease_ms_ = std::to_string(opt_.lease.count());
        max_attempts_ = std::to_string(opt_.max_attempts);
        batch_ = std::to_string(opt_.reclaim_batch);
    }
    delay_queue(const delay_queue&) = delete;
    delay_queue& operator=(const delay_queue&) = delete;

    const options& get_options() const noexcept { return opt_; }

    /// Queues `id` to be due at `deadline` (the caller's clock, taken as server time). False if
    /// `id` is already queued (waiting or leased); nothing changes then.
    bool put(std::string_view id, std::string_view payload, std::chrono::system_clock::time_point deadline) {
        check_id(id);
        const std::string at = std::to_string(detail::to_ms(deadline));
        return put_impl({id, payload, "a", at}).front();
    }

    /// Queues `id` to be due `delay` from now by the server's clock. False if already queued.
    bool put_after(std::string_view id, std::string_view payload, std::chrono::milliseconds delay) {
        check_id(id);
        const std::string ms = std::to_string(detail::clamp_delay(delay));
        return put_impl({id, payload, "r", ms}).front();
    }

    struct put_request {
        std::string_view id, payload;
        std::chrono::milliseconds delay{0};
    };

    /// put_after for many jobs: one round trip and one script call per 500 jobs. Element i of
    /// the result is what put_after would have returned for jobs[i]; a duplicate id is refused.
    std::vector<bool> put_many(std::span<const put_request> jobs) {
        std::vector<std::string> ms;
        ms.reserve(jobs.size());  // never reallocates: `args` holds views of these strings
        std::vector<std::string_view> args;
        args.reserve(4 * jobs.size());
        for (const auto& j : jobs) {
            check_id(j.id);
            ms.push_back(std::to_string(detail::clamp_delay(j.delay)));
            args.insert(args.end(), {j.id, j.payload, "r", ms.back()});
        }
        return put_impl(args);
    }

    /// Removes a waiting or leased job. False if `id` is not queued.
    bool cancel(std::string_view id) {
        check_id(id);
        return integer(eval(detail::s_cancel, {key(k_due), key(k_leased), key(k_data), key(k_meta)}, {id})) == 1;
    }

    /// Gives a waiting job a new due time, `delay` from now. False for an unknown or leased id.
    bool reschedule(std::string_view id, std::chrono::milliseconds delay) {
        check_id(id);
        const std::string ms = std::to_string(detail::clamp_delay(delay));
        return integer(eval(detail::s_reschedule, {key(k_due), key(k_wake)}, {id, ms})) == 1;
    }

    /// Leases the earliest due job, waiting up to `max_wait` for one (not at all when <= 0).
    std::optional<job> take(std::chrono::milliseconds max_wait) {
        auto jobs = take_many(1, max_wait);
        if (jobs.empty()) return std::nullopt;
        return std::move(jobs.front());
    }

    /// Leases up to `max_jobs` (at most 500) due jobs, earliest first, waiting up to `max_wait` for the
    /// first. Every job has its own lease and token.
    std::vector<job> take_many(std::size_t max_jobs, std::chrono::milliseconds max_wait) {
        using clock = std::chrono::steady_clock;
        const auto limit =
            delayq::detail::saturating_add(clock::now(), std::max(max_wait, std::chrono::milliseconds::zero()));
        const std::string count = std::to_string(std::clamp<std::size_t>(max_jobs, 1, max_batch));
        auto c = borrow();
        bool recovered = false;
        bool watching = false;  // this call took the wake-up marker: it watches the head for everyone
        for (;;) {
            auto r = eval(*c, detail::s_take,
                          {key(k_due), key(k_leased), key(k_data), key(k_meta), key(k_wake), key(k_dead), key(k_seq)},
                          {lease_ms_, max_attempts_, batch_, count});
            if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) bad_reply("take", r.get());
            if (r->element[0]->integer == 1) return to_jobs(r.get());
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(limit - clock::now());
            if (max_wait <= std::chrono::milliseconds::zero() || left <= std::chrono::milliseconds::zero()) {
                // Leaving with the marker would leave the pending head unwatched: pass it on.
                if (watching && r->element[1]->integer >= 0)
                    integer(run(*c, std::array<std::string_view, 4>{"ZADD", key(k_wake), "0", "w"}));
                return {};
            }
            // +1 ms: the server rounds "now" down, so the reported distance may be short by < 1 ms.
            const long long next = r->element[1]->integer;
            const std::chrono::milliseconds until_due(next < 0 ? std::numeric_limits<long long>::max() : next + 1);
            const bool precise = until_due <= std::min(left, opt_.max_block);
            const auto wait = std::max(detail::min_block, std::min({until_due, left, opt_.max_block}));
            try {
                watching = block(*c, wait, precise) || watching;
            } catch (const error&) {
                // The wait changes nothing on the server, so one broken wait (CLIENT KILL, a
                // restart) is retried on a fresh connection; a second one is the caller's.
                if (recovered) throw;
                recovered = true;
                c = borrow();
            }
        }
    }

    /// Done with the job: it is gone for good. False if the lease was lost (ended, or cancelled).
    bool ack(const job& j) { return settle({&j, 1}, "ack").front(); }

    /// ack for many jobs, one round trip per 500; element i is what ack(jobs[i]) would have returned.
    std::vector<bool> ack_many(std::span<const job> jobs) { return settle(jobs, "ack"); }

    /// Back to the queue, due `retry_after` from now (or dead-lettered after max_attempts).
    /// False if the lease was lost.
    bool nack(const job& j, std::chrono::milliseconds retry_after) {
        return settle({&j, 1}, std::to_string(detail::clamp_delay(retry_after))).front();
    }

    /// Jobs queued: waiting plus leased.
    std::size_t size() { return count("HLEN", k_data); }

    /// Jobs moved to the dead-letter hash `dq:v1:{name}:dead` (id -> payload).
    std::size_t dead_size() { return count("HLEN", k_dead); }

private:
    static constexpr std::size_t max_batch = 500;
    enum key_id : std::size_t { k_due, k_leased, k_data, k_meta, k_wake, k_dead, k_seq, k_count };
    static constexpr std::array<const char*, k_count> key_names{"due", "leased", "data", "meta", "wake", "dead", "seq"};

    // A borrowed connection; goes back to the pool unless it broke.
    struct deleter {
        delay_queue* q;
        void operator()(detail::connection* c) const noexcept { q->give_back(c); }
    };
    using handle = std::unique_ptr<detail::connection, deleter>;

    handle borrow() {
        {
            std::lock_guard lk(pool_m_);
            if (!pool_.empty()) {
                handle h(pool_.back().release(), deleter{this});
                pool_.pop_back();
                return h;
            }
        }
        return handle(new detail::connection(opt_.host, opt_.port, opt_.io_timeout), deleter{this});
    }

    void give_back(detail::connection* c) noexcept {
        std::unique_ptr<detail::connection> owned(c);
        if (c->broken()) return;
        try {
            std::lock_guard lk(pool_m_);
            pool_.push_back(std::move(owned));
        } catch (...) {  // out of memory for the pool: closing the connection loses nothing
        }
    }

    std::string_view key(key_id k) const noexcept { return keys_[k]; }

    static void check_id(std::string_view id) {
        if (id.empty()) throw std::invalid_argument("delayq::redis::delay_queue: a job id must not be empty");
    }

    [[noreturn]] static void bad_reply(std::string_view what, const redisReply* r) {
        if (r->type == REDIS_REPLY_ERROR)
            throw error("delayq::redis: " + std::string(what) + ": " + std::string(r->str, r->len));
        throw error("delayq::redis: " + std::string(what) + ": unexpected reply type " + std::to_string(r->type));
    }

    static long long integer(const detail::reply_ptr& r) {
        if (r->type != REDIS_REPLY_INTEGER) bad_reply("reply", r.get());
        return r->integer;
    }

    // Runs a command; a server still loading its data set is retried until io_timeout has passed.
    detail::reply_ptr run(detail::connection& c, std::span<const std::string_view> args) {
        const auto give_up = std::chrono::steady_clock::now() + opt_.io_timeout;
        for (;;) {
            auto r = c.command(args);
            if (!detail::error_starts_with(r.get(), "LOADING") || std::chrono::steady_clock::now() >= give_up) return r;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }

    std::size_t count(std::string_view cmd, key_id k) {
        auto c = borrow();
        auto r = run(*c, std::array<std::string_view, 2>{cmd, key(k)});
        return static_cast<std::size_t>(integer(r));
    }

    // SHA1s come from SCRIPT LOAD (no SHA-1 code here), once per object; they never change, so
    // after a NOSCRIPT (a restarted server forgot its scripts) loading again is all it takes.
    std::string_view sha(detail::connection& c, detail::script_id s) {
        if (sha_ready_[s].load(std::memory_order_acquire)) return sha_[s];
        const std::string loaded = load(c, s);
        std::lock_guard lk(sha_m_);
        if (!sha_ready_[s].load(std::memory_order_relaxed)) {
            sha_[s] = loaded;
            sha_ready_[s].store(true, std::memory_order_release);
        }
        return sha_[s];
    }

    std::string load(detail::connection& c, detail::script_id s) {
        auto r = run(c, std::array<std::string_view, 3>{"SCRIPT", "LOAD", detail::scripts[s]});
        if (r->type != REDIS_REPLY_STRING) bad_reply("SCRIPT LOAD", r.get());
        return std::string(r->str, r->len);
    }

    detail::reply_ptr eval(detail::connection& c, detail::script_id s, std::initializer_list<std::string_view> keys,
                           std::span<const std::string_view> args) {
        std::vector<std::string_view> argv;
        argv.reserve(3 + keys.size() + args.size());
        const std::string nkeys = std::to_string(keys.size());
        argv.insert(argv.end(), {"EVALSHA", sha(c, s), nkeys});
        argv.insert(argv.end(), keys);
        argv.insert(argv.end(), args.begin(), args.end());
        for (bool reloaded = false;; reloaded = true) {
            auto r = run(c, argv);
            if (r->type != REDIS_REPLY_ERROR) return r;
            if (reloaded || !detail::error_starts_with(r.get(), "NOSCRIPT")) bad_reply("script", r.get());
            load(c, s);
        }
    }

    detail::reply_ptr eval(detail::connection& c, detail::script_id s, std::initializer_list<std::string_view> keys,
                           std::initializer_list<std::string_view> args) {
        return eval(c, s, keys, std::span<const std::string_view>(args.begin(), args.size()));
    }

    detail::reply_ptr eval(detail::script_id s, std::initializer_list<std::string_view> keys,
                           std::initializer_list<std::string_view> args) {
        auto c = borrow();
        return eval(*c, s, keys, args);
    }

    // Runs a batch script over `args`, `per` arguments per job (plus `fixed` leading ones), at most
    // max_batch jobs per call so that no single call stalls the server; one 0/1 per job.
    std::vector<bool> batched(detail::script_id s, std::initializer_list<std::string_view> keys,
                              std::span<const std::string_view> fixed, std::span<const std::string_view> args,
                              std::size_t per) {
        std::vector<bool> out;
        out.reserve(args.size() / per);
        auto c = borrow();
        std::vector<std::string_view> chunk;
        for (std::size_t at = 0; at < args.size(); at += per * max_batch) {
            const std::size_t n = std::min(args.size() - at, per * max_batch);
            chunk.assign(fixed.begin(), fixed.end());
            chunk.insert(chunk.end(), args.begin() + static_cast<std::ptrdiff_t>(at),
                         args.begin() + static_cast<std::ptrdiff_t>(at + n));
            auto r = eval(*c, s, keys, chunk);
            if (r->type != REDIS_REPLY_ARRAY || r->elements != n / per) bad_reply("batch", r.get());
            for (std::size_t i = 0; i < r->elements; ++i) out.push_back(r->element[i]->integer == 1);
        }
        return out;
    }

    std::vector<bool> put_impl(std::span<const std::string_view> args) {
        return batched(detail::s_put, {key(k_due), key(k_data), key(k_wake)}, {}, args, 4);
    }
    std::vector<bool> put_impl(std::initializer_list<std::string_view> args) {
        return put_impl(std::span<const std::string_view>(args.begin(), args.size()));
    }

    std::vector<bool> settle(std::span<const job> jobs, const std::string& how) {
        std::vector<std::string> tokens;
        tokens.reserve(jobs.size());  // never reallocates: `args` holds views of these strings
        std::vector<std::string_view> args;
        args.reserve(2 * jobs.size());
        for (const auto& j : jobs) {
            check_id(j.id);
            tokens.push_back(std::to_string(j.token));
            args.insert(args.end(), {j.id, tokens.back()});
        }
        const std::array<std::string_view, 2> fixed{how, max_attempts_};
        return batched(detail::s_settle,
                       {key(k_due), key(k_leased), key(k_data), key(k_meta), key(k_wake), key(k_dead)}, fixed, args, 2);
    }

    static std::vector<job> to_jobs(const redisReply* r) {
        const auto n = static_cast<std::size_t>(r->element[1]->integer);
        if (r->elements != 2 + 6 * n) bad_reply("take", r);
        std::vector<job> out(n);
        for (std::size_t k = 0; k < n; ++k) {
            redisReply* const* e = r->element + 2 + 6 * k;
            const auto str = [](const redisReply* x) {
                return x->type == REDIS_REPLY_STRING ? std::string(x->str, x->len) : std::string();
            };
            job& j = out[k];
            j.id = str(e[0]);
            j.payload = str(e[1]);
            j.deadline = detail::from_ms(e[2]->integer);
            j.attempts = static_cast<unsigned>(e[3]->integer);
            j.token = static_cast<std::uint64_t>(e[4]->integer);
            j.lease_deadline = detail::from_ms(e[5]->integer);
        }
        return out;
    }

    // Waits on the wake zset for `wait`. When `precise`, a due time is what we wait for: our own
    // timer ends the block with CLIENT UNBLOCK, as the server's timeout may be a cron tick late.
    // True if it took the marker.
    bool block(detail::connection& c, std::chrono::milliseconds wait, bool precise) {
        if (precise && c.client_id < 0) c.client_id = integer(run(c, std::array<std::string_view, 2>{"CLIENT", "ID"}));
        char secs[32];
        std::snprintf(secs, sizeof secs, "%lld.%03lld", static_cast<long long>(wait.count() / 1000),
                      static_cast<long long>(wait.count() % 1000));
        c.set_timeout(wait + opt_.io_timeout);
        c.send(std::array<std::string_view, 3>{"BZPOPMIN", key(k_wake), secs});
        detail::reply_ptr r;
        try {
            if (precise && !readable(c, wait)) {
                // A busy server may not have read our BZPOPMIN yet, and an unblock that arrives
                // first unblocks nothing: repeat it until the reply comes (or the read times out).
                const auto give_up = std::chrono::steady_clock::now() + opt_.io_timeout;
                do {
                    unblock(c.client_id);
                } while (!readable(c, std::chrono::milliseconds(5)) && std::chrono::steady_clock::now() < give_up);
            }
            r = c.receive("BZPOPMIN");
        } catch (...) {
            c.discard();  // a reply may still be on its way: the connection is out of step
            throw;
        }
        c.set_timeout(opt_.io_timeout);
        if (r->type == REDIS_REPLY_ERROR) bad_reply("BZPOPMIN", r.get());
        return r->type == REDIS_REPLY_ARRAY;
    }

    static bool readable(detail::connection& c, std::chrono::milliseconds wait) {
        const auto end = std::chrono::steady_clock::now() + wait;
        for (;;) {
            pollfd p{};
            p.fd = c.ctx()->fd;
            p.events = POLLIN;
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
            const int n = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
            if (n > 0) return true;
            if (n == 0) return false;
            if (errno != EINTR) return true;  // let the read report the socket's error
        }
    }

    void unblock(long long id) {
        auto c = borrow();
        const std::string sid = std::to_string(id);
        auto r = run(*c, std::array<std::string_view, 3>{"CLIENT", "UNBLOCK", sid});
        if (r->type == REDIS_REPLY_ERROR) bad_reply("CLIENT UNBLOCK", r.get());
    }

    options opt_;
    std::array<std::string, k_count> keys_;
    std::string lease_ms_, max_attempts_, batch_;
    std::mutex sha_m_;
    std::array<std::string, detail::s_count> sha_;
    std::array<std::atomic<bool>, detail::s_count> sha_ready_{};
    std::mutex pool_m_;
    std::vector<std::unique_ptr<detail::connection>> pool_;
};

}  // namespace delayq::redis
