// delay_queue against the floor it pays for: a std::priority_queue under a std::mutex.
//
// put: the structure holds N elements; a batch of puts is timed, then (untimed) the same number of
// elements is popped so that it holds N again. Deadlines are precomputed, uniform in [10 s, 70 s].
// take: the structure holds N due elements; a batch of takes is timed, then refilled untimed.
// Both run on manual_clock, so that "due" is set by the benchmark and the clock read is an atomic
// load for both (steady_clock::now() would add ~40 ns to every take, the same for both).
#include <benchmark/benchmark.h>

#include <chrono>
#include <delayq/delay_queue.hpp>
#include <delayq/manual_clock.hpp>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <vector>

namespace {

using clock_type = delayq::manual_clock;
using tp = clock_type::time_point;

struct item {
    std::uint64_t payload;
    tp at;
    tp deadline() const noexcept { return at; }
};

// What a C++ user writes without delayq.
class locked_heap {
    struct entry {
        tp at;
        std::uint64_t seq;
        item value;
        bool operator<(const entry& o) const noexcept {  // priority_queue is a max-heap
            return at > o.at || (at == o.at && seq > o.seq);
        }
    };

  public:
    bool put(const item& v) {
        std::lock_guard lk(m_);
        q_.push(entry{v.at, seq_++, v});
        return true;
    }
    std::optional<item> poll() {
        std::lock_guard lk(m_);
        if (q_.empty() || q_.top().at > clock_type::now()) return std::nullopt;
        item v = q_.top().value;
        q_.pop();
        return v;
    }

  private:
    std::mutex m_;
    std::priority_queue<entry> q_;
    std::uint64_t seq_ = 0;
};

std::vector<item> random_items(std::size_t n, tp base, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int64_t> ms(10'000, 70'000);
    std::vector<item> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = item{i, base + std::chrono::milliseconds(ms(rng))};
    return v;
}

constexpr std::size_t batch = 1024;

using dq = delayq::delay_queue<item, clock_type>;

// Takes out the first k elements, due or not.
template <class Q>
void shrink(Q& q, std::size_t k) {
    const tp now = clock_type::now();
    clock_type::set(tp::max());
    for (std::size_t i = 0; i < k; ++i) q.poll();
    clock_type::set(now);
}

template <class Q>
void put_at_n(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    clock_type::set(tp{std::chrono::hours(1)});
    const tp base = clock_type::now();
    auto fill = random_items(n, base, 1);
    auto more = random_items(1 << 16, base, 2);
    Q q;
    for (auto& v : fill) q.put(v);
    std::size_t next = 0;
    for (auto _ : state) {
        state.PauseTiming();
        // Keep the size at N: take out a batch (not timed), then time a batch of puts.
        shrink(q, batch);
        state.ResumeTiming();
        for (std::size_t i = 0; i < batch; ++i) {
            benchmark::DoNotOptimize(q.put(more[next]));
            next = (next + 1) & (more.size() - 1);
        }
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
    state.counters["ns_per_put"] =
        benchmark::Counter(static_cast<double>(state.iterations() * batch),
                           benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

template <class Q>
void take_due_at_n(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    clock_type::set(tp{std::chrono::hours(1)});
    auto fill = random_items(n + batch, tp{}, 3);  // all due: deadlines end at 70 s
    Q q;
    for (std::size_t i = 0; i < n; ++i) q.put(fill[i]);
    for (auto _ : state) {
        state.PauseTiming();
        for (std::size_t i = 0; i < batch; ++i) q.put(fill[n + i]);
        state.ResumeTiming();
        for (std::size_t i = 0; i < batch; ++i) benchmark::DoNotOptimize(q.poll());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

void sizes(benchmark::internal::Benchmark* b) {
    b->Arg(1'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMicrosecond);
}

BENCHMARK(put_at_n<dq>)->Name("put/delay_queue")->Apply(sizes);
BENCHMARK(put_at_n<locked_heap>)->Name("put/locked_priority_queue")->Apply(sizes);
BENCHMARK(take_due_at_n<dq>)->Name("take_due/delay_queue")->Apply(sizes);
BENCHMARK(take_due_at_n<locked_heap>)->Name("take_due/locked_priority_queue")->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
