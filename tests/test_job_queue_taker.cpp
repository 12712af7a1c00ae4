// The job queues' shared taker (detail/job_queue/taker.hpp) over a fake store, in the three shapes
// its backends give it: Redis (several lanes, a wake source polled with a pipe, each take claims
// for itself), SQLite (one lane, no wake source, a recheck, its commits learned as the truth) and
// PostgreSQL (one lane, a wake source, one claim for every waiting take).
//
// Time is a manual_clock: nothing here asserts how long anything took in real time. Real time
// bounds only the waits for other threads (eventually()), so that a wrong taker fails a check
// instead of hanging the run; a take still running at the end of a case is pushed out (the
// store shut, the clock moved far) and the case fails.
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <delayq/detail/fork.hpp>
#include <delayq/detail/job_queue/exception_copy.hpp>
#include <delayq/detail/job_queue/taker.hpp>
#include <delayq/job.hpp>
#include <delayq/manual_clock.hpp>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "caught_apart.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using delayq::manual_clock;
using delayq::test::eventually;
using tp = manual_clock::time_point;
namespace jq = delayq::detail::job_queue;

namespace {

tp at(manual_clock::duration d) {
    return tp{d};
}

// What the fake store throws: a claim that failed, a wake source lost for good.
class store_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// The three shapes of store (docs/design/job-queue-taker.md, section 3).
struct redis_like {
    static constexpr bool external_wake = true, claim_for_all = false, look_on_entry = true;
    static constexpr std::size_t claim_cap = delayq::max_take_many;
    static constexpr unsigned wake_losses_per_take = ~0U;
    static constexpr manual_clock::duration recheck = manual_clock::duration::max();
    static constexpr bool commits = false;  // its answers are not learned apart from the claim
    static constexpr std::size_t lanes = 3;
};
struct sqlite_like {
    static constexpr bool external_wake = false, claim_for_all = false, look_on_entry = true;
    static constexpr std::size_t claim_cap = delayq::max_take_many;
    [[maybe_unused]] static constexpr unsigned wake_losses_per_take = ~0U;  // no wake source
    static constexpr manual_clock::duration recheck = 200ms;
    static constexpr bool commits = true;  // each claim commits, and the commit calls learn()
    static constexpr std::size_t lanes = 1;
};
struct pg_like {
    static constexpr bool external_wake = true, claim_for_all = true, look_on_entry = false;
    static constexpr std::size_t claim_cap = 1000;
    static constexpr unsigned wake_losses_per_take = 1;
    static constexpr manual_clock::duration recheck = manual_clock::duration::max();
    static constexpr bool commits = false;
    static constexpr std::size_t lanes = 1;
};

// One claim, as the store saw it.
struct claim_record {
    std::size_t lane = 0, n = 0, got = 0;
    bool patient = false;
    std::thread::id by;
    tp at;
};

// A store of job ids by due time, per lane, with what a test needs to steer and watch the taker:
// a gate that holds claims after they computed their answer (the answer is on its way), failures
// to inject, a queue of news and losses for the wake source, and counters.
template <class Shape>
class fake_store {
  public:
    using clock = manual_clock;
    static constexpr bool external_wake = Shape::external_wake;
    static constexpr bool claim_for_all = Shape::claim_for_all;
    static constexpr bool look_on_entry = Shape::look_on_entry;
    static constexpr std::size_t claim_cap = Shape::claim_cap;
    static constexpr unsigned wake_losses_per_take = Shape::wake_losses_per_take;

    explicit fake_store(std::size_t lanes) : queued_(lanes), failing_(lanes, 0) {}

    // The taker's learn(), for the commits of an SQLite-like store.
    std::function<void(std::size_t, tp)> learn;

    // --- the store concept ---

    std::size_t lanes() const noexcept { return queued_.size(); }
    manual_clock::duration recheck_every() const noexcept { return Shape::recheck; }

    jq::claimed<clock> claim(std::size_t lane, std::size_t n, bool patient) {
        ++claims;
        std::unique_lock lk(m_);
        claim_record rec{lane, n, 0, patient, std::this_thread::get_id(), clock::now()};
        std::exception_ptr failed;
        jq::claimed<clock> got;
        if (failing_[lane] != 0) {
            if (failing_[lane] > 0) --failing_[lane];
            failed = std::make_exception_ptr(
                store_error("the claim on lane " + std::to_string(lane) + " failed"));
        } else {
            auto& q = queued_[lane];
            while (!q.empty() && q.begin()->first <= rec.at && got.jobs.size() < n) {
                got.jobs.push_back(delayq::job{q.begin()->second, {}, {}, 1, 0, {}});
                q.erase(q.begin());
            }
            got.next = q.empty() ? tp::max() : q.begin()->first;
            rec.got = got.jobs.size();
            leased += got.jobs.size();
            if constexpr (Shape::commits) learn(lane, got.next);  // its commit, in order
        }
        log_.push_back(rec);
        if (hold_ > 0) {  // the answer is made: hold it on its way until released
            --hold_;
            ++held;
            const unsigned gen = released_;
            const auto give_up = std::chrono::steady_clock::now() + 30s;  // never hang
            while (released_ == gen && !shut_ && std::chrono::steady_clock::now() < give_up)
                gate_.wait_for(lk, 10ms);
            --held;
        }
        if (failed) std::rethrow_exception(failed);
        return got;
    }

    bool changed_elsewhere() {
        std::lock_guard lk(m_);
        ++changed_calls;
        changed_at_.push_back(clock::now());
        if (changed_answers_ == 0) return false;
        --changed_answers_;
        return true;
    }

    static std::exception_ptr copy_error(const std::exception_ptr& e) noexcept {
        return delayq::detail::copy_for_caller<store_error>(
            e, [](const store_error& x) { return store_error(std::string(x.what())); });
    }
    static bool lane_failure(const std::exception_ptr&) noexcept { return true; }
    void drop_inherited() noexcept { ++drops; }

