#include <algorithm>
#include <atomic>
#include <delayq/delay_queue.hpp>
#include <delayq/manual_clock.hpp>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using delayq::manual_clock;
using delayq::test::eventually;
using mtp = manual_clock::time_point;

namespace {

struct item {
    int id;
    mtp at;
    mtp deadline() const noexcept { return at; }
    friend bool operator==(const item&, const item&) = default;
};

using queue = delayq::delay_queue<item, manual_clock>;

mtp at(std::chrono::milliseconds d) {
    return mtp{d};
}

std::vector<int> ids(const std::vector<item>& v) {
    std::vector<int> out;
    for (auto& i : v) out.push_back(i.id);
    return out;
}

// A taker on its own thread, whose result the test can watch.
struct taker {
    std::atomic<bool> done{false};
    std::optional<item> got;
    std::jthread thread;

    template <class F>
    explicit taker(F take) {
        thread = std::jthread([this, take] {
            got = take();
            done = true;
        });
    }
};

}  // namespace

TEST_CASE("an empty delay_queue") {
    manual_clock::reset();
    queue q;
    CHECK(q.empty());
    CHECK(q.size() == 0);
    CHECK_FALSE(q.poll());
    CHECK_FALSE(q.peek());
    CHECK_FALSE(q.next_deadline());
    std::vector<item> out;
    CHECK(q.drain_to(std::back_inserter(out)) == 0);
    CHECK(q.remove_if([](const item&) { return true; }) == 0);
    CHECK_FALSE(q.take_for(0ms));
    CHECK_FALSE(q.closed());
    CHECK(q.close().empty());
    CHECK(q.closed());
}

TEST_CASE("elements come out in deadline order, ties first in first out") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(30ms)});
    q.put(item{2, at(10ms)});
    q.put(item{3, at(20ms)});
    q.put(item{4, at(10ms)});
    q.put(item{5, at(10ms)});
    CHECK(q.size() == 5);
    CHECK(q.next_deadline() == at(10ms));
    manual_clock::advance(1h);
    std::vector<int> order;
    while (auto v = q.poll()) order.push_back(v->id);
    CHECK(order == std::vector<int>{2, 4, 5, 3, 1});
}

TEST_CASE("ordering holds against a sorted reference for random deadlines") {
    manual_clock::reset();
    queue q;
    std::mt19937 rng(7);
    std::vector<item> ref;
    for (int i = 0; i < 2000; ++i) {
        item it{i, at(std::chrono::milliseconds(rng() % 100))};
        ref.push_back(it);
        q.put(it);
        if (rng() % 4 == 0) {  // interleave pops with puts
            manual_clock::set(at(std::chrono::milliseconds(rng() % 100)));
            auto v = q.poll();
            std::stable_sort(ref.begin(), ref.end(), [](auto& a, auto& b) { return a.at < b.at; });
            if (ref.front().at <= manual_clock::now()) {
                REQUIRE(v);
                CHECK(*v == ref.front());
                ref.erase(ref.begin());
            } else {
                CHECK_FALSE(v);
            }
        }
    }
    manual_clock::set(mtp::max());
    std::stable_sort(ref.begin(), ref.end(), [](auto& a, auto& b) { return a.at < b.at; });
    std::vector<item> rest;
    q.drain_to(std::back_inserter(rest));
    CHECK(rest == ref);
}

TEST_CASE("peek shows a head that is not due, and poll does not take it") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(10ms)});
    REQUIRE(q.peek());
    CHECK(q.peek()->id == 1);
    CHECK_FALSE(q.poll());
    CHECK(q.size() == 1);
    manual_clock::advance(9ms);
    CHECK_FALSE(q.poll());
    manual_clock::advance(1ms);
    auto v = q.poll();
    REQUIRE(v);
    CHECK(v->id == 1);
    CHECK(q.empty());
}

