// The errors of delayq::redis: the family that every call of the Redis job queue throws (besides
// std::invalid_argument for bad arguments). Part of <delayq/redis/delay_queue.hpp>.
//
// One way for every backend: detail/ includes the backend's public error header and throws its
// types (delayq/sqlite/error.hpp, delayq/postgres/error.hpp likewise).
#include "../detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <string>
#include <utility>

#include "../job.hpp"

namespace delayq::redis {

/// A server or connection problem: the message names the command and carries the server's own
/// words, or says what went wrong with the connection (connection_error, below).
class error : public delayq::queue_error {
  public:
    using queue_error::queue_error;
};

/// The server could not be reached, the connection broke, or no answer came within io_timeout;
/// or the server (or the cluster) could not serve the queue's keys for as long (LOADING,
/// CLUSTERDOWN, MASTERDOWN, TRYAGAIN, no node for the slot). The call may have run; retrying it
/// is safe. Also a delayq::unavailable_error.
class connection_error : public error, public unavailable_error {
  public:
    using error::error;  ///< as error's
    /// As error's.
    const char* what() const noexcept override { return error::what(); }
};

/// The queue's keys on the server were written in an older key layout, which this version does
/// not read (docs/redis.md, "Upgrading"). Nothing was changed: the jobs are still there for the
/// version that wrote them. version() names that layout ("v2").
class layout_error : public error {
  public:
    /// An error saying `what`, about a queue in key layout `version`.
    layout_error(const std::string& what, std::string version)
        : error(what), version_(std::move(version)) {}
    /// The layout the queue's keys are in ("v2").
    const std::string& version() const noexcept { return version_; }

  private:
    std::string version_;
};

}  // namespace delayq::redis