    void open_wake() {
        ++open_wakes;
        std::lock_guard lk(m_);
        if (open_failures_ > 0) {
            --open_failures_;
            throw store_error("the wake source cannot be opened");
        }
    }

    // Waits until the manual time `until`, news, a loss, or a byte in `poke`: the pipe is polled
    // in short real-time slices, since moving a manual_clock wakes only its own sleepers.
    bool wait_wake(tp until, int poke, std::vector<jq::news<clock>>& heard, bool may_lose) {
        const int inside = ++in_wait;
        int seen = max_in_wait.load();
        while (inside > seen && !max_in_wait.compare_exchange_weak(seen, inside)) {
        }
        struct leave {
            std::atomic<int>& n;
            ~leave() { --n; }
        } guard{in_wait};
        ++wait_calls;
        const auto give_up = std::chrono::steady_clock::now() + 60s;  // never hang
        for (;;) {
            {
                std::lock_guard lk(m_);
                if (!events_.empty()) {
                    if (events_.front().lost) {
                        events_.pop_front();
                        if (!may_lose) throw store_error("the wake source was lost");
                        return false;
                    }
                    while (!events_.empty() && !events_.front().lost) {
                        heard.push_back(events_.front().said);
                        events_.pop_front();
                    }
                    return true;
                }
                if (shut_) return true;
            }
            if (clock::now() >= until) return true;
            pollfd p{poke, POLLIN, 0};
            if (::poll(&p, 1, 1) > 0) return true;
            if (std::chrono::steady_clock::now() > give_up) return true;
        }
    }

    // --- what the tests do ---

    // A job due at `due` in `lane`, that nobody is told of (a put by another process).
    void add(std::size_t lane, tp due, const std::string& id) {
        std::lock_guard lk(m_);
        queued_[lane].emplace(due, id);
        ++put;
    }
    // A commit of an SQLite-like store: the lane's next event, learned as the truth, in commit
    // order (under the store's lock, as SQLite's commit() under db_m_).
    void commit(std::size_t lane) {
        std::lock_guard lk(m_);
        learn(lane, queued_[lane].empty() ? tp::max() : queued_[lane].begin()->first);
    }
    // News from the wake source, read by the next wait_wake() (all that are queued at once).
    void tell(std::vector<jq::news<clock>> said) {
        std::lock_guard lk(m_);
        for (auto& n : said) events_.push_back({n, false});
    }
    void lose_wake() {
        std::lock_guard lk(m_);
        events_.push_back({{}, true});
    }
    // The next `n` claims on `lane` fail (-1: every one, 0: none).
    void fail(std::size_t lane, int n) {
        std::lock_guard lk(m_);
        failing_[lane] = n;
    }
    void fail_open(int n) {
        std::lock_guard lk(m_);
        open_failures_ = n;
    }
    void hold_next(unsigned n) {
        std::lock_guard lk(m_);
        hold_ = n;
    }
    void release() {
        std::lock_guard lk(m_);
        ++released_;
        gate_.notify_all();
    }
    void answer_changed(int n) {
        std::lock_guard lk(m_);
        changed_answers_ = n;
    }
    // Ends every wait of the store (for a test that failed and must not hang).
    void shut() {
        std::lock_guard lk(m_);
        shut_ = true;
        gate_.notify_all();
    }
    std::vector<claim_record> log() const {
        std::lock_guard lk(m_);
        return log_;
    }
    std::vector<tp> changed_at() const {
        std::lock_guard lk(m_);
        return changed_at_;
    }
    std::size_t queued() const {
        std::lock_guard lk(m_);
        std::size_t n = 0;
        for (auto& q : queued_) n += q.size();
        return n;
    }
    tp earliest_in(std::size_t lane) const {
        std::lock_guard lk(m_);
        return queued_[lane].empty() ? tp::max() : queued_[lane].begin()->first;
    }
    // The earliest due time still queued (tp::max() if none).
    tp earliest() const {
        std::lock_guard lk(m_);
        tp t = tp::max();
        for (auto& q : queued_)
            if (!q.empty()) t = std::min(t, q.begin()->first);
        return t;
    }

    std::atomic<int> claims{0}, held{0}, wait_calls{0}, in_wait{0}, max_in_wait{0};
    std::atomic<int> open_wakes{0}, drops{0}, changed_calls{0};
    std::atomic<std::size_t> put{0}, leased{0};

  private:
    struct event {
        jq::news<clock> said;
        bool lost = false;
    };
    mutable std::mutex m_;
    std::vector<std::multimap<tp, std::string>> queued_;
    std::vector<int> failing_;
    std::deque<event> events_;
    std::vector<claim_record> log_;
    std::vector<tp> changed_at_;
    std::condition_variable gate_;
    unsigned hold_ = 0, released_ = 0;
    int changed_answers_ = 0, open_failures_ = 0;
    bool shut_ = false;
};

// One take() in a thread of its own, and what it returned or threw.
class take_thread {
  public:
    template <class T>
    take_thread(T& t, std::size_t want, std::chrono::milliseconds max_wait,
                std::function<void(const std::exception&)> on_error)
        : th_([this, &t, want, max_wait, on_error = std::move(on_error)] {
              try {
                  jobs_ = t.take(want, max_wait);
              } catch (const std::exception& e) {
                  error_ = std::current_exception();
                  if (on_error) on_error(e);  // in the handler: the object is still alive
              } catch (...) {
                  error_ = std::current_exception();
              }
              at_ = manual_clock::now();
              done_.store(true);
          }) {}
    take_thread(const take_thread&) = delete;
    take_thread& operator=(const take_thread&) = delete;
    ~take_thread() { join(); }

    bool done() const { return done_.load(); }
    bool finished(std::chrono::milliseconds limit = 10s) const {
        return eventually([&] { return done(); }, limit);
    }
    std::thread::id id() const { return th_.get_id(); }
    void join() {
        if (th_.joinable()) th_.join();
    }
    // Only once done() (the thread wrote them before).
    const std::vector<delayq::job>& jobs() const { return jobs_; }
    std::exception_ptr error() const { return error_; }
    tp at() const { return at_; }

