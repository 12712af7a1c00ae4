// Catch2 2.x: the runner's main() is compiled once here, not in every test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
