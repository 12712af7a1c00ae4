// The errors of delayq::postgres: the family that every call of the PostgreSQL job queue throws
// (besides std::invalid_argument for bad arguments), and the one function that throws them,
// raise(), which the parts under detail/ call as well. Part of <delayq/postgres/delay_queue.hpp>.
//
// One way for every backend: detail/ includes the backend's public error header and throws its
// types (delayq/redis/error.hpp, delayq/sqlite/error.hpp likewise); nothing passes a function
// down to throw them.
#include "../detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <string>
#include <utility>

#include "../job.hpp"

namespace delayq::postgres {

/// A server or connection problem. `what()` names what the call was doing and carries the
/// server's own words; sqlstate() is the server's SQLSTATE (empty when the problem is not the
/// server's answer).
class error : public queue_error {
  public:
    /// An error saying `what`, with SQLSTATE `sqlstate`.
    error(const std::string& what, std::string sqlstate)
        : queue_error(what), sqlstate_(std::move(sqlstate)) {}
    /// The server's SQLSTATE, or empty.
    const std::string& sqlstate() const noexcept { return sqlstate_; }

  private:
    std::string sqlstate_;
};
/// The connection could not be made, broke, or the server did not answer within io_timeout (or
/// is shutting down, restarting, or not yet accepting connections), or no pooled connection was
/// free within io_timeout, or the server stopped the statement at its limit (SQLSTATE 57014:
/// not applied). The call may have been applied; retrying it is safe (see "Connections" above).
/// Also a delayq::unavailable_error.
class connection_error : public error, public unavailable_error {
  public:
    using error::error;  ///< as error's
    /// As error's.
    const char* what() const noexcept override { return error::what(); }
};
/// The schema holds delayq tables of another version (see "Upgrading" in docs/postgres.md).
class schema_version_error : public error {
  public:
    using error::error;  ///< as error's
};
/// The server refused a statement for a missing privilege (SQLSTATE 42501); what() names it.
class permission_error : public error {
  public:
    using error::error;  ///< as error's
};
/// The server is older than PostgreSQL 12.
class server_version_error : public error {
  public:
    using error::error;  ///< as error's
};

namespace detail {

/// What went wrong, as the error family names it.
enum class problem { other, connection, schema_version, permission, server_version };

// What the queue says when its connections do not each have a server session of their own.
inline constexpr const char* pooler_message =
    "a connection pooler in transaction or statement mode (e.g. pgbouncer pool_mode=transaction) "
    "sits between the queue and the server: its connections do not keep a server session of "
    "their own, so LISTEN and the connection's settings do not hold; connect to the server, or "
    "through a pooler in session mode (see \"Connection poolers\" in docs/postgres.md)";

/// Throws the exception of the family for `p`: `what` says what the call was doing and what
/// went wrong, `sqlstate` is the server's SQLSTATE, or empty.
[[noreturn]] inline void raise(problem p, const std::string& what, const std::string& sqlstate) {
    std::string m = "delayq::postgres: " + what;
    if (sqlstate == "26000")  // a statement the connection prepared is not there
        m += std::string(" (") + pooler_message + ")";
    switch (p) {
        case problem::connection:
            throw connection_error(m, sqlstate);
        case problem::schema_version:
            throw schema_version_error(m, sqlstate);
        case problem::permission:
            throw permission_error(m, sqlstate);
        case problem::server_version:
            throw server_version_error(m, sqlstate);
        case problem::other:
            break;
    }
    throw error(m, sqlstate);
}

}  // namespace detail

}  // namespace delayq::postgres
