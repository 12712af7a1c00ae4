// A job queue in memory, for the tests of what runs above every job queue (delayq::worker): the
// contract's semantics (leases on the system clock, fencing tokens, max_attempts, dead letters)
// in a page, with faults a test switches on (takes, acks and extensions that throw, extensions
// that are refused) and a record of the calls.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <delayq/job.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace delayq_test {

// What a store's failure looks like to the worker: a delayq::unavailable_error.
class memory_unavailable : public delayq::queue_error, public delayq::unavailable_error {
  public:
    explicit memory_unavailable(const std::string& what) : delayq::queue_error(what) {}
    const char* what() const noexcept override { return delayq::queue_error::what(); }
};

class memory_job_queue {
  public:
    using clock = std::chrono::system_clock;
    using milliseconds = std::chrono::milliseconds;

    struct options {
        milliseconds lease{30000};
        unsigned max_attempts = 0;
    };

    // Faults, under the lock (set them through with()).
    struct faults {
        int fail_takes = 0;           // the next n takes throw
        int fail_settles = 0;         // the next n acks, nacks and buries throw
        int fail_extends = 0;         // the next n extends throw
        bool refuse_extends = false;  // extends return false
    };

    // What happened, under the lock.
    struct record {
        std::size_t takes = 0, acks = 0, nacks = 0, buries = 0, extends = 0, deliveries = 0;
        std::vector<milliseconds> nack_delays;
        std::vector<std::string> reasons;  // of the nacks and buries that gave one
    };

    memory_job_queue() : memory_job_queue(options{}) {}
    explicit memory_job_queue(options o) : opt_(o) {}

    const options& get_options() const noexcept { return opt_; }

    template <class F>
    auto with(F f) {
        std::lock_guard lk(m_);
        return f(faults_, record_);
    }

    bool put(std::string_view id, std::string_view payload, clock::time_point at) {
        std::lock_guard lk(m_);
        if (jobs_.count(std::string(id))) return false;
        jobs_[std::string(id)] = entry{std::string(payload), at, at, 0, 0, false, {}};
        cv_.notify_all();
        return true;
    }
    bool put_after(std::string_view id, std::string_view payload, milliseconds d) {
        return put(id, payload, clock::now() + std::max(d, milliseconds::zero()));
    }
    std::vector<bool> put_many(std::span<const delayq::put_request> rs) {
        std::vector<bool> out;
        for (const auto& r : rs) out.push_back(put_after(r.id, r.payload, r.delay));
        return out;
    }
    // The worker's tests run no series: the concept's calls are here, refused.
    bool put_every(std::string_view, std::string_view, milliseconds) {
        throw std::logic_error("memory_job_queue: no repeatable jobs");
    }
    bool put_cron(std::string_view, std::string_view, std::string_view) {
        throw std::logic_error("memory_job_queue: no repeatable jobs");
    }
    bool cancel(std::string_view id) {
        std::lock_guard lk(m_);
        return jobs_.erase(std::string(id)) == 1;
    }
    bool reschedule(std::string_view id, milliseconds d) {
        std::lock_guard lk(m_);
        auto it = jobs_.find(std::string(id));
        if (it == jobs_.end() || it->second.leased) return false;
        it->second.at = clock::now() + d;
        cv_.notify_all();
        return true;
    }

    std::optional<delayq::job> take(milliseconds max_wait, const std::stop_token& stop = {}) {
        auto v = take_many(1, max_wait, stop);
        if (v.empty()) return std::nullopt;
        return std::move(v.front());
    }

    std::vector<delayq::job> take_many(std::size_t n, milliseconds max_wait,
                                       const std::stop_token& stop = {}) {
        // (Before the lock: a stop already requested runs the callback here, at once.)
        std::stop_callback wake(stop, [&] {
            std::lock_guard inner(m_);
            cv_.notify_all();
        });
        std::unique_lock lk(m_);
        ++record_.takes;
        if (faults_.fail_takes > 0) {
            --faults_.fail_takes;
            throw memory_unavailable("memory_job_queue: take failed (a fault the test asked for)");
        }
        const auto until = clock::now() + std::max(max_wait, milliseconds::zero());
        std::vector<delayq::job> out;
        for (;;) {
            if (stop.stop_requested() || n == 0) return out;
            const auto now = clock::now();
            if (paused_) {  // hands out nothing; resume() wakes it
                if (now >= until) return out;
                cv_.wait_until(lk, until);
                continue;
            }
            auto earliest = clock::time_point::max();
            for (auto it = jobs_.begin(); it != jobs_.end() && out.size() < n;) {
                auto& [id, e] = *it;
                if (e.at > now) {
                    earliest = std::min(earliest, e.at);
                    ++it;
                    continue;
                }
                if (e.leased && opt_.max_attempts > 0 && e.attempts >= opt_.max_attempts) {
                    e.last_error = delayq::lease_ended_reason;
                    to_dead(it);
                    it = jobs_.erase(it);
                    continue;
                }
                e.deadline = e.at;
                e.leased = true;
                ++e.attempts;
                e.token = ++tokens_;
                e.at = now + opt_.lease;
                ++record_.deliveries;
                out.push_back({id, e.payload, e.deadline, e.attempts, e.token, e.at});
                ++it;
            }
            if (!out.empty() || now >= until) return out;
            cv_.wait_until(lk, std::min(until, earliest));
        }
    }

