// delayq::job_queue<Q>: the contract that every durable job queue backend meets
// (delayq::redis::delay_queue and sharded_delay_queue, delayq::sqlite::delay_queue,
// delayq::postgres::delay_queue), written once as a concept so that code, and one behaviour suite
// (tests/contract/), can be written against any of them.
//
// The semantics that the signatures cannot say, and that every backend keeps:
// - An id is "queued" while its job waits or is leased. put() and put_after() of a queued id
//   return false and change nothing; after ack() or cancel() (or a move to the dead letters) the id
//   may be put again.
// - take(max_wait) leases the earliest due job (not before its deadline), waiting up to max_wait
//   (not at all when <= 0) without polling; attempts is 1 at the first delivery, +1 at each
//   redelivery (after nack() or a lease that ended). take(max_wait, stop) and take_many(n,
//   max_wait, stop) return nothing once the std::stop_token `stop` is requested: a take blocked
//   then is woken (within 100 ms, unless a call to the store is on its way, which ends within
//   the store's timeout), and a take that starts with stop requested leases nothing.
// - ack() and nack() succeed only while the lease holds and with the lease's token (fencing):
//   false once the lease ended, the job was delivered again, or it was cancelled.
// - extend(job, lease) makes the lease end `lease` from now (by the store's clock), longer or
//   shorter, fenced like ack(); the token stays the holder's. A negative lease is
//   std::invalid_argument.
// - bury() moves a leased job to the dead letters at once, fenced like ack() (a job its handler
//   knows it can never do: retrying would only fail again).
// - nack(job, retry_after, reason) and bury(job, reason) keep `reason` (its first max_reason_size
//   bytes) as the job's last error, which stays with it in the dead letters; nack(job,
//   retry_after) and bury(job) keep the last error as it was. A job whose max_attempts-th lease
//   ends dies with lease_ended_reason. A put starts a job with none.
// - get(id) tells a queued job (waiting or leased; a lease that ended reads as waiting, due at its
//   end) or a dead letter (a queued job first, if its id is both), or nothing. dead(max, after)
//   pages through the dead letters in the order they died, then by id: up to max (at most
//   max_take_many) after the dead letter `after` (empty: from the first; not a dead letter: an
//   empty page). jobs(state, max, after) pages the same way through the jobs of one state:
//   waiting ones by due time (a lease that ended counts, due at its end), leased ones by the end
//   of their lease, both then by id; dead ones as dead(). Each is an index lookup, never a scan
//   of the queue.
// - requeue_dead(id, delay) puts a dead letter back as a waiting job due `delay` from now, with
//   attempts from 0 and its last error kept; false, changing nothing, for an id that is not dead
//   or is queued. purge_dead(older_than) removes the dead letters that died longer ago than that,
//   and returns how many. The option keep_dead (0: for ever) makes each move to the dead letters
//   remove a few that died longer ago than that, so they stay bounded. Negative delays and ages
//   are std::invalid_argument.
// - pause() stops the queue's takes in every process (store-wide, kept by the store): while it is
//   paused, a take leases nothing and waits (up to its max_wait, or until a stop request) for a
//   resume(), which wakes it; every other call works as before (puts, acks, nacks, extends,
//   cancels, lookups; a lease that ends still ends). Both are idempotent; paused() tells.
// - put_every(id, payload, period) and put_cron(id, payload, expression) queue a series: each
//   run is an ordinary job with the series' id (the first due one period from now, or at the
//   first minute the five-field UTC expression matches), and the step that acks a run, or moves
//   it to the dead letters, queues the next in the same atomic step (detail/job_queue/repeat.hpp:
//   the next slot after now, so a series that fell behind makes one catch-up run). Like put(),
//   false when the id is queued. A period <= 0 or a bad expression is std::invalid_argument.
//   cancel(id) ends the series.
// - cancel() removes a waiting or leased job; reschedule() moves a waiting job only.
// - With max_attempts N > 0, a job whose N-th delivery is nacked or whose N-th lease ends moves to
//   the dead letters (dead_size()) instead of waiting again.
// - size() counts the queued jobs: waiting plus leased. stats() tells them apart: waiting (due or
//   not; a lease that ended reads as waiting, due since its end), due now, leased, dead, and the
//   lag (how long the oldest due job has been due), in one look at the store (one statement,
//   transaction or script); each backend's stats() says what it reads.
// - Limits on leases (options.limits, delayq::job_limits) are kept by the store across every
//   process: a take that one holds back waits, woken when a lease of the queue ends or the
//   window turns; it never fails.
// - Limits (delayq/job.hpp): an id is 1 to max_id_size (1024) bytes, else every call that names
//   it throws std::invalid_argument; take_many(n, ...) leases at most max_take_many (500) jobs,
//   and take_many(0, ...) returns nothing at once. Delays and times are clamped: a negative delay
//   is due now.
// - Errors: bad arguments throw std::invalid_argument, the store's problems the backend's error,
//   a delayq::queue_error; among them, a store that could not serve the call now (unreachable,
//   no answer within the call's timeout, held by another connection) throws a
//   delayq::unavailable_error, after which a retry is safe.
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "job.hpp"

