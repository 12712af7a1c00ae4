// The vocabulary that the durable job queues share, whatever holds their jobs (a Redis server, an
// SQLite file): one delivery of a job, one request of a batched put, and the base of every
// backend's error family. Nothing here depends on a backend.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace delayq {

/// One delivery of a job, as take() hands it out: what ack() and nack() need to prove that the
/// caller still holds the lease.
struct job {
    std::string id;                                  ///< the id it was put with
    std::string payload;                             ///< its payload, binary-safe
    std::chrono::system_clock::time_point deadline;  ///< when this delivery was due
    unsigned attempts = 0;                           ///< 1 at the first delivery
    /// Fencing token of this lease: greater at each lease of the job, so a holder whose lease
    /// ended (and whose job was delivered again) is refused by ack() and nack().
    std::uint64_t token = 0;
    std::chrono::system_clock::time_point lease_deadline;  ///< the lease ends then
};

/// One job of a put_many(): put_after(id, payload, delay). The views must outlive the call.
struct put_request {
    std::string_view id;                 ///< the job's id
    std::string_view payload;            ///< its payload, binary-safe
    std::chrono::milliseconds delay{0};  ///< due this long from now
};

/// The base of every job queue backend's errors (delayq::sqlite::error, ...): the store could not
/// do what was asked. Bad arguments are std::invalid_argument instead.
class queue_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

}  // namespace delayq
