// Runs the reminders that example_redis_producer queued, each once it is due; exits after 10 s
// without work. Start several: each reminder goes to exactly one of them, and if one is killed
// mid-job, its job goes to another when its 30 s lease ends.
//   example_redis_consumer [HOST [PORT]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    delayq::redis::options o;
    o.name = "reminders";
    if (argc > 1) o.host = argv[1];
    if (argc > 2) o.port = std::atoi(argv[2]);
    try {
        delayq::redis::delay_queue q(o);
        while (auto job = q.take(10s)) {  // waits without polling; nullopt after 10 s idle
            const auto late = std::chrono::system_clock::now() - job->deadline;
            std::printf("%s: %s (attempt %u, %lld ms after its due time)\n", job->id.c_str(),
                        job->payload.c_str(), job->attempts,
                        static_cast<long long>(
                            std::chrono::duration_cast<std::chrono::milliseconds>(late).count()));
            if (!q.ack(*job)) std::printf("  lease lost: someone else has it now\n");
        }
        std::printf("no work for 10 s, leaving\n");
    } catch (const delayq::redis::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
