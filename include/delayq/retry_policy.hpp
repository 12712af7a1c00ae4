// delayq::retry_policy: how long a failed job waits before its next attempt. Exponential backoff:
// the n-th failure waits up to base * 2^(n-1), never more than cap, with jitter spreading the
// retries of jobs that failed together (a store or a service that went down for all of them) so
// that they do not all come back at the same moment and fail together again.
//
// Full jitter (a delay drawn uniformly from [0, backoff]) is the default: of the usual choices it
// spreads retries most, and so finishes a burst of failures with the fewest calls, at the price of
// some retries coming back early (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
// Equal jitter keeps at least half of the backoff; none keeps all of it.
//
// The policy is a pure function of the attempt and a random number, so a test can pin the number;
// delayq::worker draws it.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>

namespace delayq {

/// How a retry_policy spreads its delays.
enum class jitter {
    none,   ///< the backoff itself
    equal,  ///< half the backoff, plus up to the other half
    full,   ///< anything from 0 to the backoff
};

/// Exponential backoff with a base, a cap and jitter: the delay before the attempt that follows
/// the failure of attempt n (1 at the first delivery).
struct retry_policy {
    std::chrono::milliseconds base = std::chrono::seconds(1);  ///< the first failure's backoff
    std::chrono::milliseconds cap = std::chrono::hours(1);     ///< no backoff beyond this
    delayq::jitter jitter = jitter::full;                      ///< how the delay is spread

    /// Throws std::invalid_argument unless 0 <= base <= cap.
    void check() const {
        if (base < std::chrono::milliseconds::zero())
            throw std::invalid_argument("delayq::retry_policy: base must not be negative");
        if (cap < base) throw std::invalid_argument("delayq::retry_policy: cap must be >= base");
    }

    /// The backoff after the failure of attempt `attempt` (0 counts as 1): min(cap, base *
    /// 2^(attempt-1)), without jitter.
    constexpr std::chrono::milliseconds backoff(unsigned attempt) const noexcept {
        auto d = std::max(base, std::chrono::milliseconds::zero());
        for (unsigned n = 1; n < attempt && d < cap; ++n)
            d = d > cap / 2 ? cap : d * 2;  // doubled at most while below cap: no overflow
        return std::min(d, cap);
    }

    /// The delay after the failure of attempt `attempt`, with `random` (any 64-bit number, drawn
    /// uniformly) choosing the point of the jitter's range.
    constexpr std::chrono::milliseconds delay(unsigned attempt,
                                              std::uint64_t random) const noexcept {
        const auto b = backoff(attempt);
        const auto span = [&](std::chrono::milliseconds width) {
            const auto w = static_cast<std::uint64_t>(width.count());
            return std::chrono::milliseconds(
                static_cast<std::chrono::milliseconds::rep>(w == 0 ? 0 : random % (w + 1)));
        };
        switch (jitter) {
            case delayq::jitter::none:
                return b;
            case delayq::jitter::equal:
                return b - b / 2 + span(b / 2);
            case delayq::jitter::full:
                break;
        }
        return span(b);
    }
};

}  // namespace delayq
