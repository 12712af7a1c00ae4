// Built against delayq-redis.pc: the Redis header compiles and links with what the .pc names.
// It connects to no server unless given one (host and port), so the package test can run it.
#include <delayq/redis/delay_queue.hpp>
#include <string>

int main(int argc, char** argv) {
    if (argc < 3) return 0;
    delayq::redis::options o;
    o.host = argv[1];
    o.port = std::stoi(argv[2]);
    o.name = "package-test";
    delayq::redis::delay_queue q(o);
    return q.size() == 0 ? 0 : 1;
}
