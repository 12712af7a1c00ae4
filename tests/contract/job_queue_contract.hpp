// The behaviour suite of delayq::job_queue, written once for every backend. A test file defines
// `delayq_contract_fixtures`, a std::tuple of fixture types, and then includes this header; each
// TEST_CASE below runs once per fixture.
//
// A fixture F is default-constructible (a fresh, empty queue: a temporary file, a new queue name on
// a server started for the test) and has
//   using queue = Q;                                        // satisfies delayq::job_queue
//   std::unique_ptr<Q> make(delayq_contract::settings s);   // a new handle on F's queue
// Each make() returns another handle on the same queue, as another process would open it: a
// handle must see what another handle put. settings carries what the tests vary.
//
// No assertion here bounds a wall-clock time tighter than seconds: the machines that run this are
// shared and slow. Waking is checked by what comes out (the earlier job, not the later one), and
// "never early" against the system clock, which every backend's deadlines are on.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <delayq/job_queue.hpp>
#include <delayq/worker.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "catch.hpp"

namespace delayq_contract {

using namespace std::chrono_literals;

/// What the tests vary between handles; the fixture maps it onto its backend's options.
struct settings {
    std::chrono::milliseconds lease = std::chrono::seconds(30);
    unsigned max_attempts = 0;
    std::chrono::milliseconds keep_dead{0};  // how long dead letters are kept (0: for ever)
    delayq::job_limits limits{};             // the handle's limits (none by default)
};

/// When the store made the lease of `j`, by the store's clock: its lease end less the lease.
template <class Job>
std::chrono::system_clock::time_point leased_at(const Job& j, std::chrono::milliseconds lease) {
    return j.lease_deadline - lease;
}

/// A deadline already due by any clock on this machine.
inline const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));

/// "j" followed by n (appended: g++ 12 warns wrongly of -Wrestrict inside "j" + to_string(n)).
inline std::string id_of(const char* prefix, std::size_t n) {
    std::string s(prefix);
    s += std::to_string(n);
    return s;
}

/// Waits up to 120 s, a bound nobody would call working, for `done()`; whether it came.
template <class F>
bool eventually(F done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!done()) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
}

/// |a - b| <= tolerance.
inline bool near(std::chrono::system_clock::time_point a, std::chrono::system_clock::time_point b,
                 std::chrono::milliseconds tolerance = std::chrono::seconds(5)) {
    return a - b <= tolerance && b - a <= tolerance;
}

}  // namespace delayq_contract

TEMPLATE_LIST_TEST_CASE("contract: the queue meets delayq::job_queue", "[contract]",
                        delayq_contract_fixtures) {
    STATIC_REQUIRE(delayq::job_queue<typename TestType::queue>);
}

TEMPLATE_LIST_TEST_CASE("contract: put, take, ack, and a binary payload goes through intact",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    const std::string payload("a\0b\r\n\xff", 6);
    REQUIRE(q->put_after("j1", payload, 0ms));
    CHECK(q->size() == 1);
    auto j = q->take(5s);
    REQUIRE(j);
    CHECK(j->id == "j1");
    CHECK(j->payload == payload);
    CHECK(j->attempts == 1);
    CHECK(j->deadline <= std::chrono::system_clock::now());
    CHECK(j->lease_deadline - j->deadline >= 30s);
    CHECK(q->size() == 1);  // leased still counts
    CHECK(q->ack(*j));
    CHECK_FALSE(q->ack(*j));
    CHECK(q->size() == 0);
    CHECK_FALSE(q->take(0ms));
}

TEMPLATE_LIST_TEST_CASE("contract: put is idempotent by id while the job is queued", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    CHECK(q->put("a", "first", past));
    CHECK_FALSE(q->put("a", "second", past));       // waiting
    CHECK_FALSE(q->put_after("a", "second", 0ms));  // waiting
    auto j = q->take(5s);
    REQUIRE(j);
    CHECK(j->payload == "first");
    CHECK_FALSE(q->put("a", "third", past));  // leased
    CHECK(q->size() == 1);
    CHECK(q->ack(*j));
    CHECK(q->put("a", "fourth", past));  // free again after ack
    CHECK(q->cancel("a"));
    CHECK(q->put("a", "fifth", past));  // and after cancel
    auto k = q->take(5s);
    REQUIRE(k);
    CHECK(k->payload == "fifth");
    CHECK(k->attempts == 1);  // a new job: its attempts start again
}

TEMPLATE_LIST_TEST_CASE("contract: jobs come out earliest first, never before their deadline",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put("c", "", past + 3ms));
    REQUIRE(q->put("a", "", past + 1ms));
    REQUIRE(q->put("b", "", past + 2ms));
    const auto later = std::chrono::system_clock::now() + 700ms;
    REQUIRE(q->put("later", "", later));
    for (const char* id : {"a", "b", "c"}) {
        auto j = q->take(5s);
        REQUIRE(j);
        CHECK(j->id == id);
        CHECK(q->ack(*j));
    }
    CHECK_FALSE(q->take(0ms));  // max_wait <= 0 does not block, and "later" is not due
    auto j = q->take(30s);
    REQUIRE(j);
    CHECK(j->id == "later");
    CHECK(std::chrono::system_clock::now() >= later);
    CHECK(j->deadline >= later - 1ms);
}

TEMPLATE_LIST_TEST_CASE("contract: nack redelivers, and an ack with an old token is refused",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_after("n", "x", 0ms));
    auto first = q->take(5s);
    REQUIRE(first);
    CHECK(q->nack(*first, 0ms));
    CHECK_FALSE(q->nack(*first, 0ms));  // settled: the lease is gone
    auto second = q->take(5s);
    REQUIRE(second);
    CHECK(second->id == "n");
    CHECK(second->attempts == 2);
    CHECK(second->token > first->token);
    CHECK_FALSE(q->ack(*first));  // fencing: the first delivery's token is stale
    CHECK(q->size() == 1);
    CHECK(q->ack(*second));
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: nack's retry_after delays the redelivery", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_after("r", "x", 0ms));
    auto j = q->take(5s);
    REQUIRE(j);
    const auto nacked = std::chrono::system_clock::now();
    REQUIRE(q->nack(*j, 500ms));
    CHECK_FALSE(q->take(0ms));
    auto again = q->take(30s);
    REQUIRE(again);
    CHECK(std::chrono::system_clock::now() >= nacked + 500ms);
    CHECK(again->attempts == 2);
    CHECK(q->ack(*again));
}

TEMPLATE_LIST_TEST_CASE(
    "contract: a lease that ends redelivers the job, and the late holder is fenced", "[contract]",
    delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 300ms});
    REQUIRE(q->put_after("l", "x", 0ms));
    auto first = q->take(5s);
    REQUIRE(first);
    CHECK(first->lease_deadline - first->deadline >= 300ms);
    auto second = q->take(30s);  // comes back once the lease ends
    REQUIRE(second);
    CHECK(std::chrono::system_clock::now() >= first->lease_deadline);
    CHECK(second->id == "l");
    CHECK(second->attempts == 2);
    CHECK(second->token > first->token);
    CHECK_FALSE(q->ack(*first));
    CHECK_FALSE(q->nack(*first, 0ms));
    CHECK(q->ack(*second));
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: after max_attempts deliveries a job is dead-lettered",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 300ms, .max_attempts = 2});
    REQUIRE(q->put_after("nacked", "x", 0ms));
    for (unsigned attempt = 1; attempt <= 2; ++attempt) {
        auto j = q->take(5s);
        REQUIRE(j);
        CHECK(j->attempts == attempt);
        CHECK(q->nack(*j, 0ms));
    }
    CHECK(q->size() == 0);
    CHECK(q->dead_size() == 1);
    CHECK_FALSE(q->take(0ms));

    // The lease ending counts as a failed delivery too.
    REQUIRE(q->put_after("expired", "y", 0ms));
    auto a = q->take(5s);
    REQUIRE(a);
    auto b = q->take(30s);  // after the first lease ended
    REQUIRE(b);
    CHECK(b->attempts == 2);
    // The second lease ends too; the job is dead once the queue notices (the next take).
    CHECK_FALSE(q->take(1500ms));
    CHECK(q->size() == 0);
    CHECK(q->dead_size() == 2);
    CHECK_FALSE(q->ack(*b));

    // A dead job's id is free again.
    CHECK(q->put_after("nacked", "z", 0ms));
    CHECK(q->size() == 1);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: extend moves a lease's end, and the holder's token keeps working", "[contract]",
    delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 2s});
    auto other = f.make({.lease = 2s});
    REQUIRE(q->put_after("x", "p", 0ms));
    auto j = q->take(5s);
    REQUIRE(j);
    CHECK(q->extend(*j, 60s));
    // Past the first lease's end, nobody else is handed the job: it is still leased.
    CHECK_FALSE(other->take(4s));
    CHECK(q->size() == 1);
    CHECK(q->extend(*j, 60s));        // as often as the holder likes
    CHECK(q->ack(*j));                // the same token
    CHECK_FALSE(q->extend(*j, 60s));  // settled
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: extend is fenced like ack", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 1s});
    REQUIRE(q->put_after("x", "p", 0ms));
    auto first = q->take(5s);
    REQUIRE(first);
    auto second = q->take(30s);  // once the first lease ended
    REQUIRE(second);
    CHECK(second->attempts == 2);
    CHECK_FALSE(q->extend(*first, 60s));  // the lease was lost, and the job delivered again
    CHECK(q->extend(*second, 60s));
    CHECK_FALSE(q->ack(*first));
    CHECK(q->nack(*second, 0ms));
    CHECK_FALSE(q->extend(*second, 60s));  // waiting again
    auto third = q->take(5s);
    REQUIRE(third);
    CHECK(q->cancel("x"));
    CHECK_FALSE(q->extend(*third, 60s));  // cancelled
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: a lease shortened by extend ends then, and a waiting take gets "
    "the job",
    "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    auto q = f.make({.lease = 120s});
    auto other = f.make({.lease = 120s});
    REQUIRE(q->put_after("x", "p", 0ms));
    auto j = q->take(5s);
    REQUIRE(j);
    std::optional<job> got;
    std::thread waiter([&] { got = other->take(60s); });
    std::this_thread::sleep_for(300ms);  // let it wait (a slow start only weakens the test)
    CHECK(q->extend(*j, 100ms));
    waiter.join();
    REQUIRE(got);  // not 120 s later
    CHECK(got->id == "x");
    CHECK(got->attempts == 2);
    CHECK_FALSE(q->ack(*j));
    CHECK(other->ack(*got));
}

