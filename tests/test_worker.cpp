// delayq::worker over a job queue in memory (memory_job_queue.hpp), whose faults a test switches
// on: what each end of a handler does to its job, the lease kept while a handler runs, stop(),
// the hooks and the counters; and delayq::retry_policy's arithmetic. The worker over the real
// backends is in the contract suite (tests/contract/).
//
// No assertion bounds a wall-clock time tighter than a user would call broken (seconds): what
// comes out is checked, and the waits are for events.
#include <atomic>
#include <chrono>
#include <delayq/retry_policy.hpp>
#include <delayq/worker.hpp>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "memory_job_queue.hpp"

using namespace std::chrono_literals;
using delayq_test::memory_job_queue;
using clock_type = std::chrono::steady_clock;

namespace {

// Waits up to 60 s (a bound nobody would call working) for `done()`.
template <class F>
bool eventually(F done) {
    const auto until = clock_type::now() + 60s;
    while (!done()) {
        if (clock_type::now() > until) return false;
        std::this_thread::sleep_for(5ms);
    }
    return true;
}

delayq::worker_options quick(std::size_t threads = 1) {
    delayq::worker_options o;
    o.threads = threads;
    o.retry = {.base = 0ms, .cap = 0ms};
    return o;
}

}  // namespace

static_assert(delayq::job_queue<memory_job_queue>);

TEST_CASE("worker: every job is handled and acked once, on several threads", "[worker]") {
    memory_job_queue q;
    constexpr int jobs = 300;
    for (int i = 0; i < jobs; ++i)
        REQUIRE(q.put_after("j" + std::to_string(i), std::to_string(i),
                            std::chrono::milliseconds(i % 7)));
    std::mutex m;
    std::multiset<std::string> seen;
    {
        delayq::worker w(
            q,
            [&](const delayq::job& j) {
                std::lock_guard lk(m);
                seen.insert(j.id);
            },
            quick(4));
        REQUIRE(eventually([&] { return w.counters().done == jobs; }));
        const auto c = w.counters();
        CHECK(c.retried == 0);
        CHECK(c.dead == 0);
        CHECK(c.in_flight == 0);
    }
    CHECK(seen.size() == jobs);
    std::set<std::string> once(seen.begin(), seen.end());
    CHECK(once.size() == jobs);
    CHECK(q.size() == 0);
}

TEST_CASE("worker: a handler that throws is retried with the policy's delay and its reason",
          "[worker]") {
    memory_job_queue q;
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<int> calls{0};
    std::mutex m;
    std::vector<std::string> reasons;
    std::vector<std::string> errors;
    auto o = quick();
    o.retry = {.base = 10ms, .cap = 1s, .jitter = delayq::jitter::none};
    o.hooks.retrying = [&](const delayq::job&, std::chrono::milliseconds, std::string_view why) {
        std::lock_guard lk(m);
        reasons.emplace_back(why);
    };
    o.hooks.handler_error = [&](const delayq::job&, std::string_view what) {
        std::lock_guard lk(m);
        errors.emplace_back(what);
    };
    delayq::worker w(
        q,
        [&](const delayq::job& j) {
            ++calls;
            if (j.attempts < 3) throw std::runtime_error("boom " + std::to_string(j.attempts));
        },
        o);
    REQUIRE(eventually([&] { return w.counters().done == 1; }));
    w.stop();
    CHECK(calls == 3);
    CHECK(w.counters().retried == 2);
    CHECK(reasons == std::vector<std::string>{"boom 1", "boom 2"});
    CHECK(errors == reasons);
    q.with([](auto&, auto& r) {
        CHECK(r.nack_delays == std::vector<std::chrono::milliseconds>{10ms, 20ms});
    });
}

TEST_CASE("worker: a job that keeps failing goes to the dead letters after max_attempts",
          "[worker]") {
    memory_job_queue q({.lease = 30s, .max_attempts = 3});
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<int> dead_hooks{0};
    auto o = quick();
    o.hooks.dead_lettered = [&](const delayq::job& j, std::string_view why) {
        if (j.attempts == 3 && why == "always") ++dead_hooks;
    };
    delayq::worker w(
        q, [](const delayq::job&) { throw std::runtime_error("always"); }, o);
    REQUIRE(eventually([&] { return w.counters().dead == 1; }));
    w.stop();
    CHECK(w.counters().retried == 2);
    CHECK(dead_hooks == 1);
    CHECK(q.dead_size() == 1);
    CHECK(q.size() == 0);
}

