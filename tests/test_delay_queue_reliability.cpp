// delay_queue on its unhappy paths (issue 10): close() when handing the elements back throws, a
// taker whose sleep throws, the leader when clear()/remove_if() take its head away, and the clock
// going backwards. Each of these tests failed or hung before its fix; a test that would hang
// instead fails its check after a bounded wait and then frees its threads, so the suite never
// hangs.
//
// This binary replaces the global operator new (to fail one allocation on demand), so it holds
// only these tests.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <delayq/delay_queue.hpp>
#include <delayq/manual_clock.hpp>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support.hpp"

namespace {

// How many more allocations on this thread succeed before one throws std::bad_alloc; -1: all do.
// Per thread, so that only the call under test fails, not a taker or the test framework.
thread_local long allocations_before_failure = -1;

}  // namespace

// Every form that pairs with the plain delete is replaced, so that a sanitizer sees malloc/free
// throughout (Catch2 uses the nothrow form); the array and aligned forms stay the runtime's own.
// Not inlined: g++ would then see a free() of what `new` returned (-Wmismatched-new-delete).
[[gnu::noinline]] void* operator new(std::size_t n) {
    if (allocations_before_failure >= 0 && allocations_before_failure-- == 0)
        throw std::bad_alloc();
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    return std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}

using namespace std::chrono_literals;
using delayq::manual_clock;
using delayq::test::eventually;
using mtp = manual_clock::time_point;

namespace {

mtp at(std::chrono::milliseconds d) {
    return mtp{d};
}

struct item {
    int id;
    mtp at;
    mtp deadline() const noexcept { return at; }
};

using queue = delayq::delay_queue<item, manual_clock>;

// Counts down the copies and moves of the element types below, on this thread; the one that
// takes it past zero throws. -1: none throws.
thread_local int copies_and_moves_before_throw = -1;

void count_copy_or_move() {
    if (copies_and_moves_before_throw >= 0 && copies_and_moves_before_throw-- == 0)
        throw std::runtime_error("copy or move");
}

// Copyable, with a move that may throw: the queue keeps it boxed. The count is taken before
// anything is changed, so a throwing copy or move leaves its source as it was.
struct brittle {
    int id;
    mtp at;
    brittle(int i, mtp a) : id(i), at(a) {}
    brittle(const brittle& o) : id(o.id), at(o.at) { count_copy_or_move(); }
    brittle(brittle&& o) noexcept(false) : id(o.id), at(o.at) {
        count_copy_or_move();
        o.id = -1;
    }
    brittle& operator=(const brittle& o) {
        count_copy_or_move();
        id = o.id;
        at = o.at;
        return *this;
    }
    brittle& operator=(brittle&& o) noexcept(false) {
        count_copy_or_move();
        id = std::exchange(o.id, -1);
        at = o.at;
        return *this;
    }
    ~brittle() = default;
    mtp deadline() const noexcept { return at; }
};

// Move-only, with a move that may throw; the payload is a heap block, so that a lost or doubly
// owned element shows up under ASan.
struct stubborn {
    int id;
    mtp at;
    std::unique_ptr<int> payload;
    stubborn(int i, mtp a) : id(i), at(a), payload(std::make_unique<int>(i)) {}
    stubborn(const stubborn&) = delete;
    stubborn& operator=(const stubborn&) = delete;
    stubborn(stubborn&& o) noexcept(false) : id(o.id), at(o.at) {
        count_copy_or_move();
        payload = std::move(o.payload);
        o.id = -1;
    }
    stubborn& operator=(stubborn&& o) noexcept(false) {
        count_copy_or_move();
        id = std::exchange(o.id, -1);
        at = o.at;
        payload = std::move(o.payload);
        return *this;
    }
    ~stubborn() = default;
    mtp deadline() const noexcept { return at; }
};

bool intact(const brittle& v) {
    return v.id >= 0;
}
bool intact(const stubborn& v) {
    return v.id >= 0 && v.payload && *v.payload == v.id;
}

// A taker on its own thread, whose result (or exception) the test can watch.
template <class T>
struct taker {
    std::atomic<bool> done{false};
    std::optional<T> got;
    std::exception_ptr error;
    std::jthread thread;

