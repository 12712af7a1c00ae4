// Queues reminders on a Redis delay queue; another process (example_redis_consumer) runs them.
//   example_redis_producer [HOST [PORT [COUNT [SPACING_MS]]]]
// COUNT reminders (default 5), the i-th due i * SPACING_MS from now (default 1000 ms).
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
    const int count = argc > 3 ? std::atoi(argv[3]) : 5;
    const std::chrono::milliseconds spacing(argc > 4 ? std::atoi(argv[4]) : 1000);
    try {
        delayq::redis::delay_queue q(o);
        for (int i = 1; i <= count; ++i) {
            const std::string id = "reminder-" + std::to_string(i);
            // The id makes the put idempotent: running the producer twice queues each reminder
            // once.
            const bool queued =
                q.put_after(id, "call back customer #" + std::to_string(i), i * spacing);
            std::printf("%s %s, due in %lld ms\n", id.c_str(),
                        queued ? "queued" : "was already queued",
                        static_cast<long long>((i * spacing).count()));
        }
    } catch (const delayq::redis::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