TEST_CASE("deadlines in the past are due at once") {
    manual_clock::set(at(1h));
    queue q;
    q.put(item{1, mtp::min()});
    q.put(item{2, at(0ms)});
    CHECK(q.poll()->id == 1);
    CHECK(q.poll()->id == 2);
}

TEST_CASE("drain_to moves only due elements, in order, at most max") {
    manual_clock::reset();
    queue q;
    for (int i = 0; i < 10; ++i) q.put(item{i, at(std::chrono::milliseconds(10 * i))});
    manual_clock::set(at(45ms));  // 0..4 due
    std::vector<item> out;
    CHECK(q.drain_to(std::back_inserter(out), 2) == 2);
    CHECK(ids(out) == std::vector<int>{0, 1});
    CHECK(q.drain_to(std::back_inserter(out)) == 3);
    CHECK(ids(out) == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(q.drain_to(std::back_inserter(out)) == 0);
    CHECK(q.size() == 5);
    CHECK(q.drain_to(std::back_inserter(out), 0) == 0);
}

TEST_CASE("remove_if removes matching elements, due or not, and keeps the order") {
    manual_clock::reset();
    queue q;
    for (int i = 0; i < 10; ++i) q.put(item{i, at(std::chrono::milliseconds(10 * i))});
    manual_clock::set(at(25ms));                                           // 0, 1, 2 due
    CHECK(q.remove_if([](const item& v) { return v.id % 2 == 1; }) == 5);  // 1 due; 3,5,7,9 not
    CHECK(q.size() == 5);
    CHECK(q.remove_if([](const item&) { return false; }) == 0);
    CHECK_THROWS_AS(q.remove_if([](const item& v) -> bool {
        if (v.id == 4) throw std::runtime_error("pred");
        return true;
    }),
                    std::runtime_error);
    CHECK(q.size() == 5);  // a throwing predicate removes nothing
    manual_clock::set(mtp::max());
    std::vector<item> out;
    q.drain_to(std::back_inserter(out));
    CHECK(ids(out) == std::vector<int>{0, 2, 4, 6, 8});
}

TEST_CASE("remove_if on a large queue rebuilds a heap that keeps the order, ties included") {
    manual_clock::reset();
    queue q;
    std::mt19937 rng(11);
    std::vector<item> ref;
    const auto by_deadline = [](auto& a, auto& b) { return a.at < b.at; };
    int id = 0;
    for (int round = 0; round < 40; ++round) {
        for (int i = 0; i < 300; ++i) {  // several levels of the heap, many equal deadlines
            item it{id++, at(std::chrono::milliseconds(rng() % 300))};
            ref.push_back(it);
            q.put(it);
        }
        const int k = 2 + static_cast<int>(rng() % 5), r = static_cast<int>(rng() % 2);
        const auto gone = [&](const item& v) { return v.id % k == r; };
        const auto n = static_cast<std::size_t>(std::count_if(ref.begin(), ref.end(), gone));
        CHECK(q.remove_if(gone) == n);
        std::erase_if(ref, gone);
        std::stable_sort(ref.begin(), ref.end(), by_deadline);
        for (int i = 0; i < 20 && !ref.empty(); ++i) {  // the heads, as the rebuilt heap has them
            manual_clock::set(ref.front().at);
            auto v = q.poll();
            REQUIRE(v);
            CHECK(*v == ref.front());
            ref.erase(ref.begin());
        }
    }
    REQUIRE(q.size() == ref.size());
    manual_clock::set(mtp::max());
    std::vector<item> out;
    q.drain_to(std::back_inserter(out));
    CHECK(out == ref);
}

TEST_CASE("clear empties the queue") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(1ms)});
    q.put(item{2, at(2ms)});
    q.clear();
    CHECK(q.empty());
    CHECK(q.put(item{3, at(3ms)}));
    CHECK(q.size() == 1);
}

