// Model-based fuzzing of hierarchical_wheel<manual_clock>, the thread-free core of
// hierarchical_timing_wheel: the caller drives advance(). The driver and the model are in
// wheel_model.hpp. Like the hashed wheel, it promises deadline order (first in, first out among
// equal deadlines) within one pass, and every task stays cancellable until it starts: a cancel()
// from a task is true exactly when the target has not run yet.
#include <delayq/hierarchical_timing_wheel.hpp>

#include "wheel_model.hpp"

namespace {

using namespace delayq_fuzz;

struct hierarchical {
    using wheel = delayq::hierarchical_wheel<mclock>;

    template <class OnError>
    static std::unique_ptr<wheel> make(FuzzedDataProvider& in, rep tick, std::size_t max_pending,
                                       OnError on_error, bool precise) {
        wheel::options o;
        o.tick = duration{tick};
        o.wheel_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(2, 8)
                                        : in.ConsumeIntegralInRange<std::size_t>(2, 64);
        o.max_pending = max_pending;
        o.on_error = on_error;
        o.precise = precise;
        return std::make_unique<wheel>(std::move(o));
    }

    // One pass at the model's time (tasks that tasks schedule due now run in the next pass).
    static void advance(wheel& wh, world& w) {
        const std::size_t n = wh.advance(w.adv_now);
        FZ_CHECK(n == w.log.size());
    }

    // This target found a signed overflow for a start within one tick of time_point::min() (the
    // origin's rounding; fixed in d0d47e6), then that with the origin at time_point::min() a
    // deadline of time_point::max() ran 1 ns early (docs/misuse.md, finding 4; fixed since): the
    // clock may start anywhere.
    static time_point usable_start(time_point t, rep) { return t; }

    static std::size_t pending(const wheel& wh) { return wh.pending(); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    run_wheel<hierarchical>(in);
    return 0;
}
