// The script client: how a queue object runs the scripts of scripts.hpp on its shards and reads
// their replies. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. A queue object changes the server only through scripts. Each of its shards is one
// hash tag, `{name}` or `{name#i}`, so one Cluster slot with its own five keys (scripts.hpp's key
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
// a shard while one of that kind is on its way go together as one script call (merger.hpp): the
// client splits the reply, each call gets its own answers and its own jobs.
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
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/epoch_ms.hpp"
#include "../types.hpp"
#include "cluster.hpp"
#include "connection.hpp"
#include "merger.hpp"
#include "scripts.hpp"

namespace delayq::redis::detail {

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

// A call handed to a shard's merger (merger.hpp): its arguments, and its failure if it fails.
struct script_call : merged_call {
    std::span<const std::string_view> args;  // the script's own, for this call's jobs
    std::exception_ptr failure;
};

// A consume call handed to a shard's merger: its settlements and how many jobs it takes.
struct consume_call : script_call {
    std::size_t take = 0;  // args: (how id token)*
    consumed result;
};

// A put call handed to a shard's merger.
struct put_call : script_call {
    std::vector<bool> result;  // args: (id payload mode ms)*
};

// The mergers of one shard: one for the puts, one for the consumes that may wait for a failing
// node and one for those that may not (router::call's `patient`: they are sent apart).
struct shard_mergers {
    static constexpr std::size_t depth = 1;  // calls of a kind on their way at a time
    merger<consume_call> patient{depth, max_batch}, impatient{depth, max_batch};
    merger<put_call> puts{depth, max_batch};
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
        }
        lease_ms_ = std::to_string(opt_.lease.count());
        max_attempts_ = std::to_string(opt_.max_attempts);
        batch_ = std::to_string(opt_.reclaim_batch);
        // Objects merge their calls when every word of those calls, and where and how they go,
        // is the same.
        std::string common;
        for (const std::string& part :
             {opt_.host, std::to_string(opt_.port), opt_.user, opt_.password, channel_, lease_ms_,
              max_attempts_, batch_, std::to_string(opt_.io_timeout.count())})
            common.append(part).push_back('\0');
        for (shard& at : shards_)
            at.merge = shared_in_process<shard_mergers>(common + at.keys[0] + '\0' + at.index, [] {
                return std::make_shared<shard_mergers>();
            });
    }
    script_client(const script_client&) = delete;
    script_client& operator=(const script_client&) = delete;

    const options& get_options() const noexcept { return opt_; }
    std::size_t shards() const noexcept { return shards_.size(); }
    const std::string& channel() const noexcept { return channel_; }
    std::uint16_t slot(std::size_t s) const noexcept { return shards_[s].slot; }
    router& route() noexcept { return router_; }

    // The shard that holds `id`.
    std::size_t shard_of(std::string_view id) const noexcept {
        return shards_.size() == 1 ? 0 : fnv1a(id) % shards_.size();
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

    // Runs script `id` on shard `s` with ARGV = channel, shard number, `args` (see "The idea").
    // `patient`: see router::call. Every step (the layout check, SCRIPT LOAD, the script) spends
    // one budget: io_timeout from now.
    reply_ptr eval(std::size_t s, script_id id, std::span<const std::string_view> args,
                   bool patient = true) {
        return eval(s, id, args, patient, budget::from_now(opt_.io_timeout));
    }

    // The same within `b`, a budget that began earlier (a merged call's: see merger.hpp).
    reply_ptr eval(std::size_t s, script_id id, std::span<const std::string_view> args,
                   bool patient, const budget& b) {
        shard& at = shards_[s];
        if (!at.layout_checked.load(std::memory_order_acquire)) check_layout(at, patient, b);
        std::vector<std::string_view> argv;
        argv.reserve(5 + k_count + args.size());
        argv.insert(argv.end(), {"EVALSHA", sha(at, id, patient, b), "4"});
        static_assert(k_count == 4);
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
        shards_[s].merge->puts.run(c, [&](put_call& first) noexcept {
            answer(
                first, s_put,
                [&](const put_call&, std::span<const std::string_view> all, const budget& b) {
                    return put_now(s, all, b);
                },
                [](put_call& p, std::vector<bool>& out, std::size_t& at) {
                    const auto n = static_cast<std::ptrdiff_t>(p.args.size() / 4);
                    const auto from = out.begin() + static_cast<std::ptrdiff_t>(at);
                    p.result.assign(from, from + n);
                    at += static_cast<std::size_t>(n);
                });
        });
        if (c.failure) std::rethrow_exception(c.failure);
        return std::move(c.result);
    }

    // The consume script: settles `settle` ((how, id, token)*), then leases up to `take` jobs.
    // `patient`: see router::call. Merged with other threads' consumes on the shard (see
    // "Merging"): the settlements of all go first, then the takes, each getting the next of the
    // jobs leased, in the order the calls were handed in.
    consumed consume(std::size_t s, std::span<const std::string_view> settle, std::size_t take,
                     bool patient = true) {
        consume_call c;
        c.args = settle;
        c.take = take;
        c.units = std::max<std::size_t>(1, settle.size() / 3 + take);
        shard_mergers& m = *shards_[s].merge;
        (patient ? m.patient : m.impatient).run(c, [&](consume_call& first) noexcept {
            std::size_t job_at = 0;
            answer(
                first, s_consume,
                [&](const consume_call& head, std::span<const std::string_view> all,
                    const budget& b) {
                    std::size_t takes = 0;
                    for (const merged_call* k = &head; k != nullptr; k = k->next)
                        takes += static_cast<const consume_call*>(k)->take;
                    return consume_now(s, all, takes, patient, b);
                },
                [&](consume_call& k, consumed& out, std::size_t& ok_at) {
                    const std::size_t settled = k.args.size() / 3;
                    k.result.next = out.next;
                    k.result.ok.assign(
                        out.ok.begin() + static_cast<std::ptrdiff_t>(ok_at),
                        out.ok.begin() + static_cast<std::ptrdiff_t>(ok_at + settled));
                    ok_at += settled;
                    for (; job_at < out.jobs.size() && k.result.jobs.size() < k.take; ++job_at)
                        k.result.jobs.push_back(std::move(out.jobs[job_at]));
                });
        });
        if (c.failure) std::rethrow_exception(c.failure);
        return std::move(c.result);
    }

    // Jobs queued in shard `s`, waiting plus leased.
    std::size_t size(std::size_t s) {
        return static_cast<std::size_t>(integer(eval(s, s_size, {})));
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
    // Sends the merged calls that begin at `first` (merger::run's batch) of script `id` as one:
    // `run(head, args, b)`, where `head` begins the calls sent (through `next`) and `args` is
    // their arguments one after another, and answers each: the whole result when it went alone,
    // else its share, which `split(call, result, at)` takes from `at` on (and moves `at` past). A
    // failure is every call's. The budget `b` is the earliest one of the calls sent, so that each
    // returns within its own io_timeout; a call whose own ran out while it waited for its turn
    // fails unsent, as the link fails a call handed in behind a hung one, and is not sent.
    template <class Call, class Run, class Split>
    void answer(Call& first, script_id id, Run run, Split split) noexcept {
        const auto budget_of = [&](steady::time_point start) {
            return budget{start, delayq::detail::saturating_add(start, opt_.io_timeout),
                          opt_.io_timeout};
        };
        const auto now = steady::now();
        merged_call* in_time = nullptr;  // the calls still in time, in order
        merged_call** last = &in_time;
        for (merged_call* next = &first; next != nullptr;) {
            Call& k = static_cast<Call&>(*next);
            next = k.next;  // read before an answer: k may be gone right after it
            if (budget_of(k.start).deadline > now) {
                *last = &k;
                last = &k.next;
                continue;
            }
            try {
                k.failure = std::make_exception_ptr(
                    unsent_error("delayq::redis: " + std::string(script_names[id]) + " script" +
                                 budget_of(k.start).timed_out() +
                                 " before it could be sent (behind another call)"));
            } catch (...) {
                k.failure = std::current_exception();
            }
            k.signal(combined::done);
        }
        *last = nullptr;
        if (in_time == nullptr) return;
        Call* const head = static_cast<Call*>(in_time);
        const bool alone = head->next == nullptr;
        using result_t = decltype(first.result);
        result_t out{};
        std::exception_ptr failed;
        try {
            steady::time_point start = head->start;
            std::vector<std::string_view> all;
            for (const merged_call* k = head; k != nullptr; k = k->next) {
                start = std::min(start, k->start);
                const auto args = static_cast<const Call&>(*k).args;
                if (!alone) all.insert(all.end(), args.begin(), args.end());
            }
            out = run(*head, alone ? head->args : std::span<const std::string_view>(all),
                      budget_of(start));
        } catch (...) {
            failed = std::current_exception();
        }
        if (alone && !failed) {
            head->result = std::move(out);
            head->signal(combined::done);
            return;
        }
        std::size_t at = 0;
        for (merged_call* next = head; next != nullptr;) {
            Call& k = static_cast<Call&>(*next);
            next = k.next;
            try {
                if (failed)
                    k.failure = copy_of(failed);
                else
                    split(k, out, at);
            } catch (...) {
                k.failure = std::current_exception();
            }
            k.signal(combined::done);
        }
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
        args.reserve(4 + settle.size());
        const std::string count = std::to_string(take);
        args.insert(args.end(), {std::string_view(lease_ms_), std::string_view(max_attempts_),
                                 std::string_view(batch_), std::string_view(count)});
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
        std::atomic<bool> layout_checked{false};
        std::shared_ptr<shard_mergers> merge;  // shared with other objects (see "Merging")
    };

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
    std::string channel_, lease_ms_, max_attempts_, batch_;
    std::mutex sha_m_;
    std::array<std::string, s_count> sha_;
    std::array<std::atomic<bool>, s_count> sha_ready_{};
};

}  // namespace delayq::redis::detail
