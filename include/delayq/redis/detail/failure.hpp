// The failures of the layers under the Redis queue (the link, the router, the scripts), apart from
// the public errors (delayq/redis/error.hpp) that the queue turns them into: a call that sent
// nothing (which the router may send elsewhere), a connection's failure with its cause apart (which
// a link names for each of its callers), and each caller's own copy of a failure that answers
// several. Part of <delayq/redis/delay_queue.hpp>.
#pragma once

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "../../detail/job_queue/exception_copy.hpp"
#include "../error.hpp"

namespace delayq::redis::detail {

/// Nothing was sent: the connection could not be made, or the call ran out of time before it was
/// written. Safe to retry, elsewhere too.
class unsent_error : public connection_error {
  public:
    using connection_error::connection_error;
};

// What a connection throws: the whole message, and its end (why) apart, so that a link can name
// each of its callers' own commands.
class io_failure : public connection_error {
  public:
    io_failure(const std::string& what, std::string why, bool unsent)
        : connection_error("delayq::redis: " + what + why), why_(std::move(why)), unsent_(unsent) {}
    const std::string& why() const noexcept { return why_; }
    bool unsent() const noexcept { return unsent_; }
    /// The same failure with a message of its own (copy_of() says why).
    io_failure deep_copy() const { return io_failure(std::string(what()), why_, unsent_, 0); }

  private:
    io_failure(const std::string& whole, std::string why, bool unsent, int)
        : connection_error(whole), why_(std::move(why)), unsent_(unsent) {}

    std::string why_;  // " timed out after 300 ms (io_timeout)", ": Connection reset by peer"
    bool unsent_;
};

// A copy of the exception in `e`, for one of several callers that a failure answers (the calls of
// a merged call, the calls that waited for one slot map reload): each its own object, with a
// message of its own (delayq/detail/job_queue/exception_copy.hpp says why). These are the types a
// call of the link, the router and the scripts throws; anything else is shared as it is.
inline std::exception_ptr copy_of(const std::exception_ptr& e) noexcept {
    return delayq::detail::copy_for_caller<layout_error, unsent_error, io_failure, connection_error,
                                           error>(e, [](const auto& x) {
        using type = std::remove_cvref_t<decltype(x)>;
        if constexpr (std::is_same_v<type, layout_error>)
            return layout_error(std::string(x.what()), x.version());
        else if constexpr (std::is_same_v<type, io_failure>)
            return x.deep_copy();
        else
            return type(std::string(x.what()));
    });
}

}  // namespace delayq::redis::detail
