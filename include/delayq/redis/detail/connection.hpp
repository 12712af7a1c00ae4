// The Redis backend's wire: one hiredis connection, a link that many threads share, and the
// subscription that waiting consumers listen on. Part of <delayq/redis/delay_queue.hpp>.
//
// The idea. A round trip on loopback costs the server a read, a write and an event-loop turn, and
// the client a write, a read and a context switch; the Lua work of one job is smaller than that.
// So the calls of all the threads that share one queue object go to a node over one connection,
// and whatever they send at about the same time travels together: one thread at a time, the
// leader, writes every queued command in one write, then reads the replies in order and hands
// each to its thread as soon as it is in (StackExchange.Redis and ioredis's auto-pipelining do
// the same). It does not wait for a batch's last reply before it writes the next batch: a thread
// woken by its reply hands in its next call while the server works on the calls behind it, and
// the leader writes it after the next reply. So the server and the client are not idle in turn
// (see link, below). A thread alone pays one round trip, as before; eight threads pay about one
// write and one read per batch instead of one each. Nothing here blocks on the server: a blocked
// command would hold up everybody behind it, so waiting for work is done on a connection of its
// own (the subscriber below).
//
// Failures. A hiredis context is unusable after any I/O error, so the link drops it and the next
// call connects afresh (with its timeouts set again: hiredis 0.14's reconnect forgets them). An
// error says which command failed and why; a read or write that ran into the socket timeout says
// "timed out after N ms (io_timeout)", not errno's text. A failure to connect is `unsent_error`:
// nothing reached the server, so the caller may retry it elsewhere (the cluster router does, after
// a failover); any later failure leaves it unknown whether the command ran, which only the caller
// can judge.
//
// The subscriber. Consumers wait for work with SUBSCRIBE on the queue's channel, to which every
// script that makes the next due time earlier publishes that time. A subscribed connection is not
// a blocked one: the client waits on the socket with poll() and its own timeout, at the due time
// it knows, to the millisecond, not at the server's next cron tick (blocking commands' timeouts
// are handled in the cron, every 100 ms by default).
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
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../types.hpp"

namespace delayq::redis::detail {

using std::chrono::milliseconds;
using command = std::span<const std::string_view>;  // one command's arguments

/// Nothing was sent: the connection could not be made. Safe to retry, elsewhere too.
class unsent_error : public error {
  public:
    using error::error;
};

// What a connection throws: the whole message, and its end (why) apart, so that a link can name
// each of its callers' own commands.
class io_failure : public error {
  public:
    io_failure(const std::string& what, std::string why, bool unsent)
        : error("delayq::redis: " + what + why), why_(std::move(why)), unsent_(unsent) {}
    const std::string& why() const noexcept { return why_; }
    bool unsent() const noexcept { return unsent_; }

