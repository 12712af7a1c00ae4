// One libpq connection for delayq::postgres, with a time limit on every exchange, and the binary
// encoding of the statements' parameters and results. Part of <delayq/postgres/delay_queue.hpp>.
//
// Time limits. libpq's blocking calls wait as long as the server or the network takes; a queue
// call must return or fail within options::io_timeout (plus one connect) whatever the server
// does. So a connection is made with PQconnectStartParams/PQconnectPoll and every statement is
// sent in nonblocking mode and answered through poll(2) on the socket, by the deadline of the
// call that uses the connection (set_deadline; the queue gives each call io_timeout from its
// start, its wait for a pooled connection included). A connection that misses its deadline, or
// breaks, is marked broken and never used again: what it sent may or may not have been applied,
// which the queue's calls are written to tolerate (a put is idempotent by id, a lease token
// fences a stale holder).
//
// Fencing: a call that failed leaves nothing running that changes the queue afterwards. A
// statement the client gave up on is still running on the server: waiting for a lock (a
// migration's LOCK TABLE, a long transaction), it would commit whenever the lock goes, to
// nobody: a put that threw applied later, a claim that leases a job to no consumer and counts
// its attempt (max_attempts then buries jobs that were never handed out), and one more backend
// for every retry. Two ways to stop it were weighed:
//  - a cancel request (PQcancel) when the client gives up. It travels on a connection of its
//    own, after the fact: it races the statement's commit (a cancel that arrives after the
//    commit does nothing, and the client cannot tell which happened), it cannot reach a server
//    that does not answer (the case that made the client give up), and libpq before 17 sends
//    it blocking, with no time limit of its own.
//  - the server's own limit, statement_timeout, set so that it ends at least guard() (a tenth
//    of io_timeout, at most 250 ms) before the client's deadline (fence()): the server itself
//    aborts the statement, lock waits included, before the client would give up, and says so
//    (SQLSTATE 57014, a connection_error): the client knows the outcome, nothing was applied,
//    and the connection stays usable. No race: the abort happens inside the statement's
//    transaction, before its commit.
// So the fence is the server's limit, and there is no cancel request. The limit is a session
// setting, sent (one round trip) only when the one in force does not fit the call's remaining
// time: on a connection's first use and after a call waited for the pool, not on every call.
// What it cannot cover: a commit already under way when the client gives up (waiting for the
// disk, or for a synchronous standby): the statement is done and only its durability is
// awaited, the ordinary "a call that failed may have been applied"; and a server that reads the
// statement more than guard() after it was sent (its limit starts when it reads it). The
// wake-up that follows a write in the same round trip (exec_then) has a limit of its own and
// may still run, until then, after the call failed: it changes no job, it only notifies.
//
// Many hosts. A conninfo may name several hosts (host=db1,db2 ... target_session_attrs=
// read-write). libpq's async connect moves to the next host only when one fails, and does not
// enforce connect_timeout (the caller must), so a host that does not answer at all (a dead
// machine, not a refused port) would take the whole io_timeout and leave none for the next. So
// the conninfo is parsed (PQconninfoParse) and the hosts are tried one by one, each with every
// other setting as given (target_session_attrs judges each): each for connect_timeout when the
// conninfo (or PGCONNECT_TIMEOUT) gives one (at least 2 s, as libpq reads it), else for an
// equal share of what is left of io_timeout; all of them within io_timeout. The queue object
// remembers the host that answered last and tries it first next time, so that one dead host
// does not cost every new connection its time (load_balance_hosts=random keeps libpq's random
// order).
//
// Idle connections. A server that goes away while a connection is idle (a restart, a
// terminated backend) writes its goodbye (a FATAL message, which libpq hands to the notice
// receiver when no statement runs) and closes it; alive() sees either without a round trip, so
// a dead connection is replaced before anything is sent on it.
//
// Binary format. Parameters and results travel in PostgreSQL's binary format: bytea is sent and
// received as is (no escaping, payloads are binary-safe and cost no hex step), integers are
// big-endian. The parameter types are given to PQprepare, so the binary layouts always match.
//
// Errors are thrown as the typed exceptions of delayq::postgres's family, through raise()
// (delayq/postgres/error.hpp).
#pragma once

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../error.hpp"

