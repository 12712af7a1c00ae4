// A private Redis Cluster for one test process: 3 masters and 3 replicas, each a redis_server on
// a loopback port whose port + 10000 (the cluster bus) is free, joined with
// `redis-cli --cluster create ... --cluster-replicas 1`. Killed with its nodes on destruction (and
// by the kernel if the process dies: see redis_server.hpp). Starting one takes ~4 s on 2 cores.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "redis_server.hpp"

namespace delayq_test {

// Runs a program to its end (killed after `limit`); returns its exit status and appends its
// output to `out`.
inline int run_program(const std::vector<std::string>& args, std::string& out,
                       std::chrono::seconds limit = std::chrono::seconds(60)) {
    char tmpl[] = "/tmp/delayq-run-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    ::close(fd);
    const pid_t pid = spawn(args, tmpl);
    if (pid < 0) throw std::runtime_error("cannot start " + args[0]);
    int status = 0;
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > give_up) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream f(tmpl);
    std::stringstream s;
    s << f.rdbuf();
    out += s.str();
    ::unlink(tmpl);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class redis_cluster {
  public:
    // `extra`: more "--option value" arguments for every node (the benchmark turns persistence
    // off, as for its single server). A failover by CLUSTER FAILOVER loses nothing whatever the
    // persistence: the replica has every write before it takes over.
    explicit redis_cluster(std::vector<std::string> extra = {}) {
        std::vector<std::string> node_args{"--cluster-enabled",      "yes",
                                           "--cluster-config-file",  "nodes.conf",
                                           "--cluster-node-timeout", "2000"};
        node_args.insert(node_args.end(), extra.begin(), extra.end());
        for (int i = 0; i < 6; ++i)
            nodes_.push_back(std::make_unique<redis_server>(node_args, true));
        std::vector<std::string> args{find_redis_program("redis-cli"), "--cluster", "create"};
        for (const auto& n : nodes_) args.push_back("127.0.0.1:" + std::to_string(n->port()));
        args.insert(args.end(), {"--cluster-replicas", "1", "--cluster-yes"});
        std::string out;
        if (run_program(args, out) != 0)
            throw std::runtime_error("redis-cli --cluster create failed:\n" + out);
        wait_stable("the new cluster");
    }
    redis_cluster(const redis_cluster&) = delete;
    redis_cluster& operator=(const redis_cluster&) = delete;

    std::size_t size() const noexcept { return nodes_.size(); }
    redis_server& node(std::size_t i) { return *nodes_[i]; }
    redis_server& at_port(int port) {
        for (auto& n : nodes_)
            if (n->port() == port) return *n;
        throw std::runtime_error("no node on port " + std::to_string(port));
    }

    // The port of the master that serves `slot`, as node `asking` (else a running node) sees it.
    int master_of(std::uint16_t slot) const { return master_of(slot, running()); }
    int master_of(std::uint16_t slot, std::size_t asking) const {
        auto r = nodes_[asking]->command({"CLUSTER", "SLOTS"});
        for (std::size_t i = 0; i < r->elements; ++i) {
            const redisReply* range = r->element[i];
            if (range->element[0]->integer <= slot && slot <= range->element[1]->integer)
                return static_cast<int>(range->element[2]->element[1]->integer);
        }
        return -1;
    }
    // The lowest slot that the master on `port` serves.
    std::uint16_t first_slot_of(int port) const {
        auto r = nodes_[running()]->command({"CLUSTER", "SLOTS"});
        long long first = 16384;
        for (std::size_t i = 0; i < r->elements; ++i)
            if (r->element[i]->element[2]->element[1]->integer == port)
                first = std::min(first, r->element[i]->element[0]->integer);
        if (first == 16384) throw std::runtime_error("no slot on port " + std::to_string(port));
        return static_cast<std::uint16_t>(first);
    }

    int master_of_key(const std::string& key) const {
        return master_of(delayq::redis::detail::slot_of(key));
    }

    std::vector<int> masters() const {
        std::vector<int> out;
        auto r = nodes_[running()]->command({"CLUSTER", "SLOTS"});
        for (std::size_t i = 0; i < r->elements; ++i) {
            const int p = static_cast<int>(r->element[i]->element[2]->element[1]->integer);
            if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
        }
        return out;
    }

    std::string id_of(int port) { return at_port(port).text({"CLUSTER", "MYID"}); }

    // A replica of the master on `port`.
    int replica_of(int master_port) {
        for (auto& n : nodes_) {
            if (killed(n->port())) continue;
            auto r =
                n->command({"ROLE"});  // a replica: ["slave", host, master port, state, offset]
            if (std::string(r->element[0]->str) == "slave" &&
                static_cast<int>(r->element[2]->integer) == master_port)
                return n->port();
        }
        throw std::runtime_error("no replica of the master on port " + std::to_string(master_port));
    }

    // CLUSTER FAILOVER on a replica of the master that serves `slot`: a coordinated handover, no
    // write lost. Returns when every node names the replica as the slot's master. Redis gives up
    // a manual failover whose replica has not caught up within 5 s (a loaded machine): then it is
    // asked again.
    int failover(std::uint16_t slot) {
        const int old_master = master_of(slot);
        const int replica = replica_of(old_master);
        const auto everyone_agrees = [&] {
            for (std::size_t i = 0; i < nodes_.size(); ++i)
                if (master_of(slot, i) != replica) return false;
            return true;
        };
        for (int attempt = 0; !everyone_agrees(); ++attempt) {
            if (attempt == 4)
                throw std::runtime_error("CLUSTER FAILOVER did not happen in 4 tries");
            auto r = at_port(replica).command({"CLUSTER", "FAILOVER"});
            if (r->type == REDIS_REPLY_ERROR)
                throw std::runtime_error("CLUSTER FAILOVER: " + std::string(r->str));
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(15);
            while (!everyone_agrees() && std::chrono::steady_clock::now() < give_up)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        wait_stable("the cluster after the failover");
        return replica;
    }

    // `redis-cli --cluster reshard`: moves `count` slots from the master on `from` to the one on
    // `to` while the cluster serves clients.
    void reshard(int from, int to, int count) {
        std::string out;
        const std::vector<std::string> args{find_redis_program("redis-cli"),
                                            "--cluster",
                                            "reshard",
                                            "127.0.0.1:" + std::to_string(from),
                                            "--cluster-from",
                                            id_of(from),
                                            "--cluster-to",
                                            id_of(to),
                                            "--cluster-slots",
                                            std::to_string(count),
                                            "--cluster-yes"};
        if (run_program(args, out) != 0)
            throw std::runtime_error("redis-cli --cluster reshard failed:\n" + out);
        wait_stable("the cluster after the reshard");
    }

    // Kills the node on `port` the hard way (SIGKILL: no goodbye to the cluster). The others
    // flag it as failing after the node timeout (2 s), and a replica of a killed master takes
    // over a moment later, unless it was killed too.
    void kill9(int port) {
        at_port(port).kill9();
        killed_.push_back(port);
    }
    bool killed(int port) const {
        return std::find(killed_.begin(), killed_.end(), port) != killed_.end();
    }

    // Whether every node still running names `port` as the master of `slot`.
    bool all_name_master(std::uint16_t slot, int port) const {
        for (std::size_t i = 0; i < nodes_.size(); ++i)
            if (!killed(nodes_[i]->port()) && master_of(slot, i) != port) return false;
        return true;
    }

    // Waits until the replicas of the master on `port` have every write it took so far (Redis
    // replicates asynchronously: a master killed before that loses those writes).
    void wait_replicated(int port) {
        wait_until("the replicas of " + std::to_string(port), [&] {
            const std::string info = at_port(port).text({"INFO", "replication"});
            const auto field = [&](const std::string& name, std::size_t from = 0) {
                const auto at = info.find(name, from);
                if (at == std::string::npos) return std::string();
                const auto begin = at + name.size();
                return info.substr(begin, info.find_first_of(",\r\n", begin) - begin);
            };
            const std::string master = field("master_repl_offset:");
            const auto replica = info.find("slave0:");
            return !master.empty() && replica != std::string::npos &&
                   field("offset=", replica) == master;
        });
    }

    // Every node says cluster_state:ok and sees 3 masters and 3 replicas.
    void wait_stable(const std::string& what) {
        wait_until(what, [&] {
            for (auto& n : nodes_) {
                if (n->text({"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos)
                    return false;
                const std::string all = n->text({"CLUSTER", "NODES"});
                int masters = 0, replicas = 0;
                std::stringstream lines(all);
                for (std::string line; std::getline(lines, line);) {
                    if (line.find("fail") != std::string::npos ||
                        line.find("handshake") != std::string::npos)
                        return false;
                    if (line.find("master") != std::string::npos) ++masters;
                    if (line.find("slave") != std::string::npos) ++replicas;
                }
                if (masters != 3 || replicas != 3) return false;
            }
            return true;
        });
    }

  private:
    std::size_t running() const {  // a node to ask: the first that was not killed
        for (std::size_t i = 0; i < nodes_.size(); ++i)
            if (!killed(nodes_[i]->port())) return i;
        throw std::runtime_error("every node of the cluster was killed");
    }

    template <class F>
    void wait_until(const std::string& what, F ready) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!ready()) {
            if (std::chrono::steady_clock::now() > give_up)
                throw std::runtime_error(what + " did not settle in 60 s");
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }

    std::vector<std::unique_ptr<redis_server>> nodes_;
    std::vector<int> killed_;  // ports of the nodes kill9() killed
};

// redis_server's interface over one cluster that the whole test process shares, so that a suite
// written for one server runs on a cluster unchanged (tests/redis-cluster builds
// test_redis_queue.cpp with it). Each instance starts from an empty cluster; its extra
// "--option value" arguments are set with CONFIG SET on every node and set back afterwards.
// Commands with a key go to the master that serves it; CONFIG, SCRIPT and FLUSHALL go to every
// node; anything else (INFO, TIME, CLIENT) to the master of queue "q", where the tests' queue is.
class cluster_server {
  public:
    explicit cluster_server(std::vector<std::string> extra = {}) {
        auto& c = shared();
        for (int m : c.masters()) c.at_port(m).command({"FLUSHALL"});
        for (std::size_t i = 0; i + 1 < extra.size(); i += 2) {
            const std::string name = extra[i].substr(2);
            for (std::size_t n = 0; n < c.size(); ++n) {
                auto old = c.node(n).command({"CONFIG", "GET", name});
                if (old->elements == 2)
                    restore_.push_back(
                        {n, name, std::string(old->element[1]->str, old->element[1]->len)});
                c.node(n).command({"CONFIG", "SET", name, extra[i + 1]});
            }
        }
    }
    cluster_server(const cluster_server&) = delete;
    cluster_server& operator=(const cluster_server&) = delete;
    ~cluster_server() {
        for (const auto& r : restore_)
            shared().node(r.node).command({"CONFIG", "SET", r.name, r.value});
    }

    // A master that does not serve the tests' queue "q": every queue starts with a MOVED.
    int port() const {
        auto& c = shared();
        const int q_master = c.master_of_key("{q}");
        for (int m : c.masters())
            if (m != q_master) return m;
        return q_master;
    }

    reply command(const std::vector<std::string>& args) const {
        auto& c = shared();
        static const std::vector<std::string> keyed{"ZSCORE", "HGET",  "EXISTS", "SET", "GET",
                                                    "HLEN",   "ZCARD", "DEL",    "TYPE"};
        if (args.size() > 1 && std::find(keyed.begin(), keyed.end(), args[0]) != keyed.end())
            return c.at_port(c.master_of_key(args[1])).command(args);
        if (args[0] == "CONFIG" || args[0] == "SCRIPT" || args[0] == "FLUSHALL") {
            for (std::size_t n = 1; n < c.size(); ++n) c.node(n).command(args);
            return c.node(0).command(args);
        }
        return c.at_port(c.master_of_key("{q}")).command(args);
    }
    std::string text(const std::vector<std::string>& args) const {
        auto r = command(args);
        return r->str != nullptr ? std::string(r->str, r->len) : std::string();
    }
    std::vector<std::string> keys(const std::string& pattern) const {
        std::vector<std::string> out;
        for (int m : shared().masters())
            for (auto& k : shared().at_port(m).keys(pattern)) out.push_back(std::move(k));
        return out;
    }
    long long waiting_objects() const {
        long long n = 0;
        for (std::size_t i = 0; i < shared().size(); ++i) n += shared().node(i).waiting_objects();
        return n;
    }
    std::string info_field(const std::string& section, const std::string& prefix) const {
        return shared().at_port(shared().master_of_key("{q}")).info_field(section, prefix);
    }
    long long time_ms() const { return shared().node(0).time_ms(); }

    static redis_cluster& shared() {
        static redis_cluster c;  // started by the first test, stopped at exit
        return c;
    }

  private:
    struct setting {
        std::size_t node;
        std::string name, value;
    };
    std::vector<setting> restore_;
};

inline delayq::redis::options opts(const cluster_server& s, std::string name = "q") {
    return queue_options(s.port(), std::move(name));
}

}  // namespace delayq_test
