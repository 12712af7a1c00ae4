// The Lua scripts of the Redis delay queue: every change of a job's state is one script, run
// whole by the server. Part of <delayq/redis/delay_queue.hpp>.
//
// A job's states (the server's clock decides every "due" and "ended"):
//
// clang-format off
//   waiting  in `events` (score: due ms); its payload in its bucket ("p" field); "m" =
//            "attempts:0:0" once delivered, "/" and its last error after that once it has one;
//            a run of a series (put_every, put_cron) has its schedule in "r" too
//   leased   in `events` (score: lease end ms); "m" = "attempts:token:lease end", and
//            "/" and its last error if it has one
//   dead     in `dead` (id -> payload), `dead:info` (id -> "attempts:died/last error") and
//            `dead:order` (member "died:id")
//   gone     nowhere: the id may be put again
//
// | from    | to      | by                                                                   |
// |---------|---------|----------------------------------------------------------------------|
// | gone    | waiting | put (refused while the id is waiting or leased); put_every, put_cron |
// | waiting | waiting | reschedule                                                           |
// | waiting | leased  | take: attempts + 1, a new token                                      |
// | waiting | gone    | cancel                                                               |
// | leased  | gone    | ack; cancel                                                          |
// | leased  | waiting | ack, or any move to dead below, of a run of a series: its next run,  |
// |         |         | attempts 0, no last error (see "Repeatable jobs")                    |
// | leased  | leased  | extend: its lease end moved, the same token                          |
// | leased  | waiting | nack; release: the take it was leased for had given up when its      |
// |         |         | reply came (script_client.hpp), so nobody got it: due at its due     |
// |         |         | time again, attempts - 1 ("m" removed at 0)                          |
// | leased  | leased  | its lease ended: a take hands it out again, as any due job           |
// | leased  | dead    | nack, or a take finding its lease ended, once attempts reach         |
// |         |         | max_attempts; bury, at once                                          |
// | dead    | waiting | requeue dead: attempts 0, its payload and last error kept (refused   |
// |         |         | while the id is queued: put again after it died)                     |
// | dead    | gone    | purge dead: those that died before a cutoff, oldest first; and with  |
// |         |         | keep_dead, each death in consume sweeps a few that died too long ago |
// | any     | (same)  | get: reads the job, queued or dead (a queued one first)              |
// | any     | (same)  | stats: counts the jobs of each state                                 |
// | dead    | (same)  | dead page: reads the dead letters in the order they died             |
// | waiting | (same)  | jobs page: reads the waiting jobs by due time, or the leased ones by |
// | leased  |         | lease end                                                            |
// clang-format on
//
// Beside the jobs, a shard is paused or not (see "Pausing"): no job changes state by that. And it
// keeps its leases by end (`leases`) and the leases that objects with a rate made (`grants`),
// which the limits count (see "Limits").
//
// ack, nack, bury, extend and release need the job's current token while its lease holds (lease
// end > now), so a holder whose lease ended, or whose job was cancelled or delivered again, is
// refused. A take counts the attempt in the same script that leases the job, so the server has
// counted every delivery before any user code sees the job; a release takes back an attempt that
// no user code saw.
//
// Earlier versions. An ack of an earlier version could also lease the next due job for its
// object's next take() ("kept": "m" = "attempts:token:hold end:lease end", its attempts not
// counting that delivery, in `events` until the hold end, a short lease). A server may still hold
// such entries after an upgrade. These scripts read one as a lease that ends at its hold end
// (the third field): nobody here holds its token, so it comes back when the hold ends and the
// next take hands it out with its attempts + 1, or buries it after max_attempts, as any lease
// that ended. The earlier version's own objects run their own scripts and keep working.
//
// The idea. One sorted set holds every queued job, scored by the time something must happen to
// it: a waiting job's due time, a leased job's lease end. Both mean "hand it out then": a job whose
// lease ended is due again, at its lease end. So a take is one look at the set's head, whatever
// the head holds, and a lease or a nack only moves the job's score (one ZADD); the
// earliest event of any kind is the head (one ZRANGE). (Layout v2 had a sorted set per state, and
// each consume call first moved ended leases over: two more calls per job, docs/redis.md "Cost
// per job".)
//
// Keys of a queue shard with hash tag T (`{name}`, or `{name#i}` for a sharded queue) are
// `dq:v3:T:<part>`. Every script gets the same nine KEYS, in this order:
//
// clang-format off
//   KEYS[1] events      zset  id -> due time or lease end (server ms)   every queued job
//   KEYS[2] data        never created itself: it names the buckets `data:0` .. `data:1023`,
//                       hashes that hold "p" .. id -> payload, "m" .. id ->
//                       "attempts:token:lease end" (then "/" and the last error, if any) and,
//                       for a run of a series, "r" .. id -> "slot schedule"; a job's bucket
//                       is a hash of its id
//   KEYS[3] seq         string                                          the fencing-token counter
//   KEYS[4] dead        hash  id -> payload                             every dead letter
//   KEYS[5] dead:order  zset  "died:id" -> 0 (died: 14 digits, ms)      dead letters by age
//   KEYS[6] dead:info   hash  id -> "attempts:died/last error"          (died as in dead:order)
//   KEYS[7] paused      hash  "since" -> server ms of the pause         only while paused
//   KEYS[8] leases      zset  id -> lease end (server ms)               jobs leased by a take
//   KEYS[9] grants      zset  token -> server ms of the lease           leases made under a rate
// clang-format on
//
// and ARGV[1] = the wake-up channel, ARGV[2] = the shard's number; the rest is each script's own.
// A queue written in an older layout (`dq:v2:T:due` and the rest) is not read: the client refuses
// it with layout_error (script_client.hpp), and its keys stay as they are.
//
// The last error. A job's last error (the reason of its last nack or burial that gave one) rides in
// its "m" entry, after a "/" (the numbers before it hold no "/"), so the calls that end a queued
// job remove it with the job and cost no command more: ack and cancel delete "m" anyway, a put
// finds none (it writes only new jobs), and a burial reads "m" already. A take, an extend and a
// release rewrite "m" and keep what follows the "/". A reason longer than 64 bytes makes its
// bucket an ordinary hash (see "Why buckets"); reasons are cut to max_reason_size on the C++ side.
//
// Dead letters. `dead` (id -> payload) is what every version writes and reads; `dead:info` and
// `dead:order` stand beside it, written with it by a burial. A dead letter written by an earlier
// version is in `dead` alone: get reads it as dead since 0 (unknown), attempts 0, no last error,
// and the dead page does not list it (it has no place in the order). `dead:order` holds one
// member per dead letter, all of score 0, so that ZRANGEBYLEX orders them by the bytes of
// "died:id": died zero-padded to 14 digits (every time is below max_ms, 10^14) sorts by time,
// then by id, as a sorted set orders members. That makes "the dead letters after this one" one
// ZRANGEBYLEX from a position that need not be a member: a sharded queue asks every shard for
// the page after the anchor's position, found in the anchor's own shard. A member whose dead
// letter is gone from `dead` (removed by hand) is dropped by the next dead page that meets it.
// The same order makes "those that died before t" one ZRANGEBYLEX below the 14 digits of t: a
// purge and the keep_dead sweep remove the oldest first, a bounded number per call, whatever
// the hash holds.
//
// Why buckets: a waiting job costs one zset entry and one hash entry, and a big hash costs Redis
// about 80 bytes per entry; a hash of at most 128 short entries is stored as one compact listpack
// at about 30 (hash-max-listpack-entries/-value, 128 entries and 64-byte values by default). With
// 1024 buckets a shard holds about 130 000 jobs with payloads of up to 64 bytes compactly (145
// bytes per waiting job in all, against 203 in one hash); beyond that Redis converts the buckets to
// ordinary hashes, no worse than one big hash.
//
// Why `data` never exists: the scripts touch buckets they cannot declare (a take learns its ids
// inside the script). Redis Cluster runs a script only when every key it declares is on the node;
// while the slot is being migrated, a declared key that is missing makes the server answer
// TRYAGAIN (or ASK, then TRYAGAIN on the target) instead. `data` is always missing, so no script
// runs while the queue's slot is half moved, and a script that runs finds every bucket on its node.
//
// Time. Scripts read the server's clock (TIME) and nothing else: `now` rounded down decides what is
// due, `later` rounded up makes new due times (never early). Numbers leave Lua through
// string.format('%d'): `..` would print 10^14 as "1e+14" (that broke every ack once the token
// counter got there). No due time or lease end goes beyond max_ms ("no deadline", below): the
// scripts clamp to it as the C++ side does, and read it from their prelude, which is made from
// the C++ constant at compile time, so the two cannot disagree and each script's text (so its
// SHA1) is fixed for a build.
//
// Pausing. A shard is paused while its `paused` key exists: the consume script then leases
// nothing (its settlements still run: acks, nacks, extends, burials, releases) and answers "-1",
// as for an empty shard, so a take that waits sleeps until a message or max_block, never running
// the script again for the due jobs it cannot have. The key lives in the shard's slot because a
// script may touch only its own slot's keys: a sharded queue keeps one per shard, which the client
// sets and removes shard by shard (queue.hpp). The pause script sets it (HSETNX: the first
// pause's time stays) and removes it (HDEL: a hash of one field goes with its field), and on a
// resume that ended a pause publishes the shard's next event, so that the takes that wait in any
// process look at once. A hash rather than a string, because HSETNX, HDEL and EXISTS are
// commands the scripts ran already: the ACL of the version before (docs/redis.md, "Redis ACLs")
// serves this one unchanged. A queue written before this key existed has none: not paused. The
// look costs the consume script one EXISTS (about 0.3 us of server time, measured as a loop of
// them in one script on redis-server 7.0.15, against the 20 us or more of a whole consume call);
// the other scripts read the key only where they would publish (below).
//
// Leases. `leases` holds the lease end of every job a take leased, beside its score in `events`
// (the same number): the take adds it (ZADD, which moves the score of a job leased again), an
// extend moves it, and everything that ends a lease removes it (ZREM, nothing when absent): ack,
// nack, release, bury, the burial of a job whose last lease ended, cancel, requeue dead. A lease
// that ran out stays, its score <= now, until its job is leased again or settled: so the jobs
// leased now are ZCOUNT(leases, (now, +inf)), O(log n), and the ended leases cost nothing to
// keep. That count is what max_leased and stats() read; events alone cannot tell a lease end from
// a due time in O(log n). A queue written before this key existed has none (an empty set to every
// command): its jobs leased by a client of that version are not in it, so they are not counted
// as leased (stats() counts them as waiting, not due, until their lease ends; max_leased lets
// that many more be leased), which ends with those leases. Nothing else reads the key, so no
// older data is misread. A client of that version running beside this one does not remove what
// it settles: such an entry counts until its lease end, then lies in the past like any ended one.
//
// Limits (delayq::job_limits, options.limits). The consume script of an object with limits gets
// its shard's share of them (max_leased, rate and period, queue.hpp: the shares of a sharded
// queue add up to the object's limits) and, after its settlements, leases at most the room they
// leave: max_leased - ZCOUNT(leases, (now, +inf)), and rate - ZCARD(grants) once the grants of
// more than a period ago are trimmed (ZREMRANGEBYSCORE); each lease under a rate adds one grant,
// its fencing token (unique in the shard) scored by now, and a release takes it back. Due jobs
// that find no room are held back, and the answer for the next event is then the time a place
// frees, never "now" (the taker trusts a "due now" and would ask again at once): the lease end
// after which fewer than max_leased leases hold, the grant time + period after which fewer than
// rate grants stay in the window, the later of the two when both are full. A place that frees
// sooner frees by a settlement, so the settlements of an object with limits publish while a due
// job waits: an ack, nack, release or burial (or an extend that shortened a lease) publishes the
// shard's next event after it, "now" if it left room, else the time a place frees; a cancel that
// ended a lease that held publishes "now" (it does not count the room: a take that finds none is
// told the time again). The objects that wait, in every process, look then. An object without
// limits leases whatever is due, and its settlements publish nothing for the limits: give every
// object of a queue the same limits (delayq/job.hpp).
//
// Stats. The stats script counts a shard in O(log n) from what the other scripts keep: leased =
// ZCOUNT(leases, (now, +inf)); waiting = ZCARD(events) - leased (a leased job is in both);
// due_now = ZCOUNT(events, -inf, now), the waiting jobs due and the jobs whose lease ended, which
// are due again (a job whose lease holds has its lease end, > now, as its score); lag = now - the
// head's score when the head is due, else 0; dead = HLEN(dead).
//
// Repeatable jobs (put_every, put_cron). A series is one id whose runs follow one another, each an
// ordinary job with "r" .. id = "<slot> <schedule>" in its bucket beside "p" and "m": schedule is
// the text of delayq/detail/job_queue/repeat.hpp ("e<period ms>", or "c" and the cron masks), slot
// the run's place in the series, the due time its put or the run before it gave it (a reschedule
// moves the run, not its slot: an every series stays in phase with its first run). The put script
// works out the first run (every: a period after now; cron: the first matching minute after now).
// The step that ends a run queues the next in the same script: an ack, and each move to the dead
// letters (bury, the nack of the last attempt, a take finding the last lease ended). Each of them
// first proves the run's lease (its token, or its last lease ended) and the next run has none, so
// of the objects that race on one run, one step ends it: one next run, never two or none. The
// next run keeps the id and the payload, with attempts 0 and no last error ("m" removed), due at
// next_run(schedule, slot, now), which is its slot too; the dead letter that the step made stays
// beside it. next_run is the Lua twin of the C++ one, which defines it (the tests compare them):
// every, the first slot + k * period after now (one catch-up run after an outage, not a backlog);
// cron, the first whole minute after now that matches, a walk of at most 366 * 8 days. A schedule
// it cannot read (a later version's) ends the series, as the ack of a plain job ends it; so does a
// cancel, which removes "r" with the rest. A nack before the last attempt, a release or an extend
// leave the run as it is. The next run publishes as a nack does (requeue(): when it makes the
// shard's next event earlier). The schedule costs no key, and no command where there is no
// series: the settlements read "m" and "r" with one HMGET where they read "m" before, and every
// HDEL of a job names "r" too. No command that the scripts did not run already (the ACL holds).
// A dead run put back by requeue dead is a plain job (refused while its series holds the id).
// Upgrading: a client of an earlier version acks, buries or cancels a run as a plain job, which
// ends the series and leaves its "r" behind, for the next put of the id to inherit: start series
// once every client is of this version.
//
// Wake-ups. Consumers wait on the pub/sub channel. A script that may make the shard's next event
// (the head of `events`: the earliest due time or lease end) earlier publishes "<shard> <ms until
// then>": put, reschedule and requeue dead when the job comes before the head, consume when a
// nack, a release or an extend (to a shorter lease) makes the head earlier than it was. Nothing
// else can make it earlier (acks, cancels and burials remove events, purges touch none; a take
// leases a job that was due, so its lease ends after the event it replaces; a lease that ends is
// due at that same moment; the limits hold due jobs back, and publish of their own, see
// "Limits"). So a consumer that knows a time before which nothing is due (from its last script)
// and hears every message since never sleeps past a due job. While the shard is paused nobody
// takes, so a script publishes nothing (publish() looks at the key first: one EXISTS, only where it
// would publish); the resume publishes instead.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "../../detail/epoch_ms.hpp"
#include "../../job.hpp"

