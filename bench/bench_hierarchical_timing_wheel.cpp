// hierarchical_timing_wheel side by side with delay_queue (the binary heap it is built on) and the
// thread-free hashed_wheel, on manual_clock (reading the clock is an atomic load for all three).
//
// schedule/<S>/N   the structure holds N pending timers (deadlines uniform in [10 s, 70 s] from
//                  now); a batch of 1024 schedule_at calls with precomputed deadlines is timed,
//                  then (untimed) taken out again, so N stays N. Per schedule.
// cancel/<S>/N     N pending; 1024 random handles are cancelled (timed), then re-scheduled
//                  (untimed). Per cancel. (delay_queue has no handles: not measured.)
// expire/<S>/N     N pending (scheduled untimed); the clock jumps past them all and the structure
//                  is driven until all have fired (timed). Per fired timer. For the wheels that
//                  includes running the task and freeing its node; for the heap, one pop.
// expire_stepped/<S>/N  the same, with the clock moved one 1 ms tick at a time over the 60 s,
//                  driving after each step: the steady state of a live timer.
//
// The wheels, both thread-free (driven by advance() on the benchmark's thread): tick 1 ms; the
// hierarchical wheel (hierarchical_wheel; its rows keep the name hierarchical_timing_wheel) with
// wheel_size 20 (levels of 20 ms, 400 ms, 8 s, 160 s); the hashed wheel with 65536 buckets (one
// round covers 65 s).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <delayq/delay_queue.hpp>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

namespace {

using mclock = delayq::manual_clock;
using mtp = mclock::time_point;
using namespace std::chrono_literals;

constexpr std::size_t batch = 1024;
const mtp base{1h};

std::uint64_t fired = 0;  // single-threaded: every structure here runs tasks on the caller
struct task {
    std::uint64_t* counter;
    void operator()() const noexcept { ++*counter; }
};

std::vector<mtp> deadlines(std::size_t n, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int64_t> us(10'000'000, 70'000'000);
    std::vector<mtp> v(n);
    for (auto& t : v) t = base + std::chrono::microseconds(us(rng));
    return v;
}

struct item {
    mtp at;
    mtp deadline() const noexcept { return at; }
};

// ---- the structures behind one interface -------------------------------------------------------

class heap {
  public:
    explicit heap(std::size_t) {}
    void insert(std::size_t, mtp at) { q_.put(item{at}); }
    void take_back(std::size_t, std::size_t count) {  // the `count` earliest, due or not
        const mtp now = mclock::now();
        mclock::set(mtp::max());
        for (std::size_t i = 0; i < count; ++i) q_.poll();
        mclock::set(now);
    }
    std::size_t expire(mtp now) {
        mclock::set(now);
        std::size_t k = 0;
        while (auto v = q_.poll()) {
            task{&fired}();
            ++k;
        }
        return k;
    }

  private:
    delayq::delay_queue<item, mclock> q_;
};

template <class W>
class wheel {
  public:
    explicit wheel(std::size_t capacity) : w_(options()) { h_.resize(capacity); }
    ~wheel() { w_.stop(); }
    void insert(std::size_t slot, mtp at) { h_[slot] = w_.schedule_at(task{&fired}, at); }
    void cancel(std::size_t slot) { h_[slot].cancel(); }
    void take_back(std::size_t first, std::size_t count) {
        for (std::size_t i = 0; i < count; ++i) h_[first + i].cancel();
    }
    std::size_t expire(mtp now) {
        const auto before = fired;
        mclock::set(now);
        w_.advance(now);
        return static_cast<std::size_t>(fired - before);
    }

  private:
    static typename W::options options() {
        typename W::options o;
        o.tick = 1ms;
        if constexpr (std::is_same_v<W, delayq::hashed_wheel<mclock>>) {
            o.wheel_size = 65536;
        } else {
            o.wheel_size = 20;
        }
        return o;
    }
    W w_;
    std::vector<delayq::timeout<mclock>> h_;
};

using htw = wheel<delayq::hierarchical_wheel<mclock>>;
using hashed = wheel<delayq::hashed_wheel<mclock>>;

// ---- workloads ---------------------------------------------------------------------------------

template <class S>
void schedule(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    const auto at = deadlines(n + batch, 1);
    S s(n + batch);
    for (std::size_t i = 0; i < n; ++i) s.insert(i, at[i]);
    std::size_t round = 0;
    for (auto _ : state) {
        const std::size_t shift = (round++ * 7919) % n;
        for (std::size_t i = 0; i < batch; ++i) s.insert(n + i, at[(shift + i) % n]);
        state.PauseTiming();
        s.take_back(n, batch);
        state.ResumeTiming();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

template <class S>
void cancel(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    const auto at = deadlines(n, 2);
    S s(n);
    for (std::size_t i = 0; i < n; ++i) s.insert(i, at[i]);
    std::mt19937_64 rng(3);
    std::vector<std::size_t> victims(std::min(batch, n / 2));
    std::vector<char> picked(n, 0);
    for (auto _ : state) {
        state.PauseTiming();
        for (auto& v : victims) {
            do v = rng() % n;
            while (picked[v]);
            picked[v] = 1;
        }
        state.ResumeTiming();
        for (auto v : victims) s.cancel(v);
        state.PauseTiming();
        for (auto v : victims) {
            s.insert(v, at[v]);
            picked[v] = 0;
        }
        state.ResumeTiming();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * victims.size()));
}

template <class S>
void expire(benchmark::State& state, bool stepped) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto at = deadlines(n, 4);
    std::size_t total = 0;
    for (auto _ : state) {
        state.PauseTiming();
        mclock::set(base);
        auto s = std::make_unique<S>(n);
        for (std::size_t i = 0; i < n; ++i) s->insert(i, at[i]);
        state.ResumeTiming();
        if (stepped) {
            for (mtp t = base + 1ms; t <= base + 71s; t += 1ms) total += s->expire(t);
        } else {
            total += s->expire(base + 71s);
        }
        state.PauseTiming();
        s.reset();
        state.ResumeTiming();
    }
    if (total != n * state.iterations()) state.SkipWithError("not every timer fired");
    state.SetItemsProcessed(static_cast<std::int64_t>(total));
}

void sizes(benchmark::internal::Benchmark* b) {
    for (long n : {1'000L, 10'000L, 100'000L, 1'000'000L, 10'000'000L}) b->Arg(n);
}

template <class S>
void register_all(const char* name) {
    const std::string s = name;
    benchmark::RegisterBenchmark(("schedule/" + s).c_str(), schedule<S>)->Apply(sizes);
    if constexpr (requires(S & x) { x.cancel(std::size_t{}); })
        benchmark::RegisterBenchmark(("cancel/" + s).c_str(), cancel<S>)->Apply(sizes);
    benchmark::RegisterBenchmark(("expire/" + s).c_str(),
                                 [](benchmark::State& st) { expire<S>(st, false); })
        ->Apply(sizes)
        ->Iterations(1);
    benchmark::RegisterBenchmark(("expire_stepped/" + s).c_str(),
                                 [](benchmark::State& st) { expire<S>(st, true); })
        ->Arg(1'000)
        ->Arg(1'000'000)
        ->Iterations(1);
}

}  // namespace

int main(int argc, char** argv) {
    register_all<htw>("hierarchical_timing_wheel");
    register_all<heap>("delay_queue");
    register_all<hashed>("hashed_wheel");
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
