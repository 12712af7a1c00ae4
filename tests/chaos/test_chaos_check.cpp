// The chaos check's judge (chaos_check.hpp) on logs written by hand: each broken promise is found,
// and nothing that at-least-once delivery allows (a process killed in the middle of a call, a
// lease that ended, a redelivery) is called a violation.
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "chaos_check.hpp"

namespace {

using delayq_chaos::event;
using delayq_chaos::final_state;

constexpr long long ms = 1'000'000;               // ns
constexpr long long t0 = 1'000 * ms;              // CLOCK_MONOTONIC at the "start"
constexpr long long r0 = 1'700'000'000'000 * ms;  // CLOCK_REALTIME then

// A process's log, built line by line; `at` is ms after the start, on both clocks.
struct log_builder {
    explicit log_builder(int f) : file(f) {}
    int file;
    std::vector<event> events;
    log_builder& operator()(long long at, const std::string& text) {
        event e;
        const std::string full =
            std::to_string(t0 + at * ms) + " " + std::to_string(r0 + at * ms) + " " + text;
        REQUIRE(delayq_chaos::parse_line(full, e));
        e.file = file;
        e.no = events.size() + 1;
        events.push_back(e);
        return *this;
    }
};

std::string ns_at(long long at) {
    return std::to_string(r0 + at * ms);
}

// "job SEQ ID ATTEMPTS TOKEN DEADLINE LEASE", times in ms after the start.
std::string job(int seq, const std::string& id, int attempts, int token, long long due,
                long long lease_end) {
    return "job " + std::to_string(seq) + " " + id + " " + std::to_string(attempts) + " " +
           std::to_string(token) + " " + ns_at(due) + " " + ns_at(lease_end);
}

// A producer that put `id`, due at `due` ms, between 0 and 10 ms.
log_builder producer(const std::string& id, long long due = 0, bool poison = false) {
    log_builder p(0);
    p(0, "put-begin " + id + (poison ? " 1 " : " 0 ") + ns_at(due) +
             " after:" + std::to_string(due))(10, "put-end " + id + " 1");
    return p;
}

// Judges `logs` with `cs`, each log's events numbered as the log's place in the list.
delayq_chaos::report check_logs(std::initializer_list<log_builder> logs, const final_state& end,
                                const delayq_chaos::check_settings& cs) {
    std::vector<std::vector<event>> all;
    for (const auto& l : logs) {
        all.push_back(l.events);
        for (auto& e : all.back()) e.file = static_cast<int>(all.size() - 1);
    }
    return delayq_chaos::check(all, end, cs);
}

std::multiset<std::string> kinds(std::initializer_list<log_builder> logs, const final_state& end,
                                 unsigned max_attempts = 3, long long max_leased = 0) {
    delayq_chaos::check_settings cs;
    cs.max_attempts = max_attempts;
    cs.max_leased = max_leased;
    const auto r = check_logs(logs, end, cs);
    std::multiset<std::string> out;
    for (const auto& v : r.violations) {
        out.insert(v.kind);
        // Every violation shows its events, but those about the store as a whole.
        if (v.kind != "integrity" && v.kind != "store-unreadable") CHECK(!v.evidence.empty());
    }
    return out;
}

final_state empty_end() {
    final_state s;
    s.read = true;
    s.integrity = "ok";
    return s;
}

final_state queued(const std::string& id) {
    auto s = empty_end();
    s.queued.insert(id);
    return s;
}

final_state dead(const std::string& id, long long attempts) {
    auto s = empty_end();
    s.dead[id] = attempts;
    return s;
}

const std::multiset<std::string> none;

}  // namespace

TEST_CASE("chaos check: a job put, taken and acked is no violation") {
    log_builder c(1);
    c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
        40, "ack-begin a 7")(50, "ack-end a 7 1");
    CHECK(kinds({producer("a"), c}, empty_end()) == none);
}

TEST_CASE("chaos check: a returned put that is nowhere at the end is lost") {
    CHECK(kinds({producer("a")}, empty_end()) == std::multiset<std::string>{"lost"});
    CHECK(kinds({producer("a")}, queued("a")) == none);
}

TEST_CASE("chaos check: what a process killed mid-call may have done is not a loss") {
    SECTION("killed between an ack's return and its log line") {
        log_builder c(1);
        c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
            40, "ack-begin a 7");
        CHECK(kinds({producer("a"), c}, empty_end()) == none);
    }
    SECTION("killed in a cancel") {
        log_builder k(1);
        k(20, "cancel-begin a");
        CHECK(kinds({producer("a"), k}, empty_end()) == none);
    }
    SECTION("a put whose process died before its log line may or may not exist") {
        log_builder p(0);
        p(0, "put-begin a 0 " + ns_at(0) + " after:0");
        CHECK(kinds({p}, empty_end()) == none);
        log_builder c(1);
        c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
            40, "ack-begin a 7")(50, "ack-end a 7 1");
        CHECK(kinds({p, c}, empty_end()) == none);
    }
}

TEST_CASE("chaos check: a redelivery after a lease ended is at-least-once, not a violation") {
    // The first consumer died holding the job (its lease ended at 1030); the second took it at
    // 1100 with attempts 2 and acked it.
    log_builder c1(1), c2(2);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030));
    c2(1050, "take-begin 0 1 100")(1100, "take-end 0 1")(1100, job(0, "a", 2, 9, 1030, 2100))(
        1110, "ack-begin a 9")(1120, "ack-end a 9 1");
    CHECK(kinds({producer("a"), c1, c2}, empty_end()) == none);
    SECTION("a consumer killed after the server leased it, before it logged the take") {
        log_builder c3(1);
        c3(20, "take-begin 0 1 100");  // attempts 1 went to it; the log shows only attempts 2
        CHECK(kinds({producer("a"), c3, c2}, empty_end()) == none);
    }
}

