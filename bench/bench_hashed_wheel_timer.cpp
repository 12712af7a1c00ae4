// hashed_wheel_timer against delay_queue and a locked std::priority_queue.
//
//   schedule_at/N   insert with a precomputed deadline into a structure holding N pending
//   schedule/N      the same with a relative delay (reads the clock), timer only
//   cancel/N/R      cancel() of a pending task, in schedule order (R=0) or random order (R=1);
//                   the node stays alive with the handle, so this is unlink + destroying the task
//   expire/N        N tasks due over one second, run by passes at every 1 ms: time per task run
//   memory/N        heap bytes per pending task (requested; and as malloc really hands them out)
//   idle_wakeups    worker wake-ups in 1 s, 1 ms tick, nothing pending / one task an hour away
//
// Deadlines are random within a window an hour ahead, so the timer's worker sleeps throughout.
// To hold N steady, inserts are undone in batches (up to 4096, N .. 1.5 N pending) outside the
// timed region (cancel for the wheels, pop of the head for the heaps, which is as good: the window
// stays the same). expire drives the thread-free core (hashed_wheel<manual_clock>) so that it
// measures the structure, not the scheduler.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <delayq/delay_queue.hpp>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/manual_clock.hpp>
#include <functional>
#include <mutex>
#include <new>
#include <queue>
#include <random>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// ---- allocation accounting (on only inside the memory benchmarks) ----
namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::int64_t> g_requested{0}, g_usable{0};
}  // namespace

// Not inlined: g++ would then see a free() of what `new` returned (-Wmismatched-new-delete).
[[gnu::noinline]] void* operator new(std::size_t n) {
    void* p = std::malloc(n ? n : 1);
    if (!p) throw std::bad_alloc();
    if (g_counting.load(std::memory_order_relaxed)) {
        g_requested.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
        g_usable.fetch_add(static_cast<std::int64_t>(malloc_usable_size(p)) + 8,
                           std::memory_order_relaxed);
    }
    return p;
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
    if (p && g_counting.load(std::memory_order_relaxed))
        g_usable.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)) + 8,
                           std::memory_order_relaxed);
    std::free(p);
}
void* operator new(std::size_t n, std::align_val_t a) {
    void* p =
        std::aligned_alloc(static_cast<std::size_t>(a), (n + static_cast<std::size_t>(a) - 1) &
                                                            ~(static_cast<std::size_t>(a) - 1));
    if (!p) throw std::bad_alloc();
    if (g_counting.load(std::memory_order_relaxed)) {
        g_requested.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
        g_usable.fetch_add(static_cast<std::int64_t>(malloc_usable_size(p)) + 8,
                           std::memory_order_relaxed);
    }
    return p;
}
void operator delete(void* p, std::align_val_t) noexcept {
    operator delete(p);
}
void operator delete(void* p, std::size_t n, std::align_val_t) noexcept {
    if (p && g_counting.load(std::memory_order_relaxed))
        g_requested.fetch_sub(static_cast<std::int64_t>(n), std::memory_order_relaxed);
    operator delete(p);
}
void operator delete(void* p, std::size_t n) noexcept {
    if (p && g_counting.load(std::memory_order_relaxed))
        g_requested.fetch_sub(static_cast<std::int64_t>(n), std::memory_order_relaxed);
    operator delete(p);
}

namespace {

// Inserts are undone in batches of this many (N .. 1.5 N pending).
std::size_t batch_for(std::size_t n) {
    return std::min<std::size_t>(4096, std::max<std::size_t>(n / 2, 1));
}

// A task with a small capture (one pointer), as a timer's user typically has.
struct small_task {
    std::atomic<std::uint64_t>* counter;
    void operator()() const { counter->fetch_add(1, std::memory_order_relaxed); }
};

std::vector<steady::duration> random_offsets(std::size_t n, std::uint32_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int64_t> d(
        0, std::chrono::duration_cast<steady::duration>(10s).count());
    std::vector<steady::duration> v(n);
    for (auto& x : v) x = steady::duration{d(rng)};
    return v;
}

delayq::hashed_wheel_options<> timer_options() {
    delayq::hashed_wheel_options<> o;  // the defaults: 100 ms tick, 512 buckets
    return o;
}

// ---- the locked std::priority_queue peer ----
template <class Clock>
class locked_heap {
  public:
    using time_point = typename Clock::time_point;
    struct entry {
        time_point at;
        std::uint64_t seq;
        std::function<void()> fn;
        bool operator<(const entry& o) const { return at > o.at || (at == o.at && seq > o.seq); }
    };
    void push(std::function<void()> f, time_point at) {
        std::lock_guard lk(m_);
        q_.push(entry{at, seq_++, std::move(f)});
    }
    void pop_head() {
        std::lock_guard lk(m_);
        q_.pop();
    }
    std::size_t expire(time_point now) {
        std::size_t n = 0;
        std::unique_lock lk(m_);
        while (!q_.empty() && q_.top().at <= now) {
            auto fn = std::move(const_cast<entry&>(q_.top()).fn);
            q_.pop();
            lk.unlock();
            fn();
            ++n;
            lk.lock();
        }
        return n;
    }
    std::size_t size() const {
        std::lock_guard lk(m_);
        return q_.size();
    }