TEMPLATE_LIST_TEST_CASE("contract: bury moves a leased job to the dead letters at once, fenced",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 1s, .max_attempts = 5});
    REQUIRE(q->put_after("x", "p", 0ms));
    auto first = q->take(5s);
    REQUIRE(first);
    auto second = q->take(30s);  // once the first lease ended
    REQUIRE(second);
    CHECK_FALSE(q->bury(*first));  // the lease was lost
    CHECK(q->dead_size() == 0);
    CHECK(q->bury(*second));
    CHECK_FALSE(q->bury(*second));
    CHECK_FALSE(q->ack(*second));
    CHECK(q->size() == 0);
    CHECK(q->dead_size() == 1);
    CHECK_FALSE(q->take(0ms));
    CHECK(q->put_after("x", "again", 0ms));  // a dead job's id is free again
    CHECK(q->size() == 1);
}

TEMPLATE_LIST_TEST_CASE("contract: a negative lease is std::invalid_argument for extend",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_after("x", "p", 0ms));
    auto j = q->take(5s);
    REQUIRE(j);
    CHECK_THROWS_AS(q->extend(*j, -1ms), std::invalid_argument);
    CHECK(q->ack(*j));  // the refused call changed nothing
}

TEMPLATE_LIST_TEST_CASE("contract: cancel removes a waiting or a leased job", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_after("w", "x", 60s));
    CHECK(q->cancel("w"));
    CHECK_FALSE(q->cancel("w"));
    CHECK_FALSE(q->cancel("unknown"));
    REQUIRE(q->put_after("l", "x", 0ms));
    auto j = q->take(5s);
    REQUIRE(j);
    CHECK(q->cancel("l"));
    CHECK_FALSE(q->ack(*j));  // the holder learns its job is gone
    CHECK_FALSE(q->nack(*j, 0ms));
    CHECK(q->size() == 0);
    CHECK(q->dead_size() == 0);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: a job cancelled through another handle is not handed out by a later take",
    "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto consumer = f.make({});
    auto admin = f.make({});
    REQUIRE(consumer->put("a", "x", past));
    REQUIRE(consumer->put("b", "y", past + 1ms));
    auto a = consumer->take(5s);
    REQUIRE(a);
    CHECK(a->id == "a");
    CHECK(consumer->ack(*a));  // a queue may do more here; b must still be cancellable
    CHECK(admin->cancel("b"));
    auto after = consumer->take(0ms);  // began after the cancel returned true
    CHECK_FALSE(after);
    CHECK(consumer->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: reschedule moves a waiting job only", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    CHECK_FALSE(q->reschedule("unknown", 0ms));
    REQUIRE(q->put_after("w", "x", 60s));
    CHECK_FALSE(q->take(0ms));
    CHECK(q->reschedule("w", 0ms));
    auto j = q->take(30s);
    REQUIRE(j);
    CHECK(j->id == "w");
    CHECK_FALSE(q->reschedule("w", 0ms));  // leased
    CHECK(q->ack(*j));
    REQUIRE(q->put("v", "x", past));
    CHECK(q->reschedule("v", 60s));  // later: no longer due
    CHECK_FALSE(q->take(0ms));
    CHECK(q->size() == 1);
}

TEMPLATE_LIST_TEST_CASE("contract: put_many, take_many and ack_many", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    using request = delayq::put_request_t<typename TestType::queue>;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    auto q = f.make({});
    std::vector<std::string> ids;
    for (std::size_t i = 0; i < 10; ++i) ids.push_back(id_of("m", i));
    std::vector<request> reqs;
    for (std::size_t i = 0; i < ids.size(); ++i)
        reqs.push_back(request{ids[i], "p", std::chrono::milliseconds(0)});
    reqs.push_back(request{ids[3], "dup", std::chrono::milliseconds(0)});  // refused
    const auto put = q->put_many(reqs);
    REQUIRE(put.size() == 11);
    CHECK(std::count(put.begin(), put.end(), true) == 10);
    CHECK_FALSE(put.back());
    CHECK(q->size() == 10);
    CHECK(q->put_many(std::vector<request>{}).empty());

    std::vector<job> got;
    for (int round = 0; round < 20 && got.size() < 10; ++round) {
        auto some = q->take_many(20, 5s);
        CHECK_FALSE(some.empty());
        for (auto& j : some) got.push_back(std::move(j));
    }
    REQUIRE(got.size() == 10);
    std::set<std::string> seen;
    std::set<std::uint64_t> tokens;
    for (const auto& j : got) {
        seen.insert(j.id);
        tokens.insert(j.token);
        CHECK(j.attempts == 1);
        CHECK(j.payload == "p");
    }
    CHECK(seen.size() == 10);
    CHECK(tokens.size() == 10);  // every job its own lease
    const auto acked = q->ack_many(got);
    CHECK(std::count(acked.begin(), acked.end(), true) == 10);
    const auto again = q->ack_many(got);
    CHECK(std::count(again.begin(), again.end(), true) == 0);
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: take_many(0, ...) returns nothing at once and leases nothing",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using steady = std::chrono::steady_clock;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put("a", "x", past));
    auto start = steady::now();
    CHECK(q->take_many(0, 20s).empty());
    CHECK(steady::now() - start < 10s);  // did not wait for its max_wait
    auto j = q->take(0ms);               // still waiting, its attempts uncounted
    REQUIRE(j);
    CHECK(j->attempts == 1);
    CHECK(q->ack(*j));
    start = steady::now();
    CHECK(q->take_many(0, 20s).empty());  // nothing due: no wait either
    CHECK(steady::now() - start < 10s);
}