namespace delayq::postgres::detail {

// Type OIDs of the parameters the statements take (pg_type.h; stable across versions).
inline constexpr Oid bool_oid = 16, bytea_oid = 17, int8_oid = 20, text_oid = 25,
                     bytea_array_oid = 1001, int8_array_oid = 1016;

/// The problem an SQLSTATE stands for: a refused privilege, a lost connection or a server going
/// down (class 08, 57P01-57P03), or anything else.
inline problem classify(std::string_view sqlstate) noexcept {
    if (sqlstate == "42501") return problem::permission;
    if (sqlstate.substr(0, 2) == "08" || sqlstate == "57P01" || sqlstate == "57P02" ||
        sqlstate == "57P03")
        return problem::connection;
    return problem::other;
}

/// The parameters of one statement, in binary format.
class params {
  public:
    params& text(std::string_view s) { return add(s, text_oid); }
    params& bytes(std::string_view s) { return add(s, bytea_oid); }
    params& int8(long long v) {
        char b[8];
        put_be(b, static_cast<std::uint64_t>(v), 8);
        return add(std::string_view(b, 8), int8_oid);
    }
    params& boolean(bool v) {
        const char b = v ? 1 : 0;
        return add(std::string_view(&b, 1), bool_oid);
    }
    /// A one-dimensional bytea[] of `items`.
    template <class Range, class Get>
    params& bytes_array(const Range& items, Get get) {
        std::string s = array_header(bytea_oid, items.size());
        for (const auto& item : items) {
            const std::string_view v = get(item);
            append_be(s, v.size(), 4);
            s.append(v);
        }
        return add(s, bytea_array_oid);
    }
    /// A one-dimensional bigint[] of `items`.
    template <class Range, class Get>
    params& int8_array(const Range& items, Get get) {
        std::string s = array_header(int8_oid, items.size());
        for (const auto& item : items) {
            append_be(s, 8, 4);
            append_be(s, static_cast<std::uint64_t>(static_cast<long long>(get(item))), 8);
        }
        return add(s, int8_array_oid);
    }

    int count() const noexcept { return static_cast<int>(values_.size()); }
    const Oid* types() const noexcept { return types_.data(); }
    /// The pointers libpq takes; valid while this object lives and is not added to.
    struct view {
        std::vector<const char*> values;
        std::vector<int> lengths, formats;
    };
    view pointers() const {
        view v;
        for (const auto& s : values_) {
            v.values.push_back(s.data());
            v.lengths.push_back(static_cast<int>(s.size()));
            v.formats.push_back(1);
        }
        return v;
    }

  private:
    static void put_be(char* out, std::uint64_t v, int n) {
        for (int i = n - 1; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
    }
    static void append_be(std::string& s, std::uint64_t v, int n) {
        char b[8];
        put_be(b, v, n);
        s.append(b, static_cast<std::size_t>(n));
    }
    static std::string array_header(Oid element, std::size_t n) {
        std::string s;
        append_be(s, 1, 4);  // dimensions
        append_be(s, 0, 4);  // no NULLs
        append_be(s, element, 4);
        append_be(s, n, 4);  // length of the one dimension
        append_be(s, 1, 4);  // its lower bound
        return s;
    }
    params& add(std::string_view v, Oid type) {
        values_.emplace_back(v);
        types_.push_back(type);
        return *this;
    }
    std::vector<std::string> values_;
    std::vector<Oid> types_;
};

/// A statement's result, in binary format.
class result {
  public:
    explicit result(PGresult* r = nullptr) noexcept : r_(r) {}
    int rows() const noexcept { return r_ ? PQntuples(r_.get()) : 0; }
    bool is_null(int row, int col) const noexcept { return PQgetisnull(r_.get(), row, col) != 0; }
    std::string bytes(int row, int col) const {
        return std::string(PQgetvalue(r_.get(), row, col),
                           static_cast<std::size_t>(PQgetlength(r_.get(), row, col)));
    }
    /// A column's bytes, valid while this result lives.
    std::string_view bytes_view(int row, int col) const {
        return std::string_view(PQgetvalue(r_.get(), row, col),
                                static_cast<std::size_t>(PQgetlength(r_.get(), row, col)));
    }
    /// An integer column of any width (int2, int4, int8), big-endian.
    long long integer(int row, int col) const noexcept {
        const auto* p = reinterpret_cast<const unsigned char*>(PQgetvalue(r_.get(), row, col));
        const int n = PQgetlength(r_.get(), row, col);
        std::uint64_t v = (n > 0 && (p[0] & 0x80)) ? ~std::uint64_t{0} : 0;  // sign
        for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
        return static_cast<long long>(v);
    }
    PGresult* get() const noexcept { return r_.get(); }
    /// The rows a command changed (PQcmdTuples).
    long long changed() const noexcept {
        const char* s = r_ ? PQcmdTuples(r_.get()) : "";
        return *s ? std::strtoll(s, nullptr, 10) : 0;
    }

