// The Redis backend's wire: one hiredis connection, the link that every thread and every queue
// object of a process shares to one server, and the subscription that waiting consumers listen
// on. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. A round trip on loopback costs the server a read, a write and an event-loop turn, and
// the client a write, a read and a context switch; the Lua work of one job is smaller than that.
// So the calls that a process makes to one server go over one connection, and whatever is sent at
// about the same time travels together (StackExchange.Redis's multiplexer and ioredis's
// auto-pipelining do the same). Writing and reading are two roles, each held by one thread at a
// time. A call handed in while nobody writes is written at once by its own thread, with every call
// handed in meanwhile, in one write: no call waits for the replies of others before it is sent, so
// the server and the client are not idle in turn. One thread, the reader, reads the replies in
// order and hands each to its thread as soon as it is in, until its own is answered, and then
// hands the role on. A thread alone pays one round trip, as before; eight threads pay about one
// write and one read per batch instead of one each. Nothing here blocks on the server: a blocked
// command would hold up everybody behind it, so waiting for work is done on a connection of its
// own (the subscriber below).
//
// One link per server and user, not per queue object (shared_link()): a user who gives each
// thread its own queue object, as many do, gets the batching that one shared object gets. Objects
// of different users (or passwords) never share one; a child process after fork() never uses its
// parent's (it would interleave its commands with the parent's on one socket). The link lives as
// long as its last user, whatever order the objects go in.
//
// Time. Every call has its own deadline, its io_timeout after it began (a budget, below), and
// returns or fails by then, plus at most one connect, whoever else uses the link and however the
// server behaves: the reader waits for the next reply only until the earliest deadline of the
// calls in flight, and a call whose deadline passes gives up by itself wherever it is (still to
// be written: it was not sent, and never will be). A connect is made by the thread of the most
// patient call that waits for it, within that call's time: the others wait for it each until its
// own deadline, not another's. A call that ran out of time is given up alone: its reply, when it
// comes, is read and dropped, and the calls of other threads and objects behind it go on (an object
// with a short io_timeout does not fail the calls of one with a long one). Once no call is left
// waiting on the connection, one that timed out is closed, so that the next call starts on a fresh
// one. An error says how long the call really waited: "timed out after 1002 ms (io_timeout 1000
// ms)".
//
// Failures. A hiredis context is unusable after any I/O error, so the link drops it, every call in
// flight on it fails, and the next call connects afresh. An error says which command failed and
// why. A failure to connect, or a call given up before it was written, is `unsent_error`: nothing
// reached the server, so the caller may retry it elsewhere (the cluster router does, after a
// failover); any later failure leaves it unknown whether the command ran, which only the caller
// can judge. A link that timed out or failed is `suspect()` until a reply comes in again: the
// router then reloads the cluster's slot map before it sends there (cluster.hpp).
//
// The subscriber. Consumers wait for work with SUBSCRIBE on the queue's channel, to which every
// script that makes the next due time earlier publishes that time. A subscribed connection is not
// a blocked one: the client waits on the socket with poll() and its own timeout, at the due time
// it knows, to the millisecond, not at the server's next cron tick (blocking commands' timeouts
// are handled in the cron, every 100 ms by default). Each queue object has its own.
#pragma once

#if __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
#else
#include <hiredis.h>  // hiredis 1.0's pkg-config file points inside include/hiredis
#endif
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../detail/job_queue/handoff.hpp"
#include "../../detail/time.hpp"
#include "../types.hpp"
#include "failure.hpp"
#include "shared_in_process.hpp"

namespace delayq::redis::detail {

using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;
using command = std::span<const std::string_view>;  // one command's arguments

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

inline timeval to_timeval(milliseconds d) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(d.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((d.count() % 1000) * 1000);
    return tv;
}

inline std::string_view text_of(const redisReply* r) noexcept {
    return r->str != nullptr ? std::string_view(r->str, r->len) : std::string_view();
}

inline bool error_starts_with(const redisReply* r, std::string_view prefix) {
    return r->type == REDIS_REPLY_ERROR && text_of(r).substr(0, prefix.size()) == prefix;
}

// "EVALSHA", or "SCRIPT LOAD" for the commands with subcommands: what an error message names.
inline std::string name_of(command args) {
    std::string n(args.empty() ? std::string_view("command") : args[0]);
    if (args.size() > 1 && (n == "SCRIPT" || n == "CLIENT" || n == "CLUSTER"))
        n.append(" ").append(args[1]);
    return n;
}

// Where to connect, and as whom: the credentials travel with the address, so that every
// connection (the links, the subscriber, a reconnect, every node of a cluster) logs in the same
// way, and connections of different users are never shared.
struct endpoint {
    std::string host;
    int port = 0;
    std::string user, password;  // both empty: no AUTH
    bool operator==(const endpoint&) const = default;
    std::string str() const { return host + ":" + std::to_string(port); }  // never the password
};

// A call's time: when it began, and its deadline, io_timeout later. Every step of the call (a
// reload of the slot map, a wait for a failover, the round trip itself) spends from the one
// budget.
struct budget {
    steady::time_point start, deadline;
    milliseconds io_timeout;