    bool ack(const delayq::job& j) {
        return settle(
            j, [&](auto it) { jobs_.erase(it); }, 'a');
    }
    std::vector<bool> ack_many(std::span<const delayq::job> js) {
        std::vector<bool> out;
        for (const auto& j : js) out.push_back(ack(j));
        return out;
    }
    bool nack(const delayq::job& j, milliseconds d) { return nack_for(j, d, nullptr); }
    bool nack(const delayq::job& j, milliseconds d, std::string_view reason) {
        return nack_for(j, d, &reason);
    }
    bool bury(const delayq::job& j) { return bury_for(j, nullptr); }
    bool bury(const delayq::job& j, std::string_view reason) { return bury_for(j, &reason); }
    bool extend(const delayq::job& j, milliseconds lease) {
        if (lease < milliseconds::zero()) throw std::invalid_argument("negative lease");
        std::lock_guard lk(m_);
        ++record_.extends;
        if (faults_.fail_extends > 0) {
            --faults_.fail_extends;
            throw memory_unavailable(
                "memory_job_queue: extend failed (a fault the test asked for)");
        }
        if (faults_.refuse_extends) return false;
        auto it = holding(j);
        if (it == jobs_.end()) return false;
        it->second.at = clock::now() + lease;
        cv_.notify_all();
        return true;
    }

    std::size_t size() {
        std::lock_guard lk(m_);
        return jobs_.size();
    }
    std::size_t dead_size() {
        std::lock_guard lk(m_);
        return dead_.size();
    }
    delayq::queue_stats stats() {
        std::lock_guard lk(m_);
        delayq::queue_stats s;
        const auto now = clock::now();
        auto oldest = now;
        for (const auto& [id, e] : jobs_) {
            if (e.leased && e.at > now) {
                ++s.leased;
                continue;
            }
            ++s.waiting;
            if (e.at <= now) ++s.due_now, oldest = std::min(oldest, e.at);
        }
        s.dead = dead_.size();
        s.lag = std::chrono::duration_cast<milliseconds>(now - oldest);
        return s;
    }
    std::optional<delayq::job_info> get(std::string_view id) {
        std::lock_guard lk(m_);
        if (auto it = jobs_.find(std::string(id)); it != jobs_.end()) {
            const entry& e = it->second;
            const bool leased = e.leased && e.at > clock::now();
            return delayq::job_info{
                it->first, leased ? delayq::job_state::leased : delayq::job_state::waiting,
                e.at,      e.attempts,
                e.payload, e.last_error};
        }
        if (auto it = dead_.find(std::string(id)); it != dead_.end()) return it->second;
        return std::nullopt;
    }
    std::vector<delayq::job_info> dead(std::size_t max, std::string_view after = {}) {
        std::lock_guard lk(m_);
        std::vector<const delayq::job_info*> all;
        for (const auto& [id, d] : dead_) all.push_back(&d);
        std::sort(all.begin(), all.end(), [](auto* a, auto* b) {
            return std::tie(a->time, a->id) < std::tie(b->time, b->id);
        });
        auto from = all.begin();
        if (!after.empty()) {
            from = std::find_if(all.begin(), all.end(), [&](auto* d) { return d->id == after; });
            if (from == all.end()) return {};
            ++from;
        }
        std::vector<delayq::job_info> out;
        for (; from != all.end() && out.size() < std::min(max, delayq::max_take_many); ++from)
            out.push_back(**from);
        return out;
    }

