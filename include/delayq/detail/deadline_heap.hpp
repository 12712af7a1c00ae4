// deadline_heap<T>: a min-heap of elements by deadline(), first in, first out among equal ones,
// with no lock and no clock: the timing wheel's queue of buckets (timing_wheel.hpp). Room is made
// by reserve() (with a room_key: room.hpp), so that put() within it never allocates and a pass
// that re-queues buckets cannot fail.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "room.hpp"

namespace delayq::detail {

template <class T>
class deadline_heap {
  public:
    using time_point = decltype(std::declval<const T&>().deadline());

    /// Makes room for `n` elements in all. Throws std::bad_alloc (then nothing changed).
    void reserve(std::size_t n, room_key key) { heap_.reserve(n, key); }

    /// Adds x. Pre: size() < the room reserve() made.
    void put(const T& x) noexcept {
        heap_.push_back(entry{x, seq_++});
        std::push_heap(heap_.begin(), heap_.end(), later);
    }

    /// Takes out the earliest element if its deadline is <= now.
    std::optional<T> poll(time_point now) noexcept {
        if (heap_.empty() || heap_[0].x.deadline() > now) return std::nullopt;
        std::pop_heap(heap_.begin(), heap_.end(), later);
        const T x = heap_.back().x;
        heap_.pop_back();
        return x;
    }

    /// The earliest deadline; nullopt when empty.
    std::optional<time_point> next_deadline() const noexcept {
        if (heap_.empty()) return std::nullopt;
        return heap_[0].x.deadline();
    }

    /// Drops every element, keeping the room.
    void clear() noexcept { heap_.clear(); }

    std::size_t size() const noexcept { return heap_.size(); }

  private:
    struct entry {
        T x;
        std::uint64_t seq;
    };
    // The heap's order: the root is the earliest deadline, the first put among equals.
    static bool later(const entry& a, const entry& b) noexcept {
        const auto da = a.x.deadline();
        const auto db = b.x.deadline();
        return da != db ? db < da : b.seq < a.seq;
    }

    room_array<entry> heap_;
    std::uint64_t seq_ = 0;
};

}  // namespace delayq::detail
