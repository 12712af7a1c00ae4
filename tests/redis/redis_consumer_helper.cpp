// Takes one job, prints its id and then waits to be killed: the consumer that dies mid-lease.
// usage: delayq_redis_consumer_helper PORT QUEUE LEASE_MS
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s PORT QUEUE LEASE_MS\n", argv[0]);
        return 2;
    }
    delayq::redis::options o;
    o.port = std::atoi(argv[1]);
    o.name = argv[2];
    o.lease = std::chrono::milliseconds(std::atoll(argv[3]));
    delayq::redis::delay_queue q(o);
    auto j = q.take(std::chrono::seconds(30));
    if (!j) return 1;
    std::printf("%s\n", j->id.c_str());
    std::fflush(stdout);
    for (;;) ::pause();
}