    template <class F>
    explicit taker(F take) {
        thread = std::jthread([this, take] {
            try {
                got = take();
            } catch (...) {
                error = std::current_exception();
            }
            done = true;
        });
    }
};

// Three takers without a time limit: one leads on the head's deadline, two follow (one plain,
// one with a stop token that is never used), so that both condition variables have a sleeper.
template <class T>
struct blocked_takers {
    std::stop_source never;
    std::vector<std::unique_ptr<taker<T>>> all;

    template <class Q>
    explicit blocked_takers(Q& q) {
        for (int i = 0; i < 3; ++i) {
            all.push_back(std::make_unique<taker<T>>(
                [&q, this, i] { return i == 2 ? q.take(never.get_token()) : q.take(); }));
            // one at a time, so that the first one leads
            REQUIRE(eventually([&] { return q.waiting_takers() == std::size_t(i) + 1; }));
        }
    }

    bool all_done() const {
        return std::all_of(all.begin(), all.end(), [](auto& t) { return t->done.load(); });
    }

    // Checks that every taker returns, and with nothing. If they do not (the defect), frees them
    // so that the test can end: moving the clock wakes the leader, which sees the queue closed
    // and hands on to a follower, and so on.
    void check_woken_empty_handed() {
        const bool woken = eventually([&] { return all_done(); });
        CHECK(woken);
        if (!woken) {
            manual_clock::advance(24h);
            never.request_stop();
            REQUIRE(eventually([&] { return all_done(); }));
        }
        for (auto& t : all) {
            CHECK_FALSE(t->got);
            CHECK_FALSE(t->error);
        }
    }
};

template <class T>
std::vector<int> ids(const std::vector<T>& v) {
    std::vector<int> out;
    for (auto& e : v) out.push_back(e.id);
    return out;
}

// n elements with ids 0..n-1, due in reverse order of their ids (so the heap is not sorted), all
// due within 100 ms; the order in which they must come back.
template <class Q>
std::vector<int> fill(Q& q, int n) {
    std::vector<int> order;
    for (int i = 0; i < n; ++i) {
        REQUIRE(q.emplace(i, at(std::chrono::milliseconds(100 - i))));
        order.insert(order.begin(), i);
    }
    return order;
}

// close() with the copy or move of the (k+1)-th element handed back throwing.
template <class T>
void close_throwing_midway(int k) {
    manual_clock::reset();
    delayq::delay_queue<T, manual_clock> q;
    const std::vector<int> order = fill(q, 8);
    blocked_takers<T> takers(q);

    copies_and_moves_before_throw = k;
    CHECK_THROWS_AS(q.close(), std::runtime_error);
    copies_and_moves_before_throw = -1;

    // Closed, whatever happened after: puts are refused and every taker is woken.
    CHECK(q.closed());
    CHECK_FALSE(q.emplace(99, at(0ms)));
    takers.check_woken_empty_handed();
    // Nothing lost: every element is still held, intact, and a later close() hands them all back.
    CHECK(q.size() == order.size());
    std::vector<T> rest = q.close();
    CHECK(ids(rest) == order);
    CHECK(std::all_of(rest.begin(), rest.end(), [](const T& v) { return intact(v); }));
    CHECK(q.empty());
    CHECK(q.close().empty());
}

}  // namespace

TEST_CASE("close: a copy that throws midway (copyable element whose move may throw)",
          "[exceptions]") {
    // Before the fix: close() set closed_, then moved the elements out; a move that threw skipped
    // the wake-up, so the takers slept on (the wake-up check failed after 20 s), and the elements
    // moved before it were lost (ids -1 in the later close()).
    close_throwing_midway<brittle>(0);
    close_throwing_midway<brittle>(3);
    close_throwing_midway<brittle>(7);
}