TEST_CASE("worker: retry_in asks for its own delay, dead_letter buries at once", "[worker]") {
    memory_job_queue q({.lease = 30s, .max_attempts = 10});
    REQUIRE(q.put_after("later", "p", 0ms));
    REQUIRE(q.put_after("never", "p", 0ms));
    std::atomic<int> later_calls{0}, never_calls{0};
    delayq::worker w(
        q,
        [&](const delayq::job& j) {
            if (j.id == "never") {
                ++never_calls;
                throw delayq::dead_letter("malformed");
            }
            if (++later_calls == 1) throw delayq::retry_in(50ms, "busy");
        },
        quick());
    REQUIRE(eventually([&] { return w.counters().done == 1 && w.counters().dead == 1; }));
    w.stop();
    CHECK(never_calls == 1);  // on its first attempt, max_attempts notwithstanding
    CHECK(later_calls == 2);
    CHECK(q.dead_size() == 1);
    q.with([](auto&, auto& r) {
        CHECK(r.buries == 1);
        CHECK(r.nack_delays == std::vector<std::chrono::milliseconds>{50ms});
    });
}

TEST_CASE("worker: a handler that runs ten leases long keeps its lease and runs once", "[worker]") {
    memory_job_queue q({.lease = 150ms});
    REQUIRE(q.put_after("long", "p", 0ms));
    std::atomic<int> calls{0};
    delayq::worker w(
        q,
        [&](const delayq::job&) {
            ++calls;
            std::this_thread::sleep_for(1500ms);  // ten leases
        },
        quick(2));  // a second thread would be handed the job if its lease ended
    REQUIRE(eventually([&] { return w.counters().done == 1; }));
    w.stop();
    CHECK(calls == 1);
    q.with([](auto&, auto& r) {
        CHECK(r.deliveries == 1);
        CHECK(r.extends >= 10);
    });
    CHECK(w.counters().lease_lost == 0);
}

TEST_CASE("worker: a refused extension stops the handler, and the worker leaves the job alone",
          "[worker]") {
    memory_job_queue q({.lease = 300ms});
    q.with([](auto& f, auto&) { f.refuse_extends = true; });
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<int> stopped{0}, lost_hooks{0};
    auto o = quick();
    o.hooks.lease_lost = [&](const delayq::job&) { ++lost_hooks; };
    delayq::worker w(
        q,
        [&](const delayq::job&, std::stop_token st) {
            if (stopped > 0) return;  // the redelivery: done at once
            while (!st.stop_requested()) std::this_thread::sleep_for(1ms);
            ++stopped;
        },
        o);
    REQUIRE(eventually([&] { return w.counters().done == 1; }));
    w.stop();
    CHECK(stopped == 1);
    CHECK(lost_hooks == 1);
    CHECK(w.counters().lease_lost == 1);
    q.with([](auto&, auto& r) {
        CHECK(r.acks == 1);  // the redelivery's only: the stopped handler's job was not acked
        CHECK(r.nacks == 0);
        CHECK(r.deliveries == 2);
    });
}

TEST_CASE("worker: an extension that fails is tried again while the lease holds", "[worker]") {
    memory_job_queue q({.lease = 600ms});
    q.with([](auto& f, auto&) { f.fail_extends = 1; });
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<int> failed{0};
    auto o = quick();
    o.hooks.call_failed = [&](std::string_view) { ++failed; };
    delayq::worker w(
        q, [](const delayq::job&) { std::this_thread::sleep_for(1500ms); }, o);
    REQUIRE(eventually([&] { return w.counters().done == 1; }));
    w.stop();
    CHECK(failed == 1);
    CHECK(w.counters().failed_calls == 1);
    CHECK(w.counters().lease_lost == 0);
    q.with([](auto&, auto& r) { CHECK(r.deliveries == 1); });
}

TEST_CASE("worker: stop() of idle threads returns at once, not after their take's wait",
          "[worker]") {
    memory_job_queue q;
    delayq::worker w(
        q, [](const delayq::job&) {}, quick(4));
    std::this_thread::sleep_for(100ms);  // let them block (a slow start only weakens the test)
    const auto start = clock_type::now();
    w.stop();
    CHECK(clock_type::now() - start < 30s);  // the takes wait an hour: they were woken
    q.with([](auto&, auto& r) { CHECK(r.takes >= 1); });
}

