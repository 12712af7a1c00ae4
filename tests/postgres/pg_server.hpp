// A private PostgreSQL server for one test (or benchmark) process: initdb in a temporary
// directory, the postmaster on a free loopback port with its socket in that directory, stopped in
// the destructor, so a failing test leaves nothing behind and the tests never touch a server they
// did not start. The postmaster is a child of the thread that starts it, killed by the kernel when
// that thread ends (PR_SET_PDEATHSIG), so a test killed by ctest's timeout leaves no server
// either; its backends notice the postmaster's death and exit. As root, initdb and the server run
// as the `postgres` user (they refuse to run as root), which owns the directory.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
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

#include "../free_port.hpp"

extern char** environ;

namespace delayq_pg_test {

// The server's programs: $DELAYQ_PG_BINDIR, Debian's /usr/lib/postgresql/<newest>/bin, or PATH.
inline std::string bindir() {
    if (const char* env = std::getenv("DELAYQ_PG_BINDIR"); env != nullptr && *env != '\0')
        return env;
    std::string best;
    int best_version = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
        const std::string v = e.path().filename().string();
        const int n = std::atoi(v.c_str());
        if (n > best_version && ::access((e.path() / "bin/postgres").c_str(), X_OK) == 0) {
            best_version = n;
            best = (e.path() / "bin").string();
        }
    }
    if (!best.empty()) return best;
    if (const char* path = std::getenv("PATH")) {
        std::stringstream dirs(path);
        for (std::string dir; std::getline(dirs, dir, ':');)
            if (!dir.empty() && ::access((dir + "/initdb").c_str(), X_OK) == 0) return dir;
    }
    throw std::runtime_error(
        "PostgreSQL's initdb and postgres not found (not in /usr/lib/postgresql/*/bin, not on "
        "PATH, DELAYQ_PG_BINDIR unset): the Postgres tests need a real server; install it with "
        "`apt-get install postgresql`");
}

// The user the server runs as: `postgres` when we are root, else ourselves.
struct server_user {
    uid_t uid = ::geteuid();
    gid_t gid = ::getegid();
    bool switch_to = false;
    server_user() {
        if (uid != 0) return;
        const passwd* pw = ::getpwnam("postgres");
        if (pw == nullptr)
            throw std::runtime_error(
                "running as root and there is no `postgres` user to run the server as (the "
                "postgresql package creates it)");
        uid = pw->pw_uid;
        gid = pw->pw_gid;
        switch_to = true;
    }
};

// Starts `args` (args[0] is the program) as `user`, with stdout and stderr to `log`, in a process
// group of its own, killed by the kernel when the calling thread ends. Returns its pid.
inline pid_t spawn(const std::vector<std::string>& args, const server_user& user,
                   const std::string& log) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    // The child: only async-signal-safe calls until exec.
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
    }
    if (user.switch_to &&
        (::setgroups(0, nullptr) != 0 || ::setgid(user.gid) != 0 || ::setuid(user.uid) != 0))
        ::_exit(126);
    // After the change of user, which clears it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent is already gone
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
}

class pg_server {
  public:
    /// initdb and start; `settings` are extra `-c name=value` for the server.
    explicit pg_server(std::vector<std::string> settings = {}) : settings_(std::move(settings)) {
        make_dir();
        run({bin_ + "/initdb", "-D", data(), "-A", "trust", "-U", "postgres", "-E", "UTF8",
             "--no-locale", "--no-sync"},
            "initdb");
        start();
    }

    /// A streaming standby of `primary` (pg_basebackup -R) on a port of its own, started;
    /// `settings` as above (e.g. cluster_name=NAME, the name synchronous_standby_names knows it
    /// by).
    static std::unique_ptr<pg_server> standby_of(const pg_server& primary,
                                                 std::vector<std::string> settings) {
        std::unique_ptr<pg_server> s(new pg_server(std::move(settings), nullptr));
        s->make_dir();
        s->run({s->bin_ + "/pg_basebackup", "-D", s->data(), "-R", "-X", "stream", "-c", "fast",
                "-h", "127.0.0.1", "-p", std::to_string(primary.port()), "-U", "postgres"},
               "pg_basebackup");
        s->start();
        return s;
    }