namespace delayq {

namespace detail {

template <class Q>
struct put_request_of {
    using type = delayq::put_request;
};
template <class Q>
requires requires {
    typename Q::put_request;
}
struct put_request_of<Q> {
    using type = typename Q::put_request;
};

}  // namespace detail

/// The job type of queue Q: what its take() hands out (delayq::job, or a backend's own type with
/// the same members).
template <class Q>
using job_type_t = typename std::remove_cvref_t<decltype(std::declval<Q&>().take(
    std::chrono::milliseconds{}))>::value_type;

/// The request type of Q's put_many(): Q::put_request if Q names one, else delayq::put_request.
template <class Q>
using put_request_t = typename detail::put_request_of<Q>::type;

/// A job as every backend hands it out: the members of delayq::job.
template <class J>
concept job_like = requires(const J& j) {
    { j.id } -> std::convertible_to<std::string_view>;
    { j.payload } -> std::convertible_to<std::string_view>;
    { j.deadline } -> std::convertible_to<std::chrono::system_clock::time_point>;
    { j.attempts } -> std::convertible_to<unsigned>;
    { j.token } -> std::convertible_to<std::uint64_t>;
    { j.lease_deadline } -> std::convertible_to<std::chrono::system_clock::time_point>;
};

/// A durable, leased job queue: the members and the semantics above.
template <class Q>
concept job_queue = requires {
    typename job_type_t<Q>;
}
&&job_like<job_type_t<Q>>&& requires(Q& q, std::string_view s,
                                     std::chrono::system_clock::time_point tp,
                                     std::chrono::milliseconds d, std::size_t n,
                                     const job_type_t<Q>& j, std::span<const job_type_t<Q>> js,
                                     std::span<const put_request_t<Q>> ps, std::stop_token st) {
    { q.put(s, s, tp) } -> std::same_as<bool>;
    { q.put_after(s, s, d) } -> std::same_as<bool>;
    { q.put_many(ps) } -> std::same_as<std::vector<bool>>;
    { q.put_every(s, s, d) } -> std::same_as<bool>;
    { q.put_cron(s, s, s) } -> std::same_as<bool>;
    { q.cancel(s) } -> std::same_as<bool>;
    { q.reschedule(s, d) } -> std::same_as<bool>;
    { q.take(d) } -> std::same_as<std::optional<job_type_t<Q>>>;
    { q.take_many(n, d) } -> std::same_as<std::vector<job_type_t<Q>>>;
    { q.take(d, st) } -> std::same_as<std::optional<job_type_t<Q>>>;
    { q.take_many(n, d, st) } -> std::same_as<std::vector<job_type_t<Q>>>;
    { q.ack(j) } -> std::same_as<bool>;
    { q.ack_many(js) } -> std::same_as<std::vector<bool>>;
    { q.nack(j, d) } -> std::same_as<bool>;
    { q.extend(j, d) } -> std::same_as<bool>;
    { q.bury(j) } -> std::same_as<bool>;
    { q.nack(j, d, s) } -> std::same_as<bool>;
    { q.bury(j, s) } -> std::same_as<bool>;
    { q.get(s) } -> std::same_as<std::optional<job_info>>;
    { q.dead(n, s) } -> std::same_as<std::vector<job_info>>;
    { q.jobs(job_state::waiting, n, s) } -> std::same_as<std::vector<job_info>>;
    { q.requeue_dead(s, d) } -> std::same_as<bool>;
    { q.purge_dead(d) } -> std::same_as<std::size_t>;
    q.pause();
    q.resume();
    { q.paused() } -> std::same_as<bool>;
    { q.size() } -> std::same_as<std::size_t>;
    { q.dead_size() } -> std::same_as<std::size_t>;
    { q.stats() } -> std::same_as<queue_stats>;
    q.get_options();
};

/// A job queue that acks a job and leases the next due one in one round trip:
/// ack_and_try_take(j) is ack(j) and then, in the same round trip (two on a PostgreSQL object
/// with limits), a take that does not wait, which leases by take()'s rules (pause, limits,
/// max_attempts, series, fencing) whether or not the ack held (a sharded Redis queue looks at the
/// acked job's shard only). What a loop of take, handle, ack saves with it is one round trip per
/// job; delayq::worker uses it where a queue has it.
template <class Q>
concept acks_and_takes = job_queue<Q> && std::same_as<job_type_t<Q>, job> &&
    requires(Q& q, const job& j) {
    { q.ack_and_try_take(j) } -> std::same_as<ack_take_result>;
};

}  // namespace delayq
