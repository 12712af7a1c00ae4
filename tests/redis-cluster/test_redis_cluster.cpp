// delayq::redis on a Redis Cluster of 3 masters and 3 replicas that each test starts: a failover
// and a reshard of the queue's slot while producers and consumers run, and the sharded queue
// spread over the masters. Every job is counted in and out.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <delayq/redis/delay_queue.hpp>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "flow.hpp"
#include "redis_cluster.hpp"

using namespace std::chrono_literals;
using delayq::redis::delay_queue;
using delayq::redis::sharded_delay_queue;
using delayq::redis::detail::slot_of;
using delayq_test::redis_cluster;

namespace {

// Options for queue `name`, pointed at a node that does not serve it (so it starts with a MOVED).
delayq::redis::options cluster_options(redis_cluster& c, const std::string& name) {
    auto o = delayq_test::queue_options(c.node(0).port(), name);
    const int owner = c.master_of_key("{" + name + "}");
    for (int m : c.masters())
        if (m != owner) o.port = m;
    return o;
}

// A queue name whose slot is the first of `master`'s slots: the one that
// `redis-cli --cluster reshard --cluster-slots 1` moves.
std::string name_on_first_slot(redis_cluster& c, int master) {
    const std::uint16_t first = c.first_slot_of(master);
    for (int n = 0;; ++n) {
        const std::string name = "reshard-" + std::to_string(n);
        if (slot_of("{" + name + "}") == first) return name;
    }
}

// 4 producers put 4 x 400 jobs over about 4 s (due within 300 ms), 4 consumers take and ack them
// (one delivery in ten nacked first); `midway` runs once half of them are put.
delayq_test::flow_options paced(std::function<void()> midway) {
    delayq_test::flow_options f;
    f.per_producer = 400;
    f.put_interval = 10ms;
    f.midway = std::move(midway);
    f.leases_may_be_lost = true;  // the outage can outlast a prefetched job's hold (flow.hpp)
    return f;
}

// What every run checks; `during` names what must also have gone on while the cluster changed.
enum class during { nothing, puts_with_jobs_pending, puts_and_acks };

void check(const delayq_test::flow_result& r, during d) {
    for (const auto& f : r.failures) FAIL_CHECK(f);
    for (const auto& l : r.lost) WARN("lease lost in the outage, the job delivered again: " << l);
    CHECK(r.all_acked_once());  // a lost lease's job too: acked exactly once, by its new holder
    // Only the prefetched jobs handed out as the outage began: at most one a consumer, twice.
    CHECK(r.lost.size() <= 8);
    if (d != during::nothing) {  // the change met live traffic and jobs that had to move
        CHECK(r.put_during_midway > 0);
        CHECK(r.pending_at_midway > 0);
    }
    if (d == during::puts_and_acks) CHECK(r.acked_during_midway > 0);
}

// Consumer threads on one queue object that take and ack until stopped, recording every
// delivery (when, which shard), every ack that went through and every error.
class consumers {
  public:
    using clock = std::chrono::steady_clock;
    struct delivery {
        std::string id;
        std::size_t shard;
        clock::time_point at;
    };

    consumers(sharded_delay_queue& q, int threads) : q_(q) {
        for (int i = 0; i < threads; ++i) ts_.emplace_back([this] { run(); });
    }
    consumers(const consumers&) = delete;
    consumers& operator=(const consumers&) = delete;
    ~consumers() { stop(); }

    void stop() {
        stop_ = true;
        for (auto& t : ts_)
            if (t.joinable()) t.join();
    }

    std::size_t shard_of(const std::string& id) const {
        return delayq::redis::detail::fnv1a(id) % q_.shards();
    }

    // Deliveries of shards that `pick` accepts, in the time window (after, before).
    template <class Pick>
    std::size_t delivered(Pick pick, clock::time_point after, clock::time_point before) const {
        std::lock_guard lk(m_);
        std::size_t n = 0;
        for (const auto& d : deliveries_)
            if (pick(d.shard) && d.at > after && d.at < before) ++n;
        return n;
    }
    std::size_t delivered_id(const std::string& id) const {
        std::lock_guard lk(m_);
        std::size_t n = 0;
        for (const auto& d : deliveries_) n += d.id == id;
        return n;
    }
    std::size_t delivered() const {
        std::lock_guard lk(m_);
        return deliveries_.size();
    }
    std::map<std::string, int> acked() const {
        std::lock_guard lk(m_);
        return acked_;
    }
    std::vector<std::string> take_errors() const {
        std::lock_guard lk(m_);
        return take_errors_;
    }
    std::vector<std::string> ack_errors() const {
        std::lock_guard lk(m_);
        return ack_errors_;
    }
    // The ids whose ack threw: it may have run (the reply was lost) or not (then the job comes
    // again).
    std::set<std::string> unsure() const {
        std::lock_guard lk(m_);
        return unsure_;
    }

