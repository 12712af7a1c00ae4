// End-to-end figures of delayq::redis against a local redis-server that this program starts
// itself (no persistence, like a cache-style deployment; `--port P` uses a running server), and
// BullMQ's beside them when it is installed.
//
//   bench_redis [--jobs N] [--batch-jobs N] [--paced-seconds S] [--idle-seconds S] [--repeat R]
//               [--port P] [--only put|e2e|paced|idle|memory|sharded|bullmq]
//
// 1. put-only rate: 4 producers, one shared queue object, delays far in the future;
// 2. end to end: 4 producers put N jobs due U[0, 2 s], 4 consumers run the plain loop
//    `while (auto j = q.take(..)) q.ack(*j);` until every job is acked; single calls, then
//    put_many/take_many/ack_many of 100; each R times (median shown);
// 3. BullMQ doing 2. with single calls (bullmq/bench.mjs): 4 producers awaiting each add, 4
//    workers of concurrency 1; skipped with a message without `node` or `npm install` in bullmq/;
// 4. lateness (take returned - due time) with producers paced at 2 000 jobs/s in all and two of
//    the four consumers busy 5 ms with every job they take (an idle consumer must get the job);
// 5. commands per second sent by one idle consumer (INFO commandstats);
// 6. bytes of Redis memory per waiting job (INFO memory, 100 000 jobs, 10-byte ids, 16-byte
//    payloads);
// 7. the sharded queue (8 shards) end to end on this one server and on a local Redis Cluster of 3
//    masters + 3 replicas that this program starts (needs ports whose port + 10000 is free).
// Lateness uses the system clock of this machine, which the local servers share.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <delayq/redis/delay_queue.hpp>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "redis_cluster.hpp"
#include "redis_server.hpp"

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using sys = std::chrono::system_clock;

namespace {

struct config {
    int jobs = 100'000;        // for the single-call runs: the 2 s delay window is a small part
    int batch_jobs = 200'000;  // for the batched runs
    int paced_seconds = 10;
    int idle_seconds = 20;
    int repeat = 3;
    int port = 0;
    std::string only;
};

std::string id_of(int run, int i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%d:%07d", run, i);
    return buf;
}

const std::string payload16 = "0123456789abcdef";

using delayq_test::queue_options;

double seconds(clk::duration d) {
    return std::chrono::duration<double>(d).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

std::string list(const std::vector<double>& v) {
    std::string s;
    for (double x : v) s += (s.empty() ? "" : ", ") + std::to_string(static_cast<long>(x));
    return s;
}

long long info_number(const delayq_test::redis_server& srv, const std::string& section,
                      const std::string& field) {
    const auto v = srv.info_field(section, field);
    return v.empty() ? 0 : std::stoll(v);
}

// 4 producer threads sharing one queue object; `batch` > 1 uses put_many with that many jobs a
// call.
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
                batch <= 1 ? "put_after" : ("put_many of " + std::to_string(batch)).c_str(),
                4 * per, s, 4 * per / s);
}

struct lateness {
    std::mutex m;
    std::vector<double> ms;
    void add(sys::time_point deadline) {
        const double late =
            std::chrono::duration<double, std::milli>(sys::now() - deadline).count();
        std::lock_guard lk(m);
        ms.push_back(late);
    }
    std::string report() {
        std::sort(ms.begin(), ms.end());
        auto at = [&](double q) {
            return ms[std::min(ms.size() - 1,
                               static_cast<std::size_t>(q * static_cast<double>(ms.size())))];
        };
        char buf[128];
        std::snprintf(buf, sizeof buf, "lateness p50 %.2f ms, p99 %.2f ms, max %.2f ms", at(0.5),
                      at(0.99), ms.back());
        return buf;
    }
};

struct run_shape {
    int jobs = 0;
    double rate = 0;         // > 0: producers paced to this many jobs/s in all
    int batch = 1;           // > 1: put_many / take_many / ack_many of this many
    int busy_consumers = 0;  // that many consumers work 5 ms on every job they take
};

