// delayq::prometheus_exposition: the text that a Prometheus server scrapes, checked line by line
// against the format's rules (one HELP and TYPE per family, escaped label values, counters ending
// in _total, seconds as decimals).
#include <chrono>
#include <cstddef>
#include <delayq/prometheus.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
}

std::size_t count_of(const std::vector<std::string>& lines, const std::string& line) {
    std::size_t n = 0;
    for (const auto& l : lines) n += l == line;
    return n;
}

}  // namespace

TEST_CASE("prometheus: a queue's figures, one line each, with HELP and TYPE", "[prometheus]") {
    delayq::queue_stats s;
    s.waiting = 12;
    s.due_now = 3;
    s.leased = 4;
    s.dead = 1;
    s.lag = 1500ms;
    const std::string text = delayq::prometheus_text("orders", s);
    const auto lines = lines_of(text);
    CHECK(text.back() == '\n');
    CHECK(count_of(lines, "# TYPE delayq_jobs gauge") == 1);
    CHECK(count_of(lines, "delayq_jobs{queue=\"orders\",state=\"waiting\"} 12") == 1);
    CHECK(count_of(lines, "delayq_jobs{queue=\"orders\",state=\"leased\"} 4") == 1);
    CHECK(count_of(lines, "delayq_jobs{queue=\"orders\",state=\"dead\"} 1") == 1);
    CHECK(count_of(lines, "delayq_jobs_due{queue=\"orders\"} 3") == 1);
    CHECK(count_of(lines, "delayq_lag_seconds{queue=\"orders\"} 1.500000") == 1);
    CHECK(count_of(lines, "# TYPE delayq_lag_seconds gauge") == 1);
}

TEST_CASE("prometheus: a worker's counters are counters, named _total", "[prometheus]") {
    delayq::worker_counters c;
    c.done = 7;
    c.retried = 2;
    c.dead = 1;
    c.failed_calls = 5;
    c.in_flight = 3;
    c.handler_time = 2500ms;
    const auto lines = lines_of(delayq::prometheus_text("orders", c));
    CHECK(count_of(lines, "# TYPE delayq_worker_jobs_total counter") == 1);
    CHECK(count_of(lines, "delayq_worker_jobs_total{queue=\"orders\",outcome=\"done\"} 7") == 1);
    CHECK(count_of(lines, "delayq_worker_jobs_total{queue=\"orders\",outcome=\"retried\"} 2") == 1);
    CHECK(count_of(lines, "delayq_worker_jobs_total{queue=\"orders\",outcome=\"lease_lost\"} 0") ==
          1);
    CHECK(count_of(lines, "delayq_worker_failed_calls_total{queue=\"orders\"} 5") == 1);
    CHECK(count_of(lines, "delayq_worker_in_flight{queue=\"orders\"} 3") == 1);
    CHECK(count_of(lines, "delayq_worker_handler_seconds_total{queue=\"orders\"} 2.500000") == 1);
}

TEST_CASE("prometheus: several queues share each family's HELP and TYPE, samples grouped",
          "[prometheus]") {
    delayq::prometheus_exposition e;
    e.add("a", delayq::queue_stats{});
    e.add("b", delayq::queue_stats{});
    e.add("a", delayq::worker_counters{});
    const auto lines = lines_of(e.str());
    CHECK(count_of(lines, "# TYPE delayq_jobs gauge") == 1);
    CHECK(count_of(lines, "# HELP delayq_jobs Jobs of a queue, by state.") == 1);
    // A family's samples follow its TYPE line, with no other family's between them.
    std::string family;
    std::vector<std::string> order;
    for (const auto& l : lines) {
        if (l.rfind("# TYPE ", 0) == 0) {
            family = l.substr(7, l.find(' ', 7) - 7);
            order.push_back(family);
        } else if (l.rfind("# ", 0) != 0) {
            CHECK(l.rfind(family + "{", 0) == 0);
        }
    }
    CHECK(order.size() == 7);  // 3 of a queue, 4 of a worker
    CHECK(count_of(lines, "delayq_jobs{queue=\"b\",state=\"dead\"} 0") == 1);
}

TEST_CASE("prometheus: a queue name is escaped as a label value", "[prometheus]") {
    const auto lines = lines_of(delayq::prometheus_text("a\"b\\c\nd", delayq::queue_stats{}));
    CHECK(count_of(lines, "delayq_jobs_due{queue=\"a\\\"b\\\\c\\nd\"} 0") == 1);
    for (const auto& l : lines) CHECK(!l.empty());  // the line feed did not break a line
}
