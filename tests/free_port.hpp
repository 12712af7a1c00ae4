// A free loopback TCP port for a private test server (redis_server.hpp, redis_cluster.hpp,
// pg_server.hpp), and whether a given one can be bound. A port found free may be taken by another
// process before the server binds it: the servers' start() tries another then.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <stdexcept>

namespace delayq_test {

// Whether a loopback TCP port can be bound right now.
inline bool port_is_free(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

// A port nobody listens on right now (the kernel picks it). `cluster_bus`: a port whose
// port + 10000 is free too, at most 55535 (a Redis Cluster node listens on both).
inline int free_port(bool cluster_bus = false) {
    if (cluster_bus) {
        static thread_local std::mt19937 rng(std::random_device{}());
        std::uniform_int_distribution<int> pick(20000, 45535);
        for (int i = 0; i < 1000; ++i)
            if (const int p = pick(rng); port_is_free(p) && port_is_free(p + 10000)) return p;
        throw std::runtime_error(
            "no free loopback port pair (port, port + 10000) for a cluster node");
    }
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

}  // namespace delayq_test