TEST_CASE("close: a move that throws midway (move-only element)", "[exceptions]") {
    // Before the fix: as above. Now the elements moved so far are moved back.
    close_throwing_midway<stubborn>(0);
    close_throwing_midway<stubborn>(3);
    close_throwing_midway<stubborn>(7);
}

TEST_CASE("close: the allocation of the handed-back vector fails", "[memory]") {
    // Before the fix: closed_ was set before the reserve(), which threw: the takers slept on.
    manual_clock::reset();
    queue q;
    const std::vector<int> order = fill(q, 8);
    blocked_takers<item> takers(q);

    const auto close_out_of_memory = [&] {
        allocations_before_failure = 0;
        try {
            auto rest = q.close();
            allocations_before_failure = -1;
            return rest;
        } catch (...) {
            allocations_before_failure = -1;
            throw;
        }
    };
    CHECK_THROWS_AS(close_out_of_memory(), std::bad_alloc);

    CHECK(q.closed());
    takers.check_woken_empty_handed();
    CHECK(q.size() == order.size());
    CHECK(ids(q.close()) == order);
}

namespace {

// A clock that reads manual_clock's time and sleeps through manual_clock's wait hook, except that
// the next `throws` waits throw instead: a Clock's wait hook may throw (manual_clock's own
// bookkeeping allocates), and a taker's sleep must then leave the queue as it found it.
struct throwing_clock {
    using duration = manual_clock::duration;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<throwing_clock>;
    [[maybe_unused]] static constexpr bool is_steady = true;  // a chrono Clock; unused here

    static inline std::atomic<int> throws{0};

    static time_point now() noexcept { return time_point{manual_clock::now().time_since_epoch()}; }

    template <class CV>
    static void wait_until(CV& cv, std::unique_lock<std::mutex>& lk, time_point tp,
                           std::stop_token st) {
        for (int n = throws.load(); n > 0;) {
            if (throws.compare_exchange_weak(n, n - 1)) throw std::runtime_error("wait hook");
        }
        manual_clock::wait_until(cv, lk, manual_clock::time_point{tp.time_since_epoch()},
                                 std::move(st));
    }
};

struct titem {
    int id;
    throwing_clock::time_point at;
    throwing_clock::time_point deadline() const noexcept { return at; }
};

}  // namespace

TEST_CASE("a leader whose sleep throws hands the lead on", "[exceptions]") {
    // Before the fix: the throwing leader left leader_ pointing into its finished call and its
    // sleeper count raised, so the follower slept on without a timer and was never woken:
    // waiting_takers() stayed 2, and the element, once due, was not taken.
    for (const bool stoppable_follower : {false, true}) {
        INFO("stoppable follower: " << stoppable_follower);
        manual_clock::reset();
        throwing_clock::throws = 0;
        delayq::delay_queue<titem, throwing_clock> q;
        q.put(titem{1, throwing_clock::time_point{10ms}});
        taker<titem> a([&] { return q.take(); });
        REQUIRE(eventually([&] { return q.waiting_takers() == 1; }));
        CHECK(manual_clock::sleepers() == 1);  // a leads
        std::stop_source never;
        taker<titem> b([&] { return stoppable_follower ? q.take(never.get_token()) : q.take(); });
        REQUIRE(eventually([&] { return q.waiting_takers() == 2; }));
        CHECK(manual_clock::sleepers() == 1);  // b follows, without a timer

        // Moving the clock short of the deadline wakes a; it leads again, and that sleep throws.
        throwing_clock::throws = 1;
        manual_clock::advance(1ms);
        REQUIRE(eventually([&] { return a.done.load(); }));
        CHECK(a.error);
        CHECK_FALSE(a.got);
        CHECK(q.size() == 1);

        // b leads now: one taker, asleep on the deadline.
        CHECK(eventually([&] { return q.waiting_takers() == 1 && manual_clock::sleepers() == 1; }));
        manual_clock::advance(9ms);
        const bool took = eventually([&] { return b.done.load(); });
        CHECK(took);
        if (!took) q.close();  // frees b
        REQUIRE(eventually([&] { return b.done.load(); }));
        REQUIRE(b.got);
        CHECK(b.got->id == 1);
        CHECK(q.waiting_takers() == 0);
    }
    throwing_clock::throws = 0;
}

