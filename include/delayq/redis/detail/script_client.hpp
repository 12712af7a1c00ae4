// The script client: how a queue object runs the scripts of scripts.hpp on its shards and reads
// their replies. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. A queue object changes the server only through scripts. Each of its shards is one
// hash tag, `{name}` or `{name#i}`, so one Cluster slot with its own keys (scripts.hpp's key
// layout); a job's shard is a hash of its id. A call is EVALSHA with the shard's keys, the
// wake-up channel, the shard's number and the script's own arguments, sent through the router
// (cluster.hpp) to the node that serves the slot. The SHA1s come from SCRIPT LOAD, once per
// object (no SHA-1 code here); they never change while the program runs, since each script's text
// is fixed at compile time. A node that has not seen a script (restarted, SCRIPT FLUSH, a new
// master) answers NOSCRIPT without running anything, and EVAL with the source then runs it and
// teaches it to that node.
//
// Replies are flat arrays of integers and strings (each script in scripts.hpp says what it
// returns). Decoding checks their shape: anything else, or an error reply, is a
// delayq::redis::error naming the script. Due times and lease ends come back as server
// milliseconds since the epoch and become system_clock time points, rounded up (never early);
// the other way, a time point or a delay is clamped to [0, max_ms]. A batch (put_many, ack_many)
// is one call per shard and max_batch jobs, so that no single call stalls the server.
//
// Merging. The puts and the consumes (takes, acks, nacks) that threads of the process hand in for
// a shard while one of that kind is on its way go together as one script call
// (delayq/detail/job_queue/combiner.hpp): the client splits the reply, each call gets its own
// answers and its own jobs.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/epoch_ms.hpp"
#include "../../detail/job_queue/combiner.hpp"
#include "../types.hpp"
#include "cluster.hpp"
#include "connection.hpp"
#include "scripts.hpp"

namespace delayq::redis::detail {

using delayq::detail::job_queue::combined_call;
using delayq::detail::job_queue::combiner;

inline constexpr std::size_t max_batch = 500;  // jobs per script call: no call stalls the server

// A script argument: the letter c, then n in decimal. (Appended rather than "c" + to_string(n):
// g++ 12 at -O2 warns, wrongly, of -Wrestrict inside that operator+, in users' builds too.)
inline std::string tagged(char c, long long n) {
    std::string s(1, c);
    s += std::to_string(n);
    return s;
}

// Times as both job queues store them (delayq/detail/epoch_ms.hpp).
using delayq::detail::clamp_delay;
using delayq::detail::from_ms;
using delayq::detail::to_ms;

// FNV-1a, 64 bits: which shard an id belongs to. Part of the key layout: never change it.
constexpr std::uint64_t fnv1a(std::string_view s) noexcept {
    std::uint64_t h = 14695981039346656037ULL;
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    return h;
}

// The consume script's reply.
struct consumed {
    long long next = -1;  // ms until the shard's next event; 0: more is due; -1: empty
    std::vector<bool> ok;
    std::vector<job> jobs;
};

// A call handed to a shard's combiner (delayq/detail/job_queue/combiner.hpp): its arguments, and
// its failure if it fails.
struct script_call : combined_call {
    std::span<const std::string_view> args;  // the script's own, for this call's jobs
    std::exception_ptr failure;
};

// A consume call handed to a shard's combiner: its settlements and how many jobs it takes.
struct consume_call : script_call {
    std::size_t take = 0;  // args: (how id token)*
    consumed result;
};

// A put call handed to a shard's combiner.
struct put_call : script_call {
    std::vector<bool> result;  // args: (id payload mode ms)*
};

// The combiners of one shard: one for the puts, one for the consumes that may wait for a failing
// node and one for those that may not (router::call's `patient`: they are sent apart).
struct shard_combiners {
    combiner<consume_call> patient{max_batch}, impatient{max_batch};
    combiner<put_call> puts{max_batch};
};

// The shards of one queue object and the scripts it runs on them. Shards are numbered 0..N-1.
// Every member may be called from many threads at once.
class script_client {
  public:
    // `o` has been checked (queue_base::checked); `shards` is in 1..slot_count.
    script_client(options o, std::size_t shards, bool sharded)
        : opt_(std::move(o)),
          router_(endpoint{opt_.host, opt_.port, opt_.user, opt_.password}, opt_.io_timeout),
          shards_(shards) {
        const std::string v(layout);
        channel_ = "dq:" + v + ":{" + opt_.name + (sharded ? "#*" : "") + "}:wake";
        for (std::size_t i = 0; i < shards; ++i) {
            shard& s = shards_[i];
            s.index = std::to_string(i);
            s.tag = "{" + opt_.name + (sharded ? "#" + s.index : "") + "}";
            for (std::size_t k = 0; k < k_count; ++k)
                s.keys[k] = "dq:" + v + ":" + s.tag + ":" + key_names[k];
            s.slot = slot_of(s.keys[0]);
            s.max_leased = std::to_string(share(opt_.limits.max_leased, shards, i));
            s.rate = std::to_string(share(opt_.limits.rate, shards, i));
        }
        limited_ = opt_.limits.max_leased > 0 || opt_.limits.rate > 0;
        period_ = std::to_string(clamp_delay(opt_.limits.period));
        lease_ms_ = std::to_string(opt_.lease.count());
        max_attempts_ = std::to_string(opt_.max_attempts);
        reclaim_batch_ = std::to_string(opt_.reclaim_batch);
        keep_dead_ = std::to_string(clamp_delay(opt_.keep_dead));
        // Objects merge their calls when every word of those calls, and where and how they go,
        // is the same (keep_dead too: a merged consume sweeps by its sender's; and the limits:
        // it leases within its sender's).
        for (const std::string& part :
             {opt_.host, std::to_string(opt_.port), opt_.user, opt_.password, channel_, lease_ms_,
              max_attempts_, reclaim_batch_, keep_dead_, std::to_string(opt_.io_timeout.count()),
              std::to_string(opt_.limits.max_leased), std::to_string(opt_.limits.rate), period_})
            merge_key_.append(part).push_back('\0');
        const unsigned generation = fork_generation();
        for (shard& at : shards_) {
            at.merge = shared_combiners(at);
            at.merge_generation.store(generation, std::memory_order_relaxed);
        }
    }
    script_client(const script_client&) = delete;
    script_client& operator=(const script_client&) = delete;

