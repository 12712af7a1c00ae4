// bench/ab: two revisions of delayq in one process, their rounds alternated (see main.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace ab {

/// One side's structure under one workload: round() times one batch, in ns per operation
/// (< 0: no such workload).
struct rounds {
    virtual ~rounds() = default;
    virtual double round() = 0;
};

}  // namespace ab

std::unique_ptr<ab::rounds> make_base(const std::string& structure, const std::string& workload,
                                      std::size_t n);
std::unique_ptr<ab::rounds> make_work(const std::string& structure, const std::string& workload,
                                      std::size_t n);
