// missed_tick: what a periodic task (schedule_every) does after a run that came late.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <cstdint>

namespace delayq {

/// What a periodic task does after a run that came late, past one or more of its due times
/// (schedule_every). With period P, first due at S, the k-th run is due at S + k * P. Whatever the
/// policy, a run whose successor would lie past time_point::max() is the task's last.
enum class missed_tick : std::uint8_t {
    skip,   ///< the default: the next run is due at the first S + k * P after the late run (the
            ///< missed ones are dropped; the grid is kept)
    burst,  ///< every missed run happens, back to back in the same pass (then back on the grid):
            ///< one run per period missed, so a tiny period after a long stall makes a long pass
    delay,  ///< the next run is due P after the late run (the grid moves with it)
};

}  // namespace delayq