    const options& get_options() const noexcept { return opt_; }
    std::size_t shards() const noexcept { return shards_.size(); }
    const std::string& channel() const noexcept { return channel_; }
    bool limited() const noexcept { return limited_; }

    // Shard `i`'s share of a limit `n` over `shards` shards: n / shards, one more for the first
    // n % shards, so that the shares add up to n (queue.hpp refuses 0 < n < shards: a share of 0
    // is no limit to the script).
    static std::size_t share(std::size_t n, std::size_t shards, std::size_t i) noexcept {
        return n / shards + (i < n % shards ? 1 : 0);
    }
    std::uint16_t slot(std::size_t s) const noexcept { return shards_[s].slot; }
    router& route() noexcept { return router_; }

    // The shard that holds `id`.
    std::size_t shard_of(std::string_view id) const noexcept {
        return shards_.size() == 1 ? 0 : fnv1a(id) % shards_.size();
    }

    [[noreturn]] static void bad_reply(std::string_view what, const redisReply* r) {
        if (r->type == REDIS_REPLY_ERROR) {
            std::string msg =
                "delayq::redis: " + std::string(what) + ": " + std::string(text_of(r));
            if (transient(text_of(r))) throw connection_error(msg);  // not now: the router gave up
            throw error(msg);
        }
        throw error("delayq::redis: " + std::string(what) + ": unexpected reply type " +
                    std::to_string(r->type));
    }

    static long long integer(const reply_ptr& r) {
        if (r->type != REDIS_REPLY_INTEGER) bad_reply("reply", r.get());
        return r->integer;
    }

    // Runs script `id` on shard `s` with ARGV = channel, shard number, `args` (see "The idea").
    // `patient`: see router::call. Every step (the layout check, SCRIPT LOAD, the script) spends
    // one budget: io_timeout from now.
    reply_ptr eval(std::size_t s, script_id id, std::span<const std::string_view> args,
                   bool patient = true) {
        return eval(s, id, args, patient, budget::from_now(opt_.io_timeout));
    }

