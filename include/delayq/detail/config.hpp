// The first include of every public header: compiled as anything older than C++20 (g++ 12's
// default is C++17, and the pkg-config files' flags carry no -std), delayq stops at one line that
// says so, instead of going on into pages of errors from the code after it (std::span, concepts).
#pragma once

// Newer than C++17 passes: MSVC says so in _MSVC_LANG (its __cplusplus stays 199711L without
// /Zc:__cplusplus).
#if __cplusplus <= 201703L && !(defined(_MSVC_LANG) && _MSVC_LANG > 201703L)
#error \
    "delayq needs C++20: compile with -std=c++20 (or CMake: target_compile_features(... cxx_std_20))"
// MSVC stops at an #error; g++ and clang++ go on, into the errors of every header after this one.
// An include that cannot be found is fatal to them, so it stops them here.
#include <delayq: compilation stopped, see the error above>
#endif