  private:
    void run() {
        while (!stop_) {
            std::optional<delayq::redis::job> j;
            try {
                j = q_.take(200ms);
            } catch (const std::exception& e) {
                std::lock_guard lk(m_);
                take_errors_.emplace_back(e.what());
                continue;
            }
            if (!j) continue;
            {
                std::lock_guard lk(m_);
                deliveries_.push_back({j->id, shard_of(j->id), clock::now()});
            }
            try {
                const bool ok = q_.ack(*j);  // false: the lease ended, it comes again
                std::lock_guard lk(m_);
                if (ok) ++acked_[j->id];
            } catch (const std::exception& e) {  // its master is down
                std::lock_guard lk(m_);
                ack_errors_.emplace_back(e.what());
                unsure_.insert(j->id);
            }
        }
    }

    sharded_delay_queue& q_;
    std::atomic<bool> stop_{false};
    mutable std::mutex m_;
    std::vector<delivery> deliveries_;
    std::map<std::string, int> acked_;
    std::set<std::string> unsure_;
    std::vector<std::string> take_errors_, ack_errors_;
    std::vector<std::thread> ts_;
};

// `count` jobs "j0".. put with put_many, due spread evenly over `over` from now.
std::vector<std::string> put_spread(sharded_delay_queue& q, int count,
                                    std::chrono::milliseconds over) {
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) ids.push_back("j" + std::to_string(i));
    std::vector<sharded_delay_queue::put_request> reqs;
    for (int i = 0; i < count; ++i) reqs.push_back({ids[i], ids[i], over * i / count});
    const auto queued = q.put_many(reqs);
    for (std::size_t i = 0; i < queued.size(); ++i)
        if (!queued[i]) throw std::runtime_error("put refused: " + ids[i]);
    return ids;
}

}  // namespace

TEST_CASE(
    "a sharded queue whose shard's master is killed: the live shards keep delivering, and the "
    "dead shard's jobs come once its replica took over, none lost") {
    // cluster-require-full-coverage yes: the cluster is down for a moment, from when the dead
    // master is marked failed (the node timeout, 6 s here) until its replica took over. Until
    // then the cluster serves every slot but the dead master's: that is the window checked below.
    redis_cluster c({"--cluster-node-timeout", "6000"});
    const std::string name = "orders";
    const int victim = c.master_of_key("{" + name + "#0}");
    auto o = delayq_test::queue_options(victim, name);
    for (int m : c.masters())
        if (m != victim) o.port = m;  // the options name a node that stays up
    o.lease = 5s;                     // a lease that the dead master took with it ends soon
    o.io_timeout = 2s;                // an ack that its master's death holds up gives up sooner
    sharded_delay_queue q(o, 12);
    std::set<std::size_t> dead;  // the shards of the master that is killed
    for (std::size_t i = 0; i < 12; ++i)
        if (c.master_of_key("{" + name + "#" + std::to_string(i) + "}") == victim) dead.insert(i);
    REQUIRE(!dead.empty());
    REQUIRE(dead.size() < 12);
    const auto is_dead = [&](std::size_t s) { return dead.count(s) == 1; };
    const auto is_live = [&](std::size_t s) { return dead.count(s) == 0; };

    // Every job is put before the kill and reaches the replica: a put that an asynchronous
    // replication loses with its master is a documented loss, not what this test is about. Due
    // over 12 s at 100 a second: live jobs still come due in the window checked below however
    // late the consumers start (under the sanitizers they start seconds late, and with 6 s of
    // jobs the live shards had none left to deliver by then).
    const auto ids = put_spread(q, 1200, 12s);
    c.wait_replicated(victim);
    const int replica = c.replica_of(victim);
    const std::uint16_t slot = slot_of("{" + name + "#" + std::to_string(*dead.begin()) + "}");

    using clock = consumers::clock;
    consumers cs(q, 8);
    REQUIRE(delayq_test::eventually([&] { return cs.delivered() >= 40; }, 30s));
    const auto killed_at = clock::now();
    c.kill9(victim);
    // A replica takes over no sooner than the node timeout (6 s) after its master went silent:
    // until then the cluster serves every slot but the dead master's. From io_timeout after the
    // kill no call that the kill caught is still waiting (an ack of a job of a dead shard waits
    // that long), and every consumer has met a dead shard: the live shards must keep delivering
    // all the same. (The window is seconds long, and at ~67 live jobs due a second, 10 is a bound
    // only a stall misses, not a slow machine: with 2 s it once saw 0 under clang's sanitizers.)
    REQUIRE(delayq_test::eventually([&] { return c.all_name_master(slot, replica); }, 60s));
    const auto over_at = clock::now();
    const std::size_t live_while_down =
        cs.delivered(is_live, killed_at + 2500ms, std::min(over_at, killed_at + 5500ms));
    INFO("deliveries from the live shards from 2.5 s to 5.5 s after the kill: " << live_while_down);
    CHECK(live_while_down >= 10);

    // Every job comes out: acked, or delivered and then its ack threw (the master died with the
    // ack in flight: it may have run; if it did not, the job comes again). And nothing is left.
    const auto missing = [&] {
        const auto acked = cs.acked();
        const auto unsure = cs.unsure();
        std::vector<std::string> out;
        for (const auto& id : ids)
            if (acked.count(id) == 0 && unsure.count(id) == 0) out.push_back(id);
        return out;
    };
    const auto drained = [&] {
        try {
            return missing().empty() && q.size() == 0;
        } catch (const delayq::redis::error&) {  // the shard's master is not back yet
            return false;
        }
    };
    const bool done = delayq_test::eventually(drained, 60s);
    cs.stop();
    for (const auto& e : cs.take_errors()) UNSCOPED_INFO("take: " << e);
    for (const auto& e : cs.ack_errors()) UNSCOPED_INFO("ack: " << e);
    for (const auto& id : missing())
        UNSCOPED_INFO("never acked: " << id << " (shard " << cs.shard_of(id) << ", delivered "
                                      << cs.delivered_id(id) << " times)");
    CHECK(done);
    CHECK(missing().empty());
    CHECK(q.size() == 0);
    CHECK(cs.delivered(is_dead, over_at, clock::time_point::max()) > 0);
}

