// Many consumers on one Redis queue: an idle consumer takes a due job on time while another works,
// a take that gives up hands the wake-up on, a put wakes the consumers exactly when it makes the
// next event earlier, and takes from many threads of one object never give up while jobs are due.
#include <array>
#include <atomic>
#include <chrono>
#include <delayq/redis/delay_queue.hpp>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "redis_proxy.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq_test::eventually;
using delayq_test::opts;
using delayq_test::redis_server;

namespace {

// The server's time at the take (the lease began then) minus the time the delivery was due.
std::chrono::milliseconds lateness(const delayq::redis::job& j, std::chrono::milliseconds lease) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(j.lease_deadline - lease -
                                                                 j.deadline);
}

// A consumer thread: takes jobs with take(max_wait) and keeps what it took; a job whose id is
// `busy_id` keeps it busy for `busy` before its ack. It ends after the first job it takes once
// `stop` is set (stop_all() puts one job per consumer for that).
struct consumer {
    delay_queue q;
    std::mutex m;
    std::vector<delayq::redis::job> taken;
    std::vector<std::string> errors;
    std::thread t;

    consumer(delayq::redis::options o, const std::atomic<bool>& stop,
             std::chrono::milliseconds max_wait, std::string busy_id,
             std::chrono::milliseconds busy)
        : q(std::move(o)) {
        t = std::thread([this, &stop, max_wait, busy_id = std::move(busy_id), busy] {
            try {
                for (;;) {
                    auto j = q.take(max_wait);
                    if (!j) continue;
                    {
                        std::lock_guard lk(m);
                        taken.push_back(*j);
                    }
                    if (j->id == busy_id) std::this_thread::sleep_for(busy);  // the work
                    q.ack(*j);
                    if (stop.load()) return;
                }
            } catch (const std::exception& e) {
                std::lock_guard lk(m);
                errors.emplace_back(e.what());
            }
        });
    }
    std::optional<delayq::redis::job> find(const std::string& id) {
        std::lock_guard lk(m);
        for (const auto& j : taken)
            if (j.id == id) return j;
        return std::nullopt;
    }
    ~consumer() { t.join(); }
};

// Ends `n` consumers that share `stop`: each takes one of the jobs put here and leaves.
void stop_all(delay_queue& producer, std::atomic<bool>& stop, int n) {
    stop = true;
    for (int i = 0; i < n; ++i) producer.put_after("stop-" + std::to_string(i), "", 0ms);
}

}  // namespace

TEST_CASE("two idle consumers: while one works on the first job the other takes the second on time",
          "[wake]") {
    // Issue 10, item 11. Before the fix the wake-up was passed on only when more work was due
    // *now*: the consumer that watched the head took A, nobody watched B, and B waited for the idle
    // consumer's max_block to run out (B ~4.4 s late here).
    redis_server srv;
    auto o = opts(srv);
    o.max_block = 5s;
    delay_queue producer(opts(srv));
    std::atomic<bool> stop{false};
    consumer c1(o, stop, 10s, "A", 2s), c2(o, stop, 10s, "A", 2s);
    REQUIRE(eventually([&] { return srv.waiting_objects() == 2; }));
    REQUIRE(producer.put_after("A", "", 200ms));
    REQUIRE(producer.put_after("B", "", 600ms));
    std::optional<delayq::redis::job> b;
    REQUIRE(eventually(
        [&] {
            b = c1.find("B");
            if (!b) b = c2.find("B");
            return b.has_value();
        },
        8s));
    CHECK(lateness(*b, o.lease) < 2s);  // not a max_block late
    const bool same = c1.find("A").has_value() == c1.find("B").has_value();
    CHECK_FALSE(same);  // the idle consumer took B, not the busy one after its work
    stop_all(producer, stop, 2);
    CHECK(c1.errors.empty());
    CHECK(c2.errors.empty());
}

TEST_CASE("a take that runs out of max_wait after being woken hands the watch on", "[wake]") {
    // Issue 10, item 11, second half. C1 (take(300 ms)) blocks first, so the put's wake-up went
    // to it; C1 learnt that the job is due in 1 s, gave up at 300 ms and (before the fix) took the
    // wake-up with it: C2, idle all along, took the job only when its own max_block ran out (4 s
    // late). Since the wake-ups are broadcast (pub/sub) every waiting object hears them.
    redis_server srv;
    auto o = opts(srv);
    o.max_block = 5s;
    delay_queue c1(o);
    CHECK_FALSE(c1.take(0ms));  // connect and load the scripts first
    std::thread t1([&] { (void)c1.take(300ms); });
    REQUIRE(eventually([&] { return srv.waiting_objects() == 1; }));
    delay_queue producer(opts(srv));
    std::atomic<bool> stop{false};
    consumer c2(o, stop, 10s, "", 0ms);
    REQUIRE(eventually([&] { return srv.waiting_objects() == 2; }));
    REQUIRE(producer.put_after("A", "", 1s));
    t1.join();
    std::optional<delayq::redis::job> a;
    REQUIRE(eventually([&] { return (a = c2.find("A")).has_value(); }, 8s));
    CHECK(lateness(*a, o.lease) < 2s);  // not a max_block late
    stop_all(producer, stop, 1);
    CHECK(c2.errors.empty());
}