  private:
    std::vector<delayq::job> jobs_;
    std::exception_ptr error_;
    tp at_;
    std::atomic<bool> done_{false};
    std::thread th_;  // last: starts once the rest is made
};

std::vector<std::string> ids(const std::vector<delayq::job>& jobs) {
    std::vector<std::string> out;
    for (auto& j : jobs) out.push_back(j.id);
    return out;
}

std::string message_of(const std::exception_ptr& e) {
    if (e == nullptr) return "no error";
    try {
        std::rethrow_exception(e);
    } catch (const store_error& x) {
        return std::string("store_error: ") + x.what();
    } catch (const std::exception& x) {
        return std::string("other: ") + x.what();
    } catch (...) {
        return "not a std::exception";
    }
}

// A fresh clock, a store of `Shape` and its taker, and the take threads of one case. A case that
// leaves a take hanging fails (finish()), and the take is pushed out before anything is destroyed.
template <class Shape>
class fixture {
  public:
    using store_type = fake_store<Shape>;
    using taker_type = jq::taker<store_type>;

    explicit fixture(std::size_t lanes = Shape::lanes) : store(lanes), taker(store) {
        store.learn = [this](std::size_t l, tp t) { taker.learn(l, t); };
    }
    fixture(const fixture&) = delete;
    fixture& operator=(const fixture&) = delete;
    ~fixture() { rescue(); }

    take_thread& start(std::size_t want, std::chrono::milliseconds max_wait,
                       std::function<void(const std::exception&)> on_error = {}) {
        return takes_.emplace_back(taker, want, max_wait, std::move(on_error));
    }

    // `followers` takes asleep on the clock and `leading` in wait_wake() (for a store without a
    // wake source the leader sleeps on the clock too: count it in `followers`).
    bool settled(std::size_t followers, int leading) {
        return eventually([&] {
            return manual_clock::sleepers() == followers && store.in_wait.load() == leading;
        });
    }

    // The take that leads waits for its wake: in wait_wake(), or asleep on the clock.
    bool leader_waits(std::size_t others_asleep = 0) {
        if constexpr (Shape::external_wake) return settled(others_asleep, 1);
        return settled(others_asleep + 1, 0);
    }

    // Takes once, so that the wake source is open and every lane known (the manual clock moves by
    // 1 ms).
    void warm_up() {
        auto& w = start(1, 1ms);
        REQUIRE(leader_waits());
        manual_clock::advance(1ms);
        REQUIRE(w.finished());
        REQUIRE(w.error() == nullptr);
    }

    // Every take ended, and the invariants that every case checks held.
    void finish() {
        for (auto& t : takes_) CHECK(t.finished());
        rescue();
        CHECK(store.max_in_wait.load() <= 1);  // (I1) one leader on the wake source at most
    }

    struct clock_reset {
        clock_reset() { manual_clock::reset(); }
    } reset_;  // first: the taker reads the clock when it is made
    store_type store;
    taker_type taker;

  private:
    bool all_done() const {
        return std::all_of(takes_.begin(), takes_.end(), [](auto& t) { return t.done(); });
    }
    void rescue() {
        if (!all_done()) {
            store.shut();
            for (int i = 0; i < 200 && !all_done(); ++i) {
                manual_clock::advance(24h);
                std::this_thread::sleep_for(50ms);
            }
            if (!all_done()) {
                std::fputs("test_job_queue_taker: a take never returned\n", stderr);
                std::abort();
            }
        }
        for (auto& t : takes_) t.join();
    }
    std::list<take_thread> takes_;
};

}  // namespace

TEMPLATE_TEST_CASE("taker: one leader among 16 waiting takes, and each gets its job", "[taker]",
                   redis_like, pg_like) {
    fixture<TestType> f;
    std::vector<take_thread*> takes;
    for (int i = 0; i < 16; ++i) takes.push_back(&f.start(1, 10s));
    REQUIRE(f.settled(15, 1));  // one in wait_wake(), fifteen followers
    const int before = f.store.claims.load();
    for (std::size_t i = 0; i < 16; ++i) {
        const std::size_t lane = i % f.store.lanes();
        f.store.add(lane, at(100ms), "j" + std::to_string(i));
        f.taker.hint(lane, at(100ms));
    }
    manual_clock::advance(100ms);
    std::set<std::string> out;
    for (auto* t : takes) {
        REQUIRE(t->finished());
        INFO(message_of(t->error()));
        CHECK(t->error() == nullptr);
        CHECK(t->jobs().size() == 1);
        for (auto& j : t->jobs()) out.insert(j.id);
    }
    CHECK(out.size() == 16);
    CHECK(f.store.leased.load() == 16);
    if constexpr (TestType::claim_for_all) CHECK(f.store.claims.load() - before == 1);
    f.finish();
}

TEST_CASE("taker: a take times out at its max_wait with nothing, and the post moves on",
          "[taker]") {
    fixture<redis_like> f;
    auto& a = f.start(1, 100ms);
    REQUIRE(f.leader_waits());
    auto& b = f.start(1, 1s);
    REQUIRE(f.settled(1, 1));
    manual_clock::advance(100ms);
    REQUIRE(a.finished());
    CHECK(a.error() == nullptr);
    CHECK(a.jobs().empty());
    CHECK(a.at() == at(100ms));
    // b leads now: news reach it through the wake source alone (no clock move wakes it).
    REQUIRE(f.settled(0, 1));
    CHECK_FALSE(b.done());
    f.store.add(2, at(100ms), "x");
    f.store.tell({{2, at(100ms)}});
    REQUIRE(b.finished());
    CHECK(ids(b.jobs()) == std::vector<std::string>{"x"});
    CHECK(b.at() == at(100ms));
    f.finish();
}