TEMPLATE_LIST_TEST_CASE("contract: take_many leases at most max_take_many jobs, whatever it asks",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using request = delayq::put_request_t<typename TestType::queue>;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    auto q = f.make({});
    const std::size_t total = delayq::max_take_many + 100;
    std::vector<std::string> ids;
    for (std::size_t i = 0; i < total; ++i) ids.push_back(id_of("c", i));
    std::vector<request> reqs;
    for (const auto& id : ids) reqs.push_back(request{id, "p", std::chrono::milliseconds(0)});
    const auto put = q->put_many(reqs);
    REQUIRE(std::count(put.begin(), put.end(), true) == static_cast<std::ptrdiff_t>(total));
    std::set<std::string> seen;
    for (int round = 0; round < 100 && seen.size() < total; ++round) {
        std::vector<job> some = q->take_many(2 * total, 5s);
        CHECK(some.size() <= delayq::max_take_many);
        for (const auto& j : some) seen.insert(j.id);
        const auto acked = q->ack_many(some);
        CHECK(std::count(acked.begin(), acked.end(), true) ==
              static_cast<std::ptrdiff_t>(some.size()));
    }
    CHECK(seen.size() == total);
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: a job id is 1 to max_id_size bytes, else std::invalid_argument",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using request = delayq::put_request_t<typename TestType::queue>;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    auto q = f.make({});
    const std::string longest(delayq::max_id_size, 'i');
    REQUIRE(q->put(longest, "x", past));
    auto j = q->take(5s);
    REQUIRE(j);
    CHECK(j->id == longest);
    CHECK(q->ack(*j));

    for (const std::string& bad : {std::string(), std::string(delayq::max_id_size + 1, 'i')}) {
        INFO("an id of " << bad.size() << " bytes");
        CHECK_THROWS_AS(q->put(bad, "x", past), std::invalid_argument);
        CHECK_THROWS_AS(q->put_after(bad, "x", 0ms), std::invalid_argument);
        CHECK_THROWS_AS(q->cancel(bad), std::invalid_argument);
        CHECK_THROWS_AS(q->reschedule(bad, 0ms), std::invalid_argument);
        const std::vector<request> reqs{request{"fine", "x", 0ms}, request{bad, "x", 0ms}};
        CHECK_THROWS_AS(q->put_many(reqs), std::invalid_argument);
        job forged = *j;
        forged.id = bad;
        CHECK_THROWS_AS(q->ack(forged), std::invalid_argument);
        CHECK_THROWS_AS(q->nack(forged, 0ms), std::invalid_argument);
        CHECK_THROWS_AS(q->extend(forged, 1s), std::invalid_argument);
        CHECK_THROWS_AS(q->bury(forged), std::invalid_argument);
        CHECK_THROWS_AS(q->ack_many(std::vector<job>{forged}), std::invalid_argument);
    }
    CHECK(q->size() == 0);  // a put_many with one bad id puts none of its jobs
}

TEMPLATE_LIST_TEST_CASE("contract: a take waiting for a later job wakes for an earlier put",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_after("late", "x", 60s));
    std::atomic<bool> waiting{false};
    std::optional<delayq::job_type_t<typename TestType::queue>> got;
    std::thread taker([&] {
        waiting = true;
        got = q->take(30s);
    });
    while (!waiting) std::this_thread::yield();
    std::this_thread::sleep_for(200ms);  // most likely asleep in take by now; either way works
    REQUIRE(q->put_after("early", "y", 0ms));
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "early");
    CHECK(q->ack(*got));
}

TEMPLATE_LIST_TEST_CASE("contract: another handle's put wakes a waiting take", "[contract]",
                        delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto consumer = f.make({});
    auto producer = f.make({});
    REQUIRE(producer->put_after("late", "x", 60s));
    std::optional<delayq::job_type_t<typename TestType::queue>> got;
    std::thread taker([&] { got = consumer->take(30s); });
    std::this_thread::sleep_for(200ms);
    REQUIRE(producer->put_after("early", "y", 0ms));
    taker.join();
    REQUIRE(got);
    CHECK(got->id == "early");
    CHECK(producer->ack(*got));  // a lease is the queue's, not the handle's
    CHECK(consumer->size() == 1);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: a stop request ends blocked takes, and a stopped take leases "
    "nothing",
    "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    auto q = f.make({});
    auto other = f.make({});
    std::stop_source stop;
    std::atomic<int> returned{0};
    std::optional<job> one;
    std::vector<job> many{job{}};
    std::vector<job> others{job{}};
    const auto start = std::chrono::steady_clock::now();
    // Three takes blocked on an empty queue, two handles, waits that no test waits out.
    std::thread a([&] {
        one = q->take(120s, stop.get_token());
        ++returned;
    });
    std::thread b([&] {
        many = q->take_many(10, 120s, stop.get_token());
        ++returned;
    });
    std::thread c([&] {
        others = other->take_many(3, 120s, stop.get_token());
        ++returned;
    });
    std::this_thread::sleep_for(300ms);  // let them block (a slow start only weakens the test)
    CHECK(returned == 0);
    stop.request_stop();
    a.join();
    b.join();
    c.join();
    // Woken, not timed out: a bound a user would call broken, not a timing.
    CHECK(std::chrono::steady_clock::now() - start < 60s);
    CHECK_FALSE(one);
    CHECK(many.empty());
    CHECK(others.empty());

    // A take that starts with stop requested leases nothing, even with a job due.
    REQUIRE(q->put_after("j1", "x", 0ms));
    CHECK_FALSE(q->take(5s, stop.get_token()));
    CHECK(q->take_many(5, 0ms, stop.get_token()).empty());
    auto j = other->take(5s);
    REQUIRE(j);
    CHECK(j->id == "j1");
    CHECK(j->attempts == 1);  // its first delivery: the stopped takes leased nothing
    CHECK(q->ack(*j));
}

TEMPLATE_LIST_TEST_CASE("contract: 4 producers and 4 consumers, every job in and out once",
                        "[contract]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    constexpr std::size_t producers = 4, consumers = 4, per_producer = 300;
    constexpr std::size_t total = producers * per_producer;
    std::mutex m;
    std::map<std::string, int> acked;
    // Catch's assertions are not thread-safe: the threads count, the test checks after.
    std::atomic<std::size_t> done{0}, early{0}, put_refused{0}, garbled{0};
    std::vector<std::thread> threads;
    for (std::size_t p = 0; p < producers; ++p)
        threads.emplace_back([&, p] {
            for (std::size_t i = 0; i < per_producer; ++i) {
                const std::string id = id_of(p == 0 ? "a" : p == 1 ? "b" : p == 2 ? "c" : "d", i);
                const auto delay = std::chrono::milliseconds((i * 7 + p * 13) % 200);
                if (!q->put_after(id, id, delay)) ++put_refused;
            }
        });
    for (std::size_t c = 0; c < consumers; ++c)
        threads.emplace_back([&] {
            while (done < total) {
                auto j = q->take(200ms);
                if (!j) continue;
                if (std::chrono::system_clock::now() < j->deadline) ++early;
                if (j->payload != j->id) ++garbled;
                if (q->ack(*j)) {
                    std::lock_guard lk(m);
                    ++acked[j->id];
                    ++done;
                }
            }
        });
    for (auto& t : threads) t.join();
    CHECK(put_refused == 0);
    CHECK(early == 0);
    CHECK(garbled == 0);
    CHECK(acked.size() == total);
    CHECK(std::all_of(acked.begin(), acked.end(), [](const auto& e) { return e.second == 1; }));
    CHECK(q->size() == 0);
}

// delayq::worker over every backend: the worker's own rules are in tests/test_worker.cpp, over a
// queue in memory; these are what must hold against each store.

TEMPLATE_LIST_TEST_CASE("contract: a worker on each of two handles does every job once",
                        "[contract][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    auto other = f.make({});
    constexpr std::size_t jobs = 200;
    for (std::size_t i = 0; i < jobs; ++i)
        REQUIRE(q->put_after(id_of("w", i), "p", std::chrono::milliseconds(i % 50)));
    std::mutex m;
    std::map<std::string, int> runs;
    const auto handler = [&](const delayq::job& j) {
        std::lock_guard lk(m);
        ++runs[j.id];
    };
    {
        delayq::worker a(*q, handler, {.threads = 2});
        delayq::worker b(*other, handler, {.threads = 2});
        CHECK(eventually([&] { return a.counters().done + b.counters().done >= jobs; }));
    }
    CHECK(runs.size() == jobs);
    CHECK(std::all_of(runs.begin(), runs.end(), [](const auto& e) { return e.second == 1; }));
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: a worker's handler that runs four leases long runs once",
                        "[contract][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 1s});
    auto other = f.make({.lease = 1s});
    REQUIRE(q->put_after("long", "p", 0ms));
    std::atomic<int> runs{0};
    const auto handler = [&](const delayq::job&) {
        ++runs;
        std::this_thread::sleep_for(4s);
    };
    {
        delayq::worker a(*q, handler);
        delayq::worker b(*other, handler);  // would be handed the job if a lease ended
        CHECK(eventually([&] { return a.counters().done + b.counters().done >= 1; }));
        CHECK(a.counters().lease_lost + b.counters().lease_lost == 0);
    }
    CHECK(runs == 1);
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: a worker's failing job is retried, then dead-lettered",
                        "[contract][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 3});
    REQUIRE(q->put_after("bad", "p", 0ms));
    REQUIRE(q->put_after("hopeless", "p", 0ms));
    std::atomic<int> bad_runs{0}, hopeless_runs{0};
    {
        delayq::worker w(*q,
                         [&](const delayq::job& j) {
                             if (j.id == "hopeless") {
                                 ++hopeless_runs;
                                 throw delayq::dead_letter("no such order");
                             }
                             ++bad_runs;
                             throw std::runtime_error("fails every time");
                         },
                         {.retry = {.base = 10ms, .cap = 50ms}});
        CHECK(eventually([&] { return w.counters().dead >= 2; }));
        CHECK(w.counters().retried == 2);
    }
    CHECK(bad_runs == 3);
    CHECK(hopeless_runs == 1);
    CHECK(q->dead_size() == 2);
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: stop() of a worker whose threads wait on an empty queue "
    "returns at once",
    "[contract][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    delayq::worker w(*q, [](const delayq::job&) {}, {.threads = 4});
    std::this_thread::sleep_for(300ms);  // let them block (a slow start only weakens the test)
    const auto start = std::chrono::steady_clock::now();
    w.stop();
    CHECK(std::chrono::steady_clock::now() - start < 30s);  // woken, not an hour's wait
}

