// Producers and consumers on one queue object, counting every job in and out: what the stress,
// failover and reshard tests share. Catch2's macros are not for other threads, so the threads
// collect what went wrong and the test checks it afterwards.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace delayq_test {

struct flow_options {
    int producers = 4, per_producer = 750, consumers = 4;
    std::chrono::milliseconds max_delay{300};   // each job due U[0, max_delay] after its put
    bool nacks = true;                          // about one delivery in ten is nacked first
    std::chrono::milliseconds put_interval{0};  // each producer's pause between puts
    std::chrono::seconds limit{60};             // consumers give up after this
    std::function<void()> midway;  // run by the calling thread once half the jobs are put
    // An outage longer than a lease (30 s by default) ends the leases it holds up, and their jobs
    // are delivered again. Then a refused ack or nack is what fencing owes its holder, not a
    // failure; it is counted in `lost`, and the job must still be acked exactly once by someone.
    // (While the queue had prefetch, a job handed out from the object's memory held only a short
    // hold until the object's word reached the server, so a failover could end it.)
    bool leases_may_be_lost = false;
};

struct flow_result {
    int total = 0;
    std::map<std::string, int> acked;  // id -> acks that returned true
    std::vector<std::string> failures;
    std::vector<std::string> lost;  // refused acks and nacks, with leases_may_be_lost
    int nacks = 0;
    int put_during_midway = 0, acked_during_midway = 0;  // the run went on while midway() ran
    int pending_at_midway = 0;  // put and not yet acked when midway() began
    bool all_acked_once() const {
        if (acked.size() != static_cast<std::size_t>(total)) return false;
        for (const auto& [id, n] : acked)
            if (n != 1) return false;
        return true;
    }
};

// The flow with `object(t)` the queue object that thread t uses (producers 0..producers-1, then
// the consumers).
template <class ObjectOf>
flow_result run_flow_with(ObjectOf object, const flow_options& f) {
    flow_result res;
    res.total = f.producers * f.per_producer;
    std::mutex m;
    std::atomic<int> done{0}, put{0}, nacks{0};
    const auto fail = [&](std::string what) {
        std::lock_guard lk(m);
        res.failures.push_back(std::move(what));
    };
    const auto refused = [&](const char* what, const std::string& id) {
        if (!f.leases_may_be_lost) return fail(std::string(what) + " refused: " + id);
        std::lock_guard lk(m);
        res.lost.push_back(std::string(what) + " " + id);
    };
    const auto deadline = std::chrono::steady_clock::now() + f.limit;
    std::vector<std::thread> ts;
    for (int p = 0; p < f.producers; ++p)
        ts.emplace_back([&, p] {
            auto& q = object(p);
            std::mt19937 rng(static_cast<unsigned>(p));
            std::uniform_int_distribution<long long> delay(0, f.max_delay.count());
            for (int i = 0; i < f.per_producer; ++i) {
                const std::string id = "p" + std::to_string(p) + "-" + std::to_string(i);
                try {
                    if (!q.put_after(id, std::to_string(p), std::chrono::milliseconds(delay(rng))))
                        fail("put refused: " + id);
                } catch (const std::exception& e) {
                    fail("put " + id + ": " + e.what());
                }
                ++put;
                if (f.put_interval.count() > 0) std::this_thread::sleep_for(f.put_interval);
            }
        });
    for (int c = 0; c < f.consumers; ++c)
        ts.emplace_back([&, c] {
            auto& q = object(f.producers + c);
            std::mt19937 rng(static_cast<unsigned>(100 + c));
            std::uniform_int_distribution<int> dice(0, 9);
            while (done.load() < res.total && std::chrono::steady_clock::now() < deadline) {
                try {
                    auto j = q.take(std::chrono::milliseconds(200));
                    if (!j) continue;
                    if (f.nacks && dice(rng) == 0) {
                        if (!q.nack(*j, std::chrono::milliseconds(dice(rng) * 5)))
                            refused("nack", j->id);
                        ++nacks;
                        continue;
                    }
                    if (!q.ack(*j)) {
                        refused("ack", j->id);
                        continue;
                    }
                    std::lock_guard lk(m);
                    if (++res.acked[j->id] == 1) ++done;
                } catch (const std::exception& e) {
                    fail(std::string("consumer: ") + e.what());
                }
            }
        });
    if (f.midway) {
        while (put.load() < res.total / 2)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const int put_before = put.load(), acked_before = done.load();
        res.pending_at_midway = put_before - acked_before;
        try {
            f.midway();
        } catch (const std::exception& e) {
            fail(std::string("midway: ") + e.what());
        }
        res.put_during_midway = put.load() - put_before;
        res.acked_during_midway = done.load() - acked_before;
    }
    for (auto& t : ts) t.join();
    res.nacks = nacks.load();
    return res;
}

// The flow with every thread on one queue object.
template <class Queue>
flow_result run_flow(Queue& q, const flow_options& f) {
    return run_flow_with([&q](int) -> Queue& { return q; }, f);
}

}  // namespace delayq_test