TEMPLATE_TEST_CASE("taker: a follower times out at its max_wait with nothing, the leader stays",
                   "[taker]", redis_like, sqlite_like, pg_like) {
    fixture<TestType> f(1);
    f.warm_up();
    auto& l = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    auto& w = f.start(1, 50ms);
    REQUIRE(f.leader_waits(1));
    manual_clock::advance(50ms);
    REQUIRE(w.finished());
    CHECK(w.error() == nullptr);
    CHECK(w.jobs().empty());
    CHECK(w.at() == at(51ms));
    REQUIRE(f.leader_waits());
    CHECK_FALSE(l.done());
    const tp now = manual_clock::now();
    f.store.add(0, now, "j");
    f.taker.hint(0, now);
    REQUIRE(l.finished());
    CHECK(ids(l.jobs()) == std::vector<std::string>{"j"});
    CHECK(l.at() == now);
    f.finish();
}

TEST_CASE("taker: a leader that got its job hands the post on", "[taker]") {
    fixture<redis_like> f(1);
    f.warm_up();
    auto& l = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    auto& w = f.start(1, 10s);
    REQUIRE(f.settled(1, 1));
    const tp now = manual_clock::now();
    f.store.add(0, now, "a");
    f.store.tell({{0, now}});
    REQUIRE(l.finished());
    CHECK(ids(l.jobs()) == std::vector<std::string>{"a"});
    // w leads now (no clock move woke it): the next news reach it.
    REQUIRE(f.leader_waits());
    f.store.add(0, now, "b");
    f.store.tell({{0, now}});
    REQUIRE(w.finished());
    CHECK(ids(w.jobs()) == std::vector<std::string>{"b"});
    CHECK(w.at() == now);
    f.finish();
}

TEMPLATE_TEST_CASE(
    "taker: news heard while a claim that found nothing is on its way bring a "
    "second claim (I3)",
    "[taker]", redis_like, sqlite_like, pg_like) {
    fixture<TestType> f(1);
    f.warm_up();  // the wake source is open and the lane known empty: only news can help now
    f.store.hold_next(1);
    auto& t = f.start(1, 10s);
    if constexpr (!TestType::look_on_entry) {  // it trusts the empty lane: tell it to look
        REQUIRE(f.leader_waits());
        f.store.tell({{0, tp::min()}});
    }
    REQUIRE(eventually([&] { return f.store.held.load() == 1; }));
    const tp now = manual_clock::now();
    f.store.add(0, now, "j");
    if constexpr (TestType::commits)
        f.store.commit(0);  // the put's commit: the truth, after the claim's
    else
        f.taker.hint(0, now);
    f.store.release();  // the answer "nothing queued" arrives after the put
    REQUIRE(t.finished());
    CHECK(t.error() == nullptr);
    CHECK(ids(t.jobs()) == std::vector<std::string>{"j"});
    CHECK(t.at() == now);  // not at a later recheck or limit
    f.finish();
}

TEST_CASE("taker: news brought through another waiting take while a claim is on its way",
          "[taker]") {
    fixture<redis_like> f(1);
    f.warm_up();
    f.store.hold_next(1);
    auto& t = f.start(1, 10s);  // claims on entry: held
    REQUIRE(eventually([&] { return f.store.held.load() == 1; }));
    auto& l = f.start(1, 10s);  // claims too (on entry), finds nothing, leads
    REQUIRE(f.leader_waits());
    const tp now = manual_clock::now();
    const int waits = f.store.wait_calls.load();
    f.store.add(0, now, "j");
    f.store.tell({{0, now}});  // heard by l: it must lower t's floor too
    // l heard it, found the lane claimed by t, and waits again.
    REQUIRE(eventually([&] { return f.store.wait_calls.load() > waits; }));
    REQUIRE(f.leader_waits());
    f.store.release();
    // Exactly one of them gets the job, the clock standing still.
    REQUIRE(eventually([&] { return t.done() || l.done(); }));
    manual_clock::advance(10s);  // the other one times out
    REQUIRE(t.finished());
    REQUIRE(l.finished());
    CHECK(t.jobs().size() + l.jobs().size() == 1);
    CHECK((t.done() && !t.jobs().empty() ? t.at() : l.at()) == now);
    f.finish();
}

TEST_CASE("taker: a claim hung on one lane does not stop the wake source from being read (I6)",
          "[taker]") {
    fixture<redis_like> f(2);
    f.warm_up();
    f.store.hold_next(1);
    auto& t = f.start(1, 10s);  // its claim on lane 0 hangs
    REQUIRE(eventually([&] { return f.store.held.load() == 1; }));
    auto& l = f.start(1, 10s);  // looks too, then leads
    REQUIRE(f.leader_waits());
    const tp now = manual_clock::now();
    f.store.add(1, now, "j");
    f.store.tell({{1, now}});
    REQUIRE(l.finished());
    CHECK(ids(l.jobs()) == std::vector<std::string>{"j"});
    CHECK(l.at() == now);
    CHECK_FALSE(t.done());
    f.store.release();
    REQUIRE(eventually([&] { return f.store.held.load() == 0; }));
    manual_clock::advance(10s);
    REQUIRE(t.finished());
    CHECK(t.jobs().empty());
    f.finish();
}

TEST_CASE(
    "taker: a wake source that cannot be opened fails the take that tried, the next one "
    "tries again",
    "[taker]") {
    fixture<redis_like> f(1);
    f.store.fail_open(1);
    auto& t = f.start(1, 10s);
    REQUIRE(t.finished());
    REQUIRE(t.error() != nullptr);
    CHECK_THROWS_AS(std::rethrow_exception(t.error()), store_error);
    auto& u = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    CHECK(f.store.open_wakes.load() == 2);
    f.store.add(0, manual_clock::now(), "j");
    f.store.tell({{0, manual_clock::now()}});
    REQUIRE(u.finished());
    CHECK(ids(u.jobs()) == std::vector<std::string>{"j"});
    f.finish();
}

