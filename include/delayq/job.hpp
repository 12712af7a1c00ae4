// The vocabulary that the durable job queues share, whatever holds their jobs (a Redis server, an
// SQLite file, a PostgreSQL database): one delivery of a job, one request of a batched put, the
// base of every backend's error family, and the one error family a caller may catch and retry
// whatever the backend. Nothing here depends on a backend.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
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

/// What ack_and_try_take() did, on the backends that have it: whether the ack held (false: the
/// lease was lost, as ack() says), and the next job it leased in the same round trip, if one was
/// due then (it leases as take(0ms) would: never while the queue is paused or a limit is full).
struct ack_take_result {
    bool acked = false;         ///< what ack() would have returned
    std::optional<job> next{};  ///< the job leased after the ack, with a lease of its own
};

/// The longest reason a nack() or bury() keeps, in bytes: a longer one is cut to its first
/// max_reason_size bytes. An exception's what() can be a whole stack trace; the store keeps
/// one per job, written with every failed attempt.
inline constexpr std::size_t max_reason_size = 4096;

/// The last error of a job whose last lease ended with its max_attempts-th delivery: it went to
/// the dead letters because its consumer neither settled it nor extended its lease (it crashed,
/// hung, or lost the store), not because it said why.
inline constexpr std::string_view lease_ended_reason = "its last lease ended";

/// Where a job is, as get() and dead() tell it.
enum class job_state {
    waiting,  ///< queued and not leased: due at job_info::time (maybe already)
    leased,   ///< taken; the lease ends at job_info::time
    dead,     ///< in the dead letters since job_info::time
};

/// A job as the store holds it, for an application or an operator to look at: get(), dead().
struct job_info {
    std::string id;                              ///< the id it was put with
    job_state state = job_state::waiting;        ///< where it is
    std::chrono::system_clock::time_point time;  ///< due (waiting), lease end (leased), died (dead)
    unsigned attempts = 0;                       ///< deliveries so far (0: never taken)
    std::string payload;                         ///< its payload, binary-safe
    std::string last_error;                      ///< the last reason given by nack() or bury()
};

/// A queue's figures at one moment: how many jobs are where, and how far behind its
/// consumers are.
struct queue_stats {
    std::size_t waiting = 0;  ///< queued and not leased, due or not
    std::size_t due_now = 0;  ///< of those, the ones that are due
    std::size_t leased = 0;   ///< taken, their lease not ended
    std::size_t dead = 0;     ///< in the dead letters
    /// How long the oldest due job has been due (0 when none is): how far behind the consumers
    /// are. A queue whose lag grows needs more consumers, or has consumers that stopped.
    std::chrono::milliseconds lag{0};
};

/// One job of a put_many(): put_after(id, payload, delay). The views must outlive the call.
struct put_request {
    std::string_view id;                 ///< the job's id
    std::string_view payload;            ///< its payload, binary-safe
    std::chrono::milliseconds delay{0};  ///< due this long from now
};

/// Limits on the leases of a queue, an option of each queue object (`options.limits`), kept by the
/// store across every process: the store counts the queue's leases, not the object's. A take that
/// a limit holds back waits (it never fails): it is woken when a lease of the queue ends (an ack,
/// nack, bury or cancel by an object with limits, or the lease running out) or when the period
/// turns, and it asks the store no more often than that. Give every object of a queue the same
/// limits: the rate counts the leases made by objects that have one, and an object without limits
/// leases whatever is due.
struct job_limits {
    /// At most this many jobs of the queue leased at once (0: no limit). A lease that ran out
    /// without an ack no longer counts: its job is due again.
    std::size_t max_leased = 0;
    /// At most `rate` leases made in any `period` (a sliding window; 0: no limit).
    std::size_t rate = 0;
    std::chrono::milliseconds period{0};  ///< the window of `rate` (> 0 when rate is set)
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
