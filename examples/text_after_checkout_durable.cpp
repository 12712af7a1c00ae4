// "Text the customer after checkout", as text_after_checkout.cpp does it, but with the texts kept
// in a delayq::sqlite::delay_queue: a file that every put reaches (fsynced) before it returns. That
// example saves what is left at close(), which a kill -9 or a power cut never reaches; here there
// is nothing to save, and a process killed mid-flow loses no text.
//
// Seven checkouts, 100 ms apart, each queues a text due 1 s later (60 s in a shop; short here so
// that a run takes seconds). Three sender threads take the texts as they come due and ack each
// once it is sent. With --crash-after N the process kills itself (SIGKILL) right after its Nth
// text, before that text's ack. Run it again on the same file: it resumes, sends every text left,
// the one whose ack was lost again once its lease ends (at least once), and removes the file.
//   example_text_after_checkout_durable [--file PATH] [--crash-after N]
// PATH: the queue's file (default: delayq_texts.queue in the temporary directory). The run that
// finds the file already there is the restart: it takes no new checkouts and only sends.
// text_after_checkout_durable.sh runs the pair and checks their output (ctest, label example).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <delayq/sqlite/delay_queue.hpp>
#include <filesystem>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using sys = std::chrono::system_clock;

namespace {

constexpr auto text_delay = 1000ms;  // after the checkout
constexpr int checkouts = 7;

long long now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(sys::now().time_since_epoch())
        .count();
}

// The payload: the checkout time (ms on the system clock), a tab, the phone, a tab, the text.
struct text {
    long long checkout_ms = 0;
    std::string phone, body;

    std::string payload() const { return std::to_string(checkout_ms) + '\t' + phone + '\t' + body; }
    static text parse(std::string_view p) {
        const auto a = p.find('\t');
        const auto b = p.find('\t', a + 1);
        return {std::stoll(std::string(p.substr(0, a))), std::string(p.substr(a + 1, b - a - 1)),
                std::string(p.substr(b + 1))};
    }
};

struct counters {
    std::atomic<int> sent{0};   // texts sent by this process, acked or not
    std::atomic<int> acked{0};  // texts gone from the file for good
};

// Sends each text as it comes due, then acks it, until asked to stop; with crash_after > 0 the
// process dies right after its crash_after-th text, before that text's ack.
void sender(int who, delayq::sqlite::delay_queue& q, counters& c, int crash_after,
            std::stop_token stop) {
    while (!stop.stop_requested()) {
        // Sleeps until the next text is due, without polling; the bound only lets it see `stop`.
        auto job = q.take(250ms);
        if (!job) continue;
        const text t = text::parse(job->payload);
        std::printf("  sender %d: texted %s \"%s\" %lld ms after checkout (attempt %u%s)\n", who,
                    t.phone.c_str(), t.body.c_str(), now_ms() - t.checkout_ms, job->attempts,
                    job->attempts > 1 ? ": its last sender died before the ack" : "");
        if (c.sent.fetch_add(1) + 1 == crash_after) {
            std::printf("  crash: kill -9 after %d texts, before the last one's ack\n",
                        crash_after);
            std::raise(SIGKILL);  // nothing runs after it (no destructor, no exit handler): kill -9
        }
        if (q.ack(*job)) {
            c.acked.fetch_add(1);
            c.acked.notify_all();
        }  // false: its lease (2 s) ended first, so the text comes back and is sent again
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::filesystem::path file = std::filesystem::temp_directory_path() / "delayq_texts.queue";
    int crash_after = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--file" && i + 1 < argc) {
            file = argv[++i];
        } else if (arg == "--crash-after" && i + 1 < argc) {
            crash_after = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: %s [--file PATH] [--crash-after N]\n", argv[0]);
            return 2;
        }
    }
    // Line by line, so that what was printed before the kill is not lost with the process.
    std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);

    const bool restart = std::filesystem::exists(file);
    try {
        delayq::sqlite::options o;
        o.path = file.string();
        o.lease = 2s;  // a text is sent in far less; a killed sender's text comes back after it
        delayq::sqlite::delay_queue q(o);
        counters c;
        // The texts to send before this run is done: those left in the file, and each put below.
        int expected = static_cast<int>(q.size());
        if (restart)
            std::printf("Restart: %d texts left in %s (waiting, or taken by the killed run)\n",
                        expected, file.c_str());
        else
            std::printf("Texts due %lld ms after checkout, three senders, queue file %s\n",
                        static_cast<long long>(text_delay.count()), file.c_str());

        std::vector<std::jthread> pool;
        for (int i = 1; i <= 3; ++i)
            pool.emplace_back([&, i](std::stop_token stop) { sender(i, q, c, crash_after, stop); });

        for (int n = 1; !restart && n <= checkouts; ++n) {
            if (n > 1) std::this_thread::sleep_for(100ms);
            const text t{now_ms(), "+1-555-01" + std::to_string(10 + n),
                         "how was your order #" + std::to_string(1000 + n) + "?"};
            const sys::time_point due{std::chrono::milliseconds(t.checkout_ms) + text_delay};
            // Idempotent by id: a checkout retried after an error cannot queue its text twice.
            if (q.put("order-" + std::to_string(1000 + n), t.payload(), due)) ++expected;
            std::printf("  checkout: order #%d, text to %s due %lld ms after checkout\n", 1000 + n,
                        t.phone.c_str(), static_cast<long long>(text_delay.count()));
        }

        for (int a = c.acked.load(); a < expected; a = c.acked.load()) c.acked.wait(a);
        pool.clear();  // asks the senders to stop and joins them, each within 250 ms
        const auto left = q.size();
        std::printf("Done: %d texts sent, %zu left in the file\n", c.sent.load(), left);
        if (left != 0) return 1;
    } catch (const delayq::queue_error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    // Every text went out: the file (and SQLite's WAL files beside it) has nothing more to keep.
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(file.string() + suffix);
    return 0;
}