    static budget from_now(milliseconds io_timeout) {
        const auto now = steady::now();
        return {now, delayq::detail::saturating_add(now, io_timeout), io_timeout};
    }
    // The milliseconds waited so far, rounded down.
    long long waited() const {
        return std::chrono::duration_cast<milliseconds>(steady::now() - start).count();
    }
    // " timed out after 1002 ms (io_timeout 1000 ms)": how long the call really waited.
    std::string timed_out() const {
        return " timed out after " + std::to_string(waited()) + " ms (io_timeout " +
               std::to_string(io_timeout.count()) + " ms)";
    }
};

// Milliseconds from now until `t`, rounded up, for poll(): 0 when it has passed.
inline int poll_ms(steady::time_point t) {
    const auto left = delayq::detail::saturating_between<milliseconds>(steady::now(), t);
    return static_cast<int>(std::clamp<long long>(left.count(), 0, 1'000'000'000));
}

// Waits until `fd` is ready for `events` or `until` passes; false when it passed. Throws the
// error of poll() itself.
inline bool await_fd(int fd, short events, steady::time_point until) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int n = ::poll(&p, 1, poll_ms(until));
        if (n > 0) return true;
        if (n == 0) {
            if (steady::now() >= until) return false;
            continue;  // woken a little early (poll rounds): wait out the rest
        }
        if (errno != EINTR) return true;  // the read or write that follows reports the error
    }
}

// One hiredis context, used by one thread at a time. Any I/O error leaves the context unusable:
// it marks itself broken and its owner throws it away. Reads and writes wait with poll() until a
// deadline the caller gives, not with a socket timeout, so that each call keeps its own.
class connection {
  public:
    // Connects and logs in within `io_timeout`.
    connection(const endpoint& at, milliseconds io_timeout)
        : connection(at, io_timeout, delayq::detail::saturating_add(steady::now(), io_timeout)) {}

    // Connects and logs in by `until` (a call's deadline: the connect and the login together);
    // `io_timeout` is what command_reply() gives each command later.
    connection(const endpoint& at, milliseconds io_timeout, steady::time_point until)
        : io_timeout_(io_timeout) {
        const milliseconds within =
            std::max(milliseconds(1),
                     delayq::detail::saturating_between<milliseconds>(steady::now(), until));
        ctx_ = redisConnectWithTimeout(at.host.c_str(), at.port, to_timeval(within));
        if (ctx_ == nullptr) throw io_failure("connecting to " + at.str(), ": out of memory", true);
        if (ctx_->err != 0) {
            const bool timed_out = ctx_->err == REDIS_ERR_IO && errno == EINPROGRESS;
            std::string why = timed_out ? " timed out after " + std::to_string(within.count()) +
                                              " ms (io_timeout)"
                                        : ": " + std::string(ctx_->errstr);
            redisFree(ctx_);
            throw io_failure("connecting to " + at.str(), std::move(why), true);
        }
        // A backstop only: every read and write below waits with poll() until its deadline.
        redisSetTimeout(ctx_, to_timeval(io_timeout));
        redisEnableKeepAlive(ctx_);
        if (!at.user.empty() || !at.password.empty()) {
            try {
                login(at, until);
            } catch (...) {
                redisFree(ctx_);
                throw;
            }
        }
    }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;
    ~connection() { redisFree(ctx_); }

    bool broken() const noexcept { return broken_; }
    int fd() const noexcept { return ctx_->fd; }

    // Throws the last I/O failure, for `what` (a command's name); the connection is broken now.
    [[noreturn]] void fail(const std::string& what) {
        broken_ = true;
        throw io_failure(
            what,
            ": " + (ctx_->err != 0 ? std::string(ctx_->errstr) : std::string("connection lost")),
            false);
    }

    // Appends a command to `out`, in RESP (an array of bulk strings): no allocation once the
    // buffer has grown.
    static void append(std::string& out, command args) {
        out += '*';
        out += std::to_string(args.size());
        out += "\r\n";
        for (std::string_view a : args) {
            out += '$';
            out += std::to_string(a.size());
            out += "\r\n";
            out += a;
            out += "\r\n";
        }
    }

    // Queues a command straight into the buffer that flush() sends.
    void append(command args) { append(out_, args); }

    // What send_all() sent of a buffer, and why it stopped (0: it sent it all; ETIMEDOUT: `until`
    // passed; else errno).
    struct sent {
        std::size_t bytes = 0;
        int error = 0;
    };

    // Sends `buf` by `until`. With send(MSG_NOSIGNAL), not hiredis's write(): a write into a
    // connection the server has closed is then an error here, not SIGPIPE, whose default action
    // ends the process (a node killed while a call is being written). Touches nothing of the
    // connection but its socket, so one thread may send while another reads.
    sent send_all(std::string_view buf, steady::time_point until) const noexcept {
        sent s;
        while (s.bytes < buf.size()) {
            const ssize_t n = ::send(ctx_->fd, buf.data() + s.bytes, buf.size() - s.bytes,
                                     MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                s.bytes += static_cast<std::size_t>(n);
                continue;
            }
            const int e = n < 0 ? errno : EPIPE;
            if (e == EINTR) continue;
            if (e == EAGAIN || e == EWOULDBLOCK) {
                if (await_fd(ctx_->fd, POLLOUT, until)) continue;
                s.error = ETIMEDOUT;
            } else {
                s.error = e;
            }
            return s;
        }
        return s;
    }

