// "Text the customer after checkout", kept in a delayq::sqlite::delay_queue file that every put
// reaches (fsynced) before it returns, and sent by a delayq::worker: a process killed mid-flow
// loses no text. Seven checkouts, 100 ms apart, each queue a text due 1 s later (60 s in a shop);
// three sender threads send each text once it is due. With --crash-after N the process kills
// itself (SIGKILL) right after its Nth text, before that text's ack. Run it again on the same
// file: it sends every text left, the one whose ack was lost again once its lease ends (at least
// once), and removes the file. text_after_checkout_durable.sh runs the pair (ctest).
//   example_text_after_checkout_durable [--file PATH] [--crash-after N]
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <delayq/sqlite/delay_queue.hpp>
#include <delayq/worker.hpp>
#include <filesystem>
#include <string>
#include <thread>

using namespace std::chrono_literals;

static long long now_ms() {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
    std::string file = std::filesystem::temp_directory_path() / "delayq_texts.queue";
    int crash_after = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--file") file = argv[i + 1];
        if (std::string(argv[i]) == "--crash-after") crash_after = std::stoi(argv[i + 1]);
    }
    std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);  // what a kill cuts short is printed already
    const bool restart = std::filesystem::exists(file);
    delayq::sqlite::delay_queue q({.path = file, .lease = 2s});
    std::size_t expected = q.size();  // on a restart: the texts the killed run left
    std::atomic<int> sent{0};
    // The payload: the checkout's time (ms), a space, the order's number.
    delayq::worker senders(
        q,
        [&](const delayq::job& j) {
            const long long checkout = std::stoll(j.payload);
            const std::string order = j.payload.substr(j.payload.find(' ') + 1);
            std::printf(
                "  texted +1-555-0%s \"how was your order #%s?\" %lld ms after checkout "
                "(attempt %u)\n",
                order.c_str(), order.c_str(), now_ms() - checkout, j.attempts);
            if (++sent == crash_after) {
                std::printf("  crash: kill -9 after %d texts, before the last one's ack\n",
                            sent.load());
                std::raise(SIGKILL);  // nothing runs after it: no destructor, no exit handler
            }
        },
        {.threads = 3});
    for (int n = 1001; !restart && n <= 1007; ++n) {
        const long long checkout = now_ms();
        // Idempotent by id: a checkout retried after an error cannot queue its text twice.
        expected += q.put_after("order-" + std::to_string(n),
                                std::to_string(checkout) + ' ' + std::to_string(n), 1000ms);
        std::printf("  checkout: order #%d, text due 1000 ms after checkout\n", n);
        std::this_thread::sleep_for(100ms);
    }
    while (senders.counters().done < expected) std::this_thread::sleep_for(10ms);
    senders.stop();
    const std::size_t left = q.size();
    std::printf("Done: %d texts sent, %zu left in the file\n", sent.load(), left);
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(file + suffix);
    return left == 0 ? 0 : 1;
}