TEMPLATE_LIST_TEST_CASE(
    "contract: get() tells a job's state, time, attempts, payload and last error",
    "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    auto other = f.make({});
    const std::string payload("a\0b", 3);
    const auto later = std::chrono::system_clock::now() + 1h;
    REQUIRE(q->put("now", payload, past));
    REQUIRE(q->put("later", "p", later));
    CHECK_FALSE(q->get("nobody").has_value());

    auto i = other->get("later");  // another handle sees it
    REQUIRE(i.has_value());
    CHECK(i->id == "later");
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(near(i->time, later));
    CHECK(i->attempts == 0);
    CHECK(i->payload == "p");
    CHECK(i->last_error.empty());

    auto j = q->take(0ms);
    REQUIRE(j.has_value());
    REQUIRE(j->id == "now");
    i = other->get("now");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::leased);
    CHECK(near(i->time, j->lease_deadline));
    CHECK(i->attempts == 1);
    CHECK(i->payload == payload);

    REQUIRE(q->nack(*j, 1h, "the payment service said 503"));
    i = other->get("now");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(near(i->time, std::chrono::system_clock::now() + 1h));
    CHECK(i->attempts == 1);
    CHECK(i->last_error == "the payment service said 503");

    // A nack without a reason keeps the last one; a stale holder's reason is refused with it.
    REQUIRE(q->reschedule("now", 0ms));
    auto again = q->take(5s);
    REQUIRE(again.has_value());
    CHECK_FALSE(q->nack(*j, 0ms, "a stale holder"));
    REQUIRE(q->nack(*again, 1h));
    i = q->get("now");
    REQUIRE(i.has_value());
    CHECK(i->attempts == 2);
    CHECK(i->last_error == "the payment service said 503");

    REQUIRE(q->cancel("now"));
    CHECK_FALSE(q->get("now").has_value());
}

TEMPLATE_LIST_TEST_CASE(
    "contract: a dead letter keeps its last error, and dead() pages oldest first",
    "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 1});
    constexpr std::size_t n = 5;
    for (std::size_t k = 0; k < n; ++k) REQUIRE(q->put(id_of("d", k), "p", past));
    CHECK(q->dead(10, "").empty());
    std::vector<std::string> died;  // in that order, so they page in it
    for (std::size_t k = 0; k < n; ++k) {
        std::this_thread::sleep_for(3ms);  // each dies in a millisecond of its own
        auto j = q->take(0ms);
        REQUIRE(j.has_value());
        died.push_back(j->id);
        if (k % 2 == 0) {
            REQUIRE(q->nack(*j, 0ms, "reason " + j->id));
        } else {
            REQUIRE(q->bury(*j, "reason " + j->id));
        }
    }
    CHECK(q->dead_size() == n);
    CHECK(q->size() == 0);

    std::vector<std::string> seen;
    std::string after;
    for (int pages = 0; pages < 10; ++pages) {
        const auto page = q->dead(2, after);
        CHECK(page.size() <= 2);
        if (page.empty()) break;
        for (const auto& d : page) {
            CHECK(d.state == delayq::job_state::dead);
            CHECK(d.attempts == 1);
            CHECK(d.payload == "p");
            CHECK(near(d.time, std::chrono::system_clock::now(), 60s));
            CHECK(d.last_error == "reason " + d.id);
            seen.push_back(d.id);
        }
        after = page.back().id;
    }
    CHECK(seen == died);
    CHECK(q->dead(10, "not dead").empty());  // nothing follows a job that is not dead
    CHECK(q->dead(0, "").empty());

    const auto i = q->get("d3");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->last_error == "reason d3");

    // Put again, the id is queued, and get() tells the queued job.
    REQUIRE(q->put("d3", "new", past));
    const auto queued = q->get("d3");
    REQUIRE(queued.has_value());
    CHECK(queued->state == delayq::job_state::waiting);
    CHECK(queued->payload == "new");
    CHECK(queued->last_error.empty());
}

namespace delayq_contract {

/// The ids of a page of jobs, in its order.
inline std::vector<std::string> ids_of(const std::vector<delayq::job_info>& page) {
    std::vector<std::string> ids;
    for (const auto& j : page) ids.push_back(j.id);
    return ids;
}

/// Every job in `state`, page after page of `max`, each page after the last id of the one
/// before: their ids, in order.
template <class Q>
std::vector<std::string> paged(Q& q, delayq::job_state state, std::size_t max) {
    std::vector<std::string> ids;
    std::string after;
    for (int pages = 0; pages < 100; ++pages) {
        const auto page = q.jobs(state, max, after);
        CHECK(page.size() <= max);
        if (page.empty()) break;
        for (const auto& j : page) CHECK(j.state == state);
        const auto more = ids_of(page);
        ids.insert(ids.end(), more.begin(), more.end());
        after = page.back().id;
    }
    return ids;
}

}  // namespace delayq_contract

TEMPLATE_LIST_TEST_CASE("contract: jobs() pages waiting and leased jobs in time order",
                        "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using delayq::job_state;
    using V = std::vector<std::string>;
    TestType f;
    auto q = f.make({});
    CHECK(q->jobs(job_state::waiting, 10).empty());
    CHECK(q->jobs(job_state::leased, 10).empty());

    // Due times: "d" now, "c" in 50 minutes, "a" and "b" in an hour (the tie goes by id).
    const auto hour = std::chrono::system_clock::now() + 1h;
    REQUIRE(q->put("b", "pb", hour));
    REQUIRE(q->put("a", "pa", hour));
    REQUIRE(q->put("c", "pc", hour - 10min));
    REQUIRE(q->put("d", "pd", past));
    const auto all = q->jobs(job_state::waiting, 10);
    CHECK(ids_of(all) == V{"d", "c", "a", "b"});
    REQUIRE(all.size() == 4);
    CHECK(all[0].time == past);
    CHECK(all[0].payload == "pd");
    CHECK(all[0].attempts == 0);
    CHECK(near(all[2].time, hour));
    CHECK(all[2].payload == "pa");
    CHECK(paged(*q, job_state::waiting, 1) == V{"d", "c", "a", "b"});
    CHECK(paged(*q, job_state::waiting, 3) == V{"d", "c", "a", "b"});
    CHECK(ids_of(q->jobs(job_state::waiting, 2, "c")) == V{"a", "b"});
    CHECK(q->jobs(job_state::waiting, 10, "b").empty());  // the last one: nothing follows
    CHECK(q->jobs(job_state::leased, 10).empty());

    // A taken job moves from the waiting jobs to the leased ones, at its lease's end.
    auto d = q->take(5s);
    REQUIRE(d.has_value());
    REQUIRE(d->id == "d");
    CHECK(ids_of(q->jobs(job_state::waiting, 10)) == V{"c", "a", "b"});
    const auto leased = q->jobs(job_state::leased, 10);
    REQUIRE(leased.size() == 1);
    CHECK(leased[0].id == "d");
    CHECK(leased[0].state == job_state::leased);
    CHECK(leased[0].attempts == 1);
    CHECK(near(leased[0].time, d->lease_deadline, 1s));

    // Leases in the order they end: "c"'s, made shorter, ends before "d"'s.
    REQUIRE(q->reschedule("c", 0ms));
    auto c = q->take(5s);
    REQUIRE(c.has_value());
    REQUIRE(c->id == "c");
    REQUIRE(q->extend(*c, 10s));
    CHECK(paged(*q, job_state::leased, 1) == V{"c", "d"});
    CHECK(ids_of(q->jobs(job_state::leased, 10, "c")) == V{"d"});
    CHECK(ids_of(q->jobs(job_state::waiting, 10)) == V{"a", "b"});

    // An `after` that is not in the state asked for, or no job at all: an empty page.
    CHECK(q->jobs(job_state::waiting, 10, "d").empty());
    CHECK(q->jobs(job_state::leased, 10, "a").empty());
    CHECK(q->jobs(job_state::waiting, 10, "nobody").empty());
    CHECK(q->jobs(job_state::waiting, 0).empty());
    CHECK(q->jobs(job_state::leased, 0).empty());

    // The dead ones page as dead() does.
    REQUIRE(q->bury(*c, "no good"));
    CHECK(ids_of(q->jobs(job_state::dead, 10)) == V{"c"});
    CHECK(ids_of(q->jobs(job_state::dead, 10)) == ids_of(q->dead(10)));
    CHECK(q->jobs(job_state::dead, 10, "c").empty());
    CHECK(q->jobs(job_state::waiting, 10, "c").empty());
    CHECK(ids_of(q->jobs(job_state::leased, 10)) == V{"d"});
    CHECK_THROWS_AS(q->jobs(job_state::waiting, 10, std::string(delayq::max_id_size + 1, 'x')),
                    std::invalid_argument);
}

