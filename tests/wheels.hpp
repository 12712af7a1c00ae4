// The two thread-free wheels on manual_clock behind one face, for the TEMPLATE_TEST_CASEs that run
// on both: TestType::wheel, and TestType::options(buckets): a 1 ms tick and `buckets` buckets in
// the ring, or in each level (no worker thread: the test drives it).
#pragma once

#include <chrono>
#include <cstddef>
#include <delayq/hashed_wheel_timer.hpp>
#include <delayq/hierarchical_timing_wheel.hpp>
#include <delayq/manual_clock.hpp>

namespace delayq::test {

struct hashed_core {
    using wheel = delayq::hashed_wheel<manual_clock>;
    static wheel::options options(std::size_t buckets = 16) {
        wheel::options o;
        o.tick = std::chrono::milliseconds(1);
        o.wheel_size = buckets;
        return o;
    }
};

struct hierarchical_core {
    using wheel = delayq::hierarchical_wheel<manual_clock>;
    static wheel::options options(std::size_t buckets = 8) {
        wheel::options o;
        o.tick = std::chrono::milliseconds(1);
        o.wheel_size = buckets;
        return o;
    }
};

}  // namespace delayq::test