TEST_CASE(
    "a sharded queue with a shard gone for good: every job of the live shards is delivered and "
    "take() reports no error (master and replica killed, full coverage not required)") {
    redis_cluster c({"--cluster-require-full-coverage", "no"});
    const std::string name = "orders";
    const int victim = c.master_of_key("{" + name + "#0}");
    const int replica = c.replica_of(victim);
    auto o = delayq_test::queue_options(victim, name);
    for (int m : c.masters())
        if (m != victim) o.port = m;
    o.io_timeout = 1s;
    std::set<std::size_t> dead;
    for (std::size_t i = 0; i < 12; ++i)
        if (c.master_of_key("{" + name + "#" + std::to_string(i) + "}") == victim) dead.insert(i);
    REQUIRE(!dead.empty());
    REQUIRE(dead.size() < 12);

    std::vector<std::string> ids;
    {
        sharded_delay_queue producer(o, 12);
        ids = put_spread(producer, 480, 1s);
    }
    c.kill9(victim);
    c.kill9(replica);
    std::set<std::string> live;  // the jobs that can still be had
    for (const auto& id : ids)
        if (dead.count(delayq::redis::detail::fnv1a(id) % 12) == 0) live.insert(id);

    sharded_delay_queue q(o, 12);
    consumers cs(q, 4);
    const auto live_acked = [&] {
        std::size_t n = 0;
        for (const auto& [id, times] : cs.acked()) n += live.count(id);
        return n;
    };
    const bool all = delayq_test::eventually([&] { return live_acked() == live.size(); }, 30s);
    cs.stop();
    INFO("live jobs acked: " << live_acked() << " of " << live.size());
    CHECK(all);
    const auto errors = cs.take_errors();
    INFO("take errors: " << errors.size() << (errors.empty() ? "" : ", the first: " + errors[0]));
    CHECK(errors.empty());
    std::size_t stray = 0, twice = 0;
    for (const auto& [id, times] : cs.acked()) {
        stray += 1 - live.count(id);  // nothing can come from the dead shards
        twice += times > 1 ? 1 : 0;   // nothing failed: nothing comes twice
    }
    CHECK(stray == 0);
    CHECK(twice == 0);
    CHECK(cs.ack_errors().empty());
    std::optional<delayq::redis::job> none;
    CHECK_NOTHROW(none = q.take(300ms));  // drained: no job, and no error either
    CHECK_FALSE(none);
}

