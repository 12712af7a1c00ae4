// The one vocabulary of delayq: something that has a deadline.
//
// `deadline_of(x)` finds the deadline of x: a member `x.deadline()`, an ADL `deadline(x)`, or,
// for pointer-likes (raw pointers, unique_ptr, shared_ptr, reference_wrapper), the deadline of
// what they point to. `Delayed<T, Clock>` is every T for which that yields a Clock time point.
// `delayed<V, Clock>` gives a deadline to a value that has none.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "detail/time.hpp"

namespace delayq {

namespace detail::deadline_of_impl {

// Blocks ordinary lookup, so that only ADL finds a user's `deadline(x)`.
void deadline() = delete;

template <class T>
concept has_member = requires(const T& t) {
    t.deadline();
};

template <class T>
concept has_adl = !has_member<T> && requires(const T& t) {
    deadline(t);
};

template <class T>
struct is_smart_pointer : std::false_type {};
template <class U, class D>
struct is_smart_pointer<std::unique_ptr<U, D>> : std::true_type {};
template <class U>
struct is_smart_pointer<std::shared_ptr<U>> : std::true_type {};

struct fn {
    template <class T>
    requires has_member<T>
    constexpr decltype(auto) operator()(const T& t) const noexcept(noexcept(t.deadline())) {
        return t.deadline();
    }

    template <class T>
    requires has_adl<T>
    constexpr decltype(auto) operator()(const T& t) const noexcept(noexcept(deadline(t))) {
        return deadline(t);
    }

    template <class T>
    requires(!has_member<T> && !has_adl<T> &&
             (std::is_pointer_v<T> || is_smart_pointer<T>::value) &&
             std::is_invocable_v<const fn&,
                                 decltype(*std::declval<const T&>())>) constexpr decltype(auto)
    operator()(const T& p) const {
        return (*this)(*p);
    }

    template <class U>
    requires std::is_invocable_v<const fn&, const U&>
    constexpr decltype(auto) operator()(const std::reference_wrapper<U>& r) const {
        return (*this)(r.get());
    }
};

}  // namespace detail::deadline_of_impl

inline namespace cpo {
/// The deadline of anything delayq can hold: `x.deadline()`, else an ADL `deadline(x)`, else, for
/// a raw pointer, unique_ptr, shared_ptr or reference_wrapper, the deadline of what it points to.
/// O(1) (what the user's `deadline` costs). Precondition: a pointer is not null. noexcept when
/// the deadline function is.
inline constexpr detail::deadline_of_impl::fn deadline_of{};
}  // namespace cpo

/// `T` has a deadline on `Clock`'s time line: `deadline_of(t)` converts to
/// `Clock::time_point`. What delay_queue holds, and what the wheels' timeout handles model.
template <class T, class Clock = std::chrono::steady_clock>
concept Delayed = requires(const T& t) {
    { delayq::deadline_of(t) } -> std::convertible_to<typename Clock::time_point>;
};

/// A value that has no deadline of its own, with one: an aggregate, built as
/// `delayed<V, Clock>{v, at}` or with delay_for(). Copyable, movable and comparable as `V` is.
template <class V, class Clock = std::chrono::steady_clock>
struct delayed {
    V value;                        ///< the payload
    typename Clock::time_point at;  ///< when it is due

    /// `at`; makes delayed a `Delayed<delayed, Clock>`.
    typename Clock::time_point deadline() const noexcept { return at; }
};

/// `v`, due `d` from now: `Clock::now() + d`, rounded up to Clock's resolution and saturating
/// (`duration::max()` is `time_point::max()`, never; a negative `d` is in the past, due at once).
/// Throws what copying or moving `v` throws.
template <class Clock = std::chrono::steady_clock, class V, class Rep, class Period>
delayed<std::decay_t<V>, Clock> delay_for(V&& v, std::chrono::duration<Rep, Period> d) {
    return {std::forward<V>(v), detail::deadline_after<Clock>(d)};
}

}  // namespace delayq
