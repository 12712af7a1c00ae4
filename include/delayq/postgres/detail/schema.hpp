// The tables of delayq::postgres (schema version 1), their creation on first use, and the
// statements the queue runs. Part of <delayq/postgres/delay_queue.hpp>.
//
// The layout. All queues of one database live in one schema (options::schema, "delayq" by
// default), told apart by a `queue` column:
//
// clang-format off
//   meta   name text PRIMARY KEY, value bigint: 'version', the schema's version (1)
//   jobs   queue text, id bytea, payload bytea, at bigint, attempts integer, token bigint,
//          last_error bytea NULL, PRIMARY KEY (queue, id)
//          waiting (token = 0): `at` is when it is due
//          leased  (token > 0): `at` is when the lease ends (extend moves it); `token` the
//                   lease's fencing token
//          last_error: the last reason a nack or bury gave (NULL: none yet)
//          repeat text NULL, due bigint NULL: a run of a series (put_every, put_cron): its
//          schedule (detail/job_queue/repeat.hpp) and the time it was due, which `at` no longer
//          says once it is leased or retried; NULL for a job of its own
//   jobs_at ON jobs(queue, at)           -- the next due job, the next ended lease: one seek
//   dead   queue text, id bytea, payload bytea, attempts integer, died bigint,
//          last_error bytea NULL,        -- the job's, or lease_ended_reason
//          PRIMARY KEY (queue, id)       -- past max_attempts, or buried
//   dead_died ON dead(queue, died, id)   -- the dead letters in the order they died: dead(),
//                                        -- purge_dead(), keep_dead
//   tokens a sequence: the fencing tokens
//   paused queue text PRIMARY KEY, since bigint: the queues whose takes are paused (pause()),
//          since when (ms); a row per paused queue, so a handful of rows at most
//   jobs_leased ON jobs(queue, at) WHERE token <> 0
//                                        -- the leases alone: max_leased counts those not ended
//                                        -- and finds the first to end, stats() counts them
//   grants queue text, at bigint, n integer: the leases that objects with a rate made (n at
//          `at`, ms), trimmed of those older than the period by the claims that read them
//   grants_at ON grants(queue, at)
//   next_run(text, bigint, bigint) a function: the next run of a series (next_run_sql)
// clang-format on
//
// Why one `at` column for both states: a take claims every row whose `at` has passed, in order
// of `at`: a waiting job that came due and a lease that ended (a redelivery, or a move to the dead
// letters after its max_attempts-th delivery) alike, with one index seek and no separate reclaim
// pass. The next event a waiting consumer sleeps until is min(at), one seek too.
//
// Times are milliseconds since 1970 on the server's clock (clock_timestamp(); see now_cte for the
// rounding that keeps every job from being early); a put's absolute deadline is the caller's,
// rounded up.
// Fencing tokens are nextval('tokens') * 65536 plus 16 random bits: greater at each lease, and a
// value that a crash or a failover handed out again (a sequence may repeat values whose
// transaction was lost) still differs from the lost lease's token but for a 1 in 65 536 chance.
//
// Names. The schema is any name of ASCII letters, digits and `_` (delay_queue checks it), always
// written quoted ("user", "Order" and "group" are schemas like any other; case is kept); the
// statement builders below take it quoted (quote_ident). The queue's name is text: the queue's own
// connections speak UTF-8 (session_sql), and the put on the caller's connection sends the name as
// bytes that the server reads as UTF-8, whatever the caller's client_encoding.
//
// Creation and upgrades. The first object to connect to a database without the schema creates it
// in one transaction, under a transaction-level advisory lock, so that processes starting at once
// all succeed with one schema. An object that finds another version refuses to run
// (schema_version_error). A later version will upgrade version 1 in place under the same lock, in
// one transaction; docs/postgres.md ("Upgrading") says how to do it by hand.
//
// The last_error columns and dead_died are additions to version 1 that an older delayq neither
// reads nor minds (a nullable column that no statement of it names, an index): version 1 made
// before them gets them when an object first connects (upgrade_sql), and stays version 1. The
// catalogs are read first, and the DDL runs only when something is missing: ALTER TABLE and
// CREATE INDEX take their table's lock (ACCESS EXCLUSIVE, SHARE) even when IF NOT EXISTS finds
// the column or index there, which at every open would stall every process's calls.
//
// The paused table is such an addition too, made the same way (it needs CREATE on the schema,
// not ownership of the tables). Why a table and not a row of meta or a column of each job: the
// claim reads it on every take, so it must be a probe of a key that nothing else writes (a take
// never waits for a pause, nor a pause for the takes), and a pause must be one row, whatever the
// queue holds. An older delayq neither reads nor minds it: its takes go on while the queue is
// paused (docs/postgres.md, "Pausing").
//
// jobs_leased and grants are additions too, for options::limits, made the same way (the index needs
// ownership of jobs, the table CREATE on the schema). Why a partial index and not a counter row:
// every lease, ack and nack of every object would update the one row of its queue, and the
// queue's writers would queue behind each other for it; the partial index holds one entry per
// lease, which the lease writes anyway (its `at` moves), and a count of the leases not ended is a
// range of it, as long as the consumers hold leases, however many jobs wait. The grants are a table
// of their own, not columns of the jobs: a lease's grant must outlive its job (an ack within the
// period still counts), and a claim reads the window, at most `rate` rows, not the jobs. An older
// delayq neither reads nor minds them (it keeps no limits).
//
// The repeat and due columns and the function next_run are additions too, for repeatable jobs,
// made the same way (the columns need ownership of jobs, the function CREATE on the schema; it
// gets EXECUTE for the roles that have privileges on jobs, beside PUBLIC's default). The next run
// of a series is made by the statement that ends the run before it (an ack, ack_many, a nack of
// the last attempt, a bury, a claim that buries a last lease that ended: next_run_set_sql), so the
// server computes it there: hence a function in SQL, not the C++ of repeat.hpp, which it matches
// exactly. Why `due` beside `at`: an every-series stays in phase with its first run, and once a
// run is leased (or retried by a nack) `at` is its lease's end (or its retry's time). An older
// delayq neither reads nor writes them: its puts are jobs of their own, and its ack of a run
// removes it without making the next one (the series ends), so every process of a queue that
// runs series needs this version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "../../job.hpp"
#include "connection.hpp"

