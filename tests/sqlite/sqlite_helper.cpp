// Another process on a queue file, for tests/sqlite/test_sqlite_queue.cpp. Prints one line: what
// happened, or the error class that the queue threw and its message.
//
//   delayq_sqlite_helper put PATH ID DELAY_MS   queue one job: "queued" or "refused"
//   delayq_sqlite_helper nobody PATH            open PATH as user nobody (uid 65534) and put
//   delayq_sqlite_helper fill PATH BYTES        with RLIMIT_FSIZE = BYTES, put 200-byte jobs until
//   a
//                                               put throws: "<error class> <puts returned true>"
//   delayq_sqlite_helper produce PATH PREFIX N  put PREFIX0 .. PREFIX<N-1>, due in 0..299 ms,
//                                               printing "put ID" once each put returned
//   delayq_sqlite_helper consume PATH LEASE_MS  take and ack forever: "acking ID" before each
//                                               ack, "acked ID" once it returned true, "early ID"
//                                               for a job handed out before its deadline
//   delayq_sqlite_helper pause PATH             pause the queue: "paused"
//   delayq_sqlite_helper resume PATH            resume it: "running"
//   delayq_sqlite_helper paused PATH            "paused" or "running"
//   delayq_sqlite_helper take PATH WAIT_MS      take one job waiting up to WAIT_MS and ack it:
//                                               "took ID ATTEMPTS", or "nothing"
// produce and consume are the processes that the crash test kills with SIGKILL mid-flow.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <delayq/sqlite/delay_queue.hpp>
#include <exception>
#include <string>

namespace {

// The name of the error class `e` is (the most derived of the family that it matches).
const char* class_of(const std::exception& e) {
    using namespace delayq::sqlite;
    if (dynamic_cast<const not_a_queue_error*>(&e)) return "not_a_queue_error";
    if (dynamic_cast<const newer_version_error*>(&e)) return "newer_version_error";
    if (dynamic_cast<const corrupt_error*>(&e)) return "corrupt_error";
    if (dynamic_cast<const disk_full_error*>(&e)) return "disk_full_error";
    if (dynamic_cast<const busy_error*>(&e)) return "busy_error";
    if (dynamic_cast<const read_only_error*>(&e)) return "read_only_error";
    if (dynamic_cast<const error*>(&e)) return "error";
    return "other";
}

delayq::sqlite::options opts(const char* path) {
    delayq::sqlite::options o;
    o.path = path;
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    long puts = 0;
    try {
        if (mode == "put" && argc == 5) {
            delayq::sqlite::delay_queue q(opts(argv[2]));
            const bool queued = q.put_after(argv[3], "from another process",
                                            std::chrono::milliseconds(std::atoll(argv[4])));
            std::printf("%s\n", queued ? "queued" : "refused");
            return 0;
        }
        if ((mode == "pause" || mode == "resume" || mode == "paused") && argc == 3) {
            delayq::sqlite::delay_queue q(opts(argv[2]));
            if (mode == "pause") q.pause();
            if (mode == "resume") q.resume();
            std::printf("%s\n", q.paused() ? "paused" : "running");
            return 0;
        }
        if (mode == "take" && argc == 4) {
            delayq::sqlite::delay_queue q(opts(argv[2]));
            auto j = q.take(std::chrono::milliseconds(std::atoll(argv[3])));
            if (!j) {
                std::printf("nothing\n");
                return 0;
            }
            std::printf("took %s %u\n", j->id.c_str(), j->attempts);
            q.ack(*j);
            return 0;
        }
        if (mode == "produce" && argc == 5) {
            delayq::sqlite::delay_queue q(opts(argv[2]));
            const long n = std::atol(argv[4]);
            for (long i = 0; i < n; ++i) {
                std::string id = argv[3];
                id += std::to_string(i);
                if (q.put_after(id, id, std::chrono::milliseconds(i * 7 % 300)))
                    std::printf("put %s\n", id.c_str());
                std::fflush(stdout);
            }
            return 0;
        }
        if (mode == "consume" && argc == 4) {
            auto o = opts(argv[2]);
            o.lease = std::chrono::milliseconds(std::atoll(argv[3]));
            delayq::sqlite::delay_queue q(o);
            for (;;) {
                auto j = q.take(std::chrono::seconds(1));
                if (!j) continue;
                if (std::chrono::system_clock::now() < j->deadline)
                    std::printf("early %s\n", j->id.c_str());
                std::printf("acking %s\n", j->id.c_str());
                std::fflush(stdout);
                if (q.ack(*j)) std::printf("acked %s\n", j->id.c_str());
                std::fflush(stdout);
            }
        }
        if (mode == "nobody" && argc == 3) {
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
                std::printf("cannot become nobody: %s\n", std::strerror(errno));
                return 3;
            }
            delayq::sqlite::delay_queue q(opts(argv[2]));
            q.put_after("as-nobody", "x", std::chrono::milliseconds(0));
            std::printf("opened and put\n");
            return 0;
        }
        if (mode == "fill" && argc == 4) {
            // Past the limit a write fails with EFBIG, after SIGXFSZ, whose default kills.
            std::signal(SIGXFSZ, SIG_IGN);
            const rlim_t bytes = std::strtoull(argv[3], nullptr, 10);
            const rlimit lim{bytes, bytes};
            if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
            delayq::sqlite::delay_queue q(opts(argv[2]));
            const std::string payload(200, 'x');
            for (;; ++puts) {
                std::string id = "f";
                id += std::to_string(puts);
                if (!q.put_after(id, payload, std::chrono::hours(1))) return 4;
            }
        }
    } catch (const std::exception& e) {
        std::printf("%s %ld %s\n", class_of(e), puts, e.what());
        return 1;
    }
    std::fprintf(stderr,
                 "usage: %s put PATH ID DELAY_MS | nobody PATH | fill PATH BYTES | produce PATH "
                 "PREFIX N | consume PATH LEASE_MS | pause PATH | resume PATH | paused PATH | "
                 "take PATH WAIT_MS\n",
                 argv[0]);
    return 2;
}