TEST_CASE("worker: stop() lets a running handler finish within the drain timeout", "[worker]") {
    memory_job_queue q;
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<bool> started{false}, interrupted{false};
    auto o = quick();
    o.drain_timeout = 60s;
    delayq::worker w(
        q,
        [&](const delayq::job&, std::stop_token st) {
            started = true;
            std::this_thread::sleep_for(300ms);
            interrupted = st.stop_requested();
        },
        o);
    REQUIRE(eventually([&] { return started.load(); }));
    w.stop();
    CHECK_FALSE(interrupted);
    CHECK(w.counters().done == 1);
    CHECK(q.size() == 0);
}

TEST_CASE("worker: the reason a handler gives is the job's last error in the store", "[worker]") {
    memory_job_queue q({.lease = 30s, .max_attempts = 10});
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<int> calls{0};
    {
        delayq::worker w(
            q,
            [&](const delayq::job&) {
                switch (++calls) {
                    case 1:
                        throw std::runtime_error("the payment service said 503");
                    case 2:
                        throw delayq::retry_in(1ms);  // no reason: the last one stays
                    case 3:
                        throw delayq::retry_in(1ms, "rate limited");
                    default:
                        throw delayq::dead_letter("no such order");
                }
            },
            quick());
        REQUIRE(eventually([&] { return w.counters().dead == 1; }));
    }
    CHECK(calls == 4);
    q.with([](auto&, auto& r) {
        CHECK(r.reasons == std::vector<std::string>{"the payment service said 503", "rate limited",
                                                    "no such order"});
    });
    const auto i = q.get("j");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::dead);
    CHECK(i->last_error == "no such order");
}

TEST_CASE("worker: a job released by stop() keeps its last error", "[worker]") {
    memory_job_queue q;
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<int> calls{0};
    auto o = quick();
    o.drain_timeout = 10ms;
    delayq::worker w(
        q,
        [&](const delayq::job&, std::stop_token st) {
            if (++calls == 1) throw std::runtime_error("first failure");
            while (!st.stop_requested()) std::this_thread::sleep_for(1ms);
        },
        o);
    REQUIRE(eventually([&] { return calls.load() == 2; }));
    w.stop();
    CHECK(w.counters().released == 1);
    const auto i = q.get("j");
    REQUIRE(i.has_value());
    CHECK(i->state == delayq::job_state::waiting);
    CHECK(i->last_error == "first failure");
}

TEST_CASE("worker: after the drain timeout a handler is asked to stop and its job goes back",
          "[worker]") {
    memory_job_queue q;
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<bool> started{false};
    auto o = quick();
    o.drain_timeout = 100ms;
    delayq::worker w(
        q,
        [&](const delayq::job&, std::stop_token st) {
            started = true;
            while (!st.stop_requested()) std::this_thread::sleep_for(1ms);
            // returns normally: it still did not finish, so the job is not acked
        },
        o);
    REQUIRE(eventually([&] { return started.load(); }));
    w.stop();
    const auto c = w.counters();
    CHECK(c.done == 0);
    CHECK(c.released == 1);
    CHECK(q.size() == 1);  // waiting again, due now
    auto again = q.take(0ms);
    REQUIRE(again);
    CHECK(again->attempts == 2);
}

TEST_CASE("worker: failing takes and settlements are tried again, and nothing is lost",
          "[worker]") {
    memory_job_queue q;
    q.with([](auto& f, auto&) {
        f.fail_takes = 3;
        f.fail_settles = 2;
    });
    for (int i = 0; i < 5; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "p", 0ms));
    std::atomic<int> failed{0};
    auto o = quick(2);
    o.hooks.call_failed = [&](std::string_view) { ++failed; };
    delayq::worker w(
        q, [](const delayq::job&) {}, o);
    REQUIRE(eventually([&] { return w.counters().done == 5; }));
    w.stop();
    CHECK(failed == 5);
    CHECK(w.counters().failed_calls == 5);
    CHECK(q.size() == 0);
}

