// due_batch (detail/due_batch.hpp): whatever runs a ring hands over, the batch comes out in the
// heap's order — deadline, then first in, first out — whether each run's sort is enough (runs in
// time order) or the whole needs one sort (runs that overlap, equal deadlines across two runs, a
// run too large to sort on its own).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <delayq/detail/due_batch.hpp>
#include <delayq/detail/hashed_wheel_ring.hpp>
#include <delayq/detail/node_pool.hpp>
#include <delayq/detail/timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "catch.hpp"

namespace {

using mc = delayq::manual_clock;
using node = delayq::detail::timer_node<mc>;

// n bare nodes (no task: due_batch never runs or destroys one), deadline d[i], seq i.
struct nodes {
    explicit nodes(const std::vector<std::int64_t>& d) : v(d.size()) {
        for (std::size_t i = 0; i < d.size(); ++i)
            v[i].init(nullptr, mc::time_point{mc::duration{d[i]}}, static_cast<std::uint32_t>(i),
                      1);
    }
    std::vector<node> v;
};

// Adds the nodes of `runs` (indices into ns) run by run, finishes, and returns the seq order.
std::vector<std::uint32_t> batch_of(nodes& ns, const std::vector<std::vector<std::size_t>>& runs) {
    delayq::detail::due_batch<mc> b;
    const delayq::detail::construction_room room;
    b.reserve(ns.v.size(), room.key());  // as a wheel does when it schedules
    b.begin();
    for (const auto& run : runs) {
        b.next_run();
        for (std::size_t i : run) b.add(&ns.v[i]);
    }
    b.finish();
    std::vector<std::uint32_t> out;
    for (std::size_t i = 0; i < b.size(); ++i) out.push_back(b.at(i)->seq);
    b.clear();
    return out;
}

// The heap's order of all nodes: by deadline, then seq.
std::vector<std::uint32_t> heap_order(const nodes& ns) {
    std::vector<std::uint32_t> s(ns.v.size());
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::uint32_t>(i);
    std::stable_sort(s.begin(), s.end(), [&](std::uint32_t a, std::uint32_t b) {
        return ns.v[a].deadline < ns.v[b].deadline;
    });
    return s;
}

// Splits 0..n-1 into `count` runs of consecutive indices, each shuffled.
std::vector<std::vector<std::size_t>> shuffled_runs(std::size_t n, std::size_t count,
                                                    std::mt19937_64& rng) {
    std::vector<std::vector<std::size_t>> runs(count);
    for (std::size_t i = 0; i < n; ++i) runs[i * count / n].push_back(i);
    for (auto& r : runs) std::shuffle(r.begin(), r.end(), rng);
    return runs;
}

}  // namespace