    // The same within `b`, a budget that began earlier (a merged call's: see
    // delayq/detail/job_queue/combiner.hpp).
    reply_ptr eval(std::size_t s, script_id id, std::span<const std::string_view> args,
                   bool patient, const budget& b) {
        shard& at = shards_[s];
        if (!at.layout_checked.load(std::memory_order_acquire)) check_layout(at, patient, b);
        std::vector<std::string_view> argv;
        argv.reserve(5 + k_count + args.size());
        argv.insert(argv.end(), {"EVALSHA", sha(at, id, patient, b), "9"});
        static_assert(k_count == 9);
        argv.insert(argv.end(), at.keys.begin(), at.keys.end());
        argv.insert(argv.end(), {std::string_view(channel_), std::string_view(at.index)});
        argv.insert(argv.end(), args.begin(), args.end());
        auto r = router_.call(at.slot, argv, patient, b);
        if (error_starts_with(r.get(), "NOSCRIPT")) {
            argv[0] = "EVAL";
            argv[1] = scripts[id];
            r = router_.call(at.slot, argv, patient, b);
        }
        if (r->type == REDIS_REPLY_ERROR)
            bad_reply(std::string(script_names[id]) + " script", r.get());
        return r;
    }

    reply_ptr eval(std::size_t s, script_id id, std::initializer_list<std::string_view> args) {
        return eval(s, id, std::span<const std::string_view>(args.begin(), args.size()));
    }

    // The put script with `args` = (id payload mode ms)*: whether each job was queued. Merged
    // with other threads' puts on the shard (see "Merging").
    std::vector<bool> put(std::size_t s, std::span<const std::string_view> args) {
        put_call c;
        c.args = args;
        c.units = args.size() / 4;
        c.deadline = delayq::detail::saturating_add(c.start, opt_.io_timeout);
        carried more;
        const auto f =
            combiners(shards_[s])
                .puts.run(
                    c, [&](const put_call& k) { more.add(k.args, 0); },
                    [&](put_call& me, combiner<put_call>::batch& b) noexcept {
                        std::vector<bool> out;
                        std::exception_ptr failed;
                        try {
                            if (b.size() == 0)
                                out = put_now(s, me.args, budget_of(me));
                            else
                                out = put_now(s, more.after(me.args), budget_of(me));
                        } catch (...) {
                            failed = std::current_exception();
                        }
                        if (b.size() == 0) {
                            me.result = std::move(out);
                            me.failure = failed;
                            return;
                        }
                        b.claim();
                        std::size_t at = 0;
                        const auto answer = [&](put_call& k, std::size_t n) noexcept {
                            try {
                                if (failed) {
                                    k.failure = &k == &me ? failed : copy_of(failed);
                                } else {
                                    const auto from = out.begin() + static_cast<std::ptrdiff_t>(at);
                                    k.result.assign(from, from + static_cast<std::ptrdiff_t>(n));
                                }
                            } catch (...) {
                                k.failure = std::current_exception();
                            }
                        };
                        answer(me, me.args.size() / 4);
                        at += me.args.size() / 4;
                        for (std::size_t i = 0; i < b.size(); ++i) {
                            const std::size_t n = more.count[i] / 4;
                            if (put_call* k = b.at(i)) {
                                answer(*k, n);
                                k->signal(combined_call::done);
                            }
                            at += n;
                        }
                    });
        if (f != combiner<put_call>::fate::answered) late(c, s_put, f);
        if (c.failure) std::rethrow_exception(c.failure);
        return std::move(c.result);
    }

    // The consume script: settles `settle` ((how, id, token)*), then leases up to `take` jobs.
    // `patient`: see router::call. Merged with other threads' consumes on the shard (see
    // "Merging"): the settlements of all go first, then the takes, each getting the next of the
    // jobs leased, in the order the calls were handed in. A take that gave up before the answer
    // came (delayq/detail/job_queue/combiner.hpp) gets none: the jobs go to the takes still
    // waiting, and those that none of them wants (more were leased than they take) are released
    // (release()): a take that failed leaves nothing leased, and no attempt counted.
    consumed consume(std::size_t s, std::span<const std::string_view> settle, std::size_t take,
                     bool patient = true) {
        consume_call c;
        c.args = settle;
        c.take = take;
        c.units = std::max<std::size_t>(1, settle.size() / 3 + take);
        c.deadline = delayq::detail::saturating_add(c.start, opt_.io_timeout);
        shard_combiners& m = combiners(shards_[s]);
        carried more;
        std::vector<job> unwanted;  // leased for takes that gave up
        const auto f = (patient ? m.patient : m.impatient)
                           .run(
                               c, [&](const consume_call& k) { more.add(k.args, k.take); },
                               [&](consume_call& me, combiner<consume_call>::batch& b) noexcept {
                                   send_consume(s, patient, me, b, more, unwanted);
                               });
        if (f != combiner<consume_call>::fate::answered) late(c, s_consume, f);
        if (!unwanted.empty()) release(s, unwanted, patient, c);
        if (c.failure) std::rethrow_exception(c.failure);
        return std::move(c.result);
    }