namespace delayq::redis::detail {

enum key_id : std::size_t {
    k_events,
    k_data,
    k_seq,
    k_dead,
    k_dead_order,
    k_dead_info,
    k_paused,
    k_leases,
    k_grants,
    k_count
};
inline constexpr std::array<const char*, k_count> key_names{
    "events", "data", "seq", "dead", "dead:order", "dead:info", "paused", "leases", "grants"};

// The layout version, in every key's name; and the older layouts' keys that say a queue was
// written in one of them (script_client.hpp refuses such a queue).
inline constexpr std::string_view layout = "v3";
inline constexpr std::array<std::string_view, 1> older_layouts{"v2"};
inline constexpr std::array<const char*, 4> older_keys{"due", "leased", "seq", "dead"};

enum script_id : std::size_t {
    s_put,
    s_consume,
    s_cancel,
    s_reschedule,
    s_size,
    s_get,
    s_dead_page,
    s_requeue_dead,
    s_purge_dead,
    s_pause,
    s_stats,
    s_jobs_page,
    s_count
};

// "No deadline": the latest due time or lease end, in ms since the epoch, shared with the SQLite
// queue (delayq/detail/epoch_ms.hpp). Due times travel as milliseconds through Lua numbers
// (doubles): below 10^14 ms (year 5138) they are exact in a double and in every format the scripts
// use. The one spelling of it, for C++ and Lua both.
using delayq::detail::max_ms;

// A script's text, made at compile time: N characters and a NUL.
template <std::size_t N>
struct lua_text {
    std::array<char, N + 1> chars{};

