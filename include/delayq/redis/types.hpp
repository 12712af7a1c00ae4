// The public types of the Redis backend: the options a queue is made with, and its errors
// (error.hpp). Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. Plain data with no code and nothing beyond the standard library and the job queues'
// shared vocabulary (<delayq/job.hpp>: the job, the put request, the base of the errors, which the
// SQLite and PostgreSQL backends share), so that every part of the backend can name them: the
// queue classes, and the parts under detail/ too. Public headers that detail/ includes, as the
// other backends' detail/ include theirs: moved into detail/, the types would leave the API
// reference, which documents no detail/ header.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "../job.hpp"
#include "error.hpp"

namespace delayq::redis {

/// The options of delay_queue and sharded_delay_queue. Bad values (an empty `name`, a name with
/// `{` or `}`, `lease` or `io_timeout` <= 0, `max_block` < 2 ms, `reclaim_batch` 0, `keep_dead`
/// < 0, `limits` that are not a set of limits) make the queue's constructor throw
/// std::invalid_argument.
struct options {
    std::string host = "127.0.0.1";  ///< a server, or any node of a Redis Cluster
    int port = 6379;                 ///< its port
    std::string name;                ///< the queue; non-empty, no '{' or '}'
    /// How long a taken job is invisible to other consumers before it is delivered again (> 0).
    std::chrono::milliseconds lease = std::chrono::seconds(30);
    /// The limit of one round trip to the server (> 0); beyond it, delayq::redis::error.
    std::chrono::milliseconds io_timeout = std::chrono::seconds(5);
    /// Deliveries before a job that keeps failing goes to the dead letters (its last nack, or its
    /// last lease ending, moves it); 0: redeliver forever. 25 by default, as River and Sidekiq.
    unsigned max_attempts = 25;
    /// The longest a waiting take goes without asking the server, >= 2 ms.
    std::chrono::milliseconds max_block = std::chrono::seconds(5);
    /// Jobs whose last attempt ended that one script call moves to the dead letters, > 0.
    std::size_t reclaim_batch = 100;
    /// How long dead letters are kept (>= 0); 0: for ever. Otherwise every move to the dead
    /// letters also removes up to 10 of those that died more than this long ago, oldest first,
    /// so they stay bounded without a reaper (purge_dead() removes them on demand). Dead letters
    /// of versions before this option existed are never removed by it.
    std::chrono::milliseconds keep_dead{0};
    /// The Redis ACL user to log in as (AUTH user password); empty: `default`, or no AUTH at all
    /// when `password` is empty too. docs/redis.md lists the permissions the user needs.
    std::string user;
    std::string password;  ///< its password (or the server's requirepass, with no user)
    /// Limits on the queue's leases, kept in Redis across every process (delayq::job_limits): a
    /// rate needs a period > 0 and a period a rate, else std::invalid_argument. A
    /// sharded_delay_queue gives each shard its share (the shares add up to each limit, and a
    /// take leases from a shard only within that shard's share), so a limit that is not 0 must
    /// be at least the number of shards, else std::invalid_argument: a shard with a share of 0
    /// would never hand out its jobs.
    delayq::job_limits limits{};
};

/// One delivery of a job, as take() hands it out (delayq::job, the type every backend shares).
/// Times are the server's clock; the fencing token is unique within the job's shard only (see
/// sharded_delay_queue).
using delayq::job;

/// One job of put_many() (delayq::put_request).
using delayq::put_request;

/// A job as get() and dead() show it (delayq::job_info): times are the server's clock.
using delayq::job_info;

/// Where a job is, as get() and dead() tell it (delayq::job_state).
using delayq::job_state;

/// What ack_and_try_take() did (delayq::ack_take_result).
using delayq::ack_take_result;

}  // namespace delayq::redis
