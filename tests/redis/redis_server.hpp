// A private redis-server for one test (or benchmark) process: a free loopback port, a temporary
// directory, started in the constructor and killed in the destructor, so a failing test leaves
// nothing behind. The tests never touch a server they did not start. A server is also killed by
// the kernel when the thread that started it ends (PR_SET_PDEATHSIG), so a test process that
// crashes or is killed by ctest's timeout leaves no server either: start servers from the thread
// that lives as long as they should (the tests' main thread).
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <delayq/redis/delay_queue.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../free_port.hpp"

extern char** environ;

namespace delayq_test {

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply = std::unique_ptr<redisReply, reply_deleter>;

// A Redis program (redis-server, redis-cli): $DELAYQ_REDIS_SERVER's directory for both, /usr/bin,
// or PATH.
inline std::string find_redis_program(const std::string& name = "redis-server") {
    if (const char* env = std::getenv("DELAYQ_REDIS_SERVER"); env != nullptr && *env != '\0') {
        if (name == "redis-server") return env;
        const std::string beside = std::filesystem::path(env).parent_path() / name;
        if (::access(beside.c_str(), X_OK) == 0) return beside;
    }
    if (::access(("/usr/bin/" + name).c_str(), X_OK) == 0) return "/usr/bin/" + name;
    if (const char* path = std::getenv("PATH")) {
        std::stringstream dirs(path);
        for (std::string dir; std::getline(dirs, dir, ':');) {
            const std::string p = dir + "/" + name;
            if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p;
        }
    }
    throw std::runtime_error(
        name + " not found (not at /usr/bin/" + name +
        ", not on PATH, DELAYQ_REDIS_SERVER unset): the Redis tests need a real server; "
        "install it with `apt-get install redis-server`");
}

inline std::string find_redis_server() {
    return find_redis_program("redis-server");
}

// Starts `args` (args[0] is the program) with stdout and stderr to `log` (or inherited when
// empty), in a child that the kernel kills when the calling thread ends. Returns its pid, or -1.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& log = "") {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    // The child: only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent is already gone
    if (!log.empty()) {
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::close(fd);
        }
    }
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
}

// Runs `args` on the connection `c`: its reply, or null when the connection failed.
inline redisReply* command_argv(redisContext* c, const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> len;
    for (const auto& a : args) {
        argv.push_back(a.data());
        len.push_back(a.size());
    }
    return static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), len.data()));
}

// One command on a fresh connection to the redis-server on 127.0.0.1:`port`: its reply; throws
// when the connection or the command fails (redis_server::command, the benchmarks' INFO calls).
inline reply command_at(int port, const std::vector<std::string>& args) {
    redisContext* c = redisConnect("127.0.0.1", port);
    const std::string where = "the redis-server on port " + std::to_string(port);
    if (c == nullptr || c->err != 0) {
        const std::string msg = c != nullptr ? c->errstr : "out of memory";
        redisFree(c);
        throw std::runtime_error("cannot connect to " + where + ": " + msg);
    }
    redisReply* r = command_argv(c, args);
    const std::string err = c->errstr;
    redisFree(c);
    if (r == nullptr) throw std::runtime_error("command to " + where + " failed: " + err);
    return reply(r);
}

// A loopback socket that accepts connections (the kernel completes them) but never answers: a
// server that hangs. Closed on destruction.
class silent_server {
  public:
    silent_server() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(fd_, 16) != 0 ||
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            if (fd_ >= 0) ::close(fd_);
            throw std::runtime_error("cannot listen on a loopback port");
        }
        port_ = ntohs(a.sin_port);
    }
    silent_server(const silent_server&) = delete;
    silent_server& operator=(const silent_server&) = delete;
    ~silent_server() { ::close(fd_); }
    int port() const noexcept { return port_; }
    int fd() const noexcept { return fd_; }

  private:
    int fd_;
    int port_ = 0;
};

// A loopback server that speaks just enough RESP for a test to script a node's answers: each
// command (an array of bulk strings) goes to `answer`, whose reply is written back raw (RESP text,
// e.g. "+OK\r\n"); std::nullopt closes the connection. With no `answer`, each connection is
// closed as soon as it is accepted. Each connection is served by a thread of its own, so `answer`
// may be called from several threads at once, and may block (a node that hangs) as long as it
// returns before the server is destroyed.
class scripted_server {
  public:
    using script = std::function<std::optional<std::string>(const std::vector<std::string>&)>;