TEMPLATE_LIST_TEST_CASE("contract: jobs() pages through many jobs of one due time by id",
                        "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using delayq::job_state;
    TestType f;
    auto q = f.make({});
    // Pages of 3 that begin and end inside groups of jobs due at the same time: each page is the
    // next 3 in (due time, id) order, none skipped and none twice.
    const auto at = std::chrono::system_clock::now() + 1h;
    std::vector<std::string> want;
    for (int group = 0; group < 3; ++group)
        for (int i = 0; i < 7; ++i) {
            const std::string id =
                std::string(1, static_cast<char>('k' - group)) + std::to_string(i);
            REQUIRE(q->put(id, "p", at + group * 1min));
        }
    for (int group = 0; group < 3; ++group)
        for (int i = 0; i < 7; ++i)
            want.push_back(std::string(1, static_cast<char>('k' - group)) + std::to_string(i));
    CHECK(paged(*q, job_state::waiting, 3) == want);
    CHECK(paged(*q, job_state::waiting, 5) == want);
}

TEMPLATE_LIST_TEST_CASE("contract: a job whose lease ended is listed as waiting from that end",
                        "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using delayq::job_state;
    using V = std::vector<std::string>;
    TestType f;
    auto q = f.make({.lease = 200ms});
    REQUIRE(q->put("early", "p", past));
    REQUIRE(q->put("late", "p", std::chrono::system_clock::now() + 1h));
    auto j = q->take(5s);
    REQUIRE(j.has_value());
    REQUIRE(j->id == "early");
    CHECK(ids_of(q->jobs(job_state::leased, 10)) == V{"early"});
    CHECK(ids_of(q->jobs(job_state::waiting, 10)) == V{"late"});
    REQUIRE(eventually([&] { return q->jobs(job_state::leased, 10).empty(); }));
    const auto waiting = q->jobs(job_state::waiting, 10);
    CHECK(ids_of(waiting) == V{"early", "late"});
    REQUIRE(waiting.size() == 2);
    CHECK(near(waiting[0].time, j->lease_deadline, 1s));
    CHECK(paged(*q, job_state::waiting, 1) == V{"early", "late"});
    CHECK(ids_of(q->jobs(job_state::waiting, 10, "early")) == V{"late"});
}

TEMPLATE_LIST_TEST_CASE(
    "contract: bury without a reason keeps the last error, and a long reason is cut",
    "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put("kept", "p", past));
    auto j = q->take(0ms);
    REQUIRE(j.has_value());
    REQUIRE(q->nack(*j, 0ms, "first failure"));
    REQUIRE(q->put("long", "p", past));
    j = q->take(5s);
    REQUIRE(j.has_value());
    if (j->id != "kept") {  // "long" came first: due at the same time
        REQUIRE(q->nack(*j, 0ms));
        j = q->take(5s);
        REQUIRE(j.has_value());
    }
    REQUIRE(j->id == "kept");
    REQUIRE(q->bury(*j));
    auto i = q->get("kept");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->last_error == "first failure");

    auto l = q->take(5s);
    REQUIRE(l.has_value());
    REQUIRE(l->id == "long");
    std::string reason(delayq::max_reason_size + 100, 'x');
    reason.back() = 'y';
    REQUIRE(q->nack(*l, 1h, reason));
    i = q->get("long");
    REQUIRE(i.has_value());
    CHECK(i->last_error == std::string(delayq::max_reason_size, 'x'));
}

TEMPLATE_LIST_TEST_CASE("contract: a job whose last lease ends goes to the dead letters saying so",
                        "[contract][lookup]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 200ms, .max_attempts = 1});
    REQUIRE(q->put("crashed", "p", past));
    REQUIRE(q->take(0ms).has_value());  // and never settled, as by a consumer that crashed
    CHECK(eventually([&] {
        (void)q->take(0ms);  // a take finds the lease ended
        return q->dead_size() == 1;
    }));
    const auto i = q->get("crashed");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->attempts == 1);
    CHECK(i->last_error == std::string(delayq::lease_ended_reason));
}

TEMPLATE_LIST_TEST_CASE("contract: a worker's dead letter says what its handler threw",
                        "[contract][lookup][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 2});
    REQUIRE(q->put_after("bad", "p", 0ms));
    REQUIRE(q->put_after("hopeless", "p", 0ms));
    {
        delayq::worker w(*q,
                         [&](const delayq::job& j) {
                             if (j.id == "hopeless") throw delayq::dead_letter("no such order");
                             throw std::runtime_error("attempt " + std::to_string(j.attempts));
                         },
                         {.retry = {.base = 10ms, .cap = 50ms}});
        CHECK(eventually([&] { return w.counters().dead >= 2; }));
    }
    const auto bad = q->get("bad");
    REQUIRE(bad.has_value());
    CHECK(bad->state == delayq::job_state::dead);
    CHECK(bad->last_error == "attempt 2");
    const auto hopeless = q->get("hopeless");
    REQUIRE(hopeless.has_value());
    CHECK(hopeless->last_error == "no such order");
}

TEMPLATE_LIST_TEST_CASE(
    "contract: requeue_dead puts a dead letter back, attempts from 0, last error kept",
    "[contract][dead]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 1});
    auto other = f.make({.max_attempts = 1});
    REQUIRE(q->put("a", "p", past));
    REQUIRE(q->put("b", "p", past));
    for (int k = 0; k < 2; ++k) {
        auto j = q->take(0ms);
        REQUIRE(j.has_value());
        REQUIRE(q->nack(*j, 0ms, "failed " + j->id));
    }
    REQUIRE(q->dead_size() == 2);
    CHECK_THROWS_AS(q->requeue_dead("a", -1ms), std::invalid_argument);
    CHECK_FALSE(q->requeue_dead("nobody", 0ms));

    REQUIRE(other->requeue_dead("a", 0ms));  // from another handle: a take here wakes
    CHECK_FALSE(q->requeue_dead("a", 0ms));  // not dead any more
    CHECK(q->dead_size() == 1);
    auto i = q->get("a");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->attempts == 0);
    CHECK(i->payload == "p");
    CHECK(i->last_error == "failed a");
    auto j = q->take(5s);
    REQUIRE(j.has_value());
    CHECK(j->id == "a");
    CHECK(j->attempts == 1);
    CHECK(q->ack(*j));

    // Later, from now: not before its delay.
    REQUIRE(q->requeue_dead("b", 1h));
    i = q->get("b");
    REQUIRE(i.has_value());
    CHECK(near(i->time, std::chrono::system_clock::now() + 1h));
    CHECK_FALSE(q->take(0ms).has_value());

    // A dead letter whose id was put again stays dead: the queued job keeps the id.
    REQUIRE(q->cancel("b"));
    REQUIRE(q->put("c", "p", past));
    j = q->take(0ms);
    REQUIRE(j.has_value());
    REQUIRE(q->bury(*j, "gone"));
    REQUIRE(q->put("c", "new", past));
    CHECK_FALSE(q->requeue_dead("c", 0ms));
    CHECK(q->dead_size() == 1);
    i = q->get("c");
    REQUIRE(i.has_value());
    CHECK(i->payload == "new");
}

TEMPLATE_LIST_TEST_CASE("contract: purge_dead removes the dead letters older than asked",
                        "[contract][dead]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 1});
    for (std::size_t k = 0; k < 3; ++k) REQUIRE(q->put(id_of("d", k), "p", past));
    for (std::size_t k = 0; k < 3; ++k) {
        auto j = q->take(0ms);
        REQUIRE(j.has_value());
        REQUIRE(q->bury(*j));
    }
    CHECK_THROWS_AS(q->purge_dead(-1ms), std::invalid_argument);
    CHECK(q->purge_dead(1h) == 0);
    CHECK(q->dead_size() == 3);
    std::this_thread::sleep_for(20ms);  // each died at least a few ms before now
    CHECK(q->purge_dead(0ms) == 3);
    CHECK(q->dead_size() == 0);
    CHECK(q->dead(10, "").empty());
    CHECK_FALSE(q->get("d1").has_value());
}