TEST_CASE("take(0) in four threads at once: none gives up while jobs are due", "[threads]") {
    // Found while measuring: a take whose shard another thread of the object was looking at (its
    // consume script in flight) returned nothing at once, although jobs were due: three of four
    // `while (auto j = q.take(0ms)) q.ack(*j);` loops ended at the start and one did all the work.
    redis_server srv;
    delay_queue q(opts(srv));
    constexpr int n = 2000;
    const auto past = std::chrono::system_clock::time_point(std::chrono::hours(24));
    std::vector<delay_queue::put_request> reqs;
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back("j" + std::to_string(i));
    for (const auto& id : ids) REQUIRE(q.put(id, "", past));
    std::atomic<int> ready{0};
    std::array<int, 4> took{};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&, t] {
            ++ready;
            while (ready.load() < 4) {
            }
            while (auto j = q.take(0ms)) {
                q.ack(*j);
                ++took[static_cast<std::size_t>(t)];
            }
        });
    for (auto& t : ts) t.join();
    CHECK(took[0] + took[1] + took[2] + took[3] == n);
    for (int k : took) CHECK(k > 0);
    CHECK(q.size() == 0);
}

TEST_CASE("a put publishes exactly when it makes the shard's next event earlier", "[wake]") {
    // Issue 28. The put script used to compare with the head's score (ZRANGE WITHSCORES, the
    // dearest part of that call); it now asks whether the head is a job it put. Consumers sleep
    // until the next event they were told of, so a put before it must publish, and one after it
    // need not. Scripts' commands are counted in commandstats.
    redis_server srv;
    delay_queue q(opts(srv));
    const auto publishes = [&] {
        const std::string n = srv.info_field("commandstats", "cmdstat_publish:calls=");
        return n.empty() ? 0 : std::stoi(n);
    };
    REQUIRE(q.put_after("a", "", 10s));  // the first job: the next event
    CHECK(publishes() == 1);
    REQUIRE(q.put_after("b", "", 20s));  // after the head: nothing to say
    CHECK(publishes() == 1);
    REQUIRE(q.put_after("c", "", 5s));  // before it
    CHECK(publishes() == 2);
    const std::array<delayq::put_request, 2> later{{{"d", "", 30s}, {"e", "", 40s}}};
    CHECK(q.put_many(later) == std::vector<bool>{true, true});
    CHECK(publishes() == 2);
    const std::array<delayq::put_request, 2> one_earlier{{{"f", "", 50s}, {"g", "", 1s}}};
    CHECK(q.put_many(one_earlier) == std::vector<bool>{true, true});
    CHECK(publishes() == 3);
    CHECK_FALSE(q.put_after("a", "", 0ms));  // already queued: nothing changes, nothing said
    CHECK(publishes() == 3);
    REQUIRE(q.put("h", "", std::chrono::system_clock::now()));  // an absolute time, due now
    CHECK(publishes() == 4);
    CHECK(q.size() == 8);
}

TEST_CASE(
    "a take asleep until a put's due time is not put back to sleep by an older answer that comes "
    "later") {
    // One object, two threads. The first waits for jobs, reading the queue's messages. The
    // second's take looks at the server (nothing is due) and its answer is slow to come back (the
    // proxy holds it 1.5 s). Meanwhile another client puts a job due in 2 s: the first thread
    // hears it and sleeps until then. The second's answer, older than the put, must not move the
    // object's next event back to "nothing for max_block" (20 s): the job comes out when due.
    redis_server srv;
    delayq_test::redis_proxy proxy(srv.port());
    auto o = delayq_test::queue_options(proxy.port());
    o.max_block = 20s;
    delay_queue q(o);
    delay_queue producer(opts(srv));
    auto waiter = std::async(std::launch::async, [&] { return q.take(60s); });
    std::this_thread::sleep_for(1s);  // its first look done, it reads the messages (or soon will)
    proxy.delay_replies(1500ms);
    auto looker = std::async(std::launch::async, [&] { return q.take(0ms); });
    std::this_thread::sleep_for(300ms);  // the look has run on the server, its answer is held
    const auto put_at = std::chrono::steady_clock::now();
    REQUIRE(producer.put_after("due-in-2s", "x", 2s));
    const auto j = waiter.get();
    const auto waited = std::chrono::steady_clock::now() - put_at;
    REQUIRE(j);
    CHECK(j->id == "due-in-2s");
    // Due after 2 s, then one look through the proxy (1.5 s): about 3.5 s. Put back to sleep, it
    // comes after max_block, 20 s.
    CHECK(waited < 12s);
    CHECK_FALSE(looker.get());
}