namespace delayq::postgres::detail {

inline constexpr long long schema_version = 1;
inline constexpr int oldest_server = 120000;  // PostgreSQL 12

// The advisory lock key that serializes creating (and later upgrading) the schema: "delayq" in
// ASCII, as every delayq version spells it.
inline constexpr long long schema_lock_key = 0x64656c617971LL;

/// Throws server_version_error for a server older than PostgreSQL 12 (`version` as
/// PQserverVersion gives it, e.g. 150004).
inline void check_server_version(int version) {
    if (version < oldest_server)
        raise(problem::server_version,
              "the server is PostgreSQL " + std::to_string(version / 10000) + " (version " +
                  std::to_string(version) + "); delayq::postgres needs PostgreSQL 12 or later",
              "");
}

// `schema` as an SQL identifier: quoted, so that reserved words and capitals are names like any
// other. The caller has checked that it holds only ASCII letters, digits and `_`.
inline std::string quote_ident(const std::string& schema) {
    return '"' + schema + '"';
}

// The paused table of schema `s` (quoted), for create_sql and upgrade_sql.
inline std::string paused_table_sql(const std::string& s) {
    return "CREATE TABLE IF NOT EXISTS " + s +
           ".paused(queue text PRIMARY KEY, since bigint NOT NULL)";
}

// The partial index of the leases (see "The layout" above), for create_sql and upgrade_sql.
inline std::string leased_index_sql(const std::string& s) {
    return "CREATE INDEX IF NOT EXISTS jobs_leased ON " + s + ".jobs(queue, at) WHERE token <> 0";
}

// The grants table and its index, for create_sql and upgrade_sql.
inline std::string grants_table_sql(const std::string& s) {
    return "CREATE TABLE IF NOT EXISTS " + s +
           ".grants(queue text NOT NULL, at bigint NOT NULL, n integer NOT NULL);"
           "CREATE INDEX IF NOT EXISTS grants_at ON " +
           s + ".grants(queue, at)";
}

inline std::string max_ms_sql() {
    return "99999999999999";  // delayq::detail::max_ms
}

// The columns of a run of a series (see "The layout"), for create_sql and upgrade_sql.
inline constexpr const char* repeat_columns_sql =
    "ADD COLUMN IF NOT EXISTS repeat text, "
    "ADD COLUMN IF NOT EXISTS due bigint";

// The function next_run(schedule, due, now) of schema `s` (quoted): the ms of the run after one
// due at `due` that ended at `now`, for a schedule as detail/job_queue/repeat.hpp writes it, or
// NULL for a text it cannot read (the series ends), exactly as next_run() there says, clamped
// to delayq's end of time (max_ms_sql). It never fails on any input: it runs inside the acks.
//
// "e<ms>": in numeric, so that no text (however many digits) overflows. "c<masks>": the masks
// are read as cron::from_masks reads them (at most 7 fields of digits, a field's value at most
// 2^40 * 10 + 9 since it stops reading past 2^40; bits past each mask's width dropped), and the
// search is cron::next_after's, from the minute after `now`, over the same 366 * 8 days, and first
// from the minute after 1970-01-01T00:00 (from_masks refuses masks that find nothing there). The
// calendar is integer arithmetic (the civil date of a day number, Howard Hinnant's), not date
// and interval, whose conversions read the session's time zone: IMMUTABLE is true of it. The
// search walks months, not days: a month's matching days are one mask (the days of the month,
// and the weekdays spread over them from the weekday of its 1st), so a rare day (29 February)
// costs at most 97 steps, not 2 928. Its search_path is pg_catalog's alone: the caller's own
// (a function or operator of the same name in a schema it lists) cannot change what it does.
inline std::string next_run_sql(const std::string& s) {
    return "CREATE OR REPLACE FUNCTION " + s +
           R"sql(.next_run(sched text, due_ms bigint, now_ms bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
  f text[]; v bigint[] := ARRAY[0, 0, 0, 0, 0, 0, 0]; p numeric;
  mins bigint; hrs bigint; doms bigint; mons bigint; dows bigint; either boolean;
  mfirst int; hfirst int; fm bigint; d0 bigint; h0 int; m0 int; hi bigint; res bigint;
  z bigint; era bigint; doe bigint; yoe bigint; doy bigint; mp bigint; y bigint; mo int;
  base bigint; dim int; w1 int; p7 bigint; dm bigint; k int;
BEGIN
  IF sched IS NULL OR length(sched) < 2 THEN RETURN NULL; END IF;
  IF left(sched, 1) = 'e' THEN
    IF due_ms IS NULL OR now_ms IS NULL OR substr(sched, 2) !~ '^[0-9]+$' THEN
      RETURN NULL;
    END IF;
    p := substr(sched, 2)::numeric;
    IF p = 0 THEN RETURN NULL; END IF;
    IF due_ms > now_ms THEN RETURN least(due_ms + p, )sql" +
           max_ms_sql() + R"sql(); END IF;
    RETURN least(due_ms + (div(now_ms::numeric - due_ms, p) + 1) * p, )sql" +
           max_ms_sql() + R"sql();
  END IF;
  IF sched !~ '^c[0-9]*(:[0-9]*){6}$' OR now_ms IS NULL OR now_ms < 0
     OR now_ms > )sql" +
           max_ms_sql() + R"sql( THEN
    RETURN NULL;
  END IF;
  f := string_to_array(substr(sched, 2), ':');
  FOR i IN 1..7 LOOP
    IF f[i] <> '' THEN
      p := f[i]::numeric;
      IF div(p, 10) > 1099511627776 THEN RETURN NULL; END IF;
      v[i] := p;
    END IF;
  END LOOP;
  mins := (v[1] & 1073741823) | ((v[2] & 1073741823) << 30);
  hrs := v[3] & 16777215;
  doms := v[4] & 4294967294;
  mons := v[5] & 8190;
  dows := v[6] & 127;
  either := (v[7] & 3) = 0;
  IF mins = 0 OR hrs = 0 THEN RETURN NULL; END IF;
  mfirst := strpos(reverse(mins::bit(64)::text), '1') - 1;
  hfirst := strpos(reverse(hrs::bit(64)::text), '1') - 1;
  FOR pass IN 1..2 LOOP
    fm := CASE WHEN pass = 1 THEN 1 ELSE now_ms / 60000 + 1 END;
    d0 := fm / 1440; h0 := (fm % 1440) / 60; m0 := fm % 60;
    hi := d0 + 2927; res := NULL;
    z := d0 + 719468; era := z / 146097; doe := z - era * 146097;
    yoe := (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy := doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp := (5 * doy + 2) / 153;
    mo := CASE WHEN mp < 10 THEN mp + 3 ELSE mp - 9 END;
    y := yoe + era * 400 + CASE WHEN mo <= 2 THEN 1 ELSE 0 END;
    base := d0 - (doy - (153 * mp + 2) / 5);
    WHILE res IS NULL AND base <= hi LOOP
      dim := CASE WHEN mo = 2 THEN CASE WHEN y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0)
             THEN 29 ELSE 28 END WHEN mo IN (4, 6, 9, 11) THEN 30 ELSE 31 END;
      IF (mons >> mo) & 1 = 1 THEN
        w1 := (base + 4) % 7;
        p7 := ((dows >> w1) | (dows << (7 - w1))) & 127;
        dm := (p7 << 1) | (p7 << 8) | (p7 << 15) | (p7 << 22) | (p7 << 29);
        dm := CASE WHEN either THEN doms | dm ELSE doms & dm END;
        dm := dm & ((1::bigint << (dim + 1)) - 2);
        IF d0 > base THEN dm := dm & ~((1::bigint << (d0 - base + 1)::int) - 1); END IF;
        IF hi < base + dim - 1 THEN dm := dm & ((1::bigint << (hi - base + 2)::int) - 1); END IF;
        WHILE dm <> 0 LOOP
          k := strpos(reverse(dm::bit(64)::text), '1') - 1;
          IF base + k - 1 > d0 THEN
            res := (base + k - 1) * 1440 + hfirst * 60 + mfirst;
          ELSIF (hrs >> h0) & 1 = 1 AND mins >> m0 <> 0 THEN
            res := d0 * 1440 + h0 * 60 + m0
                   + strpos(reverse((mins >> m0)::bit(64)::text), '1') - 1;
          ELSIF hrs >> (h0 + 1) <> 0 THEN
            res := d0 * 1440 + mfirst
                   + (h0 + strpos(reverse((hrs >> (h0 + 1))::bit(64)::text), '1')) * 60;
          END IF;
          EXIT WHEN res IS NOT NULL;
          dm := dm & (dm - 1);
        END LOOP;
      END IF;
      base := base + dim;
      IF mo = 12 THEN mo := 1; y := y + 1; ELSE mo := mo + 1; END IF;
    END LOOP;
    IF res IS NULL THEN RETURN NULL; END IF;
  END LOOP;
  RETURN least(res * 60000, )sql" +
           max_ms_sql() + R"sql();
END
$f$)sql";
}

// The SQL that creates version 1 in schema `s` (quoted), and the schema itself unless
// `schema_exists` (CREATE SCHEMA needs CREATE on the database even when the schema is there).
inline std::string create_sql(const std::string& s, bool schema_exists) {
    return (schema_exists ? std::string() : "CREATE SCHEMA IF NOT EXISTS " + s + ";") +
           "CREATE TABLE IF NOT EXISTS " + s +
           ".meta(name text PRIMARY KEY, value bigint NOT NULL);" + "CREATE TABLE IF NOT EXISTS " +
           s +
           ".jobs(queue text NOT NULL, id bytea NOT NULL, payload bytea NOT NULL,"
           " at bigint NOT NULL, attempts integer NOT NULL DEFAULT 0,"
           " token bigint NOT NULL DEFAULT 0, last_error bytea, repeat text, due bigint,"
           " PRIMARY KEY (queue, id));" +
           "CREATE INDEX IF NOT EXISTS jobs_at ON " + s + ".jobs(queue, at);" +
           "CREATE TABLE IF NOT EXISTS " + s +
           ".dead(queue text NOT NULL, id bytea NOT NULL, payload bytea NOT NULL,"
           " attempts integer NOT NULL, died bigint NOT NULL, last_error bytea,"
           " PRIMARY KEY (queue, id));" +
           "CREATE INDEX IF NOT EXISTS dead_died ON " + s + ".dead(queue, died, id);" +
           "CREATE SEQUENCE IF NOT EXISTS " + s + ".tokens;" + paused_table_sql(s) + ";" +
           leased_index_sql(s) + ";" + grants_table_sql(s) + ";" + next_run_sql(s) + ";" +
           "INSERT INTO " + s + ".meta(name, value) VALUES ('version', " +
           std::to_string(schema_version) + ") ON CONFLICT (name) DO NOTHING;";
}

// The version in schema `schema`'s meta table (0: a meta table without one, not ours). Throws
// the server's error, typed, when it cannot be read.
inline long long read_version(connection& c, const std::string& schema) {
    result r = c.exec_simple(
        "SELECT value::text FROM " + quote_ident(schema) + ".meta WHERE name = 'version'",
        "reading the schema");
    if (r.rows() == 0) return 0;       // a meta table without a version: not ours
    return std::stoll(r.bytes(0, 0));  // simple protocol: text
}

// Which additions to version 1 schema `schema` (unquoted) lacks (see "Creation and upgrades"
// above): a read of pg_catalog, which every role may read and which locks no table.
struct missing_additions {
    bool last_errors = false;  // a last_error column, or the dead_died index
    bool paused = false;       // the paused table
    bool leased = false;       // the jobs_leased index
    bool grants = false;       // the grants table
    bool repeat = false;       // the repeat and due columns of jobs
    bool next_run = false;     // the function next_run
    bool any() const noexcept {
        return last_errors || paused || leased || grants || repeat || next_run;
    }
};
inline missing_additions lacks_additions(connection& c, const std::string& schema) {
    // `schema` holds only letters, digits and `_`: it needs no escaping in a literal.
    const result r = c.exec_simple(
        "SELECT (SELECT count(*) FROM pg_catalog.pg_class t JOIN pg_catalog.pg_attribute a ON "
        "a.attrelid = t.oid WHERE t.relnamespace = n.oid AND t.relname IN ('jobs', 'dead') AND "
        "a.attname = 'last_error' AND NOT a.attisdropped) = 2 AND EXISTS (SELECT 1 FROM "
        "pg_catalog.pg_class i WHERE i.relnamespace = n.oid AND i.relname = 'dead_died'), "
        "EXISTS (SELECT 1 FROM pg_catalog.pg_class p WHERE p.relnamespace = n.oid AND p.relname "
        "= 'paused'), EXISTS (SELECT 1 FROM pg_catalog.pg_class l WHERE l.relnamespace = n.oid "
        "AND l.relname = 'jobs_leased'), EXISTS (SELECT 1 FROM pg_catalog.pg_class g WHERE "
        "g.relnamespace = n.oid AND g.relname = 'grants'), (SELECT count(*) FROM "
        "pg_catalog.pg_class "
        "t JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid WHERE t.relnamespace = n.oid AND "
        "t.relname = 'jobs' AND a.attname IN ('repeat', 'due') AND NOT a.attisdropped) = 2, EXISTS "
        "(SELECT 1 FROM pg_catalog.pg_proc f WHERE f.pronamespace = n.oid AND f.proname = "
        "'next_run') FROM pg_catalog.pg_namespace n WHERE "
        "n.nspname = '" +
            schema + "'",
        "reading the catalogs");
    missing_additions m;
    m.last_errors = r.rows() == 0 || r.bytes(0, 0) != "t";  // simple protocol: text
    m.paused = r.rows() == 0 || r.bytes(0, 1) != "t";
    m.leased = r.rows() == 0 || r.bytes(0, 2) != "t";
    m.grants = r.rows() == 0 || r.bytes(0, 3) != "t";
    m.repeat = r.rows() == 0 || r.bytes(0, 4) != "t";
    m.next_run = r.rows() == 0 || r.bytes(0, 5) != "t";
    return m;
}

