// The translation unit scripts/tidy runs clang-tidy over: every public header, and one
// instantiation of each template with the usual arguments, so that the checks see the code that
// users compile. Not built by CMake (this folder has no CMakeLists.txt).
#include <delayq/basic_wheel.hpp>
#include <delayq/coro.hpp>
#include <delayq/delay_queue.hpp>
#include <delayq/delayed.hpp>
#include <delayq/delayq.hpp>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/job.hpp>
#include <delayq/job_queue.hpp>
#include <delayq/manual_clock.hpp>
#include <delayq/missed_tick.hpp>
#include <delayq/prometheus.hpp>
#include <delayq/retry_policy.hpp>
#include <delayq/timeout.hpp>
#include <delayq/worker.hpp>
#if __has_include(<hiredis/hiredis.h>)
#include <delayq/redis/delay_queue.hpp>
#endif
#if __has_include(<sqlite3.h>)
#include <delayq/sqlite/delay_queue.hpp>
#endif
#if __has_include(<libpq-fe.h>)
#include <delayq/postgres/delay_queue.hpp>
#endif

#include <chrono>
#include <coroutine>
#include <exception>
#include <iterator>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

namespace {

struct detached {
    struct promise_type {
        detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

template <class Timer>
detached sleep_on(Timer& t, const std::stop_token& st) {
    using namespace std::chrono_literals;
    (void)co_await delayq::sleep_for(t, 1ms, st);
    (void)co_await delayq::sleep_until(t, Timer::clock::now(), [](delayq::resumption r) { r(); });
}

template <class Clock>
void use_all() {
    using namespace std::chrono_literals;
    delayq::delay_queue<delayq::delayed<std::string, Clock>, Clock> q;
    q.put(delayq::delay_for<Clock>(std::string("x"), 1ms));
    (void)q.poll();
    (void)q.take_for(0ms);
    (void)q.peek();
    std::vector<delayq::delayed<std::string, Clock>> out;
    q.drain_to(std::back_inserter(out));
    q.remove_if([](const auto&) { return true; });
    (void)q.next_deadline();
    (void)q.close();

    delayq::delay_queue<std::unique_ptr<delayq::delayed<int, Clock>>, Clock> qp;
    qp.put(std::make_unique<delayq::delayed<int, Clock>>(delayq::delay_for<Clock>(1, 1ms)));
    (void)qp.take_for(0ms);

    delayq::hashed_wheel<Clock> hw;
    auto h = hw.schedule([] {}, 1ms);
    (void)h.cancel();
    (void)hw.advance();
    (void)hw.next_expiry();
    std::stop_source src;
    sleep_on(hw, src.get_token());
    src.request_stop();
    (void)hw.stop();

    delayq::hashed_wheel_timer<Clock> t;
    t.schedule([] {}, 1ms);
    (void)t.stop();

    delayq::hierarchical_wheel<Clock> w;
    auto every = w.schedule_every([] {}, 1ms, delayq::missed_tick::burst);
    (void)every.cancel();
    w.schedule([] {}, 1ms);
    (void)w.advance();
    (void)w.next_expiry();
    (void)w.pending();
    (void)w.stop();

    delayq::hierarchical_timing_wheel<Clock> ht;
    ht.schedule([] {}, 1ms);
    (void)ht.wakeups();
    (void)ht.stop();
}

}  // namespace

int main() try {
    use_all<std::chrono::steady_clock>();
    use_all<delayq::manual_clock>();
#if __has_include(<hiredis/hiredis.h>)
    delayq::redis::options ro;
    ro.name = "tidy";
    delayq::redis::delay_queue rq(ro);
    (void)rq.put_after("a", "b", std::chrono::milliseconds(1));
    static_assert(delayq::job_queue<delayq::redis::delay_queue>);
#endif
#if __has_include(<sqlite3.h>)
    delayq::sqlite::options so;
    so.path = "tidy.db";
    delayq::sqlite::delay_queue sq(so);
    (void)sq.put_after("a", "b", std::chrono::milliseconds(1));
    if (auto j = sq.take(std::chrono::milliseconds(0))) {
        (void)sq.extend(*j, std::chrono::seconds(1));
        (void)sq.bury(*j);
    }
    static_assert(delayq::job_queue<delayq::sqlite::delay_queue>);
    {
        delayq::worker_options wo;
        wo.hooks.retrying = [](const delayq::job&, std::chrono::milliseconds, std::string_view) {};
        delayq::worker w(
            sq, [](const delayq::job&, const std::stop_token&) {}, wo);
        delayq::prometheus_exposition e;
        e.add("tidy", w.counters());
        e.add("tidy", delayq::queue_stats{});
        (void)e.str();
        w.stop();
    }
    sq.pause();
    (void)sq.paused();
    sq.resume();
#endif
    return 0;
} catch (...) {
    return 1;
}
