// The WAL as SQLite holds it open: the fsync that makes a durable put durable, through SQLite's
// own file object, and the check that the file it fsynced is still the queue's WAL. Part of
// <delayq/sqlite/delay_queue.hpp>.
//
// Why through SQLite's object. A descriptor of our own on the WAL would be closed some day, and
// closing any descriptor of a file drops every POSIX lock the process holds on it (SQLite's "How
// To Corrupt An SQLite Database File", 2.2). SQLite's own object is the file its commits go to,
// open for as long as the connection is.
//
// Why the check. SQLite's file object stays open on the WAL it opened even if the WAL is removed
// (by a program that does not use SQLite's locks, by `rm`) and another process creates a new one
// at its path: commits would then go to a file nobody will read, and an fsync of it would promise
// nothing. On Linux /proc/self/fd names each descriptor of the process, and one whose file was
// removed reads "<path> (deleted)": the descriptors of the WAL are found once, and each sync reads
// their names again (one readlink each). Without /proc, the check is that a file is at the path.
//
// Threads. The first sync() also fsyncs the WAL's directory and clears a flag in SQLite's file
// object that SQLite's own calls read: the owner makes it under the connection's mutex; later ones
// run outside it, one at a time, while other threads commit (an fsync and writes of one file may
// run at once).
#pragma once

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "handle.hpp"

namespace delayq::sqlite::detail {

class wal_file {
  public:
    /// Whether the first sync() was made (then the others may run outside the mutex).
    bool ready() const noexcept { return wal_ != nullptr; }

    /// fsyncs the WAL; throws (problem::disk_full or other) if it failed or if the WAL is no
    /// longer the file at its path. The first call must hold the connection's mutex.
    void sync(database& db) {
        if (wal_ == nullptr) {
            sqlite3_file* wal = nullptr;
            if (sqlite3_file_control(db.get(), "main", SQLITE_FCNTL_JOURNAL_POINTER, &wal) !=
                    SQLITE_OK ||
                wal == nullptr || wal->pMethods == nullptr)
                db.fail(problem::other, "cannot fsync the WAL: SQLite has none open");
            if (sqlite3_file_control(db.get(), "main", SQLITE_FCNTL_FILE_POINTER, &main_) !=
                    SQLITE_OK ||
                main_ == nullptr || main_->pMethods == nullptr)
                main_ = nullptr;
            path_ = sqlite3_filename_wal(sqlite3_db_filename(db.get(), "main"));
            std::error_code ec;
            auto real = std::filesystem::canonical(path_, ec);
            if (!ec) path_ = real.string();
            fsync(db, wal);
            wal_ = wal;
            find_descriptors();
        } else {
            fsync(db, wal_);
        }
        check(db);
    }

  private:
    void fsync(database& db, sqlite3_file* f) {
        const int rc = f->pMethods->xSync(f, SQLITE_SYNC_NORMAL | SQLITE_SYNC_DATAONLY);
        if (rc == SQLITE_OK) return;
        int e = 0;
        f->pMethods->xFileControl(f, SQLITE_FCNTL_LAST_ERRNO, &e);
        const bool full = e == ENOSPC || e == EDQUOT || e == EFBIG;
        db.fail(full ? problem::disk_full : problem::other,
                std::string(full ? "the disk is full (" : "") + "fsync of the WAL failed: " +
                    std::system_category().message(e) + (full ? ")" : ""),
                rc);
    }

    // What /proc/self/fd/<fd> names; "" if nothing.
    static std::string name_of(int fd) {
        std::error_code ec;
        auto name = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
        return ec ? std::string() : name.string();
    }

    // The descriptors of this process that name the WAL (SQLite's among them).
    void find_descriptors() {
        fds_.clear();
        std::error_code ec;
        for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
             it.increment(ec)) {
            const std::string n = it->path().filename().string();
            char* stop = nullptr;
            const long fd = std::strtol(n.c_str(), &stop, 10);
            if (stop == n.c_str() || *stop != '\0') continue;
            const std::string name = name_of(static_cast<int>(fd));
            if (name == path_ || name == path_ + deleted) fds_.push_back(static_cast<int>(fd));
        }
    }

    void check(database& db) {
        int moved = 0;
        if (wal_removed(true) ||
            (main_ != nullptr &&
             main_->pMethods->xFileControl(main_, SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK &&
             moved != 0))
            db.fail(problem::other,
                    "the file or its WAL was removed or replaced while the queue had it open "
                    "(not through SQLite): the last commits are not on disk; reopen the queue");
    }

    bool wal_removed(bool may_look_again) {
        if (fds_.empty()) {
            struct stat st {};
            return ::stat(path_.c_str(), &st) != 0 && errno == ENOENT;
        }
        for (const int fd : fds_) {
            const std::string name = name_of(fd);
            if (name == path_ + deleted) return true;
            if (name != path_ && may_look_again) {
                // Another object of the process closed its descriptor (and the number may have
                // been reused): look again, once.
                find_descriptors();
                return wal_removed(false);
            }
        }
        return false;
    }

    static constexpr const char* deleted = " (deleted)";

    sqlite3_file* wal_ = nullptr;   // SQLite's object of the WAL, once synced
    sqlite3_file* main_ = nullptr;  // and of the database file
    std::string path_;              // the WAL's path, symbolic links resolved
    std::vector<int> fds_;          // the descriptors of the WAL, as /proc/self/fd names them
};

}  // namespace delayq::sqlite::detail