  private:
    struct deleter {
        void operator()(PGresult* r) const noexcept { PQclear(r); }
    };
    std::unique_ptr<PGresult, deleter> r_;
};

/// One connection to the server; used by one thread at a time.
class connection {
  public:
    using clock = std::chrono::steady_clock;

    /// Connects to `conninfo` (a libpq connection string or URI; empty: libpq's defaults and
    /// environment) by `deadline`, host by host (see "Many hosts" above); `io_timeout` is the
    /// queue's, which the server's limit on each statement is derived from (see "Fencing").
    /// `last_host`, if given, is where the connections of one queue object keep the host that
    /// answered last, which the next connect tries first.
    connection(const std::string& conninfo, std::chrono::milliseconds io_timeout,
               clock::time_point deadline, std::atomic<std::size_t>* last_host = nullptr)
        : timeout_(io_timeout), deadline_(deadline) {
        std::string why;
        const auto targets = targets_of(conninfo, why);
        if (targets.hosts.empty()) raise(problem::connection, "cannot connect: " + why, "");
        const std::size_t n = targets.hosts.size();
        const std::size_t first =
            last_host != nullptr && !targets.shuffled ? last_host->load() % n : 0;
        for (std::size_t i = 0; i < n && !conn_; ++i) {
            const auto now = clock::now();
            const std::size_t k = (first + i) % n;
            const std::string host = describe(targets.hosts[k]);
            if (now >= deadline) {
                why += (why.empty() ? "" : "; ") + host + ": not tried, no time left";
                continue;
            }
            // This host's limit: connect_timeout, or an equal share of what is left.
            const auto until = targets.per_host.count() > 0
                                   ? std::min(deadline, now + targets.per_host)
                                   : now + (deadline - now) / static_cast<long>(n - i);
            std::string failed;
            if (try_connect(targets, k, until, failed)) {
                if (last_host != nullptr) last_host->store(k);
                break;
            }
            if (!why.empty()) why += "; ";
            if (n > 1) why.append(host).append(": ");
            why += failed;
        }
        if (!conn_) {
            broken_ = true;
            if (n == 1) raise(problem::connection, "cannot connect: " + why, "");
            raise(problem::connection,
                  "cannot connect to any of " + std::to_string(n) + " hosts within io_timeout (" +
                      std::to_string(timeout_.count()) + " ms): " + why,
                  "");
        }
        if (PQsetnonblocking(conn_.get(), 1) != 0) fail_connect();
        // The server's notices (CREATE ... IF NOT EXISTS skipping) are not the caller's business;
        // libpq would print them on stderr. What the server says while no statement runs is a
        // notice too, and a FATAL one is its goodbye (a terminated backend, a shutdown): the
        // connection is dead even before its end of file is read.
        PQsetNoticeReceiver(
            conn_.get(),
            [](void* self, const PGresult* r) {
                const char* sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
                if (sev != nullptr &&
                    (std::strcmp(sev, "FATAL") == 0 || std::strcmp(sev, "PANIC") == 0))
                    static_cast<connection*>(self)->goodbye_ = true;
            },
            this);
    }

    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    PGconn* get() const noexcept { return conn_.get(); }
    /// Whether the connection broke, missed a deadline or heard the server's goodbye: it is never
    /// used again.
    bool broken() const noexcept {
        return broken_ || goodbye_ || PQstatus(conn_.get()) != CONNECTION_OK;
    }
    int server_version() const noexcept { return PQserverVersion(conn_.get()); }