TEST_CASE("due_batch: runs in time order, each shuffled, come out in the heap's order") {
    std::mt19937_64 rng(1);
    for (std::size_t n : {std::size_t{10}, std::size_t{1000}, std::size_t{100'000}}) {
        std::vector<std::int64_t> d(n);
        for (std::size_t i = 0; i < n; ++i)
            d[i] = static_cast<std::int64_t>(i / 3) * 1000 - 5'000;  // equal threes, some < 0
        nodes ns(d);
        auto runs = shuffled_runs(n, std::max<std::size_t>(1, n / 97), rng);
        // equal deadlines within a run in reverse seq order: first in, first out must still hold
        CHECK(batch_of(ns, runs) == heap_order(ns));
    }
}

TEST_CASE("due_batch: runs whose times overlap are sorted as a whole") {
    std::mt19937_64 rng(2);
    const std::size_t n = 20'000;
    std::vector<std::int64_t> d(n);
    for (auto& x : d) x = static_cast<std::int64_t>(rng() % 1'000'000);
    nodes ns(d);
    auto runs = shuffled_runs(n, 40, rng);  // runs of random deadlines: they overlap
    CHECK(batch_of(ns, runs) == heap_order(ns));
}

TEST_CASE("due_batch: equal deadlines across two runs in the wrong seq order") {
    // run 1 holds seq 2 and 3 at deadline 7, run 2 seq 0 and 1 at deadline 7 too
    nodes ns({7, 7, 7, 7});
    CHECK(batch_of(ns, {{3, 2}, {1, 0}}) == std::vector<std::uint32_t>{0, 1, 2, 3});
    CHECK(batch_of(ns, {{1, 0}, {3, 2}}) == std::vector<std::uint32_t>{0, 1, 2, 3});
}

TEST_CASE("due_batch: a run larger than one run's sort handles is sorted with the whole") {
    std::mt19937_64 rng(3);
    const std::size_t n = delayq::detail::deadline_run_max + 1000;
    std::vector<std::int64_t> d(n);
    for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::int64_t>(i);
    nodes ns(d);
    std::vector<std::size_t> big(n - 10), last;
    for (std::size_t i = 0; i < n - 10; ++i) big[i] = i;
    std::shuffle(big.begin(), big.end(), rng);
    for (std::size_t i = n - 10; i < n; ++i) last.push_back(n - 1 - (i - (n - 10)));
    CHECK(batch_of(ns, {big, last}) == heap_order(ns));
}

TEST_CASE("due_batch: empty runs and a batch added without next_run()") {
    nodes ns({5, 3, 9, 1});
    CHECK(batch_of(ns, {{}, {1, 0}, {}, {}, {3, 2}, {}}) == std::vector<std::uint32_t>{3, 1, 0, 2});
    CHECK(batch_of(ns, {{0, 1, 2, 3}}) == std::vector<std::uint32_t>{3, 1, 0, 2});
}

TEST_CASE("due_batch: large runs of wide deadlines and deadlines anywhere on the time line") {
    // Runs of 5 000 and 130 000 nodes spanning 2^40 ns each (a run's sort goes most significant
    // digit first), with equal pairs; then one batch of extremes sorted as a whole.
    std::mt19937_64 rng(4);
    for (std::size_t per_run : {std::size_t{5'000}, std::size_t{130'000}}) {
        const std::size_t n = 2 * per_run;
        std::vector<std::int64_t> d(n);
        for (std::size_t i = 0; i < n; ++i) {
            const auto run = static_cast<std::int64_t>(i / per_run);
            d[i] = (run << 41) + static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 40));
            if (i % per_run != 0 && rng() % 8 == 0) d[i] = d[i - 1];  // equal to the one before
        }
        nodes ns(d);
        auto runs = shuffled_runs(n, 2, rng);
        CHECK((batch_of(ns, runs) == heap_order(ns)));  // (( )): no print of 260k numbers
    }
    std::vector<std::int64_t> d(50'000);
    for (auto& x : d) x = static_cast<std::int64_t>(rng());
    d[0] = std::numeric_limits<std::int64_t>::min();
    d[1] = std::numeric_limits<std::int64_t>::max();
    d[2] = std::numeric_limits<std::int64_t>::max();
    d[3] = 0;
    nodes ns(d);
    CHECK((batch_of(ns, shuffled_runs(d.size(), 7, rng)) == heap_order(ns)));
}

TEST_CASE("due_batch: 300 000 equal deadlines out of seq order are put in order in O(n log n)") {
    // One deadline for all (timers set for midnight), in a bucket or a level whose walk does not
    // give the schedule order: in reverse within one run, and as two runs in the wrong order.
    // Insertion sort took n^2 / 4 moves here: hours; ctest's timeout fails it.
    const std::size_t n = 300'000;
    nodes ns(std::vector<std::int64_t>(n, 42));
    std::vector<std::size_t> reverse(n), low, high;
    for (std::size_t i = 0; i < n; ++i) {
        reverse[i] = n - 1 - i;
        (i < n / 2 ? low : high).push_back(i);
    }
    CHECK(batch_of(ns, {reverse}) == heap_order(ns));
    CHECK(batch_of(ns, {high, low}) == heap_order(ns));
    std::vector<std::size_t> first(reverse.begin(), reverse.begin() + 1000),
        rest(reverse.begin() + 1000, reverse.end());
    CHECK(batch_of(ns, {first, rest}) == heap_order(ns));  // runs small enough to sort alone
}

TEST_CASE("reserved_allocator: room mapped from 16 KiB on, its pages handed back past keep") {
    using alloc = delayq::detail::reserved_allocator<std::uint64_t>;
    constexpr std::size_t page = 4096 / sizeof(std::uint64_t), huge = (1U << 21) / 8;
    for (std::size_t n : {std::size_t{100}, std::size_t{1} << 11, std::size_t{1} << 19}) {
        CAPTURE(n);
        alloc a;
        std::uint64_t* p = a.allocate(n);
        const bool mapped = n * sizeof(std::uint64_t) >= (std::size_t{1} << 14);
        if (n >= huge) CHECK(reinterpret_cast<std::uintptr_t>(p) % (std::size_t{1} << 21) == 0);
        std::fill(p, p + n, std::uint64_t{7});
        const std::size_t keep = n / 4;
        alloc::release_unused(p, n, keep);
        // Kept: the first `keep`, and the rest of the page (huge page) they end in.
        const std::size_t unit = n >= huge ? huge : page;
        const std::size_t from = (keep + unit - 1) / unit * unit;
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint64_t want = mapped && i >= from ? 0 : 7;
            if (p[i] != want) FAIL("element " << i << " is " << p[i] << ", not " << want);
        }
        std::fill(p, p + n, std::uint64_t{9});  // the room is still there, and writable
        CHECK(p[n - 1] == 9);
        a.deallocate(p, n);
    }
}

// A pass cannot make room (detail/room.hpp): every member that may allocate takes a room_key,
// which only a room_lock (a schedule's) or a constructor's construction_room makes. What a pass
// holds, a plain lock, gives it none, so such a call does not compile.
namespace {
template <class R>
constexpr bool ring_room_without_key = requires(R& r, typename R::place p) {
    r.prepare(p);
}
|| requires(R& r, typename R::duration d) {
    r.prepare_repeat(d);
}
|| requires(R& r) {
    r.reserve(std::size_t{1});
};
template <class T>
constexpr bool reserves_without_key = requires(T& t) {
    t.reserve(std::size_t{1});
};
template <class Pool>
constexpr bool allocates_without_key = requires(Pool& p) {
    p.allocate(48, 8);
};
}  // namespace
static_assert(!std::is_default_constructible_v<delayq::detail::room_key>);
static_assert(!ring_room_without_key<delayq::detail::hashed_wheel_ring<mc>>);
static_assert(!ring_room_without_key<delayq::detail::timing_wheel<mc>>);
static_assert(!reserves_without_key<delayq::detail::due_batch<mc>>);
static_assert(!reserves_without_key<delayq::detail::near_window<mc>>);
static_assert(!reserves_without_key<delayq::detail::room_array<int>>);
static_assert(!allocates_without_key<delayq::detail::node_pool>);
