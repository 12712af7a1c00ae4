// A put whose fsync fails: it throws, yet it was applied (its commit came first), and its job is
// delivered; retrying it is safe. docs/sqlite.md says so in "Durability" and "Errors".
//
// The failure comes from a VFS of this test's own, registered as SQLite's default for the test:
// it passes every call to the real one, and fails the WAL's syncs while `fail_wal_sync` is set.
//
// Also: the callers of one failed group commit (a failed fsync) each get an exception of their
// own, with a message of its own (include/delayq/detail/job_queue/exception_copy.hpp says why).
#include <sqlite3.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "caught_apart.hpp"
#include "expect_error.hpp"
#include "sqlite_files.hpp"

using namespace std::chrono_literals;
using delayq::sqlite::delay_queue;
using delayq_sqlite_test::opts;
using delayq_sqlite_test::temp_dir;

namespace {

std::atomic<bool> fail_wal_sync{false};
sqlite3_vfs* real = nullptr;

// A file of the test's VFS: SQLite's object first, then the real VFS's file.
struct shim_file {
    sqlite3_file base;
    bool wal;
    sqlite3_file* inner() { return reinterpret_cast<sqlite3_file*>(this + 1); }
};
shim_file* of(sqlite3_file* f) {
    return reinterpret_cast<shim_file*>(f);
}

int x_close(sqlite3_file* f) {
    return of(f)->inner()->pMethods->xClose(of(f)->inner());
}
int x_read(sqlite3_file* f, void* b, int n, sqlite3_int64 o) {
    return of(f)->inner()->pMethods->xRead(of(f)->inner(), b, n, o);
}
int x_write(sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
    return of(f)->inner()->pMethods->xWrite(of(f)->inner(), b, n, o);
}
int x_truncate(sqlite3_file* f, sqlite3_int64 n) {
    return of(f)->inner()->pMethods->xTruncate(of(f)->inner(), n);
}
// A gate for the next sync of the WAL: hold_next_sync() makes it wait until release_sync().
std::mutex gate_m;
std::condition_variable gate_cv;
bool hold_next = false, holding = false, released = false;
std::atomic<int> wal_syncs{0};       // syncs of the WAL so far
std::atomic<int> fail_wal_errno{0};  // the OS error a failed sync reports (0: SQLite's own)

void hold_next_sync() {
    std::lock_guard lk(gate_m);
    hold_next = true;
    holding = released = false;
}
void wait_until_held() {
    std::unique_lock lk(gate_m);
    gate_cv.wait(lk, [] { return holding; });
}
void release_sync() {
    std::lock_guard lk(gate_m);
    released = true;
    gate_cv.notify_all();
}

int x_sync(sqlite3_file* f, int flags) {
    if (of(f)->wal) {
        std::unique_lock lk(gate_m);
        if (hold_next) {
            hold_next = false;
            holding = true;
            gate_cv.notify_all();
            gate_cv.wait(lk, [] { return released; });
        }
        lk.unlock();
        ++wal_syncs;
        if (fail_wal_sync) return SQLITE_IOERR_FSYNC;
    }
    return of(f)->inner()->pMethods->xSync(of(f)->inner(), flags);
}
int x_size(sqlite3_file* f, sqlite3_int64* n) {
    return of(f)->inner()->pMethods->xFileSize(of(f)->inner(), n);
}
int x_lock(sqlite3_file* f, int l) {
    return of(f)->inner()->pMethods->xLock(of(f)->inner(), l);
}
int x_unlock(sqlite3_file* f, int l) {
    return of(f)->inner()->pMethods->xUnlock(of(f)->inner(), l);
}
int x_reserved(sqlite3_file* f, int* r) {
    return of(f)->inner()->pMethods->xCheckReservedLock(of(f)->inner(), r);
}
int x_control(sqlite3_file* f, int op, void* a) {
    if (op == SQLITE_FCNTL_LAST_ERRNO && of(f)->wal && fail_wal_sync && fail_wal_errno != 0) {
        *static_cast<int*>(a) = fail_wal_errno;
        return SQLITE_OK;
    }
    return of(f)->inner()->pMethods->xFileControl(of(f)->inner(), op, a);
}
int x_sector(sqlite3_file* f) {
    return of(f)->inner()->pMethods->xSectorSize(of(f)->inner());
}
int x_caps(sqlite3_file* f) {
    return of(f)->inner()->pMethods->xDeviceCharacteristics(of(f)->inner());
}
int x_shm_map(sqlite3_file* f, int pg, int sz, int ext, void volatile** p) {
    return of(f)->inner()->pMethods->xShmMap(of(f)->inner(), pg, sz, ext, p);
}
int x_shm_lock(sqlite3_file* f, int o, int n, int fl) {
    return of(f)->inner()->pMethods->xShmLock(of(f)->inner(), o, n, fl);
}
void x_shm_barrier(sqlite3_file* f) {
    of(f)->inner()->pMethods->xShmBarrier(of(f)->inner());
}
int x_shm_unmap(sqlite3_file* f, int del) {
    return of(f)->inner()->pMethods->xShmUnmap(of(f)->inner(), del);
}
int x_fetch(sqlite3_file* f, sqlite3_int64 o, int n, void** p) {
    return of(f)->inner()->pMethods->xFetch(of(f)->inner(), o, n, p);
}
int x_unfetch(sqlite3_file* f, sqlite3_int64 o, void* p) {
    return of(f)->inner()->pMethods->xUnfetch(of(f)->inner(), o, p);
}

const sqlite3_io_methods shim_methods = {
    3,          x_close,       x_read,      x_write,   x_truncate, x_sync, x_size,
    x_lock,     x_unlock,      x_reserved,  x_control, x_sector,   x_caps, x_shm_map,
    x_shm_lock, x_shm_barrier, x_shm_unmap, x_fetch,   x_unfetch};

int x_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out) {
    shim_file* s = of(f);
    s->base.pMethods = nullptr;
    s->wal = (flags & SQLITE_OPEN_WAL) != 0;
    const int rc = real->xOpen(real, name, s->inner(), flags, out);
    if (rc == SQLITE_OK && s->inner()->pMethods != nullptr) s->base.pMethods = &shim_methods;
    return rc;
}
int x_delete(sqlite3_vfs*, const char* n, int d) {
    return real->xDelete(real, n, d);
}
int x_access(sqlite3_vfs*, const char* n, int f, int* r) {
    return real->xAccess(real, n, f, r);
}
int x_full(sqlite3_vfs*, const char* n, int sz, char* out) {
    return real->xFullPathname(real, n, sz, out);
}
int x_random(sqlite3_vfs*, int n, char* out) {
    return real->xRandomness(real, n, out);
}
int x_sleep(sqlite3_vfs*, int us) {
    return real->xSleep(real, us);
}
int x_time(sqlite3_vfs*, double* t) {
    return real->xCurrentTime(real, t);
}
int x_error(sqlite3_vfs*, int n, char* out) {
    return real->xGetLastError(real, n, out);
}
int x_time64(sqlite3_vfs*, sqlite3_int64* t) {
    return real->xCurrentTimeInt64(real, t);
}

