// Time as the job queues store it (Redis, SQLite and PostgreSQL alike): whole milliseconds since
// the system clock's epoch. Going in, a time point is rounded up and a delay clamped, so that
// nothing is ever due early and every sum stays below max_ms; coming out, milliseconds become a
// system_clock time point, rounded up.
#pragma once

#include <algorithm>
#include <chrono>

#include "time.hpp"

namespace delayq::detail {

// "No deadline": the latest due time or lease end a queue stores. Below 10^14 ms (year 5138) a
// count is exact in a double, so in every format Lua uses, and a lease end added to one never
// overflows. The one spelling of it: the Redis scripts' prelude is made from it too.
inline constexpr long long max_ms = 99'999'999'999'999LL;

// `tp` in ms since the epoch, rounded up, clamped to [0, max_ms].
inline long long to_ms(std::chrono::system_clock::time_point tp) {
    const long long ms = saturating_ceil<std::chrono::milliseconds>(tp.time_since_epoch()).count();
    return std::clamp(ms, 0LL, max_ms);
}

// ms since the epoch as a time point, rounded up.
inline std::chrono::system_clock::time_point from_ms(long long ms) {
    return std::chrono::system_clock::time_point(
        saturating_ceil<std::chrono::system_clock::duration>(std::chrono::milliseconds(ms)));
}

// A delay clamped to [0, max_ms].
inline long long clamp_delay(std::chrono::milliseconds d) {
    return std::clamp<long long>(d.count(), 0, max_ms);
}

}  // namespace delayq::detail
