// Another process on a test's queue, for tests/postgres/test_postgres_queue.cpp:
//   pg_helper put CONNINFO SCHEMA NAME ID        open (creating the tables), put ID due now;
//                                                prints 1 or 0
//   pg_helper crash CONNINFO NAME MAX_ATTEMPTS   take one job (lease 300 ms; waiting up to 3 s),
//                                                print its id and attempts, and die at once
//                                                (_exit) without a word to the server: a job
//                                                that kills its consumer
//   pg_helper cancel CONNINFO NAME ID            cancel ID; prints 1 or 0
//   pg_helper pause CONNINFO NAME                pause the queue; prints paused() after it
//   pg_helper resume CONNINFO NAME               resume the queue; prints paused() after it
// Exit status 0, or 2 with the exception's text on stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <delayq/postgres/delay_queue.hpp>
#include <exception>
#include <string>

using namespace std::chrono_literals;

int main(int argc, char** argv) try {
    if (argc < 4) {
        std::fprintf(stderr, "usage: pg_helper put|crash|cancel|pause|resume CONNINFO ...\n");
        return 2;
    }
    const std::string mode = argv[1];
    delayq::postgres::options o;
    o.conninfo = argv[2];
    if (mode == "put" && argc == 6) {
        o.schema = argv[3];
        o.name = argv[4];
        delayq::postgres::delay_queue q(o);
        std::printf("%d\n", q.put_after(argv[5], "x", 0ms) ? 1 : 0);
        return 0;
    }
    o.name = argv[3];
    if (mode == "pause" || mode == "resume") {
        delayq::postgres::delay_queue q(o);
        if (mode == "pause")
            q.pause();
        else
            q.resume();
        std::printf("%d\n", q.paused() ? 1 : 0);
        return 0;
    }
    if (argc < 5) {
        std::fprintf(stderr, "pg_helper %s: too few arguments\n", mode.c_str());
        return 2;
    }
    if (mode == "crash") {
        o.lease = 300ms;
        o.max_attempts = static_cast<unsigned>(std::atoi(argv[4]));
        delayq::postgres::delay_queue q(o);
        if (auto j = q.take(3s)) {  // the lease before ends within 300 ms
            std::printf("%s %u\n", j->id.c_str(), j->attempts);
            std::fflush(stdout);
            ::_exit(3);  // the job killed us: no ack, no nack
        }
        return 0;
    }
    if (mode == "cancel") {
        delayq::postgres::delay_queue q(o);
        std::printf("%d\n", q.cancel(argv[4]) ? 1 : 0);
        return 0;
    }
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
} catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
}