  private:
    mutable std::mutex m_;
    std::priority_queue<entry> q_;
    std::uint64_t seq_ = 0;
};

using dq_item = delayq::delayed<std::function<void()>, delayq::manual_clock>;

// ---- schedule_at ----

void BM_wheel_schedule_at(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const std::size_t batch = batch_for(n);
    std::atomic<std::uint64_t> c{0};
    delayq::hashed_wheel_timer<> t(timer_options());
    const auto base = steady::now() + 1h;
    auto offs = random_offsets(n + (1 << 16), 1);
    for (std::size_t i = 0; i < n; ++i) t.schedule_at(small_task{&c}, base + offs[i]);
    std::vector<delayq::timeout<>> mine;
    mine.reserve(batch);
    std::size_t k = n;
    for (auto _ : state) {
        mine.push_back(t.schedule_at(small_task{&c}, base + offs[k]));
        if (++k == offs.size()) k = n;
        if (mine.size() == batch) {
            state.PauseTiming();
            for (auto& h : mine) h.cancel();
            mine.clear();
            state.ResumeTiming();
        }
    }
    state.counters["pending"] = static_cast<double>(t.pending());
}

void BM_wheel_schedule(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const std::size_t batch = batch_for(n);
    std::atomic<std::uint64_t> c{0};
    delayq::hashed_wheel_timer<> t(timer_options());
    auto offs = random_offsets(n + (1 << 16), 1);
    for (std::size_t i = 0; i < n; ++i) t.schedule(small_task{&c}, 1h + offs[i]);
    std::vector<delayq::timeout<>> mine;
    mine.reserve(batch);
    std::size_t k = n;
    for (auto _ : state) {
        mine.push_back(t.schedule(small_task{&c}, 1h + offs[k]));
        if (++k == offs.size()) k = n;
        if (mine.size() == batch) {
            state.PauseTiming();
            for (auto& h : mine) h.cancel();
            mine.clear();
            state.ResumeTiming();
        }
    }
}

void BM_heap_push(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const std::size_t batch = batch_for(n);
    std::atomic<std::uint64_t> c{0};
    locked_heap<steady> q;
    const auto base = steady::now() + 1h;
    auto offs = random_offsets(n + (1 << 16), 1);
    for (std::size_t i = 0; i < n; ++i) q.push(small_task{&c}, base + offs[i]);
    std::size_t k = n, since = 0;
    for (auto _ : state) {
        q.push(small_task{&c}, base + offs[k]);
        if (++k == offs.size()) k = n;
        if (++since == batch) {
            state.PauseTiming();
            for (std::size_t i = 0; i < batch; ++i) q.pop_head();
            since = 0;
            state.ResumeTiming();
        }
    }
}

void BM_delay_queue_put(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const std::size_t batch = batch_for(n);
    std::atomic<std::uint64_t> c{0};
    delayq::delay_queue<dq_item, delayq::manual_clock> q;
    delayq::manual_clock::reset();
    const auto base = delayq::manual_clock::now() + 1h;
    auto offs = random_offsets(n + (1 << 16), 1);
    for (std::size_t i = 0; i < n; ++i) q.put(dq_item{small_task{&c}, base + offs[i]});
    std::size_t k = n, since = 0;
    for (auto _ : state) {
        q.put(dq_item{small_task{&c}, base + offs[k]});
        if (++k == offs.size()) k = n;
        if (++since == batch) {
            state.PauseTiming();
            delayq::manual_clock::set(delayq::manual_clock::time_point::max());
            for (std::size_t i = 0; i < batch; ++i) benchmark::DoNotOptimize(q.poll());
            delayq::manual_clock::reset();
            since = 0;
            state.ResumeTiming();
        }
    }
}

// ---- cancel ----

void BM_wheel_cancel(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    std::atomic<std::uint64_t> c{0};
    delayq::hashed_wheel_timer<> t(timer_options());
    const auto base = steady::now() + 1h;
    auto offs = random_offsets(n, 2);
    std::vector<delayq::timeout<>> hs;
    hs.reserve(n);
    std::mt19937 rng(3);
    auto fill = [&] {
        hs.clear();
        for (std::size_t i = 0; i < n; ++i)
            hs.push_back(t.schedule_at(small_task{&c}, base + offs[i]));
        if (state.range(1))
            std::shuffle(hs.begin(), hs.end(), rng);  // random order: cache misses included
    };
    fill();
    std::size_t k = 0;
    for (auto _ : state) {
        benchmark::DoNotOptimize(hs[k].cancel());
        if (++k == n) {
            state.PauseTiming();
            fill();
            k = 0;
            state.ResumeTiming();
        }
    }
}

// ---- expiry throughput ----

template <class Fill, class Expire>
void expire_loop(benchmark::State& state, Fill fill, Expire expire) {
    const auto n = static_cast<std::size_t>(state.range(0));
    std::uint64_t fired = 0;
    for (auto _ : state) {
        state.PauseTiming();
        delayq::manual_clock::reset();
        fill(n);
        state.ResumeTiming();
        for (int ms = 0; ms <= 1000; ++ms) {
            delayq::manual_clock::set(delayq::manual_clock::time_point{} +
                                      std::chrono::milliseconds(ms));
            fired += expire(delayq::manual_clock::now());
        }
    }
    if (fired != n * static_cast<std::uint64_t>(state.iterations()))
        state.SkipWithError("lost tasks");
    state.SetItemsProcessed(static_cast<std::int64_t>(fired));
}

void BM_wheel_expire(benchmark::State& state) {
    std::atomic<std::uint64_t> c{0};
    delayq::hashed_wheel_options<delayq::manual_clock> o;
    o.tick = 1ms;
    o.wheel_size = 1024;
    std::unique_ptr<delayq::hashed_wheel<delayq::manual_clock>> w;
    auto offs = random_offsets(static_cast<std::size_t>(state.range(0)), 4);
    expire_loop(
        state,
        [&](std::size_t n) {
            w.reset();
            w = std::make_unique<delayq::hashed_wheel<delayq::manual_clock>>(o);
            for (std::size_t i = 0; i < n; ++i)
                w->schedule_at(small_task{&c}, delayq::manual_clock::time_point{} + offs[i] / 10);
        },
        [&](auto now) { return w->advance(now); });
}

void BM_heap_expire(benchmark::State& state) {
    std::atomic<std::uint64_t> c{0};
    std::unique_ptr<locked_heap<delayq::manual_clock>> q;
    auto offs = random_offsets(static_cast<std::size_t>(state.range(0)), 4);
    expire_loop(
        state,
        [&](std::size_t n) {
            q = std::make_unique<locked_heap<delayq::manual_clock>>();
            for (std::size_t i = 0; i < n; ++i)
                q->push(small_task{&c}, delayq::manual_clock::time_point{} + offs[i] / 10);
        },
        [&](auto now) { return q->expire(now); });
}

void BM_delay_queue_expire(benchmark::State& state) {
    std::atomic<std::uint64_t> c{0};
    std::unique_ptr<delayq::delay_queue<dq_item, delayq::manual_clock>> q;
    auto offs = random_offsets(static_cast<std::size_t>(state.range(0)), 4);
    std::vector<dq_item> out;
    expire_loop(
        state,
        [&](std::size_t n) {
            q = std::make_unique<delayq::delay_queue<dq_item, delayq::manual_clock>>();
            for (std::size_t i = 0; i < n; ++i)
                q->put(dq_item{small_task{&c}, delayq::manual_clock::time_point{} + offs[i] / 10});
        },
        [&](auto) {
            out.clear();
            const std::size_t k = q->drain_to(std::back_inserter(out));
            for (auto& x : out) x.value();
            return k;
        });
}

// ---- memory ----

template <class Fill>
void memory_of(benchmark::State& state, Fill fill) {
    const auto n = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
        g_requested = 0;
        g_usable = 0;
        g_counting = true;
        fill(n, state);
        g_counting = false;
    }
}

