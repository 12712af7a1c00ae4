// "Text the customer 60 seconds after checkout", with delay_queue and a pool of consumer threads.
//
// Checkout puts a text into the queue, due 60 s later; three sender threads block in take() and
// each gets the next text as it comes due (only one of them sleeps on the earliest deadline, the
// others without a timer). At shutdown, close() wakes the senders and hands back every text not
// yet due, earliest first: here they are written to a file, as a service would persist them, and
// read back after a "restart" into a new queue with their original deadlines. Nothing is lost.
//
// Time is a manual_clock, so the minutes pass at once and the run is the same every time; with
// std::chrono::steady_clock (the default) the code is the same.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <delayq/delay_queue.hpp>
#include <delayq/manual_clock.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using clock_type = delayq::manual_clock;

namespace {

struct text {
    std::string phone;
    std::string body;
    clock_type::time_point due;
    clock_type::time_point deadline() const { return due; }  // makes `text` Delayed
};

long seconds(clock_type::time_point tp) {
    return static_cast<long>(
        std::chrono::duration_cast<std::chrono::seconds>(tp.time_since_epoch()).count());
}

// Sends what comes due until the queue is closed; counts what it sent.
void sender(int who, delayq::delay_queue<text, clock_type>& q, std::atomic<int>& sent) {
    while (auto t = q.take()) {  // nullopt once close() is called
        std::printf("  sender %d at %3ld s: texted %s \"%s\" (due at %ld s)\n", who,
                    seconds(clock_type::now()), t->phone.c_str(), t->body.c_str(), seconds(t->due));
        sent.fetch_add(1);
        sent.notify_all();
    }
}

// Moves the clock to `to` and waits until the senders have sent `expected` texts in all.
void run_until(clock_type::time_point to, std::atomic<int>& sent, int expected) {
    clock_type::set(to);
    for (int s = sent.load(); s < expected; s = sent.load()) sent.wait(s);
}

}  // namespace

int main() {
    clock_type::reset();
    const auto t0 = clock_type::now();
    const auto file = std::filesystem::temp_directory_path() / "delayq_texts_not_sent.tsv";

    std::puts("Texts due 60 s after checkout, three sender threads (simulated clock):");
    int expected = 0;
    {
        delayq::delay_queue<text, clock_type> q;
        std::atomic<int> sent{0};
        std::vector<std::jthread> pool;
        for (int i = 1; i <= 3; ++i) pool.emplace_back([&, i] { sender(i, q, sent); });

        // Seven checkouts, 20 s apart; each queues its text for 60 s later.
        for (int n = 1; n <= 7; ++n) {
            run_until(t0 + n * 20s, sent, expected);
            q.put(text{"+1-555-01" + std::to_string(10 + n),
                       "how was your order #" + std::to_string(1000 + n) + "?",
                       clock_type::now() + 60s});
            std::printf("  checkout at %3ld s: order #%d, text queued for %ld s\n",
                        seconds(clock_type::now()), 1000 + n, seconds(clock_type::now() + 60s));
            // The texts of checkouts at least 60 s ago are due by now (one each 20 s).
            expected = std::max(0, n - 2);
        }
        run_until(t0 + 150s, sent, 4);  // the texts due at 80, 100, 120 and 140 s go out

        std::puts("  shutdown at 150 s: close() wakes the senders and hands back what is left");
        std::vector<text> left = q.close();
        pool.clear();  // joins the senders, which returned from take() with nullopt
        std::ofstream out(file);
        for (const text& t : left) {
            out << seconds(t.due) << '\t' << t.phone << '\t' << t.body << '\n';
            std::printf("  persisted: %s \"%s\" due at %ld s\n", t.phone.c_str(), t.body.c_str(),
                        seconds(t.due));
        }
        std::printf("  %d sent, %zu persisted, 7 queued: none lost\n", sent.load(), left.size());
        if (sent.load() + static_cast<int>(left.size()) != 7) return 1;
    }

    // After the restart: the same texts, with their original deadlines, in a new queue.
    std::puts("Restart at 170 s: the persisted texts go back into a new queue");
    clock_type::set(t0 + 170s);
    delayq::delay_queue<text, clock_type> q;
    std::ifstream in(file);
    long due_s;
    std::string phone, body;
    while (in >> due_s && std::getline(in >> std::ws, phone, '\t') && std::getline(in, body))
        q.put(text{phone, body, t0 + std::chrono::seconds(due_s)});
    std::filesystem::remove(file);
    std::atomic<int> sent{0};
    std::vector<std::jthread> pool;
    for (int i = 1; i <= 3; ++i) pool.emplace_back([&, i] { sender(i, q, sent); });
    run_until(t0 + 170s, sent, 1);  // the one due at 160 s is overdue: it goes out at once
    run_until(t0 + 180s, sent, 2);
    run_until(t0 + 200s, sent, 3);
    q.close();
    pool.clear();
    std::printf("after the restart: %d sent, %zu left\n", sent.load(), q.size());
    return sent.load() == 3 && q.empty() ? 0 : 1;
}