// The upgrade that adds what lacks_additions() found missing, to schema `s` (quoted): one
// statement, so one transaction under one statement_timeout, that looks again under the schema's
// advisory lock and runs only the DDL still needed. Objects that open at once wait for the first,
// then find nothing to do; no process takes the tables' locks once the upgrade is done. A
// nullable column without a default is a change of the catalogs only (no rewrite); the index is
// built under a SHARE lock on `dead`, which holds back the moves to the dead letters meanwhile
// (docs/postgres.md says how to build it ahead, CONCURRENTLY, for a large dead table).
//
// The paused and grants tables, when they are made here, get the privileges that the jobs table
// has (its ACL, or its owner's default): a role that was granted the use of the tables before this
// upgrade may still take, which reads them, pause, and lease under a rate. Granted by the role
// that makes them, their owner. The jobs_leased index is built under a SHARE lock on `jobs`, a
// read of every job once, which holds back the queue's writes meanwhile (docs/postgres.md says
// how to build it ahead, CONCURRENTLY, for a large queue).
//
// The repeat and due columns are nullable, without a default: a change of the catalogs only.
// The function next_run, when it is made here, gets EXECUTE for every role that has a privilege
// on jobs: PUBLIC has it by default, but not where default privileges took that away.
inline std::string upgrade_sql(const std::string& s) {
    const auto lacks_column = [&](const char* table) {
        return "IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = '" + s + "." +
               table + "'::regclass AND attname = 'last_error' AND NOT attisdropped) THEN " +
               "ALTER TABLE " + s + "." + table + " ADD COLUMN last_error bytea; END IF; ";
    };
    const auto grant_as_jobs = [&](const char* table) {
        return "FOR g IN SELECT a.grantee, a.privilege_type FROM pg_catalog.pg_class c, "
               "aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a WHERE c.oid = '" +
               s + ".jobs'::regclass AND a.grantee <> (SELECT oid FROM pg_catalog.pg_roles WHERE " +
               "rolname = current_user) LOOP EXECUTE format('GRANT %s ON " + s + "." + table +
               " TO %s', g.privilege_type, CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE " +
               "quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END); END LOOP; ";
    };
    return "DO $dq$DECLARE g record; BEGIN PERFORM pg_advisory_xact_lock(" +
           std::to_string(schema_lock_key) + "); " + lacks_column("jobs") + lacks_column("dead") +
           "IF to_regclass('" + s + ".dead_died') IS NULL THEN CREATE INDEX dead_died ON " + s +
           ".dead(queue, died, id); END IF; IF to_regclass('" + s + ".paused') IS NULL THEN " +
           paused_table_sql(s) + "; " + grant_as_jobs("paused") + "END IF; IF to_regclass('" + s +
           ".jobs_leased') IS NULL THEN " + leased_index_sql(s) + "; END IF; IF to_regclass('" + s +
           ".grants') IS NULL THEN " + grants_table_sql(s) + "; " + grant_as_jobs("grants") +
           "END IF; IF (SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = '" + s +
           ".jobs'::regclass AND attname IN ('repeat', 'due') AND NOT attisdropped) < 2 THEN " +
           "ALTER TABLE " + s + ".jobs " + repeat_columns_sql + "; END IF; IF to_regprocedure('" +
           s + ".next_run(text, bigint, bigint)') IS NULL THEN " + next_run_sql(s) + "; " +
           "FOR g IN SELECT DISTINCT a.grantee FROM pg_catalog.pg_class c, aclexplode(coalesce(" +
           "c.relacl, acldefault('r', c.relowner))) a WHERE c.oid = '" + s +
           ".jobs'::regclass AND a.grantee <> (SELECT oid FROM pg_catalog.pg_roles WHERE " +
           "rolname = current_user) LOOP EXECUTE format('GRANT EXECUTE ON FUNCTION " + s +
           ".next_run(text, bigint, bigint) TO %s', CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE " +
           "quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END); END LOOP; END IF; END$dq$";
}

// What the catalogs say of schema `schema` and its meta table, and what the role may do with
// them: a query of pg_catalog, which every role may read.
struct schema_state {
    bool exists = false, usage = false;      // the schema; USAGE on it
    bool meta = false, meta_select = false;  // its meta table; SELECT on it
    std::string role;                        // current_user
};
inline schema_state probe_schema(connection& c, const std::string& schema) {
    // `schema` holds only letters, digits and `_`: it needs no escaping in a literal.
    const result r = c.exec_simple(
        "SELECT n.oid IS NOT NULL, coalesce(has_schema_privilege(n.oid, 'USAGE'), false), m.oid "
        "IS NOT NULL, coalesce(has_table_privilege(m.oid, 'SELECT'), false), current_user FROM "
        "(SELECT 1) o LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = '" +
            schema +
            "' LEFT JOIN pg_catalog.pg_class m ON m.relnamespace = n.oid AND m.relname = 'meta'",
        "reading the catalogs");
    schema_state st;
    st.exists = r.bytes(0, 0) == "t";
    st.usage = r.bytes(0, 1) == "t";
    st.meta = r.bytes(0, 2) == "t";
    st.meta_select = r.bytes(0, 3) == "t";
    st.role = r.bytes(0, 4);
    return st;
}

// Makes sure schema `schema` (unquoted) holds version 1 of the tables, creating them if needed.
// A privilege that is missing is named: the schema's USAGE, the meta table's SELECT, or what the
// creation needs.
inline void ensure_schema(connection& c, const std::string& schema) {
    const std::string s = quote_ident(schema);
    long long v = -1;
    try {
        v = read_version(c, schema);
    } catch (const std::exception&) {
        if (c.broken()) throw;
        // Not created yet (42P01, 3F000), or not readable: the catalogs tell which.
        const schema_state st = probe_schema(c, schema);
        if (st.exists && !st.usage)
            raise(problem::permission,
                  "role " + st.role + " lacks USAGE on schema " + s + ", which holds the queue (" +
                      "GRANT USAGE ON SCHEMA " + s + " TO " + st.role + ")",
                  "42501");
        if (st.meta && !st.meta_select)
            raise(problem::permission,
                  "role " + st.role + " lacks SELECT on table " + s + ".meta, which holds the " +
                      "version of the queue's tables (GRANT SELECT ON " + s + ".meta TO " +
                      st.role + ")",
                  "42501");
        // There and readable: made by another process since the read failed (read it again),
        // or the failure was something else (which the second read throws again).
        if (!st.meta)
            c.exec_simple("BEGIN; SELECT pg_advisory_xact_lock(" + std::to_string(schema_lock_key) +
                              ");" + create_sql(s, st.exists) + "COMMIT;",
                          st.exists ? "creating the queue's tables in the existing schema (needs "
                                      "CREATE on the schema)"
                                    : "creating the queue's schema and tables (needs CREATE on the "
                                      "database, or the schema created ahead with CREATE on it)");
        v = read_version(c, schema);
    }
    if (v != schema_version)
        raise(problem::schema_version,
              "schema " + s + " holds delayq tables of version " + std::to_string(v) +
                  "; this delayq reads version " + std::to_string(schema_version) +
                  (v > schema_version ? " (written by a newer delayq: upgrade delayq)"
                                      : " (see \"Upgrading\" in docs/postgres.md)"),
              "");
    const missing_additions m = lacks_additions(c, schema);
    if (m.any()) {
        // What the upgrade adds, and the privileges it needs: named in its error.
        std::vector<std::string> what;
        if (m.last_errors) what.emplace_back("the last_error columns and the dead_died index");
        if (m.paused) what.emplace_back("the table paused");
        if (m.leased) what.emplace_back("the index jobs_leased");
        if (m.grants) what.emplace_back("the table grants");
        if (m.repeat) what.emplace_back("the repeat and due columns of jobs");
        if (m.next_run) what.emplace_back("the function next_run");
        const bool own = m.last_errors || m.leased || m.repeat,
                   create = m.paused || m.grants || m.next_run;
        const std::string needs = std::string(own ? "ownership of the tables" : "") +
                                  (own && create ? " and " : "") +
                                  (create ? "CREATE on schema " + s : "");
        std::string list;
        for (std::size_t i = 0; i < what.size(); ++i)
            list += (i == 0 ? "" : i + 1 == what.size() ? " and " : ", ") + what[i];
        const std::string doing = "adding " + list + " to the queue's tables (needs " + needs +
                                  "; see \"The tables, and upgrading\" in docs/postgres.md)";
        c.exec_simple(upgrade_sql(s), doing.c_str());
    }
}

// The settings of the queue's own connections, sent once after connecting. Every statement is
// a few index probes by design, over a table whose contents change by the millisecond, so its
// statistics say little (none at all on a new table): a plan chosen from them (a scan of every
// waiting job to ack ten, a walk of the whole queue to find the rows just claimed) can cost a
// thousand times the probes. So the statements are written so that the probes are the only
// plans left (a key lookup per element, LATERAL; rows already found are updated where they lie,
// by ctid; a LATERAL lookup ends in LIMIT 1, which keeps the planner from turning it into a
// join it may reorder), the planner may not fall back to reading the table (no sequential or bitmap
// scans), each statement is planned once per connection (generic plans: a custom plan of the claim
// costs more than running it), and JIT compilation, which a penalized plan's cost would trigger, is
// off. And the connection speaks UTF-8, whatever PGCLIENTENCODING or the conninfo say: the queue's
// name is text, and its bytes must mean the same on every connection.
inline constexpr const char* session_sql =
    "SET plan_cache_mode = force_generic_plan; SET jit = off; SET enable_seqscan = off; "
    "SET enable_bitmapscan = off; SET client_encoding = 'UTF8'";

