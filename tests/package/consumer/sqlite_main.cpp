// A user of delayq::sqlite: a job put, taken and acked in a file of the working directory.
#include <cstdio>
#include <delayq/sqlite/delay_queue.hpp>

int main() {
    std::remove("package.queue");
    delayq::sqlite::options o;
    o.path = "package.queue";
    delayq::sqlite::delay_queue q(o);
    if (!q.put_after("a", "payload", std::chrono::milliseconds(1))) return 1;
    auto j = q.take(std::chrono::seconds(10));
    return j && j->payload == "payload" && q.ack(*j) && q.size() == 0 ? 0 : 1;
}