TEST_CASE("chaos check: handed out by a take that began after cancel() returned true") {
    log_builder k(1), c(2);
    k(20, "cancel-begin a")(30, "cancel-end a 1");
    SECTION("the take began after the cancel returned") {
        c(40, "take-begin 0 1 0")(45, "take-end 0 1")(45, job(0, "a", 1, 7, 0, 1045));
        CHECK(kinds({producer("a"), k, c}, empty_end()) ==
              std::multiset<std::string>{"ran-after-cancel"});
    }
    SECTION("a take that began before the cancel returned may hand it out") {
        c(25, "take-begin 0 1 0")(45, "take-end 0 1")(45, job(0, "a", 1, 7, 0, 1045));
        CHECK(kinds({producer("a"), k, c}, empty_end()) == none);
    }
    SECTION("its holder's ack after the cancel must be refused") {
        c(15, "take-begin 0 1 0")(18, "take-end 0 1")(18, job(0, "a", 1, 7, 0, 1018))(
            40, "ack-begin a 7")(45, "ack-end a 7 1");
        CHECK(kinds({producer("a"), k, c}, empty_end()) ==
              std::multiset<std::string>{"settled-after-cancel"});
        log_builder ok(2);
        ok(15, "take-begin 0 1 0")(18, "take-end 0 1")(18, job(0, "a", 1, 7, 0, 1018))(
            40, "ack-begin a 7")(45, "ack-end a 7 0");
        CHECK(kinds({producer("a"), k, ok}, empty_end()) == none);
    }
    SECTION("still queued at the end") {
        CHECK(kinds({producer("a"), k}, queued("a")) ==
              std::multiset<std::string>{"cancelled-came-back"});
    }
}

TEST_CASE("chaos check: two acks that returned true") {
    log_builder c1(1), c2(2);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
        1500, "ack-begin a 7")(1510, "ack-end a 7 1");
    c2(1040, "take-begin 0 1 100")(1050, "take-end 0 1")(1050, job(0, "a", 2, 9, 1030, 2050))(
        1600, "ack-begin a 9")(1610, "ack-end a 9 1");
    const auto k = kinds({producer("a"), c1, c2}, empty_end());
    CHECK(k.count("acked-twice") == 1);
    CHECK(k.count("fencing") == 1);  // c1's ack, token 7, after token 9 was handed out
}

TEST_CASE("chaos check: an ack that began after its lease ended must be refused") {
    log_builder c(1);
    c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
        1030, "ack-begin a 7")(1040, "ack-end a 7 1");
    CHECK(kinds({producer("a"), c}, empty_end()) ==
          std::multiset<std::string>{"settled-after-lease"});
    log_builder in_time(1);
    in_time(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
        1029, "ack-begin a 7")(1040, "ack-end a 7 1");
    CHECK(kinds({producer("a"), in_time}, empty_end()) == none);
}

TEST_CASE("chaos check: a put of a new id refused, and dead letters the queue does not count") {
    log_builder p(0);
    p(0, "put-begin a 0 " + ns_at(0) + " after:0")(10, "put-end a 0");
    CHECK(kinds({p}, empty_end()) == std::multiset<std::string>{"put-refused"});
    log_builder d(1);
    d(5000, "drain-end 1 2");
    CHECK(kinds({producer("a"), d}, dead("a", 3), 0) ==
          std::multiset<std::string>{"store-unreadable"});
    log_builder d1(1);
    d1(5000, "drain-end 1 1");
    CHECK(kinds({producer("a"), d1}, dead("a", 3), 0) == none);
}

TEST_CASE("chaos check: handed out again while a lease still held") {
    log_builder c1(1), c2(2);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030));
    c2(500, "take-begin 0 1 100")(510, "take-end 0 1")(510, job(0, "a", 2, 9, 0, 1510))(
        520, "ack-begin a 9")(530, "ack-end a 9 1");
    CHECK(kinds({producer("a"), c1, c2}, empty_end()) ==
          std::multiset<std::string>{"double-lease"});
    SECTION("not after a nack let it go") {
        c1(100, "nack-begin a 7 0")(110, "nack-end a 7 1");
        CHECK(kinds({producer("a"), c1, c2}, empty_end()) == none);
    }
}

TEST_CASE("chaos check: early deliveries") {
    SECTION("before the deadline the store handed out") {
        log_builder c(1);
        c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 31, 1030))(
            40, "ack-begin a 7")(50, "ack-end a 7 1");
        CHECK(kinds({producer("a"), c}, empty_end()) == std::multiset<std::string>{"early"});
    }
    SECTION("before the due time it was put with") {
        log_builder c(1);
        c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
            40, "ack-begin a 7")(50, "ack-end a 7 1");
        CHECK(kinds({producer("a", 500), c}, empty_end()) == std::multiset<std::string>{"early"});
    }
    SECTION("before a nack's retry_after") {
        log_builder c(1);
        c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
            40, "nack-begin a 7 300")(50, "nack-end a 7 1")(60, "take-begin 1 1 100")(
            70, "take-end 1 1")(70, job(1, "a", 2, 8, 0, 1070))(80, "ack-begin a 8")(
            90, "ack-end a 8 1");
        CHECK(kinds({producer("a"), c}, empty_end()) == std::multiset<std::string>{"early"});
    }
}