TEST_CASE(
    "worker: a failed ack after the first lease is tried again while the extended lease "
    "holds",
    "[worker]") {
    memory_job_queue q({.lease = 300ms});
    REQUIRE(q.put_after("j", "p", 0ms));
    delayq::worker w(
        q,
        [&](const delayq::job&) {
            std::this_thread::sleep_for(700ms);  // past the lease the take gave: extended
            q.with([](auto& f, auto&) { f.fail_settles = 1; });  // the ack's first try fails
        },
        quick());
    REQUIRE(eventually([&] { return w.counters().done + w.counters().lease_lost >= 1; }));
    w.stop();
    CHECK(w.counters().done == 1);
    CHECK(w.counters().lease_lost == 0);
    CHECK(w.counters().failed_calls == 1);
    q.with([](auto&, auto& r) { CHECK(r.deliveries == 1); });
}

TEST_CASE("worker: a hook that throws is ignored", "[worker]") {
    memory_job_queue q;
    REQUIRE(q.put_after("j", "p", 0ms));
    auto o = quick();
    o.hooks.handler_error = [](const delayq::job&, std::string_view) {
        throw std::runtime_error("a bad hook");
    };
    std::atomic<int> calls{0};
    delayq::worker w(
        q,
        [&](const delayq::job&) {
            if (++calls == 1) throw std::runtime_error("once");
        },
        o);
    REQUIRE(eventually([&] { return w.counters().done == 1; }));
}

TEST_CASE("worker: stop() from a handler is std::logic_error, not a wait for itself", "[worker]") {
    memory_job_queue q;
    REQUIRE(q.put_after("j", "p", 0ms));
    std::atomic<bool> refused{false};
    std::optional<delayq::worker<memory_job_queue>> w;
    std::atomic<bool> ready{false};
    w.emplace(q, [&](const delayq::job&) {
        while (!ready) std::this_thread::sleep_for(1ms);
        try {
            w->stop();
        } catch (const std::logic_error&) {
            refused = true;
        }
    });
    ready = true;
    REQUIRE(eventually([&] { return w->counters().done == 1; }));
    w.reset();
    CHECK(refused);
}

TEST_CASE("worker: bad options are std::invalid_argument", "[worker]") {
    memory_job_queue q;
    const auto handler = [](const delayq::job&) {};
    auto o = quick();
    o.threads = 0;
    CHECK_THROWS_AS(delayq::worker(q, handler, o), std::invalid_argument);
    o = quick();
    o.drain_timeout = -1ms;
    CHECK_THROWS_AS(delayq::worker(q, handler, o), std::invalid_argument);
    o = quick();
    o.lease = -1ms;
    CHECK_THROWS_AS(delayq::worker(q, handler, o), std::invalid_argument);
    o = quick();
    o.retry = {.base = 2s, .cap = 1s};
    CHECK_THROWS_AS(delayq::worker(q, handler, o), std::invalid_argument);
}