    /// The deadline of the call that uses the connection now: every exchange until the next
    /// call ends by then, and the server's own limit on each statement ends before (see
    /// "Fencing" above). At first, the connect's deadline.
    void set_deadline(clock::time_point deadline) noexcept { deadline_ = deadline; }

    /// Whether an idle connection still looks usable: a server that went away (restarted,
    /// terminated the backend) has written its last words on it or closed it, which one poll with
    /// no wait shows. Costs no round trip. `listening`: notifications may arrive, and stay
    /// queued for wait_notification(); the server's goodbye (a FATAL message, or the end of the
    /// stream) means the end; otherwise anything that came while idle means the end.
    bool alive(bool listening = false) {
        if (broken()) return false;
        pollfd fd{PQsocket(conn_.get()), POLLIN, 0};
        if (::poll(&fd, 1, 0) <= 0) return true;  // nothing to read: as it was
        if (!listening || PQconsumeInput(conn_.get()) == 0) broken_ = true;
        return !broken();
    }

    /// Prepares `sql` as statement `name` with the parameter types of `p`.
    void prepare(const char* name, const std::string& sql, const std::vector<Oid>& types) {
        fence("preparing a statement");
        if (!PQsendPrepare(conn_.get(), name, sql.c_str(), static_cast<int>(types.size()),
                           types.data()))
            lost("sending a statement");
        finish(deadline_, "preparing a statement");
    }

    /// Runs the prepared statement `name` with `p`; binary results.
    result exec(const char* name, const params& p, const char* doing) {
        fence(doing);
        const auto deadline = deadline_;
        const auto v = p.pointers();
        if (!PQsendQueryPrepared(conn_.get(), name, p.count(), v.values.data(), v.lengths.data(),
                                 v.formats.data(), 1))
            lost(doing);
        return finish(deadline, doing);
    }

#ifdef LIBPQ_HAS_PIPELINING
    // Enters pipeline mode and queues `first` with `p1` and `second` with `p2`, each ended by a
    // sync point of its own (`apart`: two transactions) or both by one (one transaction).
    void send_pipelined(const char* first, const params& p1, const char* second, const params& p2,
                        bool apart, const char* doing) {
        const auto v1 = p1.pointers();
        const auto v2 = p2.pointers();
        PGconn* c = conn_.get();
        if (!PQenterPipelineMode(c) ||
            !PQsendQueryPrepared(c, first, p1.count(), v1.values.data(), v1.lengths.data(),
                                 v1.formats.data(), 1) ||
            (apart && !PQpipelineSync(c)) ||
            !PQsendQueryPrepared(c, second, p2.count(), v2.values.data(), v2.lengths.data(),
                                 v2.formats.data(), 1) ||
            !PQpipelineSync(c))
            lost(doing);
    }
#endif

    /// Runs the prepared statement `first` with `p1`, then `second` with `p2`, each in a
    /// transaction of its own, in one round trip (libpq's pipeline mode; two round trips with a
    /// libpq older than 14): `second` starts after `first` committed, whether `first` failed or
    /// not. Returns both results; throws `first`'s error, else `second`'s.
    std::pair<result, result> exec_then(const char* first, const params& p1, const char* second,
                                        const params& p2, const char* doing) {
#ifdef LIBPQ_HAS_PIPELINING
        fence(doing);
        const auto deadline = deadline_;
        PGconn* c = conn_.get();
        send_pipelined(first, p1, second, p2, true, doing);
        flush(deadline, doing);
        answer a1 = read_answer(deadline, doing, true);
        answer a2;
        try {
            a2 = read_answer(deadline, doing, true);
        } catch (...) {
            // `second` missed the deadline (the connection is dropped): `first`'s failure, if it
            // failed, says more (a stall: the server stopped it, nothing of it applied).
            if (!a1.err.empty()) check(a1, doing);
            throw;
        }
        if (!PQexitPipelineMode(c)) lost(doing);
        check(a1, doing);
        check(a2, doing);
        return {std::move(a1.last), std::move(a2.last)};
#else
        result r1;
        try {
            r1 = exec(first, p1, doing);
        } catch (...) {
            if (!broken()) (void)exec(second, p2, doing);
            throw;
        }
        return {std::move(r1), exec(second, p2, doing)};
#endif
    }