TEST_CASE("taker: several lanes due at once are claimed by as many waiting takes", "[taker]") {
    fixture<redis_like> f(3);
    f.warm_up();
    std::vector<take_thread*> takes;
    takes.push_back(&f.start(1, 10s));
    REQUIRE(f.leader_waits());
    for (std::size_t i = 1; i < 4; ++i) {
        takes.push_back(&f.start(1, 10s));
        REQUIRE(f.settled(i, 1));
    }
    const tp now = manual_clock::now();
    std::vector<jq::news<manual_clock>> said;
    for (std::size_t l = 0; l < 3; ++l) {
        f.store.add(l, now, "j" + std::to_string(l));
        said.push_back({l, now});
    }
    f.store.tell(said);  // one message per lane, read by the leader at once
    // Three jobs due now, in three lanes, and four takes waiting: three must get one each, the
    // clock standing still (a follower left asleep would wait for its own limit).
    REQUIRE(eventually(
        [&] {
            return std::count_if(takes.begin(), takes.end(), [](auto* t) { return t->done(); }) ==
                   3;
        },
        5s));
    CHECK(f.store.queued() == 0);
    manual_clock::advance(10s);  // the fourth: nothing for it
    std::set<std::string> out;
    for (auto* t : takes) {
        REQUIRE(t->finished());
        for (auto& id : ids(t->jobs())) out.insert(id);
    }
    CHECK(out == std::set<std::string>{"j0", "j1", "j2"});
    f.finish();
}

TEST_CASE(
    "taker: one claim answers every waiting take, in the order they came, each up to its "
    "want (PostgreSQL shape)",
    "[taker]") {
    fixture<pg_like> f;
    f.warm_up();
    std::vector<take_thread*> takes;
    for (std::size_t i = 0; i < 5; ++i) {  // wants 1..5, one after the other
        takes.push_back(&f.start(i + 1, 10s));
        REQUIRE(f.settled(i, 1));
    }
    const int before = f.store.claims.load();
    for (int k = 1; k <= 30; ++k) {
        const std::string id = (k < 10 ? "j0" : "j") + std::to_string(k);
        f.store.add(0, at(1ms + std::chrono::microseconds(k)), id);
    }
    f.taker.hint(0, at(1ms + 1us));
    manual_clock::advance(50ms);
    for (auto* t : takes) REQUIRE(t->finished());
    REQUIRE(f.store.claims.load() - before == 1);
    const claim_record c = f.store.log().back();
    CHECK(c.n == 15);
    CHECK(c.got == 15);
    // The claimer first, then the others in the order they came.
    std::vector<take_thread*> order;
    for (auto* t : takes)
        if (t->id() == c.by) order.push_back(t);
    REQUIRE(order.size() == 1);
    for (auto* t : takes)
        if (t->id() != c.by) order.push_back(t);
    std::vector<std::string> handed;
    for (auto* t : order) {
        INFO(message_of(t->error()));
        CHECK(t->error() == nullptr);
        const std::size_t want =
            static_cast<std::size_t>(std::find(takes.begin(), takes.end(), t) - takes.begin() + 1);
        CHECK(t->jobs().size() == want);
        for (auto& id : ids(t->jobs())) handed.push_back(id);
    }
    std::vector<std::string> expected;
    for (int k = 1; k <= 15; ++k) expected.push_back((k < 10 ? "j0" : "j") + std::to_string(k));
    CHECK(handed == expected);
    CHECK(f.store.queued() == 15);
    f.finish();
}

TEST_CASE("taker: a claim for all asks for claim_cap at most (PostgreSQL shape)", "[taker]") {
    fixture<pg_like> f;
    f.warm_up();
    std::vector<take_thread*> takes;
    for (std::size_t i = 0; i < 4; ++i) {
        takes.push_back(&f.start(400, 10s));
        REQUIRE(f.settled(i, 1));
    }
    for (int k = 0; k < 2000; ++k) f.store.add(0, at(2ms), "j" + std::to_string(k));
    f.taker.hint(0, at(2ms));
    const std::size_t first = f.store.log().size();
    manual_clock::advance(2ms);
    std::set<std::string> out;
    std::size_t total = 0;
    for (auto* t : takes) {
        REQUIRE(t->finished());
        CHECK(t->error() == nullptr);
        CHECK_FALSE(t->jobs().empty());
        CHECK(t->jobs().size() <= 400);
        total += t->jobs().size();
        for (auto& id : ids(t->jobs())) out.insert(id);
    }
    const auto log = f.store.log();
    REQUIRE(log.size() == first + 2);
    CHECK(log[first].n == 1000);  // 400 + 400 + 400 asked, capped; the 4th claims on its own
    CHECK(log[first + 1].n == 400);
    for (auto& c : log) CHECK(c.n <= 1000);
    CHECK(out.size() == total);
    CHECK(total == f.store.leased.load());
    CHECK(total == 1400);
    f.finish();
}

TEST_CASE(
    "taker: a take counted in a claim on its way outlives its max_wait and gets its jobs "
    "(PostgreSQL shape, I2)",
    "[taker]") {
    fixture<pg_like> f;
    f.warm_up();
    auto& l = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    auto& x = f.start(1, 50ms);
    REQUIRE(f.settled(1, 1));
    f.store.hold_next(1);
    const tp now = manual_clock::now();
    f.store.add(0, now, "a");
    f.store.add(0, now, "b");
    f.taker.hint(0, now);
    REQUIRE(eventually([&] { return f.store.held.load() == 1; }));
    manual_clock::advance(1s);  // past x's limit while the claim that counts it is on its way
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(x.done());
    CHECK_FALSE(l.done());
    f.store.release();
    REQUIRE(x.finished());
    REQUIRE(l.finished());
    CHECK(x.jobs().size() == 1);
    CHECK(l.jobs().size() == 1);
    CHECK(f.store.log().back().n == 2);
    CHECK(f.store.leased.load() == 2);
    f.finish();
}

