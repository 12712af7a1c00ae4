// The Postgres tests' shared pieces: one private server for the whole test process (started on
// first use, from the main thread, which lives as long as the process), fresh queue names, and
// the contract suite's fixture.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <delayq/postgres/delay_queue.hpp>
#include <memory>
#include <string>

#include "pg_server.hpp"

namespace delayq_contract {
struct settings;  // tests/contract/job_queue_contract.hpp, included after the fixture list
}

namespace delayq_pg_test {

/// The test process's server.
inline pg_server& server() {
    static pg_server s;
    return s;
}

/// A queue name no other test of this process (or another process) used.
inline std::string fresh_name(const char* prefix = "q") {
    static std::atomic<unsigned> n{0};
    return std::string(prefix) + "-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
}

/// Options for queue `name` on the test server.
inline delayq::postgres::options opts(const std::string& name, pg_server& s = server()) {
    delayq::postgres::options o;
    o.conninfo = s.conninfo();
    o.name = name;
    return o;
}

/// The contract suite's fixture: a fresh queue on the process's server; make() opens another
/// object on it, as another process would.
struct fixture {
    using queue = delayq::postgres::delay_queue;
    std::string name = fresh_name("contract");
    template <class Settings = delayq_contract::settings>
    std::unique_ptr<queue> make(const Settings& s) {
        auto o = opts(name);
        o.lease = s.lease;
        o.max_attempts = s.max_attempts;
        o.keep_dead = s.keep_dead;
        o.limits = s.limits;
        return std::make_unique<queue>(o);
    }
};

}  // namespace delayq_pg_test