TEMPLATE_LIST_TEST_CASE("contract: with keep_dead, a dead letter older than that goes",
                        "[contract][dead]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 1, .keep_dead = 100ms});
    REQUIRE(q->put("old", "p", past));
    auto j = q->take(0ms);
    REQUIRE(j.has_value());
    REQUIRE(q->bury(*j));
    std::this_thread::sleep_for(300ms);
    REQUIRE(q->put("new", "p", past));
    j = q->take(0ms);
    REQUIRE(j.has_value());
    REQUIRE(q->nack(*j, 0ms, "dies now"));
    // The older one, dead three times longer than kept, went when the new one died (or
    // before); the new one stays until it is that old itself.
    CHECK_FALSE(q->get("old").has_value());
    CHECK(q->get("new").has_value());
    CHECK(q->dead_size() == 1);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: pause stops the takes of every handle, everything else works, resume hands out "
    "again",
    "[contract][pause]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto a = f.make({});
    auto b = f.make({});
    CHECK_FALSE(a->paused());
    REQUIRE(a->put("held", "p", past));
    auto held = a->take(0ms);
    REQUIRE(held.has_value());

    b->pause();
    b->pause();  // idempotent
    CHECK(a->paused());
    CHECK(b->paused());
    REQUIRE(a->put("w1", "p", past));
    REQUIRE(a->put_after("w2", "p", 0ms));
    CHECK_FALSE(a->take(0ms).has_value());
    CHECK_FALSE(b->take(200ms).has_value());  // waits its max_wait, then nothing
    CHECK(a->take_many(10, 0ms).empty());
    // Everything but a take works: the held lease is extended, nacked, taken by nobody.
    CHECK(a->extend(*held, 30s));
    CHECK(a->nack(*held, 0ms, "while paused"));
    CHECK(a->reschedule("w2", 0ms));
    CHECK(a->get("held").has_value());
    CHECK(a->size() == 3);
    CHECK(a->cancel("w2"));
    std::this_thread::sleep_for(5ms);  // the nacked job's due time, rounded up to the next ms
    CHECK(b->take_many(10, 0ms).empty());

    a->resume();
    a->resume();  // idempotent
    CHECK_FALSE(b->paused());
    auto got = b->take_many(10, 5s);
    if (got.size() < 2) {  // a take_many may hand out what is due at one moment: take the rest
        auto more = b->take_many(10, 5s);
        got.insert(got.end(), more.begin(), more.end());
    }
    std::set<std::string> ids;
    for (const auto& j : got) ids.insert(std::string(j.id));
    CHECK(ids == std::set<std::string>{"held", "w1"});
    for (const auto& j : got) CHECK(b->ack(j));
    CHECK(a->size() == 0);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: a take blocked on a paused queue is woken by another handle's resume",
    "[contract][pause]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    auto consumer = f.make({});
    auto operator_ = f.make({});
    operator_->pause();
    REQUIRE(operator_->put("due", "p", past));
    std::atomic<bool> returned{false};
    std::optional<job> got;
    const auto start = std::chrono::steady_clock::now();
    std::thread taker([&] {
        got = consumer->take(120s);
        returned = true;
    });
    std::this_thread::sleep_for(500ms);  // a due job, a paused queue: the take stays blocked
    CHECK_FALSE(returned);
    operator_->resume();
    taker.join();
    // Woken, not timed out: a bound a user would call broken, not a timing.
    CHECK(std::chrono::steady_clock::now() - start < 60s);
    REQUIRE(got.has_value());
    CHECK(got->id == "due");
    CHECK(got->attempts == 1);
    CHECK(consumer->ack(*got));
}

TEMPLATE_LIST_TEST_CASE("contract: a stop request ends a take blocked on a paused queue",
                        "[contract][pause]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    q->pause();
    REQUIRE(q->put("due", "p", past));
    std::stop_source stop;
    const auto start = std::chrono::steady_clock::now();
    std::thread stopper([&] {
        std::this_thread::sleep_for(300ms);
        stop.request_stop();
    });
    CHECK(q->take_many(5, 120s, stop.get_token()).empty());
    stopper.join();
    CHECK(std::chrono::steady_clock::now() - start < 60s);
    q->resume();
    auto j = q->take(5s);
    REQUIRE(j.has_value());
    CHECK(j->attempts == 1);  // the stopped take leased nothing
    CHECK(q->ack(*j));
}

TEMPLATE_LIST_TEST_CASE("contract: a worker on a paused queue runs nothing until it is resumed",
                        "[contract][pause][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    auto other = f.make({});
    other->pause();
    REQUIRE(q->put("a", "p", past));
    REQUIRE(q->put("b", "p", past));
    std::atomic<int> ran{0};
    delayq::worker w(*q, [&](const delayq::job&) { ++ran; }, {.threads = 2});
    std::this_thread::sleep_for(500ms);
    CHECK(ran == 0);
    other->resume();
    CHECK(eventually([&] { return ran == 2; }));
    w.stop();
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: limits without a period or with a negative one are refused",
                        "[contract][limits]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    CHECK_THROWS_AS(f.make({.limits = {.max_leased = 0, .rate = 5, .period = 0ms}}),
                    std::invalid_argument);
    CHECK_THROWS_AS(f.make({.limits = {.max_leased = 0, .rate = 5, .period = -1ms}}),
                    std::invalid_argument);
    CHECK_THROWS_AS(f.make({.limits = {.max_leased = 0, .rate = 0, .period = 1s}}),
                    std::invalid_argument);
    CHECK(f.make({.limits = {.max_leased = 3, .rate = 0, .period = 0ms}}) != nullptr);
}

TEMPLATE_LIST_TEST_CASE(
    "contract: max_leased holds every handle's takes while that many jobs are leased, and an ack "
    "wakes a held take",
    "[contract][limits]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using job = delayq::job_type_t<typename TestType::queue>;
    TestType f;
    const settings s{.limits = {.max_leased = 2, .rate = 0, .period = 0ms}};
    auto a = f.make(s);
    auto b = f.make(s);
    for (std::size_t i = 0; i < 6; ++i) REQUIRE(a->put(id_of("j", i), "p", past));
    auto first = a->take_many(10, 5s);
    REQUIRE(first.size() <= 2);
    if (first.size() < 2) {
        auto more = b->take_many(10, 5s);
        first.insert(first.end(), more.begin(), more.end());
    }
    REQUIRE(first.size() == 2);
    CHECK_FALSE(a->take(0ms).has_value());
    CHECK(b->take_many(10, 200ms).empty());  // waits its max_wait, then nothing

    std::atomic<bool> returned{false};
    std::optional<job> got;
    std::thread taker([&] {
        got = b->take(120s);
        returned = true;
    });
    std::this_thread::sleep_for(300ms);
    CHECK_FALSE(returned);
    const auto start = std::chrono::steady_clock::now();
    CHECK(a->ack(first[0]));
    taker.join();
    CHECK(std::chrono::steady_clock::now() - start < 20s);  // woken by the ack, not a lease's end
    REQUIRE(got.has_value());
    CHECK_FALSE(a->take(0ms).has_value());  // first[1] and got: two leased again
    CHECK(b->nack(*got, 1h, "later"));
    auto next = a->take(5s);  // the nack ended a lease: one more may be leased
    REQUIRE(next.has_value());
    CHECK(a->ack(first[1]));
    CHECK(a->ack(*next));
    auto rest = a->take_many(10, 5s);
    CHECK(rest.size() <= 2);
    for (const auto& j : rest) CHECK(a->ack(j));
}

TEMPLATE_LIST_TEST_CASE("contract: a lease that runs out frees its place under max_leased",
                        "[contract][limits]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    const settings s{.lease = 500ms, .limits = {.max_leased = 1, .rate = 0, .period = 0ms}};
    auto a = f.make(s);
    auto b = f.make(s);
    REQUIRE(a->put("crashes", "p", past));
    REQUIRE(a->put("other", "p", past));
    auto held = a->take(5s);
    REQUIRE(held.has_value());
    // Never acked: the next lease comes once this one has ended, not before.
    auto next = b->take(60s);
    REQUIRE(next.has_value());
    CHECK(leased_at(*next, 500ms) >= held->lease_deadline - 2ms);
    CHECK(b->ack(*next));
}

