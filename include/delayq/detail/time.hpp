// Saturating time arithmetic. Deadlines are computed as `now + delay`; a delay of
// `duration::max()` or a conversion from a coarse unit must give "never", not a signed overflow.
#pragma once

#include <chrono>
#include <limits>
#include <ratio>
#include <type_traits>

namespace delayq::detail {

__extension__ typedef __int128 wide_rep;

// A count `c` of `From` units (128 bits: a difference of two 64-bit counts fits) in units of `To`,
// rounded up.
template <class To, class From>
constexpr wide_rep ceil_wide_count(wide_rep c) noexcept {
    using ratio = std::ratio_divide<typename From::period, typename To::period>;
    const wide_rep num = ratio::num, den = ratio::den;
    const wide_rep prod = c * num;  // |c| <= 2^64, num < 2^63: within 128 bits
    wide_rep r = prod / den;
    if (prod % den > 0) ++r;  // round up; truncation already rounds negatives up
    return r;
}

// `d` in units of `To`, rounded up (a deadline is never early), as a 128-bit count: every 64-bit
// count times every ratio fits, so nothing overflows before the caller clamps.
template <class To, class Rep, class Period>
constexpr wide_rep ceil_count(std::chrono::duration<Rep, Period> d) noexcept {
    static_assert(std::is_integral_v<typename To::rep>,
                  "delayq durations need an integral representation");
    using ratio = std::ratio_divide<Period, typename To::period>;  // one unit of d, in To units
    if constexpr (std::is_floating_point_v<Rep>) {
        const long double v = static_cast<long double>(d.count()) * ratio::num / ratio::den;
        constexpr long double far = 1e30L;  // beyond any 64-bit count, within 128 bits
        if (!(v == v)) return 0;            // NaN: no delay
        if (v >= far) return static_cast<wide_rep>(far);
        if (v <= -far) return -static_cast<wide_rep>(far);
        auto t = static_cast<wide_rep>(v);
        if (static_cast<long double>(t) < v) ++t;
        return t;
    } else {
        return ceil_wide_count<To, std::chrono::duration<Rep, Period>>(d.count());
    }
}

template <class Rep>
constexpr Rep clamp_count(wide_rep r) noexcept {
    constexpr Rep hi = std::numeric_limits<Rep>::max();
    constexpr Rep lo = std::numeric_limits<Rep>::min();
    if (r > static_cast<wide_rep>(hi)) return hi;
    if (r < static_cast<wide_rep>(lo)) return lo;
    return static_cast<Rep>(r);
}

// `d` converted to `To`, rounded up, clamped to To's range.
template <class To, class Rep, class Period>
constexpr To saturating_ceil(std::chrono::duration<Rep, Period> d) noexcept {
    return To{clamp_count<typename To::rep>(ceil_count<To>(d))};
}

// `tp + d`, clamped to [time_point::min(), time_point::max()].
template <class TimePoint, class Rep, class Period>
constexpr TimePoint saturating_add(TimePoint tp, std::chrono::duration<Rep, Period> d) noexcept {
    using dur = typename TimePoint::duration;
    const wide_rep sum = static_cast<wide_rep>(tp.time_since_epoch().count()) + ceil_count<dur>(d);
    return TimePoint{dur{clamp_count<typename dur::rep>(sum)}};
}

// `to - from` in units of `To`, rounded up and clamped to To's range: nothing overflows, however
// far apart the two are (from time_point::min() to time_point::max() included).
template <class To, class TimePoint>
constexpr To saturating_between(TimePoint from, TimePoint to) noexcept {
    using from_dur = typename TimePoint::duration;
    using rep = typename from_dur::rep;
    if constexpr (std::is_floating_point_v<rep>) {
        return saturating_ceil<To>(to - from);  // a floating difference saturates by itself
    } else {
        const wide_rep diff = static_cast<wide_rep>(to.time_since_epoch().count()) -
                              static_cast<wide_rep>(from.time_since_epoch().count());
        return To{clamp_count<typename To::rep>(ceil_wide_count<To, from_dur>(diff))};
    }
}

// `Clock::now() + d`, saturating: the deadline of something delayed by `d` from now.
template <class Clock, class Rep, class Period>
typename Clock::time_point deadline_after(std::chrono::duration<Rep, Period> d) {
    return saturating_add(Clock::now(), d);
}

}  // namespace delayq::detail