TEST_CASE("close hands back everything in order, refuses puts, and is idempotent") {
    manual_clock::reset();
    delayq::delay_queue<std::unique_ptr<item>, manual_clock> q;
    q.put(std::make_unique<item>(item{1, at(20ms)}));
    q.put(std::make_unique<item>(item{2, at(10ms)}));
    CHECK(q.emplace(new item{3, at(15ms)}));
    auto rest = q.close();
    REQUIRE(rest.size() == 3);
    CHECK(rest[0]->id == 2);
    CHECK(rest[1]->id == 3);
    CHECK(rest[2]->id == 1);
    CHECK(q.closed());
    CHECK(q.empty());
    auto late = std::make_unique<item>(item{4, at(0ms)});
    CHECK_FALSE(q.put(std::move(late)));
    REQUIRE(late);  // untouched: nothing is lost
    CHECK(late->id == 4);
    CHECK(q.close().empty());
    CHECK_FALSE(q.take());  // closed: returns at once
}

TEST_CASE("move-only elements and delayed<V> work") {
    manual_clock::reset();
    delayq::delay_queue<delayq::delayed<std::unique_ptr<int>, manual_clock>, manual_clock> q;
    q.put(delayq::delay_for<manual_clock>(std::make_unique<int>(7), 5ms));
    q.emplace(std::make_unique<int>(8), at(1ms));
    manual_clock::advance(5ms);
    CHECK(*q.take()->value == 8);
    CHECK(*q.take()->value == 7);
}

TEST_CASE("take waits until the clock reaches the head's deadline, not before") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(10ms)});
    taker t([&] { return q.take(); });
    REQUIRE(eventually([] { return manual_clock::sleepers() == 1; }));
    const auto before = manual_clock::sleeps_begun();
    manual_clock::advance(10ms - 1ns);
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before || t.done; }));
    CHECK_FALSE(t.done);  // it looked at the clock, one nanosecond short, and slept again
    manual_clock::advance(1ns);
    REQUIRE(eventually([&] { return t.done.load(); }));
    REQUIRE(t.got);
    CHECK(t.got->id == 1);
}

TEST_CASE("take on an empty queue waits for a put") {
    manual_clock::reset();
    queue q;
    taker t([&] { return q.take(); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 1; }));
    CHECK(manual_clock::sleepers() == 0);  // nothing to time: it sleeps without a timer
    q.put(item{5, at(0ms)});
    REQUIRE(eventually([&] { return t.done.load(); }));
    CHECK(t.got->id == 5);
}

TEST_CASE("take_for and take_until give up on the clock") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(100ms)});
    taker a([&] { return q.take_for(10ms); });
    taker b([&] { return q.take_until(at(20ms)); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 2; }));
    manual_clock::advance(10ms);
    REQUIRE(eventually([&] { return a.done.load(); }));
    CHECK_FALSE(a.got);
    CHECK_FALSE(b.done);
    manual_clock::advance(10ms);
    REQUIRE(eventually([&] { return b.done.load(); }));
    CHECK_FALSE(b.got);
    CHECK(q.size() == 1);  // nothing taken
    // A limit already passed returns at once; a due head is still returned.
    CHECK_FALSE(q.take_until(at(0ms)));
    manual_clock::advance(80ms);
    CHECK(q.take_for(0ms)->id == 1);
}

TEST_CASE("take_for with a huge duration does not overflow") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(5ms)});
    taker t([&] { return q.take_for(std::chrono::hours::max()); });
    REQUIRE(eventually([] { return manual_clock::sleepers() == 1; }));
    manual_clock::advance(5ms);
    REQUIRE(eventually([&] { return t.done.load(); }));
    CHECK(t.got->id == 1);
}

