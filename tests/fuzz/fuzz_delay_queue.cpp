// Model-based fuzzing of delay_queue<T, manual_clock>.
//
// The model is a std::map keyed by (deadline, insertion number): exactly the order the contract
// promises (earliest deadline first, first in first out among equal deadlines). Every operation is
// applied to both, and after each one size(), empty(), next_deadline(), peek() and closed() must
// agree. What comes out (poll, take_until with a limit that has passed, drain_to, close) must be
// the model's elements, in the model's order, and never one whose deadline is after now.
//
// The clock moves forwards, and also backwards (and back again to the latest time it read): due
// is judged by the clock as it reads, so after a step back nothing comes out early, nothing is
// lost, and what was due comes out once the clock is back.
//
// The first byte picks the element type: one with a nothrow move (held in place in the heap), or
// one whose move may throw (held boxed), copyable or move-only, so every storage path and every
// way close() hands elements back is exercised. For the last two, close() may be made to throw on
// the n-th copy or move: the queue must then be closed and still hold every element, in order.
#include <algorithm>
#include <delayq/delay_queue.hpp>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "fuzz_common.hpp"

namespace {

using namespace delayq_fuzz;

struct item {
    std::uint64_t id = 0;
    time_point at{};
    std::shared_ptr<int>
        payload;  // a heap block per element: ASan sees a leaked or doubly freed one

    item(std::uint64_t i, time_point t, std::shared_ptr<int> p) noexcept
        : id(i), at(t), payload(std::move(p)) {}
    time_point deadline() const noexcept { return at; }
};

// How many more copies or moves of a boxed element succeed before one throws; -1: all do. Armed
// only around close().
int copies_or_moves_before_throw = -1;

void count_copy_or_move() {
    if (copies_or_moves_before_throw >= 0 && copies_or_moves_before_throw-- == 0)
        throw std::runtime_error("copy or move");
}

struct boxed_item {
    std::uint64_t id = 0;
    time_point at{};
    std::shared_ptr<int> payload;

    boxed_item(std::uint64_t i, time_point t, std::shared_ptr<int> p)
        : id(i), at(t), payload(std::move(p)) {}
    boxed_item(const boxed_item& o) : id(o.id), at(o.at), payload(o.payload) {
        count_copy_or_move();
    }
    boxed_item& operator=(const boxed_item&) = default;
    boxed_item(boxed_item&& o) noexcept(false) : id(o.id), at(o.at) {
        count_copy_or_move();
        payload = std::move(o.payload);
    }
    boxed_item& operator=(boxed_item&& o) noexcept(false) {
        id = o.id;
        at = o.at;
        payload = std::move(o.payload);
        return *this;
    }
    ~boxed_item() = default;
    time_point deadline() const noexcept { return at; }
};

// Move-only, with a move that may throw: close() moves it out, and back if a later move throws.
struct boxed_move_only {
    std::uint64_t id = 0;
    time_point at{};
    std::shared_ptr<int> payload;

