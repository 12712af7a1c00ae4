// End-to-end figures of delayq::redis::delay_queue against a local redis-server that this program
// starts itself (no persistence, like a cache-style deployment; `--port P` uses a running server).
//
//   bench_redis [--jobs N] [--batch-jobs N] [--paced-seconds S] [--idle-seconds S] [--port P]
//               [--only put|e2e|paced|idle|memory]
//
// 1. put-only rate: 4 producers, one shared queue object, delays far in the future;
// 2. end to end: 4 producers put N jobs due uniformly in [0, 2 s], 4 consumers take and ack them;
// 3. lateness (take returned - deadline) when producers are paced at 2 000 jobs/s in total;
// 4. commands per second sent by one idle consumer (INFO commandstats);
// 5. bytes of Redis memory per pending job (INFO memory, 100 000 pending jobs, 10-byte ids,
//    16-byte payloads).
// Lateness uses the system clock of this machine, which the local server shares.
#include <delayq/redis/delay_queue.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "redis_server.hpp"

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using sys = std::chrono::system_clock;

namespace {

struct config {
    int jobs = 40'000;         // for the single-call runs
    int batch_jobs = 200'000;  // for the batched runs: long enough that the 2 s delay window does not dominate
    int paced_seconds = 10;
    int idle_seconds = 20;
    int port = 0;
    std::string only;  // put, e2e, paced, idle or memory: run just that part
};

std::string id_of(int run, int i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%d:%07d", run, i);
    return buf;
}

const std::string payload16 = "0123456789abcdef";

using delayq_test::queue_options;

double seconds(clk::duration d) { return std::chrono::duration<double>(d).count(); }

long long info_number(const delayq_test::redis_server& srv, const std::string& section, const std::string& field) {
    const auto v = srv.info_field(section, field);
    return v.empty() ? 0 : std::stoll(v);
}

// 4 producer threads sharing one queue object; `batch` > 1 uses put_many with that many jobs a call.
void put_only(int port, int jobs, int batch) {
    delayq::redis::delay_queue q(queue_options(port, "bench-put-" + std::to_string(batch)));
    const int per = jobs / 4;
    const auto start = clk::now();
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            std::vector<std::string> ids;
            std::vector<delayq::redis::delay_queue::put_request> reqs;
            for (int i = 0; i < per; ++i) {
                if (batch <= 1) {
                    q.put_after(id_of(p, i), payload16, 1h);
                    continue;
                }
                ids.push_back(id_of(p, i));
                if (static_cast<int>(ids.size()) == batch || i + 1 == per) {
                    reqs.clear();
                    for (const auto& id : ids) reqs.push_back({id, payload16, 1h});
                    q.put_many(reqs);
                    ids.clear();
                }
            }
        });
    for (auto& t : ts) t.join();
    const double s = seconds(clk::now() - start);
    std::printf("put-only (%s): %d puts in %.2f s = %.0f puts/s (4 producers)\n",
                batch <= 1 ? "put_after" : ("put_many of " + std::to_string(batch)).c_str(), 4 * per, s, 4 * per / s);
}

struct lateness {
    std::mutex m;
    std::vector<double> ms;
    void add(sys::time_point deadline) {
        const double late = std::chrono::duration<double, std::milli>(sys::now() - deadline).count();
        std::lock_guard lk(m);
        ms.push_back(late);
    }
    void report(const char* what) {
        std::sort(ms.begin(), ms.end());
        auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(q * static_cast<double>(ms.size())))]; };
        std::printf("%s lateness over %zu jobs: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", what, ms.size(), at(0.5), at(0.99), ms.back());
    }
};

// Producers put `jobs` jobs due in [0, 2 s]; when `rate` > 0 they are paced to `rate` jobs/s in all.
// Consumers take and ack until every job is acked.
// `batch` > 1: producers use put_many and consumers take_many/ack_many, `batch` jobs a call.
void end_to_end(int port, int jobs, double rate, int batch, const char* name) {
    delayq::redis::delay_queue q(queue_options(port, name));
    std::atomic<int> acked{0};
    lateness late;
    const int per = jobs / 4;
    const int total = per * 4;
    const auto start = clk::now();
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            std::mt19937 rng(static_cast<unsigned>(p + 1));
            std::uniform_int_distribution<int> delay(0, 2000);
            std::vector<std::string> ids;
            std::vector<delayq::redis::delay_queue::put_request> reqs;
            for (int i = 0; i < per; ++i) {
                if (rate > 0) std::this_thread::sleep_until(start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(i * 4.0 / rate)));
                if (batch <= 1) {
                    q.put_after(id_of(p, i), payload16, std::chrono::milliseconds(delay(rng)));
                    continue;
                }
                ids.push_back(id_of(p, i));
                if (static_cast<int>(ids.size()) == batch || i + 1 == per) {
                    reqs.clear();
                    for (const auto& id : ids) reqs.push_back({id, payload16, std::chrono::milliseconds(delay(rng))});
                    q.put_many(reqs);
                    ids.clear();
                }
            }
        });
    for (int c = 0; c < 4; ++c)
        ts.emplace_back([&] {
            while (acked.load(std::memory_order_relaxed) < total) {
                if (batch <= 1) {
                    auto j = q.take(200ms);
                    if (!j) continue;
                    late.add(j->deadline);
                    if (q.ack(*j)) acked.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                auto js = q.take_many(static_cast<std::size_t>(batch), 200ms);
                for (const auto& j : js) late.add(j.deadline);
                for (bool ok : q.ack_many(js)) acked.fetch_add(ok ? 1 : 0, std::memory_order_relaxed);
            }
        });
    for (auto& t : ts) t.join();
    const double s = seconds(clk::now() - start);
    const std::string how = batch <= 1 ? "single calls" : "batches of " + std::to_string(batch);
    if (rate > 0) {
        std::printf("paced (%s): %d jobs at %.0f jobs/s over %.2f s\n", how.c_str(), total, rate, s);
        late.report("paced:        ");
    } else {
        std::printf("end to end (%s): %d jobs (put -> take -> ack, delays U[0, 2 s]) in %.2f s = %.0f jobs/s (4 producers, 4 consumers)\n",
                    how.c_str(), total, s, total / s);
        late.report("end to end:   ");
    }
}