    constexpr std::string_view view() const noexcept { return {chars.data(), N}; }
};

template <std::size_t N>
consteval lua_text<N - 1> lua(const char (&s)[N]) {
    lua_text<N - 1> t;
    for (std::size_t i = 0; i < N; ++i) t.chars[i] = s[i];
    return t;
}

template <std::size_t A, std::size_t B>
consteval lua_text<A + B> operator+(const lua_text<A>& a, const lua_text<B>& b) {
    lua_text<A + B> t;
    for (std::size_t i = 0; i < A; ++i) t.chars[i] = a.chars[i];
    for (std::size_t i = 0; i <= B; ++i) t.chars[A + i] = b.chars[i];
    return t;
}

consteval std::size_t digits_of(long long n) {
    std::size_t d = 1;
    for (; n >= 10; n /= 10) ++d;
    return d;
}

// N in decimal, as a Lua number literal.
template <long long N>
consteval lua_text<digits_of(N)> decimal() {
    static_assert(N >= 0);
    lua_text<digits_of(N)> t;
    long long n = N;
    for (std::size_t i = digits_of(N); i-- > 0; n /= 10)
        t.chars[i] = static_cast<char>('0' + n % 10);
    return t;
}

// `s` (N bytes) as a Lua string literal, between single quotes. A quote, a backslash or a line
// break in it would need escapes, which a constant of ours never has: compiling one fails.
template <std::size_t N>
consteval lua_text<N + 2> quoted(std::string_view s) {
    lua_text<N + 2> t;
    t.chars[0] = t.chars[N + 1] = '\'';
    for (std::size_t i = 0; i < N; ++i) {
        if (s[i] == '\'' || s[i] == '\\' || s[i] == '\n' || s[i] == '\r')
            throw "quoted(): the text needs an escape";
        t.chars[i + 1] = s[i];
    }
    return t;
}

// The scripts' common opening; see "Time" and "Wake-ups" above. Its first line is max_ms, in
// the constant's own digits. Each redis.call costs about as much as the rest of a small script,
// so the scripts make as few as they can (one put: TIME, ZRANGE, HSETNX, ZADD; a take of one
// job: TIME, EXISTS, ZRANGE, HMGET, INCRBY, HSET, ZADD to `events` and to `leases`).
inline constexpr auto prelude = lua("local max_ms = ") + decimal<max_ms>() + lua(R"lua(
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local later = sec * 1000 + math.ceil(usec / 1000)
local events, data, seq, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead_order, dead_info, paused = KEYS[5], KEYS[6], KEYS[7]
local leases, grants = KEYS[8], KEYS[9]
local function due_at(ms) return math.min(later + ms, max_ms) end
local function bucket(id)
  local h = #id
  for i = 1, #id, 4 do
    local a, b, c, d = string.byte(id, i, i + 3)
    h = ((((h * 256 + a) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)) % 1048573
  end
  return data .. ':' .. (h % 1024)
end
local function head()
  local h = redis.call('ZRANGE', events, '0', '0', 'WITHSCORES')
  return h[2] and tonumber(h[2])
end
-- Whether the shard is paused, looked up once per script, by the first step that asks.
local held = nil
local function on_hold()
  if held == nil then held = redis.call('EXISTS', paused) == 1 end
  return held
end
local function publish(at)
  if on_hold() then return end
  local ms = string.format('%d', math.max(at - now, 0))
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' ' .. ms)
end
)lua");

// next_run(schedule, slot, now): the due time (ms) of the run of a series after the one whose slot
// is `slot`, ended at `now`; nil for a schedule this version cannot read (see "Repeatable jobs").
// The twin of delayq::detail::job_queue::next_run, which defines it, read line by line beside
// detail/cron.hpp: the tests run this text with times of their own and compare. It reads no key
// and no clock, so a test can run it alone. Masks are tested by arithmetic (floor(mask / 2^k) % 2),
// exact in a double: no library beyond Lua's own.
inline constexpr auto repeat_lua = lua(R"lua(
local function next_run(text, slot, now)
  local kind = string.sub(text, 1, 1)
  if kind == 'e' then
    local period = tonumber(string.match(text, '^e(%d+)$') or '')
    if not period or period <= 0 then return nil end
    -- (acked before its time: the next in phase)
    if slot > now then return slot + period end
    return slot + (math.floor((now - slot) / period) + 1) * period
  end
  if kind ~= 'c' then return nil end
  local v = {string.match(text, '^c(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')}
  if #v ~= 7 then return nil end
  for k = 1, 7 do v[k] = tonumber(v[k]) end
  local function set(mask, from, to, shift)
    local t = {}
    for k = from, to do t[k] = math.floor(mask / 2 ^ (k - shift)) % 2 == 1 end
    return t
  end
  local minute_ok, minute_hi = set(v[1], 0, 29, 0), set(v[2], 30, 59, 30)
  for k = 30, 59 do minute_ok[k] = minute_hi[k] end
  local hour_ok, dom_ok = set(v[3], 0, 23, 0), set(v[4], 1, 31, 0)
  local month_ok, dow_ok = set(v[5], 1, 12, 0), set(v[6], 0, 6, 0)
  local dom_any, dow_any = v[7] % 2 == 1, math.floor(v[7] / 2) % 2 == 1
  -- A day (days since 1970-01-01) matches: its month, and its day of the month and weekday as
  -- cron.hpp's day_matches. Month and day from civil_from_days (H. Hinnant's algorithm); the
  -- weekday from 1970-01-01, a Thursday (Sunday 0).
  local function day_matches(day)
    local z = day + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
                            - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local d = doy - math.floor((153 * mp + 2) / 5) + 1
    if not month_ok[mp < 10 and mp + 3 or mp - 9] then return false end
    local dom, dow = dom_ok[d], dow_ok[(day + 4) % 7]
    if dom_any or dow_any then return dom and dow end
    return dom or dow
  end
  -- From the minute after now's minute, day by day, as cron.hpp's next_after.
  local from = (math.floor(now / 60000) + 1) * 60000
  local day = math.floor(from / 86400000)
  local hour = math.floor((from - day * 86400000) / 3600000)
  local minute = math.floor((from - day * 86400000) / 60000) % 60
  for n = 1, 366 * 8 do
    if day_matches(day) then
      for h = hour, 23 do
        if hour_ok[h] then
          for m = (h == hour) and minute or 0, 59 do
            if minute_ok[m] then return day * 86400000 + h * 3600000 + m * 60000 end
          end
        end
      end
    end
    day, hour, minute = day + 1, 0, 0
  end
  return nil
end
)lua");