TEST_CASE("leader-follower: only one taker sleeps on the head, and one element wakes one taker") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(10ms)});
    constexpr int K = 4;
    std::vector<std::unique_ptr<taker>> takers;
    for (int i = 0; i < K; ++i) takers.push_back(std::make_unique<taker>([&] { return q.take(); }));
    REQUIRE(eventually([&] { return q.waiting_takers() == K; }));
    CHECK(manual_clock::sleepers() == 1);  // the leader; the followers wait without a timer
    manual_clock::advance(10ms);
    auto done = [&] {
        return std::count_if(takers.begin(), takers.end(), [](auto& t) { return t->done.load(); });
    };
    REQUIRE(eventually([&] { return done() == 1 && q.waiting_takers() == K - 1; }));
    CHECK(q.empty());
    // The next element is led by exactly one of the remaining takers.
    q.put(item{2, at(20ms)});
    REQUIRE(eventually([&] { return manual_clock::sleepers() == 1; }));
    CHECK(done() == 1);
    manual_clock::advance(10ms);
    REQUIRE(eventually([&] { return done() == 2 && q.waiting_takers() == K - 2; }));
    q.close();
    REQUIRE(eventually([&] { return done() == K; }));
    int got = 0;
    for (auto& t : takers) got += t->got ? 1 : 0;
    CHECK(got == 2);
}

TEST_CASE("a put of an earlier element wakes the leader") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(100ms)});
    taker a([&] { return q.take(); });
    taker b([&] { return q.take(); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 2 && manual_clock::sleepers() == 1; }));
    const auto before = manual_clock::sleeps_begun();
    q.put(item{2, at(10ms)});
    // Someone must start a new timed sleep for the new head without the clock moving.
    REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > before; }));
    CHECK_FALSE(a.done);
    CHECK_FALSE(b.done);
    manual_clock::advance(10ms);
    REQUIRE(eventually([&] { return a.done || b.done; }));
    auto& first = a.done ? a : b;
    auto& second = a.done ? b : a;
    CHECK(first.got->id == 2);
    REQUIRE(eventually([&] { return q.waiting_takers() == 1 && manual_clock::sleepers() == 1; }));
    CHECK_FALSE(second.done);
    manual_clock::advance(90ms);
    REQUIRE(eventually([&] { return second.done.load(); }));
    CHECK(second.got->id == 1);
}

TEST_CASE("close wakes every blocked taker") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(1h)});
    std::vector<std::unique_ptr<taker>> takers;
    for (int i = 0; i < 5; ++i) takers.push_back(std::make_unique<taker>([&] { return q.take(); }));
    std::stop_source never;
    taker stoppable([&] { return q.take(never.get_token()); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 6; }));
    auto rest = q.close();
    CHECK(rest.size() == 1);
    for (auto& t : takers) {
        REQUIRE(eventually([&] { return t->done.load(); }));
        CHECK_FALSE(t->got);
    }
    REQUIRE(eventually([&] { return stoppable.done.load(); }));
    CHECK_FALSE(stoppable.got);
}

TEST_CASE("a stop request wakes exactly its own taker") {
    manual_clock::reset();
    queue q;
    q.put(item{1, at(1h)});
    std::stop_source s1, s2, s3;
    taker t1([&] { return q.take(s1.get_token()); });
    taker t2([&] { return q.take(s2.get_token()); });
    taker t3([&] { return q.take_for(2h, s3.get_token()); });
    REQUIRE(eventually([&] { return q.waiting_takers() == 3; }));
    s2.request_stop();
    REQUIRE(eventually([&] { return t2.done.load(); }));
    CHECK_FALSE(t2.got);
    REQUIRE(eventually([&] { return q.waiting_takers() == 2; }));
    CHECK_FALSE(t1.done);
    CHECK_FALSE(t3.done);
    CHECK(q.size() == 1);
    // The remaining two still work: the element goes to one of them.
    manual_clock::advance(1h);
    REQUIRE(eventually([&] { return t1.done || t3.done; }));
    s1.request_stop();
    s3.request_stop();
    REQUIRE(eventually([&] { return t1.done && t3.done; }));
    CHECK((t1.got.has_value() + t3.got.has_value()) == 1);
    // A token stopped before the call returns at once, even with a due element.
    std::stop_source stopped;
    stopped.request_stop();
    q.put(item{2, at(0ms)});
    CHECK_FALSE(q.take(stopped.get_token()));
    CHECK(q.size() == 1);
}