    // Ends the connection for both directions: a thread blocked on it wakes up to an error.
    void shut() const noexcept { ::shutdown(ctx_->fd, SHUT_RDWR); }

    // Drops what append() queued and flush() has not sent.
    void discard() noexcept { out_.clear(); }

    // Sends what append() queued, by `until` (see send_all()). A failure is unsent() when not a
    // byte of it went out; the connection is broken then. A timeout says how long the call of `b`
    // waited (or, without one, the connection's io_timeout).
    void flush(std::string_view what, steady::time_point until, const budget* b = nullptr) {
        const sent s = send_all(out_, until);
        if (s.error != 0) {
            out_.clear();
            broken_ = true;
            throw io_failure(std::string(what),
                             s.error != ETIMEDOUT ? ": " + std::generic_category().message(s.error)
                             : b != nullptr       ? b->timed_out()
                                                  : timed_out(),
                             s.bytes == 0);
        }
        if (out_.capacity() > (std::size_t{1} << 20)) {
            std::string().swap(out_);  // a large payload's room is not kept
        } else {
            out_.clear();
        }
    }

    // The next reply, waiting for it until `until`; null when that passed first. An error reply
    // is returned, not thrown; an I/O error is thrown (for `what`).
    reply_ptr read(std::string_view what, steady::time_point until) {
        for (;;) {
            void* r = nullptr;
            if (redisGetReplyFromReader(ctx_, &r) != REDIS_OK) fail(std::string(what));
            if (r != nullptr) return checked(r);
            if (!await_fd(ctx_->fd, POLLIN, until)) return nullptr;
            if (redisBufferRead(ctx_) != REDIS_OK) fail(std::string(what));
        }
    }

    // A reply already received, without touching the socket; null if none is complete yet.
    reply_ptr buffered() {
        void* r = nullptr;
        if (redisGetReplyFromReader(ctx_, &r) != REDIS_OK) fail("reading a message");
        return r != nullptr ? checked(r) : nullptr;
    }

    // Reads what the socket holds (call after poll() said it is readable).
    void fill() {
        if (redisBufferRead(ctx_) != REDIS_OK) fail("reading a message");
    }

    // One command and its reply, within the connection's io_timeout.
    reply_ptr command_reply(command args) {
        return command_reply(args, delayq::detail::saturating_add(steady::now(), io_timeout_));
    }

    // One command and its reply, by `until`.
    reply_ptr command_reply(command args, steady::time_point until) {
        const std::string what = name_of(args);
        append(args);
        flush(what, until);
        reply_ptr r = read(what, until);
        if (r == nullptr) {
            broken_ = true;
            throw io_failure(what, timed_out(), false);
        }
        return r;
    }

  private:
    // AUTH [user] password, before anything else: with ACLs, every other command needs it. A
    // refusal is unsent_error-like: none of the caller's commands reached the server.
    void login(const endpoint& at, steady::time_point until) {
        std::array<std::string_view, 3> args{"AUTH", at.user, at.password};
        command cmd(args);
        if (at.user.empty()) {  // the `default` user, or a server with requirepass
            args[1] = at.password;
            cmd = cmd.first(2);
        }
        reply_ptr r;
        try {
            r = command_reply(cmd, until);
        } catch (const io_failure& e) {
            throw io_failure("logging in to " + at.str(), e.why(), true);
        }
        if (r->type == REDIS_REPLY_ERROR)
            throw io_failure("logging in to " + at.str(),
                             ": AUTH" +
                                 (at.user.empty() ? std::string() : " as '" + at.user + "'") +
                                 " refused: " + std::string(text_of(r.get())),
                             true);
    }

    std::string timed_out() const {
        return " timed out after " + std::to_string(io_timeout_.count()) + " ms (io_timeout)";
    }

    reply_ptr checked(void* r) {
        reply_ptr reply(static_cast<redisReply*>(r));
        // The server closes the connection right after a protocol error (e.g. a payload beyond
        // proto-max-bulk-len): do not use it again.
        if (error_starts_with(reply.get(), "ERR Protocol error")) broken_ = true;
        return reply;
    }