// Registered as the default while it lives.
struct shim_vfs {
    sqlite3_vfs vfs{};
    shim_vfs() {
        real = sqlite3_vfs_find(nullptr);
        REQUIRE(real != nullptr);
        vfs.iVersion = 2;
        vfs.szOsFile = static_cast<int>(sizeof(shim_file)) + real->szOsFile;
        vfs.mxPathname = real->mxPathname;
        vfs.zName = "delayq-test-failing-sync";
        vfs.xOpen = x_open;
        vfs.xDelete = x_delete;
        vfs.xAccess = x_access;
        vfs.xFullPathname = x_full;
        vfs.xRandomness = x_random;
        vfs.xSleep = x_sleep;
        vfs.xCurrentTime = x_time;
        vfs.xGetLastError = x_error;
        vfs.xCurrentTimeInt64 = x_time64;
        REQUIRE(sqlite3_vfs_register(&vfs, 1) == SQLITE_OK);
    }
    ~shim_vfs() {
        sqlite3_vfs_unregister(&vfs);
        sqlite3_vfs_register(real, 1);
    }
    shim_vfs(const shim_vfs&) = delete;
    shim_vfs& operator=(const shim_vfs&) = delete;
};

}  // namespace

TEST_CASE("fsync: a put whose fsync failed threw, yet its job is in the file and is delivered") {
    temp_dir dir;
    shim_vfs shim;
    delay_queue q(opts(dir.file()));
    REQUIRE(q.put_after("before", "x", 0ms));  // the first sync, which syncs the directory too
    fail_wal_sync = true;
    const auto msg =
        delayq::test::message_of<delayq::sqlite::error>([&] { q.put_after("lost?", "y", 0ms); });
    fail_wal_sync = false;
    CHECK(delayq::test::contains(msg, "fsync of the WAL failed"));
    CHECK_FALSE(q.put_after("lost?", "y", 0ms));  // a retry: it is queued already
    delay_queue other(opts(dir.file()));          // another connection sees it too
    CHECK(other.size() == 2);
    // A put due now is due at the next millisecond (never early): a take may wait that long.
    std::string taken;
    for (int i = 0; i < 2; ++i) {
        auto j = other.take(5s);
        REQUIRE(j);
        taken += j->id + " ";
        CHECK(other.ack(*j));
    }
    CHECK(taken == "before lost? ");
    CHECK_FALSE(other.take(0ms));
}

