// wheel_ring: what wheel_core needs from a ring of buckets (hashed_wheel_ring, timing_wheel).
//
// A ring holds nodes and says which are due; it has no lock, no thread, no clock and no tasks, and
// is not thread-safe: the core calls every member under its lock except position(), which depends
// on nothing that changes.
//
// What a ring may read of a node: its deadline, its sequence number and its links (and write the
// links). Never the callable, nor the state: a ring holds cancelled nodes too. A cancel leaves its
// node linked until the core's next bury() (wheel_core.hpp, "Cancel"), and meanwhile the ring may
// move it as any other (a staging lane that settles, a bucket that a pass refiles), or unlink it;
// the core buries before every pass and every stop(), so expire() and take_all() meet none.
//
// Two kinds of members (room.hpp says why, and how the types keep them apart):
//
// Room: may allocate; each takes a room_key, which only a schedule's or a reschedule's lock makes
// (or a constructor), where an exception is harmless. A pass cannot call them. With p a place,
// d a duration, k a count, key a room_key:
//
//   r.prepare(p, key)           makes the room a link at p needs beyond reserve()'s (the
//                               hierarchical wheel's levels). Then nothing visible changed.
//   r.prepare_repeat(d, key)    makes the room that links by a pass, at most d after the pass's
//                               time, need: a periodic task's next run, whichever pass moves it.
//   r.reserve(k, key)           makes the room for r to hold k nodes. post: while r holds at most
//                               k, neither a link nor expire() allocates (the core calls it as its
//                               pending count grows).
//
// Each throws std::bad_alloc, and then the room is as it was.
//
// Everything else: noexcept and allocation-free, given the room; a pass may call these. With r a
// Ring, n a node, t a time point:
//
//   r.position(t) -> place      where a node due at t belongs. Callable without the lock.
//   r.link(n, p, wake_by) -> b  pre: n is in no ring, n->deadline is at p, prepare(p) was called
//                               (or p is at most d after the last pass's time, d given to
//                               prepare_repeat()), reserve() made room for the nodes held with n.
//                               post: n is held; b says whether n comes out before wake_by (false
//                               for wake_by == time_point::min()). For a new node (the hashed ring
//                               stages it).
//   r.relink(n, p, wake_by)     as link(), for a node moved (reschedule, a periodic task's next
//                               run), which the hashed ring links into its bucket at once.
//   r.unlink(n)                 pre: r holds n. post: it does not.
//   r.prefetch_unlink(n)        pre: r holds n. A hint that unlink(n) follows soon: starts the
//                               cache misses it will wait for. Changes nothing.
//   r.may_postpone(n) -> b      pre: r holds n. Whether n may stay where it is while the caller
//                               moves its deadline later: then the pass that meets it files it
//                               again by its own deadline, never early and never late.
//   r.expire(t, sink) -> count  unlinks every node due at t (deadline <= t) and hands each to
//                               sink(n), bucket by bucket, calling sink.next_run() between two
//                               buckets (due_batch); returns how many. Never early.
//   r.next_expiry() -> opt<t>   when expire() will next have work; nullopt when nothing is held.
//                               May be early (after an unlink), never late.
//   r.next_expiry_runs_a_task() whether next_expiry() is a node's deadline rather than the opening
//                               of a bucket (a driver spins only before the former).
//   r.floor_to_grid(t), r.ceil_to_grid(t)
//                               the tick grid at or before, at or after t (for precise = false).
//   r.take_all(f)               unlinks every node and hands each to f(n) (prev null; f may reuse
//                               next), in no order.
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>

#include "room.hpp"
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
                              typename Clock::time_point t, typename Clock::duration d,
                              room_key key, ring_sink_archetype<Clock>& sink,
                              ring_take_archetype<Clock>& take) {
    // room: only with a key
    r.prepare(p, key);
    r.prepare_repeat(d, key);
    r.reserve(std::size_t{}, key);
    // the rest: what a pass may call
    { cr.position(t) } noexcept -> std::same_as<typename R::place>;
    { r.link(n, p, t) } noexcept -> std::same_as<bool>;
    { r.relink(n, p, t) } noexcept -> std::same_as<bool>;
    { r.unlink(n) } noexcept;
    { cr.prefetch_unlink(n) } noexcept;
    { cr.may_postpone(n) } noexcept -> std::same_as<bool>;
    { r.expire(t, sink) } noexcept -> std::same_as<std::size_t>;
    { cr.next_expiry() } noexcept -> std::same_as<std::optional<typename Clock::time_point>>;
    { cr.next_expiry_runs_a_task() } noexcept -> std::same_as<bool>;
    { cr.floor_to_grid(t) } noexcept -> std::same_as<typename Clock::time_point>;
    { cr.ceil_to_grid(t) } noexcept -> std::same_as<typename Clock::time_point>;
    { r.take_all(take) } noexcept;
};
// clang-format on

}  // namespace delayq::detail
