// Request timeouts with retransmission and exponential backoff: every request arms a timer; the
// reply cancels it. Almost every timer is cancelled before it fires, which is the wheels' best
// case: a cancel is O(1) and gives the timer's memory back at once, where a heap would keep the
// entry (or search for it) until its deadline.
//
// A client sends 10 000 requests, one a millisecond, over a simulated network: replies take 5 to
// 80 ms, 2 % take 300 ms, and 3 % of the messages are lost. A request not answered within its
// timeout is sent again with the timeout doubled (200, 400, 800, 1600 ms); after four attempts the
// client gives up. The timers sit in a hashed_wheel driven by the client's loop; the network is a
// second wheel standing for the packets in flight. Time is a manual_clock, so the ten simulated
// seconds take a fraction of a second and the run is the same every time.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/manual_clock.hpp>
#include <random>
#include <vector>

using namespace std::chrono_literals;
using clock_type = delayq::manual_clock;

namespace {

constexpr int requests = 10'000;
constexpr int max_attempts = 4;
constexpr auto first_timeout = 200ms;

struct request {
    int attempts = 0;
    bool answered = false;
    bool given_up = false;
    delayq::timeout<clock_type> timer;  // the pending retransmission
};

struct counts {
    long timers = 0, cancelled = 0, fired = 0, replies = 0, duplicates = 0, lost = 0;
    std::array<long, max_attempts + 1> answered_at{};  // by attempt number
};

class client {
  public:
    client(delayq::hashed_wheel<clock_type>& timers, delayq::hashed_wheel<clock_type>& network)
        : timers_(timers), network_(network), reqs_(requests) {}

    void send(int id) {
        request& r = reqs_[static_cast<std::size_t>(id)];
        ++r.attempts;
        // Backoff: 200 ms, then twice as long at each retry.
        const auto timeout = first_timeout * (1 << (r.attempts - 1));
        r.timer = timers_.schedule([this, id] { on_timeout(id); }, timeout);
        ++c_.timers;
        transmit(id);
    }

    void on_reply(int id) {
        request& r = reqs_[static_cast<std::size_t>(id)];
        ++c_.replies;
        if (r.answered || r.given_up) {
            ++c_.duplicates;  // the answer to a retransmitted copy, or too late: ignored
            return;
        }
        r.answered = true;
        ++c_.answered_at[static_cast<std::size_t>(r.attempts)];
        if (r.timer.cancel()) ++c_.cancelled;  // the usual case: the timer never fires
    }

    const counts& stats() const { return c_; }
    std::size_t unanswered() const {
        std::size_t n = 0;
        for (const auto& r : reqs_) n += (r.answered || r.given_up) ? 0 : 1;
        return n;
    }

  private:
    void on_timeout(int id) {
        request& r = reqs_[static_cast<std::size_t>(id)];
        ++c_.fired;
        if (r.attempts == max_attempts) {
            r.given_up = true;
            std::printf("  request %d: no reply after %d attempts, given up\n", id, max_attempts);
            return;
        }
        send(id);  // retransmit, with the timeout doubled
    }

    // The network: a request and its reply each get lost with 3 % odds; the reply comes after
    // 5-80 ms, or after 300 ms (later than the first timeout) one time in fifty.
    void transmit(int id) {
        if (lose_(rng_) < 3 || lose_(rng_) < 3) {
            ++c_.lost;
            return;
        }
        const auto rtt = lose_(rng_) < 2 ? 300ms : std::chrono::milliseconds(rtt_(rng_));
        network_.schedule([this, id] { on_reply(id); }, rtt);
    }

    delayq::hashed_wheel<clock_type>& timers_;
    delayq::hashed_wheel<clock_type>& network_;
    std::vector<request> reqs_;
    counts c_;
    std::mt19937 rng_{2024};
    std::uniform_int_distribution<int> lose_{0, 99};
    std::uniform_int_distribution<int> rtt_{5, 80};
};

}  // namespace

int main() {
    clock_type::reset();
    delayq::hashed_wheel_options<clock_type> t;
    t.tick = 10ms;  // a timeout fires within 10 ms after its deadline, never before
    t.wheel_size = 256;
    delayq::hashed_wheel<clock_type> timers(t);
    delayq::hashed_wheel_options<clock_type> n;
    n.tick = 1ms;
    n.wheel_size = 512;
    delayq::hashed_wheel<clock_type> network(n);
    client cl(timers, network);

    std::printf("%d requests, one a millisecond; timeout 200 ms doubling per retry, %d attempts:\n",
                requests, max_attempts);
    int sent = 0;
    std::size_t peak = 0;
    while (sent < requests || timers.pending() != 0 || network.pending() != 0) {
        if (sent < requests) cl.send(sent++);
        peak = std::max(peak, timers.pending());
        clock_type::advance(1ms);
        network.advance();  // replies arrive (and cancel their timers)
        timers.advance();   // timeouts fire (and retransmit)
    }

    const counts& c = cl.stats();
    const long answered = c.answered_at[1] + c.answered_at[2] + c.answered_at[3] + c.answered_at[4];
    std::printf("answered: %ld (first try %ld, second %ld, third %ld, fourth %ld)\n", answered,
                c.answered_at[1], c.answered_at[2], c.answered_at[3], c.answered_at[4]);
    std::printf(
        "timers: %ld armed, %ld cancelled before firing (%.1f %%), %ld fired "
        "(retransmissions and give-ups); at most %zu pending at once\n",
        c.timers, c.cancelled,
        100.0 * static_cast<double>(c.cancelled) / static_cast<double>(c.timers), c.fired, peak);
    std::printf("network: %ld messages lost, %ld replies, %ld of them duplicates or too late\n",
                c.lost, c.replies, c.duplicates);
    const bool ok = c.cancelled + c.fired == c.timers && cl.unanswered() == 0 &&
                    timers.pending() == 0 && c.cancelled * 10 > c.timers * 8;
    return ok ? 0 : 1;
}