// ARGV channel shard (id payload mode ms)*; mode 'a': ms is a due time, 'r': a delay, 's': ms is
// the schedule of a series instead, whose first run it queues (see "Repeatable jobs"; a schedule
// this version cannot read, which the C++ side never sends, fails the call before it writes).
// Returns one 1 (queued) or 0 (already queued: nothing changes) per job. Publishes when a job
// comes before the shard's earliest event: exactly when, after the ZADDs, the head is a job put
// here (ties with the old head publish too, harmlessly). The head is read without its score: a
// score in a reply costs the server more than the rest of that ZRANGE (docs/redis.md, "Cost per
// job"), and so does a Lua number passed as an argument, hence the scores as strings.
inline constexpr auto put_lua = prelude + repeat_lua + lua(R"lua(
local earliest, added, out, first = nil, {}, {}, {}
-- The first runs, as the run before a series' first: an every series' a period after `later`
-- (never early, as due_at), a cron series' the first matching minute after now.
for i = 3, #ARGV, 4 do
  if ARGV[i + 2] == 's' then
    local at = next_run(ARGV[i + 3], later, now)
    if not at then return redis.error_reply('unreadable schedule ' .. ARGV[i + 3]) end
    first[i] = math.min(at, max_ms)
  end
end
for i = 3, #ARGV, 4 do
  local id = ARGV[i]
  local b = bucket(id)
  if redis.call('HSETNX', b, 'p' .. id, ARGV[i + 1]) == 0 then
    out[#out + 1] = 0
  else
    local score = ARGV[i + 3]
    local at = first[i]
    if at then
      score = string.format('%d', at)
      redis.call('HSET', b, 'r' .. id, score .. ' ' .. ARGV[i + 3])
    else
      at = tonumber(score)
      if ARGV[i + 2] == 'r' then at = due_at(at) score = string.format('%d', at) end
    end
    redis.call('ZADD', events, score, id)
    added[id] = true
    if not earliest or at < earliest then earliest = at end
    out[#out + 1] = 1
  end
end
if earliest and added[redis.call('ZRANGE', events, '0', '0')[1]] then publish(earliest) end
return out
)lua");

// What the scripts that read a job's last error share (see "The last error" and "Dead letters"):
// tail_of(m), the part of an "m" or dead:info entry from its "/" on ('' if none), so the last
// error with "/" before it; place_of(id, info), a dead letter's member of dead:order, made from
// its dead:info entry.
inline constexpr auto last_error_lua = lua(R"lua(
local function tail_of(m)
  local at = m and string.find(m, '/', 1, true)
  return at and string.sub(m, at) or ''
end
local function place_of(id, info)
  return string.match(info, '^%d+:(%d+)') .. ':' .. id
end
)lua");

// The last error of a job whose last lease ended (delayq::lease_ended_reason), in the constant's
// own words.
inline constexpr auto lease_ended_lua =
    lua("local lease_ended = ") + quoted<lease_ended_reason.size()>(lease_ended_reason) + lua("\n");

// The most dead letters that one sweep removes (purge dead's batch): one script call that
// removes them stays short (a few ms), and the unpacked lists stay far below Lua's stack limit.
inline constexpr std::size_t max_sweep = 1000;

// sweep(cutoff, limit), after the prelude and last_error_lua: removes up to `limit` (at most
// max_sweep) of the dead letters that died before `cutoff` (ms), oldest first. Returns how many
// dead letters it removed and how many places of dead:order it went through: fewer places than
// `limit` means none older is left. A place that is not its dead letter's (removed by hand) goes
// without touching `dead`; five commands in all, whatever `limit`.
inline constexpr auto sweep_lua = lua(R"lua(
local function sweep(cutoff, limit)
  if cutoff <= 0 or limit <= 0 then return 0, 0 end
  local got = redis.call('ZRANGEBYLEX', dead_order, '-', '(' .. string.format('%014d', cutoff),
                         'LIMIT', '0', string.format('%d', limit))
  if #got == 0 then return 0, 0 end
  local ids, gone = {}, {}
  for k, member in ipairs(got) do
    ids[k] = string.sub(member, string.find(member, ':', 1, true) + 1)
  end
  local infos = redis.call('HMGET', dead_info, unpack(ids))
  for k, id in ipairs(ids) do
    if infos[k] and place_of(id, infos[k]) == got[k] then gone[#gone + 1] = id end
  end
  local removed = 0
  if #gone > 0 then
    removed = redis.call('HDEL', dead, unpack(gone))
    redis.call('HDEL', dead_info, unpack(gone))
  end
  redis.call('ZREMRANGEBYLEX', dead_order, '-', '[' .. got[#got])
  return removed, #got
end
)lua");

// ARGV channel shard lease_ms max_attempts reclaim_batch take_count keep_dead max_leased rate
// period (how id token)*
// Settles the listed leases (how: 'a' ack, 'n<ms>' nack due ms from now, 'd' bury: to the dead
// letters now, 'e<ms>' extend: the lease ends ms from now instead, 'r<ms>' release: due again at
// ms, the due time the job was leased at, its attempt taken back; for the jobs a merged take
// leased for a caller that had given up, script_client.hpp), then leases up to take_count
// due jobs, earliest first, each counting its attempt. A nack's or a burial's how may go on
// with "/" and a reason, which becomes the job's last error; without one the last error stays.
// A due job whose lease ended after its last attempt (max_attempts) goes to the dead letters
// instead, its last error lease_ended, at most reclaim_batch of them per call. meta holds
// "attempts:token:lease_end", so one HGET proves a lease; a settled lease's token is cleared
// (0), so it cannot settle again. With keep_dead > 0 (ms), the call ends by sweeping up to 10
// dead letters that died more than keep_dead ago per death it made (at most max_sweep): so a
// stream of deaths keeps the dead letters bounded, at one ZRANGEBYLEX per call that buries when
// nothing is that old. max_leased, rate and period (ms) are the shard's share of the object's
// limits, 0 for none (see "Limits"): the takes lease at most the room they leave.
// While the shard is paused (see "Pausing") it settles as ever and leases nothing, and looks at
// no due job (none is buried for its ended lease either: that waits for a take after the resume).
// Returns {next, ok*, n, (id, payload, due, attempts, token, lease_end)*n}: next is the ms until
// the next event after all that (0: more is due now; -1: nothing is queued, or the shard is
// paused, so that no take looks again before a message; held back by a limit: until a place
// frees, > 0); one ok (1 settled or extended, 0 the lease was lost) per settlement.
inline constexpr auto consume_lua = prelude + last_error_lua + lease_ended_lua + sweep_lua +
                                    repeat_lua + lua("local max_sweep = ") + decimal<max_sweep>() +
                                    lua(R"lua(
local lease_ms, max_attempts, keep_dead = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[7])
local max_leased, rate, period = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local limited = max_leased > 0 or rate > 0
local now_s = string.format('%d', now)
-- freed: a settlement ended a lease; shortened: an extend moved a lease end earlier.
local out, before, deaths, freed, shortened = {0}, false, 0, false, false
-- Back to waiting, due at `at`. The next event may get earlier: remember it as it was.
local function requeue(id, at)
  if before == false then before = head() end
  redis.call('ZADD', events, string.format('%d', at), id)
end
-- A run of a series (its "r" entry `r`, false if none) ends: true if its next run is queued, its
-- payload kept, attempts 0, no last error; false if it has no schedule, or one this version
-- cannot read, and the job is to go (see "Repeatable jobs"). Its lease is the caller's to end.
local function again(id, b, r)
  if not r then return false end
  local slot, schedule = string.match(r, '^(%d+) (.+)$')
  local at = slot and next_run(schedule, tonumber(slot), now)
  if not at then return false end
  at = math.min(at, max_ms)
  redis.call('HDEL', b, 'm' .. id)
  redis.call('HSET', b, 'r' .. id, string.format('%d ', at) .. schedule)
  requeue(id, at)
  return true
end
-- To the dead letters, after `a` attempts, its last error `tail` ("/" and the reason, or '');
-- a run of a series (`r`, as again's) leaves its next run behind. The place of an earlier dead
-- letter of the same id goes: one place per dead letter.
local function bury(id, b, payload, a, tail, r)
  deaths = deaths + 1
  redis.call('ZREM', leases, id)
  redis.call('HSET', dead, id, payload or '')
  if not again(id, b, r) then
    redis.call('ZREM', events, id)
    redis.call('HDEL', b, 'p' .. id, 'm' .. id, 'r' .. id)
  end
  local old = redis.call('HGET', dead_info, id)
  if old then redis.call('ZREM', dead_order, place_of(id, old)) end
  local info = string.format('%d:%014d', a, now) .. (tail == '' and '/' or tail)
  redis.call('HSET', dead_info, id, info)
  redis.call('ZADD', dead_order, '0', place_of(id, info))
end
for i = 11, #ARGV, 3 do
  local id, ok = ARGV[i + 1], 0
  local b = bucket(id)
  local mr = redis.call('HMGET', b, 'm' .. id, 'r' .. id)
  local m, r = mr[1], mr[2]
  local a, token, lease_end
  -- (An earlier version's kept entry has a fourth field; its third, the hold end, is its lease end.)
  if m then a, token, lease_end = string.match(m, '^(%d+):(%d+):(%d+)') end
  if token == ARGV[i + 2] and tonumber(lease_end) > now then
    ok = 1
    a = tonumber(a)
    local how = string.sub(ARGV[i], 1, 1)
    -- The last error from now on: the reason after the "/" of this how, or the one it had.
    local cut = string.find(ARGV[i], '/', 2, true)
    local tail = cut and string.sub(ARGV[i], cut) or tail_of(m)
    if tail == '/' then tail = '' end
    local ms = tonumber(string.sub(ARGV[i], 2, (cut or 0) - 1))
    if how == 'e' then
      -- Extended (or shortened): the same lease, its end moved; a shorter one may make the
      -- next event earlier, hence requeue's look at the head first.
      local ends = due_at(ms)
      redis.call('HSET', b, 'm' .. id, string.format('%d:%s:%d', a, token, ends) .. tail)
      requeue(id, ends)
      redis.call('ZADD', leases, string.format('%d', ends), id)
      if ends < tonumber(lease_end) then shortened = true end
    else
      -- The lease ends (bury() removes it from `leases` itself).
      freed = true
      if how == 'a' then
        redis.call('ZREM', leases, id)
        if not again(id, b, r) then
          redis.call('ZREM', events, id)
          redis.call('HDEL', b, 'p' .. id, 'm' .. id, 'r' .. id)
        end
      elseif how == 'd' then
        bury(id, b, redis.call('HGET', b, 'p' .. id), a, tail, r)
      elseif how == 'r' then
        -- Leased for a take that gave up: as before that take, its attempt not counted, nor
        -- its grant.
        if a > 1 or tail ~= '' then
          redis.call('HSET', b, 'm' .. id, string.format('%d:0:0', a - 1) .. tail)
        else
          redis.call('HDEL', b, 'm' .. id)
        end
        redis.call('ZREM', leases, id)
        if rate > 0 then redis.call('ZREM', grants, token) end
        requeue(id, math.min(ms, max_ms))
      elseif max_attempts > 0 and a >= max_attempts then
        bury(id, b, redis.call('HGET', b, 'p' .. id), a, tail, r)
      else
        redis.call('HSET', b, 'm' .. id, string.format('%d:0:0', a) .. tail)
        redis.call('ZREM', leases, id)
        requeue(id, due_at(ms))
      end
    end
  end
  out[#out + 1] = ok
end
-- The due jobs to lease, and one more event: the earliest that stays tells when the next is due.
-- The jobs leased here stay at the head (their scores change at the end), so a look after a
-- burial starts after them.
local want, budget = tonumber(ARGV[6]), tonumber(ARGV[5])
local n, rows, next_due = 0, {}, nil
local hold = on_hold()
-- The room the limits leave (nil: no limit, or paused): leases held now, grants in the window.
local room, active, granted = nil, 0, 0
if limited and not hold then
  room = max_ms
  if max_leased > 0 then
    active = redis.call('ZCOUNT', leases, '(' .. now_s, '+inf')
    room = max_leased - active
  end
  if rate > 0 then
    redis.call('ZREMRANGEBYSCORE', grants, '-inf', string.format('%d', now - period))
    granted = redis.call('ZCARD', grants)
    room = math.min(room, rate - granted)
  end
  room = math.max(room, 0)
  want = math.min(want, room)
end
local want_s = string.format('%d', want)
-- Paused: nothing to lease, and the due jobs are not looked at (see "Pausing").
if not hold then
  repeat
    local heads = redis.call('ZRANGE', events, n == 0 and '0' or string.format('%d', n), want_s, 'WITHSCORES')
    local buried, k = false, 0
    while heads[2 * k + 2] do
      local at = tonumber(heads[2 * k + 2])
      if at > now or n == want then next_due = at break end
      local id = heads[2 * k + 1]
      k = k + 1
      local b = bucket(id)
      local pm = redis.call('HMGET', b, 'p' .. id, 'm' .. id, 'r' .. id)
      local a, token = 0, '0'
      if pm[2] then a, token = string.match(pm[2], '^(%d+):(%d+):') a = tonumber(a) end
      -- A job whose lease ended is due again; after its last attempt, it is dead instead.
      if token ~= '0' and max_attempts > 0 and a >= max_attempts then
        if budget == 0 then next_due = now break end
        budget = budget - 1
        bury(id, b, pm[1], a, '/' .. lease_ended, pm[3])
        buried = true
      else
        n = n + 1
        rows[n] = {id, b, pm[1] or '', at, a + 1, tail_of(pm[2])}
      end
    end
  until next_due or not buried
end
out[#out + 1] = n
local lease_end = math.min(now + lease_ms, max_ms)
if n > 0 then
  local token = redis.call('INCRBY', seq, string.format('%d', n)) - n
  local ends, given, lease_s = {}, {}, string.format('%d', lease_end)
  for k = 1, n do
    local r = rows[k]
    token = token + 1
    redis.call('HSET', r[2], 'm' .. r[1], string.format('%d:%d:%d', r[5], token, lease_end) .. r[6])
    ends[2 * k - 1], ends[2 * k] = lease_s, r[1]
    given[2 * k - 1], given[2 * k] = now_s, string.format('%d', token)
    out[#out + 1] = r[1]
    out[#out + 1] = r[3]
    out[#out + 1] = r[4]
    out[#out + 1] = r[5]
    out[#out + 1] = token
    out[#out + 1] = lease_end
  end
  redis.call('ZADD', events, unpack(ends))
  redis.call('ZADD', leases, unpack(ends))
  if rate > 0 then redis.call('ZADD', grants, unpack(given)) end
end
local after = next_due
if n > 0 and (not after or lease_end < after) then after = lease_end end
local told = before ~= false and after and (not before or after < before)
if told then publish(after) end
-- Held back: a due job waits and the limits leave no room. Its next event is when a place
-- frees: the lease end (the grant time + period) after which fewer than max_leased leases
-- (rate grants) are left, the later of the two when both are full.
local due_waits = next_due and next_due <= now
if room and due_waits and room - n <= 0 then
  local free = nil
  if max_leased > 0 and active + n >= max_leased then
    local rank = redis.call('ZCOUNT', leases, '-inf', now_s) + active + n - max_leased
    local e = redis.call('ZRANGE', leases, string.format('%d', rank), string.format('%d', rank), 'WITHSCORES')
    free = tonumber(e[2]) or lease_end
  end
  if rate > 0 and granted + n >= rate then
    local rank = string.format('%d', granted + n - rate)
    local g = redis.call('ZRANGE', grants, rank, rank, 'WITHSCORES')
    local t = (tonumber(g[2]) or now) + period
    if not free or t > free then free = t end
  end
  after = math.max(free, now + 1)
end
-- Room freed while due jobs wait (a place, or the time one frees, moved earlier): the takes that
-- a limit holds back, in every process, look again.
if room and not told and due_waits and (freed or shortened) then publish(after) end
out[1] = (after and not hold) and math.max(after - now, 0) or -1
if deaths > 0 and keep_dead > 0 then sweep(now - keep_dead, math.min(10 * deaths, max_sweep)) end
return out
)lua");

// ARGV channel shard id limited. Returns 1 if the job was queued (waiting or leased) and is gone
// now; 2 if so, and it was leased, limited is '1' (the object has limits) and a due job waits:
// then a place under max_leased freed, and the script published "now" so that the takes that a
// limit holds back look again (see "Limits"; the caller tells its own takes).
inline constexpr auto cancel_lua = prelude + lua(R"lua(
local id = ARGV[3]
if redis.call('HDEL', bucket(id), 'p' .. id, 'm' .. id, 'r' .. id) == 0 then return 0 end
redis.call('ZREM', events, id)
if ARGV[4] ~= '1' then
  redis.call('ZREM', leases, id)
  return 1
end
local ends = tonumber(redis.call('ZSCORE', leases, id) or '0')
redis.call('ZREM', leases, id)
local at = head()
if ends <= now or not at or at > now then return 1 end
publish(now)
return 2
)lua");

// ARGV channel shard id delay_ms. Returns 1 if the job was waiting and is due delay_ms from now.
// A leased job (a token in its "m") is not waiting, even once its lease ended.
inline constexpr auto reschedule_lua = prelude + lua(R"lua(
local id = ARGV[3]
if not redis.call('ZSCORE', events, id) then return 0 end
local m = redis.call('HGET', bucket(id), 'm' .. id)
if m and not string.match(m, '^%d+:0:') then return 0 end
local first, at = head(), due_at(tonumber(ARGV[4]))
redis.call('ZADD', events, at, id)
if at < first then publish(at) end
return 1
)lua");

// ARGV channel shard id. Returns {state, time, attempts, payload, last error}: state 1 waiting
// (time: its due time, or the end of a lease that ended), 2 leased (time: the lease end), 3 dead
// (time: when it died); {0} if the id is neither queued nor dead. A queued job comes first: a
// dead letter's id may have been put again. A dead letter of an earlier version (in `dead`
// alone) reads as dead since 0 after 0 attempts, with no last error.
inline constexpr auto get_lua = prelude + last_error_lua + lua(R"lua(
local id = ARGV[3]
local pm = redis.call('HMGET', bucket(id), 'p' .. id, 'm' .. id)
if pm[1] then
  local at = tonumber(redis.call('ZSCORE', events, id) or '0')
  local a, token, lease_end = 0, '0', 0
  if pm[2] then a, token, lease_end = string.match(pm[2], '^(%d+):(%d+):(%d+)') end
  local state = (token ~= '0' and tonumber(lease_end) > now) and 2 or 1
  return {state, at, tonumber(a) or 0, pm[1], string.sub(tail_of(pm[2]), 2)}
end
local payload = redis.call('HGET', dead, id)
if not payload then return {0} end
local info = redis.call('HGET', dead_info, id)
if not info then return {3, 0, 0, payload, ''} end
local a, died = string.match(info, '^(%d+):(%d+)')
return {3, tonumber(died) or 0, tonumber(a) or 0, payload, string.sub(tail_of(info), 2)}
)lua");

// ARGV channel shard max from. The dead letters in dead:order after `from` ('' from the first;
// 'i' and an id: after that dead letter; 'p' and a place "died:id": after that place, which need
// not be one of this shard's), up to max. Returns {place, (id, died, attempts, payload, last
// error)*}: place is where the page starts after ('' from the first); an 'i' id that is not a
// dead letter with a place (not dead, or dead by an earlier version) returns {''} alone. No
// clock is read: this script has an opening of its own.
inline constexpr auto dead_page_lua = last_error_lua + lua(R"lua(
local dead, dead_order, dead_info = KEYS[4], KEYS[5], KEYS[6]
local want, from = tonumber(ARGV[3]), ARGV[4]
local place = string.sub(from, 2)
if string.sub(from, 1, 1) == 'i' then
  local info = redis.call('HGET', dead_info, place)
  if not info or redis.call('HEXISTS', dead, place) == 0 then return {''} end
  place = place_of(place, info)
end
local out, n, start = {place}, 0, place == '' and '-' or '(' .. place
while n < want do
  local ask = want - n
  local got = redis.call('ZRANGEBYLEX', dead_order, start, '+', 'LIMIT', '0',
                         string.format('%d', ask))
  for _, member in ipairs(got) do
    local cut = string.find(member, ':', 1, true)
    local id = string.sub(member, cut + 1)
    local info = redis.call('HGET', dead_info, id)
    local payload = redis.call('HGET', dead, id)
    if payload and info and place_of(id, info) == member then
      local a, died = string.match(info, '^(%d+):(%d+)')
      n = n + 1
      out[#out + 1] = id
      out[#out + 1] = tonumber(died)
      out[#out + 1] = tonumber(a)
      out[#out + 1] = payload
      out[#out + 1] = string.sub(tail_of(info), 2)
    else
      -- A place whose dead letter is gone from `dead` (removed by hand): dropped for good.
      redis.call('ZREM', dead_order, member)
      if info and not payload then redis.call('HDEL', dead_info, id) end
    end
  end
  if #got < ask then break end
  start = '(' .. got[#got]
end
return out
)lua");

// ARGV channel shard what max from. The waiting jobs (what 'w': neither leased nor dead, a lease
// that ended included, in `events` by due time) or the leased ones (what 'l': their lease holds,
// in `leases` by its end), then by id, as a sorted set orders its members, after `from` ('' from
// the first; 'i' and an id: after that job; 'p' and a place "time:id": after that place, which
// need not be one of this shard's), up to max. Returns {place, (id, time, attempts, payload, last
// error)*}: place is where the page starts after ('' from the first); an 'i' id that is not in
// that state returns {''} alone. The place is found in O(log^2 n): the range of the sorted set
// whose score is the place's time, halved by member until the first one after its id. Each member
// then costs its bucket's HMGET, which says whether it is in the state asked: the waiting page
// steps over the leases that hold (at most as many as the consumers hold), the leased page over
// entries that a client of an earlier version left in `leases` ("Leases").
inline constexpr auto jobs_page_lua = prelude + last_error_lua + lua(R"lua(
local leased_page = ARGV[3] == 'l'
local want, from = tonumber(ARGV[4]), ARGV[5]
local set = leased_page and leases or events
-- Whether member a comes after b in a sorted set's order of equal scores: bytewise (Lua's own
-- comparison follows the locale).
local function after(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
-- The job `id` of this shard if it is in the state asked: {attempts, payload, last error}.
local function look(id)
  local pm = redis.call('HMGET', bucket(id), 'p' .. id, 'm' .. id)
  if not pm[1] then return nil end
  local a, token, lease_end = 0, '0', 0
  if pm[2] then a, token, lease_end = string.match(pm[2], '^(%d+):(%d+):(%d+)') end
  if (token ~= '0' and tonumber(lease_end) > now) ~= leased_page then return nil end
  return {tonumber(a) or 0, pm[1], string.sub(tail_of(pm[2]), 2)}
end
local place = string.sub(from, 2)
if string.sub(from, 1, 1) == 'i' then
  local score = look(place) and redis.call('ZSCORE', set, place)
  if not score then return {''} end
  place = string.format('%d', tonumber(score)) .. ':' .. place
end
local now_s = string.format('%d', now)
local rank = leased_page and redis.call('ZCOUNT', set, '-inf', now_s) or 0
if place ~= '' then
  local cut = string.find(place, ':', 1, true)
  local time, id = string.sub(place, 1, cut - 1), string.sub(place, cut + 1)
  local lo = redis.call('ZCOUNT', set, '-inf', '(' .. time)
  local hi = redis.call('ZCOUNT', set, '-inf', time)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', set, string.format('%d', mid), string.format('%d', mid))[1]
    if after(m, id) then hi = mid else lo = mid + 1 end
  end
  rank = math.max(rank, lo)
end
local out, n = {place}, 0
while n < want do
  local ask = want - n
  local got = redis.call('ZRANGE', set, string.format('%d', rank),
                         string.format('%d', rank + ask - 1), 'WITHSCORES')
  for i = 1, #got, 2 do
    local j = look(got[i])
    if j then
      n = n + 1
      out[#out + 1] = got[i]
      out[#out + 1] = tonumber(got[i + 1])
      out[#out + 1] = j[1]
      out[#out + 1] = j[2]
      out[#out + 1] = j[3]
    end
  end
  if #got < 2 * ask then break end
  rank = rank + ask
end
return out
)lua");

// ARGV channel shard id delay_ms. Returns 1 if `id` was a dead letter and is now a waiting job,
// due delay_ms from now: its payload, its last error (in "m", attempts 0), gone from the three
// dead-letter keys. 0, changing nothing, if it is not dead, or if it is queued too (put again
// after it died: the queued job keeps the id). A dead letter of an earlier version (in `dead`
// alone) comes back without a last error. Publishes as put does, when it comes first.
inline constexpr auto requeue_dead_lua = prelude + last_error_lua + lua(R"lua(
local id = ARGV[3]
local b = bucket(id)
if redis.call('HEXISTS', b, 'p' .. id) == 1 then return 0 end
local payload = redis.call('HGET', dead, id)
if not payload then return 0 end
local info = redis.call('HGET', dead_info, id)
redis.call('HDEL', dead, id)
-- (Buried by this version, it has no lease; by hand or by an older one, it may: it has none now.)
redis.call('ZREM', leases, id)
if info then
  redis.call('HDEL', dead_info, id)
  redis.call('ZREM', dead_order, place_of(id, info))
end
local tail = tail_of(info)
if tail == '' or tail == '/' then
  redis.call('HSET', b, 'p' .. id, payload)
else
  redis.call('HSET', b, 'p' .. id, payload, 'm' .. id, '0:0:0' .. tail)
end
local at = due_at(tonumber(ARGV[4]))
redis.call('ZADD', events, string.format('%d', at), id)
if redis.call('ZRANGE', events, '0', '0')[1] == id then publish(at) end
return 1
)lua");

// ARGV channel shard older_than_ms [cutoff]. Removes up to max_sweep dead letters that died
// before cutoff (ms; if not given, older_than_ms before now), oldest first (sweep). Returns
// {removed, places, cutoff}: places below max_sweep means none older is left. The client calls
// again with that cutoff until then, so that no one call holds the server long, and a purge ends
// however fast jobs die meanwhile.
inline constexpr auto purge_dead_lua = prelude + last_error_lua + sweep_lua +
                                       lua("local max_sweep = ") + decimal<max_sweep>() + lua(R"lua(
local cutoff = tonumber(ARGV[4] or '') or now - tonumber(ARGV[3])
local removed, places = sweep(cutoff, max_sweep)
return {removed, places, string.format('%d', cutoff)}
)lua");

// ARGV channel shard how. how 'p': pauses the shard (its takes lease nothing until a resume;
// already paused: nothing changes, the first pause's time stays); 'r': resumes it, and if that
// ended a pause and a job is queued, publishes the shard's next event (whatever publish() says
// of a due time, the takes that wait look then: the jobs that fell due while it was paused, at
// once); '': changes nothing. Returns 1 if the shard is paused now, else 0.
inline constexpr auto pause_lua = prelude + lua(R"lua(
local how = ARGV[3]
if how == 'p' then
  redis.call('HSETNX', paused, 'since', string.format('%d', now))
  return 1
end
if how == 'r' then
  if redis.call('HDEL', paused, 'since') == 1 then
    held = false
    local at = head()
    if at then publish(at) end
  end
  return 0
end
return on_hold() and 1 or 0
)lua");

// ARGV channel shard. Returns the number of queued jobs, waiting plus leased.
inline constexpr auto size_lua = lua(R"lua(
return redis.call('ZCARD', KEYS[1])
)lua");

// ARGV channel shard. Returns {waiting, due_now, leased, dead, lag ms} of the shard (see
// "Stats"), six commands whatever it holds, changing nothing. A count of `leases` above what
// `events` can hold (entries that a client of an earlier version left behind, "Leases") is cut
// so that waiting >= due_now and waiting + leased = the queued jobs.
inline constexpr auto stats_lua = prelude + lua(R"lua(
local now_s = string.format('%d', now)
local queued = redis.call('ZCARD', events)
local due = redis.call('ZCOUNT', events, '-inf', now_s)
local leased = math.min(redis.call('ZCOUNT', leases, '(' .. now_s, '+inf'), queued - due)
local at = head()
local lag = (at and at <= now) and now - at or 0
return {queued - leased, due, leased, redis.call('HLEN', dead), lag}
)lua");

inline constexpr std::array<std::string_view, s_count> scripts{
    put_lua.view(),        consume_lua.view(), cancel_lua.view(),    reschedule_lua.view(),
    size_lua.view(),       get_lua.view(),     dead_page_lua.view(), requeue_dead_lua.view(),
    purge_dead_lua.view(), pause_lua.view(),   stats_lua.view(),     jobs_page_lua.view()};
inline constexpr std::array<const char*, s_count> script_names{
    "put",       "consume",      "cancel",     "reschedule", "size",  "get",
    "dead page", "requeue dead", "purge dead", "pause",      "stats", "jobs page"};

}  // namespace delayq::redis::detail