// Sets a new connection of the queue up (session_sql), in one round trip; returns the server
// process that answered (pg_backend_pid()). Where it is not the process the connection was
// given at connect (PQbackendPID), something between speaks for the server: a pooler.
inline long long set_up_session(connection& c) {
    const result r = c.exec_simple(std::string(session_sql) + "; SELECT pg_backend_pid()",
                                   "setting up a connection");
    return std::stoll(r.bytes(0, 0));  // simple protocol: text
}

// The probe for a pooler that does not give each connection a session of its own, run once by an
// object whose connection `c` is answered by server process `pid` that is not the one libpq was
// given: `other`, a second connection made just now, asks which server process answers it. With
// no pooler, or one in session mode, it is another process, since `c` holds `pid` for as long as
// it lives. A pooler in transaction or statement mode gave `pid` back to its pool when `c`'s last
// statement ended, and hands out the most recently freed server connection first (pgbouncer's
// default, server_round_robin = 0): `other` is answered by `pid`.
inline void check_own_session(connection& other, long long pid) {
    const result r = other.exec_simple("SELECT pg_backend_pid()", "looking for a pooler");
    if (std::stoll(r.bytes(0, 0)) == pid) raise(problem::other, pooler_message, "");
}

// The server's clock, read once, in ms since 1970: `now` rounded down, to judge what is due (a
// job due at `at` is handed out once now >= at: never early), and `up` rounded up, to add a delay
// to (a job due `d` ms from now is due at up + d, never before the call's time plus d; with now +
// d it could be due up to a millisecond early).
inline constexpr const char* now_cte =
    "t AS (SELECT floor(c.ms)::bigint AS now, ceil(c.ms)::bigint AS up FROM (SELECT "
    "extract(epoch FROM clock_timestamp()) * 1000 AS ms) c)";

// The same, for a statement whose commit need not wait for the disk (a lease, an ack, a nack
// when options::durable_leases is false, a wake-up): synchronous_commit is off for its
// transaction only, so it is visible at once and on disk within the server's wal_writer_delay. A
// crash of the server may undo the last of them, which means a redelivery; it never undoes a put
// or a cancel, whose commits wait, and whose flush carries every earlier commit with it.
inline std::string lease_now_cte(bool durable) {
    std::string cte = now_cte;
    if (!durable)  // one more column of t, so that the clock is read as now_cte reads it
        cte.insert(cte.find(" FROM (SELECT"),
                   ", set_config('synchronous_commit', 'off', true) AS async");
    return cte;
}

// An object's options::limits as its statements are built for them, and the channel that its
// settles NOTIFY. The numbers are constants of the statements' text, as keep_dead's are: they are
// the object's own for its life, and a statement that reads only the limits it has costs an
// object without limits nothing.
struct limit_settings {
    long long max_leased = 0;  // 0: none
    long long rate = 0;        // 0: none
    long long period = 0;      // ms, > 0 with a rate
    std::string channel;       // the queue's (a plain identifier: a literal as it is)
    bool any() const noexcept { return max_leased > 0 || rate > 0; }
};

// The NOTIFY that a settle by an object with limits sends, once, when CTE `from` has a row: a
// place under max_leased may have come free, and takes that a limit holds back, in every process,
// claim again at its commit. Empty without limits. `n` names the CTE, which the statement's
// answer must read (a CTE that nothing reads is not run).
inline std::string settle_notify_sql(const limit_settings& l, const std::string& from) {
    if (!l.any()) return "";
    return ", n AS (SELECT pg_notify('" + l.channel + "', '') FROM " + from + " LIMIT 1)";
}

// The insert of one job: $1 queue (text; or `queue`, an expression of $1), $2 id, $3 payload, $4
// due (ms) or delay, $5 whether $4 is a delay. Inserts nothing when the id is queued.
inline std::string insert_one_sql(const std::string& s, const char* queue = "$1") {
    return "INSERT INTO " + s + ".jobs(queue, id, payload, at) SELECT " + queue +
           ", $2, $3, least(CASE WHEN $5 THEN t.up ELSE 0 END + $4, " + max_ms_sql() +
           ") FROM t ON CONFLICT DO NOTHING";
}

// put: insert_one_sql's parameters; the wake-up (wake_sql) follows in a transaction of its own.
inline std::string put_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) + " " + insert_one_sql(s);
}

// The put in the caller's transaction: put_sql's parameters, but $1 the queue's name as bytea
// in UTF-8 (the caller's connection may have any client_encoding, which a text parameter would be
// read in), and with `notify` $6 the channel. With `notify` it notifies whenever it inserted, at
// the caller's commit (see the top of delay_queue.hpp). Returns (inserted, notified).
inline std::string put_in_transaction_sql(const std::string& s, bool notify) {
    const std::string insert = insert_one_sql(s, "convert_from($1, 'UTF8')");
    if (!notify)
        return "WITH " + std::string(now_cte) + ", i AS (" + insert +
               " RETURNING 1) SELECT (SELECT count(*) FROM i), 0::bigint";
    return "WITH " + std::string(now_cte) + ", i AS (" + insert +
           " RETURNING 1), n AS (SELECT pg_notify($6, '') FROM i) SELECT (SELECT count(*) FROM "
           "i), (SELECT count(*) FROM n)";
}

// put_many: $1 queue, $2 ids, $3 payloads, $4 delays. Inserts the first job of each id that is
// not queued; returns the ids inserted.
inline std::string put_many_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) + " INSERT INTO " + s +
           ".jobs(queue, id, payload, at) SELECT DISTINCT ON (u.id) $1, u.id, u.payload, "
           "least(t.up + greatest(u.delay, 0), " +
           max_ms_sql() +
           ") FROM t, unnest($2::bytea[], $3::bytea[], $4::bigint[]) WITH ORDINALITY AS u(id, "
           "payload, delay, ord) ORDER BY u.id, u.ord ON CONFLICT DO NOTHING RETURNING id";
}

// put_every, put_cron: $1 queue, $2 id, $3 payload, $4 the schedule (detail/job_queue/repeat.hpp).
// The first run, due at next_run($4) from now (rounded up, as a put's delay): a period from now,
// or the first minute the expression matches. Inserts nothing when the id is queued (or, which
// the caller's check of the schedule rules out, when next_run cannot read it). The wake-up
// follows (wake_sql).
inline std::string put_repeat_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) + ", n AS MATERIALIZED (SELECT " + s +
           ".next_run($4, t.up, t.up) AS at FROM t) INSERT INTO " + s +
           ".jobs(queue, id, payload, at, repeat, due) SELECT $1, $2, $3, n.at, $4, n.at FROM n "
           "WHERE n.at IS NOT NULL ON CONFLICT DO NOTHING";
}

// The wake-up that follows a put, put_many, reschedule, nack or requeue_dead, in a transaction of
// its own that starts after theirs committed: $1 queue, $2 the ids they wrote, $3 the channel.
// NOTIFY unless the earliest waiting job among the ids has another job (waiting, or leased) due
// before it and after now: the consumers already wake for that one, or were told of it.
//
// Why after the commit, in a snapshot of its own: a consumer sleeps until the earliest `at` its
// last claim saw. A job that a statement sees may be gone (acked, cancelled) before that
// statement commits, and a consumer that claims in between sees neither the job nor the new one,
// and sleeps past it. A job that this later snapshot sees was committed before the consumer's
// claim or after it; before: the claim saw it (nothing deletes it before this snapshot); after:
// it was written by a put, reschedule, nack or requeue_dead whose own wake-up asks the same about
// an earlier job (the order by (at, id) is strict, so the chain ends), or by a claim, whose row was
// due earlier still. So every consumer is woken, or wakes, by the time the job is due. The witness
// must lie after now: a due job that a consumer saw has been handed out or is being handled.
//
// No NOTIFY while the queue is paused: its consumers would claim nothing, in every process. The
// resume notifies instead (resume_sql), and a consumer it wakes claims after it committed, so
// after this write committed too (the write committed before this snapshot, which saw the
// pause, so before the resume).
inline std::string wake_sql(const std::string& s) {
    return "WITH " + lease_now_cte(false) +
           ", b AS (SELECT j.at, j.id FROM unnest($2::bytea[]) AS u(id), LATERAL (SELECT x.at, "
           "x.id FROM " +
           s +
           ".jobs x WHERE x.queue = $1 AND x.id = u.id AND x.token = 0 LIMIT 1) j ORDER BY j.at, "
           "j.id LIMIT 1) SELECT pg_notify($3, '') FROM b, t WHERE NOT EXISTS (SELECT 1 FROM " +
           s + ".paused z WHERE z.queue = $1) AND (b.at <= t.now OR NOT EXISTS (SELECT 1 FROM " +
           s +
           ".jobs w WHERE w.queue = $1 AND w.at > t.now AND w.at <= b.at AND (w.at < b.at OR "
           "w.id < b.id)))";
}

// cancel: $1 queue, $2 id. With limits (`l`), it NOTIFYs when the job was leased, its lease not
// ended (settle_notify_sql), and returns (removed, notified); else its command tag counts the
// rows removed.
inline std::string cancel_sql(const std::string& s, const limit_settings& l = {}) {
    if (l.any())
        return "WITH " + std::string(now_cte) + ", a AS (DELETE FROM " + s +
               ".jobs j WHERE j.queue = $1 AND j.id = $2 RETURNING j.token, j.at)" +
               settle_notify_sql(l, "a, t WHERE a.token <> 0 AND a.at > t.now") +
               " SELECT (SELECT count(*) FROM a), (SELECT count(*) FROM n)";
    return "DELETE FROM " + s + ".jobs WHERE queue = $1 AND id = $2";
}

