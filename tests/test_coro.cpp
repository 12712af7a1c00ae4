// <delayq/coro.hpp>: co_await sleep_for / sleep_until on the wheels.
//
// Each test declares its wheel after what the coroutines write to: a wheel destroyed at the end
// of a failed test resumes its sleepers (false), which must find their state still alive.
//
// Assertions never contain a co_await: Catch's macros wrap their expression in a try block and
// temporaries, which g++ 12's coroutines do not always carry across a suspension.
//
// The thread-free wheels (hashed_wheel, hierarchical_wheel) on manual_clock make every test here
// deterministic: a coroutine resumes exactly inside the advance() that runs its task. The threaded
// timers check where a coroutine resumes and, under TSan, the races between a sleep ending, its
// stop_token and the timer's stop().
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <delayq/coro.hpp>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <deque>
#include <exception>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__clang__)
#if __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#endif
#endif

#include "catch.hpp"
#include "support.hpp"
#include "wheels.hpp"

using namespace std::chrono_literals;
using mc = delayq::manual_clock;

namespace {

// A coroutine that starts at once and destroys itself when it ends.
struct detached {
    struct promise_type {
        detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

// A coroutine that starts at once and whose frame its owner destroys (also while it sleeps).
// With Rethrow, what its body throws leaves it for whoever resumed it (as with many task types'
// promises); the frame is then at its final suspend point, and the owner still destroys it —
// except under clang, which destroys such a frame's locals a second time (LLVM issue 61900: the
// frame still says it is suspended where it last slept, so destroy() ends the sleep_awaiter that
// the throw already ended, and releases its task twice). There the frame is left alive, and
// LeakSanitizer told so.
template <bool Rethrow>
struct owned_coro {
    struct promise_type {
        owned_coro get_return_object() noexcept {
            return owned_coro{std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_always final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        bool threw = false;
        void unhandled_exception() noexcept(!Rethrow) {
            if constexpr (Rethrow) {
                threw = true;
                throw;
            } else {
                std::terminate();
            }
        }
    };
    explicit owned_coro(std::coroutine_handle<promise_type> h) : h_(h) {}
    owned_coro(owned_coro&& o) noexcept : h_(std::exchange(o.h_, {})) {}
    owned_coro& operator=(owned_coro&&) = delete;
    ~owned_coro() {
        if (!h_) return;
#if defined(__clang__)
        if (h_.promise().threw) {
#if __has_feature(address_sanitizer)
            __lsan_ignore_object(h_.address());
#endif
            return;
        }
#endif
        h_.destroy();
    }
    bool done() const {
        return h_.done();
    }

  private:
    std::coroutine_handle<promise_type> h_;
};
using owned = owned_coro<false>;
using rethrowing = owned_coro<true>;

delayq::hashed_wheel_options<mc> wheel_opts(mc::duration tick = 1ms) {
    delayq::hashed_wheel_options<mc> o;
    o.tick = tick;
    o.wheel_size = 64;
    return o;
}

// What one sleeper saw.
struct outcome {
    int resumed = 0;
    std::optional<bool> ok;
    mc::time_point at{};
    std::thread::id thread{};
};

template <class Timer>
detached sleeper(Timer& t, mc::duration d, outcome& out, std::stop_token st = {}) {
    const bool ok = co_await delayq::sleep_for(t, d, std::move(st));
    out.ok = ok;
    out.at = mc::now();
    out.thread = std::this_thread::get_id();
    ++out.resumed;
}

// An executor: a queue of resumptions that the test runs when it chooses.
struct run_queue {
    std::mutex m;
    std::deque<delayq::resumption> q;
    std::size_t run_all() {
        std::size_t n = 0;
        for (;;) {
            std::unique_lock lk(m);
            if (q.empty()) return n;
            auto r = q.front();
            q.pop_front();
            lk.unlock();
            r();
            ++n;
        }
    }
    std::size_t size() {
        std::lock_guard lk(m);
        return q.size();
    }
};

struct post_to {
    run_queue* rq;
    void operator()(delayq::resumption r) const {
        std::lock_guard lk(rq->m);
        rq->q.push_back(r);
    }
};

// What a coroutine threw after its sleep.
struct thrown_after_sleep : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Sleeps `d`, notes how the sleep ended, then throws (a rethrowing promise passes it on).
template <class Timer>
rethrowing throws_after_sleep(Timer& t, mc::duration d, outcome& out, std::stop_token st = {}) {
    const bool ok = co_await delayq::sleep_for(t, d, std::move(st));
    out.ok = ok;
    out.thread = std::this_thread::get_id();
    ++out.resumed;
    throw thrown_after_sleep(ok ? "woke" : "cut short");
}

// An on_error that keeps what it is given.
struct error_log {
    std::mutex m;
    std::vector<std::string> what;
    std::function<void(std::exception_ptr)> handler() {
        return [this](std::exception_ptr e) {
            std::string w;
            try {
                std::rethrow_exception(std::move(e));
            } catch (const thrown_after_sleep& x) {
                w = x.what();
            } catch (...) {
                w = "something else";
            }
            std::lock_guard lk(m);
            what.push_back(std::move(w));
        };
    }
    std::vector<std::string> seen() {
        std::lock_guard lk(m);
        return what;
    }
};

using hashed = delayq::test::hashed_core;
using hierarchical = delayq::test::hierarchical_core;

// A thread-free wheel (TestType of wheels.hpp) whose on_error writes to `log`.
template <class W>
typename W::wheel::options options_with(error_log& log) {
    auto o = W::options(std::is_same_v<W, hashed> ? 64 : 8);
    o.on_error = log.handler();
    return o;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "coro: sleep_for resumes inside the advance() that reaches the deadline, never before",
    "[coro]", hashed, hierarchical) {
    mc::reset();
    outcome o, far;
    typename TestType::wheel w(TestType::options());
    sleeper(w, 5ms, o);
    CHECK(o.resumed == 0);
    CHECK(w.pending() == 1);
    mc::advance(4ms);
    CHECK(w.advance() == 0);
    CHECK(o.resumed == 0);
    mc::advance(1ms);
    CHECK(w.advance() == 1);
    CHECK(o.resumed == 1);
    CHECK(o.ok == true);
    CHECK(o.at == mc::time_point{} + 5ms);
    CHECK(o.thread == std::this_thread::get_id());
    CHECK(w.pending() == 0);
    sleeper(w, 2s, far);  // rounds past the hashed ring; levels up the hierarchical wheel
    mc::advance(2s - 1ns);
    CHECK(w.advance() == 0);
    CHECK(far.resumed == 0);
    mc::advance(1ns);
    CHECK(w.advance() == 1);
    CHECK(far.resumed == 1);
    CHECK(far.ok == true);
    CHECK(far.at == mc::time_point{} + 5ms + 2s);
}

TEST_CASE("coro: sleep_until, a past deadline and a coroutine that sleeps in a loop", "[coro]") {
    mc::reset();
    mc::advance(1s);
    int rounds = 0;
    bool finished = false;
    delayq::hashed_wheel<mc> w(wheel_opts());
    auto loop = [&]() -> detached {
        bool ok = co_await delayq::sleep_until(w, mc::time_point{});  // in the past: next pass
        CHECK(ok);
        ++rounds;
        for (int i = 0; i < 3; ++i) {
            ok = co_await delayq::sleep_for(w, 10ms);  // a task scheduled from a task
            CHECK(ok);
            ++rounds;
        }
        finished = true;
    };
    loop();
    CHECK(rounds == 0);  // never inside the co_await: through the timer
    w.advance();
    CHECK(rounds == 1);
    for (int i = 0; i < 3; ++i) {
        mc::advance(10ms);
        w.advance();
    }
    CHECK(rounds == 4);
    CHECK(finished);
}

TEST_CASE("coro: thousands of sleepers resume once each, in deadline order, never early",
          "[coro]") {
    mc::reset();
    constexpr int n = 5000;
    std::vector<outcome> outs(n);
    std::vector<mc::duration> delays(n);
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> ms(0, 500);
    std::vector<int> order;
    order.reserve(n);
    delayq::hashed_wheel<mc> w(wheel_opts());
    auto one = [&](int i) -> detached {
        co_await delayq::sleep_for(w, delays[static_cast<std::size_t>(i)]);
        outs[static_cast<std::size_t>(i)].at = mc::now();
        ++outs[static_cast<std::size_t>(i)].resumed;
        order.push_back(i);
    };
    for (int i = 0; i < n; ++i) {
        delays[static_cast<std::size_t>(i)] = std::chrono::milliseconds(ms(rng));
        one(i);
    }
    CHECK(w.pending() == static_cast<std::size_t>(n));
    for (int step = 0; step < 600; ++step) {
        mc::advance(1ms);
        w.advance();
    }
    CHECK(w.pending() == 0);
    REQUIRE(order.size() == static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        const auto& o = outs[static_cast<std::size_t>(i)];
        CHECK(o.resumed == 1);
        CHECK(o.at >= mc::time_point{} + delays[static_cast<std::size_t>(i)]);        // never early
        CHECK(o.at <= mc::time_point{} + delays[static_cast<std::size_t>(i)] + 1ms);  // one tick
    }
    for (std::size_t k = 1; k < order.size(); ++k)  // deadline order, first in first out
        CHECK(delays[static_cast<std::size_t>(order[k - 1])] <=
              delays[static_cast<std::size_t>(order[k])]);
}

TEST_CASE(
    "coro: a stop request resumes the sleeper with false in the timer's next pass and frees its "
    "timer",
    "[coro]") {
    mc::reset();
    std::stop_source src;
    outcome o;
    delayq::hashed_wheel<mc> w(wheel_opts());
    sleeper(w, 1h, o, src.get_token());
    CHECK(w.pending() == 1);
    src.request_stop();  // moves its task to now: not resumed inside request_stop()
    CHECK(o.resumed == 0);
    CHECK(w.advance() == 1);  // no time has passed
    CHECK(o.resumed == 1);
    CHECK(o.ok == false);
    CHECK(o.at == mc::time_point{});
    CHECK(w.pending() == 0);
    mc::advance(2h);
    w.advance();
    CHECK(o.resumed == 1);  // once
}

TEST_CASE("coro: a stop requested before the co_await: the sleep ends at once with false",
          "[coro]") {
    mc::reset();
    std::stop_source src;
    outcome o;
    delayq::hashed_wheel<mc> w(wheel_opts());
    src.request_stop();
    sleeper(w, 1h, o, src.get_token());
    CHECK(o.resumed == 1);  // did not stay suspended: resumed by await_suspend returning false
    CHECK(o.ok == false);
    CHECK(w.pending() == 0);
}

TEST_CASE("coro: stop() and the destructor resume every sleeper with false, none is leaked",
          "[coro]") {
    mc::reset();
    std::vector<outcome> outs(100);
    {
        delayq::hashed_wheel<mc> w(wheel_opts());
        for (std::size_t i = 0; i < 50; ++i) sleeper(w, std::chrono::seconds(i + 1), outs[i]);
        auto left = w.stop();
        CHECK(left.size() == 50);
        for (std::size_t i = 0; i < 50; ++i) {
            CHECK(outs[i].resumed == 1);
            CHECK(outs[i].ok == false);
        }
    }
    {
        delayq::hashed_wheel<mc> w(wheel_opts());
        for (std::size_t i = 50; i < 100; ++i) sleeper(w, std::chrono::seconds(i), outs[i]);
    }  // the destructor cancels them
    for (std::size_t i = 50; i < 100; ++i) {
        CHECK(outs[i].resumed == 1);
        CHECK(outs[i].ok == false);
    }
}

TEST_CASE("coro: a sleep on a stopped timer throws rejected_error into the coroutine", "[coro]") {
    mc::reset();
    delayq::hashed_wheel<mc> w(wheel_opts());
    (void)w.stop();
    bool threw = false, after = false;
    auto c = [&]() -> detached {
        try {
            co_await delayq::sleep_for(w, 1ms);
            after = true;
        } catch (const delayq::rejected_error&) {
            threw = true;
        }
    };
    c();
    CHECK(threw);
    CHECK_FALSE(after);
}

TEST_CASE("coro: at max_pending the sleep is refused with rejected_error, nothing leaks",
          "[coro]") {
    mc::reset();
    auto o = wheel_opts();
    o.max_pending = 1;
    outcome first;
    delayq::hashed_wheel<mc> w(o);
    sleeper(w, 10ms, first);
    bool threw = false;
    auto c = [&]() -> detached {
        try {
            co_await delayq::sleep_for(w, 1ms);
        } catch (const delayq::rejected_error&) {
            threw = true;
        }
    };
    c();
    CHECK(threw);
    CHECK(w.pending() == 1);
    mc::advance(10ms);
    w.advance();
    CHECK(first.resumed == 1);
}

TEST_CASE("coro: a frame destroyed while it sleeps cancels its task and is not resumed", "[coro]") {
    mc::reset();
    int after = 0;
    delayq::hashed_wheel<mc> w(wheel_opts());
    {
        auto c = [&]() -> owned {
            co_await delayq::sleep_for(w, 10ms);
            ++after;
        };
        owned o = c();
        CHECK(w.pending() == 1);
        CHECK_FALSE(o.done());
    }  // destroys the suspended frame
    CHECK(w.pending() == 0);
    mc::advance(1s);
    CHECK(w.advance() == 0);
    CHECK(after == 0);
}

TEST_CASE("coro: with an executor the coroutine resumes where the executor runs it", "[coro]") {
    mc::reset();
    run_queue rq;
    int resumed = 0;
    std::vector<bool> oks;
    std::stop_source src;
    delayq::hashed_wheel<mc> w(wheel_opts());
    auto c = [&](mc::duration d, std::stop_token st) -> detached {
        oks.push_back(co_await delayq::sleep_for(w, d, post_to{&rq}, std::move(st)));
        ++resumed;
    };
    c(5ms, {});
    c(1h, src.get_token());
    mc::advance(5ms);
    CHECK(w.advance() == 1);
    CHECK(resumed == 0);  // handed to the executor, not resumed inside advance()
    CHECK(rq.size() == 1);
    CHECK(rq.run_all() == 1);
    CHECK(resumed == 1);
    src.request_stop();  // a cut-short sleep goes through the next pass and the executor too
    CHECK(w.advance() == 1);
    CHECK(resumed == 1);
    CHECK(rq.run_all() == 1);
    CHECK(resumed == 2);
    REQUIRE(oks.size() == 2);
    CHECK(oks[0] == true);
    CHECK(oks[1] == false);
}

TEST_CASE("coro: sleep_until with an executor, and an executor that throws resumes inline",
          "[coro]") {
    mc::reset();
    run_queue rq;
    int resumed = 0;
    delayq::hashed_wheel<mc> w(wheel_opts());
    auto c = [&]() -> detached {
        const bool ok = co_await delayq::sleep_until(w, mc::now() + 3ms, post_to{&rq});
        CHECK(ok);
        ++resumed;
    };
    c();
    mc::advance(3ms);
    w.advance();
    CHECK(rq.run_all() == 1);
    CHECK(resumed == 1);

    auto throwing = [](delayq::resumption) { throw std::runtime_error("pool closed"); };
    auto d = [&]() -> detached {
        const bool ok = co_await delayq::sleep_for(w, 1ms, throwing);
        CHECK(ok);
        ++resumed;
    };
    d();
    mc::advance(1ms);
    w.advance();  // the executor throws: the coroutine goes on here rather than being lost
    CHECK(resumed == 2);
}

TEST_CASE("coro: on a hashed_wheel_timer the coroutine resumes on the worker thread", "[coro]") {
    mc::reset();
    std::atomic<int> resumed{0};
    std::thread::id where;
    bool ok = false;
    delayq::hashed_wheel_timer<mc> t(wheel_opts());
    auto c = [&]() -> detached {
        ok = co_await delayq::sleep_for(t, 5ms);
        where = std::this_thread::get_id();
        resumed.fetch_add(1, std::memory_order_release);
    };
    c();
    REQUIRE(delayq::test::eventually([] { return mc::sleepers() == 1; }));
    mc::advance(5ms);
    REQUIRE(delayq::test::eventually([&] { return resumed.load(std::memory_order_acquire) == 1; }));
    CHECK(ok);
    CHECK(where != std::this_thread::get_id());
}

TEST_CASE("coro: a stop request racing the sleep's end resumes each coroutine exactly once",
          "[coro][race]") {
    // Threaded timer, real clock, deadlines of 0 to 200 us: the worker ends sleeps while another
    // thread requests stops. Each coroutine counts its resumptions; TSan watches the rest.
    delayq::hashed_wheel_options<std::chrono::steady_clock> o;
    o.tick = std::chrono::microseconds(50);
    o.wheel_size = 64;
    constexpr int n = 2000;
    std::vector<std::stop_source> stops(n);
    std::vector<std::atomic<int>> resumed(n);
    std::atomic<int> oks{0}, cut{0};
    std::latch all(n);
    delayq::hashed_wheel_timer<std::chrono::steady_clock> t(o);
    auto c = [&](int i) -> detached {
        const bool ok = co_await delayq::sleep_for(t, std::chrono::microseconds(i % 200),
                                                   stops[static_cast<std::size_t>(i)].get_token());
        (ok ? oks : cut).fetch_add(1);
        resumed[static_cast<std::size_t>(i)].fetch_add(1);
        all.count_down();
    };
    std::jthread stopper([&] {
        for (int i = n - 1; i >= 0; i -= 2) stops[static_cast<std::size_t>(i)].request_stop();
    });
    for (int i = 0; i < n; ++i) c(i);
    all.wait();
    stopper.join();
    for (auto& r : resumed) CHECK(r.load() == 1);
    CHECK(oks.load() + cut.load() == n);
    CHECK(t.pending() == 0);
}

TEST_CASE("coro: stop() racing sleeps that end on the worker resumes each exactly once",
          "[coro][race]") {
    delayq::hashed_wheel_options<std::chrono::steady_clock> o;
    o.tick = std::chrono::microseconds(50);
    constexpr int n = 1000;
    std::vector<std::atomic<int>> resumed(n);
    std::atomic<int> oks{0}, cut{0};
    std::latch all(n);
    delayq::hashed_wheel_timer<std::chrono::steady_clock> t(o);
    auto c = [&](int i) -> detached {
        const bool ok = co_await delayq::sleep_for(t, std::chrono::microseconds(i));
        (ok ? oks : cut).fetch_add(1);
        resumed[static_cast<std::size_t>(i)].fetch_add(1);
        all.count_down();
    };
    for (int i = 0; i < n; ++i) c(i);
    (void)t.stop();  // the ones not yet run resume here, with false
    all.wait();
    for (auto& r : resumed) CHECK(r.load() == 1);
    CHECK(oks.load() + cut.load() == n);
}

TEST_CASE("coro: stop() resumes a parent that destroys its sleeping children: no hang, no leak",
          "[coro]") {
    // stop() ends the sleeps one by one, each resuming its coroutine (false) inline. When it
    // comes to the parent, the children whose turn has not come yet are still asleep, their tasks
    // waiting further down this thread's stack to be ended; the parent's end drops them, which
    // destroys their frames. Waiting for those tasks would never end: they are detached instead.
    mc::reset();
    int woke = 0, cut = 0, frames_gone = 0;
    std::optional<bool> parent_ok;
    struct count_on_exit {
        int& n;
        ~count_on_exit() { ++n; }
    };
    delayq::hashed_wheel<mc> w(wheel_opts());
    auto child = [&](mc::duration d) -> owned {
        count_on_exit g{frames_gone};
        const bool ok = co_await delayq::sleep_for(w, d);
        ++(ok ? woke : cut);
    };
    auto parent = [&]() -> detached {
        std::vector<owned> children;
        for (int i = 0; i < 10; ++i) children.push_back(child(std::chrono::seconds(10 + i)));
        parent_ok = co_await delayq::sleep_for(w, 1s);
    };  // the children's frames go with the parent's
    parent();
    CHECK(w.pending() == 11);
    const auto left = w.stop();
    CHECK(left.size() == 11);
    CHECK(parent_ok == false);
    CHECK(woke == 0);
    CHECK(frames_gone == 10);  // every child's frame is gone, resumed first (cut) or not
    CHECK(cut < 10);           // the test means something only if some were still asleep
    CHECK(w.pending() == 0);
}

TEST_CASE("coro: a stop request resumes a parent that destroys its sleeping children", "[coro]") {
    mc::reset();
    std::stop_source src;
    int children_resumed = 0;
    delayq::hashed_wheel<mc> w(wheel_opts());
    auto child = [&](mc::duration d) -> owned {
        co_await delayq::sleep_for(w, d);
        ++children_resumed;
    };
    bool parent_done = false;
    auto parent = [&]() -> detached {
        std::vector<owned> children;
        for (int i = 0; i < 10; ++i) children.push_back(child(std::chrono::seconds(10 + i)));
        const bool ok = co_await delayq::sleep_for(w, 1s, src.get_token());
        CHECK_FALSE(ok);
        parent_done = true;
    };
    parent();
    src.request_stop();
    CHECK_FALSE(parent_done);
    CHECK(w.advance() == 1);  // the parent's sleep, moved to now by the stop request
    CHECK(parent_done);
    CHECK(w.pending() == 0);
    mc::advance(1h);
    w.advance();
    CHECK(children_resumed == 0);
}

// A promise that rethrows hands what the coroutine throws to whoever resumed it. After a sleep
// that ran its course that is the timer's pass, which gives it to on_error; a sleep cut short must
// end the same way, or at least never inside a noexcept frame (std::terminate).

TEMPLATE_TEST_CASE(
    "coro: a rethrowing coroutine that throws after its sleep ends: on_error hears it",
    "[coro][throw]", hashed, hierarchical) {
    mc::reset();
    error_log log;
    outcome o;
    typename TestType::wheel w(options_with<TestType>(log));
    rethrowing c = throws_after_sleep(w, 5ms, o);
    mc::advance(5ms);
    CHECK(w.advance() == 1);
    CHECK(o.resumed == 1);
    CHECK(o.ok == true);
    CHECK(c.done());
    CHECK(log.seen() == std::vector<std::string>{"woke"});
}

TEMPLATE_TEST_CASE(
    "coro: a stop request cuts a sleep short: the coroutine resumes in the next pass, with false, "
    "and what it throws goes to on_error",
    "[coro][throw]", hashed, hierarchical) {
    mc::reset();
    error_log log;
    std::stop_source src;
    outcome o, other;
    typename TestType::wheel w(options_with<TestType>(log));
    rethrowing c = throws_after_sleep(w, 1h, o, src.get_token());
    rethrowing d = throws_after_sleep(w, 1h, other);
    CHECK(w.pending() == 2);
    src.request_stop();  // must not resume the coroutine in here: it could not report a throw
    CHECK(o.resumed == 0);
    REQUIRE(w.next_expiry());
    CHECK(*w.next_expiry() <= mc::now());  // due at once
    CHECK(w.advance() == 1);
    CHECK(o.resumed == 1);
    CHECK(o.ok == false);
    CHECK(o.thread == std::this_thread::get_id());
    CHECK(c.done());
    CHECK(log.seen() == std::vector<std::string>{"cut short"});
    CHECK(w.pending() == 1);  // the other sleep is untouched
    CHECK(other.resumed == 0);
    mc::advance(2h);
    CHECK(w.advance() == 1);
    CHECK(o.resumed == 1);  // once
    CHECK(other.ok == true);
    CHECK(log.seen() == std::vector<std::string>{"cut short", "woke"});
}

TEMPLATE_TEST_CASE(
    "coro: stop() cuts a sleep short: what a rethrowing coroutine then throws goes to on_error",
    "[coro][throw]", hashed, hierarchical) {
    mc::reset();
    error_log log;
    std::vector<outcome> outs(3);
    typename TestType::wheel w(options_with<TestType>(log));
    std::vector<rethrowing> cs;
    for (std::size_t i = 0; i < outs.size(); ++i)
        cs.push_back(throws_after_sleep(w, std::chrono::hours(i + 1), outs[i]));
    const auto left = w.stop();  // resumes each (false); each throws
    CHECK(left.size() == 3);
    for (std::size_t i = 0; i < outs.size(); ++i) {
        CHECK(outs[i].resumed == 1);
        CHECK(outs[i].ok == false);
        CHECK(cs[i].done());
    }
    CHECK(w.pending() == 0);
    // stop() resumed them on this thread, and what they threw went to on_error, in deadline order
    CHECK(log.seen() == std::vector<std::string>(3, "cut short"));
}

TEMPLATE_TEST_CASE(
    "coro: the timer's destructor cuts a sleep short: what a rethrowing coroutine then throws goes "
    "to on_error",
    "[coro][throw]", hashed, hierarchical) {
    mc::reset();
    error_log log;
    std::vector<outcome> outs(3);
    std::vector<rethrowing> cs;
    {
        typename TestType::wheel w(options_with<TestType>(log));
        for (std::size_t i = 0; i < outs.size(); ++i)
            cs.push_back(throws_after_sleep(w, std::chrono::hours(i + 1), outs[i]));
    }  // resumes each (false); each throws
    for (std::size_t i = 0; i < outs.size(); ++i) {
        CHECK(outs[i].resumed == 1);
        CHECK(outs[i].ok == false);
        CHECK(cs[i].done());
    }
    // the destructor resumed them on this thread, and what they threw went to on_error
    CHECK(log.seen() == std::vector<std::string>(3, "cut short"));
}

TEMPLATE_TEST_CASE(
    "coro: on a threaded timer a stop request resumes the coroutine on the worker, and what it "
    "throws goes to on_error",
    "[coro][throw]", delayq::hashed_wheel_timer<mc>, delayq::hierarchical_timing_wheel<mc>) {
    mc::reset();
    error_log log;
    std::stop_source src;
    outcome o;
    typename TestType::options opts;
    opts.tick = 1ms;
    opts.on_error = log.handler();
    TestType t(opts);
    rethrowing c = throws_after_sleep(t, 1h, o, src.get_token());
    src.request_stop();
    REQUIRE(delayq::test::eventually([&] { return log.seen().size() == 1; }));
    CHECK(log.seen() == std::vector<std::string>{"cut short"});
    CHECK(o.resumed == 1);
    CHECK(o.ok == false);
    CHECK(o.thread != std::this_thread::get_id());
    CHECK(t.pending() == 0);
}
