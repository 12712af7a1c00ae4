// delayq's version: the one place it is written. CMake's project() reads the three numbers below
// (CMakeLists.txt), so the package version file, the pkg-config files and the API reference all
// say what this header says; CHANGELOG.md has a section per version.
#pragma once

/// \file
/// The version of delayq, as macros (for `#if`) and as constants. Versions 0.x.y: a new minor
/// version may change the API (CHANGELOG.md says how); a new patch version does not.

#define DELAYQ_VERSION_MAJOR 0  ///< the major version
#define DELAYQ_VERSION_MINOR 1  ///< the minor version: 0.x versions differ in their API
#define DELAYQ_VERSION_PATCH 0  ///< the patch version: fixes only

/// The version as one number, MAJOR × 10000 + MINOR × 100 + PATCH, for `#if DELAYQ_VERSION >= ...`.
#define DELAYQ_VERSION \
    (DELAYQ_VERSION_MAJOR * 10000 + DELAYQ_VERSION_MINOR * 100 + DELAYQ_VERSION_PATCH)

#define DELAYQ_VERSION_STRINGIFY_(x) #x                           ///< (a helper)
#define DELAYQ_VERSION_STRINGIFY(x) DELAYQ_VERSION_STRINGIFY_(x)  ///< (a helper)
/// The version as a string literal, "MAJOR.MINOR.PATCH".
#define DELAYQ_VERSION_STRING                                                        \
    DELAYQ_VERSION_STRINGIFY(DELAYQ_VERSION_MAJOR)                                   \
    "." DELAYQ_VERSION_STRINGIFY(DELAYQ_VERSION_MINOR) "." DELAYQ_VERSION_STRINGIFY( \
        DELAYQ_VERSION_PATCH)

namespace delayq {

inline constexpr int version_major = DELAYQ_VERSION_MAJOR;            ///< DELAYQ_VERSION_MAJOR
inline constexpr int version_minor = DELAYQ_VERSION_MINOR;            ///< DELAYQ_VERSION_MINOR
inline constexpr int version_patch = DELAYQ_VERSION_PATCH;            ///< DELAYQ_VERSION_PATCH
inline constexpr const char* version_string = DELAYQ_VERSION_STRING;  ///< "MAJOR.MINOR.PATCH"

}  // namespace delayq
