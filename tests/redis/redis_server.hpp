// A private redis-server for one test (or benchmark) process: a free loopback port, a temporary
// directory, started in the constructor and killed in the destructor, so a failing test leaves
// nothing behind. The tests never touch a server they did not start.
#pragma once

#include <delayq/redis/delay_queue.hpp>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace delayq_test {

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply = std::unique_ptr<redisReply, reply_deleter>;

// The server binary: $DELAYQ_REDIS_SERVER, /usr/bin/redis-server, or redis-server on PATH.
inline std::string find_redis_server() {
    if (const char* env = std::getenv("DELAYQ_REDIS_SERVER"); env != nullptr && *env != '\0') return env;
    if (::access("/usr/bin/redis-server", X_OK) == 0) return "/usr/bin/redis-server";
    if (const char* path = std::getenv("PATH")) {
        std::stringstream dirs(path);
        for (std::string dir; std::getline(dirs, dir, ':');) {
            const std::string p = dir + "/redis-server";
            if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p;
        }
    }
    throw std::runtime_error(
        "redis-server not found (not at /usr/bin/redis-server, not on PATH, DELAYQ_REDIS_SERVER unset): "
        "the Redis tests need a real server; install it with `apt-get install redis-server`");
}

// A port nobody listens on right now. Another process may take it before the server binds it;
// start() then tries another.
inline int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("socket() failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        ::close(fd);
        throw std::runtime_error("cannot bind a loopback port");
    }
    ::close(fd);
    return ntohs(a.sin_port);
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
        if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0 ||
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

private:
    int fd_;
    int port_ = 0;
};

class redis_server {
public:
    // `extra` are more "--option value" arguments, e.g. {"--appendfsync", "always"}.
    explicit redis_server(std::vector<std::string> extra = {}) : binary_(find_redis_server()), extra_(std::move(extra)) {
        char tmpl[] = "/tmp/delayq-redis-XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
        dir_ = tmpl;
        std::string why;
        for (int i = 0; i < 5; ++i) {
            port_ = free_port();
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
    reply command(const std::vector<std::string>& args) const {
        redisContext* c = redisConnect("127.0.0.1", port_);
        if (c == nullptr || c->err != 0) {
            const std::string msg = c != nullptr ? c->errstr : "out of memory";
            redisFree(c);
            throw std::runtime_error("cannot connect to the test redis-server: " + msg);
        }
        std::vector<const char*> argv;
        std::vector<std::size_t> len;
        for (const auto& a : args) {
            argv.push_back(a.data());
            len.push_back(a.size());
        }
        auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), len.data()));
        const std::string err = c->errstr;
        redisFree(c);
        if (r == nullptr) throw std::runtime_error("command to the test redis-server failed: " + err);
        return reply(r);
    }

    std::string text(const std::vector<std::string>& args) const {
        auto r = command(args);
        return r->str != nullptr ? std::string(r->str, r->len) : std::string();
    }

    // The keys matching a KEYS pattern (the test servers hold a handful of keys).
    std::vector<std::string> keys(const std::string& pattern) const {
        auto r = command({"KEYS", pattern});
        std::vector<std::string> out;
        for (std::size_t i = 0; i < r->elements; ++i) out.emplace_back(r->element[i]->str, r->element[i]->len);
        return out;
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
        std::vector<std::string> args{binary_,        "--port",         std::to_string(port_),
                                      "--bind",       "127.0.0.1",      "--dir",
                                      dir_,           "--appendonly",   "yes",
                                      "--maxmemory-policy", "noeviction", "--save",
                                      "",             "--daemonize",    "no",
                                      "--protected-mode", "no",         "--logfile",
                                      dir_ + "/redis.log"};
        args.insert(args.end(), extra_.begin(), extra_.end());
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        if (::posix_spawn(&pid_, binary_.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
            pid_ = -1;
            why = "posix_spawn of " + binary_ + " failed";
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
            ok = r != nullptr && r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "PONG";
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
