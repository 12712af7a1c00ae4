// The workloads of bench/ab, included twice into one program: once as the working tree's delayq,
// once (side_base.cpp) as another revision's, renamed by `#define delayq delayq_base`. Each side
// builds its own structure; main.cpp alternates their rounds.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <delayq/delayq.hpp>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "ab.hpp"

namespace {

using mclock = delayq::manual_clock;
using mtp = mclock::time_point;
using namespace std::chrono_literals;

std::atomic<std::uint64_t> fired{0};

struct tick_task {  // as bench_compare's: an 8-byte capture
    std::atomic<std::uint64_t>* counter;
    void operator()() const noexcept { counter->fetch_add(1, std::memory_order_relaxed); }
};

double ns_since(std::chrono::steady_clock::time_point t0, std::size_t ops) {
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
           static_cast<double>(ops);
}

// The base side may be a revision from before the wheels took one shape (issue 27): there the
// hashed wheel's ring size was ticks_per_wheel, the thread-free hierarchical wheel was
// hierarchical_timing_wheel with own_thread = false, and it was driven by advance_clock(). The
// branches for those keep scripts/ab able to compare against such a revision.
#if __has_include(<delayq/basic_wheel.hpp>)
using hierarchical_core = delayq::hierarchical_wheel<mclock>;
#else
using hierarchical_core = delayq::hierarchical_timing_wheel<mclock>;
#endif

// bench_compare's configurations: Netty's tick with a ring spanning the deadlines, Kafka's
// defaults driven on this thread.
// The threaded hashed timer (the one bench_compare's insert, cancel and postpone rows time): its
// worker sleeps through these workloads (nothing comes due on manual_clock), so a round times the
// schedule path as users of the threaded timer meet it.
using hashed_timer = delayq::hashed_wheel_timer<mclock>;

template <class W>
typename W::options options() {
    typename W::options o;
    if constexpr (std::is_same_v<W, delayq::hashed_wheel<mclock>> ||
                  std::is_same_v<W, hashed_timer>) {
        o.tick = 100ms;
        if constexpr (requires { o.ticks_per_wheel; }) {
            o.ticks_per_wheel = 1024;
        } else {
            o.wheel_size = 1024;
        }
    } else {
        o.tick = 1ms;
        if constexpr (requires { o.own_thread; }) o.own_thread = false;
    }
    return o;
}

template <class W>
void drive(W& w, mtp now) {
    if constexpr (requires { w.advance_clock(0ms); }) {
        while (w.advance_clock(0ms)) {
        }
    } else if constexpr (requires { w.advance(now); }) {
        while (w.advance(now) != 0) {
        }
    }  // a threaded timer's worker drives it (hashed_timer runs no expire workload)
}

// The structure holds n timers with deadlines uniform in [10 s, 70 s] (handles kept); a round
// times one batch of one operation, then (untimed) puts things back.
template <class W>
class wheel_rounds final : public ab::rounds {
  public:
    wheel_rounds(std::string workload, std::size_t n) : workload_(std::move(workload)), n_(n) {
        at_ = deadlines(n_ + cold_batch, 1);
        if (workload_ == "expire" || workload_ == "stop") return;  // a fresh wheel each round
        w_ = std::make_unique<W>(options<W>());
        h_.resize(n_ + cold_batch);
        for (std::size_t i = 0; i < n_; ++i) h_[i] = w_->schedule_at(tick_task{&fired}, at_[i]);
    }
    ~wheel_rounds() override {
        if (w_) w_->stop();
    }

    double round() override {
        if (workload_ == "insert") return insert(false);
        if (workload_ == "insert_monotonic") return insert(true);
        if (workload_ == "insert_cold") return insert_cold();
        if (workload_ == "cancel") return cancel();
        if (workload_ == "postpone") return postpone();
        if (workload_ == "cancel_schedule") return cancel_schedule();
        if (workload_ == "expire") return expire(false);
        if (workload_ == "expire_monotonic") return expire(true);
        if (workload_ == "stop") return stop();
        return -1;
    }

  private:
    static constexpr std::size_t batch = 1024;
    static constexpr std::size_t cold_batch = 65536;

    static std::vector<mtp> deadlines(std::size_t n, unsigned seed) {
        std::mt19937_64 rng(seed);
        std::uniform_int_distribution<std::int64_t> us(10'000'000, 70'000'000);
        std::vector<mtp> v(n);
        for (auto& t : v) t = base() + std::chrono::microseconds(us(rng));
        return v;
    }
    static mtp base() { return mtp{1h}; }

    // 1 024 inserts at fresh deadlines (random, or 1 us apart), then cancelled: the next round's
    // nodes come from the pool still in cache, as in bench_compare's insert rows.
    double insert(bool monotonic) {
        const std::size_t shift = (round_++ * 7919) % n_;
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < batch; ++i) {
            const mtp at = monotonic ? base() + 10s + std::chrono::microseconds(shift + i)
                                     : at_[(shift + i) % n_];
            h_[n_ + i] = w_->schedule_at(tick_task{&fired}, at);
        }
        const double ns = ns_since(t0, batch);
        take_back(batch);
        return ns;
    }

