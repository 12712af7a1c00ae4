// Queues reminders on a Redis delay queue; another process (example_redis_consumer) runs them.
//   example_redis_producer [HOST [PORT]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>
#include <string>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    delayq::redis::options o;
    o.name = "reminders";
    if (argc > 1) o.host = argv[1];
    if (argc > 2) o.port = std::atoi(argv[2]);
    try {
        delayq::redis::delay_queue q(o);
        for (int i = 1; i <= 5; ++i) {
            const std::string id = "reminder-" + std::to_string(i);
            // The id makes the put idempotent: running the producer twice queues each reminder
            // once.
            const bool queued = q.put_after(id, "call back customer #" + std::to_string(i), i * 1s);
            std::printf("%s %s, due in %d s\n", id.c_str(),
                        queued ? "queued" : "was already queued", i);
        }
    } catch (const delayq::redis::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