    // Jobs queued in shard `s`, waiting plus leased.
    std::size_t size(std::size_t s) {
        return static_cast<std::size_t>(integer(eval(s, s_size, {})));
    }

    // The cancel script on shard `s`: 0 `id` was not queued; 1 it is gone; 2 it is gone, and a
    // place under this object's limits freed while a due job waits (scripts.hpp).
    long long cancel(std::size_t s, std::string_view id) {
        const std::array<std::string_view, 2> args{id, limited_ ? "1" : "0"};
        return integer(eval(s, s_cancel, args));
    }

    // The stats script on shard `s`: its figures (scripts.hpp, "Stats").
    queue_stats stats(std::size_t s) {
        auto r = eval(s, s_stats, {});
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 5) bad_reply("stats", r.get());
        std::array<long long, 5> n{};
        for (std::size_t i = 0; i < n.size(); ++i) {
            if (r->element[i]->type != REDIS_REPLY_INTEGER || r->element[i]->integer < 0)
                bad_reply("stats", r.get());
            n[i] = r->element[i]->integer;
        }
        queue_stats q;
        q.waiting = static_cast<std::size_t>(n[0]);
        q.due_now = static_cast<std::size_t>(n[1]);
        q.leased = static_cast<std::size_t>(n[2]);
        q.dead = static_cast<std::size_t>(n[3]);
        q.lag = milliseconds(n[4]);
        return q;
    }

