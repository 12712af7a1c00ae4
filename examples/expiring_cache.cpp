// A cache whose entries expire after a time to live, evicted in batches with drain_to.
//
// The map holds the values; a delay_queue holds one small record per entry, due when the entry
// expires. A sweep (here every 5 s; in a server, a timer or the event loop's idle moment) moves the
// records that are due out of the queue in batches of at most 128 with drain_to(), so that a sweep
// after a long pause never holds the cache's lock for long, and erases their entries. A put that
// refreshes a key does not search the queue for the old record: it bumps the entry's generation,
// and the old record, when it comes due, no longer matches and is skipped.
//
// get() checks the expiry itself, so an entry is never served after its time to live, even
// between sweeps: the sweeps only give the memory back. Time is a manual_clock, so the minute of
// the demo passes at once and the run is the same every time.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <delayq/delay_queue.hpp>
#include <delayq/delayed.hpp>
#include <delayq/manual_clock.hpp>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using namespace std::chrono_literals;
using clock_type = delayq::manual_clock;

namespace {

class ttl_cache {
  public:
    void put(const std::string& key, std::string value, clock_type::duration ttl) {
        const auto expires = clock_type::now() + ttl;
        std::uint64_t gen;
        {
            std::lock_guard lk(m_);
            auto& e = map_[key];
            e.value = std::move(value);
            e.expires = expires;
            gen = ++e.generation;
        }
        expiry_.put(delayq::delayed<record, clock_type>{{key, gen}, expires});
    }

    std::optional<std::string> get(const std::string& key) const {
        std::lock_guard lk(m_);
        auto it = map_.find(key);
        if (it == map_.end() || it->second.expires <= clock_type::now()) return std::nullopt;
        return it->second.value;
    }

    struct sweep_result {
        std::size_t evicted = 0, stale = 0, batches = 0;
    };

    // Evicts every expired entry, `batch` records at a time.
    sweep_result sweep(std::size_t batch) {
        sweep_result r;
        std::vector<delayq::delayed<record, clock_type>> due;
        due.reserve(batch);
        for (;;) {
            due.clear();
            const std::size_t n = expiry_.drain_to(std::back_inserter(due), batch);
            if (n == 0) break;
            ++r.batches;
            std::lock_guard lk(m_);  // held for one batch at most
            for (const auto& d : due) {
                auto it = map_.find(d.value.key);
                if (it != map_.end() && it->second.generation == d.value.generation) {
                    map_.erase(it);
                    ++r.evicted;
                } else {
                    ++r.stale;  // refreshed since: a later record stands for it
                }
            }
            if (n < batch) break;
        }
        return r;
    }

    std::size_t size() const {
        std::lock_guard lk(m_);
        return map_.size();
    }
    std::size_t records() const { return expiry_.size(); }

  private:
    struct entry {
        std::string value;
        clock_type::time_point expires;
        std::uint64_t generation = 0;
    };
    struct record {
        std::string key;
        std::uint64_t generation;
    };

    mutable std::mutex m_;
    std::unordered_map<std::string, entry> map_;
    delayq::delay_queue<delayq::delayed<record, clock_type>, clock_type> expiry_;
};

}  // namespace

int main() {
    clock_type::reset();
    ttl_cache cache;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> ttl_s(10, 60);

    // 1000 sessions with times to live of 10 to 60 s; every fifth is refreshed at 10 s for 30 s
    // more.
    for (int i = 0; i < 1000; ++i)
        cache.put("session:" + std::to_string(i), "user " + std::to_string(i),
                  std::chrono::seconds(ttl_s(rng)));
    cache.put("config", "ttl 20 s", 20s);
    std::puts("A cache of 1001 entries with times to live of 10 to 60 s; a sweep every 5 s evicts");
    std::puts("the expired ones in batches of at most 128 (simulated clock):");

    std::size_t evicted = 0, stale = 0;
    for (int s = 5; s <= 60; s += 5) {
        clock_type::advance(5s);
        if (s == 10)
            for (int i = 0; i < 1000; i += 5)
                cache.put("session:" + std::to_string(i), "user " + std::to_string(i), 30s);
        const auto r = cache.sweep(128);
        evicted += r.evicted;
        stale += r.stale;
        std::printf(
            "  %2d s  evicted %3zu in %zu batch%s, skipped %3zu stale records; %4zu entries left\n",
            s, r.evicted, r.batches, r.batches == 1 ? "" : "es", r.stale, cache.size());
        if (s == 15 || s == 20)
            std::printf("        get(\"config\") at %d s: %s\n", s,
                        cache.get("config") ? cache.get("config")->c_str() : "(expired)");
    }
    std::printf(
        "%zu evicted, %zu stale records skipped (refreshed entries), %zu left, %zu records "
        "queued\n",
        evicted, stale, cache.size(), cache.records());
    return evicted == 1001 && stale == 200 && cache.size() == 0 && cache.records() == 0 ? 0 : 1;
}