TEST_CASE("chaos check: poison jobs and max_attempts") {
    // Three deliveries, each ending its consumer, then dead: the promise kept.
    log_builder c1(1), c2(2), c3(3);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "x", 1, 1, 0, 1030))(30, "die x");
    c2(1040, "take-begin 0 1 100")(1050, "take-end 0 1")(1050, job(0, "x", 2, 2, 1030, 2050))(
        1050, "die x");
    c3(2060, "take-begin 0 1 100")(2070, "take-end 0 1")(2070, job(0, "x", 3, 3, 2050, 3070))(
        2070, "die x");
    CHECK(kinds({producer("x", 0, true), c1, c2, c3}, dead("x", 3)) == none);
    CHECK(kinds({producer("x", 0, true), c1, c2, c3}, dead("x", -1)) == none);

    SECTION("a delivery that did not count as an attempt") {
        log_builder c4(4);
        c4(3100, "take-begin 0 1 100")(3110, "take-end 0 1")(3110, job(0, "x", 3, 4, 3070, 4110))(
            3110, "die x");
        const auto k = kinds({producer("x", 0, true), c1, c2, c3, c4}, dead("x", 3));
        CHECK(k.count("attempt-not-counted") == 1);
        CHECK(k.count("too-many-deliveries") == 1);  // 4 logged deliveries, max 3
    }
    SECTION("dead before max_attempts deliveries") {
        CHECK(kinds({producer("x", 0, true), c1, c2}, dead("x", 2)) ==
              std::multiset<std::string>{"dead-too-early"});
        // Without the store's count: only when fewer takes went unlogged than attempts are missing.
        CHECK(kinds({producer("x", 0, true), c1}, dead("x", -1)) ==
              std::multiset<std::string>{"dead-too-early"});
        log_builder killed(5);
        killed(500, "take-begin 0 1 100");
        CHECK(kinds({producer("x", 0, true), c1, c2, killed}, dead("x", -1)) == none);
        // A take whose lines a SIGKILL cut short: it announced two jobs, one line made it.
        log_builder cut(5);
        cut(500, "take-begin 0 2 100")(510, "take-end 0 2")(510, job(0, "y", 1, 5, 0, 1510));
        CHECK(kinds({producer("x", 0, true), c1, c2, cut}, dead("x", -1)).count("dead-too-early") ==
              0);
    }
    SECTION("still queued after a complete drain") {
        log_builder d(6);
        d(5000, "drain-end 1");
        CHECK(kinds({producer("x", 0, true), c1, d}, queued("x")) ==
              std::multiset<std::string>{"poison-not-dead"});
    }
}

TEST_CASE("chaos check: failures, crashes, phantoms and the store's integrity") {
    log_builder p(0);
    p(0, "open-begin")(5, "open-fail - delayq::sqlite::busy_error database is locked");
    CHECK(kinds({p}, empty_end()) == std::multiset<std::string>{"call-failed"});
    log_builder o(0);
    o(0, "crash consumer-1.0 signal-Segmentation fault");
    CHECK(kinds({o}, empty_end()) == std::multiset<std::string>{"process-crashed"});
    log_builder c(0);
    c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "z", 1, 7, 0, 1030));
    CHECK(kinds({c}, empty_end()) == std::multiset<std::string>{"phantom"});
    auto bad = empty_end();
    bad.integrity = "*** in database main *** Page 5 is never used";
    CHECK(kinds({}, bad).count("integrity") == 1);
}

TEST_CASE("chaos check: calls that fail because the server was killed are no violation") {
    // The orchestrator killed the server at 100 ms and had it up again at 300; a call's timeout is
    // 10 s, one connect 10 s more, the slack 2 s, so failures until 22.3 s are the kill's, and so
    // is each process's first one after.
    log_builder o(0);
    o(100, "server-kill")(300, "server-up");
    SECTION("while the server is down, and within a call's timeout after") {
        log_builder p(1);
        p(120, "put-begin a 0 " + ns_at(0) + " after:0")(
            130, "put-fail a delayq::redis::error connection refused")(5'000, "open-begin")(
            5'010, "open-fail - delayq::redis::error connection reset");
        CHECK(kinds({o, p}, empty_end()) == none);  // the put that threw is not lost either
    }
    SECTION("a process's first failure after the kill, however late; not its second") {
        log_builder p(1);
        p(30'000, "open-begin")(30'010, "open-fail - delayq::postgres::connection_error gone");
        CHECK(kinds({o, p}, empty_end()) == none);
        p(31'000, "open-begin")(31'010, "open-fail - delayq::postgres::connection_error gone");
        CHECK(kinds({o, p}, empty_end()) == std::multiset<std::string>{"call-failed"});
    }
    SECTION("before the kill") {
        log_builder p(1);
        p(50, "open-begin")(60, "open-fail - delayq::redis::error refused");
        CHECK(kinds({o, p}, empty_end()) == std::multiset<std::string>{"call-failed"});
    }
    SECTION("an ack that returned true still settles its job across the kill") {
        log_builder c(1);
        c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030))(
            40, "ack-begin a 7")(50, "ack-end a 7 1");
        log_builder d(2);
        d(400, "take-begin 0 1 100")(410, "take-end 0 1")(410, job(0, "a", 2, 8, 0, 1410));
        CHECK(kinds({o, producer("a"), c, d}, empty_end()).count("acked-came-back") == 1);
    }
}

TEST_CASE("chaos check: fencing tokens use all 64 bits") {
    log_builder c1(1), c2(2);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(
        30, "job 0 a 1 18446744073709551000 " + ns_at(0) + " " + ns_at(1030));
    c2(1040, "take-begin 0 1 100")(1050, "take-end 0 1")(
        1050, "job 0 a 2 18446744073709551615 " + ns_at(1030) + " " + ns_at(2050))(
        1060, "ack-begin a 18446744073709551615")(1070, "ack-end a 18446744073709551615 1");
    CHECK(kinds({producer("a"), c1, c2}, empty_end()) == none);
    c1(1500, "ack-begin a 18446744073709551000")(1510, "ack-end a 18446744073709551000 1");
    CHECK(kinds({producer("a"), c1, c2}, empty_end()).count("fencing") == 1);
}

