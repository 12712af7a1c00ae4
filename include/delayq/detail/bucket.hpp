// The lists both wheels keep their nodes in: circular, intrusive, doubly linked lists with a
// sentinel, so that unlinking a node needs only the node (O(1), whatever list holds it).
//
// A bucket spreads its nodes round-robin over a few lists (its "stripes": a striped_list). Walking
// a long list waits for one cache miss after another; walking the stripes in turn, with each
// stripe's next node prefetched
// while the others are handled, waits for several at once. That is what expiring a large bucket
// costs, so it is worth the bucket's few extra bytes.
#pragma once

#include <cstddef>

#include "timer_node.hpp"

namespace delayq::detail {

struct node_list {
    node_links head;

    node_list() noexcept { head.prev = head.next = &head; }
    node_list(const node_list&) = delete;
    node_list& operator=(const node_list&) = delete;

    bool empty() const noexcept { return head.next == &head; }

    void push_back(node_links* n) noexcept {
        n->prev = head.prev;
        n->next = &head;
        head.prev->next = n;
        head.prev = n;
    }

    /// Unlinks n from whichever list holds it; n's links become null.
    static void unlink(node_links* n) noexcept {
        n->prev->next = n->next;
        n->next->prev = n->prev;
        n->prev = n->next = nullptr;
    }

    /// A hint that unlink(n) comes soon: starts the misses on n's neighbours.
    static void prefetch_unlink(const node_links* n) noexcept {
        __builtin_prefetch(n->prev, 1);
        __builtin_prefetch(n->next, 1);
    }

    /// Empties the list and returns its nodes as a chain through `next`, ending in nullptr.
    node_links* detach() noexcept {
        if (empty()) return nullptr;
        node_links* first = head.next;
        head.prev->next = nullptr;
        head.prev = head.next = &head;
        return first;
    }
};

template <std::size_t Stripes>
struct striped_list {
    static_assert(Stripes > 0 && (Stripes & (Stripes - 1)) == 0, "a power of two");

    node_list stripe[Stripes];
    unsigned next_stripe = 0;

    bool empty() const noexcept {
        for (const auto& l : stripe)
            if (!l.empty()) return false;
        return true;
    }

    void push_back(node_links* n) noexcept {
        stripe[next_stripe].push_back(n);
        next_stripe = (next_stripe + 1) & (Stripes - 1);
    }

    /// Links n at the end of stripe i (mod Stripes) rather than the next stripe in turn.
    void push_back_to(std::size_t i, node_links* n) noexcept {
        stripe[i & (Stripes - 1)].push_back(n);
    }

    /// Calls f(node) for every node, stripes in turn, each stripe's next node prefetched. f may
    /// unlink the node it is given (and nothing else of this list).
    template <class F>
    void for_each(F&& f) {
        node_links* cur[Stripes];
        for (std::size_t i = 0; i < Stripes; ++i) cur[i] = stripe[i].head.next;
        for (bool more = true; more;) {
            more = false;
            for (std::size_t i = 0; i < Stripes; ++i) {
                node_links* n = cur[i];
                if (n == &stripe[i].head) continue;
                node_links* next = n->next;
                __builtin_prefetch(next, 1);
                cur[i] = next;
                more = true;
                f(n);
            }
        }
    }

    /// Empties the list and calls f(node) for every node it held, unlinked (prev null), stripes in
    /// turn as drain() does: a ring's take_all().
    template <class F>
    void unlink_all(F&& f) {
        drain([&](node_links* n) {
            n->prev = nullptr;
            f(n);
        });
    }

    /// Empties the list, then calls f(node) for every node it held, as for_each does. f may link
    /// the node anywhere, this list included.
    template <class F>
    void drain(F&& f) {
        node_links* cur[Stripes];
        for (std::size_t i = 0; i < Stripes; ++i) cur[i] = stripe[i].detach();
        next_stripe = 0;
        for (bool more = true; more;) {
            more = false;
            for (node_links*& n : cur) {
                if (!n) continue;
                node_links* take = n;
                n = take->next;
                if (n) __builtin_prefetch(n, 1);
                more = true;
                f(take);
            }
        }
    }
};

}  // namespace delayq::detail