TEST_CASE(
    "taker: a leader answered by another take's claim for all is woken from its wait "
    "(PostgreSQL shape)",
    "[taker]") {
    fixture<pg_like> f;
    f.warm_up();
    auto& l = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    auto& w = f.start(1, 10s);
    REQUIRE(f.settled(1, 1));
    const tp now = manual_clock::now();
    for (const char* id : {"a", "b", "c"}) f.store.add(0, now, id);  // nobody told
    // take(0) asks anyway, takes one and learns that more is due: the follower is woken and
    // claims for every waiting take, the leader asleep on the wake source included.
    auto& z = f.start(1, 0ms);
    REQUIRE(z.finished());
    CHECK(z.jobs().size() == 1);
    REQUIRE(w.finished());
    CHECK(w.jobs().size() == 1);
    CHECK(eventually([&] { return l.done(); }, 5s));  // its job leased, the clock standing still
    manual_clock::advance(10s);
    REQUIRE(l.finished());
    CHECK(l.jobs().size() == 1);
    CHECK(l.at() == now);
    CHECK(f.store.leased.load() == 3);
    f.finish();
}

TEST_CASE(
    "taker: each take of a failed claim for all gets an exception object of its own "
    "(PostgreSQL shape, I4)",
    "[taker]") {
    fixture<pg_like> f;
    f.warm_up();
    constexpr std::size_t n = 4;
    std::vector<delayq::test::caught> got(n);
    std::atomic<std::size_t> recorded{0};
    std::vector<take_thread*> takes;
    for (std::size_t i = 0; i < n; ++i) {
        takes.push_back(&f.start(1, 10s, [&, i](const std::exception& e) {
            got[i].record(e, "store_error");
            ++recorded;
            (void)eventually([&] { return recorded.load() == n; });
            got[i].read_apart(e);
        }));
        REQUIRE(f.settled(i, 1));
    }
    const int before = f.store.claims.load();
    f.store.fail(0, 1);
    f.taker.hint(0, manual_clock::now());
    for (auto* t : takes) {
        REQUIRE(t->finished());
        CHECK(t->error() != nullptr);
    }
    CHECK(f.store.claims.load() - before == 1);
    CHECK(f.store.log().back().n == n);
    REQUIRE(recorded.load() == n);
    delayq::test::check_apart(got);
    f.finish();
}

TEST_CASE(
    "taker: a failing lane is set aside while the others serve, every lane failing is the "
    "caller's (Redis shape)",
    "[taker]") {
    SECTION("one lane fails") {
        fixture<redis_like> f(3);
        for (std::size_t l = 0; l < 3; ++l) f.store.add(l, at(0ms), "a" + std::to_string(l));
        f.store.fail(0, -1);
        auto& t1 = f.start(1, 1s);
        REQUIRE(t1.finished());
        INFO(message_of(t1.error()));
        CHECK(t1.error() == nullptr);
        CHECK(ids(t1.jobs()) == std::vector<std::string>{"a1"});
        auto& t2 = f.start(1, 1s);
        REQUIRE(t2.finished());
        CHECK(ids(t2.jobs()) == std::vector<std::string>{"a2"});
        const auto on_lane0 = [&] {
            const auto log = f.store.log();
            return std::count_if(log.begin(), log.end(), [](auto& c) { return c.lane == 0; });
        };
        CHECK(on_lane0() == 1);
        // While it is set aside (100 ms), nobody claims there.
        auto& t3 = f.start(1, 50ms);
        REQUIRE(f.leader_waits());
        manual_clock::advance(50ms);
        REQUIRE(t3.finished());
        CHECK(t3.error() == nullptr);
        CHECK(t3.jobs().empty());
        CHECK(on_lane0() == 1);
        // Healed, and its pause over: it serves again.
        f.store.fail(0, 0);
        manual_clock::advance(50ms);
        auto& t4 = f.start(1, 1s);
        REQUIRE(t4.finished());
        CHECK(ids(t4.jobs()) == std::vector<std::string>{"a0"});
        f.finish();
    }
    SECTION("every lane fails") {
        fixture<redis_like> f(3);
        for (std::size_t l = 0; l < 3; ++l) {
            f.store.add(l, at(0ms), "a" + std::to_string(l));
            f.store.fail(l, -1);
        }
        auto& t = f.start(1, 10s);
        REQUIRE(t.finished());  // the clock standing still: no waiting for max_wait
        REQUIRE(t.error() != nullptr);
        CHECK_THROWS_AS(std::rethrow_exception(t.error()), store_error);
        CHECK(f.store.claims.load() == 3);
        CHECK(f.store.queued() == 3);
        f.finish();
    }
}

TEST_CASE(
    "taker: the commits learned as the truth bring no claim spin, the recheck comes at "
    "recheck_every (SQLite shape)",
    "[taker]") {
    fixture<sqlite_like> f;
    SECTION("a claim whose own commit says the same next event claims once") {
        f.store.add(0, at(500ms), "j");
        auto& t = f.start(1, 1s);
        REQUIRE(f.leader_waits());
        std::this_thread::sleep_for(20ms);  // a spin would show here
        CHECK(f.store.claims.load() == 1);
        manual_clock::advance(200ms);  // the recheck: nothing changed
        REQUIRE(eventually([&] { return f.store.changed_calls.load() == 1; }));
        REQUIRE(f.leader_waits());
        CHECK(f.store.claims.load() == 1);
        manual_clock::advance(300ms);
        REQUIRE(t.finished());
        CHECK(ids(t.jobs()) == std::vector<std::string>{"j"});
        CHECK(t.at() == at(500ms));
        CHECK(f.store.claims.load() == 2);
        f.finish();
    }
    SECTION("changed_elsewhere() at recheck_every, not earlier; true: the lane is claimed again") {
        auto& t = f.start(1, 10s);
        REQUIRE(f.leader_waits());
        CHECK(f.store.claims.load() == 1);
        for (int i = 0; i < 3; ++i) {  // 100, 150, 199 ms: too early
            const auto begun = manual_clock::sleeps_begun();
            manual_clock::advance(i == 0 ? 100ms : i == 1 ? 50ms : 49ms);
            REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > begun; }));
            REQUIRE(f.leader_waits());
            CHECK(f.store.changed_calls.load() == 0);
        }
        manual_clock::advance(1ms);
        REQUIRE(eventually([&] { return f.store.changed_calls.load() == 1; }));
        CHECK(f.store.changed_at().front() == at(200ms));
        REQUIRE(f.leader_waits());
        manual_clock::advance(150ms);  // 350 ms: the next recheck is at 400
        REQUIRE(f.leader_waits());
        f.store.add(0, at(300ms), "elsewhere");  // another process's put: nobody is told
        f.store.answer_changed(1);
        const auto begun = manual_clock::sleeps_begun();
        manual_clock::advance(10ms);  // 360 ms: not yet
        REQUIRE(eventually([&] { return manual_clock::sleeps_begun() > begun; }));
        CHECK(f.store.changed_calls.load() == 1);
        CHECK_FALSE(t.done());
        manual_clock::advance(40ms);  // 400 ms
        REQUIRE(t.finished());
        CHECK(ids(t.jobs()) == std::vector<std::string>{"elsewhere"});
        CHECK(t.at() == at(400ms));
        CHECK(f.store.changed_calls.load() == 2);
        CHECK(f.store.claims.load() == 2);
        f.finish();
    }
}

