// delayq::prometheus_exposition: a queue's figures and a worker's counters in the Prometheus text
// format (version 0.0.4), for an application to serve from its own HTTP endpoint. delayq opens no
// port and pulls in no HTTP library: the application already has a server, and decides who may
// read it.
//
//     delayq::prometheus_exposition e;
//     e.add("orders", figures);             // a queue_stats: delayq_jobs{queue="orders",...}
//     e.add("orders", worker.counters());   // delayq_worker_jobs_total{queue="orders",...} ...
//     respond(200, "text/plain; version=0.0.4", e.str());
//
// The names follow Prometheus's conventions: a unit in the name (seconds), `_total` on counters,
// one family per quantity with the kind of job in a label, so that a sum over a label means
// something (every job of a queue: sum by (queue) of delayq_jobs). Each family's HELP and TYPE
// come once, whatever number of queues and workers are added, as the format requires.
//
//   delayq_jobs{queue, state}           gauge    waiting (due or not), leased, dead
//   delayq_jobs_due{queue}              gauge    waiting jobs that are due now
//   delayq_lag_seconds{queue}           gauge    age of the oldest due job (0: none is due)
//   delayq_worker_jobs_total{queue, outcome}  counter  done, retried, dead, lease_lost, released
//   delayq_worker_failed_calls_total{queue}   counter  calls to the queue that failed
//   delayq_worker_in_flight{queue}            gauge    handlers running
//   delayq_worker_handler_seconds_total{queue} counter time spent in handlers
#include "detail/config.hpp"  // first: below C++20, one clear error
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "job.hpp"
#include "worker.hpp"

namespace delayq {

/// Builds one Prometheus text exposition from the figures of any number of queues and workers.
class prometheus_exposition {
  public:
    /// Adds queue `queue`'s figures.
    void add(std::string_view queue, const queue_stats& s) {
        const std::string q = label("queue", queue);
        sample("delayq_jobs", "gauge", "Jobs of a queue, by state.",
               q + "," + label("state", "waiting"), number(s.waiting));
        sample("delayq_jobs", "gauge", "Jobs of a queue, by state.",
               q + "," + label("state", "leased"), number(s.leased));
        sample("delayq_jobs", "gauge", "Jobs of a queue, by state.",
               q + "," + label("state", "dead"), number(s.dead));
        sample("delayq_jobs_due", "gauge", "Waiting jobs of a queue that are due now.", q,
               number(s.due_now));
        sample("delayq_lag_seconds", "gauge",
               "How long the oldest due job of a queue has been due (0 when none is).", q,
               seconds(s.lag));
    }

    /// Adds the counters of a worker over queue `queue` (its counters()).
    void add(std::string_view queue, const worker_counters& c) {
        const std::string q = label("queue", queue);
        constexpr const char* help = "Jobs a worker finished with, by outcome.";
        const std::pair<const char*, std::uint64_t> outcomes[] = {{"done", c.done},
                                                                  {"retried", c.retried},
                                                                  {"dead", c.dead},
                                                                  {"lease_lost", c.lease_lost},
                                                                  {"released", c.released}};
        for (const auto& o : outcomes)
            sample("delayq_worker_jobs_total", "counter", help, q + "," + label("outcome", o.first),
                   number(o.second));
        sample("delayq_worker_failed_calls_total", "counter",
               "Calls of a worker to its queue that failed (and were tried again).", q,
               number(c.failed_calls));
        sample("delayq_worker_in_flight", "gauge", "Handlers of a worker running now.", q,
               number(c.in_flight));
        sample("delayq_worker_handler_seconds_total", "counter",
               "Time spent in a worker's handlers, all threads together.", q,
               seconds(c.handler_time));
    }

    /// The exposition: each family's HELP and TYPE, then its samples, in the order added.
    std::string str() const {
        std::string out;
        for (const family& f : families_) {
            out += "# HELP " + f.name + " " + f.help + "\n";
            out += "# TYPE " + f.name + " " + f.type + "\n";
            for (const std::string& s : f.samples) out += s;
        }
        return out;
    }

  private:
    struct family {
        std::string name, type, help;
        std::vector<std::string> samples;
    };

    void sample(const char* name, const char* type, const char* help, const std::string& labels,
                const std::string& value) {
        auto [it, added] = index_.try_emplace(name, families_.size());
        if (added) families_.push_back({name, type, help, {}});
        families_[it->second].samples.push_back(std::string(name) + "{" + labels + "} " + value +
                                                "\n");
    }

    // name="value", the value escaped as the format says: backslash, double quote, line feed.
    static std::string label(std::string_view name, std::string_view value) {
        std::string out(name);
        out += "=\"";
        for (const char ch : value) {
            if (ch == '\\') {
                out += "\\\\";
            } else if (ch == '"') {
                out += "\\\"";
            } else if (ch == '\n') {
                out += "\\n";
            } else {
                out += ch;
            }
        }
        out += '"';
        return out;
    }

    static std::string number(std::uint64_t n) { return std::to_string(n); }

    template <class Rep, class Period>
    static std::string seconds(std::chrono::duration<Rep, Period> d) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.6f", std::chrono::duration<double>(d).count());
        return buf;
    }

    std::vector<family> families_;
    std::map<std::string, std::size_t, std::less<>> index_;  // family name -> its place
};

/// One queue's figures alone, as a whole exposition.
inline std::string prometheus_text(std::string_view queue, const queue_stats& s) {
    prometheus_exposition e;
    e.add(queue, s);
    return e.str();
}

/// One worker's counters alone, as a whole exposition.
inline std::string prometheus_text(std::string_view queue, const worker_counters& c) {
    prometheus_exposition e;
    e.add(queue, c);
    return e.str();
}

}  // namespace delayq
