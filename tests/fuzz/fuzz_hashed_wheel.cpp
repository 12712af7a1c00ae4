// Model-based fuzzing of hashed_wheel<manual_clock>, the thread-free core of hashed_wheel_timer.
// The driver and the model are in wheel_model.hpp. hashed_wheel promises deadline order (first in,
// first out among equal deadlines) within one advance(), and every task stays cancellable until
// it starts.
#include <delayq/hashed_wheel_timer.hpp>

#include "wheel_model.hpp"

namespace {

using namespace delayq_fuzz;

struct hashed {
    using wheel = delayq::hashed_wheel<mclock>;

    template <class OnError>
    static std::unique_ptr<wheel> make(FuzzedDataProvider& in, rep tick, std::size_t max_pending,
                                       OnError on_error, bool precise) {
        wheel::options o;
        o.tick = duration{tick};
        o.wheel_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(1, 16)
                                        : in.ConsumeIntegralInRange<std::size_t>(1, 4096);
        o.max_pending = max_pending;
        o.on_error = on_error;
        o.precise = precise;
        return std::make_unique<wheel>(std::move(o));
    }

    static void advance(wheel& wh, world& w) {
        const std::size_t n = wh.advance(w.adv_now);
        FZ_CHECK(n == w.log.size());
    }

    static time_point usable_start(time_point t, rep) { return t; }

    static std::size_t pending(const wheel& wh) { return wh.pending(); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    run_wheel<hashed>(in);
    return 0;
}