    explicit scripted_server(script answer = {}) : answer_(std::move(answer)) {
        server_ = std::thread([this] { serve(); });
    }
    scripted_server(const scripted_server&) = delete;
    scripted_server& operator=(const scripted_server&) = delete;
    ~scripted_server() {
        stop_ = true;
        ::shutdown(listener_.fd(), SHUT_RDWR);
        server_.join();
        {
            std::lock_guard lk(m_);
            for (int c : open_) ::shutdown(c, SHUT_RDWR);
        }
        for (auto& t : conversations_) t.join();
    }
    int port() const noexcept { return listener_.port(); }

  private:
    void serve() {
        while (!stop_) {
            const int c = ::accept(listener_.fd(), nullptr, nullptr);
            if (c < 0) return;
            if (!answer_) {
                ::close(c);
                continue;
            }
            std::lock_guard lk(m_);
            open_.push_back(c);
            conversations_.emplace_back([this, c] {
                converse(c);
                std::lock_guard done(m_);  // closed under the lock: the destructor shuts down open_
                open_.erase(std::find(open_.begin(), open_.end(), c));
                ::close(c);
            });
        }
    }

    void converse(int c) {
        std::string in;
        char buf[4096];
        for (;;) {
            std::vector<std::string> args;
            std::size_t used = 0;
            while (!parse(in, args, used)) {
                const ssize_t n = ::read(c, buf, sizeof buf);
                if (n <= 0) return;
                in.append(buf, static_cast<std::size_t>(n));
            }
            in.erase(0, used);
            const std::optional<std::string> out = answer_(args);
            if (!out) return;
            if (::send(c, out->data(), out->size(), MSG_NOSIGNAL) < 0) return;
        }
    }

    // One command from the front of `in`: false while it is incomplete.
    static bool parse(const std::string& in, std::vector<std::string>& args, std::size_t& used) {
        args.clear();
        std::size_t at = 0;
        const auto number = [&](char kind, long& v) {
            if (at >= in.size() || in[at] != kind) return false;
            const auto end = in.find("\r\n", at);
            if (end == std::string::npos) return false;
            v = std::stol(in.substr(at + 1, end - at - 1));
            at = end + 2;
            return true;
        };
        long n = 0;
        if (!number('*', n)) return false;
        for (long i = 0; i < n; ++i) {
            long len = 0;
            if (!number('$', len) || in.size() < at + static_cast<std::size_t>(len) + 2)
                return false;
            args.push_back(in.substr(at, static_cast<std::size_t>(len)));
            at += static_cast<std::size_t>(len) + 2;
        }
        used = at;
        return true;
    }

    silent_server listener_;  // listens; this class answers
    script answer_;
    std::atomic<bool> stop_{false};
    std::mutex m_;
    std::vector<int> open_;                   // under m_: connections being served
    std::vector<std::thread> conversations_;  // under m_
    std::thread server_;
};

class redis_server {
  public:
    // `extra` are more "--option value" arguments, e.g. {"--appendfsync", "always"}. `cluster_bus`:
    // a port fit for a Redis Cluster node (see free_port, tests/free_port.hpp).
    explicit redis_server(std::vector<std::string> extra = {}, bool cluster_bus = false)
        : binary_(find_redis_server()), extra_(std::move(extra)) {
        char tmpl[] = "/tmp/delayq-redis-XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
        dir_ = tmpl;
        std::string why;
        for (int i = 0; i < 5; ++i) {
            port_ = free_port(cluster_bus);
            if (try_start(why)) return;
        }
        std::filesystem::remove_all(dir_);
        throw std::runtime_error("redis-server did not start: " + why);
    }
    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;
    ~redis_server() {
        kill9();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    int port() const noexcept { return port_; }
    const std::string& dir() const noexcept { return dir_; }
    pid_t pid() const noexcept { return pid_; }  // -1 while it is not running

    // Kills the server the hard way: no shutdown save, no goodbye to clients.
    void kill9() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        pid_ = -1;
    }

