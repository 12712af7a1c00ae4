// What a wheel's cancel at N pending costs at its floor, step by step, against the locked heap's
// tombstone (issue 27's yardstick): a random handle (16 bytes, in a vector) leads to its node (48
// bytes, the wheels' node header and an 8-byte capture) in a ring of N nodes linked in random
// order. Each row adds one step of a wheel's cancel to the row before; a round cancels 1 024
// random handles; the median of 31 rounds is printed. The steps are undone after each round, so
// every round starts from the same ring. No delayq code: this measures the machine.
//
//   probe_cancel_floor [N]    (default 1 000 000)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

struct node {
    node* prev;
    node* next;
    std::int64_t deadline;
    std::atomic<std::uintptr_t> state;
    std::atomic<std::uint32_t> refs;
    std::uint32_t seq;
    std::uint64_t capture;
};
static_assert(sizeof(node) == 48);

struct handle {
    node* n;
    void* core;
};

}  // namespace

int main(int argc, char** argv) {
    const std::size_t n = argc > 1 ? std::stoul(argv[1]) : 1'000'000;
    std::vector<node> slab(n);
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 rng(1);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<handle> h(n);
    for (std::size_t i = 0; i < n; ++i) {
        node& a = slab[order[i]];
        node& b = slab[order[(i + 1) % n]];
        h[i] = handle{&a, nullptr};
        a.refs = 2;  // the timer's and the handle's
        a.next = &b;
        b.prev = &a;
    }
    std::atomic<int> lock{0};
    const auto acquire = [&] {
        while (lock.exchange(1, std::memory_order_acquire) != 0) {
        }
    };
    const auto release = [&] { lock.store(0, std::memory_order_release); };
    std::mutex m;
    std::unordered_set<std::size_t> dead;

    const auto row = [&](const char* what, auto cancel, auto undo) {
        std::vector<double> ns;
        std::vector<std::size_t> victims(1024);
        for (int r = 0; r < 31; ++r) {
            for (auto& v : victims) v = rng() % n;
            std::sort(victims.begin(), victims.end());
            victims.erase(std::unique(victims.begin(), victims.end()), victims.end());
            std::shuffle(victims.begin(), victims.end(), rng);
            const auto t0 = std::chrono::steady_clock::now();
            for (const std::size_t v : victims) cancel(v);
            const std::chrono::duration<double, std::nano> d =
                std::chrono::steady_clock::now() - t0;
            ns.push_back(d.count() / static_cast<double>(victims.size()));
            for (auto it = victims.rbegin(); it != victims.rend(); ++it) undo(*it);
            victims.resize(1024);
        }
        std::sort(ns.begin(), ns.end());
        std::printf("%-62s %6.1f ns\n", what, ns[ns.size() / 2]);
    };
    const auto nothing = [](std::size_t) {};
    std::vector<node*> was_prev(n);

    std::printf("N = %zu, median of 31 rounds of 1 024 cancels\n", n);
    row(
        "heap's tombstone: a mutex and an unordered_set insert",
        [&](std::size_t v) {
            std::lock_guard lk(m);
            dead.insert(v);
        },
        [&](std::size_t v) { dead.erase(v); });
    row(
        "wheel: the handle, then a store to its node",
        [&](std::size_t v) { h[v].n->state.store(2, std::memory_order_release); }, nothing);
    row(
        "  + the node prefetched, then a spin lock around the store",
        [&](std::size_t v) {
            node* p = h[v].n;
            __builtin_prefetch(p, 1);
            acquire();
            p->state.store(2, std::memory_order_release);
            release();
        },
        nothing);
    row(
        "  + the timer's reference dropped (a locked decrement)",
        [&](std::size_t v) {
            node* p = h[v].n;
            __builtin_prefetch(p, 1);
            acquire();
            p->refs.fetch_sub(1, std::memory_order_acq_rel);
            p->state.store(2, std::memory_order_release);
            release();
        },
        [&](std::size_t v) { h[v].n->refs.store(2, std::memory_order_relaxed); });
    row(
        "  + the node unlinked from its two neighbours",
        [&](std::size_t v) {
            node* p = h[v].n;
            __builtin_prefetch(p, 1);
            acquire();
            p->refs.fetch_sub(1, std::memory_order_acq_rel);
            node* a = p->prev;
            node* b = p->next;
            a->next = b;
            b->prev = a;
            was_prev[v] = a;
            p->state.store(2, std::memory_order_release);
            release();
        },
        [&](std::size_t v) {  // relinked after the same neighbour, in reverse order of the unlinks
            node* p = h[v].n;
            node* a = was_prev[v];
            p->prev = a;
            p->next = a->next;
            a->next->prev = p;
            a->next = p;
            p->refs.store(2, std::memory_order_relaxed);
        });
}