    // 65 536 inserts after 32 MiB of other memory went through the cache: nodes, buckets and
    // handles are cold, as when a timer's memory was last used long ago.
    double insert_cold() {
        for (std::size_t i = 0; i < junk_.size(); i += 64) junk_[i] = static_cast<char>(i);
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < cold_batch; ++i)
            h_[n_ + i] = w_->schedule_at(tick_task{&fired}, at_[i]);
        const double ns = ns_since(t0, cold_batch);
        take_back(cold_batch);
        return ns;
    }

    // Back to n pending: as many timers cancelled, the oldest in turn, the new ones taking their
    // slots (as bench_compare's take_back, which says why).
    void take_back(std::size_t count) {
        for (std::size_t i = 0; i < count; ++i) {
            if (oldest_ >= n_) oldest_ = 0;
            std::swap(h_[n_ + i], h_[oldest_++]);
            h_[n_ + i].cancel();
            h_[n_ + i] = delayq::timeout<mclock>{};
        }
    }

    // 1 024 random handles cancelled, then scheduled again (untimed).
    double cancel() {
        std::unordered_set<std::size_t> pick;
        while (pick.size() < std::min(batch, n_)) pick.insert(rng_() % n_);
        const std::vector<std::size_t> v(pick.begin(), pick.end());
        const auto t0 = std::chrono::steady_clock::now();
        for (const std::size_t i : v) h_[i].cancel();
        const double ns = ns_since(t0, v.size());
        for (const std::size_t i : v) h_[i] = w_->schedule_at(tick_task{&fired}, at_[i]);
        return ns;
    }

    // 1 024 random handles cancelled and their tasks scheduled again, pushed back by 1 ms to 1 s
    // (what users write without reschedule(); bench_compare's cancel_schedule row): the old
    // handles are dropped as the new ones take their place.
    double cancel_schedule() {
        std::uniform_int_distribution<std::int64_t> push(1'000, 1'000'000);  // us
        std::vector<std::size_t> v(std::min(batch, n_));
        std::vector<mtp> to(v.size());
        for (std::size_t j = 0; j < v.size(); ++j) {
            v[j] = rng_() % n_;
            mtp d = at_[v[j]] + std::chrono::microseconds(push(rng_));
            if (d > base() + 70s) d -= 60s;
            to[j] = at_[v[j]] = d;
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t j = 0; j < v.size(); ++j) {
            h_[v[j]].cancel();
            h_[v[j]] = w_->schedule_at(tick_task{&fired}, to[j]);
        }
        return ns_since(t0, v.size());
    }

    // 1 024 random handles pushed back to now + 60 s (the idle-connection pattern), the clock 1 ms
    // on each round.
    double postpone() {
        mclock::advance(1ms);
        const mtp to = mclock::now() + 60s;
        std::vector<std::size_t> v(std::min(batch, n_));
        for (auto& i : v) i = rng_() % n_;
        const auto t0 = std::chrono::steady_clock::now();
        for (const std::size_t i : v) (void)h_[i].reschedule_at(to);
        return ns_since(t0, v.size());
    }

    // A fresh wheel with n timers (untimed), then one late pass past all of them. Monotonic:
    // scheduled in deadline order, evenly over the same 60 s (one timeout for every request).
    double expire(bool monotonic) {
        mclock::set(base());
        W w(options<W>());
        std::vector<delayq::timeout<mclock>> h(n_);
        for (std::size_t i = 0; i < n_; ++i) {
            const mtp at = monotonic ? base() + 10s +
                                           std::chrono::microseconds(60'000'000) *
                                               static_cast<std::int64_t>(i) /
                                               static_cast<std::int64_t>(n_)
                                     : at_[i];
            h[i] = w.schedule_at(tick_task{&fired}, at);
        }
        const mtp now = base() + 71s;
        mclock::set(now);
        const auto t0 = std::chrono::steady_clock::now();
        drive(w, now);
        return ns_since(t0, n_);
    }

    // A fresh wheel with n timers (untimed, handles dropped), then stop() and its handles dropped.
    double stop() {
        mclock::set(base());
        W w(options<W>());
        for (std::size_t i = 0; i < n_; ++i) w.schedule_at(tick_task{&fired}, at_[i]);
        const auto t0 = std::chrono::steady_clock::now();
        w.stop();
        return ns_since(t0, n_);
    }

    std::string workload_;
    std::size_t n_;
    std::vector<mtp> at_;
    std::unique_ptr<W> w_;
    std::vector<delayq::timeout<mclock>> h_;
    std::mt19937_64 rng_{3};
    std::size_t round_ = 0;
    std::size_t oldest_ = 0;  // take_back() cancels from here on
    std::vector<char> junk_ = std::vector<char>(std::size_t{32} << 20);
};

}  // namespace

std::unique_ptr<ab::rounds> AB_MAKE(const std::string& structure, const std::string& workload,
                                    std::size_t n) {
    mclock::set(mtp{1h});
    if (structure == "hashed")
        return std::make_unique<wheel_rounds<delayq::hashed_wheel<mclock>>>(workload, n);
    if (structure == "hierarchical")
        return std::make_unique<wheel_rounds<hierarchical_core>>(workload, n);
    if (structure == "hashed_timer" && workload != "expire" && workload != "expire_monotonic" &&
        workload != "stop")
        return std::make_unique<wheel_rounds<hashed_timer>>(workload, n);
    return nullptr;
}