TEST_CASE("retry_policy: doubling from base up to cap, with jitter inside the backoff",
          "[worker]") {
    const delayq::retry_policy none{.base = 100ms, .cap = 1s, .jitter = delayq::jitter::none};
    CHECK(none.delay(0, 7) == 100ms);
    CHECK(none.delay(1, 7) == 100ms);
    CHECK(none.delay(2, 7) == 200ms);
    CHECK(none.delay(4, 7) == 800ms);
    CHECK(none.delay(5, 7) == 1s);
    CHECK(none.delay(4'000'000'000u, 7) == 1s);  // no overflow however many attempts

    const delayq::retry_policy huge{
        .base = 1ms, .cap = std::chrono::milliseconds::max(), .jitter = delayq::jitter::none};
    CHECK(huge.backoff(200) == std::chrono::milliseconds::max());

    const delayq::retry_policy full{.base = 100ms, .cap = 1s};  // full jitter by default
    CHECK(full.delay(3, 0) == 0ms);
    CHECK(full.delay(3, 400) == 400ms);
    CHECK(full.delay(3, 401) == 0ms);  // 401 mod 401
    const delayq::retry_policy equal{.base = 100ms, .cap = 1s, .jitter = delayq::jitter::equal};
    CHECK(equal.delay(3, 0) == 200ms);
    CHECK(equal.delay(3, 200) == 400ms);
    for (std::uint64_t r : {0ull, 1ull, 12345ull, ~0ull}) {
        CHECK(full.delay(10, r) <= 1s);
        CHECK(equal.delay(10, r) >= 500ms);
        CHECK(equal.delay(10, r) <= 1s);
    }
    CHECK_NOTHROW(full.check());
    CHECK_THROWS_AS((delayq::retry_policy{.base = -1ms}.check()), std::invalid_argument);
}

namespace {

// memory_job_queue with ack_and_try_take (delayq::acks_and_takes): the ack and a take that does
// not wait, as one call, whose uses and the worker's own takes it counts apart; the call fails
// while fail_polls says so (the ack and the take not done).
class polling_memory_queue : public memory_job_queue {
  public:
    using memory_job_queue::memory_job_queue;

    std::optional<delayq::job> take(std::chrono::milliseconds max_wait,
                                    const std::stop_token& stop = {}) {
        ++takes;
        return memory_job_queue::take(max_wait, stop);
    }

    delayq::ack_take_result ack_and_try_take(const delayq::job& j) {
        ++polls;
        if (fail_polls > 0) {
            --fail_polls;
            throw delayq_test::memory_unavailable("polling_memory_queue: the call failed");
        }
        delayq::ack_take_result r;
        r.acked = ack(j);
        r.next = memory_job_queue::take(0ms);
        return r;
    }

    std::atomic<int> takes{0}, polls{0}, fail_polls{0};
};

}  // namespace

static_assert(delayq::acks_and_takes<polling_memory_queue>);
static_assert(!delayq::acks_and_takes<memory_job_queue>);

TEST_CASE("worker: an ack takes the next due job in the same call, and the thread runs it",
          "[worker][ack_and_try_take]") {
    polling_memory_queue q;
    constexpr int jobs = 50;
    for (int i = 0; i < jobs; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "p", 0ms));
    std::atomic<int> ran{0};
    delayq::worker w(
        q, [&](const delayq::job&) { ++ran; }, quick());
    REQUIRE(eventually([&] { return w.counters().done == jobs; }));
    w.stop();
    CHECK(ran == jobs);
    CHECK(q.polls == jobs);  // every ack went with a take
    // The first job and the wait after the last came by take(): none between.
    CHECK(q.takes <= 3);
    CHECK(q.size() == 0);
    q.with([&](auto&, auto& r) { CHECK(r.deliveries == jobs); });
}

TEST_CASE("worker: a failed ack-and-take is tried again as a plain ack, counted once as done",
          "[worker][ack_and_try_take]") {
    polling_memory_queue q;
    q.fail_polls = 1;
    for (int i = 0; i < 3; ++i) REQUIRE(q.put_after("j" + std::to_string(i), "p", 0ms));
    std::atomic<int> failed{0};
    auto o = quick();
    o.hooks.call_failed = [&](std::string_view) { ++failed; };
    delayq::worker w(
        q, [](const delayq::job&) {}, o);
    REQUIRE(eventually([&] { return w.counters().done == 3; }));
    w.stop();
    CHECK(failed == 1);
    CHECK(w.counters().failed_calls == 1);
    CHECK(w.counters().lease_lost == 0);
    CHECK(q.size() == 0);
    q.with([](auto&, auto& r) { CHECK(r.deliveries == 3); });
}

TEST_CASE("worker: an ack refused by its token is a lost lease, and the job it took still runs",
          "[worker][ack_and_try_take]") {
    polling_memory_queue q({.lease = 30s});
    REQUIRE(q.put_after("a", "p", 0ms));
    REQUIRE(q.put_after("b", "p", 0ms));
    std::atomic<int> lost{0}, setup_failed{0};
    std::mutex m;
    std::vector<std::string> order;
    auto o = quick();
    o.hooks.lease_lost = [&](const delayq::job& j) {
        std::lock_guard lk(m);
        order.push_back("lost " + j.id);
        ++lost;
    };
    delayq::worker w(
        q,
        [&](const delayq::job& j) {
            {
                std::lock_guard lk(m);
                order.push_back(j.id);
            }
            if (j.attempts == 1 && j.id == "a") {
                // Put anew meanwhile (not on the test's thread: no assertion here, the counts
                // below tell): this token is stale.
                if (!q.cancel(j.id) || !q.put_after(j.id, "p", 1h)) ++setup_failed;
            }
        },
        o);
    REQUIRE(eventually([&] { return w.counters().done + w.counters().lease_lost == 2; }));
    w.stop();
    CHECK(w.counters().done == 1);
    CHECK(w.counters().lease_lost == 1);
    CHECK(setup_failed == 0);
    CHECK(q.takes <= 2);  // b came with a's refused ack
    std::lock_guard lk(m);
    CHECK(order == std::vector<std::string>{"a", "lost a", "b"});
}
