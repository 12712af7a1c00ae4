// BullMQ doing what bench_redis's single-call end-to-end run does, against the same redis-server:
// 4 producers add N jobs one at a time (await each add), each delayed U[0, 2 s]; 4 workers
// (concurrency 1 each) take them; completed jobs are removed, as delayq's ack removes them.
// bench_redis runs this when `node` and this folder's node_modules (npm install) are there.
//
//   node bench.mjs --port P [--jobs N] [--paced RATE]
// prints one line: "bullmq <version>: N jobs in S s = R jobs/s; lateness p50 X ms, p99 Y ms, max Z ms"
import { Queue, Worker } from 'bullmq';
import { readFileSync } from 'node:fs';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const port = arg('port', 6379);
const jobs = arg('jobs', 40000);
const paced = arg('paced', 0);  // jobs/s in all, 0: as fast as they go
const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
const name = `bench-${process.pid}`;
const version = JSON.parse(readFileSync(new URL('./node_modules/bullmq/package.json', import.meta.url))).version;

let rng = 1;  // a small deterministic generator, one stream for all producers
const uniform = (n) => {
  rng = (rng * 1103515245 + 12345) % 2147483648;
  return rng % (n + 1);
};

const late = [];
let done = 0;
let finish;
const finished = new Promise((resolve) => { finish = resolve; });
const workers = [];
for (let c = 0; c < 4; ++c) {
  workers.push(new Worker(name, async (job) => {
    late.push(Date.now() - (job.timestamp + (job.opts.delay || 0)));
  }, { connection, concurrency: 1 }));
  workers[c].on('completed', () => { if (++done === jobs) finish(); });
}
await Promise.all(workers.map((w) => w.waitUntilReady()));

const start = Date.now();
const per = Math.floor(jobs / 4);
const producers = [];
for (let p = 0; p < 4; ++p) {
  producers.push((async () => {
    const q = new Queue(name, { connection });
    for (let i = 0; i < per; ++i) {
      if (paced > 0) {
        const at = start + (i * 4 * 1000) / paced;
        const wait = at - Date.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      }
      await q.add('j', { p: '0123456789abcdef' }, { delay: uniform(2000), removeOnComplete: true, jobId: `p${p}-${i}` });
    }
    await q.close();
  })());
}
await Promise.all(producers);
await finished;
const s = (Date.now() - start) / 1000;
late.sort((a, b) => a - b);
const at = (q) => late[Math.min(late.length - 1, Math.floor(q * late.length))];
console.log(`bullmq ${version}: ${jobs} jobs in ${s.toFixed(2)} s = ${Math.round(jobs / s)} jobs/s; ` +
            `lateness p50 ${at(0.5)} ms, p99 ${at(0.99)} ms, max ${late[late.length - 1]} ms`);
await Promise.all(workers.map((w) => w.close()));
const cleanup = new Queue(name, { connection });
await cleanup.obliterate({ force: true });
await cleanup.close();
process.exit(0);