    redisContext* ctx_ = nullptr;
    milliseconds io_timeout_;
    bool broken_ = false;
    std::string out_;  // commands queued by append(), not yet sent; one thread at a time
};

// How a call of the link learns its fate (delayq/detail/job_queue/handoff.hpp): a thread that does
// the I/O says the call is done, that it reads now (`lead`), or that it writes now (`write`: the
// writer's role, handed to it; taken by the wait that sees it, so that the next wait waits for the
// next signal). The link signals only under its own lock, while the call is still its (link, R1):
// so the call is alive.
struct link_states {
    enum state : int { waiting, done, lead, write };
};
struct link_waiter : link_states,
                     delayq::detail::job_queue::handoff<link_states::state, link_states::write> {};

// One server's connection, shared by every thread of every queue object of the process that
// talks to that server as one user; see "The idea" and "Time" above. Two roles, each held by one
// thread at a time. The writer: a thread that hands in a call while nobody writes sends it at
// once, with every call handed in meanwhile, and goes on while more come (flat combining: no call
// waits for a reply before it is sent), for as long as its own call waits: once it is answered or
// out of time, or the reader's role waits for this thread, it hands the role to the oldest call
// handed in (each holder writes one batch at least, so that the calls handed in go out however
// late the threads wake). The reader: a thread whose call is in flight reads the replies in order
// and hands each to its call, until its own is answered; then it hands the role to the owner of the
// oldest call still in flight, so that no caller serves the others for longer than its own call
// takes. The connection is made by the writer, within the time of the most patient call handed in
// (whose thread gets the role to do it; the others wait, each until its own deadline), and dropped
// (every call in flight failed) by the reader once the writer has let go of it, or by the writer
// when nobody reads.
//
// Why no role is lost and no request is touched after its thread returned. Every field is under
// m_ unless it says otherwise; every signal() is made under m_.
//
// R1, a request: it lives on its caller's stack and is in exactly one place: handed_in_ (not
//     written), batch_ (in the writer's hand, between two sections of the writer: its thread,
//     timing out, finds it in neither list and looks again a moment later, so the writer may read
//     its commands without m_; back to handed_in_ if the connection broke meanwhile), in_flight_
//     (a non-null entry), or answered. Answering takes it
//     out of its list in the same section, and it is never put back. Other threads touch a
//     request only while it is the link's (not answered), under m_ (the writer its batch_ aside).
//     Its thread returns only once it is answered and it saw so: from signal(done), or in
//     read_until_answered(). A request signalled `lead` (the reader's role on its way, chosen_)
//     is never signalled `done` after (answer() leaves it be), so its thread always comes to
//     read_until_answered() and takes the role or passes it on there, whatever befell its call.
// R2, the reader's role: reading_ is true while a thread holds it or it is on its way to chosen_
//     (signalled in the section that chose it). A non-null entry of in_flight_ implies reading_:
//     the writer chooses a reader in the section that puts a batch in flight when there is none;
//     the reader hands the role to the oldest call in flight and lets go of it only when none is
//     left. The role is let go of only with the connection sound (R4).
// R3, the writer's role: writing_ is true while a thread holds it or it is on its way to
//     write_chosen_ (a request in handed_in_, signalled `write`; nothing but its own thread takes
//     it out of handed_in_ meanwhile, and its thread, timing out, takes the role first). A call
//     handed in takes the role when nobody has it and the connection is not broken_; else it is
//     written by the holder (who writes until handed_in_ is empty, or hands the role to a call
//     handed in), or it is handed the role by whoever drops the broken connection.
// R4, the connection: conn_ is set by the writer, only when there is none (then no call is in
//     flight, R5, so nobody reads), and nulled by the reader in drop() once the writer let go of
//     it, or by the writer while nobody reads: so the writer may send on it, and the reader read
//     it, without m_. broken_ (it is dead or out of step) implies conn_: nothing more is written on
//     it, the writer lets go of its role while there is a reader, and whoever has the reader's role
//     drops it before letting go (its read fails: shut() wakes it; or it finds broken_ when its own
//     call is answered; the last look and the letting go are one section). With no reader, the
//     writer drops it.
// R5: conn_ == nullptr implies in_flight_ is empty (both are cleared together).
class link {
  public:
    // `io_timeout`: the budget of the calls that bring none.
    explicit link(endpoint at, milliseconds io_timeout = std::chrono::seconds(5))
        : at_(std::move(at)), io_timeout_(io_timeout), generation_(fork_generation()) {}
    link(const link&) = delete;
    link& operator=(const link&) = delete;

    const endpoint& where() const noexcept { return at_; }

    // A call on it timed out, or it failed, and no reply has come in since.
    bool suspect() const noexcept { return suspect_.load(std::memory_order_relaxed); }

    // Sends `cmds` back to back (with other threads' commands around them, never between them)
    // and returns their replies in order, by b.deadline (plus one connect). Throws unsent_error
    // when nothing was sent (no connection, or the deadline passed before the call was written),
    // error when it fails after that.
    std::vector<reply_ptr> call(std::span<const command> cmds, const budget& b) {
        request r;
        r.cmds = cmds;
        r.b = b;
        bool write = false;
        {
            std::lock_guard lk(m_);
            if (generation_ != fork_generation()) forget_the_parent();
            handed_in_.push_back(&r);
            if (!writing_ && !broken_) write = writing_ = true;
        }
        if (write) write_all(r);
        if (wait(r) == link_waiter::lead) read_until_answered(r);
        if (!r.failure.empty()) {
            const std::string msg = "delayq::redis: " + name_of(cmds.front()) + r.failure;
            if (r.unsent) throw unsent_error(msg);
            throw connection_error(msg);
        }
        return std::move(r.replies);
    }