TEST_CASE(
    "fsync: the callers of one failed group commit each get an exception of their own, of the "
    "right type, with the message") {
    // One caller's put holds its group's fsync while the others queue for the next group, which
    // then commits their puts together and fails together (ENOSPC: disk_full_error). Each caller
    // reads its exception's what() over and over while the others let go of theirs: a shared
    // exception (or a shared message) is a data race that ThreadSanitizer reports.
    temp_dir dir;
    shim_vfs shim;
    delay_queue q(opts(dir.file()));
    REQUIRE(q.put_after("first", "x", 0ms));  // the first sync, which syncs the directory too
    constexpr int n = 6;

    struct caught : delayq::test::caught {
        int code = 0;
    };
    bool grouped = false;
    for (int round = 0; round < 20 && !grouped; ++round) {
        INFO("round " << round);
        std::vector<caught> got(n);
        std::latch all_caught(n);
        std::atomic<int> entered{0};
        const auto put = [&](int i) {
            bool arrived = false;
            try {
                ++entered;
                q.put_after("r" + std::to_string(round) + "-" + std::to_string(i), "y", 0ms);
                got[static_cast<std::size_t>(i)].type = "none";
            } catch (const delayq::sqlite::error& e) {
                caught& c = got[static_cast<std::size_t>(i)];
                c.record(e, dynamic_cast<const delayq::sqlite::disk_full_error*>(&e)
                                ? "disk_full_error"
                                : "other error");
                c.code = e.code();
                all_caught.arrive_and_wait();
                arrived = true;
                c.read_apart(e);
            } catch (...) {
                got[static_cast<std::size_t>(i)].type = "another exception";
            }
            if (!arrived) all_caught.arrive_and_wait();
        };
        fail_wal_errno = ENOSPC;
        hold_next_sync();
        std::vector<std::thread> ts;
        ts.emplace_back(put, 0);  // leads a group of its own, and waits in its fsync
        wait_until_held();
        fail_wal_sync = true;
        const int syncs_before = wal_syncs;
        for (int i = 1; i < n; ++i) ts.emplace_back(put, i);
        while (entered < n) std::this_thread::yield();
        // Not a bound: a caller late for the next group only makes this round not count.
        std::this_thread::sleep_for(300ms);
        release_sync();
        for (auto& t : ts) t.join();
        fail_wal_sync = false;
        fail_wal_errno = 0;
        // The syncs of the others' groups: fewer than the callers, some shared a commit.
        const int groups = wal_syncs - syncs_before - 1;
        INFO("the " << (n - 1) << " later callers made " << groups << " group(s)");
        grouped = groups < n - 1;

        for (const caught& c : got) {
            INFO(c.type << ": " << c.message);
            REQUIRE(c.type == "disk_full_error");
            CHECK(c.code == SQLITE_IOERR_FSYNC);
            CHECK(delayq::test::contains(c.message, "the disk is full (fsync of the WAL failed"));
        }
        delayq::test::check_apart(got);
    }
    CHECK(grouped);
    // The puts were committed before their fsync failed: each is in the file.
    CHECK(q.size() >= static_cast<std::size_t>(1 + n));
}
