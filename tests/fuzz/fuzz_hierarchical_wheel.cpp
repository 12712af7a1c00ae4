// Model-based fuzzing of hierarchical_timing_wheel<manual_clock> with own_thread = false: the
// caller drives advance_clock(). The driver and the model are in wheel_model.hpp. The wheel does
// not promise an order among the tasks of one advance, but every task stays cancellable until it
// starts: a cancel() from a task is true exactly when the target has not run yet.
#include <delayq/hierarchical_timing_wheel.hpp>

#include "wheel_model.hpp"

namespace {

using namespace delayq_fuzz;

struct hierarchical {
    using wheel = delayq::hierarchical_timing_wheel<mclock>;
    static constexpr bool ordered = false;
    static constexpr bool exact_cancel = true;
    // This target found that a refused schedule destroyed the task; fixed in d0d47e6.
    static constexpr bool keeps_task_at_max_pending = true;

    template <class OnError>
    static std::unique_ptr<wheel> make(FuzzedDataProvider& in, rep tick, std::size_t max_pending, OnError on_error) {
        wheel::options o;
        o.tick = duration{tick};
        o.wheel_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(2, 8)
                                        : in.ConsumeIntegralInRange<std::size_t>(2, 64);
        o.max_pending = max_pending;
        o.on_error = on_error;
        o.own_thread = false;
        return std::make_unique<wheel>(std::move(o));
    }

    // advance_clock(0) runs what is due without blocking; tasks that tasks schedule due now run
    // in the next call, so call it until it has nothing left.
    static void advance(wheel& wh, world&) {
        for (int i = 0;; ++i) {
            FZ_CHECK(i < 1000);
            if (!wh.advance_clock(duration::zero())) break;
        }
    }

    // This target found a signed overflow for a start within one tick of time_point::min() (the
    // origin's rounding); fixed in d0d47e6. It then found that with the origin at
    // time_point::min(), a deadline of time_point::max() maps to tick 2^64 - 2, one tick before it
    // (to_ticks clamps), so the task runs early (docs/misuse.md, finding 4; test_misuse
    // "[finding]"). Until that is fixed the clock starts two ticks above time_point::min();
    // compile with -DDELAYQ_FUZZ_HTW_MIN_START to fuzz that corner too.
    static time_point usable_start(time_point t, rep tick) {
#ifndef DELAYQ_FUZZ_HTW_MIN_START
        const time_point floor = time_point{duration{std::numeric_limits<rep>::min() + 2 * tick}};
        if (t < floor) return floor;
#else
        (void)tick;
#endif
        return t;
    }

    static std::size_t pending(const wheel& wh) { return wh.size(); }

    static void check_idle(const wheel& wh, const world&, rep) {
        FZ_CHECK(wh.levels() >= 1 && wh.levels() <= 66);  // at most one level per bit of a tick count
        FZ_CHECK(wh.current_time() <= mclock::now());
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    run_wheel<hierarchical>(in);
    return 0;
}