    /// Runs the prepared statement `first` with `p1`, then `second` with `p2`, in one transaction
    /// (one implicit transaction, ended by one sync point, in libpq's pipeline mode; BEGIN and
    /// COMMIT around them with a libpq older than 14): `second` starts after `first` returned, so
    /// it sees what committed while `first` waited (a lock). Returns `second`'s result; throws
    /// `first`'s error (`second` is then skipped, and nothing of either applied), else `second`'s.
    result exec_together(const char* first, const params& p1, const char* second, const params& p2,
                         const char* doing) {
#ifdef LIBPQ_HAS_PIPELINING
        fence(doing);
        const auto deadline = deadline_;
        PGconn* c = conn_.get();
        send_pipelined(first, p1, second, p2, false, doing);
        flush(deadline, doing);
        answer a1 = read_answer(deadline, doing, false);
        answer a2 = read_answer(deadline, doing, true);
        if (!PQexitPipelineMode(c)) lost(doing);
        check(a1, doing);
        check(a2, doing);
        return std::move(a2.last);
#else
        (void)exec_simple("BEGIN", doing);
        try {
            (void)exec(first, p1, doing);
            result r = exec(second, p2, doing);
            (void)exec_simple("COMMIT", doing);
            return r;
        } catch (...) {
            if (!broken()) (void)exec_simple("ROLLBACK", doing);
            throw;
        }
#endif
    }

    /// Runs `sql` (one or more statements, no parameters: the simple protocol).
    result exec_simple(const std::string& sql, const char* doing) {
        fence(doing);
        if (!PQsendQuery(conn_.get(), sql.c_str())) lost(doing);
        return finish(deadline_, doing);
    }

    /// Waits until a notification arrives (true), or `until` passes or the descriptor `poke` (if
    /// >= 0) is readable (false); `poke` is left unread, for the caller to drain (the taker's
    /// pipe: another thread brings the waiting take back). Throws when the connection breaks.
    bool wait_notification(clock::time_point until, int poke = -1) {
        bool poked = false;
        for (;;) {
            if (PQconsumeInput(conn_.get()) == 0 || goodbye_) lost("waiting for a notification");
            bool got = false;
            while (PGnotify* n = PQnotifies(conn_.get())) {
                PQfreemem(n);
                got = true;
            }
            if (got) return true;  // what came with the poke counts: read, it is not lost
            if (poked) return false;
            const auto now = clock::now();
            if (now >= until) return false;
            // poll(2) ignores a negative descriptor: without `poke`, the socket alone.
            std::array<pollfd, 2> fds{{{PQsocket(conn_.get()), POLLIN, 0}, {poke, POLLIN, 0}}};
            const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
            const int r =
                ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(ms, 1 << 30)));
            if (r < 0 && errno != EINTR) lost("waiting for a notification");
            poked = r > 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
        }
    }

  private:
    struct conn_deleter {
        void operator()(PGconn* c) const noexcept { PQfinish(c); }
    };

    // One host to try: its host, hostaddr and port, each empty for libpq's default.
    struct target {
        std::string host, hostaddr, port;
    };
    // The conninfo, parsed: the settings every host shares, and the hosts in the order to try.
    struct target_list {
        std::vector<std::string> keys, values;  // all but host, hostaddr and port
        std::vector<target> hosts;
        std::chrono::milliseconds per_host{0};  // connect_timeout; 0: a share of io_timeout
        bool shuffled = false;                  // load_balance_hosts=random
    };

    static std::vector<std::string> split(const std::string& s) {
        std::vector<std::string> out;
        if (s.empty()) return out;
        std::size_t from = 0;
        for (std::size_t comma; (comma = s.find(',', from)) != std::string::npos; from = comma + 1)
            out.push_back(s.substr(from, comma - from));
        out.push_back(s.substr(from));
        return out;
    }

