// One object per key for the whole process: what the queue objects of a process share. Part of
// <delayq/redis/delay_queue.hpp>.
//
// The idea. Two queue objects of one process that talk to the same server as the same user gain
// nothing from a connection each, and lose the batching that one shared connection gives their
// threads' calls (connection.hpp); likewise for the calls of one queue shard that can go as one
// script call (delayq/detail/job_queue/combiner.hpp). So such things are made once per process and
// key, on first use, and held by every object that asks with that key: a table of weak pointers, so
// that the thing goes when its last holder does, whatever order the holders go in, and the table
// never keeps one alive. A child process after fork() gets things of its own: the parent's may be
// in the middle of a call sent by a thread that the child does not have, on a socket the parent
// still uses (the table knows the fork generation it served last, fork_generation(), which the link
// asks too).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "../../detail/fork.hpp"

namespace delayq::redis::detail {

using delayq::detail::fork_count;
using delayq::detail::fork_generation;

// The one `T` of this process for `key`, made by `make()` (a shared_ptr<T>) on first use and
// shared by everyone who asks with that key while anyone holds it. A lookup is a hash lookup: a
// process may hold many (a sharded queue of 16384 shards asks once per shard), and a scan of the
// table per lookup made those quadratic. Entries whose thing is gone are swept when the table has
// doubled since the last sweep, so the table stays within twice the things alive, at O(1) a
// lookup amortized.
template <class T, class Make>
std::shared_ptr<T> shared_in_process(const std::string& key, Make make) {
    struct table {
        std::mutex m;
        unsigned generation = 0;
        std::unordered_map<std::string, std::weak_ptr<T>> items;
        std::size_t swept_at = 0;  // the table's size after the last sweep
    };
    static table* const t = new table;  // never destroyed: objects may outlive static destruction
    const unsigned generation = fork_generation();
    std::lock_guard lk(t->m);
    if (t->generation != generation) {  // the parent's
        t->items.clear();
        t->swept_at = 0;
        t->generation = generation;
    }
    auto& slot = t->items[key];
    if (std::shared_ptr<T> found = slot.lock()) return found;
    std::shared_ptr<T> made = make();
    slot = made;
    if (t->items.size() > 2 * t->swept_at + 16) {
        std::erase_if(t->items, [](const auto& item) { return item.second.expired(); });
        t->swept_at = t->items.size();
    }
    return made;
}

}  // namespace delayq::redis::detail