TEST_CASE(
    "a failover of the queue's master in the middle of a run: every job acked exactly once, none "
    "lost") {
    redis_cluster c;
    const auto o = cluster_options(c, "failover");
    const std::uint16_t slot = slot_of("{failover}");
    const int old_master = c.master_of(slot);
    delay_queue q(o);
    int new_master = 0;
    const auto r = delayq_test::run_flow(
        q, paced([&] { new_master = c.failover(slot); }));  // CLUSTER FAILOVER
    check(r, during::puts_and_acks);  // a failover takes seconds here: consumers go on
    CHECK(new_master != old_master);
    CHECK(c.master_of(slot) == new_master);
    CHECK(q.size() == 0);
    // Nothing of the queue is left on either node, and the jobs were on the new master.
    CHECK(c.at_port(new_master).keys("dq:v3:{failover}:[ed]*").empty());
}

TEST_CASE(
    "a master stopped with SIGSTOP and failed over: the object that used it follows the failover "
    "as soon as the other nodes name the new master") {
    // Seen: after such a failover an existing object got 0 successes and 11 errors over 8 s (a
    // new object: 11 and 0): the router reloaded its slot map only after a failed connect, and a
    // stopped master still accepts connections (the kernel does); its calls time out instead.
    redis_cluster c;
    const std::string name = "stopped";
    const std::uint16_t slot = slot_of("{" + name + "}");
    const int victim = c.master_of(slot);
    const int replica = c.replica_of(victim);
    auto o = cluster_options(c, name);  // a node that stays up
    o.io_timeout = 500ms;
    delay_queue q(o);
    REQUIRE(q.put_after("before", "", 1h));
    c.wait_replicated(victim);

    ::kill(c.at_port(victim).pid(), SIGSTOP);
    // Ask only the nodes that run: a command to the stopped one would wait for ever.
    const auto others_name_replica = [&] {
        for (std::size_t i = 0; i < c.size(); ++i)
            if (c.node(i).port() != victim && c.master_of(slot, i) != replica) return false;
        return true;
    };
    // Calls go on while the cluster notices (node timeout 2 s) and the replica takes over; each
    // returns or fails, none hangs.
    int ok_during = 0, failed_during = 0;
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    while (!others_name_replica() && std::chrono::steady_clock::now() < give_up) {
        try {
            ok_during +=
                q.put_after("during-" + std::to_string(ok_during + failed_during), "", 1h) ? 1 : 0;
        } catch (const delayq::redis::error& e) {
            ++failed_during;
            UNSCOPED_INFO("during: " << e.what());
        }
        std::this_thread::sleep_for(100ms);
    }
    REQUIRE(others_name_replica());
    INFO("calls while the master was stopped: " << ok_during << " went through, " << failed_during
                                                << " failed");
    CHECK(failed_during > 0);  // the master was asked, and did not answer

    // The cluster says so: every call of the same object now goes to the new master.
    int ok_after = 0;
    for (int i = 0; i < 5; ++i) {
        try {
            ok_after += q.put_after("after-" + std::to_string(i), "", 1h) ? 1 : 0;
        } catch (const delayq::redis::error& e) {
            UNSCOPED_INFO("after: " << e.what());
        }
    }
    CHECK(ok_after == 5);
    CHECK(q.size() == static_cast<std::size_t>(1 + ok_during + ok_after));
}

TEST_CASE(
    "resharding the queue's slot to another master while jobs flow: every job acked exactly once") {
    redis_cluster c;
    const auto masters = c.masters();
    const int from = masters[0], to = masters[1];
    const std::string name = name_on_first_slot(c, from);
    const std::uint16_t slot = slot_of("{" + name + "}");
    delay_queue q(cluster_options(c, name));
    const auto r = delayq_test::run_flow(
        q, paced([&] { c.reshard(from, to, 1); }));  // redis-cli --cluster reshard
    // No ack is required *during* the reshard: it lasts ~80 ms here, and while the slot is half
    // migrated every script on it gets TRYAGAIN and retries after 10, 20, 40... ms, so on a loaded
    // host all of that window's acks can land just after it (seen once in CI: 0 acks during).
    check(r, during::puts_with_jobs_pending);
    CHECK(c.master_of(slot) == to);
    CHECK(q.size() == 0);
}

