// The chaos check's event logs: one file per process (per incarnation of a worker), one line per
// event, each line written with one write() and made durable with fdatasync() before the process
// acts on what the line records. The checker (chaos_check.hpp) reads them all back.
//
// A line is `<mono_ns> <real_ns> <kind> <fields...>`: CLOCK_MONOTONIC, which is one clock for every
// process of the machine (so "this take began after that cancel returned" compares lines of two
// processes), and CLOCK_REALTIME, the clock that the SQLite queue judges due times by and that the
// Redis server (on this machine) reads with TIME. A stamp is taken after the call it records
// returned (an "-end" line) or before it began (a "-begin" line), so an end stamp is never earlier
// than the real return and a begin stamp never later than the real start: every ordering the
// checker concludes from two stamps held in fact.
//
// The kinds and their fields (ids never contain spaces; a message is the rest of its line):
//
//   start ROLE INDEX INCARNATION PID TIMEOUT_MS THREAD
//                                                 the process (or its thread THREAD > 0) began;
//                                                 its calls' timeout (io_timeout, busy_timeout)
//   open-begin | open-end | close                 a queue object constructed / destroyed
//   put-begin ID POISON DUE_NS HOW                about to put ID; POISON 0/1; DUE_NS: the time
//                                                 (realtime ns) before which it must not run
//   put-end ID 0|1                                the put returned false / true
//   cancel-begin ID | cancel-end ID 0|1
//   take-begin SEQ MAX_JOBS WAIT_MS               SEQ numbers this process's takes
//   take-end SEQ N                                followed by N lines, in the same write:
//   job SEQ ID ATTEMPTS TOKEN DEADLINE_NS LEASE_NS   one job handed out
//   ack-begin ID TOKEN | ack-end ID TOKEN 0|1
//   nack-begin ID TOKEN RETRY_MS | nack-end ID TOKEN 0|1
//   extend-begin ID TOKEN LEASE_MS | extend-end ID TOKEN 0|1
//   bury-begin ID TOKEN | bury-end ID TOKEN 0|1
//   handler-begin ID TOKEN                        a delayq::worker's handler began (the worker
//   handler-end ID TOKEN HOW PAST                 consumer); it ended: HOW return, throw,
//                                                 dead-letter, retry-in or stopped (its stop token
//                                                 requested); PAST 1 if after the take's lease end
//   worker-retry ID TOKEN DELAY_MS REASON         the worker's hooks: retrying, dead_lettered,
//   worker-dead ID TOKEN REASON                   lease_lost, call_failed
//   worker-lease-lost ID TOKEN
//   worker-call-failed MESSAGE
//   worker-stop-begin | worker-stop-end DONE RETRIED DEAD LOST RELEASED
//                                                 SIGTERM: stop() called / returned (counters())
//   die ID                                        a poison job: the process ends itself now
//   size-begin - | size-end - N                   size() (an opener's, the drainer's)
//   <call>-fail ... CLASS MESSAGE                 a call threw (open, put, cancel, take, ack, nack,
//                                                 extend, bury, size)
//   drain-end COMPLETE [DEAD]                     the drainer saw the queue empty (1; then
//                                                 dead_size() too) or gave up (0)
//   kill NAME PID | stop NAME PID | crash NAME WHAT      the orchestrator's own log
//   server-kill | server-up                       the orchestrator's too: the store's server
//                                                 killed with SIGKILL / started again
//   stall-begin HOW MS | stall-end                the store stalled for MS ms (HOW: lock-table,
//   stall-error MESSAGE                           sigstop, begin-exclusive) / free again / the
//                                                 stall could not be made
//   connection-kill | connection-kill-end N       every client connection killed (N of them)
//   connection-kill-error MESSAGE                 the kill could not be made
//
// Every "-end" and "-fail" line of a call (open, put, cancel, take, ack, nack, extend, bury, size)
// carries the moment the call itself began, `@MONO` (CLOCK_MONOTONIC ns, read after its "-begin"
// line was durable): the last field of an "-end" line, the field before CLASS of a "-fail" line.
// The judge times the call from there to the line's own stamp (a line without it: from the
// "-begin" line's stamp).
#pragma once

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace delayq_chaos {

/// Both clocks, read back to back.
struct stamp {
    long long mono = 0;  ///< CLOCK_MONOTONIC, ns
    long long real = 0;  ///< CLOCK_REALTIME, ns
};

inline long long clock_ns(clockid_t id) {
    timespec ts{};
    ::clock_gettime(id, &ts);
    return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

/// The `@MONO` field of a call's "-end" or "-fail" line: the moment the call began.
inline std::string began(const stamp& s) {
    return '@' + std::to_string(s.mono);
}

inline stamp now() {
    stamp s;
    s.mono = clock_ns(CLOCK_MONOTONIC);
    s.real = clock_ns(CLOCK_REALTIME);
    return s;
}

/// One line's text after its stamps: `kind` and the fields, space-separated. A message (which may
/// hold spaces or newlines) goes last, flattened to one line.
class line {
  public:
    explicit line(std::string_view kind) : text_(kind) {}
    line& operator<<(std::string_view field) {
        text_ += ' ';
        for (char c : field) text_ += (c == '\n' || c == '\r') ? ' ' : c;
        return *this;
    }
    line& operator<<(long long v) { return *this << std::string_view(std::to_string(v)); }
    line& operator<<(unsigned long long v) { return *this << std::string_view(std::to_string(v)); }
    line& operator<<(int v) { return *this << static_cast<long long>(v); }
    line& operator<<(unsigned v) { return *this << static_cast<unsigned long long>(v); }
    line& operator<<(long v) { return *this << static_cast<long long>(v); }
    line& operator<<(unsigned long v) { return *this << static_cast<unsigned long long>(v); }
    const std::string& text() const noexcept { return text_; }

  private:
    std::string text_;
};

/// A process's log: appends lines and makes them durable before returning.
class log_writer {
  public:
    /// Creates the log `path`, which must not exist yet: one log is one process's.
    explicit log_writer(const std::string& path)
        : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644)) {
        if (fd_ < 0)
            throw std::runtime_error("cannot create the log " + path + ": " + std::strerror(errno));
    }
    ~log_writer() { ::close(fd_); }
    log_writer(const log_writer&) = delete;
    log_writer& operator=(const log_writer&) = delete;

    /// Writes `lines`, all with stamp `s`, in one write(), then fdatasync() (unless `sync` is
    /// false: for a line that records no result, when a process must not lose time before a call).
    void write(const stamp& s, const std::vector<line>& lines, bool sync = true) {
        std::string out;
        const std::string head = std::to_string(s.mono) + ' ' + std::to_string(s.real) + ' ';
        for (const auto& l : lines) out += head + l.text() + '\n';
        std::size_t done = 0;
        while (done < out.size()) {
            const ssize_t n = ::write(fd_, out.data() + done, out.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) throw std::runtime_error(std::string("log write: ") + std::strerror(errno));
            done += static_cast<std::size_t>(n);
        }
        while (sync && ::fdatasync(fd_) != 0)
            if (errno != EINTR)
                throw std::runtime_error(std::string("log fdatasync: ") + std::strerror(errno));
    }

    /// One line stamped now. Returns the stamp.
    stamp write(const line& l) {
        const stamp s = now();
        write(s, {l});
        return s;
    }
    /// One line with a stamp taken earlier (the moment a call returned).
    void write(const stamp& s, const line& l) { write(s, std::vector<line>{l}); }

  private:
    int fd_;
};

