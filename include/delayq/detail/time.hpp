// Saturating time arithmetic. Deadlines are computed as `now + delay`; a delay of
// `duration::max()` or a conversion from a coarse unit must give "never", not a signed overflow.
#pragma once

#include <chrono>
#include <limits>
#include <ratio>
#include <type_traits>

namespace delayq::detail {

// `d` converted to `To`, rounded up (a deadline is never early), clamped to To's range.
template <class To, class Rep, class Period>
constexpr To saturating_ceil(std::chrono::duration<Rep, Period> d) noexcept {
    using to_rep = typename To::rep;
    static_assert(std::is_integral_v<to_rep>, "delayq durations need an integral representation");
    using ratio = std::ratio_divide<Period, typename To::period>;  // one unit of d, in To units
    constexpr to_rep hi = std::numeric_limits<to_rep>::max();
    constexpr to_rep lo = std::numeric_limits<to_rep>::min();
    if constexpr (std::is_floating_point_v<Rep>) {
        const long double v = static_cast<long double>(d.count()) * ratio::num / ratio::den;
        if (!(v == v)) return To::zero();  // NaN
        if (v >= static_cast<long double>(hi)) return To::max();
        if (v <= static_cast<long double>(lo)) return To::min();
        auto t = static_cast<to_rep>(v);
        if (static_cast<long double>(t) < v) ++t;
        return To{t};
    } else {
        // c * num fits in 128 bits for every 64-bit count and ratio, so divide once, exactly.
        __extension__ typedef __int128 wide;
        const wide num = ratio::num, den = ratio::den;
        const wide prod = static_cast<wide>(d.count()) * num;
        wide r = prod / den;
        if (prod % den > 0) ++r;  // round up; truncation already rounds negatives up
        if (r > static_cast<wide>(hi)) return To::max();
        if (r < static_cast<wide>(lo)) return To::min();
        return To{static_cast<to_rep>(r)};
    }
}

// `tp + d`, clamped to [time_point::min(), time_point::max()].
template <class TimePoint, class Rep, class Period>
constexpr TimePoint saturating_add(TimePoint tp, std::chrono::duration<Rep, Period> d) noexcept {
    using dur = typename TimePoint::duration;
    const dur step = saturating_ceil<dur>(d);
    typename dur::rep r;
    if (__builtin_add_overflow(tp.time_since_epoch().count(), step.count(), &r))
        return step.count() > 0 ? TimePoint::max() : TimePoint::min();
    return TimePoint{dur{r}};
}

// `Clock::now() + d`, saturating: the deadline of something delayed by `d` from now.
template <class Clock, class Rep, class Period>
typename Clock::time_point deadline_after(std::chrono::duration<Rep, Period> d) {
    return saturating_add(Clock::now(), d);
}

}  // namespace delayq::detail