    // Starts it again on the same port and directory (after kill9), reading back its AOF.
    void restart() {
        kill9();
        std::string why;
        for (int i = 0; i < 50; ++i) {  // the port may linger for a moment
            if (try_start(why)) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        throw std::runtime_error("redis-server did not restart: " + why);
    }

    // One command on a fresh connection, for checks and fault injection.
    reply command(const std::vector<std::string>& args) const { return command_at(port_, args); }

    std::string text(const std::vector<std::string>& args) const {
        auto r = command(args);
        return r->str != nullptr ? std::string(r->str, r->len) : std::string();
    }

    // The keys matching a KEYS pattern (the test servers hold a handful of keys).
    std::vector<std::string> keys(const std::string& pattern) const {
        return list({"KEYS", pattern});
    }

    // The strings of an array reply.
    std::vector<std::string> list(const std::vector<std::string>& args) const {
        auto r = command(args);
        std::vector<std::string> out;
        for (std::size_t i = 0; i < r->elements; ++i)
            out.emplace_back(r->element[i]->str, r->element[i]->len);
        return out;
    }

    // How many connections listen on the queues' wake-up channels: one per queue object that
    // has waited in take() (that is how a test knows its consumers are waiting).
    long long waiting_objects() const {
        long long n = 0;
        for (const auto& ch : list({"PUBSUB", "CHANNELS", "dq:*"}))
            n += command({"PUBSUB", "NUMSUB", ch})->element[1]->integer;
        return n;
    }

    // A field of INFO, e.g. info_field("commandstats", "cmdstat_evalsha:calls=") -> "12".
    std::string info_field(const std::string& section, const std::string& prefix) const {
        const std::string all = text({"INFO", section});
        const auto at = all.find(prefix);
        if (at == std::string::npos) return "";
        const auto begin = at + prefix.size();
        return all.substr(begin, all.find_first_of(",\r\n", begin) - begin);
    }

    // Server time in milliseconds (TIME), the clock every due time is judged by.
    long long time_ms() const {
        auto r = command({"TIME"});
        return std::stoll(std::string(r->element[0]->str, r->element[0]->len)) * 1000 +
               std::stoll(std::string(r->element[1]->str, r->element[1]->len)) / 1000;
    }

  private:
    bool try_start(std::string& why) {
        std::vector<std::string> args{binary_,
                                      "--port",
                                      std::to_string(port_),
                                      "--bind",
                                      "127.0.0.1",
                                      "--dir",
                                      dir_,
                                      "--appendonly",
                                      "yes",
                                      "--maxmemory-policy",
                                      "noeviction",
                                      "--save",
                                      "",
                                      "--daemonize",
                                      "no",
                                      "--protected-mode",
                                      "no",
                                      "--logfile",
                                      dir_ + "/redis.log"};
        args.insert(args.end(), extra_.begin(), extra_.end());
        pid_ = spawn(args);
        if (pid_ < 0) {
            why = "fork failed";
            return false;
        }
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < give_up) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                std::ifstream log(dir_ + "/redis.log");
                std::stringstream s;
                s << log.rdbuf();
                why = "redis-server exited; its log:\n" + s.str();
                return false;
            }
            if (ready()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        kill9();
        why = "redis-server did not answer PING within 20 s";
        return false;
    }

    bool ready() const {
        timeval tv{0, 200'000};
        redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
        bool ok = false;
        if (c != nullptr && c->err == 0) {
            auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
            ok = r != nullptr && r->type == REDIS_REPLY_STATUS &&
                 std::string(r->str, r->len) == "PONG";
            if (r != nullptr) freeReplyObject(r);
        }
        redisFree(c);
        return ok;
    }

    std::string binary_;
    std::vector<std::string> extra_;
    std::string dir_;
    int port_ = 0;
    pid_t pid_ = -1;
};

// Polls `cond` until it holds or `limit` passes; for conditions another process or thread makes
// true, never for timing assertions.
template <class F>
bool eventually(F&& cond, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!cond()) {
        if (std::chrono::steady_clock::now() >= end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

// Options for queue `name` on the server at `port`, everything else left at its default.
inline delayq::redis::options queue_options(int port, std::string name = "q") {
    delayq::redis::options o;
    o.port = port;
    o.name = std::move(name);
    return o;
}

inline delayq::redis::options opts(const redis_server& s, std::string name = "q") {
    return queue_options(s.port(), std::move(name));
}

}  // namespace delayq_test