    std::vector<reply_ptr> call(std::span<const command> cmds) {
        return call(cmds, budget::from_now(io_timeout_));
    }
    reply_ptr call(command c, const budget& b) {
        return std::move(call(std::span<const command>(&c, 1), b).front());
    }
    reply_ptr call(command c) { return call(c, budget::from_now(io_timeout_)); }

  private:
    struct request : link_waiter {
        std::span<const command> cmds;
        budget b;
        std::vector<reply_ptr> replies;  // under m_ while in flight
        std::string failure;             // the end of the error message; empty: it went through
        bool unsent = false;
        bool answered = false;  // under m_
    };
    // A request written, and how many of its replies are still to come. Its caller may have
    // given up on it (r == nullptr): its replies are read and dropped.
    struct in_flight {
        request* r;
        std::size_t left;
    };
    // Timed-out calls whose replies are still owed: beyond this many, the connection is dropped.
    static constexpr std::size_t most_owed = 4096;

    // How a call waits: for its answer, for the reader's role, or for the writer's (which it
    // takes, and then waits again). If its deadline passes first, it gives up by itself wherever
    // it is (handed in: it was not sent; in flight: its reply will be dropped), unless a role is
    // on its way to it (it takes the role); only while a writer has it in hand (between two of
    // the writer's sections, microseconds) does it look again a moment later.
    link_waiter::state wait(request& r) noexcept {
        for (auto until = r.b.deadline;;) {
            const link_waiter::state s = r.await_until(until);
            if (s == link_waiter::write) {
                write_all(r);
                until = r.b.deadline;
                continue;
            }
            if (s != link_waiter::waiting) return s;
            until = steady::now() + milliseconds(1);
            std::lock_guard lk(m_);
            if (chosen_ == &r || write_chosen_ == &r) continue;  // signalled: the next wait sees it
            if (const auto it = std::find(handed_in_.begin(), handed_in_.end(), &r);
                it != handed_in_.end()) {
                handed_in_.erase(it);
                give_up(r, true);
                return link_waiter::done;
            }
            for (auto& f : in_flight_)
                if (f.r == &r) {
                    f.r = nullptr;
                    give_up(r, false);
                    return link_waiter::done;
                }
        }
    }

    // Under m_: `r` (taken out of its list) ran out of time, before it was written (unsent) or
    // after.
    void give_up(request& r, bool unsent) noexcept {
        suspect_.store(true, std::memory_order_relaxed);
        std::string why;
        try {
            why = unsent ? r.b.timed_out() + " before it could be sent to " + at_.str()
                         : " to " + at_.str() + r.b.timed_out();
        } catch (...) {
        }
        r.replies.clear();
        fail_one(r, why, unsent);
    }

    // Under m_: the calls handed in that ran out of time fail, unsent.
    void expire_handed_in() noexcept {
        const auto now = steady::now();
        std::size_t kept = 0;
        for (request* r : handed_in_) {
            if (r->b.deadline > now) {
                handed_in_[kept++] = r;
                continue;
            }
            give_up(*r, true);
        }
        handed_in_.resize(kept);
    }

    // Under m_, by the writer: the role goes to `to`, a call handed in (R3).
    void pass_writer_role(request& to) noexcept {
        write_chosen_ = &to;
        to.signal(link_waiter::write);
    }

    // The writer's role, taken by the caller of `me` (or handed to it): writes what is handed
    // in, batch after batch, while its own call waits for its reply (see the class comment).
    void write_all(request& me) noexcept {
        std::unique_lock lk(m_);
        if (write_chosen_ == &me) write_chosen_ = nullptr;
        bool wrote = false;  // every holder writes a batch at least: the calls handed in go out
        for (;;) {
            expire_handed_in();
            if (broken_ && !reading_) {  // nobody reads: no call is in flight on it (R2), the
                                         // writer drops it (R4)
                std::shared_ptr<connection> dead = std::move(conn_);
                conn_ = nullptr;
                in_flight_.clear();  // replies owed to calls that gave up: none will come
                broken_ = false;
                lk.unlock();
                dead.reset();
                lk.lock();
                continue;
            }
            if (handed_in_.empty() || broken_) {  // broken: the reader drops it (R4)
                writing_ = false;
                cv_.notify_all();
                return;
            }
            if (conn_ == nullptr) {
                if (!connect(lk, me)) return;  // the role went to a more patient call
                continue;
            }
            if (wrote && (me.answered || chosen_ == &me || me.b.deadline <= steady::now())) {
                pass_writer_role(*handed_in_.front());  // this thread's call is done, or it reads
                return;
            }
            wrote = true;
            batch_.swap(handed_in_);  // the two arrays trade places, each keeping its room
            const std::shared_ptr<connection> c = conn_;
            lk.unlock();
            write(*c);
            batch_.clear();
            lk.lock();
        }
    }