TEST_CASE(
    "taker: a take sends no claim while the lane is known not due, take(0) claims once and "
    "never waits (PostgreSQL shape)",
    "[taker]") {
    fixture<pg_like> f;
    f.store.add(0, at(10s), "later");
    auto& a = f.start(1, 100ms);
    REQUIRE(f.leader_waits());
    const int known = f.store.claims.load();
    const int opened = f.store.open_wakes.load();
    auto& b = f.start(1, 50ms);
    REQUIRE(f.settled(1, 1));
    std::this_thread::sleep_for(20ms);
    CHECK(f.store.claims.load() == known);
    manual_clock::advance(100ms);
    REQUIRE(a.finished());
    REQUIRE(b.finished());
    CHECK(a.jobs().empty());
    CHECK(b.jobs().empty());
    CHECK(f.store.claims.load() == known);
    const int waits = f.store.wait_calls.load();
    for (int i = 1; i <= 3; ++i) {
        auto& z = f.start(1, 0ms);
        REQUIRE(z.finished());
        CHECK(z.jobs().empty());
        CHECK(f.store.claims.load() == known + i);
    }
    f.store.add(0, manual_clock::now(), "now");  // nobody told: take(0) asks anyway
    auto& z = f.start(1, 0ms);
    REQUIRE(z.finished());
    CHECK(ids(z.jobs()) == std::vector<std::string>{"now"});
    CHECK(f.store.claims.load() == known + 4);
    CHECK(f.store.wait_calls.load() == waits);
    CHECK(f.store.open_wakes.load() == opened);
    f.finish();
}

TEST_CASE("taker: take(0) never opens or waits on the wake source (Redis shape)", "[taker]") {
    fixture<redis_like> f(3);
    f.store.add(1, at(0ms), "j");
    auto& z = f.start(1, 0ms);
    REQUIRE(z.finished());
    CHECK(ids(z.jobs()) == std::vector<std::string>{"j"});
    auto& e = f.start(1, 0ms);
    REQUIRE(e.finished());
    CHECK(e.jobs().empty());
    CHECK(f.store.open_wakes.load() == 0);
    CHECK(f.store.wait_calls.load() == 0);
    f.finish();
}

TEMPLATE_TEST_CASE("taker: a lost wake source is opened again and every lane looked at again",
                   "[taker]", redis_like, pg_like) {
    fixture<TestType> f;
    auto& t = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    REQUIRE(f.store.open_wakes.load() == 1);
    const int claims = f.store.claims.load();
    f.store.lose_wake();
    REQUIRE(eventually([&] { return f.store.open_wakes.load() == 2; }));
    REQUIRE(f.leader_waits());
    CHECK(f.store.claims.load() >= claims + static_cast<int>(f.store.lanes()));
    CHECK_FALSE(t.done());
    f.store.lose_wake();  // a second loss in the same take
    if constexpr (TestType::wake_losses_per_take == 1) {
        REQUIRE(t.finished());
        REQUIRE(t.error() != nullptr);
        CHECK_THROWS_AS(std::rethrow_exception(t.error()), store_error);
        auto& u = f.start(1, 10s);  // the next take opens it anew
        REQUIRE(f.leader_waits());
        CHECK(f.store.open_wakes.load() == 3);
        f.store.add(0, manual_clock::now(), "j");
        f.store.tell({{0, tp::min()}});
        REQUIRE(u.finished());
        CHECK(ids(u.jobs()) == std::vector<std::string>{"j"});
    } else {
        REQUIRE(eventually([&] { return f.store.open_wakes.load() == 3; }));
        REQUIRE(f.leader_waits());
        CHECK_FALSE(t.done());
        f.store.add(0, manual_clock::now(), "j");
        f.store.tell({{0, manual_clock::now()}});
        REQUIRE(t.finished());
        CHECK(t.error() == nullptr);
        CHECK(ids(t.jobs()) == std::vector<std::string>{"j"});
    }
    f.finish();
}

TEMPLATE_TEST_CASE("taker: after fork() the next take forgets the parent's state, and works",
                   "[taker]", redis_like, sqlite_like, pg_like) {
    fixture<TestType> f(1);
    f.warm_up();  // lane known empty, wake source (if any) open
    const int opened = f.store.open_wakes.load();
    f.store.add(0, manual_clock::now(), "j");  // nobody told
    delayq::detail::fork_count().fetch_add(1);
    auto& t = f.start(1, 10s);
    REQUIRE(t.finished());  // every lane unknown again: it claims at once
    CHECK(ids(t.jobs()) == std::vector<std::string>{"j"});
    CHECK(f.store.drops.load() == 1);
    // The parent's wake source is not the child's: the next waiting take opens its own.
    auto& u = f.start(1, 10s);
    REQUIRE(f.leader_waits());
    if constexpr (TestType::external_wake) CHECK(f.store.open_wakes.load() == opened + 1);
    f.store.add(0, manual_clock::now(), "k");
    f.taker.hint(0, manual_clock::now());
    REQUIRE(u.finished());
    CHECK(ids(u.jobs()) == std::vector<std::string>{"k"});
    CHECK(f.store.drops.load() == 1);
    f.finish();
}

