// Helpers for tests about errors: what an exception says.
#pragma once

#include <exception>
#include <string>

#include "catch.hpp"

namespace delayq::test {

// The message of the E that f() throws; fails the test if it throws nothing or something else.
template <class E, class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL("threw another exception: " << e.what());
    }
    FAIL("threw nothing");
    return {};
}

inline bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace delayq::test
