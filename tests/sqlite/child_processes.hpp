// Child processes for the SQLite backend's tests: fork() with a body that ends in _exit, pipes to
// talk to them line by line, kill -9, and a look at a file through a plain connection.
//
// fork() only while the test process runs no other thread and holds no SQLite connection: a child
// starts from a clean slate (SQLite's record of the process's locks is per process, and a child
// inherits none of the locks themselves), and ends with _exit, never returning into Catch2.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "catch.hpp"

namespace delayq_sqlite_test {

// One pipe; both ends closed on destruction.
struct channel {
    int fd[2] = {-1, -1};
    channel() { REQUIRE(::pipe(fd) == 0); }
    ~channel() {
        close_read();
        close_write();
    }
    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;
    void close_read() {
        if (fd[0] >= 0) ::close(fd[0]);
        fd[0] = -1;
    }
    void close_write() {
        if (fd[1] >= 0) ::close(fd[1]);
        fd[1] = -1;
    }
    // One line (with its '\n'); atomic on a pipe for lines under PIPE_BUF.
    void say(const std::string& line) const {
        const std::string l = line + "\n";
        const char* p = l.data();
        std::size_t left = l.size();
        while (left > 0) {
            const ssize_t n = ::write(fd[1], p, left);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return;
            p += n;
            left -= static_cast<std::size_t>(n);
        }
    }
    // The next line, without its '\n'; "" at end of file or after `limit`.
    std::string hear(std::chrono::milliseconds limit = std::chrono::seconds(60)) {
        std::string line;
        const auto end = std::chrono::steady_clock::now() + limit;
        for (;;) {
            char c = 0;
            pollfd p{fd[0], POLLIN, 0};
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                end - std::chrono::steady_clock::now());
            if (left <= std::chrono::milliseconds::zero()) return line;
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
            const ssize_t n = ::read(fd[0], &c, 1);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0 || c == '\n') return line;
            line += c;
        }
    }
    // Blocks until every writer closed its end: a start signal for many children at once.
    void wait_closed() const {
        char c = 0;
        while (::read(fd[0], &c, 1) < 0 && errno == EINTR) {
        }
    }
    // Every line until every writer closed its end.
    std::vector<std::string> hear_all() {
        std::vector<std::string> out;
        std::string line;
        char buf[512];
        for (;;) {
            const ssize_t n = ::read(fd[0], buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            for (ssize_t i = 0; i < n; ++i) {
                if (buf[i] != '\n') {
                    line += buf[i];
                    continue;
                }
                out.push_back(line);
                line.clear();
            }
        }
        return out;
    }
};

// Runs `body` in a child process, which ends with _exit(body's result); 99 if it threw.
inline pid_t child(const std::function<int()>& body) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int rc = 99;
        try {
            rc = body();
        } catch (...) {
        }
        std::_Exit(rc);
    }
    return pid;
}

inline int wait_for(pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

inline void kill_9(pid_t pid) {
    ::kill(pid, SIGKILL);
    wait_for(pid);
}

// The file after what happened to it, checked by a plain connection of its own.
inline std::string integrity(const std::string& path) {
    sqlite3* db = nullptr;
    std::string result;
    if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
        sqlite3_exec(
            db, "PRAGMA integrity_check",
            [](void* r, int, char** v, char**) {
                *static_cast<std::string*>(r) += v[0] ? v[0] : "";
                return 0;
            },
            &result, nullptr);
    }
    sqlite3_close(db);
    return result;
}

}  // namespace delayq_sqlite_test
