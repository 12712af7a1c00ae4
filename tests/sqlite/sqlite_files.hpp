// Temporary queue files for the SQLite backend's tests, and the contract suite's fixture.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <delayq/sqlite/delay_queue.hpp>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>

namespace delayq_contract {
struct settings;  // tests/contract/job_queue_contract.hpp, included after the fixture list
}

namespace delayq_sqlite_test {

// A fresh directory under the system's temporary one, removed (with everything in it) at the end.
class temp_dir {
  public:
    temp_dir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "delayq-sqlite-XXXXXX");
        if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
        path_ = pattern;
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    const std::filesystem::path& path() const noexcept { return path_; }
    std::string file(const char* name = "queue.db") const { return (path_ / name).string(); }

  private:
    std::filesystem::path path_;
};

// Options for a queue in `path`, with a short foreign_changes so that the tests that wait for
// another process's put do not wait long.
inline delayq::sqlite::options opts(const std::string& path) {
    delayq::sqlite::options o;
    o.path = path;
    o.foreign_changes = std::chrono::milliseconds(50);
    return o;
}

// The contract suite's fixture: a queue in a fresh temporary file; make() opens another handle on
// it, as another process would.
struct fixture {
    using queue = delayq::sqlite::delay_queue;
    temp_dir dir;
    template <class Settings = delayq_contract::settings>
    std::unique_ptr<queue> make(const Settings& s) {
        auto o = opts(dir.file());
        o.lease = s.lease;
        o.max_attempts = s.max_attempts;
        o.keep_dead = s.keep_dead;
        o.limits = s.limits;
        return std::make_unique<queue>(o);
    }
};

}  // namespace delayq_sqlite_test
