// BullMQ doing what bench_redis's end-to-end runs do, against the same redis-server, in one of two
// modes:
//
//   single  (default) what bench_redis's single-call run does: 4 producers add N jobs one at a time
//           (await each add), each delayed U[0, 2 s]; W workers (--workers, default 4) of
//           concurrency C (--concurrency, default 1) take them. Which layout is faster depends on
//           the machine (4 x 1 and 1 x 4 both run in bench_redis, which compares with the faster).
//           With --window K each producer keeps K adds in flight instead of awaiting each one, as
//           Node programs that add from many requests at once do (Promise.all over a window):
//           up to 4 K adds are then on the wire at once.
//   batch   BullMQ at its best, beside bench_redis's put_many/take_many/ack_many run: 4 producers
//           add N jobs with addBulk, 100 a call (same delays); one worker of concurrency C
//           (--concurrency, default 100: of 50, 100 and 200 tried on the project's 2-vCPU VM, 100
//           did best) takes them.
//
// Completed jobs are removed in both, as delayq's ack removes them. bench_redis runs this when
// `node` and this folder's node_modules (npm install) are there.
//
//   node bench.mjs --port P [--jobs N] [--mode single|batch] [--workers W] [--concurrency C]
//                  [--window K] [--paced RATE]
//
// Prints one line of JSON (machine-readable; bench_redis reads it), the figures over the run from
// the first add to the last completion:
//   {"bullmq":"6.7.6","mode":"single","jobs":N,"seconds":S,"jobs_per_s":R,
//    "client_cpu_s":C,"client_switches":X,"server_cpu_s":V,"lateness_ms":{"p50":..,"p99":..,
//    "max":..}, ...}
// client_cpu_s is this node process's CPU (user + system, all its threads: process.cpuUsage());
// client_switches its context switches, voluntary and involuntary (process.resourceUsage());
// server_cpu_s is redis-server's (INFO cpu used_cpu_user + used_cpu_sys), both deltas over the run.
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';
import { readFileSync } from 'node:fs';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const port = Number(arg('port', 6379));
const jobs = Number(arg('jobs', 40000));
const mode = arg('mode', 'single');
const concurrency = Number(arg('concurrency', mode === 'single' ? 1 : 100));
const workerCount = Number(arg('workers', mode === 'single' ? 4 : 1));
const paced = Number(arg('paced', 0));  // jobs/s in all, 0: as fast as they go (single mode)
const window = Number(arg('window', 1));  // adds each producer keeps in flight (single mode)
const batch = 100;
if (mode !== 'single' && mode !== 'batch') {
  console.error(`unknown --mode ${mode} (single or batch)`);
  process.exit(2);
}
const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
const name = `bench-${process.pid}`;
const version = JSON.parse(readFileSync(new URL('./node_modules/bullmq/package.json', import.meta.url))).version;

let rng = 1;  // a small deterministic generator, one stream for all producers
const uniform = (n) => {
  rng = (rng * 1103515245 + 12345) % 2147483648;
  return rng % (n + 1);
};

// redis-server's CPU seconds so far, user + system (INFO cpu), through a client of our own:
// BullMQ 6's `await queue.client` is undefined.
const probe = new Queue(name, { connection });
const probeClient = new IORedis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
const serverCpu = async () => {
  const info = await probeClient.info('cpu');
  const field = (f) => Number(new RegExp(`^${f}:([0-9.]+)`, 'm').exec(info)[1]);
  return field('used_cpu_user') + field('used_cpu_sys');
};

const late = [];
let done = 0;
let finish;
const finished = new Promise((resolve) => { finish = resolve; });
const workers = [];
const shape = { count: workerCount, concurrency };
for (let c = 0; c < shape.count; ++c) {
  const w = new Worker(name, async (job) => {
    late.push(Date.now() - (job.timestamp + (job.opts.delay || 0)));
  }, { connection, concurrency: shape.concurrency });
  w.on('completed', () => { if (++done === jobs) finish(); });
  workers.push(w);
}
await Promise.all(workers.map((w) => w.waitUntilReady()));

const switches = () => {
  const u = process.resourceUsage();
  return u.voluntaryContextSwitches + u.involuntaryContextSwitches;
};
const server0 = await serverCpu();
const client0 = process.cpuUsage();
const switches0 = switches();
const start = Date.now();
const per = Math.floor(jobs / 4);
const opts = (p, i) => ({ delay: uniform(2000), removeOnComplete: true, jobId: `p${p}-${i}` });
const producers = [];
for (let p = 0; p < 4; ++p) {
  producers.push((async () => {
    const q = new Queue(name, { connection });
    if (mode === 'batch') {
      for (let i = 0; i < per; i += batch) {
        const bulk = [];
        for (let k = i; k < Math.min(per, i + batch); ++k)
          bulk.push({ name: 'j', data: { p: '0123456789abcdef' }, opts: opts(p, k) });
        await q.addBulk(bulk);
      }
    } else if (window > 1) {
      for (let i = 0; i < per; i += window) {
        const adds = [];
        for (let k = i; k < Math.min(per, i + window); ++k)
          adds.push(q.add('j', { p: '0123456789abcdef' }, opts(p, k)));
        await Promise.all(adds);
      }
    } else {
      for (let i = 0; i < per; ++i) {
        if (paced > 0) {
          const at = start + (i * 4 * 1000) / paced;
          const wait = at - Date.now();
          if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        }
        await q.add('j', { p: '0123456789abcdef' }, opts(p, i));
      }
    }
    await q.close();
  })());
}
await Promise.all(producers);
await finished;
const s = (Date.now() - start) / 1000;
const client = process.cpuUsage(client0);
const clientSwitches = switches() - switches0;
const server = (await serverCpu()) - server0;
late.sort((a, b) => a - b);
const at = (q) => late[Math.min(late.length - 1, Math.floor(q * late.length))];
console.log(JSON.stringify({
  bullmq: version,
  mode,
  producers: 4,
  workers: shape.count,
  concurrency: shape.concurrency,
  batch: mode === 'batch' ? batch : 1,
  window: mode === 'single' ? window : 1,
  jobs,
  seconds: s,
  jobs_per_s: Math.round(jobs / s),
  client_cpu_s: (client.user + client.system) / 1e6,
  client_switches: clientSwitches,
  server_cpu_s: Number(server.toFixed(6)),
  lateness_ms: { p50: at(0.5), p99: at(0.99), max: late[late.length - 1] },
}));
await Promise.all(workers.map((w) => w.close()));
await probe.obliterate({ force: true });
await probe.close();
probeClient.disconnect();
process.exit(0);
