// Cancel unpaid orders after 30 minutes, with the hierarchical timing wheel: placing an order
// schedules its cancellation, paying cancels that timeout. (unpaid_orders.cpp does the same with
// delay_queue, the heap; this is the wheel's version, where a payment removes the pending work at
// once instead of leaving an element to be skipped when it comes due.)
//
// Time here is a manual_clock, moved a minute at a time, so the 30 minutes take no time at all and
// the run is the same every time. The wheel is hierarchical_wheel, which has no thread of its own:
// the loop below drives it, as a shop's event loop or a test would. With hierarchical_timing_wheel
// and std::chrono::steady_clock instead (and no advance() calls), the same code runs the
// cancellations on the wheel's worker.
#include <chrono>
#include <cstdio>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>
#include <functional>
#include <map>
#include <string>

using namespace std::chrono_literals;
using clock_type = delayq::manual_clock;

namespace {

struct order {
    std::string customer;
    delayq::timeout<clock_type> cancel_at;  // the pending cancellation; cancel() it on payment
    bool cancelled = false;
};

long minutes_now() {
    return std::chrono::duration_cast<std::chrono::minutes>(clock_type::now().time_since_epoch())
        .count();
}

}  // namespace

int main() {
    clock_type::reset();
    delayq::hierarchical_wheel<clock_type>::options o;
    o.tick = 1s;  // cancellations run within a second of their deadline, never before
    delayq::hierarchical_wheel<clock_type> wheel(o);  // this loop drives it

    std::map<int, order> orders;
    int next_id = 1;
    auto place = [&](const std::string& who) {
        const int id = next_id++;
        auto& ord = orders[id];
        ord.customer = who;
        ord.cancel_at = wheel.schedule(
            [&orders, id] {
                orders[id].cancelled = true;
                std::printf(
                    "  %3ld min  order %d (%s) unpaid after 30 minutes: cancelled, stock "
                    "released\n",
                    minutes_now(), id, orders[id].customer.c_str());
            },
            30min);
        std::printf("  %3ld min  order %d placed by %s; pay within 30 minutes\n", minutes_now(), id,
                    who.c_str());
    };
    auto pay = [&](int id) {
        auto& ord = orders.at(id);
        if (ord.cancel_at.cancel()) {  // true: the cancellation will never run, and is gone already
            std::printf("  %3ld min  order %d paid: its timeout is cancelled (%zu still pending)\n",
                        minutes_now(), id, wheel.pending());
        } else {
            std::printf(
                "  %3ld min  order %d paid too late: it was cancelled, refund the payment\n",
                minutes_now(), id);
        }
    };

    std::puts("Unpaid orders on a hierarchical timing wheel (simulated clock, one step a minute):");
    // What happens in the shop, minute by minute.
    const std::multimap<long, std::function<void()>> script{
        {0, [&] { place("ana"); }},  {0, [&] { place("ben"); }},  {3, [&] { place("chen"); }},
        {5, [&] { pay(1); }},        {12, [&] { place("dee"); }}, {20, [&] { pay(3); }},
        {31, [&] { pay(2); }},       {40, [&] { place("eli"); }}, {41, [&] { pay(5); }},
        {45, [&] { place("fay"); }},
    };
    for (long minute = 0; minute <= 80; ++minute) {
        auto [first, last] = script.equal_range(minute);
        for (auto it = first; it != last; ++it) it->second();
        clock_type::advance(1min);
        wheel.advance();  // runs, here, every cancellation whose 30 minutes have passed
    }

    int cancelled = 0, paid = 0;
    for (const auto& [id, ord] : orders) (ord.cancelled ? cancelled : paid) += 1;
    std::printf("%d orders: %d paid in time, %d cancelled unpaid, %zu timeouts still pending\n",
                next_id - 1, paid, cancelled, wheel.pending());
    // ben (2), dee (4) and fay (6) never paid in time; ana, chen and eli did.
    const bool ok = paid == 3 && cancelled == 3 && wheel.pending() == 0 && orders[2].cancelled &&
                    orders[4].cancelled && orders[6].cancelled;
    return ok ? 0 : 1;
}
