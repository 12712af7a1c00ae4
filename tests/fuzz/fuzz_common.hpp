// Shared by the model-based fuzz targets: reading operations from the input, picking times that
// reach the corners of the time line, and failing loudly.
//
// Each target reads its input as a sequence of operations with FuzzedDataProvider, applies each to
// the structure and to a plain reference model, and compares them after every step; any difference
// is reported on stderr and abort()s, so libFuzzer keeps the input as a crash artifact.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <delayq/manual_clock.hpp>
#include <limits>

namespace delayq_fuzz {

using mclock = delayq::manual_clock;
using time_point = mclock::time_point;
using duration = mclock::duration;
using rep = duration::rep;

[[noreturn]] inline void fail(const char* file, int line, const char* what) {
    std::fprintf(stderr, "\n*** model mismatch at %s:%d: %s\n", file, line, what);
    std::fflush(stderr);
    std::abort();
}

#define FZ_CHECK(cond)                                               \
    do {                                                             \
        if (!(cond)) ::delayq_fuzz::fail(__FILE__, __LINE__, #cond); \
    } while (false)

// a + b, clamped to the time line (the library's own saturating add is what is tested; this one is
// written independently).
inline time_point sat_add(time_point a, rep b) {
    rep r;
    if (__builtin_add_overflow(a.time_since_epoch().count(), b, &r))
        return b > 0 ? time_point::max() : time_point::min();
    return time_point{duration{r}};
}

// A deadline relative to `now`, `scale` being the structure's natural unit (a tick): mostly near
// now, sometimes far, sometimes at the ends of the time line.
inline time_point pick_deadline(FuzzedDataProvider& in, time_point now, rep scale) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0:
        case 1:
        case 2:  // within a few ticks, either side of a boundary
            return sat_add(now, in.ConsumeIntegralInRange<rep>(-2, 40) * scale +
                                    in.ConsumeIntegralInRange<rep>(-1, 1));
        case 3:  // exactly n ticks
            return sat_add(now, in.ConsumeIntegralInRange<rep>(0, 64) * scale);
        case 4:  // sub-tick
            return sat_add(now, in.ConsumeIntegralInRange<rep>(0, scale));
        case 5:  // a few rotations/levels away
            return sat_add(now, static_cast<rep>(in.ConsumeIntegral<std::uint16_t>()) * scale);
        case 6:  // far
            return sat_add(now, static_cast<rep>(in.ConsumeIntegral<std::uint32_t>()) * scale);
        case 7:  // the past
            return sat_add(now, -static_cast<rep>(in.ConsumeIntegral<std::uint16_t>()));
        case 8:  // the ends of the time line
            switch (in.ConsumeIntegralInRange<int>(0, 3)) {
                case 0:
                    return time_point::max();
                case 1:
                    return time_point::min();
                case 2:
                    return time_point{duration{std::numeric_limits<rep>::max() -
                                               in.ConsumeIntegralInRange<rep>(0, 3 * scale)}};
                default:
                    return time_point{duration{std::numeric_limits<rep>::min() +
                                               in.ConsumeIntegralInRange<rep>(0, 3 * scale)}};
            }
        default:  // anywhere
            return time_point{duration{in.ConsumeIntegral<rep>()}};
    }
}

// How far to move the clock: mostly a tick or so, sometimes a jump, rarely to the end of time.
inline rep pick_advance(FuzzedDataProvider& in, rep scale) {
    switch (in.ConsumeIntegralInRange<int>(0, 7)) {
        case 0:
        case 1:
        case 2:
            return in.ConsumeIntegralInRange<rep>(0, 2 * scale);
        case 3:
            return in.ConsumeIntegralInRange<rep>(0, 8) * scale;
        case 4:
            return in.ConsumeIntegralInRange<rep>(0, 4) * scale +
                   in.ConsumeIntegralInRange<rep>(-1, 1);
        case 5:
            return static_cast<rep>(in.ConsumeIntegral<std::uint16_t>()) * scale;
        case 6:
            return static_cast<rep>(in.ConsumeIntegral<std::uint32_t>());
        default:
            return in.ConsumeIntegralInRange<int>(0, 7) == 0
                       ? std::numeric_limits<rep>::max()
                       : static_cast<rep>(in.ConsumeIntegral<std::uint64_t>() >> 2);
    }
}

// The clock starts somewhere: zero, near either end, or anywhere.
inline time_point pick_start(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
            return time_point{};
        case 1:
            return time_point{
                duration{std::numeric_limits<rep>::min() + in.ConsumeIntegral<std::uint16_t>()}};
        case 2:
            return time_point{
                duration{std::numeric_limits<rep>::max() - in.ConsumeIntegral<std::uint32_t>()}};
        default:
            return time_point{duration{in.ConsumeIntegral<rep>()}};
    }
}

}  // namespace delayq_fuzz