  private:
    std::string why_;  // " timed out after 300 ms (io_timeout)", ": Connection reset by peer"
    bool unsent_;
};

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
// way.
struct endpoint {
    std::string host;
    int port = 0;
    std::string user, password;  // both empty: no AUTH
    bool operator==(const endpoint&) const = default;
    std::string str() const { return host + ":" + std::to_string(port); }  // never the password
};

// One hiredis context, used by one thread at a time. Any I/O error leaves the context unusable:
// it marks itself broken and its owner throws it away.
class connection {
  public:
    connection(const endpoint& at, milliseconds io_timeout) : io_timeout_(io_timeout) {
        ctx_ = redisConnectWithTimeout(at.host.c_str(), at.port, to_timeval(io_timeout));
        if (ctx_ == nullptr) throw io_failure("connecting to " + at.str(), ": out of memory", true);
        if (ctx_->err != 0) {
            const bool timed_out = ctx_->err == REDIS_ERR_IO && errno == EINPROGRESS;
            std::string why = timed_out ? " timed out after " + std::to_string(io_timeout.count()) +
                                              " ms (io_timeout)"
                                        : ": " + std::string(ctx_->errstr);
            redisFree(ctx_);
            throw io_failure("connecting to " + at.str(), std::move(why), true);
        }
        redisSetTimeout(ctx_, to_timeval(io_timeout));
        redisEnableKeepAlive(ctx_);
        if (!at.user.empty() || !at.password.empty()) {
            try {
                login(at);
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

    // Throws a failure to send, errno `e`, for `what`; the connection is broken now.
    [[noreturn]] void fail_sending(const std::string& what, int e) {
        broken_ = true;
        if (e == EAGAIN || e == EWOULDBLOCK)  // SO_SNDTIMEO (io_timeout) ran out
            throw io_failure(what, timed_out(), false);
        throw io_failure(what, ": " + std::generic_category().message(e), false);
    }

    // Throws the last I/O failure, for `what` (a command's name); the connection is broken now.
    [[noreturn]] void fail(const std::string& what) {
        broken_ = true;
        // A read or write that ran into the socket timeout: hiredis reports errno's text
        // ("Resource temporarily unavailable"), which does not say what happened.
        if (ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK))
            throw io_failure(what, timed_out(), false);
        throw io_failure(
            what,
            ": " + (ctx_->err != 0 ? std::string(ctx_->errstr) : std::string("connection lost")),
            false);
    }

    // Queues a command, in RESP (an array of bulk strings), straight into the buffer that
    // flush() sends: no allocation once the buffer has grown.
    void append(command args) {
        out_ += '*';
        out_ += std::to_string(args.size());
        out_ += "\r\n";
        for (std::string_view a : args) {
            out_ += '$';
            out_ += std::to_string(a.size());
            out_ += "\r\n";
            out_ += a;
            out_ += "\r\n";
        }
    }

    // Sends what append() queued. With send(MSG_NOSIGNAL), not hiredis's write(): a write into a
    // connection the server has closed is then an error here, not SIGPIPE, whose default action
    // ends the process (a node killed while a call is being written).
    void flush(std::string_view what) {
        std::size_t sent = 0;
        while (sent < out_.size()) {
            const ssize_t n =
                ::send(ctx_->fd, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL);
            if (n > 0) {
                sent += static_cast<std::size_t>(n);
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                const int e = n < 0 ? errno : EPIPE;
                out_.clear();
                fail_sending(std::string(what), e);
            }
        }
        if (out_.capacity() > (std::size_t{1} << 20)) {
            std::string().swap(out_);  // a large payload's room is not kept
        } else {
            out_.clear();
        }
    }

    // The next reply, read from the socket if need be; an error reply is returned, not thrown.
    reply_ptr read(std::string_view what) {
        void* r = nullptr;
        if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) fail(std::string(what));
        return checked(r);
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

    reply_ptr command_reply(command args) {
        append(args);
        flush(name_of(args));
        return read(name_of(args));
    }

  private:
    // AUTH [user] password, before anything else: with ACLs, every other command needs it. A
    // refusal is unsent_error-like: none of the caller's commands reached the server.
    void login(const endpoint& at) {
        std::array<std::string_view, 3> args{"AUTH", at.user, at.password};
        command cmd(args);
        if (at.user.empty()) {  // the `default` user, or a server with requirepass
            args[1] = at.password;
            cmd = cmd.first(2);
        }
        reply_ptr r;
        try {
            r = command_reply(cmd);
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

// How a thread that hands in a request learns its fate: waits on its own lock and condition
// until the thread that does the I/O says the request is done, or that it leads now.
struct combined {
    enum state : int { waiting, done, lead };

    // Tells the waiting thread `what`, under the item's own lock: its thread cannot see the new
    // state, return and destroy the item before this has let go of it (POSIX lets a mutex be
    // destroyed right after another thread unlocked it).
    void signal(state what) noexcept {
        std::lock_guard lk(m);
        st = what;
        cv.notify_one();
    }
    // Waits for signal() and returns what it said.
    state await() noexcept {
        std::unique_lock lk(m);
        cv.wait(lk, [&] { return st != waiting; });
        return st;
    }

  private:
    std::mutex m;
    std::condition_variable cv;
    state st = waiting;
};

// One node's connection, shared by every thread of a queue object; see "The idea" above. A
// leader's turn: write what was handed in, read the oldest call in flight and answer it, again,
// until its own call is answered; then it hands the lead to the owner of the oldest call still in
// flight (or of the first one not written yet) and returns, so that no caller serves the others
// for longer than its own call takes. A call that fails takes every call in flight on that
// connection with it: the connection is out of step with the server.
class link {
  public:
    link(endpoint at, milliseconds io_timeout) : at_(std::move(at)), io_timeout_(io_timeout) {}
    link(const link&) = delete;
    link& operator=(const link&) = delete;

    const endpoint& where() const noexcept { return at_; }

    // Sends `cmds` back to back (with other threads' commands around them, never between them)
    // and returns their replies in order. Throws unsent_error when the connection cannot be made,
    // error when it fails after that.
    std::vector<reply_ptr> call(std::span<const command> cmds) {
        request r;
        r.cmds = cmds;
        bool lead = false;
        {
            std::lock_guard lk(m_);
            handed_in_.push_back(&r);
            lead = !std::exchange(busy_, true);
        }
        if (lead || r.await() == combined::lead) serve(r);
        if (!r.failure.empty()) {
            const std::string msg = "delayq::redis: " + name_of(cmds.front()) + r.failure;
            if (r.unsent) throw unsent_error(msg);
            throw error(msg);
        }
        return std::move(r.replies);
    }

    reply_ptr call(command c) { return std::move(call(std::span<const command>(&c, 1)).front()); }

  private:
    struct request : combined {
        std::span<const command> cmds;
        std::vector<reply_ptr> replies;
        std::string failure;  // the end of the error message; empty: it went through
        bool unsent = false;
        bool answered = false;  // its replies (or its failure) are in; read by its own leader
    };

    // The leader's loop, until `me` is answered; then it hands the lead on (or lets it go when
    // nothing is left). Never throws: a failure goes to the requests it concerns.
    void serve(request& me) noexcept {
        std::vector<request*> fresh;  // handed in, not yet written
        for (;;) {
            {
                std::lock_guard lk(m_);
                fresh.swap(handed_in_);
            }
            if (!fresh.empty()) write(fresh);
            if (!in_flight_.empty()) read_oldest();
            if (!me.answered) continue;  // in flight: its reply comes in a later turn
            request* next = nullptr;
            {
                std::lock_guard lk(m_);
                if (!in_flight_.empty())
                    next = in_flight_.front();
                else if (!handed_in_.empty())
                    next = handed_in_.front();
                else
                    busy_ = false;
            }
            if (next != nullptr) next->signal(combined::lead);
            return;
        }
    }

    // Writes `batch` in one go, and empties it: its requests are in flight now, or failed. A
    // failure drops the connection, and with it every request in flight on it.
    void write(std::vector<request*>& batch) noexcept {
        try {
            // Room to track the batch first: once written, its replies must be told apart.
            in_flight_.reserve(in_flight_.size() + batch.size());
            if (conn_ == nullptr) conn_ = std::make_unique<connection>(at_, io_timeout_);
            for (request* r : batch)
                for (command c : r->cmds) conn_->append(c);
            conn_->flush(name_of(batch.front()->cmds.front()));
        } catch (const io_failure& e) {
            // unsent: no connection, so nothing of the batch reached the server
            const bool unsent = e.unsent();
            std::string why;
            try {
                why = unsent ? ": cannot connect to " + at_.str() + e.why() : e.why();
            } catch (...) {  // no memory for the message: still a failure
            }
            fail(batch, why, unsent);
            drop(why);
            return;
        } catch (...) {
            fail(batch, ": out of memory", false);
            drop(": out of memory");
            return;
        }
        in_flight_.insert(in_flight_.end(), batch.begin(), batch.end());  // room reserved
        batch.clear();
    }

    // Reads the replies of the oldest request in flight and answers it. A failure answers every
    // request in flight: the connection is out of step with the server, and is dropped.
    void read_oldest() noexcept {
        assert(conn_ != nullptr && "a request is in flight only on a live connection");
        request* r = in_flight_.front();
        try {
            r->replies.reserve(r->cmds.size());
            for (command c : r->cmds) r->replies.push_back(conn_->read(name_of(c)));
        } catch (const io_failure& e) {
            drop(e.why());
            return;
        } catch (...) {
            drop(": out of memory");
            return;
        }
        in_flight_.erase(in_flight_.begin());
        if (conn_->broken()) drop(": connection lost");  // a protocol error: the server closed it
        answer(*r);
    }

    // The connection failed: it is dropped, and every request in flight on it fails with `why`
    // (the end of its error message; it is unknown whether the server ran it).
    void drop(const std::string& why) noexcept {
        conn_.reset();
        fail(in_flight_, why, false);
    }

    // Fails every request of `rs` with `why` (the end of its error message), answers it, and
    // empties `rs`.
    static void fail(std::vector<request*>& rs, const std::string& why, bool unsent) noexcept {
        for (request* r : rs) {
            try {
                r->failure = why.empty() ? ": failed" : why;
            } catch (...) {
                r->failure = ": failed";  // no memory for the message: still a failure
            }
            r->unsent = unsent;
            r->replies.clear();
            answer(*r);
        }
        rs.clear();
    }

    // Tells r's thread it is done (the leader's own request: nobody waits, and no harm). Not a
    // word more about r afterwards: its thread may return and destroy it at once.
    static void answer(request& r) noexcept {
        r.answered = true;
        r.signal(combined::done);
    }

    endpoint at_;
    milliseconds io_timeout_;
    std::mutex m_;
    std::vector<request*> handed_in_;  // under m_
    bool busy_ = false;                // under m_: a leader is at work
    // The leader's alone (handed on with the lead):
    std::vector<request*> in_flight_;  // written, oldest first
    std::unique_ptr<connection> conn_;
};

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
    void wait(std::chrono::steady_clock::time_point until, std::vector<std::string>& out,
              int poke = -1) {
        if (take_buffered(out)) return;
        for (;;) {
            const auto left =
                std::chrono::ceil<milliseconds>(until - std::chrono::steady_clock::now());
            std::array<pollfd, 2> p{};
            p[0].fd = conn_.fd();
            p[0].events = POLLIN;
            p[1].fd = poke;  // poll ignores a negative fd
            p[1].events = POLLIN;
            const int n =
                ::poll(p.data(), 2,
                       static_cast<int>(std::clamp<long long>(left.count(), 0, 1'000'000'000)));
            if (n == 0) return;
            if (n < 0 && errno == EINTR) continue;
            if ((p[1].revents & POLLIN) != 0) {  // somebody in this process wants the reader back
                std::array<char, 64> sink{};
                while (::read(poke, sink.data(), sink.size()) > 0) {
                }
                if ((p[0].revents & POLLIN) == 0) return;
            }
            conn_.fill();  // readable, or an error that the read reports
            if (take_buffered(out) || left.count() <= 0) return;
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