// Producers put the jobs due U[0, 2 s]; consumers take and ack until every job is acked.
// Returns jobs/s; `late` gets every job's lateness.
template <class Queue>
double end_to_end(Queue& q, const run_shape& shape, lateness& late) {
    std::atomic<int> acked{0};
    const int per = shape.jobs / 4;
    const int total = per * 4;
    static std::atomic<int> run{0};
    const int r = ++run;
    const auto start = clk::now();
    std::vector<std::thread> ts;
    for (int p = 0; p < 4; ++p)
        ts.emplace_back([&, p] {
            std::mt19937 rng(static_cast<unsigned>(p + 1));
            std::uniform_int_distribution<int> delay(0, 2000);
            std::vector<std::string> ids;
            std::vector<typename Queue::put_request> reqs;
            for (int i = 0; i < per; ++i) {
                if (shape.rate > 0)
                    std::this_thread::sleep_until(
                        start + std::chrono::duration_cast<clk::duration>(
                                    std::chrono::duration<double>(i * 4.0 / shape.rate)));
                const std::string id = id_of(r * 10 + p, i);
                if (shape.batch <= 1) {
                    q.put_after(id, payload16, std::chrono::milliseconds(delay(rng)));
                    continue;
                }
                ids.push_back(id);
                if (static_cast<int>(ids.size()) == shape.batch || i + 1 == per) {
                    reqs.clear();
                    for (const auto& x : ids)
                        reqs.push_back({x, payload16, std::chrono::milliseconds(delay(rng))});
                    q.put_many(reqs);
                    ids.clear();
                }
            }
        });
    for (int c = 0; c < 4; ++c)
        ts.emplace_back([&, c] {
            const bool busy = c < shape.busy_consumers;
            while (acked.load(std::memory_order_relaxed) < total) {
                if (shape.batch <= 1) {
                    auto j = q.take(200ms);  // the plain loop: take, work, ack
                    if (!j) continue;
                    late.add(j->deadline);
                    if (busy) std::this_thread::sleep_for(5ms);
                    if (q.ack(*j)) acked.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                auto js = q.take_many(static_cast<std::size_t>(shape.batch), 200ms);
                for (const auto& j : js) late.add(j.deadline);
                for (bool ok : q.ack_many(js))
                    acked.fetch_add(ok ? 1 : 0, std::memory_order_relaxed);
            }
        });
    for (auto& t : ts) t.join();
    return total / seconds(clk::now() - start);
}

// end_to_end `repeat` times, each on a fresh queue; prints every rate and the median.
template <class Make>
double repeated(const config& cfg, const run_shape& shape, const std::string& what, Make make) {
    std::vector<double> rates;
    std::string last;
    for (int i = 0; i < cfg.repeat; ++i) {
        auto q = make(i);
        lateness late;
        rates.push_back(end_to_end(*q, shape, late));
        last = late.report();
    }
    std::printf("%s: %d jobs, median %.0f jobs/s (runs: %s); last run's %s\n", what.c_str(),
                shape.jobs, median(rates), list(rates).c_str(), last.c_str());
    return median(rates);
}

// The BullMQ baseline (bullmq/bench.mjs), when node and the npm package are there.
void bullmq(int port, int jobs, int repeat) {
    const std::string dir = DELAYQ_BULLMQ_DIR;
    if (std::system("command -v node >/dev/null 2>&1") != 0) {
        std::printf("bullmq: skipped (no `node` on PATH)\n");
        return;
    }
    if (::access((dir + "/node_modules/bullmq/package.json").c_str(), R_OK) != 0) {
        std::printf("bullmq: skipped (not installed: run `npm install` in %s)\n", dir.c_str());
        return;
    }
    std::vector<double> rates;
    for (int i = 0; i < repeat; ++i) {
        const std::string cmd = "node " + dir + "/bench.mjs --port " + std::to_string(port) +
                                " --jobs " + std::to_string(jobs);
        std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
        std::string out;
        char buf[512];
        while (p && std::fgets(buf, sizeof buf, p.get()) != nullptr) out += buf;
        const auto eq = out.find(" = ");
        if (eq == std::string::npos) {
            std::printf("bullmq: failed: %s\n", out.c_str());
            return;
        }
        rates.push_back(std::atof(out.c_str() + eq + 3));
        if (i + 1 == repeat)
            std::printf("bullmq end to end (single calls, %s",
                        out.substr(0, out.find(':')).c_str());
    }
    std::printf("): %d jobs, median %.0f jobs/s (runs: %s)\n", jobs, median(rates),
                list(rates).c_str());
}

// One consumer waiting in take(1 h) on an empty queue; counts the commands it sends
// (commandstats also counts the commands its scripts run inside the server: those are left out).
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
    for (const char* cmd : {"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_subscribe:",
                            "cmdstat_script|load:", "cmdstat_cluster|slots:"}) {
        const auto at = stats.find(cmd);
        if (at != std::string::npos)
            calls += std::stoll(stats.substr(stats.find("calls=", at) + 6));
    }
    if (std::getenv("BENCH_VERBOSE")) std::printf("%s\n", stats.c_str());
    std::printf("idle consumer: %lld commands in %.1f s = %.2f commands/s (max_block 5 s)\n", calls,
                s, calls / s);
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
    std::printf("memory: %.0f bytes per waiting job (%d jobs, 10-byte id, 16-byte payload)\n",
                static_cast<double>(after - before) / (per * 4), per * 4);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF,
                 0);  // progress shows as it comes, in a pipe or a file too
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const int v = std::atoi(argv[i + 1]);
        if (a == "--only")
            cfg.only = argv[i + 1];
        else if (a == "--jobs")
            cfg.jobs = v;
        else if (a == "--batch-jobs")
            cfg.batch_jobs = v;
        else if (a == "--paced-seconds")
            cfg.paced_seconds = v;
        else if (a == "--idle-seconds")
            cfg.idle_seconds = v;
        else if (a == "--repeat")
            cfg.repeat = std::max(1, v);
        else if (a == "--port")
            cfg.port = v;
        else {
            std::fprintf(stderr,
                         "usage: %s [--jobs N] [--batch-jobs N] [--paced-seconds S] "
                         "[--idle-seconds S] [--repeat R] "
                         "[--port P] [--only put|e2e|paced|idle|memory|sharded|bullmq]\n",
                         argv[0]);
            return 2;
        }
    }
    std::unique_ptr<delayq_test::redis_server> own;
    if (cfg.port == 0) {
        own = std::make_unique<delayq_test::redis_server>(
            std::vector<std::string>{"--appendonly", "no"});
        cfg.port = own->port();
    }
    std::printf("redis-server on 127.0.0.1:%d; %u hardware threads\n", cfg.port,
                std::thread::hardware_concurrency());
    const auto want = [&](const char* part) { return cfg.only.empty() || cfg.only == part; };
    const auto single = [&](const std::string& name) {
        return [&cfg, name](int i) {
            return std::make_unique<delayq::redis::delay_queue>(
                queue_options(cfg.port, name + std::to_string(i)));
        };
    };
    if (want("put")) {
        put_only(cfg.port, cfg.jobs, 1);
        put_only(cfg.port, cfg.batch_jobs, 100);
    }
    if (want("e2e")) {
        repeated(cfg, {cfg.jobs, 0, 1, 0}, "end to end (single calls: put_after, take, ack)",
                 single("bench-e2e-1-"));
        repeated(cfg, {cfg.batch_jobs, 0, 100, 0}, "end to end (batches of 100)",
                 single("bench-e2e-100-"));
    }
    if (want("bullmq") || want("e2e")) bullmq(cfg.port, cfg.jobs, cfg.repeat);
    if (want("paced")) {
        lateness late;
        delayq::redis::delay_queue q(queue_options(cfg.port, "bench-paced"));
        end_to_end(q, {2000 * cfg.paced_seconds, 2000, 1, 2}, late);
        std::printf("paced at 2000 jobs/s for %d s, 2 of 4 consumers busy 5 ms per job: %s\n",
                    cfg.paced_seconds, late.report().c_str());
    }
    if (want("sharded")) {
        const auto sharded = [](int port, std::string name) {
            return [port, name](int i) {
                return std::make_unique<delayq::redis::sharded_delay_queue>(
                    queue_options(port, name + std::to_string(i)), 8);
            };
        };
        const double one = repeated(cfg, {cfg.jobs, 0, 1, 0}, "sharded (8 shards), one node",
                                    sharded(cfg.port, "bench-sh-"));
        delayq_test::redis_cluster cluster({"--appendonly", "no"});
        const double three =
            repeated(cfg, {cfg.jobs, 0, 1, 0}, "sharded (8 shards), 3-master cluster",
                     sharded(cluster.masters().front(), "bench-shc-"));
        std::printf("sharded: cluster / one node = %.2f\n", three / one);
    }
    if (!own) {
        std::printf(
            "(idle and memory figures need the program's own server: run without --port)\n");
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
