// What a PostgreSQL test holds beside the queue: a connection of its own (the application's, for
// a transactional put; another session, for a lock a migration would hold) and a host that never
// answers.
#pragma once

#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "catch.hpp"

namespace delayq_pg_test {

/// A libpq connection of the test's own.
struct app_conn {
    PGconn* c;
    explicit app_conn(const std::string& conninfo) : c(PQconnectdb(conninfo.c_str())) {
        INFO(PQerrorMessage(c));
        REQUIRE(PQstatus(c) == CONNECTION_OK);
    }
    ~app_conn() { PQfinish(c); }
    app_conn(const app_conn&) = delete;
    app_conn& operator=(const app_conn&) = delete;
    /// Runs `sql`; returns the server's error message, empty when it succeeded.
    std::string try_exec(const std::string& sql) {
        PGresult* r = PQexec(c, sql.c_str());
        const auto st = PQresultStatus(r);
        std::string err = (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
                              ? std::string()
                              : std::string(PQresultErrorMessage(r));
        PQclear(r);
        return err;
    }
    void exec(const std::string& sql) {
        const std::string err = try_exec(sql);
        INFO(sql << ": " << err);
        REQUIRE(err.empty());
    }
    /// Notifications received so far (consumes input).
    int notifications() {
        PQconsumeInput(c);
        int n = 0;
        while (PGnotify* p = PQnotifies(c)) {
            PQfreemem(p);
            ++n;
        }
        return n;
    }
};

/// A TCP port on 127.0.0.1 that completes the handshake (the kernel does, from the listen
/// backlog) and never says a word: what a client sees of a server whose machine hangs.
struct silent_host {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int port = 0;
    silent_host() {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(fd, 64) == 0);
        REQUIRE(::fcntl(fd, F_SETFL, O_NONBLOCK) == 0);  // for connections(); accept only
        REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
        port = ntohs(a.sin_port);
    }
    ~silent_host() { ::close(fd); }
    /// The connections made to it so far (each taken off the backlog and closed).
    int connections() {
        int n = 0;
        for (int c; (c = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK)) >= 0 || errno == EINTR;)
            if (c >= 0) {
                ::close(c);
                ++n;
            }
        return n;
    }
    silent_host(const silent_host&) = delete;
    silent_host& operator=(const silent_host&) = delete;
};

}  // namespace delayq_pg_test
