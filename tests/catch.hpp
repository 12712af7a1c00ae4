// One include for Catch2 v2 (single header, Debian's `catch2`) and v3 (split headers).
#pragma once
#ifdef DELAYQ_CATCH_V3
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
