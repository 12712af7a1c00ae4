// Runs the reminders that example_redis_producer queued, each once it is due; exits after IDLE_S
// seconds without work. Start several: each reminder goes to exactly one of them, and if one is
// killed mid-job, its job goes to another when its lease ends (kill_and_redeliver.sh shows it).
//   example_redis_consumer [HOST [PORT [LEASE_MS [WORK_MS [IDLE_S]]]]]
// LEASE_MS: how long a taken job stays invisible to the others (default 30 000); WORK_MS: how long
// each job's work takes before its ack (default 0); IDLE_S: default 10.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>
#include <thread>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    delayq::redis::options o;
    o.name = "reminders";
    if (argc > 1) o.host = argv[1];
    if (argc > 2) o.port = std::atoi(argv[2]);
    if (argc > 3) o.lease = std::chrono::milliseconds(std::atoi(argv[3]));
    const std::chrono::milliseconds work(argc > 4 ? std::atoi(argv[4]) : 0);
    const std::chrono::seconds idle(argc > 5 ? std::atoi(argv[5]) : 10);
    try {
        delayq::redis::delay_queue q(o);
        while (auto job = q.take(idle)) {  // waits without polling; nullopt after `idle`
            const auto late = std::chrono::system_clock::now() - job->deadline;
            std::printf("%s: %s (attempt %u, %lld ms after its due time)\n", job->id.c_str(),
                        job->payload.c_str(), job->attempts,
                        static_cast<long long>(
                            std::chrono::duration_cast<std::chrono::milliseconds>(late).count()));
            std::fflush(stdout);                // a script watching the output sees the job at once
            std::this_thread::sleep_for(work);  // the job's work (a killed consumer dies here)
            if (!q.ack(*job)) std::printf("  lease lost: someone else has it now\n");
        }
        std::printf("no work for %lld s, leaving\n", static_cast<long long>(idle.count()));
    } catch (const delayq::redis::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