TEST_CASE("a taker whose sleep throws as it waits for a put leaves no count behind",
          "[exceptions]") {
    // A taker with a time limit on an empty queue sleeps through the hook too (on its limit).
    // Before the fix: its sleeper count stayed raised (waiting_takers() read 1 after it left).
    manual_clock::reset();
    throwing_clock::throws = 1;
    delayq::delay_queue<titem, throwing_clock> q;
    CHECK_THROWS_AS(q.take_for(5ms), std::runtime_error);
    CHECK(q.waiting_takers() == 0);
    // and the queue works on
    q.put(titem{1, throwing_clock::time_point{}});
    CHECK(q.take_for(5ms));
    throwing_clock::throws = 0;
}

TEST_CASE("remove_if that removes the head wakes the leader to re-arm on the new head", "[wake]") {
    // Before the fix: nothing woke the leader; it slept on for the removed head's deadline, so no
    // new sleep began (sleeps_begun() did not move).
    manual_clock::reset();
    queue q;
    q.put(item{1, at(10ms)});
    q.put(item{2, at(50ms)});
    q.put(item{3, at(70ms)});
    std::vector<std::unique_ptr<taker<item>>> takers;
    for (int i = 0; i < 3; ++i) {
        takers.push_back(std::make_unique<taker<item>>([&] { return q.take(); }));
        REQUIRE(eventually([&] { return q.waiting_takers() == std::size_t(i) + 1; }));
    }
    CHECK(manual_clock::sleepers() == 1);  // the first one leads, on 10 ms

    CHECK(q.remove_if([](const item& v) { return v.id == 3; }) == 1);  // not the head
    const auto before = manual_clock::sleeps_begun();
    CHECK(q.remove_if([](const item& v) { return v.id == 1; }) == 1);  // the head
    // Without the clock moving, a new timed sleep begins, and then one taker leads, on 50 ms.
    CHECK(eventually([&] {
        return manual_clock::sleeps_begun() > before && manual_clock::sleepers() == 1 &&
               q.waiting_takers() == 3;
    }));
    auto done = [&] {
        return std::count_if(takers.begin(), takers.end(), [](auto& t) { return t->done.load(); });
    };
    const auto looked = manual_clock::sleeps_begun();
    manual_clock::advance(49ms);
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > looked || done() > 0; }));
    CHECK(done() == 0);
    manual_clock::advance(1ms);
    CHECK(eventually([&] { return done() == 1; }));
    q.close();
    REQUIRE(eventually([&] { return done() == 3; }));
    int got = 0;
    for (auto& t : takers) {
        if (t->got) {
            CHECK(t->got->id == 2);
            ++got;
        }
    }
    CHECK(got == 1);
}

TEST_CASE("clear wakes the leader which then sleeps without a timer", "[wake]") {
    // Before the fix: the leader slept on for the cleared head's deadline (sleepers() stayed 1).
    manual_clock::reset();
    queue q;
    q.put(item{1, at(10ms)});
    taker<item> t([&] { return q.take(); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 1 && manual_clock::sleepers() == 1; }));
    q.clear();
    CHECK(eventually([&] { return q.waiting_takers() == 1 && manual_clock::sleepers() == 0; }));
    // It still takes what comes.
    q.put(item{2, at(20ms)});
    REQUIRE(eventually([&] { return manual_clock::sleepers() == 1; }));
    manual_clock::advance(20ms);
    REQUIRE(eventually([&] { return t.done.load(); }));
    REQUIRE(t.got);
    CHECK(t.got->id == 2);
}