TEMPLATE_LIST_TEST_CASE("contract: a rate of N per period leases N, then waits for the period",
                        "[contract][limits]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    const settings s{.limits = {.max_leased = 0, .rate = 2, .period = 1s}};
    auto a = f.make(s);
    auto b = f.make(s);
    for (std::size_t i = 0; i < 5; ++i) REQUIRE(a->put(id_of("r", i), "p", past));
    std::vector<delayq::job_type_t<typename TestType::queue>> got;
    while (got.size() < 5) {
        auto& q = got.size() % 2 == 0 ? a : b;
        auto more = q->take_many(5, 60s);
        REQUIRE_FALSE(more.empty());
        got.insert(got.end(), more.begin(), more.end());
    }
    REQUIRE(got.size() == 5);
    std::vector<std::chrono::system_clock::time_point> at;
    for (const auto& j : got) at.push_back(leased_at(j, s.lease));
    std::sort(at.begin(), at.end());
    // Any three leases span a period at least (less the store's rounding to whole ms).
    for (std::size_t i = 0; i + 2 < at.size(); ++i) CHECK(at[i + 2] - at[i] >= 1s - 2ms);
    for (const auto& j : got) CHECK(a->ack(j));
}

TEMPLATE_LIST_TEST_CASE("contract: a stop request ends a take that a limit holds back",
                        "[contract][limits]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.limits = {.max_leased = 1, .rate = 0, .period = 0ms}});
    REQUIRE(q->put("a", "p", past));
    REQUIRE(q->put("b", "p", past));
    auto held = q->take(5s);
    REQUIRE(held.has_value());
    std::stop_source stop;
    const auto start = std::chrono::steady_clock::now();
    std::thread stopper([&] {
        std::this_thread::sleep_for(300ms);
        stop.request_stop();
    });
    CHECK_FALSE(q->take(120s, stop.get_token()).has_value());
    stopper.join();
    CHECK(std::chrono::steady_clock::now() - start < 20s);
    CHECK(q->ack(*held));
}

TEMPLATE_LIST_TEST_CASE(
    "contract: workers on two handles with max_leased 2 never run more than 2 handlers at once",
    "[contract][limits][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    const settings s{.limits = {.max_leased = 2, .rate = 0, .period = 0ms}};
    auto a = f.make(s);
    auto b = f.make(s);
    constexpr std::size_t jobs = 40;
    for (std::size_t i = 0; i < jobs; ++i) REQUIRE(a->put(id_of("w", i), "p", past));
    std::atomic<int> running{0};
    std::atomic<int> most{0};
    std::atomic<std::size_t> ran{0};
    const auto handler = [&](const delayq::job&) {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(5ms);
        --running;
        ++ran;
    };
    {
        delayq::worker wa(*a, handler, {.threads = 3});
        delayq::worker wb(*b, handler, {.threads = 3});
        CHECK(eventually([&] { return ran >= jobs; }));
    }
    CHECK(most <= 2);
    CHECK(ran == jobs);
    CHECK(a->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: stats counts waiting, due, leased and dead jobs, and the lag",
                        "[contract][stats]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.max_attempts = 1});
    auto s = q->stats();
    CHECK(s.waiting == 0);
    CHECK(s.due_now == 0);
    CHECK(s.leased == 0);
    CHECK(s.dead == 0);
    CHECK(s.lag == 0ms);

    REQUIRE(q->put_after("a", "p", 0ms));
    REQUIRE(q->put_after("b", "p", 0ms));
    REQUIRE(q->put_after("c", "p", 0ms));
    REQUIRE(q->put_after("later", "p", 1h));
    std::this_thread::sleep_for(100ms);
    s = q->stats();
    CHECK(s.waiting == 4);
    CHECK(s.due_now == 3);
    CHECK(s.leased == 0);
    CHECK(s.dead == 0);
    CHECK(s.lag >= 90ms);  // the oldest due job has waited at least the sleep (less rounding)
    CHECK(s.lag < 60s);

    auto j = q->take(5s);
    REQUIRE(j.has_value());
    auto k = q->take(5s);
    REQUIRE(k.has_value());
    s = q->stats();
    CHECK(s.waiting == 2);
    CHECK(s.due_now == 1);
    CHECK(s.leased == 2);
    CHECK(q->bury(*j, "no"));
    CHECK(q->ack(*k));
    auto l = q->take(5s);
    REQUIRE(l.has_value());
    CHECK(q->ack(*l));
    s = q->stats();
    CHECK(s.waiting == 1);
    CHECK(s.due_now == 0);
    CHECK(s.leased == 0);
    CHECK(s.dead == 1);
    CHECK(s.lag == 0ms);
}

TEMPLATE_LIST_TEST_CASE("contract: stats counts a job whose lease ran out as due again",
                        "[contract][stats]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 300ms});
    REQUIRE(q->put_after("a", "p", 0ms));
    auto j = q->take(5s);
    REQUIRE(j.has_value());
    CHECK(q->stats().leased == 1);
    std::this_thread::sleep_for(600ms);
    const auto s = q->stats();
    CHECK(s.leased == 0);
    CHECK(s.waiting == 1);
    CHECK(s.due_now == 1);
    CHECK(s.lag >= 200ms);  // due again since its lease ended
    CHECK(s.lag < 60s);
}

TEMPLATE_LIST_TEST_CASE("contract: put_every runs a series, one run at a time, until cancel",
                        "[contract][repeat]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    const auto before = std::chrono::system_clock::now();
    REQUIRE(q->put_every("tick", "p", 300ms));
    CHECK_FALSE(q->put_every("tick", "other", 300ms));  // queued: nothing changes
    CHECK_FALSE(q->put("tick", "other", past));
    CHECK(q->size() == 1);
    auto first = q->take(60s);
    REQUIRE(first.has_value());
    CHECK(first->id == "tick");
    CHECK(first->payload == "p");
    CHECK(first->attempts == 1);
    CHECK(first->deadline >= before + 300ms - 2ms);  // one period after the call, not before
    CHECK(q->size() == 1);
    CHECK(q->ack(*first));
    CHECK_FALSE(q->ack(*first));
    // The next run, queued by the ack: one period after the first, or the next slot after now.
    auto info = q->get("tick");
    REQUIRE(info.has_value());
    CHECK(info->state == delayq::job_state::waiting);
    CHECK(info->attempts == 0);
    CHECK(info->time > first->deadline);
    CHECK((info->time - first->deadline) % 300ms == 0ms);
    auto second = q->take(60s);
    REQUIRE(second.has_value());
    CHECK(second->deadline == info->time);
    CHECK(second->attempts == 1);
    CHECK(second->payload == "p");
    CHECK(q->cancel("tick"));  // a leased run: the series ends
    CHECK_FALSE(q->ack(*second));
    CHECK(q->size() == 0);
    CHECK_FALSE(q->take(1s).has_value());
    CHECK_FALSE(q->get("tick").has_value());
}

TEMPLATE_LIST_TEST_CASE("contract: a run that dies queues the next run, and the dead letter stays",
                        "[contract][repeat]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({.lease = 300ms, .max_attempts = 1});
    REQUIRE(q->put_every("s", "p", 200ms));
    auto run = q->take(60s);
    REQUIRE(run.has_value());
    CHECK(q->bury(*run, "broken"));
    CHECK(q->dead_size() == 1);
    CHECK(q->size() == 1);  // the next run
    auto next = q->take(60s);
    REQUIRE(next.has_value());
    CHECK(next->deadline > run->deadline);
    // Its last lease ends unsettled (max_attempts 1): it dies, and the run after it is queued.
    std::this_thread::sleep_for(600ms);
    auto third = q->take(60s);
    REQUIRE(third.has_value());
    CHECK(third->id == "s");
    CHECK(third->deadline > next->deadline);
    CHECK(third->attempts == 1);
    CHECK(q->dead_size() == 1);         // the id's dead letter: the latest death
    CHECK(q->nack(*third, 0ms, "no"));  // the last attempt, nacked: dies, the next is queued
    CHECK(q->size() == 1);
    auto info = q->get("s");
    REQUIRE(info.has_value());
    CHECK(info->state == delayq::job_state::waiting);
    CHECK(q->cancel("s"));
    CHECK(q->size() == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: a series whose runs fell behind makes one catch-up run",
                        "[contract][repeat]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_every("behind", "p", 100ms));
    std::this_thread::sleep_for(1200ms);  // about 11 periods with no consumer
    auto run = q->take(60s);
    REQUIRE(run.has_value());
    CHECK(q->ack(*run));
    auto info = q->get("behind");
    REQUIRE(info.has_value());
    CHECK(info->time > std::chrono::system_clock::now() - 5ms);  // the next slot, not a backlog
    CHECK(info->time - run->deadline >= 1s);                     // the missed slots were skipped
    CHECK(q->size() == 1);
}

TEMPLATE_LIST_TEST_CASE("contract: put_cron is due at the next matching minute, in UTC",
                        "[contract][repeat]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    using namespace std::chrono;
    TestType f;
    auto q = f.make({});
    const auto now = system_clock::now();
    REQUIRE(q->put_cron("nightly", "p", "0 3 * * *"));
    auto info = q->get("nightly");
    REQUIRE(info.has_value());
    const auto day = floor<days>(now);
    const auto want = day + hours(3) > now ? day + hours(3) : day + days(1) + hours(3);
    CHECK(info->time == want);
    CHECK_FALSE(q->put_cron("nightly", "p", "0 4 * * *"));
    CHECK_THROWS_AS(q->put_cron("bad", "p", "0 25 * * *"), std::invalid_argument);
    CHECK_THROWS_AS(q->put_cron("bad", "p", "* * *"), std::invalid_argument);
    CHECK_THROWS_AS(q->put_every("bad", "p", 0ms), std::invalid_argument);
    CHECK_THROWS_AS(q->put_every("bad", "p", -1s), std::invalid_argument);
    CHECK_FALSE(q->get("bad").has_value());
}

TEMPLATE_LIST_TEST_CASE("contract: a worker runs a series again and again, once a period",
                        "[contract][repeat][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    auto other = f.make({});
    REQUIRE(q->put_every("heartbeat", "p", 100ms));
    std::mutex m;
    std::vector<std::chrono::system_clock::time_point> runs;
    const auto handler = [&](const delayq::job& j) {
        std::lock_guard lk(m);
        runs.push_back(j.deadline);
    };
    {
        delayq::worker a(*q, handler, {.threads = 2});
        delayq::worker b(*other, handler, {.threads = 2});
        CHECK(eventually([&] {
            std::lock_guard lk(m);
            return runs.size() >= 5;
        }));
        CHECK(q->cancel("heartbeat"));
    }
    std::lock_guard lk(m);
    std::sort(runs.begin(), runs.end());
    // Never two runs of one slot: each run is due at least a period after the one before.
    for (std::size_t i = 1; i < runs.size(); ++i) CHECK(runs[i] - runs[i - 1] >= 100ms);
}

TEMPLATE_LIST_TEST_CASE("contract: a run's retry does not move its series' phase",
                        "[contract][repeat]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    REQUIRE(q->put_every("phase", "p", 1s));
    auto run = q->take(60s);
    REQUIRE(run.has_value());
    const auto slot = run->deadline;
    CHECK(q->nack(*run, 150ms, "again"));  // retried 150 ms later: the same run
    auto retry = q->take(60s);
    REQUIRE(retry.has_value());
    CHECK(retry->attempts == 2);
    CHECK(q->ack(*retry));
    auto info = q->get("phase");
    REQUIRE(info.has_value());
    CHECK((info->time - slot) % 1s == 0ms);  // a whole number of periods after the first slot
    CHECK(info->time > slot);
}

// ack_and_try_take (delayq::acks_and_takes), on the backends that have it: the ack, then a take
// that does not wait, in one round trip. A backend without it passes these by having nothing to
// check (the worker takes instead).

namespace delayq_contract {

/// Runs `body(fixture)` (a generic lambda: it is compiled only here) where the fixture's queue has
/// ack_and_try_take.
template <class Fixture, class Body>
void with_ack_and_try_take(Body body) {
    if constexpr (delayq::acks_and_takes<typename Fixture::queue>) {
        Fixture f;
        body(f);
    } else {
        SUCCEED("no ack_and_try_take");
    }
}

/// Puts "a" and "b", both due, a first, and takes a.
template <class Q>
delayq::job a_of_two(Q& q) {
    REQUIRE(q.put("a", "pa", past));
    REQUIRE(q.put("b", "pb", past + std::chrono::seconds(1)));
    auto a = q.take(std::chrono::seconds(5));
    REQUIRE(a.has_value());
    REQUIRE(a->id == "a");
    return std::move(*a);
}

}  // namespace delayq_contract

TEMPLATE_LIST_TEST_CASE("contract: ack_and_try_take acks and leases the next due job",
                        "[contract][ack_and_try_take]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    with_ack_and_try_take<TestType>([](auto& f) {
        auto q = f.make({});
        REQUIRE(q->put("later", "pl", std::chrono::system_clock::now() + 1h));
        const auto a = a_of_two(*q);
        auto r = q->ack_and_try_take(a);
        CHECK(r.acked);
        REQUIRE(r.next.has_value());
        CHECK(r.next->id == "b");
        CHECK(r.next->payload == "pb");
        CHECK(r.next->attempts == 1);
        CHECK(r.next->lease_deadline - std::chrono::system_clock::now() > 20s);
        CHECK(q->size() == 2);  // b leased, later waiting
        auto info = q->get("b");
        REQUIRE(info.has_value());
        CHECK(info->state == delayq::job_state::leased);
        CHECK_FALSE(q->ack_and_try_take(a).acked);  // settled already
        auto last = q->ack_and_try_take(*r.next);   // nothing else is due
        CHECK(last.acked);
        CHECK_FALSE(last.next.has_value());
        CHECK(q->size() == 1);
        CHECK_FALSE(q->ack(*r.next));  // its token was used
    });
}