    std::vector<delayq::job_info> jobs(delayq::job_state state, std::size_t max,
                                       std::string_view after = {}) {
        if (state == delayq::job_state::dead) return dead(max, after);
        std::lock_guard lk(m_);
        const auto now = clock::now();
        std::vector<delayq::job_info> all;
        for (const auto& [id, e] : jobs_) {
            const auto s =
                e.leased && e.at > now ? delayq::job_state::leased : delayq::job_state::waiting;
            if (s == state) all.push_back({id, s, e.at, e.attempts, e.payload, e.last_error});
        }
        std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
            return std::tie(a.time, a.id) < std::tie(b.time, b.id);
        });
        auto from = all.begin();
        if (!after.empty()) {
            from =
                std::find_if(all.begin(), all.end(), [&](const auto& j) { return j.id == after; });
            if (from == all.end()) return {};
            ++from;
        }
        std::vector<delayq::job_info> out;
        for (; from != all.end() && out.size() < std::min(max, delayq::max_take_many); ++from)
            out.push_back(std::move(*from));
        return out;
    }

    bool requeue_dead(std::string_view id, milliseconds delay) {
        if (delay < milliseconds::zero()) throw std::invalid_argument("negative delay");
        std::lock_guard lk(m_);
        const auto it = dead_.find(std::string(id));
        if (it == dead_.end() || jobs_.count(it->first)) return false;
        const auto at = clock::now() + delay;
        jobs_[it->first] = entry{it->second.payload, at, at, 0, 0, false, it->second.last_error};
        dead_.erase(it);
        cv_.notify_all();
        return true;
    }
    void pause() {
        std::lock_guard lk(m_);
        paused_ = true;
    }
    void resume() {
        std::lock_guard lk(m_);
        paused_ = false;
        cv_.notify_all();
    }
    bool paused() {
        std::lock_guard lk(m_);
        return paused_;
    }

    std::size_t purge_dead(milliseconds older_than) {
        if (older_than < milliseconds::zero()) throw std::invalid_argument("negative age");
        std::lock_guard lk(m_);
        return std::erase_if(
            dead_, [&](const auto& d) { return d.second.time < clock::now() - older_than; });
    }

    // The attempts of a queued job (0 if it is not queued).
    unsigned attempts(const std::string& id) {
        std::lock_guard lk(m_);
        auto it = jobs_.find(id);
        return it == jobs_.end() ? 0 : it->second.attempts;
    }

  private:
    bool nack_for(const delayq::job& j, milliseconds d, const std::string_view* reason) {
        return settle(
            j,
            [&](auto it) {
                record_.nack_delays.push_back(d);
                keep(it, reason);
                if (opt_.max_attempts > 0 && it->second.attempts >= opt_.max_attempts) {
                    to_dead(it);
                    jobs_.erase(it);
                    return;
                }
                it->second.leased = false;
                it->second.at = clock::now() + std::max(d, milliseconds::zero());
                cv_.notify_all();
            },
            'n');
    }
    bool bury_for(const delayq::job& j, const std::string_view* reason) {
        return settle(
            j,
            [&](auto it) {
                keep(it, reason);
                to_dead(it);
                jobs_.erase(it);
            },
            'b');
    }

    struct entry {
        std::string payload;
        clock::time_point at;        // due time, or lease end while leased
        clock::time_point deadline;  // when this delivery was due
        unsigned attempts = 0;
        std::uint64_t token = 0;
        bool leased = false;
        std::string last_error;
    };
    using iterator = std::map<std::string, entry>::iterator;

    // Under m_: the reason, if any, becomes the job's last error.
    void keep(iterator it, const std::string_view* reason) {
        if (reason == nullptr) return;
        it->second.last_error = std::string(reason->substr(0, delayq::max_reason_size));
        record_.reasons.push_back(it->second.last_error);
    }

    // Under m_: a copy of the job goes to the dead letters (the caller erases it).
    void to_dead(iterator it) {
        const entry& e = it->second;
        dead_[it->first] = delayq::job_info{
            it->first, delayq::job_state::dead, clock::now(), e.attempts, e.payload, e.last_error};
    }

    iterator holding(const delayq::job& j) {
        auto it = jobs_.find(j.id);
        if (it == jobs_.end() || !it->second.leased || it->second.token != j.token ||
            it->second.at <= clock::now())
            return jobs_.end();
        return it;
    }

    template <class F>
    bool settle(const delayq::job& j, F f, char how) {
        std::lock_guard lk(m_);
        if (faults_.fail_settles > 0) {
            --faults_.fail_settles;
            throw memory_unavailable(
                "memory_job_queue: settle failed (a fault the test asked for)");
        }
        (how == 'a' ? record_.acks : how == 'n' ? record_.nacks : record_.buries)++;
        auto it = holding(j);
        if (it == jobs_.end()) return false;
        f(it);
        return true;
    }

    options opt_;
    std::mutex m_;
    std::condition_variable cv_;
    bool paused_ = false;
    std::map<std::string, entry> jobs_;
    std::map<std::string, delayq::job_info> dead_;
    std::uint64_t tokens_ = 0;
    faults faults_;
    record record_;
};

}  // namespace delayq_test
