#include <chrono>
#include <delayq/delayed.hpp>
#include <delayq/manual_clock.hpp>
#include <functional>
#include <memory>
#include <string>

#include "catch.hpp"

using namespace std::chrono_literals;
using delayq::manual_clock;
using tp = std::chrono::steady_clock::time_point;

namespace user {
struct member {
    tp at;
    tp deadline() const { return at; }
};
struct free_fn {
    tp at;
};
tp deadline(const free_fn& f) {
    return f.at;
}
struct none {};
struct wrong_type {
    int deadline() const { return 0; }
};
}  // namespace user

static_assert(delayq::Delayed<user::member>);
static_assert(delayq::Delayed<user::free_fn>);
static_assert(delayq::Delayed<user::member*>);
static_assert(delayq::Delayed<const user::member*>);
static_assert(delayq::Delayed<std::unique_ptr<user::member>>);
static_assert(delayq::Delayed<std::shared_ptr<user::free_fn>>);
static_assert(delayq::Delayed<std::reference_wrapper<user::member>>);
static_assert(delayq::Delayed<std::unique_ptr<std::unique_ptr<user::member>>>);
static_assert(!delayq::Delayed<user::none>);
static_assert(!delayq::Delayed<int>);
static_assert(!delayq::Delayed<int*>);
static_assert(!delayq::Delayed<user::wrong_type>);
static_assert(!delayq::Delayed<user::member, manual_clock>);  // another clock's time line
static_assert(delayq::Delayed<delayq::delayed<std::string, manual_clock>, manual_clock>);
static_assert(std::chrono::is_clock_v<manual_clock>);

TEST_CASE("deadline_of finds member, ADL and pointer-like deadlines") {
    const tp t{5s};
    user::member m{t};
    user::free_fn f{t + 1s};
    CHECK(delayq::deadline_of(m) == t);
    CHECK(delayq::deadline_of(f) == t + 1s);
    CHECK(delayq::deadline_of(&m) == t);
    CHECK(delayq::deadline_of(std::make_unique<user::member>(m)) == t);
    CHECK(delayq::deadline_of(std::make_shared<user::free_fn>(f)) == t + 1s);
    CHECK(delayq::deadline_of(std::ref(m)) == t);
    CHECK(delayq::deadline_of(std::cref(f)) == t + 1s);
}

TEST_CASE("delay_for is now + d on the given clock") {
    manual_clock::reset();
    manual_clock::advance(1s);
    auto d = delayq::delay_for<manual_clock>(std::string("x"), 250ms);
    CHECK(d.value == "x");
    CHECK(d.deadline() == manual_clock::time_point{1250ms});
    CHECK(delayq::deadline_of(d) == d.at);
}

TEST_CASE("delay_for saturates instead of overflowing") {
    manual_clock::reset();
    manual_clock::advance(1h);
    using mtp = manual_clock::time_point;
    CHECK(delayq::delay_for<manual_clock>(1, manual_clock::duration::max()).at == mtp::max());
    // hours::max() in nanoseconds overflows a plain conversion; it must mean "never".
    CHECK(delayq::delay_for<manual_clock>(1, std::chrono::hours::max()).at == mtp::max());
    CHECK(delayq::delay_for<manual_clock>(1, std::chrono::seconds::min()).at == mtp::min());
    CHECK(delayq::delay_for<manual_clock>(1, -30min).at == mtp{30min});
    manual_clock::set(mtp::max() - 1ns);
    CHECK(delayq::delay_for<manual_clock>(1, 2ns).at == mtp::max());
}

TEST_CASE("saturating conversions round up, never early") {
    using delayq::detail::saturating_ceil;
    using std::chrono::duration;
    CHECK(saturating_ceil<std::chrono::microseconds>(1ns) == 1us);
    CHECK(saturating_ceil<std::chrono::microseconds>(1000ns) == 1us);
    CHECK(saturating_ceil<std::chrono::microseconds>(1001ns) == 2us);
    CHECK(saturating_ceil<std::chrono::microseconds>(-1001ns) == -1us);
    CHECK(saturating_ceil<std::chrono::nanoseconds>(duration<double>(1.5e-9)) == 2ns);
    CHECK(saturating_ceil<std::chrono::nanoseconds>(duration<double>(1e300)) ==
          std::chrono::nanoseconds::max());
    CHECK(saturating_ceil<std::chrono::nanoseconds>(duration<long long, std::ratio<1, 3>>(1)) ==
          333333334ns);
}
