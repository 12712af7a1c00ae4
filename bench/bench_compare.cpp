// Heap against wheels: every structure of delayq and the two baselines a C++ user would pick
// instead (a std::priority_queue under a std::mutex; Boost.Asio steady timers, when Boost is
// found), under the same workloads, named "workload/structure/N" for bench/compare.
//
// Method (see README "Performance"):
// - Everything runs on manual_clock, so "due" is set by the benchmark, nothing sleeps, and reading
//   the clock is an atomic load for every structure alike; the one workload about the clock read
//   (schedule_vs_schedule_at) uses steady_clock.
// - Insert workloads keep the structure at N: a batch of B inserts is timed, then (untimed) B
//   elements are taken out again: the B earliest popped for heaps, the B oldest timers cancelled
//   (and their handles dropped) for the wheels, so that the new ones stay pending in both. A
//   timer's insert is schedule_at() with its handle kept, as users do.
// - Cancel: the structure holds N; B random handles are cancelled (timed), then re-inserted.
//   A heap has no handles: delay_queue cancels a batch with one remove_if (O(N) per batch); the
//   locked heap marks tombstones in a hash set, as its users do.
// - Expire: N tasks with deadlines in [10 s, 70 s] are scheduled (untimed); the clock is moved past
//   them all and the structure is driven until all have fired (timed); per fired timer. The
//   threaded hashed timer's worker runs them while the benchmark's thread waits mostly asleep: a
//   waiter that looked at the fired count after every yield() took its line from the worker's
//   core each time, 15-20 ns per timer at 1M that was the benchmark's, not the timer's.
// - bytes_per_timer: glibc's in-use bytes (mallinfo2: heap and mapped blocks) after filling N,
//   minus before, over N, with handles dropped where the structure allows it (the user's handle
//   is not counted).
// - Wall-clock time (UseRealTime): the hashed wheel's expiry runs on its worker thread.
// - Configurations: hashed_wheel_timer at Netty's default 100 ms tick with 1024 buckets (one
//   rotation spans the 60 s of deadlines); the hierarchical wheel at Kafka's defaults (1 ms tick,
//   20 buckets per level), thread-free (hierarchical_wheel), driven by advance() on the
//   benchmark's thread. Its rows keep the name hierarchical_timing_wheel, as the thread-free hashed
//   wheel's keep hashed_wheel_timer's: the same code does the work, and bench/compare.py and the
//   committed results name the structures so.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <delayq/delayq.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <vector>

#if __has_include(<boost/asio.hpp>) && !defined(DELAYQ_BENCH_NO_ASIO)
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#define DELAYQ_BENCH_ASIO 1
#endif

namespace {

using mclock = delayq::manual_clock;
using mtp = mclock::time_point;
using namespace std::chrono_literals;

constexpr std::size_t batch = 1024;

// Allocations made by this thread (every operator new below counts one): the reschedule and
// periodic workloads report how many a timed operation made.
thread_local std::uint64_t allocations = 0;

std::atomic<std::uint64_t> fired{0};
struct tick_task {  // the callable every timer runs: a small capture, as the goals assume
    std::atomic<std::uint64_t>* counter;
    void operator()() const noexcept { counter->fetch_add(1, std::memory_order_relaxed); }
};

// Bytes glibc has handed out: small blocks (uordblks) and blocks it mapped on their own (hblkhd).
// Not the room a wheel reserves for its passes, which it maps itself and which is resident only
// while a late pass uses it (detail/huge_pages.hpp).
std::size_t heap_in_use() {
    const auto m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

// Resident bytes of the process (/proc/self/statm; 0 where it cannot be read). Unlike
// heap_in_use(), it leaves out what is mapped but never touched, and it counts the room a wheel
// maps for its passes once a pass touches it. It reads low when a row reuses memory that earlier
// rows freed (glibc keeps it), so the goal reads heap_in_use(), which since main() fixes the mmap
// threshold counts no slack around 2 MiB-aligned blocks.
std::size_t resident() {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return 0;
    long pages = 0, in_memory = 0;
    const bool ok = std::fscanf(f, "%ld %ld", &pages, &in_memory) == 2;
    std::fclose(f);
    return ok ? static_cast<std::size_t>(in_memory) *
                    static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))
              : 0;
}

}  // namespace