// The cancel in the caller's transaction: cancel_sql's, with $1 the queue's name as bytea in UTF-8
// (as put_in_transaction_sql's).
inline std::string cancel_in_transaction_sql(const std::string& s) {
    return "DELETE FROM " + s + ".jobs WHERE queue = convert_from($1, 'UTF8') AND id = $2";
}

// reschedule: $1 queue, $2 id, $3 delay. The wake-up follows (wake_sql).
inline std::string reschedule_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) + " UPDATE " + s + ".jobs j SET at = least(t.up + $3, " +
           max_ms_sql() + ") FROM t WHERE j.queue = $1 AND j.id = $2 AND j.token = 0";
}

// Moves the jobs in CTE `from` (columns id, payload, attempts, last_error) to the dead letters.
// A dead letter of the same id (one that died before, was put again and died again) is replaced.
// Returns a row per job moved (keep_dead_sql counts them).
inline std::string bury_sql(const std::string& s, const char* from) {
    return "INSERT INTO " + s +
           ".dead(queue, id, payload, attempts, died, last_error) SELECT $1, x.id, x.payload, "
           "x.attempts, t.now, x.last_error FROM " +
           from +
           " x, t ON CONFLICT (queue, id) DO UPDATE SET payload = excluded.payload, attempts = "
           "excluded.attempts, died = excluded.died, last_error = excluded.last_error RETURNING 1";
}

// A run of a series that is acked or moves to the dead letters becomes its series' next run: its
// row is updated in place (next_run_set_sql), not deleted and inserted again, so that the series'
// id always has a row that a statement waiting for it finds. A cancel (or anything keyed by the
// id) that waited for an ack of the run then finds the next run, the row's new version, and
// removes it: a deleted row and a new one would leave it nothing (it would see the old row gone,
// and not the new one, which its snapshot predates), and the series would go on. The steps that
// end a run are two CTEs each: a DELETE for the rows that end (run_ends_sql: a job of its own, or a
// schedule that next_run cannot read, which ends the series), an UPDATE for those that go on
// (run_goes_on_sql); the UPDATE is skipped (a one-time filter) when the DELETE removed the row, so
// a job of its own costs no second probe. The same fence in both: racing steps of one run, in any
// processes, make one next run (the loser finds token 0). `t` is the statement's clock (now_cte).
//
// The next run of row j (next_run_sql), for a schedule: due after the run's due time, from now.
inline std::string next_of_sql(const std::string& s) {
    return s + ".next_run(j.repeat, coalesce(j.due, (SELECT now FROM t)), (SELECT now FROM t))";
}
// Whether row j ends: no schedule (no call of the function), or no next run.
inline std::string run_ends_sql(const std::string& s) {
    return "(j.repeat IS NULL OR " + next_of_sql(s) + " IS NULL)";
}
// Whether row j goes on as its series' next run.
inline std::string run_goes_on_sql(const std::string& s) {
    return "(j.repeat IS NOT NULL AND " + next_of_sql(s) + " IS NOT NULL)";
}
// The SET that makes row j its series' next run: a waiting job (token 0, as every waiting row),
// due at the next run, from attempt 0, with no last error; the same id, payload and schedule. The
// function is called once (OFFSET 0 keeps the planner from copying the call into each column).
inline std::string next_run_set_sql(const std::string& s) {
    return "(at, due) = (SELECT x.n, x.n FROM (SELECT " + next_of_sql(s) +
           " AS n OFFSET 0) x), token = 0, attempts = 0, last_error = NULL";
}
// A column of row j as it was before this statement updated it, by its key ($1 queue, j.id): the
// statement's snapshot, which does not see the statement's own update. For the dead letter of a
// run that goes on (its attempts, its last error): the fence held, so the version the snapshot
// holds has the lease's token, and only a nack or a claim, which change the token, change them.
inline std::string before_sql(const std::string& s, const char* column) {
    return std::string("(SELECT o.") + column + " FROM " + s +
           ".jobs o WHERE o.queue = $1 AND o.id = j.id)";
}

// How many old dead letters one move to the dead letters removes at most, with
// options::keep_dead: a bound on the work it adds to a death, which still outpaces the deaths.
inline constexpr int keep_dead_batch = 100;

// With options::keep_dead (`keep` ms, > 0), the CTEs that a statement moving the jobs of CTE `b`
// (column id) to the dead letters by CTE `d` (bury_sql) adds, so that the table stays bounded
// without a reaper: up to keep_dead_batch of the queue's dead letters that died more than `keep`
// ms before now go, oldest first, one range of dead_died from its start, located first and then
// deleted where they lie (ctid). Empty without keep_dead.
//
// Only once `d` has run to its end, and only when it moved something: a claim or nack that moves
// nothing pays one test of `d`. The order matters. `d` may wait for a dead letter that another
// transaction holds (its id dies there too, or that one removes it as old); were `k` to lock old
// dead letters before `d` waits, two deaths could each hold what the other's `d` waits for (ids
// put again after they died long ago, dying at once): a deadlock. With `d` first, a statement
// waits only while it holds nothing that `k` takes, and `k` skips the rows that others hold, so
// that deaths at once never wait for each other's cleanup. The ids `b` moves are left out: `d`
// replaced their dead letters, and one statement must not change a row twice.
inline std::string keep_dead_sql(const std::string& s, long long keep) {
    if (keep <= 0) return "";
    const std::string old = "(SELECT now FROM t) - " + std::to_string(keep);
    return ", k AS (SELECT y.ctid AS r FROM " + s + ".dead y WHERE (SELECT count(*) FROM d) > 0 " +
           "AND y.queue = $1 AND y.died < " + old + " AND y.id NOT IN (SELECT id FROM b) " +
           "ORDER BY y.died, y.id LIMIT " + std::to_string(keep_dead_batch) +
           " FOR UPDATE SKIP LOCKED), kd AS (DELETE FROM " + s + ".dead y USING k WHERE " +
           "y.ctid = k.r)";
}

// The last error of a job whose max_attempts-th lease ended (delayq::lease_ended_reason), as a
// bytea literal: its bytes as they are, which holds while it has no `\` and no `'`.
inline std::string lease_ended_sql() {
    static_assert(lease_ended_reason.find_first_of("\\'") == std::string_view::npos);
    return "'" + std::string(lease_ended_reason) + "'::bytea";
}

// A job's last error as a nack or bury leaves it, over row j: the parameter `reason` (bytea) when
// the parameter `given` (boolean) says a reason was given, else the one it had.
inline std::string new_error_sql(const char* reason, const char* given) {
    return std::string("CASE WHEN ") + given + " THEN " + reason + " ELSE j.last_error END";
}

// The fencing token of a new lease (`s` quoted, and free of `'`: a literal as it is).
inline std::string token_sql(const std::string& s) {
    return "nextval('" + s + ".tokens') * 65536 + floor(random() * 65536)::bigint";
}

// The lock that serializes the claims of objects with limits on one queue: $1 the queue's key
// (a hash of the schema and the name, delay_queue::lock_key_), a transaction-level advisory lock
// that the claim's commit releases. Its own statement, before the claim in the same transaction
// (connection::exec_together): a statement sees what committed before it started, so a lock taken
// inside the claim would not refresh what the claim counts; taken by the statement before it,
// the claim starts after the last limited claim of the queue committed, and counts its leases.
inline std::string limit_lock_sql() {
    return "SELECT pg_advisory_xact_lock($1)";
}