namespace {

// An element whose copy and move throw on demand.
struct fragile {
    static inline bool throw_on_copy = false;
    static inline bool throw_on_move = false;
    int id;
    mtp at;
    fragile(int i, mtp a) : id(i), at(a) {}
    fragile(const fragile& o) : id(o.id), at(o.at) {
        if (throw_on_copy) throw std::runtime_error("copy");
    }
    fragile(fragile&& o) : id(o.id), at(o.at) {
        if (throw_on_move) throw std::runtime_error("move");
        o.id = -1;
    }
    fragile& operator=(const fragile&) = default;
    fragile& operator=(fragile&&) = default;
    mtp deadline() const { return at; }
};

}  // namespace

TEST_CASE("put has the strong guarantee when a copy or move throws") {
    manual_clock::reset();
    delayq::delay_queue<fragile, manual_clock> q;
    for (int i = 0; i < 20; ++i) q.put(fragile(i, at(std::chrono::milliseconds(20 - i))));
    fragile x(100, at(0ms));
    fragile::throw_on_copy = true;
    CHECK_THROWS_AS(q.put(x), std::runtime_error);
    fragile::throw_on_copy = false;
    fragile::throw_on_move = true;
    CHECK_THROWS_AS(q.put(std::move(x)), std::runtime_error);
    CHECK(x.id == 100);  // the argument is untouched
    CHECK(q.size() == 20);
    CHECK(q.next_deadline() == at(1ms));
    // A throwing move out of the head leaves it in the queue.
    manual_clock::advance(1h);
    CHECK_THROWS_AS(q.poll(), std::runtime_error);
    CHECK(q.size() == 20);
    fragile::throw_on_move = false;
    std::vector<int> order;
    while (auto v = q.poll()) order.push_back(v->id);
    std::vector<int> expected;
    for (int i = 19; i >= 0; --i) expected.push_back(i);
    CHECK(order == expected);
}

TEST_CASE("stress: producers and consumers lose nothing and duplicate nothing") {
    // Real clock, random near deadlines: no timing is asserted, only conservation.
    using clock = std::chrono::steady_clock;
    struct job {
        int id;
        clock::time_point at;
        clock::time_point deadline() const { return at; }
    };
    delayq::delay_queue<job> q;
    constexpr int producers = 4, consumers = 4, per_producer = 20000;
    constexpr int total = producers * per_producer;
    std::vector<std::atomic<int>> seen(total);
    std::atomic<int> taken{0};
    std::atomic<int> refused{0};
    std::vector<std::jthread> threads;
    for (int c = 0; c < consumers; ++c) {
        threads.emplace_back([&, c] {
            std::mt19937 rng(c);
            for (;;) {
                std::optional<job> j;
                switch (rng() % 3) {
                    case 0:
                        j = q.take();
                        break;
                    case 1:
                        j = q.take_for(std::chrono::microseconds(rng() % 500));
                        break;
                    default:
                        j = q.poll();
                        break;
                }
                if (j) {
                    seen[j->id].fetch_add(1);
                    taken.fetch_add(1);
                } else if (q.closed()) {
                    return;
                }
            }
        });
    }
    std::vector<std::jthread> makers;
    for (int p = 0; p < producers; ++p) {
        makers.emplace_back([&, p] {
            std::mt19937 rng(100 + p);
            for (int i = 0; i < per_producer; ++i) {
                auto at = clock::now() + std::chrono::microseconds(rng() % 2000);
                if (!q.put(job{p * per_producer + i, at})) refused.fetch_add(1);
            }
        });
    }
    makers.clear();  // joins
    eventually([&] { return taken.load() == total; }, std::chrono::seconds(60));
    auto rest = q.close();
    threads.clear();
    for (auto& j : rest) seen[j.id].fetch_add(1);
    CHECK(refused.load() == 0);
    CHECK(taken.load() + static_cast<int>(rest.size()) == total);
    int wrong = 0;
    for (auto& s : seen) wrong += s.load() != 1;
    CHECK(wrong == 0);
}
