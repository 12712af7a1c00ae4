// Cancel unpaid orders after a timeout, with delay_queue: a checkout thread puts each order with
// its payment deadline; a reaper thread takes orders as their deadlines pass and cancels those
// still unpaid. (Real shops use 30 minutes; this demo uses milliseconds.)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <delayq/delayq.hpp>
#include <mutex>
#include <set>
#include <thread>

using namespace std::chrono_literals;

struct order {
    int id;
    std::chrono::steady_clock::time_point pay_by;
    auto deadline() const { return pay_by; }  // makes `order` Delayed
};

int main() {
    delayq::delay_queue<order> expiring;
    std::mutex m;
    std::set<int> paid;
    std::atomic<int> cancelled{0}, taken{0};

    std::jthread reaper([&] {
        while (auto o = expiring.take()) {  // blocks until the earliest deadline passes
            ++taken;
            std::lock_guard lk(m);
            if (!paid.count(o->id)) {
                ++cancelled;
                std::printf("order %2d unpaid at its deadline: cancelled\n", o->id);
            }
        }
    });

    for (int id = 1; id <= 10; ++id) {
        expiring.put(
            order{id, std::chrono::steady_clock::now() + std::chrono::milliseconds(20 * id)});
        if (id % 3 == 0) {
            std::lock_guard lk(m);
            paid.insert(id);  // every third customer pays in time
        }
    }
    std::this_thread::sleep_for(250ms);
    auto left = expiring.close();  // wakes the reaper; hands back what is still waiting
    reaper.join();
    std::printf("%d cancelled, %zu paid, %zu still waiting at shutdown\n", cancelled.load(),
                paid.size(), left.size());
    return taken.load() + static_cast<int>(left.size()) == 10 ? 0 : 1;  // nothing lost
}
