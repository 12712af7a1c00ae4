// delayq::redis::delay_queue and delayq::redis::sharded_delay_queue: delay queues shared through
// Redis (or Valkey), one server or a Redis Cluster, by many producers and consumers on many
// machines. Needs hiredis (0.14 or 1.x) and Redis >= 6.0 or Valkey. docs/redis.md has the whole
// story; this header is what users include.
//
// The idea. A job's state lives in the server and changes only inside Lua scripts, one script per
// change, run whole: no crash between two steps can lose or duplicate a job (Sidekiq's and
// Redisson's losses came from multi-step moves). Due-ness is judged by the server's clock alone.
// Delivery is at least once, with leases and fencing tokens: a consumer that dies holding a job
// has it delivered again when its lease ends; an ack from a holder whose lease ended is refused.
// The code falls apart along these seams, one header each (detail/ holds what users never name):
//
//   types.hpp                 the public types: options, job, error
//   detail/connection.hpp     the wire: a hiredis connection; a link that the threads of an object
//                             share and that sends what they send together in one write; the
//                             subscriber that waiting consumers listen on
//   detail/cluster.hpp        which node serves a slot: one server, or a Redis Cluster's slot map,
//                             its MOVED and ASK redirections and its failovers
//   detail/scripts.hpp        the Lua scripts, the key layout and a job's states and transitions
//   detail/script_client.hpp  running the scripts on an object's shards (EVALSHA, NOSCRIPT), and
//                             decoding their replies
//   detail/waiting.hpp        how threads wait for due jobs without polling: the job queues'
//                             taker over the shards, woken by the subscription
//   queue.hpp                 delay_queue and sharded_delay_queue, which tie those together
#include "../detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include "queue.hpp"
#include "types.hpp"
