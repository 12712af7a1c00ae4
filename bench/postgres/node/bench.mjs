// pg-boss and graphile-worker doing what bench_postgres's end-to-end runs do, against the same
// PostgreSQL server, in one of two modes:
//
//   single  4 producers add N jobs one call at a time (await each), each delayed U[0, 2 s];
//           4 consumers take them one at a time (pg-boss: 4 loops of fetch() and complete();
//           graphile-worker: one runner of concurrency 4).
//   batch   4 producers add N jobs 100 a call (pg-boss insert(), graphile-worker's add_jobs());
//           pg-boss: 4 loops fetching and completing 100 at a time; graphile-worker: one runner
//           of concurrency 100.
//
// Polling: pg-boss's loops nap 50 ms when nothing was due (its work() would wait at least its
// 0.5 s polling interval between fetches: 8 jobs/s with 4 subscriptions of batchSize 1 here);
// graphile-worker is woken by NOTIFY on each insert and polls for jobs that come due
// (pollInterval, set to 100 ms instead of its 2 s default so that delayed jobs are not held back).
//
//   node bench.mjs --lib pgboss|graphile --conn URL --postmaster PID [--jobs N] [--mode single|batch]
//
// Prints one line of JSON: {"lib":..,"version":..,"mode":..,"jobs":N,"seconds":S,"jobs_per_s":R,
// "client_cpu_s":C,"server_cpu_s":V}. client_cpu_s is this node process's CPU (process.cpuUsage());
// server_cpu_s is the PostgreSQL server's (the postmaster and its children, from /proc), both
// deltas over the run, from the first add to the last completion.
import { readFileSync, readdirSync } from 'node:fs';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const lib = arg('lib', 'pgboss');
const conn = arg('conn', 'postgres://postgres@127.0.0.1:5432/postgres');
const postmaster = Number(arg('postmaster', 0));
const jobs = Number(arg('jobs', 20000));
const mode = arg('mode', 'single');
const batch = mode === 'batch' ? 100 : 1;
const producers = 4;

// The server's CPU seconds so far: the postmaster (with its reaped children) and its live
// children, from /proc.
const tick = 100;  // USER_HZ on Linux
const statOf = (pid) => {
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return { ppid: Number(f[1]), own: Number(f[11]) + Number(f[12]), reaped: Number(f[13]) + Number(f[14]) };
};
const serverCpu = () => {
  if (!postmaster) return 0;
  const pm = statOf(postmaster);
  let t = pm.own + pm.reaped;
  for (const d of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(d)) continue;
    try {
      const st = statOf(Number(d));
      if (st.ppid === postmaster) t += st.own;
    } catch { /* gone */ }
  }
  return t / tick;
};

let rng = 1;
const uniform = (n) => {
  rng = (rng * 1103515245 + 12345) % 2147483648;
  return rng % (n + 1);
};
const version = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;

let done = 0;
let finish;
const finished = new Promise((resolve) => { finish = resolve; });
const completed = (n) => { done += n; if (done >= jobs) finish(); };
const per = Math.floor(jobs / producers);

async function runPgBoss() {
  const { default: PgBoss } = await import('pg-boss');
  const boss = new PgBoss({ connectionString: conn, max: 8 });
  boss.on('error', (e) => console.error(e));
  await boss.start();
  const name = `bench_${process.pid}_${mode}`;
  await boss.createQueue(name);
  // Its pull API in a loop of its own, which beats work() (one fetch per polling interval, at
  // least 0.5 s, per subscription): fetch, complete, and a 50 ms nap when nothing was due.
  let stop = false;
  const loops = [];
  for (let w = 0; w < 4; ++w)
    loops.push((async () => {
      while (!stop) {
        const js = await boss.fetch(name, { batchSize: batch });
        if (!js || js.length === 0) { await new Promise((r) => setTimeout(r, 50)); continue; }
        await boss.complete(name, js.map((j) => j.id));
        completed(js.length);
      }
    })());
  return {
    version: version('pg-boss'),
    put: async (p, i, n) => {
      const when = (k) => new Date(Date.now() + uniform(2000));
      if (n === 1) return boss.send(name, { p: '0123456789abcdef' }, { startAfter: when() });
      const list = [];
      for (let k = i; k < i + n; ++k) list.push({ name, data: { p: '0123456789abcdef' }, startAfter: when(k) });
      return boss.insert(list);
    },
    close: async () => { stop = true; await Promise.all(loops); await boss.stop({ graceful: false, wait: false }); },
  };
}

async function runGraphile() {
  const { run, makeWorkerUtils } = await import('graphile-worker');
  const utils = await makeWorkerUtils({ connectionString: conn });
  await utils.migrate();
  const task = `bench_${process.pid}_${mode}`;
  const runner = await run({
    connectionString: conn,
    concurrency: mode === 'batch' ? 100 : 4,
    noHandleSignals: true,
    pollInterval: 100,
    taskList: { [task]: async () => { completed(1); } },
    logger: new (await import('graphile-worker')).Logger(() => () => {}),
  });
  return {
    version: version('graphile-worker'),
    put: async (p, i, n) => {
      const when = () => new Date(Date.now() + uniform(2000));
      if (n === 1) return utils.addJob(task, { p: '0123456789abcdef' }, { runAt: when() });
      // 0.16 has no addJobs() in WorkerUtils: its SQL function add_jobs(), which it documents.
      const specs = [];
      for (let k = i; k < i + n; ++k)
        specs.push({ identifier: task, payload: { p: '0123456789abcdef' }, run_at: when().toISOString() });
      return utils.withPgClient((c) => c.query(
        'select graphile_worker.add_jobs(array(select json_populate_recordset(null::graphile_worker.job_spec, $1::json)))',
        [JSON.stringify(specs)]));
    },
    close: async () => { await runner.stop(); await utils.release(); },
  };
}

const q = lib === 'graphile' ? await runGraphile() : await runPgBoss();
const server0 = serverCpu();
const client0 = process.cpuUsage();
const start = Date.now();
const ps = [];
for (let p = 0; p < producers; ++p) {
  ps.push((async () => {
    for (let i = 0; i < per; i += batch) await q.put(p, i, Math.min(batch, per - i));
  })());
}
await Promise.all(ps);
await finished;
const s = (Date.now() - start) / 1000;
const client = process.cpuUsage(client0);
const server = serverCpu() - server0;
console.log(JSON.stringify({
  lib, version: q.version, mode, jobs: per * producers, seconds: s,
  jobs_per_s: Math.round((per * producers) / s),
  client_cpu_s: (client.user + client.system) / 1e6, server_cpu_s: Number(server.toFixed(3)),
}));
await q.close();
process.exit(0);
