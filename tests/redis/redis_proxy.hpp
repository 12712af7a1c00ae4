// A loopback TCP proxy in front of a redis-server, for tests that need the network between a queue
// and its server to misbehave in one precise way, on one kind of connection:
// - drop_subscriptions(n): each of the next n connections on which a SUBSCRIBE arrives is closed
//   as soon as it does (a node that dies just after a subscription reached it);
// - delay_replies(d): what the server sends on a connection that has not subscribed (the calls'
//   link, not the waiting consumers' subscription) reaches the client d later (a slow reply on one
//   connection while the others are quick).
// Everything else passes through both ways, unchanged.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

namespace delayq_test {

class redis_proxy {
  public:
    explicit redis_proxy(int upstream)
        : upstream_(upstream), listen_(::socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in a = loopback(0);
        socklen_t len = sizeof a;
        if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(listen_, 16) != 0 ||
            ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
            ::pipe(stop_.data()) != 0)
            throw std::runtime_error("redis_proxy: cannot listen");
        port_ = ntohs(a.sin_port);
        acceptor_ = std::thread([this] { accept_all(); });
    }
    redis_proxy(const redis_proxy&) = delete;
    redis_proxy& operator=(const redis_proxy&) = delete;
    ~redis_proxy() {
        (void)!::write(stop_[1], "!", 1);  // never read: every poll sees it from now on
        acceptor_.join();
        for (auto& t : pumps_) t.join();
        ::close(listen_);
        ::close(stop_[0]);
        ::close(stop_[1]);
    }

    int port() const noexcept { return port_; }
    /// Closes each of the next `n` connections on which a SUBSCRIBE arrives.
    void drop_subscriptions(int n) noexcept { drops_ = n; }
    /// How many connections drop_subscriptions() has closed.
    int dropped() const noexcept { return dropped_.load(); }
    /// From now on, delays by `d` what the server sends on connections that have not subscribed.
    void delay_replies(std::chrono::milliseconds d) noexcept { delay_ms_ = d.count(); }

  private:
    static sockaddr_in loopback(int port) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        return a;
    }

    static bool send_all(int fd, const char* p, long n) {
        while (n > 0) {
            const long w = ::write(fd, p, static_cast<std::size_t>(n));
            if (w <= 0) return false;
            p += w;
            n -= w;
        }
        return true;
    }

    void accept_all() {  // pumps_ is this thread's until the destructor joins it
        for (;;) {
            std::array<pollfd, 2> p{};
            p[0] = {listen_, POLLIN, 0};
            p[1] = {stop_[0], POLLIN, 0};
            if (::poll(p.data(), 2, -1) < 0) continue;
            if ((p[1].revents & POLLIN) != 0) return;
            const int client = ::accept(listen_, nullptr, nullptr);
            if (client >= 0) pumps_.emplace_back([this, client] { pump(client); });
        }
    }

    // Whether this SUBSCRIBE's connection is to be dropped (one of the next drops_).
    bool take_a_drop() {
        int left = drops_.load();
        while (left > 0 && !drops_.compare_exchange_weak(left, left - 1)) {
        }
        if (left <= 0) return false;
        ++dropped_;
        return true;
    }

    void pump(int client) {
        const int up = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = loopback(upstream_);
        if (up < 0 || ::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            if (up >= 0) ::close(up);
            ::close(client);
            return;
        }
        bool subscriber = false;
        std::array<char, 65536> buf{};
        for (bool open = true; open;) {
            std::array<pollfd, 3> p{};
            p[0] = {client, POLLIN, 0};
            p[1] = {up, POLLIN, 0};
            p[2] = {stop_[0], POLLIN, 0};
            if (::poll(p.data(), 3, -1) < 0) continue;
            if ((p[2].revents & POLLIN) != 0) break;
            if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
                const long n = ::read(client, buf.data(), buf.size());
                if (n <= 0) break;
                const std::string_view got(buf.data(), static_cast<std::size_t>(n));
                if (got.find("\r\nSUBSCRIBE\r\n") != std::string_view::npos) {
                    subscriber = true;
                    if (take_a_drop()) break;
                }
                open = send_all(up, buf.data(), n);
            }
            if (open && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
                const long n = ::read(up, buf.data(), buf.size());
                const long delay = delay_ms_.load();
                if (n > 0 && !subscriber && delay > 0)
                    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
                open = n > 0 && send_all(client, buf.data(), n);
            }
        }
        ::close(up);
        ::close(client);
    }

    int upstream_;
    std::atomic<int> drops_{0}, dropped_{0};
    std::atomic<long> delay_ms_{0};
    int listen_;
    int port_ = 0;
    std::array<int, 2> stop_{-1, -1};
    std::thread acceptor_;
    std::vector<std::thread> pumps_;
};

}  // namespace delayq_test