    // Under lk, by the writer, with no connection and calls handed in: the call with the latest
    // deadline connects, within its own time, by its own thread (the role goes there: false);
    // the others wait for it, each until its own deadline. A failure to connect fails the calls
    // handed in, unsent: all of them, or only those out of time when the connect timed out (the
    // most patient of those left then tries, in its own time).
    bool connect(std::unique_lock<std::mutex>& lk, request& me) noexcept {
        request* patient = &me;
        const bool mine = std::find(handed_in_.begin(), handed_in_.end(), &me) != handed_in_.end();
        for (request* r : handed_in_)
            if (!mine || r->b.deadline > patient->b.deadline) {
                patient = r;
                if (!mine) break;  // the first, then the latest below
            }
        for (request* r : handed_in_)
            if (r->b.deadline > patient->b.deadline) patient = r;
        if (patient != &me) {
            pass_writer_role(*patient);
            return false;
        }
        const steady::time_point until = me.b.deadline;
        lk.unlock();
        std::shared_ptr<connection> c;
        std::string why;
        try {
            why = ": cannot connect to " + at_.str();
            try {
                c = std::make_shared<connection>(at_, io_timeout_, until);
            } catch (const io_failure& e) {
                why += e.why();
            }
        } catch (...) {  // no memory for the connection or the message: still a failure
        }
        lk.lock();
        if (c != nullptr) {
            conn_ = std::move(c);
            return true;
        }
        suspect_.store(true, std::memory_order_relaxed);
        const auto now = steady::now();
        const bool timed_out = now >= until;
        std::size_t kept = 0;
        for (request* r : handed_in_) {
            if (timed_out && r->b.deadline > now) {
                handed_in_[kept++] = r;
                continue;
            }
            if (!timed_out) {
                fail_one(*r, why, true);
                continue;
            }
            std::string late;
            try {
                late = ": cannot connect to " + at_.str() + r->b.timed_out();
            } catch (...) {
            }
            fail_one(*r, late, true);
        }
        handed_in_.resize(kept);
        return true;
    }

    // Writes batch_ in one go on `c`, the connection (the writer's: R4). Its calls whose
    // deadline passed meanwhile are cut out, unsent; the others are put in flight before they
    // are sent (their replies may come at once), and a reader is chosen if there is none.
    void write(connection& c) noexcept {
        bool no_room = false;
        try {  // outside m_: the batch's calls stay in it (R1)
            out_.clear();
            ends_.clear();
            for (request* r : batch_) {
                r->replies.reserve(r->cmds.size());
                for (command cmd : r->cmds) connection::append(out_, cmd);
                ends_.push_back(out_.size());
            }
        } catch (...) {
            no_room = true;
        }
        std::unique_lock lk(m_);
        if (broken_) {  // the reader drops it meanwhile: the batch goes on the next one
            try {
                handed_in_.insert(handed_in_.begin(), batch_.begin(), batch_.end());
                return;
            } catch (...) {
                no_room = true;
            }
        }
        if (no_room) {
            for (request* r : batch_) fail_one(*r, ": out of memory", true);
            return;
        }
        const auto now = steady::now();
        auto until = steady::time_point::max();  // the write's deadline: the batch's earliest
        std::size_t kept = 0, begin = 0, cut = 0;
        for (std::size_t i = 0; i < batch_.size(); ++i) {
            request* r = batch_[i];
            const std::size_t end = ends_[i];
            if (r->b.deadline <= now) {  // never written: its commands are cut out
                out_.erase(begin - cut, end - begin);
                cut += end - begin;
                give_up(*r, true);
            } else {
                batch_[kept++] = r;
                until = std::min(until, r->b.deadline);
            }
            begin = end;
        }
        batch_.resize(kept);
        if (batch_.empty()) return;
        const std::size_t before = in_flight_.size();
        try {
            for (request* r : batch_) in_flight_.push_back({r, r->cmds.size()});
        } catch (...) {  // no room to track them: none is sent
            in_flight_.resize(before);
            for (request* r : batch_) fail_one(*r, ": out of memory", true);
            return;
        }
        if (!reading_) {  // R2
            reading_ = true;
            chosen_ = batch_.front();
            chosen_->signal(link_waiter::lead);
        }
        lk.unlock();
        const connection::sent s = c.send_all(out_, until);
        if (s.error == 0) return;
        lk.lock();
        suspect_.store(true, std::memory_order_relaxed);
        std::string why;
        try {
            why = s.error == ETIMEDOUT ? "" : ": " + std::generic_category().message(s.error);
        } catch (...) {
        }
        if (s.bytes == 0) {
            // Nothing of it reached the server: its calls still waiting fail, unsent. They are
            // the last ones in flight (only the writer adds, the reader takes from the front
            // only calls answered, and the connection is not dropped while the writer has it).
            for (std::size_t i = in_flight_.size() - batch_.size(); i < in_flight_.size(); ++i)
                if (request* r = std::exchange(in_flight_[i].r, nullptr)) {
                    std::string mine;
                    try {
                        mine = why.empty() ? r->b.timed_out() + " sending to " + at_.str() : why;
                    } catch (...) {
                    }
                    fail_one(*r, mine, true);
                }
            in_flight_.resize(in_flight_.size() - batch_.size());
            if (s.error == ETIMEDOUT) return;  // the server reads no more: still in step
        }
        // Out of step with the server (part of it went), or dead: nothing more is written on it,
        // and it is dropped (R4); the shutdown wakes a reader waiting on it.
        broken_ = true;
        try {
            broken_why_ = why.empty() ? " to " + at_.str() + ": the write timed out" : why;
        } catch (...) {
        }
        c.shut();
    }