TEST_CASE(
    "a backward clock step: nothing early or lost and what was due comes out once the clock is "
    "back") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(10ms)});
    q.put(item{2, at(20ms)});
    q.put(item{3, at(30ms)});
    manual_clock::set(at(25ms));  // 1 and 2 are due
    manual_clock::set(at(5ms));   // and not any more: due-ness is judged by the clock as it reads
    CHECK_FALSE(q.poll());
    CHECK_FALSE(q.take_for(0ms));
    std::vector<item> out;
    CHECK(q.drain_to(std::back_inserter(out)) == 0);
    CHECK(q.size() == 3);
    CHECK(q.next_deadline() == at(10ms));

    // A leader asleep on 10 ms when the clock steps back keeps waiting for 10 ms.
    taker<item> t([&] { return q.take(); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 1 && manual_clock::sleepers() == 1; }));
    auto before = manual_clock::sleeps_begun();
    manual_clock::set(mtp::min());
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before; }));  // it looked
    before = manual_clock::sleeps_begun();
    manual_clock::set(at(10ms) - 1ns);
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before || t.done; }));
    CHECK_FALSE(t.done);
    manual_clock::set(at(10ms));
    REQUIRE(eventually([&] { return t.done.load(); }));
    REQUIRE(t.got);
    CHECK(t.got->id == 1);

    // A time limit is a point on the clock (take_for: now + d at the call): a step back makes the
    // wait longer by as much.
    manual_clock::set(at(12ms));
    taker<item> limited([&] { return q.take_for(5ms); });  // until 17 ms
    REQUIRE(eventually([&] { return q.waiting_takers() == 1; }));
    before = manual_clock::sleeps_begun();
    manual_clock::set(at(2ms));
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before; }));
    before = manual_clock::sleeps_begun();
    manual_clock::set(at(16ms));
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before || limited.done; }));
    CHECK_FALSE(limited.done);
    manual_clock::set(at(17ms));
    REQUIRE(eventually([&] { return limited.done.load(); }));
    CHECK_FALSE(limited.got);

    // From the start of the time line to its end: the rest comes out in order.
    manual_clock::set(mtp::min());
    CHECK_FALSE(q.poll());
    manual_clock::set(mtp::max());
    CHECK(q.drain_to(std::back_inserter(out)) == 2);
    CHECK(ids(out) == std::vector<int>{2, 3});
    manual_clock::reset();
}

TEST_CASE("backward clock steps under blocked takers: each element taken once and never early") {
    // The clock moves only while every taker sleeps, so a taker may compare what it got with the
    // clock: the clock cannot have moved between the queue's check and the taker's.
    manual_clock::reset();
    queue q;
    constexpr int n = 200, k = 4;
    for (int i = 1; i <= n; ++i) q.put(item{i, at(std::chrono::milliseconds(i))});
    std::vector<std::atomic<int>> seen(n + 1);
    std::atomic<int> taken{0}, early{0};
    std::vector<std::jthread> threads;
    for (int c = 0; c < k; ++c) {
        threads.emplace_back([&] {
            while (auto v = q.take()) {
                if (v->at > manual_clock::now()) early.fetch_add(1);
                seen[v->id].fetch_add(1);
                taken.fetch_add(1);
            }
        });
    }
    // Forwards to m ms, then back, several times: m elements are due, then none more until the
    // clock passes m again.
    for (const int m : {50, 120, 120, 170, 200}) {
        manual_clock::set(at(std::chrono::milliseconds(m)));
        REQUIRE(eventually([&] { return taken.load() == m && q.waiting_takers() == k; }));
        const auto before = manual_clock::sleeps_begun();
        manual_clock::set(at(std::chrono::milliseconds(m / 3)));
        REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before || m == n; }));
        REQUIRE(eventually([&] { return q.waiting_takers() == k; }));
        CHECK(taken.load() == m);
    }
    CHECK(q.close().empty());
    threads.clear();  // joins: close() woke them all
    CHECK(taken.load() == n);
    CHECK(early.load() == 0);
    int wrong = 0;
    for (int i = 1; i <= n; ++i) wrong += seen[i].load() != 1;
    CHECK(wrong == 0);
    manual_clock::reset();
}