// One consumer blocked in take(1 h) on an empty queue; counts the commands it sends (commandstats
// also counts the commands its scripts run inside the server: those are left out).
void idle(const delayq_test::redis_server& srv, int seconds_) {
    delayq::redis::delay_queue q(queue_options(srv.port(), "bench-idle"));
    (void)q.take(0ms);  // connect and load the scripts first
    std::atomic<bool> stop{false};
    std::thread consumer([&] {
        while (!stop.load())
            if (auto j = q.take(1h)) q.ack(*j);
    });
    std::this_thread::sleep_for(100ms);
    srv.command({"CONFIG", "RESETSTAT"});
    const auto start = clk::now();
    std::this_thread::sleep_for(std::chrono::seconds(seconds_));
    const std::string stats = srv.text({"INFO", "commandstats"});
    const double s = seconds(clk::now() - start);
    stop = true;
    delayq::redis::delay_queue(queue_options(srv.port(), "bench-idle")).put_after("stop", "", 0ms);
    consumer.join();
    long long calls = 0;
    for (const char* cmd : {"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_subscribe:", "cmdstat_script|load:",
                            "cmdstat_cluster|slots:"}) {
        const auto at = stats.find(cmd);
        if (at != std::string::npos) calls += std::stoll(stats.substr(stats.find("calls=", at) + 6));
    }
    if (std::getenv("BENCH_VERBOSE")) std::printf("%s\n", stats.c_str());
    std::printf("idle consumer: %lld commands in %.1f s = %.2f commands/s (max_block 5 s)\n", calls, s, calls / s);
}

void memory(const delayq_test::redis_server& srv, int n) {
    delayq::redis::delay_queue q(queue_options(srv.port(), "bench-mem"));
    (void)q.size();
    const long long before = info_number(srv, "memory", "used_memory:");
    const int per = n / 4;
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            for (int i = 0; i < per; ++i) {
                char id[16];
                std::snprintf(id, sizeof id, "j%d%08d", p, i);  // 10 bytes
                q.put_after(id, payload16, 1h);
            }
        });
    for (auto& t : ts) t.join();
    const long long after = info_number(srv, "memory", "used_memory:");
    std::printf("memory:        %.0f bytes per pending job (%d jobs, 10-byte id, 16-byte payload)\n",
                static_cast<double>(after - before) / (per * 4), per * 4);
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const int v = std::atoi(argv[i + 1]);
        if (a == "--only") {
            cfg.only = argv[i + 1];
            continue;
        }
        if (a == "--jobs") cfg.jobs = v;
        else if (a == "--batch-jobs") cfg.batch_jobs = v;
        else if (a == "--paced-seconds") cfg.paced_seconds = v;
        else if (a == "--idle-seconds") cfg.idle_seconds = v;
        else if (a == "--port") cfg.port = v;
        else {
            std::fprintf(stderr, "usage: %s [--jobs N] [--batch-jobs N] [--paced-seconds S] [--idle-seconds S] [--port P] [--only put|e2e|paced|idle|memory]\n", argv[0]);
            return 2;
        }
    }
    std::unique_ptr<delayq_test::redis_server> own;
    if (cfg.port == 0) {
        own = std::make_unique<delayq_test::redis_server>(std::vector<std::string>{"--appendonly", "no"});
        cfg.port = own->port();
    }
    std::printf("redis-server on 127.0.0.1:%d; %u hardware threads\n", cfg.port, std::thread::hardware_concurrency());
    const auto want = [&](const char* part) { return cfg.only.empty() || cfg.only == part; };
    if (want("put")) {
        put_only(cfg.port, cfg.jobs, 1);
        put_only(cfg.port, cfg.batch_jobs, 100);
    }
    if (want("e2e")) {
        end_to_end(cfg.port, cfg.jobs, 0, 1, "bench-e2e-1");
        end_to_end(cfg.port, cfg.batch_jobs, 0, 100, "bench-e2e-100");
    }
    if (want("paced")) end_to_end(cfg.port, 2000 * cfg.paced_seconds, 2000, 1, "bench-paced");
    if (!own) {
        std::printf("(idle and memory figures need the program's own server: run without --port)\n");
        return 0;
    }
    if (want("idle")) {
        own->command({"FLUSHALL"});
        idle(*own, cfg.idle_seconds);
    }
    if (want("memory")) {
        own->command({"FLUSHALL"});
        memory(*own, 100'000);
    }
}
