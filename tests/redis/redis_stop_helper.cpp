// A consumer that takes one job, acks it, and then stops itself (SIGSTOP): a consumer process that
// never calls anything again, not even from a thread of its own. The test sees it stopped with
// waitpid(WUNTRACED); exit status 1: no job.
// usage: delayq_redis_stop_helper PORT QUEUE LEASE_MS MAX_ATTEMPTS
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s PORT QUEUE LEASE_MS MAX_ATTEMPTS\n", argv[0]);
        return 2;
    }
    delayq::redis::options o;
    o.port = std::atoi(argv[1]);
    o.name = argv[2];
    o.lease = std::chrono::milliseconds(std::atoll(argv[3]));
    o.max_attempts = static_cast<unsigned>(std::atoi(argv[4]));
    delayq::redis::delay_queue q(o);
    auto j = q.take(std::chrono::seconds(30));
    if (!j || !q.ack(*j)) return 1;
    ::raise(SIGSTOP);
    return 0;
}
