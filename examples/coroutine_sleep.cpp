// C++20 coroutines that sleep on a wheel: `co_await delayq::sleep_for(timer, 5ms)`
// (<delayq/coro.hpp>).
//
// A sleeping coroutine is one timer on the wheel (a 48-byte node) and its own frame, with no thread
// of its own: 10 000 of them sleep here at once on one hashed_wheel_timer, and the program prints
// what each costs in memory. First they resume on the timer's worker thread; then the same
// coroutines are resumed on an executor that the program names: a queue that its main thread runs,
// as an event loop or a thread pool would. A stop_token cuts a sleep short (co_await gives false).
#include <delayq/coro.hpp>
#include <delayq/hashed_wheel_timer.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <stop_token>
#include <thread>

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::atomic<std::size_t> frame_bytes{0};

// The smallest coroutine type: starts at once, frees itself at the end. It notes the size of the
// last frame it allocated, to tell what a sleeping coroutine costs.
struct detached {
    struct promise_type {
        static void* operator new(std::size_t n) {
            frame_bytes.store(n, std::memory_order_relaxed);
            return ::operator new(n);
        }
        static void operator delete(void* p) noexcept { ::operator delete(p); }
        detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

// An executor: resumptions queued here run on whichever thread calls run_until().
class run_queue {
  public:
    void post(delayq::resumption r) {
        {
            std::lock_guard lk(m_);
            q_.push_back(r);
        }
        cv_.notify_one();
    }
    // Runs what comes in until done() holds.
    template <class Done>
    void run_until(Done done) {
        std::unique_lock lk(m_);
        while (!done()) {
            if (q_.empty()) {
                cv_.wait_for(lk, 10ms);
                continue;
            }
            auto r = q_.front();
            q_.pop_front();
            lk.unlock();
            r();  // the coroutine goes on here, on this thread
            lk.lock();
        }
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<delayq::resumption> q_;
};

std::size_t heap_in_use() {
#if defined(__GLIBC__)
    const auto mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#else
    return 0;
#endif
}

constexpr int sleepers = 10'000;
std::atomic<int> asleep{0}, finished{0}, on_worker{0}, on_main{0};

// Sleeps three times (1 to 20 ms each), resuming on the timer's worker.
detached on_the_wheel(delayq::hashed_wheel_timer<>& timer, int i, std::thread::id main_thread) {
    for (int round = 0; round < 3; ++round) {
        asleep.fetch_add(1);
        co_await delayq::sleep_for(timer, std::chrono::milliseconds(1 + (i * 7 + round) % 20));
        asleep.fetch_sub(1);
    }
    if (std::this_thread::get_id() != main_thread) on_worker.fetch_add(1);
    finished.fetch_add(1);
}

// The same, resumed by `rq` on the thread that runs it.
detached on_the_executor(delayq::hashed_wheel_timer<>& timer, run_queue& rq, int i,
                         std::thread::id main_thread) {
    auto post = [&rq](delayq::resumption r) { rq.post(r); };
    for (int round = 0; round < 3; ++round)
        co_await delayq::sleep_for(timer, std::chrono::milliseconds(1 + (i * 7 + round) % 20),
                                   post);
    if (std::this_thread::get_id() == main_thread) on_main.fetch_add(1);
    finished.fetch_add(1);
}

// Sleeps an hour unless `st` cuts it short; `slept` becomes 1 (the hour passed) or 0 (cut short).
detached until_stopped(delayq::hashed_wheel_timer<>& timer, std::stop_token st,
                       std::atomic<int>& slept) {
    const bool ok = co_await delayq::sleep_for(timer, 1h, std::move(st));
    slept.store(ok ? 1 : 0);
}

}  // namespace

int main() {
    delayq::hashed_wheel_timer<>::options o;
    o.tick = 1ms;
    o.wheel_size = 64;
    delayq::hashed_wheel_timer<> timer(o);
    const auto main_thread = std::this_thread::get_id();

    const std::size_t before = heap_in_use();
    auto start = clock_type::now();
    for (int i = 0; i < sleepers; ++i) on_the_wheel(timer, i, main_thread);
    const std::size_t bytes = heap_in_use() - before;
    const int sleeping = asleep.load();  // most are still in their first sleep here
    while (finished.load() < sleepers) std::this_thread::sleep_for(1ms);
    std::printf(
        "%d coroutines slept 3 times each (1-20 ms) on one hashed_wheel_timer: all done "
        "in %.0f ms, %d resumed on the timer's worker thread\n",
        sleepers, std::chrono::duration<double, std::milli>(clock_type::now() - start).count(),
        on_worker.load());
    std::printf(
        "  memory while %d slept: %.0f B per coroutine: its frame (%zu B, of which %zu the "
        "awaiter) and its timer on the wheel\n",
        sleeping, static_cast<double>(bytes) / sleepers, frame_bytes.load(),
        sizeof(delayq::sleep_awaiter<delayq::hashed_wheel_timer<>>));

    finished = 0;
    run_queue rq;
    start = clock_type::now();
    for (int i = 0; i < sleepers; ++i) on_the_executor(timer, rq, i, main_thread);
    rq.run_until([] { return finished.load() == sleepers; });
    std::printf(
        "%d more, resumed by an executor (a queue the main thread runs): all done in %.0f "
        "ms, %d of them on the main thread\n",
        sleepers, std::chrono::duration<double, std::milli>(clock_type::now() - start).count(),
        on_main.load());

    std::stop_source stop;
    std::atomic<int> slept{-1};
    until_stopped(timer, stop.get_token(), slept);
    // Cuts the hour-long sleep short: the worker resumes the coroutine at once, with false (not
    // request_stop(), which could not report what the coroutine throws).
    stop.request_stop();
    while (slept.load() < 0) std::this_thread::sleep_for(1ms);
    std::printf("a one-hour sleep cut short by its stop_token: co_await gave %s; %zu timers left\n",
                slept.load() == 1 ? "true" : "false", timer.pending());
    return on_worker.load() == sleepers && on_main.load() == sleepers && slept.load() == 0 ? 0 : 1;
}