// claim: $1 queue, $2 at most this many jobs, $3 lease (ms), and with `bury` (max_attempts > 0)
// $4 max_attempts and $5 the channel. Claims the rows whose `at` passed, earliest first, skipping
// rows another transaction holds: a waiting job that came due, or a lease that ended (redelivered,
// or buried after its max_attempts-th delivery, its last error lease_ended_reason). The rows
// claimed are updated where they lie (ctid): a join by key would let the planner scan the queue to
// find them. Returns one row per job leased (id, payload, due, attempts, token, lease end), then
// one row with a NULL id: the next `at` among the rows not claimed (NULL: none), the number of jobs
// buried, and the server's now. The next `at` is looked for from the last row claimed on, or, when
// none was, from the start: there it may be a due row that another transaction holds. With `keep`
// (ms, options::keep_dead), a claim that buries also removes old dead letters (keep_dead_sql). A
// run of a series that it buries becomes its next run (next_run_set_sql: `b0` deletes, `bs`
// updates, `b` is both), and the claim NOTIFYs $5 (at its commit; `rn`, which the trailer reads),
// since its own answer does not see the row it inserted, and the consumers of other objects, asleep
// until later, would not either: not weighed as a put's wake-up is (wake_sql), a spare one costs a
// claim, and a run that dies this way is rare.
//
// A paused queue (a row of `paused`: `z`, one probe of its key, read once) claims nothing and its
// next `at` is NULL: the consumers sleep until a notification, which the resume sends, not until
// the next due row, which would have them claim again and again while the queue stays paused.
// The test is a constant of the statement (a One-Time Filter): a paused claim reads no job.
//
// With limits (`l`, an object's options::limits), the claim runs after limit_lock_sql in its
// transaction, and leases at most the places left: max_leased less the queue's leases not ended
// (`lk`: a range of jobs_leased, as long as the leases), and rate less the leases granted in the
// last period (`lw`: a range of grants_at, at most `rate` rows); it records its own grant (`gi`,
// at t.up, the time its leases start) and trims the grants older than the period (`gd`). When a
// limit has no place left after it, the next `at` is no earlier than the time a place may come
// free (`f`): the first end of a lease (those not ended, and the ones just granted) under
// max_leased, the oldest grant of the window plus the period under a rate; a due row that a limit
// holds back is not due for the consumers until then (a time in the past would have them claim
// again and again). A settle of a lease sooner NOTIFYs (settle_notify_sql). And since the leases
// just granted are then in the answer, the next `at` also counts their ends (the caller does not
// add them, as it does without limits).
inline std::string claim_sql(const std::string& s, bool durable, bool bury, long long keep,
                             const limit_settings& l = {}) {
    const std::string dead = bury ? "j.token <> 0 AND j.attempts >= $4" : "false";
    const std::string lease_end = "least(t.up + $3, " + max_ms_sql() + ")";
    std::string limited, places = "$2";
    if (l.any()) {
        const std::string window = "(SELECT now FROM t) - " + std::to_string(l.period);
        limited = ", lk AS (SELECT count(*) AS leased, min(x.at) AS ends FROM " + s +
                  ".jobs x WHERE " + (l.max_leased > 0 ? "" : "false AND ") +
                  "x.queue = $1 AND x.token <> 0 AND x.at > (SELECT now FROM t)), lw AS (SELECT "
                  "coalesce(sum(g.n), 0) AS used, min(g.at) AS oldest FROM " +
                  s + ".grants g WHERE " + (l.rate > 0 ? "" : "false AND ") +
                  "g.queue = $1 AND g.at > " + window + ")";
        places = "greatest(least($2";
        if (l.max_leased > 0)
            places += ", " + std::to_string(l.max_leased) + " - (SELECT leased FROM lk)";
        if (l.rate > 0) places += ", " + std::to_string(l.rate) + " - (SELECT used FROM lw)";
        places += "), 0)";
    }
    std::string sql =
        "WITH " + lease_now_cte(durable) + ", z AS (SELECT EXISTS (SELECT 1 FROM " + s +
        ".paused x WHERE x.queue = $1) AS paused)" + limited +
        ", p AS (SELECT j.ctid AS r, j.id, j.at, j.attempts AS tries, " + dead + " AS dead FROM " +
        s +
        ".jobs j WHERE j.queue = $1 AND j.at <= (SELECT now FROM t) AND NOT (SELECT paused FROM "
        "z) ORDER BY j.at LIMIT " +
        places + " FOR UPDATE SKIP LOCKED), c AS (UPDATE " + s + ".jobs j SET at = " + lease_end +
        ", token = " + token_sql(s) +
        ", attempts = j.attempts + 1 FROM p, t WHERE j.ctid = p.r AND NOT p.dead RETURNING j.id, "
        "j.payload, p.at AS due, j.attempts, j.token, j.at)";
    if (bury)
        sql += ", b0 AS (DELETE FROM " + s + ".jobs j USING p WHERE j.ctid = p.r AND p.dead AND " +
               run_ends_sql(s) + " RETURNING j.id, j.payload, j.attempts, " + lease_ended_sql() +
               " AS last_error), bs AS (UPDATE " + s + ".jobs j SET " + next_run_set_sql(s) +
               " FROM p WHERE j.ctid = p.r AND p.dead AND " + run_goes_on_sql(s) +
               " RETURNING j.id, j.payload, p.tries AS attempts, " + lease_ended_sql() +
               " AS last_error), b AS (SELECT * FROM b0 UNION ALL SELECT * FROM bs), d AS (" +
               bury_sql(s, "b") + ")" + keep_dead_sql(s, keep) +
               ", rn AS (SELECT pg_notify($5, '') FROM bs LIMIT 1)";
    if (l.rate > 0)
        sql += ", gi AS (INSERT INTO " + s +
               ".grants(queue, at, n) SELECT $1, t.up, m.n FROM t, (SELECT count(*) AS n FROM c) "
               "m WHERE m.n > 0), gd AS (DELETE FROM " +
               s + ".grants g WHERE g.queue = $1 AND g.at <= (SELECT now FROM t) - " +
               std::to_string(l.period) + ")";
    std::string next = "(SELECT j.at FROM " + s +
                       ".jobs j WHERE j.queue = $1 AND j.at >= coalesce((SELECT max(at) FROM p), "
                       "-1) AND j.id NOT IN (SELECT id FROM p) ORDER BY j.at LIMIT 1)";
    if (l.any()) {
        // The claimed (`m`), the next event with the ends of their leases (`e`), and the time a
        // place comes free under each limit that has none left (`f`; NULL: one is left).
        sql += ", m AS (SELECT count(*) AS n, min(at) AS ends FROM c), e AS (SELECT least(" + next +
               ", (SELECT ends FROM m)) AS at), f AS (SELECT greatest(";
        if (l.max_leased > 0)
            sql += "CASE WHEN " + std::to_string(l.max_leased) +
                   " - lk.leased - m.n <= 0 THEN least(lk.ends, m.ends) END";
        if (l.max_leased > 0 && l.rate > 0) sql += ", ";
        if (l.rate > 0)
            sql +=
                "CASE WHEN " + std::to_string(l.rate) +
                " - lw.used - m.n <= 0 THEN least(lw.oldest, CASE WHEN m.n > 0 THEN t.up END) + " +
                std::to_string(l.period) + " END";
        sql += ") AS at FROM lk, lw, m, t)";
        next = "(SELECT CASE WHEN e.at IS NULL THEN NULL ELSE greatest(e.at, f.at) END FROM e, f)";
    }
    return sql +
           " SELECT c.id, c.payload, c.due, c.attempts::bigint, c.token, c.at FROM c UNION ALL "
           "SELECT NULL, NULL, CASE WHEN (SELECT paused FROM z) THEN NULL ELSE " +
           next + " END, " + (bury ? "(SELECT count(*) FROM b)" : "0") + ", NULL, t.now FROM t" +
           (bury ? " WHERE (SELECT count(*) FROM rn) >= 0" : "");
}

// The fence of ack, nack, extend and bury, over row j and now_cte's t: $1 queue, $2 id, $3 the
// holder's token, and the lease not ended. The token is tested as `$3 <> 0`, not `j.token <> 0`
// (the same, given j.token = $3): a test of the row's token would let the planner read the
// queue's leases through jobs_leased, whose condition it matches, and filter them by id, a walk of
// every lease for each ack, where the key finds the one row.
inline constexpr const char* held_sql =
    "j.queue = $1 AND j.id = $2 AND j.token = $3 AND $3 <> 0 AND j.at > t.now";

// ack: $1 queue, $2 id, $3 token. A run of a series becomes its next run (next_run_set_sql).
// Returns (acked, next runs queued), and with limits (`l`) whether it NOTIFYd, which it does when
// the lease held (settle_notify_sql). A next run's wake-up is the caller's, after the commit
// (wake_sql), as a put's; with limits the NOTIFY wakes the consumers already.
inline std::string ack_sql(const std::string& s, bool durable, const limit_settings& l = {}) {
    return "WITH " + lease_now_cte(durable) + ", a AS (DELETE FROM " + s +
           ".jobs j USING t WHERE " + held_sql + " AND " + run_ends_sql(s) +
           " RETURNING 1), u AS (UPDATE " + s + ".jobs j SET " + next_run_set_sql(s) +
           " FROM t WHERE " + held_sql + " AND " + run_goes_on_sql(s) +
           " AND NOT EXISTS (SELECT 1 FROM a) RETURNING 1)" +
           settle_notify_sql(l, "(SELECT 1 FROM a UNION ALL SELECT 1 FROM u) s") +
           " SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM u), (SELECT count(*) FROM u)" +
           (l.any() ? ", (SELECT count(*) FROM n)" : "");
}

// ack_many: $1 queue, $2 ids, $3 tokens. Returns the 1-based positions of the jobs acked, each
// with whether it was a run of a series, which became its next run (next_run_set_sql; the caller
// sends their wake-up, as ack's: `m` reads whether the row has a schedule, so that a batch of jobs
// of their own costs the UPDATE nothing). Each lease is found by its key and deleted where it lies;
// a row that changed in between (a new version, elsewhere) is not deleted: its lease had changed
// hands. With limits (`l`), it NOTIFYs once when it acked any (settle_notify_sql).
inline std::string ack_many_sql(const std::string& s, bool durable, const limit_settings& l = {}) {
    const std::string found =
        "WITH " + lease_now_cte(durable) +
        ", m AS (SELECT u.ord, x.r, x.s FROM unnest($2::bytea[], $3::bigint[]) WITH ORDINALITY AS "
        "u(id, token, ord), LATERAL (SELECT j.ctid AS r, j.repeat IS NOT NULL AS s FROM " +
        s +
        ".jobs j WHERE j.queue = $1 AND j.id = u.id AND j.token = u.token AND u.token <> 0 "
        "AND j.at > (SELECT now FROM t) LIMIT 1) x)";
    const std::string del = "DELETE FROM " + s + ".jobs j USING m WHERE j.ctid = m.r AND " +
                            run_ends_sql(s) + " RETURNING m.ord";
    const std::string upd = "UPDATE " + s + ".jobs j SET " + next_run_set_sql(s) +
                            " FROM m WHERE m.s AND j.ctid = m.r AND " + run_goes_on_sql(s) +
                            " RETURNING m.ord";
    // With limits, the test reads `n`, which notifies when it acked any: true either way.
    return found + ", a AS (" + del + "), u AS (" + upd + ")" +
           settle_notify_sql(l, "(SELECT 1 FROM a UNION ALL SELECT 1 FROM u) s") +
           " SELECT k.ord, k.s FROM (SELECT a.ord, false AS s FROM a UNION ALL SELECT u.ord, true "
           "FROM u) k" +
           (l.any() ? " WHERE (SELECT count(*) FROM n) >= 0" : "");
}

