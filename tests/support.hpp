// Small helpers shared by the tests.
#pragma once

#include <chrono>
#include <thread>

namespace delayq::test {

// Waits (in real time, by yielding) until pred() holds; false if it still does not after `limit`.
// Used only to let other threads reach a state; an assertion on the result can fail.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::yield();
    }
    return true;
}

}  // namespace delayq::test