TEMPLATE_LIST_TEST_CASE(
    "contract: ack_and_try_take with a stale token acks nothing and still leases the next job",
    "[contract][ack_and_try_take]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    with_ack_and_try_take<TestType>([](auto& f) {
        auto q = f.make({});
        const auto old = a_of_two(*q);
        REQUIRE(q->nack(old, 1h));  // a is due again in an hour: b is the due one
        auto r = q->ack_and_try_take(old);
        CHECK_FALSE(r.acked);
        REQUIRE(r.next.has_value());
        CHECK(r.next->id == "b");
        CHECK(q->size() == 2);  // a still queued, b leased
        CHECK(q->ack(*r.next));
    });
}

TEMPLATE_LIST_TEST_CASE(
    "contract: ack_and_try_take leases nothing while the queue is paused, and a take gets it after "
    "the resume",
    "[contract][ack_and_try_take][pause]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    with_ack_and_try_take<TestType>([](auto& f) {
        auto q = f.make({});
        const auto a = a_of_two(*q);
        q->pause();
        auto r = q->ack_and_try_take(a);
        CHECK(r.acked);  // settlements work while paused
        CHECK_FALSE(r.next.has_value());
        q->resume();
        auto b = q->take(5s);
        REQUIRE(b.has_value());
        CHECK(b->id == "b");
        CHECK(q->ack(*b));
    });
}

TEMPLATE_LIST_TEST_CASE(
    "contract: ack_and_try_take leases within max_leased, counting the leases of every handle",
    "[contract][ack_and_try_take][limits]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    with_ack_and_try_take<TestType>([](auto& f) {
        auto limited = f.make({.limits = {.max_leased = 2, .rate = 0, .period = 0ms}});
        auto other = f.make({});  // no limits: leases whatever is due, and its leases count
        for (std::size_t i = 0; i < 5; ++i) REQUIRE(limited->put(id_of("j", i), "p", past));
        auto mine = limited->take(5s);
        REQUIRE(mine.has_value());
        // The ack frees the place it held: the next job takes it.
        auto r = limited->ack_and_try_take(*mine);
        CHECK(r.acked);
        REQUIRE(r.next.has_value());
        // Two more leased elsewhere: three leases, more than the limit, even after an ack.
        auto theirs = other->take_many(2, 5s);
        REQUIRE(theirs.size() == 2);
        auto full = limited->ack_and_try_take(*r.next);
        CHECK(full.acked);
        CHECK_FALSE(full.next.has_value());  // two leased still: the limit
        CHECK(other->ack(theirs[0]));
        auto room = limited->take(5s);  // one place now
        REQUIRE(room.has_value());
        CHECK(limited->ack(*room));
        CHECK(other->ack(theirs[1]));
    });
}

TEMPLATE_LIST_TEST_CASE("contract: a worker acks with ack_and_try_take and does every job once",
                        "[contract][ack_and_try_take][worker]", delayq_contract_fixtures) {
    using namespace delayq_contract;
    TestType f;
    auto q = f.make({});
    constexpr std::size_t jobs = 200;
    for (std::size_t i = 0; i < jobs; ++i) REQUIRE(q->put(id_of("w", i), "p", past));
    std::mutex m;
    std::multiset<std::string> seen;
    {
        delayq::worker_options o;
        o.threads = 3;
        delayq::worker w(
            *q,
            [&](const delayq::job& j) {
                std::lock_guard lk(m);
                seen.insert(j.id);
            },
            o);
        REQUIRE(eventually([&] { return w.counters().done == jobs; }));
        w.stop();
        CHECK(w.counters().lease_lost == 0);
    }
    std::lock_guard lk(m);
    CHECK(seen.size() == jobs);
    CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == jobs);
    CHECK(q->size() == 0);
}