void BM_wheel_memory(benchmark::State& state) {
    std::atomic<std::uint64_t> c{0};
    auto offs = random_offsets(static_cast<std::size_t>(state.range(0)), 5);
    memory_of(state, [&](std::size_t n, benchmark::State& st) {
        delayq::hashed_wheel_timer<> t(timer_options());
        const auto base = steady::now() + 1h;
        for (std::size_t i = 0; i < n; ++i) t.schedule_at(small_task{&c}, base + offs[i]);
        st.counters["B_requested"] =
            static_cast<double>(g_requested.load()) / static_cast<double>(n);
        st.counters["B_malloc"] = static_cast<double>(g_usable.load()) / static_cast<double>(n);
        t.stop();
    });
}

void BM_heap_memory(benchmark::State& state) {
    std::atomic<std::uint64_t> c{0};
    auto offs = random_offsets(static_cast<std::size_t>(state.range(0)), 5);
    memory_of(state, [&](std::size_t n, benchmark::State& st) {
        locked_heap<steady> q;
        const auto base = steady::now() + 1h;
        for (std::size_t i = 0; i < n; ++i) q.push(small_task{&c}, base + offs[i]);
        st.counters["B_requested"] =
            static_cast<double>(g_requested.load()) / static_cast<double>(n);
        st.counters["B_malloc"] = static_cast<double>(g_usable.load()) / static_cast<double>(n);
    });
}