    boxed_move_only(std::uint64_t i, time_point t, std::shared_ptr<int> p)
        : id(i), at(t), payload(std::move(p)) {}
    boxed_move_only(const boxed_move_only&) = delete;
    boxed_move_only& operator=(const boxed_move_only&) = delete;
    boxed_move_only(boxed_move_only&& o) noexcept(false) : id(o.id), at(o.at) {
        count_copy_or_move();
        payload = std::move(o.payload);
    }
    boxed_move_only& operator=(boxed_move_only&&) = delete;  // close() must not need it
    ~boxed_move_only() = default;
    time_point deadline() const noexcept { return at; }
};

template <class T>
T make(std::uint64_t id, time_point at) {
    return T{id, at, std::make_shared<int>(static_cast<int>(id))};
}

template <class T>
void check_element(const T& v, std::uint64_t id, time_point at) {
    FZ_CHECK(v.id == id);
    FZ_CHECK(v.at == at);
    FZ_CHECK(v.payload && *v.payload == static_cast<int>(id));
}

template <class T>
void run(FuzzedDataProvider& in) {
    mclock::set(pick_start(in));
    const rep scale = in.ConsumeIntegralInRange<rep>(1, 1000);
    std::optional<delayq::delay_queue<T, mclock>> q(std::in_place);
    std::map<std::pair<time_point, std::uint64_t>, std::uint64_t> model;  // (deadline, seq) -> id
    bool closed = false;
    std::uint64_t next_id = 0;
    time_point latest = mclock::now();  // the latest time the clock has read

    auto pop_model = [&](const T& got) {
        FZ_CHECK(!model.empty());
        const auto it = model.begin();
        FZ_CHECK(it->first.first <= mclock::now());  // nothing early
        check_element(got, it->second, it->first.first);
        model.erase(it);
    };

    while (in.remaining_bytes() > 0) {
        switch (in.ConsumeIntegralInRange<int>(0, 14)) {
            case 0:
            case 1:
            case 2: {  // put
                const time_point at = pick_deadline(in, mclock::now(), scale);
                const std::uint64_t id = next_id++;
                T v = make<T>(id, at);
                bool ok;
                if constexpr (std::is_copy_constructible_v<T>) {
                    ok = in.ConsumeBool() ? q->put(std::move(v)) : q->put(std::as_const(v));
                } else {
                    ok = q->put(std::move(v));
                }
                FZ_CHECK(ok == !closed);
                if (ok)
                    model.emplace(std::pair{at, id}, id);
                else
                    check_element(v, id, at);  // refused: left untouched
                break;
            }
            case 3: {  // emplace
                const time_point at = pick_deadline(in, mclock::now(), scale);
                const std::uint64_t id = next_id++;
                const bool ok = q->emplace(id, at, std::make_shared<int>(static_cast<int>(id)));
                FZ_CHECK(ok == !closed);
                if (ok) model.emplace(std::pair{at, id}, id);
                break;
            }
            case 4:
            case 5: {  // poll
                std::optional<T> got = q->poll();
                const bool due = !model.empty() && model.begin()->first.first <= mclock::now();
                FZ_CHECK(got.has_value() == due);
                if (got) pop_model(*got);
                break;
            }
            case 6: {  // take_until / take_for with a limit that has already passed: never blocks
                std::optional<T> got =
                    in.ConsumeBool() ? q->take_until(sat_add(mclock::now(),
                                                             -in.ConsumeIntegralInRange<rep>(0, 3)))
                                     : q->take_for(duration::zero());
                const bool due =
                    !closed && !model.empty() && model.begin()->first.first <= mclock::now();
                FZ_CHECK(got.has_value() == due);
                if (got) pop_model(*got);
                break;
            }
            case 7:
            case 8: {  // move the clock (forwards mostly; set() may also go back)
                if (in.ConsumeIntegralInRange<int>(0, 9) == 0)
                    mclock::set(pick_start(in));
                else
                    mclock::advance(duration{pick_advance(in, scale)});
                latest = std::max(latest, mclock::now());
                break;
            }
            case 9: {  // drain_to
                const std::size_t max =
                    in.ConsumeBool() ? SIZE_MAX : in.ConsumeIntegralInRange<std::size_t>(0, 8);
                std::vector<T> out;
                const std::size_t n = q->drain_to(std::back_inserter(out), max);
                FZ_CHECK(n == out.size());
                FZ_CHECK(n <= max);
                for (const T& v : out) pop_model(v);
                // it stopped for a reason: the limit, or nothing more is due
                FZ_CHECK(n == max || model.empty() || model.begin()->first.first > mclock::now());
                break;
            }
            case 10: {  // remove_if
                const std::uint64_t m = in.ConsumeIntegralInRange<std::uint64_t>(1, 5);
                const std::uint64_t r = in.ConsumeIntegralInRange<std::uint64_t>(0, m - 1);
                const std::size_t n = q->remove_if([&](const T& v) { return v.id % m == r; });
                std::size_t expect = 0;
                for (auto it = model.begin(); it != model.end();) {
                    if (it->second % m == r) {
                        it = model.erase(it);
                        ++expect;
                    } else {
                        ++it;
                    }
                }
                FZ_CHECK(n == expect);
                break;
            }
            case 11: {  // close, or clear, or destroy and start again
                const int what = in.ConsumeIntegralInRange<int>(0, 5);
                if (what == 0) {
                    q->clear();
                    model.clear();
                } else if (what == 1) {
                    q.reset();  // destroys what it holds
                    q.emplace();
                    model.clear();
                    closed = false;
                } else {
                    // sometimes with the n-th copy or move of a boxed element throwing
                    if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
                        copies_or_moves_before_throw = in.ConsumeIntegralInRange<int>(0, 8);
                    std::vector<T> rest;
                    bool threw = false;
                    try {
                        rest = q->close();
                    } catch (const std::runtime_error&) {
                        threw = true;
                    }
                    copies_or_moves_before_throw = -1;
                    closed = true;
                    FZ_CHECK(!threw || !std::is_nothrow_move_constructible_v<T>);
                    // then closed, and still holding every element: the checks after each step
                    if (threw) break;
                    FZ_CHECK(rest.size() == model.size());
                    auto it = model.begin();
                    for (const T& v : rest) {
                        check_element(v, it->second, it->first.first);
                        ++it;
                    }
                    model.clear();
                }
                break;
            }
            case 12: {  // peek
                if constexpr (std::is_copy_constructible_v<T>) {
                    std::optional<T> got = q->peek();
                    FZ_CHECK(got.has_value() == !model.empty());
                    if (got) check_element(*got, model.begin()->second, model.begin()->first.first);
                }
                break;
            }
            case 14: {  // the clock steps back, or comes back to the latest time it read
                if (in.ConsumeBool())
                    mclock::set(sat_add(mclock::now(), -pick_advance(in, scale)));
                else
                    mclock::set(latest);
                latest = std::max(latest, mclock::now());
                break;
            }
            default: {  // remove_if with a predicate that throws: nothing is removed
                const std::uint64_t after = in.ConsumeIntegralInRange<std::uint64_t>(0, 4);
                std::uint64_t seen = 0;
                bool threw = false;
                try {
                    q->remove_if([&](const T&) -> bool {
                        if (seen++ == after) throw 42;
                        return true;
                    });
                } catch (int) {
                    threw = true;
                }
                FZ_CHECK(threw == (model.size() > after));
                if (!threw) model.clear();  // it matched everything
                break;
            }
        }
        // the invariants after every step
        FZ_CHECK(q->size() == model.size());
        FZ_CHECK(q->empty() == model.empty());
        FZ_CHECK(q->closed() == closed);
        const auto nd = q->next_deadline();
        FZ_CHECK(nd.has_value() == !model.empty());
        if (nd) FZ_CHECK(*nd == model.begin()->first.first);
        FZ_CHECK(q->waiting_takers() == 0);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
        case 0:
            run<item>(in);
            break;
        case 1:
            run<boxed_item>(in);
            break;
        default:
            run<boxed_move_only>(in);
            break;
    }
    return 0;
}