    // The get script: job `id` of shard `s` as the store holds it (a queued one before a dead
    // letter); nothing if it is neither queued nor dead.
    std::optional<job_info> get(std::size_t s, std::string_view id) {
        const std::array<std::string_view, 1> args{id};
        auto r = eval(s, s_get, args);
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0 ||
            r->element[0]->type != REDIS_REPLY_INTEGER)
            bad_reply("get", r.get());
        const long long state = r->element[0]->integer;
        if (state == 0) return std::nullopt;
        if (state < 1 || state > 3 || r->elements != 5) bad_reply("get", r.get());
        constexpr std::array<job_state, 3> states{job_state::waiting, job_state::leased,
                                                  job_state::dead};
        job_info j = info_of(r->element + 1, "get", r.get());
        j.id = id;
        j.state = states[static_cast<std::size_t>(state - 1)];
        return j;
    }

    // A page of one shard's dead letters (the dead page script) or of its waiting or leased jobs
    // (the jobs page script): `place`, the position in the shard's order that `jobs` follow (''
    // from the first; for `from` = 'i' and an id that is not in the state asked, '' and no jobs).
    struct job_page {
        std::string place;
        std::vector<job_info> jobs;
    };

    // Up to `max` dead letters of shard `s` after `from`: '' (the first), 'i' and an id, 'p' and
    // a place (scripts.hpp's dead page script).
    job_page dead(std::size_t s, std::size_t max, std::string_view from) {
        const std::string count = std::to_string(max);
        const std::array<std::string_view, 2> args{count, from};
        return page_of(eval(s, s_dead_page, args), job_state::dead, "dead page");
    }

    // Up to `max` waiting or leased jobs (`state`) of shard `s` after `from`, as dead() (the jobs
    // page script).
    job_page jobs(std::size_t s, job_state state, std::size_t max, std::string_view from) {
        const std::string count = std::to_string(max);
        const std::array<std::string_view, 3> args{state == job_state::leased ? "l" : "w", count,
                                                   from};
        return page_of(eval(s, s_jobs_page, args), state, "jobs page");
    }

    // The requeue dead script: dead letter `id` of shard `s` back as a waiting job due `delay_ms`
    // (>= 0) from now; false if it is not dead, or queued too.
    bool requeue_dead(std::size_t s, std::string_view id, long long delay_ms) {
        const std::string ms = std::to_string(delay_ms);
        const std::array<std::string_view, 2> args{id, ms};
        return integer(eval(s, s_requeue_dead, args)) == 1;
    }

    // The dead letters of shard `s` that died more than `older_than_ms` (>= 0) before the first
    // call's now, removed: one call of the purge dead script per max_sweep of them, each after
    // the first with the first's cutoff. How many went.
    std::size_t purge_dead(std::size_t s, long long older_than_ms) {
        const std::string ms = std::to_string(older_than_ms);
        std::string cutoff;
        std::size_t removed = 0;
        for (;;) {
            const std::array<std::string_view, 2> args{ms, cutoff};
            auto r = eval(s, s_purge_dead,
                          std::span<const std::string_view>(args.data(), cutoff.empty() ? 1 : 2));
            if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
                r->element[0]->type != REDIS_REPLY_INTEGER ||
                r->element[1]->type != REDIS_REPLY_INTEGER ||
                r->element[2]->type != REDIS_REPLY_STRING)
                bad_reply("purge dead", r.get());
            removed += static_cast<std::size_t>(r->element[0]->integer);
            if (static_cast<std::size_t>(r->element[1]->integer) < max_sweep) return removed;
            cutoff = text_of(r->element[2]);
        }
    }

    // The pause script on shard `s`, within `b` (one budget for every shard of a pause()):
    // `how` "p" pauses it, "r" resumes it, "" only looks. Whether the shard is paused now.
    bool pause(std::size_t s, std::string_view how, const budget& b) {
        const std::array<std::string_view, 1> args{how};
        return integer(eval(s, s_pause, args, true, b)) == 1;
    }

    // Jobs in shard `s`'s dead-letter hash.
    std::size_t dead_size(std::size_t s) {
        const std::array<std::string_view, 2> args{"HLEN", shards_[s].keys[k_dead]};
        return static_cast<std::size_t>(integer(router_.call(shards_[s].slot, args)));
    }

    // Calls `run(shard, indices)` for the items of each shard, at most max_batch at a time, and
    // puts the answers back in the items' order.
    template <class IdOf, class Run>
    std::vector<bool> by_shard(std::size_t n, IdOf id_of, Run run) {
        std::vector<bool> out(n);
        std::vector<std::vector<std::size_t>> groups(shards_.size());
        for (std::size_t i = 0; i < n; ++i) groups[shard_of(id_of(i))].push_back(i);
        for (std::size_t g = 0; g < groups.size(); ++g)
            for (std::size_t at = 0; at < groups[g].size(); at += max_batch) {
                const std::span<const std::size_t> idx(groups[g].data() + at,
                                                       std::min(max_batch, groups[g].size() - at));
                const std::vector<bool> got = run(g, idx);
                if (got.size() != idx.size())
                    throw error("delayq::redis: a batch's reply has the wrong length");
                for (std::size_t k = 0; k < idx.size(); ++k) out[idx[k]] = got[k];
            }
        return out;
    }

  private:
    // The arguments of the calls that a sender carries (delayq/detail/job_queue/combiner.hpp),
    // copied when it takes them into its batch: a carried call may give up and be gone before they
    // are sent.
    struct carried {
        std::string bytes;  // every argument, one after another
        std::vector<std::pair<std::size_t, std::size_t>> spans;  // each argument in `bytes`
        std::vector<std::size_t> count;                          // arguments of each call
        std::vector<std::size_t> takes;                          // jobs each call takes
        std::size_t take_sum = 0;

        // Copies a call's arguments; on failure (out of memory) nothing is kept.
        void add(std::span<const std::string_view> args, std::size_t take) {
            const std::size_t b = bytes.size(), sp = spans.size(), n = count.size();
            try {
                count.push_back(args.size());
                takes.push_back(take);
                for (std::string_view a : args) {
                    spans.emplace_back(bytes.size(), a.size());
                    bytes.append(a);
                }
            } catch (...) {
                bytes.resize(b);
                spans.resize(sp);
                count.resize(n);
                takes.resize(n);
                throw;
            }
            take_sum += take;
        }

        // `mine`, then the carried calls' arguments, in order.
        std::vector<std::string_view> after(std::span<const std::string_view> mine) const {
            std::vector<std::string_view> all;
            all.reserve(mine.size() + spans.size());
            all.insert(all.end(), mine.begin(), mine.end());
            for (const auto& [at, size] : spans) all.emplace_back(bytes.data() + at, size);
            return all;
        }
    };

    // A call's own budget: io_timeout from when it was handed in.
    budget budget_of(const combined_call& c) const noexcept {
        return budget{c.start, c.deadline, opt_.io_timeout};
    }

    // Throws the error of a call that the combiner did not answer (its `f`): its deadline passed
    // before it was sent, or while a call that carried it was on its way.
    template <class Call>
    [[noreturn]] void late(const Call& c, script_id id, typename combiner<Call>::fate f) const {
        const std::string what = "delayq::redis: " + std::string(script_names[id]) + " script" +
                                 budget_of(c).timed_out();
        if (f == combiner<Call>::fate::unsent)
            throw unsent_error(what + " before it could be sent (behind another call)");
        throw error(what +
                    " waiting for the reply to the call it was sent in with others: it may "
                    "have run");
    }

    // Sends `me` and the consumes that it carries (`b`, arguments copied in `more`) as one call
    // of the consume script, and answers each (see consume()). The jobs leased for takes that
    // gave up, more than the takes still waiting want, go to `unwanted`.
    void send_consume(std::size_t s, bool patient, consume_call& me,
                      combiner<consume_call>::batch& b, const carried& more,
                      std::vector<job>& unwanted) noexcept {
        consumed out;
        std::exception_ptr failed;
        try {
            out = b.size() == 0 ? consume_now(s, me.args, me.take, patient, budget_of(me))
                                : consume_now(s, more.after(me.args), me.take + more.take_sum,
                                              patient, budget_of(me));
        } catch (...) {
            failed = std::current_exception();
        }
        if (b.size() == 0) {
            me.result = std::move(out);
            me.failure = failed;
            return;
        }
        b.claim();
        std::size_t ok_at = 0, job_at = 0;
        const auto answer = [&](consume_call& k, std::size_t settled) noexcept {
            try {
                if (failed) {
                    k.failure = &k == &me ? failed : copy_of(failed);
                    return;
                }
                k.result.next = out.next;
                const auto from = out.ok.begin() + static_cast<std::ptrdiff_t>(ok_at);
                k.result.ok.assign(from, from + static_cast<std::ptrdiff_t>(settled));
                for (; job_at < out.jobs.size() && k.result.jobs.size() < k.take; ++job_at)
                    k.result.jobs.push_back(std::move(out.jobs[job_at]));
            } catch (...) {
                k.failure = std::current_exception();
            }
        };
        answer(me, me.args.size() / 3);
        ok_at += me.args.size() / 3;
        for (std::size_t i = 0; i < b.size(); ++i) {
            const std::size_t settled = more.count[i] / 3;
            if (consume_call* k = b.at(i)) {
                answer(*k, settled);
                k->signal(combined_call::done);
            }
            ok_at += settled;
        }
        try {
            for (; job_at < out.jobs.size(); ++job_at)
                unwanted.push_back(std::move(out.jobs[job_at]));
        } catch (...) {  // out of memory: the rest stay leased until their lease ends
        }
    }

    // Gives back the jobs that a merged consume leased for takes that had given up when its
    // reply came (consume()): each is due again at the time it was due when leased, with the
    // attempt that lease counted taken back (the consume script's release), as if those takes had
    // never run. This is one more call, made by the sender once it has answered its batch and
    // handed on to the next (delayq/detail/job_queue/combiner.hpp), so nobody else waits for it,
    // within the sender's own io_timeout: it happens only when a carried take gave up, when the
    // server was slow; riding on the next batch instead would tie it to another call's deadline and
    // add state to every merged call for a rare case. If it fails (the budget spent, the server
    // gone), the sender's own answer stands and those leases end as any other lease nobody settles:
    // the jobs are due again at their lease end, that attempt counted. On success the sender learns
    // the shard's next event from it (0: the jobs are due).
    void release(std::size_t s, const std::vector<job>& jobs, bool patient,
                 consume_call& sender) noexcept {
        try {
            std::vector<std::string> words;  // per job: "r<due ms>", its token
            words.reserve(2 * jobs.size());
            for (const job& j : jobs) {
                words.push_back(tagged('r', to_ms(j.deadline)));
                words.push_back(std::to_string(j.token));
            }
            std::vector<std::string_view> settle;
            settle.reserve(3 * jobs.size());
            for (std::size_t i = 0; i < jobs.size(); ++i)
                settle.insert(settle.end(), {words[2 * i], jobs[i].id, words[2 * i + 1]});
            const consumed c = consume_now(s, settle, 0, patient, budget_of(sender));
            if (!sender.failure) sender.result.next = c.next;
        } catch (...) {
        }
    }

    // A page script's answer: {place, (id, time, attempts, payload, last error)*}, the jobs in
    // `state`.
    static job_page page_of(const reply_ptr& r, job_state state, std::string_view script) {
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->elements % 5 != 1 ||
            r->element[0]->type != REDIS_REPLY_STRING)
            bad_reply(script, r.get());
        job_page page;
        page.place = text_of(r->element[0]);
        page.jobs.reserve(r->elements / 5);
        for (std::size_t i = 1; i < r->elements; i += 5) {
            if (r->element[i]->type != REDIS_REPLY_STRING) bad_reply(script, r.get());
            job_info& j = page.jobs.emplace_back(info_of(r->element + i + 1, script, r.get()));
            j.id = text_of(r->element[i]);
            j.state = state;
        }
        return page;
    }

    // A job_info's time, attempts, payload and last error from `e`, four elements of a reply
    // `r` of `script`: two integers, two strings.
    static job_info info_of(const redisReply* const* e, std::string_view script,
                            const redisReply* r) {
        if (e[0]->type != REDIS_REPLY_INTEGER || e[1]->type != REDIS_REPLY_INTEGER ||
            e[2]->type != REDIS_REPLY_STRING || e[3]->type != REDIS_REPLY_STRING)
            bad_reply(script, r);
        job_info j;
        j.time = from_ms(e[0]->integer);
        j.attempts = static_cast<unsigned>(e[1]->integer);
        j.payload = text_of(e[2]);
        j.last_error = text_of(e[3]);
        return j;
    }

    // The put script, now, unmerged.
    std::vector<bool> put_now(std::size_t s, std::span<const std::string_view> args,
                              const budget& b) {
        auto r = eval(s, s_put, args, true, b);
        if (r->type != REDIS_REPLY_ARRAY || r->elements != args.size() / 4)
            bad_reply("put", r.get());
        std::vector<bool> out(r->elements);
        for (std::size_t i = 0; i < r->elements; ++i) out[i] = r->element[i]->integer == 1;
        return out;
    }

    // The consume script, now, unmerged.
    consumed consume_now(std::size_t s, std::span<const std::string_view> settle, std::size_t take,
                         bool patient, const budget& b) {
        std::vector<std::string_view> args;
        args.reserve(8 + settle.size());
        const std::string count = std::to_string(take);
        const shard& at = shards_[s];
        args.insert(args.end(), {std::string_view(lease_ms_), std::string_view(max_attempts_),
                                 std::string_view(reclaim_batch_), std::string_view(count),
                                 std::string_view(keep_dead_), std::string_view(at.max_leased),
                                 std::string_view(at.rate), std::string_view(period_)});
        args.insert(args.end(), settle.begin(), settle.end());
        auto r = eval(s, s_consume, args, patient, b);
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

    struct shard {
        std::string index;                      // ARGV[2] of its scripts
        std::string tag;                        // its hash tag, braces included
        std::array<std::string, k_count> keys;  // KEYS, in scripts.hpp's order
        std::uint16_t slot = 0;
        std::string max_leased, rate;  // its share of the object's limits (share())
        std::atomic<bool> layout_checked{false};
        // Shared with other objects (see "Merging"); replaced in a child process (combiners()).
        std::shared_ptr<shard_combiners> merge;
        std::atomic<unsigned> merge_generation{0};  // the fork generation `merge` is of
    };

    // The combiners of shard `at` for this process: a child after fork() asks for its own (the
    // parent's may count calls of threads the child does not have, which would never return).
    shard_combiners& combiners(shard& at) {
        const unsigned generation = fork_generation();
        if (at.merge_generation.load(std::memory_order_acquire) != generation) {
            std::lock_guard lk(merge_m_);  // only ever taken in a child
            if (at.merge_generation.load(std::memory_order_relaxed) != generation) {
                // The parent's go with their last holder in the child: nothing in them needs
                // the parent's threads to be destroyed (a combiner holds a mutex and pointers).
                at.merge = shared_combiners(at);
                at.merge_generation.store(generation, std::memory_order_release);
            }
        }
        return *at.merge;
    }

    std::shared_ptr<shard_combiners> shared_combiners(const shard& at) const {
        return shared_in_process<shard_combiners>(merge_key_ + at.keys[0] + '\0' + at.index, [] {
            return std::make_shared<shard_combiners>();
        });
    }

    // Before a shard's first script call: a queue written in an older key layout (scripts.hpp)
    // is refused, with its keys left as they are, rather than read as empty. Its keys share the
    // shard's hash tag, so one EXISTS on the shard's node sees them. The user needs read access
    // to them (docs/redis.md's ACL gives it): a refusal says nothing about the keys (the user may
    // have been changed since they were written), so it is an error naming what is missing,
    // never "no old keys".
    void check_layout(shard& at, bool patient, const budget& b) {
        for (std::string_view old : older_layouts) {
            std::vector<std::string> keys;
            keys.reserve(older_keys.size());
            for (const char* k : older_keys)
                keys.push_back("dq:" + std::string(old) + ":" + at.tag + ":" + k);
            std::vector<std::string_view> argv{"EXISTS"};
            argv.insert(argv.end(), keys.begin(), keys.end());
            auto r = router_.call(at.slot, argv, patient, b);
            if (error_starts_with(r.get(), "NOPERM"))
                throw error(
                    "delayq::redis: queue " + at.tag + ": the check for keys of the older layout " +
                    std::string(old) +
                    " was refused: the user needs read access to the keys dq:" + std::string(old) +
                    ":" + at.tag + ":* (the ACL in docs/redis.md, \"Redis ACLs\"): EXISTS: " +
                    std::string(text_of(r.get())));
            if (integer(r) > 0)
                throw layout_error("delayq::redis: queue " + at.tag + " holds jobs in key layout " +
                                       std::string(old) + " (dq:" + std::string(old) + ":" +
                                       at.tag +
                                       ":*), which this version of delayq does not read "
                                       "(it uses " +
                                       std::string(layout) +
                                       "); they are left as they are: drain them with the "
                                       "version that wrote them (docs/redis.md, \"Upgrading\")",
                                   std::string(old));
        }
        at.layout_checked.store(true, std::memory_order_release);
    }

    // SHA1s come from SCRIPT LOAD, once per object; they never change.
    std::string_view sha(const shard& s, script_id id, bool patient, const budget& b) {
        if (sha_ready_[id].load(std::memory_order_acquire)) return sha_[id];
        const std::array<std::string_view, 3> args{"SCRIPT", "LOAD", scripts[id]};
        auto r = router_.call(s.slot, args, patient, b);
        if (r->type != REDIS_REPLY_STRING) bad_reply("SCRIPT LOAD", r.get());
        std::lock_guard lk(sha_m_);
        if (!sha_ready_[id].load(std::memory_order_relaxed)) {
            sha_[id] = std::string(text_of(r.get()));
            sha_ready_[id].store(true, std::memory_order_release);
        }
        return sha_[id];
    }

    options opt_;
    router router_;
    std::vector<shard> shards_;
    std::string channel_, lease_ms_, max_attempts_, reclaim_batch_, keep_dead_;
    std::string period_;     // of the limits' rate, in ms ("0": none)
    bool limited_ = false;   // whether the object has limits
    std::string merge_key_;  // what objects that share combiners have in common (see "Merging")
    std::mutex merge_m_;     // a child's first calls replace the parent's combiners
    std::mutex sha_m_;
    std::array<std::string, s_count> sha_;
    std::array<std::atomic<bool>, s_count> sha_ready_{};
};

}  // namespace delayq::redis::detail
