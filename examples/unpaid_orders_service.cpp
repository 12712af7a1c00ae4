// A service that cancels the orders left unpaid when their payment window ends: a delayq::worker
// over a delayq::sqlite::delay_queue file that the shop's processes put the orders in. It runs
// until SIGTERM or SIGINT, then stops taking, lets the running handlers finish, and exits 0;
// an order whose handler a kill cut short comes back to the next run when its lease ends.
//   example_unpaid_orders_service --file PATH            # the service
//   example_unpaid_orders_service --file PATH --put N    # the shop: N orders, due in 500 ms
// unpaid_orders_service.sh runs both and stops the service (ctest).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <delayq/sqlite/delay_queue.hpp>
#include <delayq/worker.hpp>
#include <string>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    std::string file, put;
    for (int i = 1; i + 1 < argc; i += 2)
        (std::string(argv[i]) == "--file" ? file : put) = argv[i + 1];
    delayq::sqlite::delay_queue orders({.path = file});
    if (!put.empty()) {  // the shop: the payload says whether the order was paid meanwhile
        for (int n = 1; n <= std::stoi(put); ++n)
            orders.put_after("order-" + std::to_string(n), n % 3 == 0 ? "paid" : "unpaid", 500ms);
        return 0;
    }
    // Blocked in every thread (the worker's threads start with this mask), taken by sigwait below.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    delayq::worker_options o{.threads = 4};
    o.hooks.retrying = [](const delayq::job& j, auto delay, std::string_view why) {
        std::printf("%s failed (%.*s), again in %lld ms\n", j.id.c_str(), int(why.size()),
                    why.data(), static_cast<long long>(delay.count()));
    };
    delayq::worker service(
        orders,
        [](const delayq::job& j) {  // returns: done; throws: retried later (the retry policy)
            std::printf(
                "%s %s\n", j.id.c_str(),
                j.payload == "paid" ? "was paid: kept" : "unpaid at its deadline: cancelled");
            std::fflush(stdout);
        },
        o);
    std::printf("running\n");
    std::fflush(stdout);
    int signal = 0;
    sigwait(&stop_signals, &signal);
    service.stop();  // no new takes; running handlers finish (30 s at most, then asked to stop)
    const auto c = service.counters();
    std::printf("stopped by signal %d: %llu orders done, %zu queued\n", signal,
                static_cast<unsigned long long>(c.done), orders.size());
}