TEMPLATE_TEST_CASE(
    "taker: a random soak: every job comes out once, none after its due time plus "
    "one step",
    "[taker]", redis_like, sqlite_like, pg_like) {
    fixture<TestType> f(TestType::external_wake && !TestType::claim_for_all ? 4 : 1);
    constexpr auto step = 5ms;
    constexpr int steps = 400, threads = 4;
    std::mutex m;
    std::map<std::string, std::vector<tp>> taken;  // id: when each take returned it
    std::map<std::string, tp> due;
    std::atomic<int> errors{0};
    std::atomic<std::size_t> returned{0};
    // The workers take until told to stop; however the case ends, they are stopped (their takes
    // end at their limits: the clock is moved until they have all left) and joined.
    struct workers {
        std::atomic<bool> stop{false};
        std::vector<std::thread> threads;
        ~workers() {
            stop = true;
            std::atomic<bool> joined{false};
            std::thread nudge([&] {
                const auto give_up = std::chrono::steady_clock::now() + 30s;
                while (!joined.load() && std::chrono::steady_clock::now() < give_up) {
                    manual_clock::advance(1s);
                    std::this_thread::sleep_for(5ms);
                }
                if (!joined.load()) {
                    std::fputs("test_job_queue_taker: a soak worker never returned\n", stderr);
                    std::abort();
                }
            });
            for (auto& t : threads) t.join();
            joined = true;
            nudge.join();
        }
    };
    std::size_t put = 0;
    {
        workers w;
        for (int k = 0; k < threads; ++k)
            w.threads.emplace_back([&, k] {
                std::mt19937 rng(static_cast<unsigned>(k) * 7919U + 1U);
                while (!w.stop.load()) {
                    const std::size_t want = 1 + rng() % 3;
                    const auto max_wait =
                        rng() % 10 == 0 ? 0ms : std::chrono::milliseconds(1 + rng() % 40);
                    try {
                        const auto jobs = f.taker.take(want, max_wait);
                        const tp now = manual_clock::now();
                        if (jobs.size() > want) ++errors;
                        std::lock_guard lk(m);
                        for (auto& j : jobs) taken[j.id].push_back(now);
                        returned += jobs.size();
                    } catch (...) {
                        ++errors;
                    }
                }
            });
        std::mt19937 rng(12345);
        for (int s = 0; s < steps; ++s) {
            for (unsigned k = s < steps - 10 ? rng() % 5 : 0; k > 0; --k) {  // the last 10: drain
                const std::size_t lane = rng() % f.store.lanes();
                const tp when = manual_clock::now() + std::chrono::milliseconds(rng() % 30);
                const std::string id = "j" + std::to_string(put++);
                {
                    std::lock_guard lk(m);
                    due[id] = when;
                }
                f.store.add(lane, when, id);
                const unsigned how = rng() % 2;
                if constexpr (TestType::commits) {  // a put in this process, or its commit
                    if (how == 0)
                        f.taker.hint(lane, when);
                    else
                        f.store.commit(lane);
                } else if constexpr (TestType::claim_for_all) {  // a NOTIFY says "look"
                    if (how == 0)
                        f.taker.hint(lane, when);
                    else
                        f.store.tell({{lane, tp::min()}});
                } else {  // a PUBLISH says when
                    if (how == 0)
                        f.taker.hint(lane, when);
                    else
                        f.store.tell({{lane, when}});
                }
            }
            if constexpr (!TestType::commits && !TestType::claim_for_all) {
                if (rng() % 3 == 0) {  // an ack, whose script says when the lane's next event is
                    const std::size_t lane = rng() % f.store.lanes();
                    f.taker.learn_from(lane, [&](tp& next) {
                        next = f.store.earliest_in(lane);
                        return 0;
                    });
                }
            }
            manual_clock::advance(step);
            // Before the clock moves on, whatever is due now has come out of its take.
            INFO("step " << s);
            REQUIRE(eventually(
                [&] {
                    return f.store.earliest() > manual_clock::now() &&
                           returned.load() == f.store.leased.load();
                },
                10s));
        }
        CHECK(f.store.queued() == 0);
    }
    CHECK(put > 600);
    CHECK(errors.load() == 0);
    CHECK(f.store.put.load() == put);
    CHECK(f.store.leased.load() == put);
    std::lock_guard lk(m);
    CHECK(taken.size() == put);
    for (auto& [id, when] : taken) {
        INFO(id);
        REQUIRE(when.size() == 1);
        CHECK(when[0] >= due[id]);
        CHECK(when[0] <= due[id] + step);
    }
    f.finish();
}

TEST_CASE("taker: another lane goes first when it came due before this one (Redis shape)",
          "[taker]") {
    fixture<redis_like> f(3);
    f.taker.learn(0, at(5ms));
    f.taker.learn(1, at(1ms));
    f.taker.learn(2, tp::max());               // empty
    CHECK_FALSE(f.taker.other_lane_first(0));  // nothing is due yet
    manual_clock::advance(2ms);
    CHECK(f.taker.other_lane_first(0));  // lane 1 is due, lane 0 not yet
    CHECK_FALSE(f.taker.other_lane_first(1));
    manual_clock::advance(4ms);  // both due: the earlier first
    CHECK(f.taker.other_lane_first(0));
    CHECK_FALSE(f.taker.other_lane_first(1));
    f.taker.learn(0, at(0ms));  // lane 0 says it was due before lane 1
    CHECK_FALSE(f.taker.other_lane_first(0));
    CHECK(f.taker.other_lane_first(1));
    CHECK(f.taker.other_lane_first(2));  // an empty lane: both others are due
    f.finish();
}