    // The reader's role, until `me` is answered: reads the next reply and hands it to its call,
    // waiting no longer than the earliest deadline in flight (the calls whose deadline passed
    // then fail; once none is left waiting, the connection is closed: the next call starts on a
    // fresh one). A failure to read drops the connection, failing every call in flight on it.
    // Then the role goes on (R2), the connection sound (R4).
    void read_until_answered(request& me) noexcept {
        std::unique_lock lk(m_);
        assert(chosen_ == &me);
        chosen_ = nullptr;
        while (!me.answered) {
            auto until = steady::time_point::max();
            for (const auto& f : in_flight_)
                if (f.r != nullptr) until = std::min(until, f.r->b.deadline);
            const std::shared_ptr<connection> c = conn_;  // `me` in flight: there is one (R5)
            lk.unlock();
            reply_ptr reply;
            std::string failed;
            try {
                reply = c->read("a reply", until);
            } catch (const io_failure& e) {
                failed = e.why();
            } catch (...) {
                failed = ": out of memory";
            }
            lk.lock();
            if (!failed.empty()) {
                drop(lk, failed);
                continue;
            }
            if (reply == nullptr) {
                give_up_late(lk);
                continue;
            }
            hand(std::move(reply));
            if (c->broken()) drop(lk, ": connection lost");  // a protocol error: it was closed
        }
        // Replies that came with the last one go to their calls now, without a system call:
        // handing the role on for them would wake a thread only to find its reply in memory.
        while (!broken_ && !in_flight_.empty() && conn_ != nullptr && !conn_->broken()) {
            reply_ptr reply;
            try {
                reply = conn_->buffered();
            } catch (...) {  // a reply that cannot be read: the next reader meets it too
                break;
            }
            if (reply == nullptr) break;
            hand(std::move(reply));
        }
        // The writer found it dead (R4). Again if so once more while drop() let go of m_ (the
        // role is let go of in the same section as this last look).
        while (broken_) drop(lk, broken_why_);
        // The role goes to the oldest call still in flight, or to nobody.
        request* next = nullptr;
        for (const auto& f : in_flight_)
            if (f.r != nullptr) {
                next = f.r;
                break;
            }
        chosen_ = next;
        reading_ = next != nullptr;
        if (next != nullptr) next->signal(link_waiter::lead);
    }

    // Under m_: the next reply goes to the oldest call in flight (dropped if it gave up), which is
    // answered when it has all of its replies.
    void hand(reply_ptr reply) noexcept {
        if (suspect_.load(std::memory_order_relaxed))
            suspect_.store(false, std::memory_order_relaxed);
        in_flight& f = in_flight_.front();
        if (f.r != nullptr) f.r->replies.push_back(std::move(reply));  // room reserved
        if (--f.left == 0) {
            request* done = f.r;
            in_flight_.pop_front();
            if (done != nullptr) answer(*done);
        }
    }

    // Under lk: the earliest deadline in flight passed with no reply. The calls whose deadline
    // passed fail, alone; once none is left waiting (or too many replies are owed), the
    // connection is closed.
    void give_up_late(std::unique_lock<std::mutex>& lk) noexcept {
        const auto now = steady::now();
        bool waiting = false;
        for (auto& f : in_flight_) {
            if (f.r == nullptr) continue;
            if (f.r->b.deadline > now) {
                waiting = true;
                continue;
            }
            give_up(*std::exchange(f.r, nullptr), false);
        }
        if (!waiting || in_flight_.size() > most_owed)
            drop(lk, " to " + at_.str() + ": no reply (the server stopped answering)");
    }

    // Under lk, by the reader: the connection is out of step or dead. Once the writer has let go
    // of it (woken by the shutdown if it waits to send; R4), it is closed, and every call in
    // flight on it fails with `why` (it is unknown whether the server ran it). The writer's role
    // then goes to the most patient call handed in meanwhile, which connects afresh.
    void drop(std::unique_lock<std::mutex>& lk, const std::string& why) noexcept {
        suspect_.store(true, std::memory_order_relaxed);
        broken_ = true;  // the writer lets go of its role and nobody takes it
        conn_->shut();
        cv_.wait(lk, [&] { return !writing_; });
        std::shared_ptr<connection> dead = std::move(conn_);  // the writer let go: ours to drop
        conn_ = nullptr;
        broken_ = false;
        for (const auto& f : in_flight_)
            if (f.r != nullptr) fail_one(*f.r, why, false);
        in_flight_.clear();
        if (!handed_in_.empty()) {  // R3: nobody writes them, nor takes the role, but this
            request* patient = handed_in_.front();
            for (request* r : handed_in_)
                if (r->b.deadline > patient->b.deadline) patient = r;
            writing_ = true;
            pass_writer_role(*patient);
        }
        lk.unlock();
        dead.reset();
        lk.lock();
    }

