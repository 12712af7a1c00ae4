// The errors of delayq::sqlite: the family that every call of the SQLite job queue throws (besides
// std::invalid_argument for bad arguments), and the one function that throws them, raise(), which
// the parts under detail/ call as well. Part of <delayq/sqlite/delay_queue.hpp>.
//
// One way for every backend: detail/ includes the backend's public error header and throws its
// types (delayq/redis/error.hpp, delayq/postgres/error.hpp likewise); nothing passes a function
// down to throw them.
#include "../detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <string>

#include "../job.hpp"

namespace delayq::sqlite {

/// What went wrong with the queue's file; the subclasses name the problems a caller can act on.
/// `what()` names the file and the problem; code() is SQLite's extended result code (0 when the
/// problem is delayq's own finding).
class error : public queue_error {
  public:
    /// An error saying `what`, with SQLite's extended result code `code` (0: delayq's own).
    error(const std::string& what, int code) : queue_error(what), code_(code) {}
    /// SQLite's extended result code, or 0 when the problem is delayq's own finding.
    int code() const noexcept { return code_; }

  private:
    int code_;
};
/// The file holds something else: not SQLite at all, or another application's database.
class not_a_queue_error : public error {
  public:
    using error::error;  ///< as error's
};
/// The file is a queue of a later format, written by a newer delayq.
class newer_version_error : public error {
  public:
    using error::error;  ///< as error's
};
/// The file is damaged (SQLITE_CORRUPT, a damaged header).
class corrupt_error : public error {
  public:
    using error::error;  ///< as error's
};
/// The disk is full, or the file reached options::max_size or RLIMIT_FSIZE (SQLITE_FULL).
class disk_full_error : public error {
  public:
    using error::error;  ///< as error's
};
/// Another connection held the file's lock for longer than options::busy_timeout (SQLITE_BUSY):
/// nothing of the call was applied, and retrying it is safe. Also a delayq::unavailable_error.
class busy_error : public error, public unavailable_error {
  public:
    using error::error;  ///< as error's
    /// As error's.
    const char* what() const noexcept override { return error::what(); }
};
/// The file (or its directory, for the WAL) cannot be written (SQLITE_READONLY).
class read_only_error : public error {
  public:
    using error::error;  ///< as error's
};

namespace detail {

/// What went wrong, as the error family names it.
enum class problem { other, not_a_queue, newer_version, corrupt, disk_full, busy, read_only };

/// Throws the exception of the family for `p`: `message` names the file and the problem, `code`
/// is SQLite's extended result code (0 when the problem is delayq's own finding).
[[noreturn]] inline void raise(problem p, const std::string& message, int code) {
    switch (p) {
        case problem::not_a_queue:
            throw not_a_queue_error(message, code);
        case problem::newer_version:
            throw newer_version_error(message, code);
        case problem::corrupt:
            throw corrupt_error(message, code);
        case problem::disk_full:
            throw disk_full_error(message, code);
        case problem::busy:
            throw busy_error(message, code);
        case problem::read_only:
            throw read_only_error(message, code);
        case problem::other:
            break;
    }
    throw error(message, code);
}

}  // namespace detail

}  // namespace delayq::sqlite