void BM_delay_queue_memory(benchmark::State& state) {
    std::atomic<std::uint64_t> c{0};
    auto offs = random_offsets(static_cast<std::size_t>(state.range(0)), 5);
    memory_of(state, [&](std::size_t n, benchmark::State& st) {
        delayq::delay_queue<dq_item, delayq::manual_clock> q;
        for (std::size_t i = 0; i < n; ++i)
            q.put(dq_item{small_task{&c}, delayq::manual_clock::time_point{} + 1h + offs[i]});
        st.counters["B_requested"] =
            static_cast<double>(g_requested.load()) / static_cast<double>(n);
        st.counters["B_malloc"] = static_cast<double>(g_usable.load()) / static_cast<double>(n);
    });
}

// ---- idle wake-ups ----

void BM_idle_wakeups(benchmark::State& state) {
    for (auto _ : state) {
        delayq::hashed_wheel_options<> o;
        o.tick = 1ms;
        delayq::hashed_wheel_timer<> t(o);
        std::atomic<std::uint64_t> c{0};
        t.schedule(small_task{&c}, 0ms);  // start the worker, then leave it idle
        while (c.load() == 0) std::this_thread::yield();
        std::this_thread::sleep_for(10ms);
        if (state.range(0)) t.schedule(small_task{&c}, 1h);
        const auto w0 = t.wakeups();
        std::this_thread::sleep_for(1s);
        state.counters["wakeups_per_s"] = static_cast<double>(t.wakeups() - w0);
    }
}

void sizes(benchmark::internal::Benchmark* b) {
    for (std::int64_t n : {1'000, 10'000, 100'000, 1'000'000}) b->Arg(n);
    if (const char* e = std::getenv("DELAYQ_BENCH_10M"); e && *e == '1') b->Arg(10'000'000);
}

}  // namespace

BENCHMARK(BM_wheel_schedule_at)->Apply(sizes);
BENCHMARK(BM_heap_push)->Apply(sizes);
BENCHMARK(BM_delay_queue_put)->Apply(sizes);
BENCHMARK(BM_wheel_schedule)->Apply(sizes);
BENCHMARK(BM_wheel_cancel)->Apply([](benchmark::internal::Benchmark* b) {
    for (std::int64_t n : {1'000, 10'000, 100'000, 1'000'000})
        for (std::int64_t r : {0, 1}) b->Args({n, r});
});
BENCHMARK(BM_wheel_expire)->Arg(10'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_heap_expire)->Arg(10'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_delay_queue_expire)->Arg(10'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_wheel_memory)->Arg(1'000'000)->Iterations(1);
BENCHMARK(BM_heap_memory)->Arg(1'000'000)->Iterations(1);
BENCHMARK(BM_delay_queue_memory)->Arg(1'000'000)->Iterations(1);
BENCHMARK(BM_idle_wakeups)->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