TEST_CASE("a sharded queue on a cluster: shards on every master, each job once, idempotent by id") {
    redis_cluster c;
    // The client's slot of a key is the server's (CRC16 of the hash tag), tags of every shape.
    const std::vector<std::string> keys{
        "",         "a",     "somekey",           "{orders#3}:due",
        "foo{}bar", "{}{x}", "a{b}c{d}",          "{{x}}",
        "{x",       "x}",    "dq:v2:{q}:data:17", std::string("bin\0\xff{t}", 8)};
    for (const auto& key : keys)
        CHECK(slot_of(key) == c.node(0).command({"CLUSTER", "KEYSLOT", key})->integer);

    auto o = cluster_options(c, "orders");
    sharded_delay_queue q(o, 12);
    CHECK(q.shards() == 12);
    std::set<int> owners;
    for (int i = 0; i < 12; ++i)
        owners.insert(c.master_of_key("{orders#" + std::to_string(i) + "}"));
    CHECK(owners.size() == 3);  // 12 hash tags land on all three masters

    // Put, cancel and reschedule by id reach the id's shard from any object.
    sharded_delay_queue other(o, 12);
    REQUIRE(q.put_after("a", "1", 1h));
    CHECK_FALSE(other.put_after("a", "again", 0ms));
    CHECK(other.reschedule("a", 0ms));
    REQUIRE(q.put_after("b", "2", 1h));
    CHECK(other.cancel("b"));
    auto j = other.take(2s);
    REQUIRE(j);
    CHECK(j->id == "a");
    CHECK(j->payload == "1");
    CHECK(other.ack(*j));

    const auto r = delayq_test::run_flow(q, {});
    check(r, during::nothing);
    CHECK(q.size() == 0);
    CHECK(other.size() == 0);
}

TEST_CASE(
    "a sharded queue with max_leased on a cluster: shards on every master keep their shares, the "
    "total never beyond the limit, and stats sums them") {
    redis_cluster c;
    auto o = cluster_options(c, "limited");
    o.limits.max_leased = 7;  // 6 shards: shares 2, 1, 1, 1, 1, 1
    sharded_delay_queue a(o, 6), b(o, 6);
    std::set<int> owners;
    for (int i = 0; i < 6; ++i)
        owners.insert(c.master_of_key("{limited#" + std::to_string(i) + "}"));
    CHECK(owners.size() >= 2);  // the shares live on different masters
    for (int i = 0; i < 60; ++i) REQUIRE(a.put_after("j" + std::to_string(i), "", 0ms));
    std::vector<delayq::redis::job> held;
    for (bool more = true; more;) {
        more = false;
        for (auto* q : {&a, &b}) {
            auto got = q->take_many(10, 0ms);
            more = more || !got.empty();
            held.insert(held.end(), got.begin(), got.end());
        }
    }
    CHECK(held.size() == 7);
    auto s = b.stats();
    CHECK(s.leased == 7);
    CHECK(s.waiting == 53);
    CHECK(s.due_now == 53);
    CHECK(s.dead == 0);
    // An ack frees one place: a take waiting for it on the other object gets a job of that shard.
    const auto shard = delayq::redis::detail::fnv1a(held.front().id) % 6;
    std::optional<delayq::redis::job> next;
    std::thread taker([&] { next = b.take(60s); });
    std::this_thread::sleep_for(200ms);
    CHECK(a.ack(held.front()));
    taker.join();
    REQUIRE(next);
    CHECK(delayq::redis::detail::fnv1a(next->id) % 6 == shard);
    held.front() = *next;
    CHECK_FALSE(a.take(0ms));
    for (const auto& j : held) CHECK(a.ack(j));
    s = a.stats();
    CHECK(s.leased == 0);
    CHECK(s.waiting == 52);
}

TEST_CASE("a series on a sharded queue on a cluster: each next run on its shard's master",
          "[repeat]") {
    redis_cluster c;
    auto o = cluster_options(c, "series");
    sharded_delay_queue q(o, 6), other(o, 6);
    std::vector<std::string> ids;
    for (int i = 0; i < 12; ++i) ids.push_back("s" + std::to_string(i));
    for (const auto& id : ids) REQUIRE(q.put_every(id, "p", 100ms));
    const auto events_of = [](const std::string& id) {
        return "dq:v3:{series#" + std::to_string(delayq::redis::detail::fnv1a(id) % 6) + "}:events";
    };
    // Two runs of each series, acked by either object: every next run is on its shard's master.
    std::map<std::string, int> acked;
    const auto done = [&] {
        if (acked.size() < ids.size()) return false;
        for (const auto& a : acked)
            if (a.second < 2) return false;
        return true;
    };
    for (int turn = 0; !done(); ++turn) {
        REQUIRE(turn < 200);
        sharded_delay_queue& taker = turn % 2 == 0 ? q : other;
        sharded_delay_queue& acker = turn % 2 == 0 ? other : q;
        auto run = taker.take(10s);
        REQUIRE(run);
        REQUIRE(acker.ack(*run));
        ++acked[run->id];
        const std::string key = events_of(run->id);
        CHECK(c.at_port(c.master_of_key(key)).text({"ZSCORE", key, run->id}) != "");
    }
    CHECK(q.size() == ids.size());
    for (const auto& id : ids) CHECK(other.cancel(id));
    CHECK(q.size() == 0);
}
