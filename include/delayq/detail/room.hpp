// room: the one rule that keeps a wheel's pass from allocating, and the types that enforce it.
//
// The rule. A pass (wheel_core::advance, and all it calls on the ring, the batch and the window)
// runs in noexcept code and must not fail halfway: it never allocates. So every member that may
// allocate — a ring's prepare(), prepare_repeat() and reserve(), a batch's or a window's reserve(),
// the node pool's allocate() — takes a `room_key`, and only a `room_lock` makes one: the core's
// lock as a schedule or a reschedule takes it, where an exception is harmless (nothing is
// scheduled or moved then); a constructor has its own (construction_room). Everything else takes
// the lock as a plain lock_guard and holds no key, so a call from a pass to a member that makes
// room does not compile. The arrays a pass writes into are `room_array`s, whose only growing member
// is reserve(), which takes a key: a push past the room reserved is a broken precondition, which
// ends the program in every build (std::terminate, as an exception out of the noexcept pass would),
// never a reallocation that happens to succeed.
//
// How much room, and when, is the core's to say (wheel_core.hpp, "Memory"): for as many nodes as
// are pending, made as the count grows; a periodic task's moves are prepared when it is scheduled
// and when it is rescheduled.
//
// Reserved, not resident: a room_array of 16 KiB and more is mapped from the system
// (reserved_allocator, huge_pages.hpp), so that its room costs address space until a pass touches
// it, and release_unused() hands touched pages back.
#pragma once

#include <cstddef>
#include <exception>
#include <mutex>
#include <type_traits>
#include <utility>

#include "huge_pages.hpp"

namespace delayq::detail {

template <class Lockable>
class room_lock;
class construction_room;

/// Leave to make room (to allocate). Only a room_lock (or a constructor's construction_room) makes
/// one; members that may allocate take it (by value: it is empty), so that code holding neither
/// cannot call them.
class room_key {
    room_key() = default;
    template <class Lockable>
    friend class room_lock;
    friend class construction_room;
};

/// A lock that may make room: held where an exception is harmless (a schedule, a reschedule).
template <class Lockable>
class room_lock {
  public:
    explicit room_lock(Lockable& m) : lk_(m) {}
    room_lock(const room_lock&) = delete;
    room_lock& operator=(const room_lock&) = delete;

    room_key key() const noexcept { return room_key{}; }

  private:
    std::lock_guard<Lockable> lk_;
};

/// The room a constructor makes: nothing is shared yet, and what it throws, the constructor throws.
class construction_room {
  public:
    construction_room() = default;
    construction_room(const construction_room&) = delete;
    construction_room& operator=(const construction_room&) = delete;

    room_key key() const noexcept { return room_key{}; }
};

/// An array of trivially copyable T with a fixed room: reserve() (with a room_key) is the only
/// member that allocates; the others never do. See the top of this header.
template <class T>
class room_array {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

  public:
    room_array() noexcept = default;
    room_array(const room_array&) = delete;
    room_array& operator=(const room_array&) = delete;
    room_array(room_array&& o) noexcept { swap(o); }
    room_array& operator=(room_array&& o) noexcept {
        room_array(std::move(o)).swap(*this);
        return *this;
    }
    ~room_array() {
        if (data_) reserved_allocator<T>().deallocate(data_, cap_);
    }

    /// Room for n elements in all, what is held kept. Throws std::bad_alloc (then nothing
    /// changed).
    void reserve(std::size_t n, room_key) {
        if (n <= cap_) return;
        T* p = reserved_allocator<T>().allocate(n);
        for (std::size_t i = 0; i < size_; ++i) p[i] = data_[i];
        if (data_) reserved_allocator<T>().deallocate(data_, cap_);
        data_ = p;
        cap_ = n;
    }

    std::size_t size() const noexcept { return size_; }
    std::size_t capacity() const noexcept { return cap_; }
    bool empty() const noexcept { return size_ == 0; }
    T* data() noexcept { return data_; }
    const T* data() const noexcept { return data_; }
    T* begin() noexcept { return data_; }
    T* end() noexcept { return data_ + size_; }
    const T* begin() const noexcept { return data_; }
    const T* end() const noexcept { return data_ + size_; }
    T& operator[](std::size_t i) noexcept { return data_[i]; }
    const T& operator[](std::size_t i) const noexcept { return data_[i]; }
    T& back() noexcept { return data_[size_ - 1]; }

    /// Pre: size() < capacity() (else std::terminate).
    void push_back(const T& x) noexcept {
        if (size_ == cap_) [[unlikely]]
            exhausted();
        data_[size_++] = x;
    }
    void pop_back() noexcept { --size_; }
    void clear() noexcept { size_ = 0; }

    /// n elements (n <= capacity(), else std::terminate); those past the old size() are whatever
    /// the memory held: the caller writes them.
    void set_size(std::size_t n) noexcept {
        if (n > cap_) [[unlikely]]
            exhausted();
        size_ = n;
    }

    void swap(room_array& o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(cap_, o.cap_);
    }

    /// The pages of the room past the first `keep` elements go back to the system (they read as
    /// zeros when next touched). Pre: size() <= keep.
    void release_unused(std::size_t keep) noexcept {
        if (size_ <= keep && data_) reserved_allocator<T>::release_unused(data_, cap_, keep);
    }

  private:
    [[noreturn, gnu::cold, gnu::noinline]] static void exhausted() noexcept { std::terminate(); }

    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t cap_ = 0;
};

}  // namespace delayq::detail
