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
// The code falls apart along four seams, one header each:
//
//   connection.hpp  the wire: a hiredis connection; a link that the threads of an object share
//                   and that sends what they send together in one write; the subscriber that
//                   waiting consumers listen on
//   cluster.hpp     which node serves a slot: one server, or a Redis Cluster's slot map, its
//                   MOVED and ASK redirections and its failovers
//   scripts.hpp     the Lua scripts, the key layout and a job's states and transitions
//   queue.hpp       the public types: options, job, delay_queue, sharded_delay_queue; how
//                   threads wait without polling, and how the take/ack loop needs one round trip
//                   per job
#pragma once

#include "cluster.hpp"
#include "connection.hpp"
#include "queue.hpp"
#include "scripts.hpp"
