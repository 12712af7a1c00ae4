// delayq::redis on a Redis Cluster of 3 masters and 3 replicas that each test starts: a failover
// and a reshard of the queue's slot while producers and consumers run, and the sharded queue
// spread over the masters. Every job is counted in and out.
#include <chrono>
#include <cstdint>
#include <delayq/redis/delay_queue.hpp>
#include <functional>
#include <set>
#include <string>
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
    return f;
}

// What every run checks; `during` names what must also have gone on while the cluster changed.
enum class during { nothing, puts_with_jobs_pending, puts_and_acks };

void check(const delayq_test::flow_result& r, during d) {
    for (const auto& f : r.failures) FAIL_CHECK(f);
    CHECK(r.all_acked_once());
    if (d != during::nothing) {  // the change met live traffic and jobs that had to move
        CHECK(r.put_during_midway > 0);
        CHECK(r.pending_at_midway > 0);
    }
    if (d == during::puts_and_acks) CHECK(r.acked_during_midway > 0);
}

}  // namespace

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
    CHECK(c.at_port(new_master).keys("dq:v2:{failover}:d*").empty());
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