    static std::string describe(const target& t) {
        const std::string& h = !t.host.empty() ? t.host : t.hostaddr;
        return (h.empty() ? std::string("the default host") : h) + ":" +
               (t.port.empty() ? std::string("default port") : t.port);
    }

    // Parses `conninfo` (PQconninfoParse: keywords or a URI) into the hosts to try, one by one;
    // empty hosts and `why` when it cannot be parsed. What the string leaves out, libpq takes
    // from the environment (PGHOST, ...), as it would.
    static target_list targets_of(const std::string& conninfo, std::string& why) {
        target_list t;
        // A bare word is a database name, as libpq reads a dbname that is not a conninfo.
        const bool bare = !conninfo.empty() && conninfo.find('=') == std::string::npos &&
                          conninfo.rfind("postgres://", 0) != 0 &&
                          conninfo.rfind("postgresql://", 0) != 0;
        char* err = nullptr;
        PQconninfoOption* parsed = PQconninfoParse(bare ? "" : conninfo.c_str(), &err);
        if (parsed == nullptr) {
            why = err != nullptr ? err : "out of memory";
            while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
            if (err != nullptr) PQfreemem(err);
            return t;
        }
        // TCP keepalives (not queries) let an idle connection notice a dead server; the
        // caller's settings come after these, so that they win.
        t.keys = {"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                  "fallback_application_name"};
        t.values = {"1", "10", "5", "3", "delayq"};
        std::string host, hostaddr, port, timeout, balance;
        for (const PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
            if (o->val == nullptr) continue;
            const std::string_view k = o->keyword;
            if (k == "host") {
                host = o->val;
            } else if (k == "hostaddr") {
                hostaddr = o->val;
            } else if (k == "port") {
                port = o->val;
            } else {
                if (k == "connect_timeout") timeout = o->val;
                if (k == "load_balance_hosts") balance = o->val;
                t.keys.emplace_back(o->keyword);
                t.values.emplace_back(o->val);
            }
        }
        PQconninfoFree(parsed);
        if (bare) {
            t.keys.emplace_back("dbname");
            t.values.push_back(conninfo);
        }
        const auto env = [](std::string& v, const char* name) {
            // As libpq reads them, on the caller's thread: safe unless the program sets the
            // environment while it connects, which libpq's own getenv() would not survive either.
            const char* e = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
            if (v.empty() && e != nullptr) v = e;
        };
        env(host, "PGHOST");
        env(hostaddr, "PGHOSTADDR");
        env(port, "PGPORT");
        env(timeout, "PGCONNECT_TIMEOUT");
        if (const int s = std::atoi(timeout.c_str()); s > 0)
            t.per_host = std::chrono::seconds(std::max(s, 2));  // libpq's minimum: 2 s
        const auto hosts = split(host), addrs = split(hostaddr), ports = split(port);
        const std::size_t n = std::max<std::size_t>({hosts.size(), addrs.size(), 1});
        if ((!hosts.empty() && !addrs.empty() && hosts.size() != addrs.size()) ||
            (ports.size() > 1 && ports.size() != n)) {
            t.hosts.push_back({host, hostaddr, port});  // libpq names what does not match
            return t;
        }
        for (std::size_t i = 0; i < n; ++i)
            t.hosts.push_back({hosts.empty() ? "" : hosts[i], addrs.empty() ? "" : addrs[i],
                               ports.empty() ? "" : ports[ports.size() == 1 ? 0 : i]});
        t.shuffled = balance == "random";
        if (t.shuffled)
            std::shuffle(t.hosts.begin(), t.hosts.end(), std::mt19937(std::random_device{}()));
        return t;
    }

    // Connects to host `i` of `t` by `until`: true, or false with `failed` saying why.
    bool try_connect(const target_list& t, std::size_t i, clock::time_point until,
                     std::string& failed) {
        const auto start = clock::now();
        std::vector<const char*> keys, values;
        for (std::size_t k = 0; k < t.keys.size(); ++k) {
            keys.push_back(t.keys[k].c_str());
            values.push_back(t.values[k].c_str());
        }
        const target& h = t.hosts[i];
        const std::pair<const char*, const std::string*> where[] = {
            {"host", &h.host}, {"hostaddr", &h.hostaddr}, {"port", &h.port}};
        for (const auto& [k, v] : where)
            if (!v->empty()) {
                keys.push_back(k);
                values.push_back(v->c_str());
            }
        keys.push_back(nullptr);
        values.push_back(nullptr);
        conn_.reset(PQconnectStartParams(keys.data(), values.data(), 0));
        if (!conn_) {
            failed = "out of memory";
            return false;
        }
        for (auto st = PGRES_POLLING_WRITING;;) {
            if (PQstatus(conn_.get()) == CONNECTION_BAD || st == PGRES_POLLING_FAILED) {
                failed = message();
                conn_.reset();
                return false;
            }
            if (st == PGRES_POLLING_OK) return true;
            const int r = poll_until(st == PGRES_POLLING_READING ? POLLIN : POLLOUT, until);
            if (r == 0) {
                const auto ms =
                    std::chrono::round<std::chrono::milliseconds>(until - start).count();
                if (t.hosts.size() == 1 && until >= deadline_)
                    failed = "no answer from the server within io_timeout (" +
                             std::to_string(timeout_.count()) + " ms)";
                else
                    failed = "no answer within " + std::to_string(ms) + " ms (" +
                             (t.per_host.count() > 0 && until < deadline_
                                  ? "connect_timeout"
                                  : "its share of io_timeout, " + std::to_string(timeout_.count()) +
                                        " ms") +
                             ")";
                conn_.reset();
                return false;
            }
            if (r < 0) {
                failed = "poll: " + std::generic_category().message(errno);
                conn_.reset();
                return false;
            }
            st = PQconnectPoll(conn_.get());
        }
    }

    // The time the server's limit on a statement leaves before the call's deadline, for its
    // answer to come back (see "Fencing" above): a tenth of io_timeout, 1 to 250 ms.
    std::chrono::milliseconds guard() const noexcept {
        return std::clamp(timeout_ / 10, std::chrono::milliseconds(1),
                          std::chrono::milliseconds(250));
    }

    // Makes sure that the server's own limit on the next statement (statement_timeout) ends at
    // least guard() before the deadline, so that the server gives up on the statement before
    // the client does; refuses to send anything when too little time is left. Sets the limit
    // (one round trip) only when the one in force does not fit: on a connection's first use, and
    // after a call waited for the pool.
    void fence(const char* doing) {
        using std::chrono::milliseconds;
        const auto left = std::chrono::floor<milliseconds>(deadline_ - clock::now());
        const auto g = guard();
        if (left <= 2 * g)
            raise(problem::connection,
                  std::string(doing) + ": no time left within io_timeout (" +
                      std::to_string(timeout_.count()) + " ms) to send the statement",
                  "");
        if (fence_.count() > 0 && fence_ <= left - g && fence_ >= left - 3 * g) return;
        const auto limit = left - 2 * g;
        fence_ = milliseconds::zero();  // unknown until the server said yes
        const std::string sql = "SET statement_timeout = " + std::to_string(limit.count());
        if (!PQsendQuery(conn_.get(), sql.c_str())) lost(doing);
        finish(deadline_, doing);
        fence_ = limit;
    }

    [[noreturn]] void fail_connect() {
        broken_ = true;
        raise(problem::connection, std::string("cannot connect: ") + message(), "");
        __builtin_unreachable();
    }
    [[noreturn]] void lost(const char* doing) {
        broken_ = true;
        raise(problem::connection, std::string(doing) + ": the connection failed: " + message(),
              "");
        __builtin_unreachable();
    }
    std::string message() const {
        std::string m = PQerrorMessage(conn_.get());
        while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
        return m.empty() ? "unknown error" : m;
    }

    // Waits for the socket to be ready for `events` until `deadline`: 1 ready, 0 the deadline
    // passed, -1 poll failed. At the deadline it looks once more without waiting: an answer that
    // is there counts.
    int poll_until(short events, clock::time_point deadline) {
        for (;;) {
            const auto now = clock::now();
            const long long ms =
                now >= deadline
                    ? 0
                    : std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
            pollfd fd{PQsocket(conn_.get()), events, 0};
            const int r = ::poll(&fd, 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
            if (r > 0) return 1;
            if (r < 0 && errno != EINTR) return -1;
            if (r == 0 && ms == 0) return 0;
        }
    }

    // Waits for the socket to be ready for `events`, or throws at `deadline`.
    void wait_socket(short events, clock::time_point deadline, const char* doing) {
        const int r = poll_until(events, deadline);
        if (r < 0) lost(doing);
        if (r == 0) {
            broken_ = true;
            raise(problem::connection,
                  std::string(doing) + ": no answer from the server within io_timeout (" +
                      std::to_string(timeout_.count()) + " ms)",
                  "");
        }
    }

    // Sends what is buffered, or throws at `deadline`.
    void flush(clock::time_point deadline, const char* doing) {
        for (;;) {
            const int f = PQflush(conn_.get());
            if (f == 0) return;
            if (f < 0) lost(doing);
            wait_socket(POLLOUT | POLLIN, deadline, doing);
            if (PQconsumeInput(conn_.get()) == 0) lost(doing);
        }
    }

    // What the server answered to one statement: its last result, and its error if it failed.
    struct answer {
        result last;
        std::string err, state;
    };

    // Reads every result of the next statement (and, in pipeline mode, its sync point), or throws
    // at `deadline`.
    answer read_answer(clock::time_point deadline, const char* doing, bool pipelined) {
        answer a;
        for (;;) {
            while (PQisBusy(conn_.get())) {
                wait_socket(POLLIN, deadline, doing);
                if (PQconsumeInput(conn_.get()) == 0) lost(doing);
            }
            PGresult* r = PQgetResult(conn_.get());
            if (r == nullptr) break;
            const auto st = PQresultStatus(r);
            if (st == PGRES_FATAL_ERROR && a.err.empty()) {
                const char* s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
                const char* m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
                a.state = s ? s : "";
                a.err = m ? m : PQresultErrorMessage(r);
            }
            a.last = result(r);
        }
#ifdef LIBPQ_HAS_PIPELINING
        if (pipelined) {
            while (PQisBusy(conn_.get())) {
                wait_socket(POLLIN, deadline, doing);
                if (PQconsumeInput(conn_.get()) == 0) lost(doing);
            }
            const result sync(PQgetResult(conn_.get()));
            if (PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC &&
                PQstatus(conn_.get()) == CONNECTION_OK) {
                broken_ = true;
                raise(problem::connection,
                      std::string(doing) + ": the server's answers are out of step", "");
            }
        }
#else
        (void)pipelined;
#endif
        return a;
    }

    // Throws the error of `a`, or the connection's if it broke.
    void check(const answer& a, const char* doing) {
        if (PQstatus(conn_.get()) != CONNECTION_OK) {
            broken_ = true;
            raise(problem::connection,
                  std::string(doing) +
                      ": the connection failed: " + (a.err.empty() ? message() : a.err),
                  a.state);
        }
        if (a.state == "57014")  // query_canceled: by the fence, or by an operator
            raise(problem::connection,
                  std::string(doing) + ": " + a.err + " (SQLSTATE 57014): the server stopped " +
                      "the statement before the call's deadline (io_timeout " +
                      std::to_string(timeout_.count()) + " ms)",
                  a.state);
        if (!a.err.empty()) {
            const problem p = classify(a.state);
            if (p == problem::connection) broken_ = true;
            raise(p, std::string(doing) + ": " + a.err + " (SQLSTATE " + a.state + ")", a.state);
        }
    }

    // Sends what is buffered and reads every result of the statement sent; throws on an error
    // result (after reading the rest, so the connection stays usable) or at `deadline`.
    result finish(clock::time_point deadline, const char* doing) {
        flush(deadline, doing);
        answer a = read_answer(deadline, doing, false);
        check(a, doing);
        return std::move(a.last);
    }

    std::chrono::milliseconds timeout_;
    clock::time_point deadline_;  // the current call's (set_deadline)
    std::unique_ptr<PGconn, conn_deleter> conn_;
    bool broken_ = false;
    bool goodbye_ = false;                // the server said FATAL while idle
    std::chrono::milliseconds fence_{0};  // statement_timeout in force; 0: unknown
};

}  // namespace delayq::postgres::detail
