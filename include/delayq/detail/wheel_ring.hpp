// wheel_ring: what wheel_core needs from a ring of buckets (hashed_wheel_ring, timing_wheel).
//
// A ring holds nodes and says which are due; it has no lock, no thread, no clock and no tasks, and
// is not thread-safe: the core calls every member under its lock except position(), which depends
// on nothing that changes. With r a Ring, n a node, t a time point, p a place:
//
//   r.position(t) -> place      where a node due at t belongs. noexcept; callable without the lock.
//   r.prepare(p)                makes the room a link at p may need beyond reserve()'s (the
//                               hierarchical wheel's levels). May throw std::bad_alloc; then
//                               nothing visible changed.
//   r.reserve(k)                makes the room for r to hold k nodes. post: while r holds at most
//                               k, neither a link nor expire() allocates (the core calls it as its
//                               pending count grows). May throw std::bad_alloc; then the room is
//                               as it was.
//   r.link(n, p, wake_by) -> b  pre: n is in no ring, n->deadline is at p, prepare(p) was called
//                               since the last expire(), reserve() made room for the nodes held
//                               with n. post: n is held; b says whether n comes out before wake_by
//                               (false for wake_by == time_point::min()). noexcept, no allocation.
//                               For a new node (the hashed ring stages it).
//   r.relink(n, p, wake_by)     as link(), for a node moved (reschedule, a periodic task's next
//                               run), which the hashed ring links into its bucket at once.
//   r.unlink(n)                 pre: r holds n. post: it does not. noexcept.
//   r.prefetch_unlink(n)        pre: r holds n. A hint that unlink(n) follows soon: starts the
//                               cache misses it will wait for. Changes nothing. noexcept.
//   r.may_postpone(n) -> b      pre: r holds n. Whether n may stay where it is while the caller
//                               moves its deadline later: then the pass that meets it files it
//                               again by its own deadline, never early and never late. noexcept.
//   r.expire(t, sink) -> count  unlinks every node due at t (deadline <= t) and hands each to
//                               sink(n), bucket by bucket, calling sink.next_run() between two
//                               buckets (due_batch); returns how many. noexcept; never early.
//   r.next_expiry() -> opt<t>   when expire() will next have work; nullopt when nothing is held.
//                               May be early (after an unlink), never late.
//   r.next_expiry_runs_a_task() whether next_expiry() is a node's deadline rather than the opening
//                               of a bucket (a driver spins only before the former).
//   r.floor_to_grid(t), r.ceil_to_grid(t)
//                               the tick grid at or before, at or after t (for precise = false).
//   r.take_all(f)               unlinks every node and hands each to f(n) (prev null; f may reuse
//                               next), in no order. noexcept.
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>

#include "timer_node.hpp"

namespace delayq::detail {

// What expire() hands nodes to, for the concept's check.
template <class Clock>
struct ring_sink_archetype {
    void operator()(timer_node<Clock>*) noexcept {}
    void next_run() noexcept {}
};

template <class Clock>
struct ring_take_archetype {
    void operator()(timer_node<Clock>*) noexcept {}
};

// (clang-format 14 breaks a compound requirement's noexcept onto a line of its own)
// clang-format off
template <class R, class Clock>
concept wheel_ring = requires(R& r, const R& cr, timer_node<Clock>* n, typename R::place p,
                              typename Clock::time_point t, ring_sink_archetype<Clock>& sink,
                              ring_take_archetype<Clock>& take) {
    { cr.position(t) } noexcept -> std::same_as<typename R::place>;
    r.prepare(p);
    r.reserve(std::size_t{});
    { r.link(n, p, t) } noexcept -> std::same_as<bool>;
    { r.relink(n, p, t) } noexcept -> std::same_as<bool>;
    { r.unlink(n) } noexcept;
    { cr.prefetch_unlink(n) } noexcept;
    { cr.may_postpone(n) } noexcept -> std::same_as<bool>;
    { r.expire(t, sink) } noexcept -> std::same_as<std::size_t>;
    { cr.next_expiry() } -> std::same_as<std::optional<typename Clock::time_point>>;
    { cr.next_expiry_runs_a_task() } -> std::same_as<bool>;
    { cr.floor_to_grid(t) } noexcept -> std::same_as<typename Clock::time_point>;
    { cr.ceil_to_grid(t) } noexcept -> std::same_as<typename Clock::time_point>;
    { r.take_all(take) } noexcept;
};
// clang-format on

}  // namespace delayq::detail