    /// Promotes a standby to a primary, waiting until it accepts writes.
    void promote() const {
        if (query("SELECT pg_promote(true, 30)") != "t")
            throw std::runtime_error("pg_promote did not finish; see " + log());
    }
    pg_server(const pg_server&) = delete;
    pg_server& operator=(const pg_server&) = delete;
    ~pg_server() {
        stop();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    int port() const noexcept { return port_; }
    const std::string& dir() const noexcept { return dir_; }
    std::string data() const { return dir_ + "/data"; }
    std::string log() const { return dir_ + "/server.log"; }
    pid_t pid() const noexcept { return pid_; }

    /// A libpq connection string for `user` on database `db`.
    std::string conninfo(const std::string& user = "postgres",
                         const std::string& db = "postgres") const {
        return "host=127.0.0.1 port=" + std::to_string(port_) + " user=" + user + " dbname=" + db +
               " connect_timeout=5";
    }

    /// Starts the postmaster (again), on the same port once it has one, and waits until it
    /// accepts connections.
    void start() {
        for (int attempt = 0;; ++attempt) {
            if (!keep_port_) port_ = delayq_test::free_port();  // a restart keeps its port
            std::vector<std::string> args = {bin_ + "/postgres",
                                             "-D",
                                             data(),
                                             "-p",
                                             std::to_string(port_),
                                             "-k",
                                             dir_,
                                             "-c",
                                             "listen_addresses=127.0.0.1",
                                             "-c",
                                             "max_connections=200"};
            for (const auto& s : settings_) {
                args.push_back("-c");
                args.push_back(s);
            }
            pid_ = spawn(args, user_, log());
            if (wait_ready()) {
                keep_port_ = true;
                return;
            }
            kill9();
            if (attempt == 5) throw std::runtime_error("postgres did not start; see " + log());
        }
    }

    /// A fast shutdown (SIGINT), then SIGKILL of the whole group if it lingers.
    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGINT);
        for (int i = 0; i < 200; ++i) {
            if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
                pid_ = 0;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        kill9();
    }

    /// kill -9 of the postmaster and every backend at once, as a crash of the machine would.
    /// (The backends are sessions of their own, not in the postmaster's process group.)
    void kill9() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGSTOP);  // forks no more
        std::vector<pid_t> children;
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
            std::ifstream stat(e.path() / "stat");
            std::string line;
            if (!std::getline(stat, line)) continue;
            const auto close = line.rfind(')');  // "pid (comm) state ppid ..."
            if (close == std::string::npos) continue;
            std::istringstream rest(line.substr(close + 1));
            std::string state;
            pid_t ppid = 0;
            rest >> state >> ppid;
            if (ppid == pid_) children.push_back(std::atoi(e.path().filename().c_str()));
        }
        for (const pid_t c : children) ::kill(c, SIGKILL);
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = 0;
    }

    /// Runs `sql` as the superuser; throws with the server's message on failure.
    void exec(const std::string& sql, const std::string& db = "postgres") const {
        PGconn* c = PQconnectdb(conninfo("postgres", db).c_str());
        PQsetNoticeProcessor(
            c, [](void*, const char*) {},
            nullptr);  // "drop cascades to ...": not the test's output
        std::string err;
        if (PQstatus(c) != CONNECTION_OK) {
            err = PQerrorMessage(c);
        } else {
            PGresult* r = PQexec(c, sql.c_str());
            const auto st = PQresultStatus(r);
            if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) err = PQresultErrorMessage(r);
            PQclear(r);
        }
        PQfinish(c);
        if (!err.empty()) throw std::runtime_error("SQL failed: " + sql + ": " + err);
    }

    /// The first column of the first row of `sql`, as text.
    std::string query(const std::string& sql, const std::string& db = "postgres") const {
        PGconn* c = PQconnectdb(conninfo("postgres", db).c_str());
        std::string out, err;
        if (PQstatus(c) != CONNECTION_OK) {
            err = PQerrorMessage(c);
        } else {
            PGresult* r = PQexec(c, sql.c_str());
            if (PQresultStatus(r) != PGRES_TUPLES_OK)
                err = PQresultErrorMessage(r);
            else if (PQntuples(r) > 0)
                out = PQgetvalue(r, 0, 0);
            PQclear(r);
        }
        PQfinish(c);
        if (!err.empty()) throw std::runtime_error("SQL failed: " + sql + ": " + err);
        return out;
    }

  private:
    pg_server(std::vector<std::string> settings, std::nullptr_t) : settings_(std::move(settings)) {}

    void make_dir() {
        std::string pattern =
            (std::filesystem::temp_directory_path() / "delayq-pg-XXXXXX").string();
        if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
        dir_ = pattern;
        if (user_.switch_to && ::chown(dir_.c_str(), user_.uid, user_.gid) != 0)
            throw std::runtime_error("cannot give " + dir_ + " to the postgres user");
    }

    // Runs `args` as the server's user and waits for it; throws when it fails.
    void run(const std::vector<std::string>& args, const char* what) {
        const pid_t pid = spawn(args, user_, log());
        int status = 0;
        ::waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            throw std::runtime_error(std::string(what) + " failed; see " + log());
    }

    bool wait_ready() {
        const std::string ci = "host=127.0.0.1 port=" + std::to_string(port_) +
                               " user=postgres dbname=postgres connect_timeout=2";
        for (int i = 0; i < 600; ++i) {
            if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
                pid_ = 0;
                return false;  // exited: the port was taken, or worse
            }
            PGconn* c = PQconnectdb(ci.c_str());
            const bool ok = PQstatus(c) == CONNECTION_OK;
            PQfinish(c);
            if (ok) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return false;
    }

    std::vector<std::string> settings_;
    server_user user_;
    std::string bin_ = bindir();
    std::string dir_;
    int port_ = 0;
    bool keep_port_ = false;
    pid_t pid_ = 0;
};

}  // namespace delayq_pg_test
