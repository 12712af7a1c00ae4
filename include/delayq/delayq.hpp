// delayq: delay queues and timers for C++20. This header brings in every in-process part; the
// job queues have headers of their own: <delayq/redis/delay_queue.hpp>,
// <delayq/sqlite/delay_queue.hpp>, <delayq/postgres/delay_queue.hpp>.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

/// \file
/// The umbrella header: delayed.hpp, manual_clock.hpp, delay_queue.hpp, timeout.hpp,
/// hashed_wheel_timer.hpp, hierarchical_timing_wheel.hpp, coro.hpp and version.hpp (not the job
/// queues, which need hiredis, SQLite or libpq: <delayq/redis/delay_queue.hpp>,
/// <delayq/sqlite/delay_queue.hpp>, <delayq/postgres/delay_queue.hpp>).

#include "delay_queue.hpp"
#include "delayed.hpp"
#include "manual_clock.hpp"
#if __has_include("timeout.hpp")
#include "timeout.hpp"
#endif
#if __has_include("hashed_wheel_timer.hpp")
#include "hashed_wheel_timer.hpp"
#endif
#if __has_include("hierarchical_timing_wheel.hpp")
#include "hierarchical_timing_wheel.hpp"
#endif
#include "coro.hpp"
#include "version.hpp"
