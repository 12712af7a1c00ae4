// One libpq connection for delayq::postgres, with a time limit on every exchange, and the binary
// encoding of the statements' parameters and results. Part of <delayq/postgres/delay_queue.hpp>.
//
// Time limits. libpq's blocking calls wait as long as the server or the network takes; a queue
// call must return or fail within options::io_timeout whatever the server does. So a connection
// is made with PQconnectStartParams/PQconnectPoll and every statement is sent in nonblocking mode
// and answered through poll(2) on the socket, with one deadline for the whole exchange. A
// connection that misses its deadline, or breaks, is marked broken and never used again: what it
// sent may or may not have been applied, which the queue's calls are written to tolerate (a put is
// idempotent by id, a lease token fences a stale holder).
//
// Binary format. Parameters and results travel in PostgreSQL's binary format: bytea is sent and
// received as is (no escaping, payloads are binary-safe and cost no hex step), integers are
// big-endian. The parameter types are given to PQprepare, so the binary layouts always match.
//
// Errors go through the raise function that the public header supplies (detail headers never
// include public ones): it turns a problem into the typed exception of the backend's family.
#pragma once

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace delayq::postgres::detail {

/// What went wrong, as the error family names it.
enum class problem { other, connection, schema_version, permission, server_version };

/// Throws the exception for `p`; never returns. `sqlstate` is the server's SQLSTATE, or empty.
using raise_fn = void (*)(problem p, const std::string& message, const std::string& sqlstate);

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
    /// environment) within `timeout`.
    connection(const std::string& conninfo, std::chrono::milliseconds timeout, raise_fn raise)
        : raise_(raise), timeout_(timeout) {
        const auto deadline = clock::now() + timeout;
        // TCP keepalives (not queries) let an idle connection notice a dead server; the
        // caller's conninfo comes last, so that its settings win.
        const char* keys[] = {"keepalives",
                              "keepalives_idle",
                              "keepalives_interval",
                              "keepalives_count",
                              "fallback_application_name",
                              "dbname",
                              nullptr};
        const char* values[] = {"1", "10", "5", "3", "delayq", conninfo.c_str(), nullptr};
        conn_.reset(PQconnectStartParams(keys, values, 1));
        if (!conn_) raise_(problem::connection, "cannot connect: out of memory", "");
        if (PQstatus(conn_.get()) == CONNECTION_BAD) fail_connect();
        for (auto st = PGRES_POLLING_WRITING;;) {
            if (st == PGRES_POLLING_OK) break;
            if (st == PGRES_POLLING_FAILED) fail_connect();
            wait_socket(st == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline, "connecting");
            st = PQconnectPoll(conn_.get());
        }
        if (PQsetnonblocking(conn_.get(), 1) != 0) fail_connect();
        // The server's notices (CREATE ... IF NOT EXISTS skipping) are not the caller's business;
        // libpq would print them on stderr.
        PQsetNoticeProcessor(
            conn_.get(), [](void*, const char*) {}, nullptr);
    }

    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    PGconn* get() const noexcept { return conn_.get(); }
    /// Whether the connection broke or missed a deadline: it is never used again.
    bool broken() const noexcept { return broken_ || PQstatus(conn_.get()) != CONNECTION_OK; }
    int server_version() const noexcept { return PQserverVersion(conn_.get()); }

    /// Whether an idle connection still looks usable: a server that went away (restarted,
    /// terminated the backend) has written its last words on it or closed it, which one poll with
    /// no wait shows. Costs no round trip. `listening`: notifications may arrive, and stay
    /// queued for wait_notification(); otherwise anything that came while idle means the end.
    bool alive(bool listening = false) {
        if (broken()) return false;
        pollfd fd{PQsocket(conn_.get()), POLLIN, 0};
        if (::poll(&fd, 1, 0) <= 0) return true;  // nothing to read: as it was
        if (!listening || PQconsumeInput(conn_.get()) == 0) broken_ = true;
        return !broken();
    }

    /// Prepares `sql` as statement `name` with the parameter types of `p`.
    void prepare(const char* name, const std::string& sql, const std::vector<Oid>& types) {
        const auto deadline = clock::now() + timeout_;
        if (!PQsendPrepare(conn_.get(), name, sql.c_str(), static_cast<int>(types.size()),
                           types.data()))
            lost("sending a statement");
        finish(deadline, "preparing a statement");
    }

    /// Runs the prepared statement `name` with `p`; binary results.
    result exec(const char* name, const params& p, const char* doing) {
        const auto deadline = clock::now() + timeout_;
        const auto v = p.pointers();
        if (!PQsendQueryPrepared(conn_.get(), name, p.count(), v.values.data(), v.lengths.data(),
                                 v.formats.data(), 1))
            lost(doing);
        return finish(deadline, doing);
    }

    /// Runs the prepared statement `first` with `p1`, then `second` with `p2`, each in a
    /// transaction of its own, in one round trip (libpq's pipeline mode; two round trips with a
    /// libpq older than 14): `second` starts after `first` committed, whether `first` failed or
    /// not. Returns both results; throws `first`'s error, else `second`'s.
    std::pair<result, result> exec_then(const char* first, const params& p1, const char* second,
                                        const params& p2, const char* doing) {
#ifdef LIBPQ_HAS_PIPELINING
        const auto deadline = clock::now() + timeout_;
        const auto v1 = p1.pointers();
        const auto v2 = p2.pointers();
        PGconn* c = conn_.get();
        if (!PQenterPipelineMode(c) ||
            !PQsendQueryPrepared(c, first, p1.count(), v1.values.data(), v1.lengths.data(),
                                 v1.formats.data(), 1) ||
            !PQpipelineSync(c) ||
            !PQsendQueryPrepared(c, second, p2.count(), v2.values.data(), v2.lengths.data(),
                                 v2.formats.data(), 1) ||
            !PQpipelineSync(c))
            lost(doing);
        flush(deadline, doing);
        answer a1 = read_answer(deadline, doing, true);
        answer a2 = read_answer(deadline, doing, true);
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

    /// Runs `sql` (one or more statements, no parameters: the simple protocol).
    result exec_simple(const std::string& sql, const char* doing) {
        const auto deadline = clock::now() + timeout_;
        if (!PQsendQuery(conn_.get(), sql.c_str())) lost(doing);
        return finish(deadline, doing);
    }

    /// Waits until a notification arrives (true) or `until` passes (false). Throws when the
    /// connection breaks.
    bool wait_notification(clock::time_point until) {
        for (;;) {
            if (PQconsumeInput(conn_.get()) == 0) lost("waiting for a notification");
            bool got = false;
            while (PGnotify* n = PQnotifies(conn_.get())) {
                PQfreemem(n);
                got = true;
            }
            if (got) return true;
            const auto now = clock::now();
            if (now >= until) return false;
            pollfd fd{PQsocket(conn_.get()), POLLIN, 0};
            const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
            const int r = ::poll(&fd, 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
            if (r < 0 && errno != EINTR) lost("waiting for a notification");
        }
    }

  private:
    struct conn_deleter {
        void operator()(PGconn* c) const noexcept { PQfinish(c); }
    };

    [[noreturn]] void fail_connect() {
        broken_ = true;
        raise_(problem::connection, std::string("cannot connect: ") + message(), "");
        __builtin_unreachable();
    }
    [[noreturn]] void lost(const char* doing) {
        broken_ = true;
        raise_(problem::connection, std::string(doing) + ": the connection failed: " + message(),
               "");
        __builtin_unreachable();
    }
    std::string message() const {
        std::string m = PQerrorMessage(conn_.get());
        while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
        return m.empty() ? "unknown error" : m;
    }

    // Waits for the socket to be ready for `events`, or throws at `deadline`.
    void wait_socket(short events, clock::time_point deadline, const char* doing) {
        for (;;) {
            const auto now = clock::now();
            if (now >= deadline) {
                broken_ = true;
                raise_(problem::connection,
                       std::string(doing) + ": no answer from the server within io_timeout (" +
                           std::to_string(timeout_.count()) + " ms)",
                       "");
            }
            pollfd fd{PQsocket(conn_.get()), events, 0};
            const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
            const int r = ::poll(&fd, 1, static_cast<int>(ms));
            if (r > 0) return;
            if (r < 0 && errno != EINTR) lost(doing);
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
                raise_(problem::connection,
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
            raise_(problem::connection,
                   std::string(doing) +
                       ": the connection failed: " + (a.err.empty() ? message() : a.err),
                   a.state);
        }
        if (!a.err.empty()) {
            const problem p = classify(a.state);
            if (p == problem::connection) broken_ = true;
            raise_(p, std::string(doing) + ": " + a.err + " (SQLSTATE " + a.state + ")", a.state);
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

    raise_fn raise_;
    std::chrono::milliseconds timeout_;
    std::unique_ptr<PGconn, conn_deleter> conn_;
    bool broken_ = false;
};

}  // namespace delayq::postgres::detail
