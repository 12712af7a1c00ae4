// The behaviour suite of delayq::job_queue (tests/contract/) against delayq::redis::delay_queue,
// on a redis-server of the test's own; the SQLite backend runs the same suite
// (tests/sqlite/test_sqlite_contract.cpp).
#include <delayq/redis/delay_queue.hpp>
#include <memory>
#include <tuple>

#include "redis_server.hpp"

namespace delayq_contract {
struct settings;
}

// A fresh server per test case; every make() opens another object on the same queue, as another
// process would.
struct redis_fixture {
    using queue = delayq::redis::delay_queue;
    delayq_test::redis_server server;

    template <class Settings = delayq_contract::settings>
    std::unique_ptr<queue> make(const Settings& s) {
        auto o = delayq_test::opts(server);
        o.lease = s.lease;
        o.max_attempts = s.max_attempts;
        o.keep_dead = s.keep_dead;
        o.limits = s.limits;
        return std::make_unique<queue>(o);
    }
};

using delayq_contract_fixtures = std::tuple<redis_fixture>;

#include "contract/job_queue_contract.hpp"