    // Under m_, in a child process after fork(): the connection and the calls are the parent's.
    // The child's descriptor of the socket is closed (the parent's stays open) and nothing of the
    // parent's calls is touched: their threads are not in this process.
    void forget_the_parent() noexcept {
        conn_ = nullptr;
        in_flight_.clear();
        handed_in_.clear();
        batch_.clear();  // a writer of the parent's may have been between its swap and its clear
        writing_ = reading_ = broken_ = false;
        chosen_ = write_chosen_ = nullptr;
        // A parent's thread may have been waiting on cv_ at the fork: the child's copy still
        // counts it, and destroying it would wait for a thread the child does not have. Made
        // anew in place; the old one is left as it is, never destroyed.
        new (&cv_) std::condition_variable;
        generation_ = fork_generation();
    }

    // Under m_: fails `r` (out of its list) with `why` (the end of its error message) and
    // answers it.
    void fail_one(request& r, const std::string& why, bool unsent) noexcept {
        try {
            r.failure = why.empty() ? ": failed" : why;
        } catch (...) {
            r.failure = ": failed";  // no memory for the message: still a failure
        }
        r.unsent = unsent;
        r.replies.clear();
        answer(r);
    }

    // Under m_: `r` (out of its list) is done. Its thread is told so, unless the reader's role is
    // on its way to it (R1: it learns it in read_until_answered()). Not a word more about r
    // afterwards: its thread may return and destroy it as soon as m_ is let go.
    void answer(request& r) noexcept {
        r.answered = true;
        if (&r != chosen_) r.signal(link_waiter::done);
    }

    endpoint at_;
    milliseconds io_timeout_;
    std::mutex m_;
    std::condition_variable cv_;        // the writer let go (for a drop)
    std::vector<request*> handed_in_;   // under m_: not written yet
    std::deque<in_flight> in_flight_;   // under m_: written, oldest first
    std::shared_ptr<connection> conn_;  // under m_; set by the writer, dropped as R4 says
    bool writing_ = false;              // under m_: the writer's role is held, or on its way
    bool reading_ = false;              // under m_: the reader's role is held, or on its way
    bool broken_ = false;               // under m_: conn_ is dead or out of step (R4)
    request* chosen_ = nullptr;         // under m_: the reader's role is on its way to it
    request* write_chosen_ = nullptr;   // under m_: the writer's role is on its way to it
    unsigned generation_;               // under m_: the fork generation it was last used in
    std::atomic<bool> suspect_{false};
    std::string broken_why_;         // under m_: why broken_ (what the calls in flight get)
    std::vector<request*> batch_;    // the writer's: the batch it writes
    std::vector<std::size_t> ends_;  // the writer's: where each call of batch_ ends in out_
    std::string out_;                // the writer's: the commands of a batch, in RESP
};

// The link of this process to `at` (server and user), made on first use and shared by every queue
// object that talks to it; it goes when its last user does (shared_in_process.hpp).
inline std::shared_ptr<link> shared_link(const endpoint& at) {
    std::string key = at.host;
    for (const std::string& part : {std::to_string(at.port), at.user, at.password})
        (key += '\0') += part;
    return shared_in_process<link>(key, [&] { return std::make_shared<link>(at); });
}

// A connection subscribed to one channel: where a queue object's waiting consumer listens for
// "the next due time is now earlier" messages. One thread at a time.
class subscriber {
  public:
    subscriber(const endpoint& at, milliseconds io_timeout, const std::string& channel)
        : conn_(at, io_timeout) {
        const std::array<std::string_view, 2> args{"SUBSCRIBE", channel};
        auto r = conn_.command_reply(args);
        if (r->type != REDIS_REPLY_ARRAY)
            throw error("delayq::redis: SUBSCRIBE: " + std::string(text_of(r.get())));
    }

    // Waits until a message comes, `until` passes or `poke` (a pipe's read end, or -1) becomes
    // readable, and appends the payloads of the messages that came (possibly none) to `out`.
    // Throws error when the connection fails.
    void wait(steady::time_point until, std::vector<std::string>& out, int poke = -1) {
        if (take_buffered(out)) return;
        for (;;) {
            std::array<pollfd, 2> p{};
            p[0].fd = conn_.fd();
            p[0].events = POLLIN;
            p[1].fd = poke;  // poll ignores a negative fd
            p[1].events = POLLIN;
            const int left = poll_ms(until);
            const int n = ::poll(p.data(), 2, left);
            if (n == 0) return;
            if (n < 0 && errno == EINTR) continue;
            if ((p[1].revents & POLLIN) != 0) {  // somebody in this process wants the reader back
                std::array<char, 64> sink{};
                while (::read(poke, sink.data(), sink.size()) > 0) {
                }
                if ((p[0].revents & POLLIN) == 0) return;
            }
            conn_.fill();  // readable, or an error that the read reports
            if (take_buffered(out) || left <= 0) return;
        }
    }

  private:
    bool take_buffered(std::vector<std::string>& out) {
        bool any = false;
        while (auto r = conn_.buffered()) {
            // ["message", channel, payload]; the subscription's own confirmation is skipped.
            if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                text_of(r->element[0]) == "message") {
                out.emplace_back(text_of(r->element[2]));
                any = true;
            }
        }
        return any;
    }

    connection conn_;
};

}  // namespace delayq::redis::detail