void* operator new(std::size_t n) {
    ++allocations;
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
    ++allocations;
    const auto al = static_cast<std::size_t>(a);
    if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
    return ::operator new(n);
}
void* operator new[](std::size_t n, std::align_val_t a) {
    return ::operator new(n, a);
}
// Every operator delete frees through one out-of-line function, so that g++ does not see free()
// (or a plain delete) meet a pointer from another operator new when it inlines.
[[gnu::noinline]] static void release_block(void* p) noexcept {
    std::free(p);
}
void operator delete(void* p) noexcept {
    release_block(p);
}
void operator delete(void* p, std::size_t) noexcept {
    release_block(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
    release_block(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
    release_block(p);
}
void operator delete[](void* p) noexcept {
    release_block(p);
}
void operator delete[](void* p, std::size_t) noexcept {
    release_block(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
    release_block(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
    release_block(p);
}

namespace {

// ---- the structures, behind one small interface ----------------------------------------------
// insert(slot, at): schedule something due at `at`; slot names it for cancel(slot).
// cancel(slot); take_back(first, count): back to `first` pending, slots first..first+count empty
// (untimed refill); expire_all(now, expected): drive until `expected` have fired.

struct item {
    std::uint64_t slot;
    mtp at;
    mtp deadline() const noexcept { return at; }
};

class locked_heap {
    struct entry {
        mtp at;
        std::uint64_t seq;
        item value;
        bool operator<(const entry& o) const noexcept {
            return at > o.at || (at == o.at && seq > o.seq);
        }
    };

  public:
    static constexpr const char* name = "locked_priority_queue";
    explicit locked_heap(std::size_t) {}
    void insert(std::size_t slot, mtp at) {
        std::lock_guard lk(m_);
        q_.push(entry{at, seq_++, item{slot, at}});
    }
    void cancel(std::size_t slot) {
        std::lock_guard lk(m_);
        dead_.insert(slot);
    }
    void take_back(std::size_t, std::size_t count) {
        std::lock_guard lk(m_);
        for (std::size_t i = 0; i < count && !q_.empty(); ++i) q_.pop();
    }
    void restore(std::size_t slot, mtp at) {
        std::lock_guard lk(m_);
        dead_.erase(slot);
        (void)at;
    }
    std::size_t expire_all(mtp now, std::size_t) {
        std::size_t n = 0;
        for (;;) {
            std::lock_guard lk(m_);
            if (q_.empty() || q_.top().at > now) return n;
            if (!dead_.erase(q_.top().value.slot)) {
                tick_task{&fired}();
                ++n;
            }
            q_.pop();
        }
    }

  private:
    std::mutex m_;
    std::priority_queue<entry> q_;
    std::unordered_set<std::size_t> dead_;
    std::uint64_t seq_ = 0;
};

class delay_queue_adapter {
  public:
    static constexpr const char* name = "delay_queue";
    explicit delay_queue_adapter(std::size_t) {}
    void insert(std::size_t slot, mtp at) { q_.put(item{slot, at}); }
    void cancel_batch(const std::vector<std::size_t>& slots) {
        std::unordered_set<std::size_t> s(slots.begin(), slots.end());
        q_.remove_if([&](const item& v) { return s.count(v.slot) != 0; });
    }
    void take_back(std::size_t, std::size_t count) {
        const mtp now = mclock::now();
        mclock::set(mtp::max());
        for (std::size_t i = 0; i < count; ++i) q_.poll();
        mclock::set(now);
    }
    void restore(std::size_t slot, mtp at) { insert(slot, at); }
    std::size_t expire_all(mtp now, std::size_t) {
        mclock::set(now);
        std::size_t n = 0;
        while (auto v = q_.poll()) {
            tick_task{&fired}();
            ++n;
        }
        return n;
    }

  private:
    delayq::delay_queue<item, mclock> q_;
};

// Both wheels have the same options' fields; the configurations differ by wheel.
template <class Timer>
constexpr bool is_hashed =
    std::is_same_v<typename Timer::options, delayq::hashed_wheel_options<typename Timer::clock>>;

// Both wheels: schedule_at + handles; they differ in how expiry is driven.
template <class Timer>
class wheel_adapter {
  public:
    explicit wheel_adapter(std::size_t capacity) : timer_(make_options()) {
        handles_.resize(capacity);
    }
    ~wheel_adapter() { timer_.stop(); }

    void insert(std::size_t slot, mtp at) {
        handles_[slot] = timer_.schedule_at(tick_task{&fired}, at);
    }
    void insert_dropping_handle(mtp at) { timer_.schedule_at(tick_task{&fired}, at); }
    void cancel(std::size_t slot) { handles_[slot].cancel(); }
    void cancel_and_drop(std::size_t slot) {  // the handle's reference goes too: the block is free
        handles_[slot].cancel();
        handles_[slot] = delayq::timeout<mclock>{};
    }
    void reschedule(std::size_t slot, mtp at) { handles_[slot].reschedule_at(at); }
    void cancel_and_insert(std::size_t slot, mtp at) {
        handles_[slot].cancel();
        insert(slot, at);
    }
    // N periodic tasks, each due first at at[i], every `period`.
    void insert_periodic(std::size_t slot, mtp first, mtp::duration period) {
        handles_[slot] = timer_.schedule_every_at(tick_task{&fired}, first, period);
    }
    std::size_t stop_all() { return timer_.stop().size(); }
    std::size_t pending() const { return timer_.pending(); }
    std::size_t advance_to(mtp now) {
        const auto before = fired.load(std::memory_order_relaxed);
        mclock::set(now);
        while (timer_.advance(now) != 0) {
        }
        return static_cast<std::size_t>(fired.load(std::memory_order_relaxed) - before);
    }
    // The heap's take_back pops its earliest elements, and the new ones stay. Here as many timers
    // are cancelled, the oldest in turn, and the new ones take their slots: they stay pending as
    // the heap's do. (Cancelling the new ones would unlink most of them from their thread's
    // staging lane before they reach a bucket, detail/staging.hpp: the timed inserts would skip
    // the placing that is part of their cost.) The handles are dropped, so that a timed insert
    // does not also pay for the last round's.
    void take_back(std::size_t first, std::size_t count) {
        for (std::size_t i = 0; i < count; ++i) {
            if (oldest_ >= first) oldest_ = 0;
            std::swap(handles_[first + i], handles_[oldest_++]);
            handles_[first + i].cancel();
            handles_[first + i] = delayq::timeout<mclock>{};
        }
    }
    void restore(std::size_t slot, mtp at) { insert(slot, at); }
    std::size_t expire_all(mtp now, std::size_t expected) {
        const auto before = fired.load();
        if constexpr (requires { timer_.advance(now); }) {  // thread-free: driven here
            mclock::set(now);
            while (fired.load(std::memory_order_relaxed) - before < expected &&
                   timer_.advance(now) != 0) {
            }
        } else {
            mclock::set(now);  // the worker wakes and runs them
            // Waiting must not slow the worker: each look at `fired` takes its line from the core
            // that is incrementing it (yield() after every look measured 15-20 ns more per timer
            // at 1M). So sleep while much is left, for less than what is left can take (20 ns a
            // timer, a quarter of the fastest pass measured), and look often only near the end.
            for (;;) {
                const auto done = fired.load(std::memory_order_relaxed) - before;
                if (done >= expected) break;
                const auto left = expected - done;
                if (left > 2048) {
                    std::this_thread::sleep_for(std::chrono::nanoseconds(20 * left));
                } else {
                    std::this_thread::yield();
                }
            }
        }
        return static_cast<std::size_t>(fired.load() - before);
    }

  protected:
    static typename Timer::options make_options() {
        typename Timer::options o;
        if constexpr (is_hashed<Timer>) {
            // Netty's default tick, and a ring that spans the deadlines' 60 s range in one round.
            o.tick = 100ms;
            o.wheel_size = 1024;
        } else {
            o.tick = 1ms;  // Kafka's default tick and wheel size (20)
        }
        return o;
    }

    Timer timer_;
    std::vector<delayq::timeout<mclock>> handles_;
    std::size_t oldest_ = 0;  // take_back() cancels from here on
};

struct hashed_adapter : wheel_adapter<delayq::hashed_wheel_timer<mclock>> {
    static constexpr const char* name = "hashed_wheel_timer";
    using wheel_adapter::wheel_adapter;
};
// The hashed wheel's thread-free core, for the workloads that drive it on the benchmark's thread
// (named as the threaded timer it is the core of: the same code does the work).
struct hashed_thread_free_adapter : wheel_adapter<delayq::hashed_wheel<mclock>> {
    static constexpr const char* name = "hashed_wheel_timer";
    using wheel_adapter::wheel_adapter;
};
// The hierarchical wheel, thread-free, driven on the benchmark's thread in every workload (named
// as its threaded form, as above).
struct hierarchical_adapter : wheel_adapter<delayq::hierarchical_wheel<mclock>> {
    static constexpr const char* name = "hierarchical_timing_wheel";
    using wheel_adapter::wheel_adapter;
};

#ifdef DELAYQ_BENCH_ASIO
// Asio arms a timerfd with the real time left until its earliest timer; on manual_clock that time
// never passes by itself. These traits say "check now" to the reactor, whose check then compares
// the deadlines with manual_clock::now(), so a poll() runs exactly the timers that are due.
struct check_now_traits {
    static mclock::duration to_wait_duration(const mclock::duration&) {
        return mclock::duration::zero();
    }
    static mclock::duration to_wait_duration(const mclock::time_point&) {
        return mclock::duration::zero();
    }
};

class asio_adapter {
    using timer = boost::asio::basic_waitable_timer<mclock, check_now_traits>;

  public:
    static constexpr const char* name = "asio_steady_timer";
    explicit asio_adapter(std::size_t capacity) { timers_.resize(capacity); }
    void insert(std::size_t slot, mtp at) {
        timers_[slot] = std::make_unique<timer>(io_, at);
        timers_[slot]->async_wait([](const boost::system::error_code& ec) {
            if (!ec) tick_task{&fired}();
        });
    }
    void cancel(std::size_t slot) { timers_[slot]->cancel(); }
    void after_cancels() { io_.poll(); }  // runs the aborted handlers: part of the cancel cost
    void take_back(std::size_t first, std::size_t count) {
        for (std::size_t i = 0; i < count; ++i) timers_[first + i]->cancel();
        io_.poll();
        io_.restart();
    }
    void restore(std::size_t slot, mtp at) { insert(slot, at); }
    std::size_t expire_all(mtp now, std::size_t expected) {
        mclock::set(now);
        const auto before = fired.load();
        // A poll may run nothing while Asio's reactor catches up; give up only after many idle
        // ones.
        for (int idle = 0; fired.load() - before < expected && idle < 1000;)
            idle = io_.poll() ? 0 : idle + 1;
        io_.restart();
        return static_cast<std::size_t>(fired.load() - before);
    }

  private:
    boost::asio::io_context io_;
    std::vector<std::unique_ptr<timer>> timers_;
};
#endif

// ---- workloads ---------------------------------------------------------------------------------

const mtp base{1h};

std::vector<mtp> random_deadlines(std::size_t n, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int64_t> us(10'000'000, 70'000'000);  // [10 s, 70 s]
    std::vector<mtp> v(n);
    for (auto& t : v) t = base + std::chrono::microseconds(us(rng));
    return v;
}

std::vector<mtp> monotonic_deadlines(std::size_t n) {
    std::vector<mtp> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = base + 10s + std::chrono::microseconds(i);
    return v;
}

template <class S>
void insert_workload(benchmark::State& state, bool monotonic) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    auto at = monotonic ? monotonic_deadlines(n + batch) : random_deadlines(n + batch, 1);
    S s(n + batch);
    const auto before = heap_in_use();
    for (std::size_t i = 0; i < n; ++i) s.insert(i, at[i]);
    state.counters["bytes_per_timer"] =
        static_cast<double>(heap_in_use() - before) / static_cast<double>(n);
    std::size_t round = 0;
    for (auto _ : state) {
        // A fresh set of deadlines each round, drawn from the same range, without a clock read.
        const std::size_t shift = (round++ * 7919) % n;
        for (std::size_t i = 0; i < batch; ++i) s.insert(n + i, at[(shift + i) % n]);
        state.PauseTiming();
        s.take_back(n, batch);
        state.ResumeTiming();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

template <class S>
void cancel_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    auto at = random_deadlines(n, 2);
    S s(n);
    for (std::size_t i = 0; i < n; ++i) s.insert(i, at[i]);
    std::mt19937_64 rng(3);
    std::vector<std::size_t> victims(batch);
    for (auto _ : state) {
        state.PauseTiming();
        std::unordered_set<std::size_t> pick;
        while (pick.size() < std::min(batch, n)) pick.insert(rng() % n);
        victims.assign(pick.begin(), pick.end());
        state.ResumeTiming();
        if constexpr (requires { s.cancel_batch(victims); }) {
            s.cancel_batch(victims);
        } else {
            for (auto v : victims) s.cancel(v);
            if constexpr (requires { s.after_cancels(); }) s.after_cancels();
        }
        state.PauseTiming();
        for (auto v : victims) s.restore(v, at[v]);
        state.ResumeTiming();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * std::min(batch, n)));
}

template <class S>
void expire_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    auto at = random_deadlines(n, 4);
    std::size_t total = 0;
    for (auto _ : state) {
        state.PauseTiming();
        mclock::set(base);
        auto s = std::make_unique<S>(n);
        for (std::size_t i = 0; i < n; ++i) s->insert(i, at[i]);
        state.ResumeTiming();
        total += s->expire_all(base + 71s, n);
        state.PauseTiming();
        s.reset();
        state.ResumeTiming();
    }
    if (total != n * state.iterations()) state.SkipWithError("not every timer fired");
    state.SetItemsProcessed(static_cast<std::int64_t>(total));
}

// Reschedule: the structure holds N; B random handles are pushed back by a random amount in
// [1 ms, 1 s] (timed: reschedule(), or the cancel + schedule that users write without it). A
// deadline past 70 s goes back to 10 s, so the range stays that of the other workloads.
// allocs_per_op: operator new calls per timed operation.
template <class S>
void reschedule_workload(benchmark::State& state, bool with_reschedule) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    auto at = random_deadlines(n, 6);
    S s(n);
    for (std::size_t i = 0; i < n; ++i) s.insert(i, at[i]);
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<std::int64_t> push(1'000, 1'000'000);  // µs
    std::vector<std::size_t> victims(batch);
    std::vector<mtp> to(batch);
    std::uint64_t allocs = 0;
    for (auto _ : state) {
        state.PauseTiming();
        for (std::size_t j = 0; j < batch; ++j) {
            const std::size_t v = rng() % n;
            mtp d = at[v] + std::chrono::microseconds(push(rng));
            if (d > base + 70s) d -= 60s;
            victims[j] = v;
            to[j] = at[v] = d;
        }
        const std::uint64_t a0 = allocations;
        state.ResumeTiming();
        if (with_reschedule) {
            for (std::size_t j = 0; j < batch; ++j) s.reschedule(victims[j], to[j]);
        } else {
            for (std::size_t j = 0; j < batch; ++j) s.cancel_and_insert(victims[j], to[j]);
        }
        state.PauseTiming();
        allocs += allocations - a0;
        state.ResumeTiming();
    }
    const auto ops = static_cast<double>(state.iterations() * batch);
    state.counters["allocs_per_op"] = static_cast<double>(allocs) / ops;
    state.SetItemsProcessed(static_cast<std::int64_t>(ops));
}

// Postpone: the idle-connection pattern. The structure holds N (random deadlines); the clock moves
// on 1 ms per batch, and B random handles are pushed back to now + 60 s, a fixed timeout
// (timed: reschedule()). Most timers of such a load never fire: they are pushed back again first.
template <class S>
void postpone_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    auto at = random_deadlines(n, 10);
    S s(n);
    for (std::size_t i = 0; i < n; ++i) s.insert(i, at[i]);
    std::mt19937_64 rng(11);
    std::vector<std::size_t> victims(batch);
    for (auto _ : state) {
        state.PauseTiming();
        mclock::advance(1ms);
        const mtp to = mclock::now() + 60s;
        for (std::size_t j = 0; j < batch; ++j) victims[j] = rng() % n;
        state.ResumeTiming();
        for (std::size_t j = 0; j < batch; ++j) s.reschedule(victims[j], to);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

// Stop: N pending (random deadlines, handles kept); stop() takes them all back, earliest first,
// and its handles are dropped (timed); per pending timer.
template <class S>
void stop_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    auto at = random_deadlines(n, 9);
    std::size_t total = 0;
    for (auto _ : state) {
        state.PauseTiming();
        mclock::set(base);
        auto s = std::make_unique<S>(n);
        for (std::size_t i = 0; i < n; ++i) s->insert_dropping_handle(at[i]);
        state.ResumeTiming();
        total += s->stop_all();
        state.PauseTiming();
        s.reset();
        state.ResumeTiming();
    }
    if (total != n * state.iterations()) state.SkipWithError("stop() did not return every timer");
    state.SetItemsProcessed(static_cast<std::int64_t>(total));
}

// Periodic: N periodic tasks with periods of 100 ms .. 1 s (at least the hashed wheel's tick, as
// a wheel's user picks it); each round moves the clock 10 ms and runs what is due (timed). Per run
// of a task: the run and its re-link at its next deadline.
template <class S>
void periodic_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    mclock::set(base);
    S s(n);
    std::mt19937_64 rng(8);
    for (std::size_t i = 0; i < n; ++i) {
        const auto period = std::chrono::milliseconds(100 + rng() % 901);
        s.insert_periodic(i, base + std::chrono::microseconds(rng() % 1'000'000), period);
    }
    mtp now = base;
    std::size_t runs = 0;
    std::uint64_t allocs = 0;
    for (auto _ : state) {
        now += 10ms;
        const std::uint64_t a0 = allocations;
        runs += s.advance_to(now);
        allocs += allocations - a0;
    }
    state.counters["allocs_per_op"] =
        runs ? static_cast<double>(allocs) / static_cast<double>(runs) : 0;
    state.SetItemsProcessed(static_cast<std::int64_t>(runs));
}

// Passes: N one-shot timers spread evenly over 1 000 passes 10 ms apart (untimed set-up), then the
// 1 000 passes (timed, per fired timer). allocs_after_first: operator new calls in passes 2 to
// 1 000, all of them: a pass that never allocates shows 0 (issue 27's goal).
template <class S>
void passes_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    constexpr std::size_t passes = 1000;
    std::size_t total = 0;
    std::uint64_t allocs = 0;
    for (auto _ : state) {
        state.PauseTiming();
        mclock::set(base);
        auto s = std::make_unique<S>(n);
        std::mt19937_64 rng(12);
        for (std::size_t i = 0; i < n; ++i)
            s->insert(i, base + std::chrono::microseconds(rng() % (passes * 10'000)));
        state.ResumeTiming();
        for (std::size_t k = 1; k <= passes; ++k) {
            const std::uint64_t a0 = allocations;
            total += s->advance_to(base + std::chrono::milliseconds(10 * k));
            if (k > 1) allocs += allocations - a0;
        }
        state.PauseTiming();
        s.reset();
        state.ResumeTiming();
    }
    if (total != n * state.iterations()) state.SkipWithError("not every timer fired");
    state.counters["allocs_after_first"] =
        static_cast<double>(allocs) / static_cast<double>(state.iterations());
    state.SetItemsProcessed(static_cast<std::int64_t>(total));
}

// Cancel-heavy (issue 27): what most timers are, request timeouts cancelled long before they
// fire. Every 10 ms of manual_clock time, new timers of 60 s; 93 % of them are cancelled at a time
// drawn uniformly from their 60 s, the rest fire. The rate keeps about N pending. After the first
// 60 s (the pending count has reached N), one hour is played, and the bytes a pending timer are
// sampled every second, both glibc's in-use bytes and the resident set (resident() says why): the
// timer's memory, dead nodes and the pool's free blocks included (the benchmark's own arrays are
// made before the baseline; a handle is dropped when its timer is cancelled, as a request's is
// when it completes). Timed: the whole hour.
template <class S>
void cancel_heavy_workload(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    constexpr std::size_t ring = 6000;  // steps of 10 ms in the 60 s timeout
    constexpr std::size_t per_slot = 512;
    constexpr std::size_t warm_up = ring, hour = 360'000;
    // pending = rate x (7 % x 6000 + 93 % x 3000 steps): rate = n / 3210 a step
    const double rate = static_cast<double>(n) / 3210.0;
    double max_bytes = 0, last_bytes = 0, max_resident = 0, to_cancel = 0, scheduled = 0;
    for (auto _ : state) {
        state.PauseTiming();
        mclock::set(base);
        auto s = std::make_unique<S>(ring * per_slot);
        std::vector<std::uint16_t> fill(ring, 0);
        std::mt19937_64 rng(27);
        std::uniform_real_distribution<double> u(0.0, 1.0);
        const auto before = heap_in_use();
        const auto resident_before = resident();
        double due = 0;
        state.ResumeTiming();
        for (std::size_t step = 0; step < warm_up + hour; ++step) {
            const mtp now = base + std::chrono::milliseconds(10 * step);
            const std::size_t here = step % ring;
            for (std::size_t k = 0; k < fill[here]; ++k) s->cancel_and_drop(here * per_slot + k);
            fill[here] = 0;
            for (due += rate; due >= 1; due -= 1) {
                scheduled += 1;
                if (u(rng) >= 0.93) {
                    s->insert_dropping_handle(now + 60s);
                    continue;
                }
                const std::size_t at = (here + 1 + rng() % (ring - 1)) % ring;
                if (fill[at] == per_slot) {  // no room left for its handle: it fires instead
                    s->insert_dropping_handle(now + 60s);  // (never seen at these rates)
                    continue;
                }
                to_cancel += 1;
                s->insert(at * per_slot + fill[at]++, now + 60s);
            }
            s->advance_to(now);
            if (step >= warm_up && step % 100 == 0) {
                state.PauseTiming();
                const double pending = static_cast<double>(s->pending());
                last_bytes = static_cast<double>(heap_in_use() - before) / pending;
                max_bytes = std::max(max_bytes, last_bytes);
                const double grown =
                    static_cast<double>(resident()) - static_cast<double>(resident_before);
                max_resident = std::max(max_resident, grown / pending);
                state.ResumeTiming();
            }
        }
        state.PauseTiming();
        s.reset();
        state.ResumeTiming();
    }
    state.counters["max_bytes_per_pending"] = max_bytes;
    state.counters["last_bytes_per_pending"] = last_bytes;
    state.counters["max_resident_per_pending"] = max_resident;
    state.counters["cancelled_fraction"] = scheduled > 0 ? to_cancel / scheduled : 0;
    state.SetItemsProcessed(static_cast<std::int64_t>(scheduled));
}

// The clock read's share: schedule(delay) reads steady_clock::now(); schedule_at does not.
template <class Timer>
void schedule_delay_or_deadline(benchmark::State& state, bool with_delay) {
    const auto n = static_cast<std::size_t>(state.range(0));
    typename Timer::options o;
    if constexpr (is_hashed<Timer>) {
        o.tick = 100ms;
        o.wheel_size = 1024;
    } else {
        o.tick = 1ms;
    }
    Timer t(o);
    std::vector<delayq::timeout<std::chrono::steady_clock>> h(n + batch);
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i)
        h[i] =
            t.schedule_at(tick_task{&fired}, now + 30s + std::chrono::microseconds(i % 30'000'000));
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) {
            if (with_delay)
                h[n + i] = t.schedule(tick_task{&fired}, 40s);
            else
                h[n + i] = t.schedule_at(tick_task{&fired}, now + 40s);
        }
        state.PauseTiming();
        for (std::size_t i = 0; i < batch; ++i) h[n + i].cancel();
        state.ResumeTiming();
    }
    t.stop();
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

// Two threads inserting into one structure that starts with N pending. As in the single-thread
// insert workloads (which take back what they insert, so the memory is reused), the structure has
// held all it will hold before the timed part: the inserts measure contention, not the first touch
// of fresh memory (page faults), which the single-thread figures do not pay either.
// one_thread_insert runs the same workload on one thread (the same 400 000 inserts in a row): the
// like-for-like baseline of the pair. insert_random is not: it inserts 1 024 nodes that the batch
// before freed, still in cache, where these come from a free list of 400 000 that are not.
template <class S>
void two_threads_workload(benchmark::State& state) {
    static std::unique_ptr<S> shared;
    static std::vector<mtp> at;
    const auto n = static_cast<std::size_t>(state.range(0));
    constexpr std::size_t per_thread = 200'000;
    if (state.thread_index() == 0) {
        mclock::set(base);
        at = random_deadlines(n + 2 * per_thread, 5);
        shared = std::make_unique<S>(n + 2 * per_thread);
        for (std::size_t i = 0; i < n + 2 * per_thread; ++i) shared->insert(i, at[i]);
        shared->take_back(n, 2 * per_thread);  // warm: the memory stays with the structure
    }
    std::size_t slot = n + static_cast<std::size_t>(state.thread_index()) * per_thread;
    for (auto _ : state) {
        shared->insert(slot, at[slot]);
        ++slot;
    }
    state.SetItemsProcessed(state.iterations());
    if (state.thread_index() == 0) {
        // Every thread has left the loop (the benchmark library waits for all at its end). The
        // structure goes now: a timer left alive (with its worker) would fire into `fired` when a
        // later benchmark moves the clock, and steal its CPU.
        shared.reset();
    }
}

void sizes(benchmark::internal::Benchmark* b) {
    for (long n : {1'000L, 10'000L, 100'000L, 1'000'000L, 10'000'000L}) b->Arg(n);
    b->Unit(benchmark::kNanosecond)->UseRealTime();  // a wheel's worker thread works too
}

template <class S>
void register_all() {
    const std::string s = S::name;
    benchmark::RegisterBenchmark(("insert_random/" + s).c_str(), [](benchmark::State& st) {
        insert_workload<S>(st, false);
    })->Apply(sizes);
    benchmark::RegisterBenchmark(("insert_monotonic/" + s).c_str(), [](benchmark::State& st) {
        insert_workload<S>(st, true);
    })->Apply(sizes);
    benchmark::RegisterBenchmark(("cancel/" + s).c_str(), cancel_workload<S>)->Apply(sizes);
    benchmark::RegisterBenchmark(("expire/" + s).c_str(), expire_workload<S>)
        ->Apply(sizes)
        ->Iterations(1);
    benchmark::RegisterBenchmark(("two_threads_insert/" + s).c_str(), two_threads_workload<S>)
        ->Arg(1'000)
        ->Arg(1'000'000)
        ->Threads(2)
        ->Iterations(200'000)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("one_thread_insert/" + s).c_str(), two_threads_workload<S>)
        ->Arg(1'000)
        ->Arg(1'000'000)
        ->Threads(1)
        ->Iterations(400'000)
        ->UseRealTime();
}

// The workloads only the wheels have (reschedule, periodic tasks), both driven on the benchmark's
// thread.
template <class S>
void register_wheel_only() {
    const std::string s = S::name;
    benchmark::RegisterBenchmark(("reschedule/" + s).c_str(), [](benchmark::State& st) {
        reschedule_workload<S>(st, true);
    })->Apply(sizes);
    benchmark::RegisterBenchmark(("cancel_schedule/" + s).c_str(), [](benchmark::State& st) {
        reschedule_workload<S>(st, false);
    })->Apply(sizes);
    benchmark::RegisterBenchmark(("postpone/" + s).c_str(), postpone_workload<S>)->Apply(sizes);
    benchmark::RegisterBenchmark(("stop/" + s).c_str(), stop_workload<S>)
        ->Arg(1'000)
        ->Arg(100'000)
        ->Arg(1'000'000)
        ->Iterations(1)
        ->Unit(benchmark::kNanosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("passes/" + s).c_str(), passes_workload<S>)
        ->Arg(1'000)  // the smoke test's size
        ->Arg(1'000'000)
        ->Iterations(1)
        ->Unit(benchmark::kNanosecond)
        ->UseRealTime();
    // One repetition: the row is a memory reading sampled 3 600 times over the hour, and three
    // of its hours at 1M took two thirds of bench/compare.py's run.
    benchmark::RegisterBenchmark(("cancel_heavy/" + s).c_str(), cancel_heavy_workload<S>)
        ->Arg(1'000)  // the smoke test's size
        ->Arg(1'000'000)
        ->Iterations(1)
        ->Repetitions(1)
        ->Unit(benchmark::kNanosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("periodic/" + s).c_str(), periodic_workload<S>)
        ->Arg(1'000)
        ->Arg(100'000)
        ->Arg(1'000'000)
        ->Unit(benchmark::kNanosecond)
        ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
    // A fixed mmap threshold: glibc moves its own up as mapped blocks are freed, so a row's bytes
    // depended on the rows run before it (a 2 MiB-aligned block, such as a wheel's slab region,
    // is mapped with up to 2 MiB of slack while the threshold is low, and mallinfo2 counts it).
    // Blocks below 1 GiB now come from the heap, where such slack is a free block, not in use.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    register_all<locked_heap>();
    register_all<delay_queue_adapter>();
    register_all<hashed_adapter>();
    register_all<hierarchical_adapter>();
#ifdef DELAYQ_BENCH_ASIO
    register_all<asio_adapter>();
#endif
    register_wheel_only<hashed_thread_free_adapter>();
    register_wheel_only<hierarchical_adapter>();
    for (bool delay : {false, true}) {
        const std::string w = delay ? "schedule_delay/" : "schedule_at/";
        benchmark::RegisterBenchmark((w + "hashed_wheel_timer").c_str(),
                                     [delay](benchmark::State& st) {
                                         schedule_delay_or_deadline<delayq::hashed_wheel_timer<>>(
                                             st, delay);
                                     })
            ->Arg(1'000)
            ->Arg(1'000'000)
            ->UseRealTime();
        benchmark::RegisterBenchmark((w + "hierarchical_timing_wheel").c_str(),
                                     [delay](benchmark::State& st) {
                                         schedule_delay_or_deadline<delayq::hierarchical_wheel<>>(
                                             st, delay);
                                     })
            ->Arg(1'000)
            ->Arg(1'000'000)
            ->UseRealTime();
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