// nack: $1 queue, $2 id, $3 token, $4 retry after (ms), $5 max_attempts, $6 the reason, $7
// whether it was given (else the last error stays). Back to waiting, or to the dead letters after
// the max_attempts-th delivery, with that last error, and then, a run of a series, with its row
// its next run (next_run_set_sql: `b0` deletes, `bs` updates, `b` is both); the wake-up follows
// (wake_sql), for the retry or the next run. With `keep` (ms, options::keep_dead), a move to the
// dead letters also removes old ones (keep_dead_sql). Returns whether the lease held. With limits
// (`l`), it also NOTIFYs when the lease held (settle_notify_sql), at its commit, which wakes the
// consumers for the job too: the caller sends no wake-up after it.
inline std::string nack_sql(const std::string& s, bool durable, long long keep,
                            const limit_settings& l = {}) {
    const std::string error = new_error_sql("$6", "$7");
    return "WITH " + lease_now_cte(durable) + ", r AS (UPDATE " + s +
           ".jobs j SET at = least(t.up + $4, " + max_ms_sql() +
           "), token = 0, last_error = " + error + " FROM t WHERE " + held_sql +
           " AND ($5 = 0 OR j.attempts < $5) RETURNING 1), b0 AS (DELETE FROM " + s +
           ".jobs j USING t WHERE " + held_sql + " AND $5 > 0 AND j.attempts >= $5 AND " +
           run_ends_sql(s) + " RETURNING j.id, j.payload, j.attempts, " + error +
           " AS last_error), bs AS (UPDATE " + s + ".jobs j SET " + next_run_set_sql(s) +
           " FROM t WHERE " + held_sql + " AND $5 > 0 AND j.attempts >= $5 AND " +
           run_goes_on_sql(s) +
           " AND NOT EXISTS (SELECT 1 FROM r) AND NOT EXISTS (SELECT 1 FROM b0) RETURNING j.id, "
           "j.payload, " +
           before_sql(s, "attempts") + " AS attempts, CASE WHEN $7 THEN $6 ELSE " +
           before_sql(s, "last_error") +
           " END AS last_error), b AS (SELECT * FROM b0 UNION ALL SELECT * FROM bs), d AS (" +
           bury_sql(s, "b") + ")" + keep_dead_sql(s, keep) +
           settle_notify_sql(l, "(SELECT 1 FROM r UNION ALL SELECT 1 FROM b) s") +
           " SELECT (SELECT count(*) FROM r) + (SELECT count(*) FROM b)" +
           (l.any() ? ", (SELECT count(*) FROM n)" : "");
}

// extend: $1 queue, $2 id, $3 token, $4 lease (ms), $5 the channel. The lease ends $4 from now,
// as a claim's does, under the same token. Returns whether the lease held, and NOTIFYs (at its
// commit) when the new end is earlier than the old, which consumers may be sleeping until. The
// notification is not weighed after the commit as a put's is (wake_sql): shortening a lease is
// rare, and a spare wake-up costs a claim, no more; delivered at the commit, it wakes consumers
// whose claim then sees the new end. `o`, a CTE, reads the row as it was before the update.
inline std::string extend_sql(const std::string& s, bool durable) {
    return "WITH " + lease_now_cte(durable) + ", o AS (SELECT j.at FROM " + s +
           ".jobs j WHERE j.queue = $1 AND j.id = $2 LIMIT 1), u AS (UPDATE " + s +
           ".jobs j SET at = least(t.up + $4, " + max_ms_sql() + ") FROM t WHERE " + held_sql +
           " RETURNING j.at), n AS (SELECT pg_notify($5, '') FROM u, o WHERE u.at < o.at) SELECT "
           "(SELECT count(*) FROM u), (SELECT count(*) FROM n)";
}

// bury: $1 queue, $2 id, $3 token, $4 the reason, $5 whether it was given (else the last error
// stays). To the dead letters at once, as a nack of the max_attempts-th delivery; the next event
// can only come later, so no wake-up, but for a run of a series, whose row becomes its next run
// (next_run_set_sql: `b0` deletes, `bs` updates, `b` is both): its wake-up is the caller's, after
// the commit (wake_sql). With `keep` (ms, options::keep_dead), it also removes old dead letters
// (keep_dead_sql). Returns whether the lease held and the next runs queued. With limits (`l`), it
// NOTIFYs when the lease held (settle_notify_sql): a place under max_leased came free, and the
// consumers see the next run.
inline std::string bury_now_sql(const std::string& s, bool durable, long long keep,
                                const limit_settings& l = {}) {
    return "WITH " + lease_now_cte(durable) + ", b0 AS (DELETE FROM " + s +
           ".jobs j USING t WHERE " + held_sql + " AND " + run_ends_sql(s) +
           " RETURNING j.id, j.payload, j.attempts, " + new_error_sql("$4", "$5") +
           " AS last_error), bs AS (UPDATE " + s + ".jobs j SET " + next_run_set_sql(s) +
           " FROM t WHERE " + held_sql + " AND " + run_goes_on_sql(s) +
           " AND NOT EXISTS (SELECT 1 FROM b0) RETURNING j.id, j.payload, " +
           before_sql(s, "attempts") + " AS attempts, CASE WHEN $5 THEN $4 ELSE " +
           before_sql(s, "last_error") +
           " END AS last_error), b AS (SELECT * FROM b0 UNION ALL SELECT * FROM bs), d AS (" +
           bury_sql(s, "b") + ")" + keep_dead_sql(s, keep) + settle_notify_sql(l, "b") +
           " SELECT (SELECT count(*) FROM b), (SELECT count(*) FROM bs)" +
           (l.any() ? ", (SELECT count(*) FROM n)" : "");
}

inline std::string size_sql(const std::string& s) {
    return "SELECT count(*) FROM " + s + ".jobs WHERE queue = $1";
}
inline std::string dead_size_sql(const std::string& s) {
    return "SELECT count(*) FROM " + s + ".dead WHERE queue = $1";
}

// stats: $1 queue. One statement, so one snapshot, and the server's clock read once (now_cte):
// (waiting, due, leased, dead, lag in ms). The jobs are counted in one pass over the queue's range
// of jobs_at, an index-only scan (a job's `at` says whether it is due: a lease not ended lies
// after now, a lease that ended is due since it ended); the leases not ended, a range of
// jobs_leased, as long as the leases; the dead letters, a range of dead_died. The lag is now less
// the first `at`, when that one is due. Counts, not a counter row: every put, take and ack would
// update it, one row that the queue's writers would queue for, to make a rare call cheap; and
// due_now changes with the clock, which no counter follows. The cost is a read of the queue's
// range of jobs_at once per call (see "The layout" for jobs_leased).
inline std::string stats_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) +
           ", a AS (SELECT count(*) AS n, count(*) FILTER (WHERE j.at <= (SELECT now FROM t)) AS "
           "due, min(j.at) AS first FROM " +
           s + ".jobs j WHERE j.queue = $1), l AS (SELECT count(*) AS n FROM " + s +
           ".jobs x WHERE x.queue = $1 AND x.token <> 0 AND x.at > (SELECT now FROM t)) SELECT "
           "a.n - l.n, a.due, l.n, (SELECT count(*) FROM " +
           s +
           ".dead d WHERE d.queue = $1), CASE WHEN a.first <= t.now THEN t.now - a.first ELSE 0 "
           "END FROM a, l, t";
}

// The columns of a job as get() and dead() read it (id, state, at, attempts, payload,
// last_error), from row `j` of jobs or dead, with `state` 0 waiting, 1 leased, 2 dead, and `at`
// its time (ms).
inline std::string info_columns_sql(const std::string& state, const std::string& at) {
    return "j.id, " + state + " AS state, " + at +
           " AS at, j.attempts::bigint AS attempts, j.payload, j.last_error";
}

// get: $1 queue, $2 id. The queued job of that id, else the dead letter: one probe of each
// table's key. A lease that ended (by the server's clock, as the fence reads it: held_sql) reads
// as waiting, due when it ended, which is when a take may hand it out again. Columns:
// info_columns_sql.
inline std::string get_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) +
           " SELECT x.id, x.state, x.at, x.attempts, x.payload, x.last_error FROM (SELECT 0 AS "
           "k, " +
           info_columns_sql("CASE WHEN j.token <> 0 AND j.at > t.now THEN 1 ELSE 0 END", "j.at") +
           " FROM " + s + ".jobs j, t WHERE j.queue = $1 AND j.id = $2 UNION ALL SELECT 1, " +
           info_columns_sql("2", "j.died") + " FROM " + s +
           ".dead j WHERE j.queue = $1 AND j.id = $2) x ORDER BY x.k LIMIT 1";
}

// dead: $1 queue, $2 the id to follow, $3 at most this many, $4 whether $2 was given (else from
// the first). The dead letters in the order they died, then by id: one probe of the key for the
// one to follow (none: nothing follows), then one range of dead_died from there, at most $3
// entries long. The range is LATERAL, under its own LIMIT, so that the planner cannot walk the
// index from the start and filter. Columns: info_columns_sql.
inline std::string dead_page_sql(const std::string& s) {
    return "WITH a AS (SELECT j.died, j.id FROM " + s +
           ".dead j WHERE $4 AND j.queue = $1 AND j.id = $2 UNION ALL SELECT -1, ''::bytea WHERE "
           "NOT $4) SELECT d.* FROM a, LATERAL (SELECT " +
           info_columns_sql("2", "j.died") + " FROM " + s +
           ".dead j WHERE j.queue = $1 AND (j.died, j.id) > (a.died, a.id) ORDER BY j.died, j.id "
           "LIMIT $3) d ORDER BY d.at, d.id";
}