/// One event read back from a log.
struct event {
    int file = 0;                ///< index of the log it came from (one process incarnation)
    std::size_t no = 0;          ///< its line number there, from 1
    long long mono = 0;          ///< CLOCK_MONOTONIC ns
    long long real = 0;          ///< CLOCK_REALTIME ns
    std::string kind;            ///< "put-begin", ...
    std::vector<std::string> f;  ///< the fields after the kind
    std::string text;            ///< the whole line, for reports

    /// Field i, or "" when the line is shorter.
    const std::string& at(std::size_t i) const {
        static const std::string none;
        return i < f.size() ? f[i] : none;
    }
    long long num(std::size_t i) const {
        const std::string& s = at(i);
        return s.empty() ? 0 : std::stoll(s);
    }
    /// The `@MONO` field (the moment the call began) among the first fields, or 0.
    long long call_start() const {
        for (std::size_t i = 0; i < f.size() && i < 4; ++i)
            if (f[i].size() > 1 && f[i][0] == '@' &&
                f[i].find_first_not_of("0123456789", 1) == std::string::npos)
                return std::stoll(f[i].substr(1));
        return 0;
    }
    /// Field i as an unsigned 64-bit number (a fencing token may use all 64 bits).
    unsigned long long unum(std::size_t i) const {
        const std::string& s = at(i);
        return s.empty() ? 0 : std::stoull(s);
    }
};

/// Parses one line (without its newline); false if it is not a whole event line.
inline bool parse_line(const std::string& text, event& e) {
    std::istringstream in(text);
    std::string mono, real;
    if (!(in >> mono >> real >> e.kind)) return false;
    try {
        e.mono = std::stoll(mono);
        e.real = std::stoll(real);
    } catch (const std::exception&) {
        return false;
    }
    e.f.clear();
    for (std::string w; in >> w;) e.f.push_back(w);
    e.text = text;
    return true;
}

/// The events of one log. A last line without its newline (the process died in the middle of the
/// write) is left out: its event was never acted upon.
inline std::vector<event> read_log(const std::string& path, int file) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream all;
    all << in.rdbuf();
    const std::string s = all.str();
    std::vector<event> out;
    std::size_t pos = 0, no = 0;
    while (pos < s.size()) {
        const std::size_t nl = s.find('\n', pos);
        if (nl == std::string::npos) break;
        ++no;
        event e;
        if (parse_line(s.substr(pos, nl - pos), e)) {
            e.file = file;
            e.no = no;
            out.push_back(std::move(e));
        }
        pos = nl + 1;
    }
    return out;
}

}  // namespace delayq_chaos