TEST_CASE("chaos check: a log's torn last line is left out") {
    const std::string path = "chaos_check_torn.log";
    {
        std::FILE* f = std::fopen(path.c_str(), "w");
        REQUIRE(f != nullptr);
        std::fputs("1 2 put-begin a 0 3 after:0\n4 5 put-end a 1\n6 7 ack-be", f);
        std::fclose(f);
    }
    const auto ev = delayq_chaos::read_log(path, 0);
    std::remove(path.c_str());
    REQUIRE(ev.size() == 2);
    CHECK(ev[1].kind == "put-end");
    CHECK(ev[1].no == 2);
}

namespace {

// The judge with the settings of a run with `--timeout 1000`: timeout 1 s, one connect 1 s, slack
// 2 s: a call must return or fail within 4 s of its start (a take: plus its wait).
delayq_chaos::report judge(std::initializer_list<log_builder> logs, const final_state& end) {
    delayq_chaos::check_settings cs;
    cs.max_attempts = 3;
    cs.call_timeout_ms = 1'000;
    cs.connect_ms = 1'000;
    cs.slack_ms = 2'000;
    return check_logs(logs, end, cs);
}

std::multiset<std::string> kinds_of(const delayq_chaos::report& r) {
    std::multiset<std::string> out;
    for (const auto& v : r.violations) {
        out.insert(v.kind);
        CHECK(!v.evidence.empty());
    }
    return out;
}

// "@MONO": the moment a call began, `at` ms after the start.
std::string began(long long at) {
    return "@" + std::to_string(t0 + at * ms);
}

// The orchestrator's log: the store stalled from 0 to 3 s.
log_builder stalled() {
    log_builder o(0);
    o(0, "stall-begin lock-table 3000")(3'000, "stall-end");
    return o;
}

}  // namespace

TEST_CASE("chaos check: a call fails or returns within its timeout + one connect + slack") {
    SECTION("a put that failed after 4.5 s is late; one that failed after 3.9 s is not") {
        log_builder p(1);
        p(0, "put-begin a 0 " + ns_at(0) + " after:0")(
            4'500, "put-fail a " + began(0) + " delayq::postgres::connection_error timed out");
        const auto r = judge({stalled(), p}, empty_end());
        CHECK(kinds_of(r) == std::multiset<std::string>{"late-failure"});
        CHECK(r.counts.at("late calls") == 1);
        CHECK(r.counts.at("failed calls") == 1);
        CHECK(r.counts.at("calls") == 1);
        CHECK(r.counts.at("max call time over its timeout, ms") == 3'500);
        log_builder in_time(1);
        in_time(0, "put-begin a 0 " + ns_at(0) + " after:0")(
            3'900, "put-fail a " + began(0) + " delayq::postgres::connection_error timed out");
        const auto ok = judge({stalled(), in_time}, empty_end());
        CHECK(kinds_of(ok) == none);
        CHECK(ok.counts.count("late calls") == 0);
    }
    SECTION("an ack that returned true after 4.5 s is late too") {
        log_builder c(1);
        c(20, "take-begin 0 1 0")(30, "take-end 0 1 " + began(20))(
            30, job(0, "a", 1, 7, 0, 10'030))(40, "ack-begin a 7")(4'540,
                                                                   "ack-end a 7 1 " + began(40));
        CHECK(kinds_of(judge({stalled(), producer("a"), c}, empty_end())) ==
              std::multiset<std::string>{"late-return"});
        log_builder in_time(1);
        in_time(20, "take-begin 0 1 0")(30, "take-end 0 1 " + began(20))(
            30, job(0, "a", 1, 7, 0, 10'030))(40, "ack-begin a 7")(3'040,
                                                                   "ack-end a 7 1 " + began(40));
        CHECK(kinds_of(judge({stalled(), producer("a"), in_time}, empty_end())) == none);
    }
    SECTION("a take may wait on top of its timeout") {
        log_builder c(1);
        c(0, "take-begin 0 1 500")(4'400, "take-end 0 0 " + began(0));
        CHECK(kinds_of(judge({stalled(), c}, empty_end())) == none);
        log_builder late(1);
        late(0, "take-begin 0 1 500")(4'600, "take-fail 0 " + began(0) + " delayq::redis::error x");
        CHECK(kinds_of(judge({stalled(), late}, empty_end())) ==
              std::multiset<std::string>{"late-failure"});
    }
    SECTION("timed from the moment the call began, not from its begin line's stamp") {
        // The begin line's fdatasync took 1 s: the call itself ran 3.9 s.
        log_builder p(1);
        p(0, "put-begin a 0 " + ns_at(0) + " after:0")(
            4'900, "put-fail a " + began(1'000) + " delayq::postgres::connection_error x");
        CHECK(kinds_of(judge({stalled(), p}, empty_end())) == none);
        log_builder old(1);  // a line without its @ field: from the begin line
        old(0, "put-begin a 0 " + ns_at(0) + " after:0")(
            4'900, "put-fail a delayq::postgres::connection_error x");
        CHECK(kinds_of(judge({stalled(), old}, empty_end())) ==
              std::multiset<std::string>{"late-failure"});
    }
    SECTION("with the timeout the process's start line says") {
        log_builder p(1);
        p(0, "start producer 0 0 4242 10000")(0, "put-begin a 0 " + ns_at(0) + " after:0")(
            4'900, "put-fail a " + began(0) + " delayq::postgres::connection_error x");
        CHECK(kinds_of(judge({stalled(), p}, empty_end())) == none);
    }
    SECTION("the lines of one put_many are one call") {
        log_builder p(1);
        p(0, "put-begin a 0 " + ns_at(0) + " many:0")(0, "put-begin b 0 " + ns_at(0) + " many:0")(
            4'500, "put-fail a " + began(0) + " delayq::postgres::connection_error x")(
            4'500, "put-fail b " + began(0) + " delayq::postgres::connection_error x");
        const auto r = judge({stalled(), p}, empty_end());
        CHECK(kinds_of(r) == std::multiset<std::string>{"late-failure"});
        CHECK(r.counts.at("calls") == 1);
    }
    SECTION("opens and size() are calls too") {
        log_builder o(1);
        o(0, "open-begin")(4'500, "open-end " + began(0))(4'600, "size-begin -")(
            9'000, "size-fail - " + began(4'600) + " delayq::redis::error x");
        const auto r = judge({stalled(), o}, empty_end());
        CHECK(kinds_of(r) ==
              std::multiset<std::string>{"call-failed", "late-failure", "late-return"});
    }
}

TEST_CASE("chaos check: calls that fail in a stall or after a connection kill are no violation") {
    SECTION("a stall excuses failures until its end + a call's time (4 s here), not later") {
        log_builder p(1);
        p(100, "put-begin a 0 " + ns_at(0) + " after:0")(
            1'100, "put-fail a " + began(100) + " delayq::redis::error timed out")(
            6'900, "cancel-begin a")(6'950, "cancel-fail a " + began(6'900) + " x y");
        const auto r = judge({stalled(), p}, empty_end());
        CHECK(kinds_of(r) == none);
        CHECK(r.counts.at("calls failed by a stall") == 2);
        p(7'100, "cancel-begin a")(7'150, "cancel-fail a " + began(7'100) + " x y");
        CHECK(kinds_of(judge({stalled(), p}, empty_end())) ==
              std::multiset<std::string>{"call-failed"});
    }
    SECTION("a connection kill excuses each process's first failure after it, however late") {
        log_builder o(0);
        o(100, "connection-kill")(110, "connection-kill-end 9");
        log_builder p(1);
        p(20'000, "cancel-begin a")(20'010, "cancel-fail a " + began(20'000) + " x y");
        const auto r = judge({o, p}, empty_end());
        CHECK(kinds_of(r) == none);
        CHECK(r.counts.at("calls failed by a connection kill") == 1);
        CHECK(r.counts.at("connections killed") == 9);
        p(21'000, "cancel-begin a")(21'010, "cancel-fail a " + began(21'000) + " x y");
        CHECK(kinds_of(judge({o, p}, empty_end())) == std::multiset<std::string>{"call-failed"});
    }
    SECTION("a put that failed in a stall may have been applied: queued or not, no violation") {
        log_builder p(1);
        p(100, "put-begin a 0 " + ns_at(0) + " after:0")(
            1'100, "put-fail a " + began(100) + " delayq::redis::error timed out");
        CHECK(kinds_of(judge({stalled(), p}, empty_end())) == none);
        CHECK(kinds_of(judge({stalled(), p}, queued("a"))) == none);
    }
}

TEST_CASE("chaos check: a second holder while an extended lease still held") {
    // Taken with a lease to 530; extended at 400 by 500 ms: the lease holds until 899 at least
    // (the store reads its clock in whole ms).
    log_builder c1(1), c2(2);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 530))(
        400, "extend-begin a 7 500")(410, "extend-end a 7 1");
    SECTION("handed out again before the extended end: the holder was killed, its lease held") {
        c2(700, "take-begin 0 1 100")(710, "take-end 0 1")(710, job(0, "a", 2, 9, 530, 1210))(
            720, "ack-begin a 9")(730, "ack-end a 9 1");
        CHECK(kinds({producer("a"), c1, c2}, empty_end()) ==
              std::multiset<std::string>{"double-lease-extended"});
    }
    SECTION("handed out again after the extended lease ended") {
        c2(900, "take-begin 0 1 100")(910, "take-end 0 1")(910, job(0, "a", 2, 9, 530, 1410))(
            920, "ack-begin a 9")(930, "ack-end a 9 1");
        CHECK(kinds({producer("a"), c1, c2}, empty_end()) == none);
    }
    SECTION("handed out again after its holder let it go") {
        c1(600, "nack-begin a 7 0")(610, "nack-end a 7 1");
        c2(700, "take-begin 0 1 100")(710, "take-end 0 1")(710, job(0, "a", 2, 9, 530, 1210))(
            720, "ack-begin a 9")(730, "ack-end a 9 1");
        CHECK(kinds({producer("a"), c1, c2}, empty_end()) == none);
    }
    SECTION("a refused nack lets nothing go, and was refused while the lease held") {
        c1(600, "nack-begin a 7 0")(610, "nack-end a 7 0");
        c2(700, "take-begin 0 1 100")(710, "take-end 0 1")(710, job(0, "a", 2, 9, 530, 1210))(
            720, "ack-begin a 9")(730, "ack-end a 9 1");
        CHECK(kinds({producer("a"), c1, c2}, empty_end()) ==
              std::multiset<std::string>{"double-lease-extended", "refused-while-held"});
    }
    SECTION("an extend of an older lease that returned true after a newer one was handed out") {
        log_builder late(1);
        late(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 530))(
            700, "extend-begin a 7 500")(710, "extend-end a 7 1");
        c2(600, "take-begin 0 1 100")(610, "take-end 0 1")(610, job(0, "a", 2, 9, 530, 1110))(
            800, "ack-begin a 9")(810, "ack-end a 9 1");
        CHECK(
            kinds({producer("a"), late, c2}, empty_end()) ==
            std::multiset<std::string>{"double-lease-extended", "fencing", "settled-after-lease"});
    }
}

TEST_CASE("chaos check: acks, refusals and settles around an extended lease") {
    log_builder c(1);
    c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 530))(
        400, "extend-begin a 7 500")(410, "extend-end a 7 1");
    SECTION("an ack after the take's lease, within the extended one") {
        c(700, "ack-begin a 7")(710, "ack-end a 7 1");
        CHECK(kinds({producer("a"), c}, empty_end()) == none);
    }
    SECTION("an ack that began after the extended lease ended must be refused") {
        c(950, "ack-begin a 7")(960, "ack-end a 7 1");
        CHECK(kinds({producer("a"), c}, empty_end()) ==
              std::multiset<std::string>{"settled-after-lease"});
    }
    SECTION("an ack refused while the extended lease held") {
        c(700, "ack-begin a 7")(710, "ack-end a 7 0");
        CHECK(kinds({producer("a"), c}, queued("a")) ==
              std::multiset<std::string>{"refused-while-held"});
        log_builder k(2);  // unless a cancel let it go
        k(640, "cancel-begin a")(650, "cancel-end a 1");
        CHECK(kinds({producer("a"), c, k}, empty_end()) == none);
    }
    SECTION("an extend that began after the lease ended must be refused") {
        c(950, "extend-begin a 7 500")(960, "extend-end a 7 1");
        CHECK(kinds({producer("a"), c}, queued("a")) ==
              std::multiset<std::string>{"settled-after-lease"});
    }
    SECTION("an extend of unknown outcome may have moved the lease: nothing judged after it") {
        c(600, "extend-begin a 7 500")(610, "extend-fail a 7 @0 delayq::unavailable_error x");
        c(1200, "ack-begin a 7")(1210, "ack-end a 7 1");
        CHECK(kinds({producer("a"), c}, empty_end()).count("settled-after-lease") == 0);
    }
}

TEST_CASE("chaos check: bury, and a holder that settles after its extend was refused") {
    log_builder c(1);
    c(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 530));
    SECTION("buried: dead after one attempt is no violation") {
        c(100, "bury-begin a 7")(110, "bury-end a 7 1");
        CHECK(kinds({producer("a"), c}, dead("a", 1)) == none);
        CHECK(kinds({producer("a"), c}, dead("a", -1)) == none);
        CHECK(kinds({producer("a"), c}, queued("a")) ==
              std::multiset<std::string>{"buried-came-back"});
        log_builder c2(2);
        c2(700, "take-begin 0 1 100")(710, "take-end 0 1")(710, job(0, "a", 2, 9, 0, 1210));
        CHECK(kinds({producer("a"), c, c2}, dead("a", 1)) ==
              std::multiset<std::string>{"buried-came-back"});
    }
    SECTION("dead after one attempt without a bury is too early") {
        CHECK(kinds({producer("a"), c}, dead("a", 1)) ==
              std::multiset<std::string>{"dead-too-early"});
        c(100, "bury-begin a 7");  // killed in the bury: it may have been applied
        CHECK(kinds({producer("a"), c}, dead("a", 1)) == none);
    }
    SECTION("settled after an extend was refused") {
        log_builder k(2);
        k(300, "cancel-begin a")(310, "cancel-end a 1");
        c(400, "extend-begin a 7 500")(410, "extend-end a 7 0")(420, "ack-begin a 7")(
            430, "ack-end a 7 0");
        CHECK(kinds({producer("a"), c, k}, empty_end()) ==
              std::multiset<std::string>{"settled-lost-lease"});
    }
}

TEST_CASE("chaos check: a worker that gives a failed settlement up while its lease holds") {
    // The lease extended at 400 holds until 899 at least; the ack fails at 610.
    log_builder w(1);
    w(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 530))(
        400, "extend-begin a 7 500")(410, "extend-end a 7 1")(600, "ack-begin a 7")(
        610, "ack-fail a 7 @0 delayq::unavailable_error gone");
    SECTION("given up at once") {
        w(611, "worker-lease-lost a 7");
        CHECK(kinds({producer("a"), w}, queued("a")) ==
              std::multiset<std::string>{"call-failed", "worker-gave-up"});
    }
    SECTION("tried again, then refused: the lease was lost") {
        w(660, "ack-begin a 7")(670, "ack-end a 7 0")(671, "worker-lease-lost a 7");
        CHECK(kinds({producer("a"), w}, queued("a")).count("worker-gave-up") == 0);
    }
    SECTION("given up after failures in a row, when its next wait would pass the lease's end") {
        // Waits of 50 and 100 ms, then 200 ms would end after 899.
        w(660, "ack-begin a 7")(670, "ack-fail a 7 @0 delayq::unavailable_error gone")(
            770, "ack-begin a 7")(780, "ack-fail a 7 @0 delayq::unavailable_error gone")(
            781, "worker-lease-lost a 7");
        CHECK(kinds({producer("a"), w}, queued("a")).count("worker-gave-up") == 0);
    }
    SECTION("given up when the lease was about to end") {
        log_builder late(1);
        late(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 530))(
            480, "ack-begin a 7")(490, "ack-fail a 7 @0 delayq::unavailable_error gone")(
            491, "worker-lease-lost a 7");
        CHECK(kinds({producer("a"), late}, queued("a")).count("worker-gave-up") == 0);
    }
}

TEST_CASE("chaos check: more jobs surely leased at once than the limit") {
    // Two consumers each hold a lease from 30 ms (a) and 40 ms (b) until their acks begin.
    log_builder c1(1), c2(2);
    c1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 1030));
    c2(25, "take-begin 0 1 100")(40, "take-end 0 1")(40, job(0, "b", 1, 8, 0, 1040));
    const auto end = [&](long long ack_a, long long ack_b) {
        log_builder x1 = c1, x2 = c2;
        x1(ack_a, "ack-begin a 7")(ack_a + 10, "ack-end a 7 1");
        x2(ack_b, "ack-begin b 8")(ack_b + 10, "ack-end b 8 1");
        return std::vector<log_builder>{x1, x2};
    };
    auto both = end(100, 100);
    CHECK(kinds({producer("a"), producer("b"), both[0], both[1]}, empty_end(), 3, 1) ==
          std::multiset<std::string>{"over-limit"});
    CHECK(kinds({producer("a"), producer("b"), both[0], both[1]}, empty_end(), 3, 2) == none);
    CHECK(kinds({producer("a"), producer("b"), both[0], both[1]}, empty_end(), 3, 0) == none);
    SECTION("not when the first ack began before the second take returned") {
        auto apart = end(35, 100);
        CHECK(kinds({producer("a"), producer("b"), apart[0], apart[1]}, empty_end(), 3, 1) == none);
    }
    SECTION("not when the first lease ended before the second take returned") {
        log_builder x1(1), x2(2);
        x1(20, "take-begin 0 1 100")(30, "take-end 0 1")(30, job(0, "a", 1, 7, 0, 35));
        x2(25, "take-begin 0 1 100")(40, "take-end 0 1")(40, job(0, "b", 1, 8, 0, 1040))(
            100, "ack-begin b 8")(110, "ack-end b 8 1");
        // a's lease ran out unacked: a is queued at the end, and redelivery is allowed.
        CHECK(kinds({producer("a"), producer("b"), x1, x2}, queued("a"), 3, 1) == none);
    }
}

TEST_CASE("chaos check: a series' runs, one a period, still there at the drain") {
    log_builder p(0), c(1), d(2);
    p(0, "start producer 0 0 4242 10000")(0, "series-begin Sp0 300")(5, "series-end Sp0 1");
    // Two runs, due at 300 and 600 ms, each taken and acked.
    c(0, "start consumer 0 0 4243 10000")(300, "take-begin 0 1 100")(310, "take-end 0 1")(
        310, job(0, "Sp0", 1, 7, 300, 1310))(320, "ack-begin Sp0 7")(330, "ack-end Sp0 7 1")(
        600, "take-begin 1 1 100")(610, "take-end 1 1")(610, job(1, "Sp0", 1, 9, 600, 1610))(
        620, "ack-begin Sp0 9")(630, "ack-end Sp0 9 1");
    d(0, "start drainer 0 0 4244 10000")(900, "take-begin 0 50 200")(910, "take-end 0 1")(
        910, job(0, "Sp0", 1, 11, 900, 1910))(920, "cancel-begin Sp0")(930, "cancel-end Sp0 1")(
        5000, "drain-end 1 0");
    CHECK(kinds({p, c, d}, empty_end()) == none);
    SECTION("a run's retry, due sooner than a period after it, is the same run") {
        log_builder c2(3);
        c2(0, "start consumer 1 0 4245 10000")(400, "take-begin 0 1 100")(410, "take-end 0 1")(
            410, job(0, "Sp0", 2, 8, 400, 1410))(420, "ack-begin Sp0 8")(430, "ack-end Sp0 8 1");
        CHECK(kinds({p, c, c2, d}, empty_end()) == none);
    }
    SECTION("two runs less than a period apart") {
        log_builder c2(3);
        c2(0, "start consumer 1 0 4245 10000")(400, "take-begin 0 1 100")(410, "take-end 0 1")(
            410, job(0, "Sp0", 1, 8, 400, 1410))(420, "ack-begin Sp0 8")(430, "ack-end Sp0 8 1");
        // (And due before the run at 300 was acked at 320-330: its next is at 600.)
        CHECK(kinds({p, c, c2, d}, empty_end()) ==
              std::multiset<std::string>{"series-two-runs", "series-run-too-soon"});
    }
    SECTION("gone before the drain, though nobody cancelled it") {
        log_builder d2(2);
        d2(0, "start drainer 0 0 4244 10000")(5000, "drain-end 1 0");
        CHECK(kinds({p, c, d2}, empty_end()) == std::multiset<std::string>{"series-ended"});
    }
}

namespace {

// The report itself, for its counts: judged and unjudged runs of a series.
delayq_chaos::report report_of(std::initializer_list<log_builder> logs, const final_state& end,
                               long long lease_ms = 1'000) {
    delayq_chaos::check_settings cs;
    cs.max_attempts = 3;
    cs.lease_ms = lease_ms;
    return check_logs(logs, end, cs);
}

long long count(const delayq_chaos::report& r, const std::string& what) {
    const auto it = r.counts.find(what);
    return it == r.counts.end() ? 0 : it->second;
}

// A consumer (log `file`) handed Sp0's run due at `due` ms at `at` ms (attempts, token; its lease
// 1 s), which acks it from `ack` ms for `ack_ms` ms; no ack if `ack` < 0, and the process killed
// in its ack if `ack_ms` < 0.
log_builder runs(int file, long long at, int attempts, int token, long long due, long long ack,
                 long long ack_ms = 10) {
    log_builder c(file);
    c(0, "start consumer " + std::to_string(file) + " 0 4243 10000")(at - 10, "take-begin 0 1 100")(
        at, "take-end 0 1")(at, job(0, "Sp0", attempts, token, due, at + 1'000));
    const std::string t = " " + std::to_string(token);
    if (ack >= 0) c(ack, "ack-begin Sp0" + t);
    if (ack >= 0 && ack_ms >= 0) c(ack + ack_ms, "ack-end Sp0" + t + " 1");
    return c;
}

// The drainer (log 2), handed Sp0's run due at `due` ms at `at` ms, which it cancels.
log_builder drains(long long at, long long due) {
    log_builder d(2);
    d(0, "start drainer 0 0 4244 10000")(at - 10, "take-begin 0 50 200")(at, "take-end 0 1")(
        at, job(0, "Sp0", 1, 9, due, at + 1'000))(at + 10, "cancel-begin Sp0")(
        at + 20, "cancel-end Sp0 1")(5000, "drain-end 1 0");
    return d;
}

// A process (log `file`) that died in a take: a delivery no log names may have been made.
log_builder died_taking(int file, long long at) {
    log_builder k(file);
    k(0, "start consumer " + std::to_string(file) + " 0 4245 10000")(at, "take-begin 0 1 100");
    return k;
}

}  // namespace

TEST_CASE("chaos check: no run of a series missing while a consumer lives") {
    // Sp0 every 300 ms from a put_every between 0 and 5 ms: slots 300, 600, 900, ...
    log_builder p(0);
    p(0, "start producer 0 0 4242 10000")(0, "series-begin Sp0 300")(5, "series-end Sp0 1");
    // The run at 300, handed out at 310 and acked at 320-330: the next is due at 600.
    const log_builder c = runs(1, 310, 1, 7, 300, 320);
    SECTION("the run after an ack, at the first slot after it, is judged and no violation") {
        const auto r = report_of({p, c, drains(610, 600)}, empty_end());
        CHECK(r.violations.empty());
        CHECK(count(r, "series: first runs judged") == 1);
        CHECK(count(r, "series: runs judged against the run before") == 1);
    }
    SECTION("a slot skipped after the run before it was acked") {
        CHECK(kinds({p, c, drains(910, 900)}, empty_end()) ==
              std::multiset<std::string>{"series-missing-run"});
    }
    SECTION("a catch-up after a run acked past the next slot is no violation") {
        // Acked at 700-710, after the slot at 600 passed: the catch-up was the run at 300 itself,
        // and its next is at 900, the first slot after the ack; one at 600 came too soon.
        const log_builder late = runs(1, 310, 1, 7, 300, 700);
        const auto r = report_of({p, late, drains(910, 900)}, empty_end());
        CHECK(r.violations.empty());
        CHECK(count(r, "series: runs judged against the run before") == 1);
        CHECK(kinds({p, late, drains(730, 600)}, empty_end()) ==
              std::multiset<std::string>{"series-run-too-soon"});
    }
    SECTION("an ack that straddles a slot allows either slot after it") {
        // Acked at 590-610: the store ran it before 600 (next 600) or after (next 900).
        for (const long long next : {600, 900})
            CHECK(kinds({p, runs(1, 310, 1, 7, 300, 590, 20), drains(960, next)}, empty_end()) ==
                  none);
    }
    SECTION("a run whose ack's outcome is unknown is not judged") {
        // The consumer was killed in its ack: whether the ack ended the run, and when, no log
        // says (the run may also have come back at its lease's end and died of its last lease).
        const auto r =
            report_of({p, runs(1, 310, 1, 7, 300, 320, -1), drains(2410, 2400)}, empty_end());
        CHECK(r.violations.empty());
        CHECK(count(r, "series: runs judged against the run before") == 0);
        CHECK(count(r, "series: runs not judged (the run before ended unseen)") == 1);
    }
    SECTION("after a redelivery, the later delivery's ack ends the run") {
        // Handed out at 310 to a consumer killed before it acked; its lease ended at 1310, the run
        // came back (attempts 2) and was acked at 1320-1330: the next run is due at 1500.
        const log_builder killed = runs(1, 310, 1, 7, 300, -1),
                          again = runs(3, 1315, 2, 8, 1310, 1320);
        CHECK(kinds({p, killed, again, drains(1910, 1500)}, empty_end()) == none);
        CHECK(kinds({p, killed, again, drains(1910, 1800)}, empty_end()) ==
              std::multiset<std::string>{"series-missing-run"});
    }
    SECTION("a run whose attempt 1 no log names is not judged from its redelivery") {
        // The consumer died in the take that leased the run at 300; its redelivery's deadline is
        // the lease's end, not the run's slot.
        const auto r =
            report_of({p, died_taking(1, 300), runs(3, 1315, 2, 8, 1310, 1320), drains(1910, 1500)},
                      empty_end());
        CHECK(r.violations.empty());
        CHECK(count(r, "series: first runs not judged") == 1);
        CHECK(count(r, "series: runs not judged (a run no log names lies between)") == 1);
    }
    SECTION("the first run is due one period after put_every") {
        CHECK(kinds({p, drains(610, 600)}, empty_end()) ==
              std::multiset<std::string>{"series-missing-run"});
        CHECK(kinds({p, drains(210, 200)}, empty_end()) ==
              std::multiset<std::string>{"series-run-too-soon"});
    }
    SECTION("a skip that a run no log names may explain is not judged") {
        // Three takes that died unlogged could each have leased a run between (max_attempts 3,
        // a lease of 1 s): it would have died of its last lease no sooner than 3 s after its slot.
        const log_builder k1 = died_taking(3, 400), k2 = died_taking(4, 500),
                          k3 = died_taking(5, 600);
        const auto r = report_of({p, c, k1, k2, k3, drains(3910, 3900)}, empty_end());
        CHECK(r.violations.empty());
        CHECK(count(r, "series: runs not judged (a run no log names may lie between)") == 1);
        // But not a skip too short for such a run.
        const auto r2 = report_of({p, c, k1, k2, k3, drains(910, 900)}, empty_end());
        REQUIRE(r2.violations.size() == 1);
        CHECK(r2.violations[0].kind == "series-missing-run");
        // With no lease known, any skip may be such a run's.
        CHECK(report_of({p, c, k1, k2, k3, drains(910, 900)}, empty_end(), 0).violations.empty());
    }
}