// waiting page and leased page: $1 queue, $2 the id to follow, $3 at most this many, $4 whether $2
// was given (else from the first). The queue's jobs in one state, in the order of `at` (a waiting
// job's due time, a leased one's lease end; a lease that ended, by the server's clock as get()
// reads it, is waiting since its end), then by id, as dead_page_sql pages the dead letters: one
// probe of the key for the job to follow, which must be in that state (else nothing follows),
// then, LATERAL under its own LIMIT, one range from there: of jobs_at for the waiting jobs, which
// steps over the leases that hold (as many as the consumers hold), of the partial jobs_leased
// for the leased ones. Both indexes end at `at`, not at (at, id), so the range is bounded above
// too, by the `at` of the page's last job, which a walk of the index in its own order finds (k:
// $3 steps, no sort): the jobs of the range are then sorted by (at, id), a page's worth and the
// ties of its last `at`, whatever plan the planner makes of the range (on a small table that it
// has not analyzed, it sorts the whole range rather than the index's order incrementally). A
// page reads every job of the time it starts at and of the time it ends at (many, when one
// put_many queued them all for the same millisecond). Columns: info_columns_sql.
inline std::string jobs_page_sql(const std::string& s, bool leased) {
    const auto in_state = [&](const char* j) {
        const std::string held = std::string(j) + ".token <> 0 AND " + j + ".at > t.now";
        return leased ? held : "NOT (" + held + ")";
    };
    return "WITH " + std::string(now_cte) + ", a AS (SELECT j.at, j.id FROM " + s +
           ".jobs j, t WHERE $4 AND j.queue = $1 AND j.id = $2 AND " + in_state("j") +
           " UNION ALL SELECT " + (leased ? "t.now" : "-1") +
           ", ''::bytea FROM t WHERE NOT $4) SELECT d.* FROM a, t, LATERAL (SELECT " +
           info_columns_sql(leased ? "1" : "0", "j.at") + " FROM " + s +
           ".jobs j WHERE j.queue = $1 AND " + in_state("j") +
           " AND j.at >= a.at AND (j.at, j.id) > (a.at, a.id) AND j.at <= coalesce((SELECT k.at "
           "FROM " +
           s + ".jobs k WHERE k.queue = $1 AND " + in_state("k") +
           " AND k.at >= a.at AND (k.at, k.id) > (a.at, a.id) ORDER BY k.at OFFSET $3 - 1 LIMIT "
           "1), 9223372036854775807) ORDER BY j.at, j.id LIMIT $3) d ORDER BY d.at, d.id";
}

// requeue_dead: $1 queue, $2 id, $3 delay (ms). The dead letter back among the jobs, waiting, due
// $3 from now, attempts 0, its payload and last error kept. `q` looks for the id among the jobs
// first: queued (put again after it died), it keeps the id and nothing more is done. Else `d`
// reads the dead letter and locks it, so that a purge skips it and a requeue at once waits for
// this one and finds it gone; `i` inserts the job unless the id was queued meanwhile; `m` deletes
// the dead letter only if `i` inserted, so a dead letter whose job was not inserted stays as it
// was. (A join of `m` to `i` by id would be planned, `i` having no statistics, as a walk of the
// queue's dead letters: the test of `i` leaves the key lookup as the only plan.)
//
// The locks come in the order a death takes them, the job's row, then the dead letter: `q` waits
// for a death of the id under way (which deletes the job, then replaces the dead letter) and, the
// job gone, `d` finds the new dead letter. Were `d` to lock the dead letter first, `i` would wait
// for that death's job row while the death waits for the dead letter: a deadlock. The wake-up
// follows (wake_sql). Returns the number moved, 0 or 1.
inline std::string requeue_dead_sql(const std::string& s) {
    const std::string key = "queue = $1 AND x.id = $2";
    return "WITH " + std::string(now_cte) + ", q AS (SELECT 1 FROM " + s + ".jobs x WHERE x." +
           key + " FOR KEY SHARE), d AS (SELECT x.id, x.payload, x.last_error FROM " + s +
           ".dead x WHERE NOT EXISTS (SELECT 1 FROM q) AND x." + key + " FOR UPDATE), " +
           "i AS (INSERT INTO " + s + ".jobs(queue, id, payload, at, last_error) SELECT $1, " +
           "d.id, d.payload, least(t.up + $3, " + max_ms_sql() + "), d.last_error FROM d, t " +
           "ON CONFLICT DO NOTHING RETURNING 1), m AS (DELETE FROM " + s + ".dead x WHERE x." +
           key + " AND EXISTS (SELECT 1 FROM i) RETURNING 1) SELECT count(*) FROM m";
}

// purge_dead, one batch: $1 queue, $2 a time (ms), $3 whether $2 is the cutoff itself (else an
// age: the cutoff is $2 before now), $4 at most this many. Deletes up to $4 of the queue's dead
// letters that died before the cutoff, oldest first: one range of dead_died from its start,
// located first and then deleted where they lie (ctid). Rows another transaction holds are
// skipped: it is deleting them, replacing them with a later death, or requeueing them. Returns
// the number deleted and the cutoff, which the purge's next batch passes on, so that a purge
// ends: what dies meanwhile dies after the cutoff.
inline std::string purge_dead_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) +
           ", c AS (SELECT CASE WHEN $3 THEN $2 ELSE t.now - $2 END AS cut FROM t), p AS (SELECT "
           "y.ctid AS r FROM " +
           s +
           ".dead y WHERE y.queue = $1 AND y.died < (SELECT cut FROM c) ORDER BY y.died, y.id "
           "LIMIT $4 FOR UPDATE SKIP LOCKED), x AS (DELETE FROM " +
           s + ".dead y USING p WHERE y.ctid = p.r RETURNING 1) SELECT (SELECT count(*) FROM x), " +
           "c.cut FROM c";
}

// pause: $1 queue. Its row in `paused`, since now, unless it has one (idempotent: the first
// pause's time stays). No wake-up: a consumer asleep until the next due job wakes then, and its
// claim finds the queue paused and sleeps until the resume's notification.
inline std::string pause_sql(const std::string& s) {
    return "WITH " + std::string(now_cte) + " INSERT INTO " + s +
           ".paused(queue, since) SELECT $1, t.now FROM t ON CONFLICT DO NOTHING";
}

// resume: $1 queue, $2 the channel. Deletes the queue's row in `paused` and, when there was one,
// NOTIFYs in the same transaction: delivered at its commit, so a consumer it wakes claims on a
// queue no longer paused. A resume that finds none notifies nobody: every consumer that saw the
// pause is woken by the resume that ended it (the claim that saw it listened first). Returns
// (deleted, notified).
inline std::string resume_sql(const std::string& s) {
    return "WITH d AS (DELETE FROM " + s +
           ".paused WHERE queue = $1 RETURNING 1), n AS (SELECT pg_notify($2, '') FROM d) SELECT "
           "(SELECT count(*) FROM d), (SELECT count(*) FROM n)";
}

// paused: $1 queue. Whether it has a row in `paused`.
inline std::string paused_sql(const std::string& s) {
    return "SELECT EXISTS (SELECT 1 FROM " + s + ".paused WHERE queue = $1)";
}

// The statements every connection of a queue prepares, one row each: the name it is prepared
// under, its SQL, and its parameters' types in the order of $1, $2, ... (the comment above each
// *_sql function says what they are), so that the three cannot drift apart. A row's index is its
// statement_index.
enum statement_index : unsigned char {
    st_put,
    st_put_many,
    st_cancel,
    st_reschedule,
    st_claim,
    st_ack,
    st_ack_many,
    st_nack,
    st_extend,
    st_bury,
    st_size,
    st_dead_size,
    st_wake,
    st_get,
    st_dead_page,
    st_requeue_dead,
    st_purge_dead,
    st_pause,
    st_resume,
    st_paused,
    st_limit_lock,
    st_stats,
    st_put_repeat,
    st_waiting_page,
    st_leased_page,
    st_count
};

struct prepared_statement {
    const char* name;  // "dq0", "dq1", ...
    std::string sql;
    std::vector<Oid> types;  // of $1, $2, ...
};

// The statements of a queue in schema `s` (quoted), with its options' durable_leases, whether it
// has a max_attempts (`bury`), its keep_dead in ms (`keep`; 0: dead letters kept for ever), and its
// limits (`l`: the claim counts them, the settles notify).
inline std::vector<prepared_statement> statements(const std::string& s, bool durable, bool bury,
                                                  long long keep, const limit_settings& l = {}) {
    std::vector<prepared_statement> v{
        {"dq0", put_sql(s), {text_oid, bytea_oid, bytea_oid, int8_oid, bool_oid}},
        {"dq1", put_many_sql(s), {text_oid, bytea_array_oid, bytea_array_oid, int8_array_oid}},
        {"dq2", cancel_sql(s, l), {text_oid, bytea_oid}},
        {"dq3", reschedule_sql(s), {text_oid, bytea_oid, int8_oid}},
        {"dq4",
         claim_sql(s, durable, bury, keep, l),
         {text_oid, int8_oid, int8_oid, int8_oid, text_oid}},
        {"dq5", ack_sql(s, durable, l), {text_oid, bytea_oid, int8_oid}},
        {"dq6", ack_many_sql(s, durable, l), {text_oid, bytea_array_oid, int8_array_oid}},
        {"dq7",
         nack_sql(s, durable, keep, l),
         {text_oid, bytea_oid, int8_oid, int8_oid, int8_oid, bytea_oid, bool_oid}},
        {"dq8", extend_sql(s, durable), {text_oid, bytea_oid, int8_oid, int8_oid, text_oid}},
        {"dq9",
         bury_now_sql(s, durable, keep, l),
         {text_oid, bytea_oid, int8_oid, bytea_oid, bool_oid}},
        {"dq10", size_sql(s), {text_oid}},
        {"dq11", dead_size_sql(s), {text_oid}},
        {"dq12", wake_sql(s), {text_oid, bytea_array_oid, text_oid}},
        {"dq13", get_sql(s), {text_oid, bytea_oid}},
        {"dq14", dead_page_sql(s), {text_oid, bytea_oid, int8_oid, bool_oid}},
        {"dq15", requeue_dead_sql(s), {text_oid, bytea_oid, int8_oid}},
        {"dq16", purge_dead_sql(s), {text_oid, int8_oid, bool_oid, int8_oid}},
        {"dq17", pause_sql(s), {text_oid}},
        {"dq18", resume_sql(s), {text_oid, text_oid}},
        {"dq19", paused_sql(s), {text_oid}},
        {"dq20", limit_lock_sql(), {int8_oid}},
        {"dq21", stats_sql(s), {text_oid}},
        {"dq22", put_repeat_sql(s), {text_oid, bytea_oid, bytea_oid, text_oid}},
        {"dq23", jobs_page_sql(s, false), {text_oid, bytea_oid, int8_oid, bool_oid}},
        {"dq24", jobs_page_sql(s, true), {text_oid, bytea_oid, int8_oid, bool_oid}},
    };
    return v;
}

}  // namespace delayq::postgres::detail
