// The vocabulary that the durable job queues share, whatever holds their jobs (a Redis server, an
// SQLite file, a PostgreSQL database): one delivery of a job, one request of a batched put, the
// base of every backend's error family, and the one error family a caller may catch and retry
// whatever the backend. Nothing here depends on a backend.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace delayq {

/// The longest job id a job queue takes, in bytes (an id is also never empty): beyond it, every
/// call that names the id throws std::invalid_argument. One key of the store's index (a b-tree
/// key in SQLite and PostgreSQL, a sorted set member in Redis), written with every job.
inline constexpr std::size_t max_id_size = 1024;

/// The most jobs that one take_many() leases, whatever it asks for: one short transaction (one
/// statement, one script call) that holds the store for a bounded time.
inline constexpr std::size_t max_take_many = 500;

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

/// The store could not serve the call now, and a later call may succeed: it could not be reached,
/// did not answer within the call's timeout, or another connection held it for too long
/// (delayq::redis::connection_error, delayq::postgres::connection_error,
/// delayq::sqlite::busy_error). Every such exception is also its backend's error, so a
/// queue_error, and a std::exception.
///
/// Retrying the call is safe: it was applied whole or not at all, and a retry of one that was
/// applied is told so by the queue's own rules (a put of a queued id returns false, an ack of a
/// settled lease returns false, a take that was applied left its jobs leased until their lease
/// ends, when they are delivered again).
///
/// Catch it by this type to retry whatever the backend:
///
///     try { q.put_after(id, payload, 30min); }
///     catch (const delayq::unavailable_error& e) { log(e.what()); retry_later(); }
class unavailable_error {
  public:
    unavailable_error() = default;                                     ///< (a base only)
    unavailable_error(const unavailable_error&) = default;             ///< copyable
    unavailable_error& operator=(const unavailable_error&) = default;  ///< copyable
    unavailable_error(unavailable_error&&) = default;                  ///< movable
    unavailable_error& operator=(unavailable_error&&) = default;       ///< movable
    virtual ~unavailable_error() = default;                            ///< (a base only)
    /// The message of the backend's exception that this is (its std::exception::what()).
    virtual const char* what() const noexcept = 0;
};

}  // namespace delayq
