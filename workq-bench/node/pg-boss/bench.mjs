// pg-boss doing what `wq-bench --postgres` does with workq-postgres, on the same database:
// WQ_POSTGRES_URL=URL node bench.mjs WORKLOAD SIZE  ->  one JSON object per line and figure.
// The URL comes through the environment, so a password is not in the process list.
//
// Settings, each as close to ours as pg-boss allows:
// - Consumers take and complete one job at a time, through pg-boss's `fetch` and `complete`
//   (two statements per job, as workq-postgres's `get` and `done`). pg-boss's `work()`
//   would wait out its polling interval after every fetch at `batchSize` 1 (its burst modes
//   need a larger batch), about 2 jobs/s; so each consumer here is the loop `work()` runs in
//   burst mode: fetch again at once after a job, and after an empty fetch wait pg-boss's
//   polling interval at the least it accepts, 0.5 s (MIN_POLLING_INTERVAL_MS). pg-boss wakes
//   `work()` by LISTEN/NOTIFY only for jobs that are ready at insert, never for a delayed job
//   coming due, so W4's lateness is bounded by that polling interval either way.
// - Adds go in batches of 100 through `insert` (one statement per batch).
// - W3 uses a queue of policy `short` (W3P, its distinct keys, a `standard` one): at most one queued (`created`) job per singletonKey, and
//   one more may be queued while it is active. That is client-go's dedup rule (a key queued
//   once, a re-add while processing delivered again), so duplicates fold the same way.
// - W7 (the fleet: W7 MODE ITEMS PROCESSES WORKERS HANDLER_MS RATE) runs pg-boss's own loop,
//   `work()`, in PROCESSES worker processes (this script again, as `W7-worker`), each with
//   WORKERS jobs in flight: `localConcurrency` 1, `batchSize` WORKERS, `burstWhenBatchFull`,
//   on a queue created with `notify` and instances with `useListenNotify`. That is pg-boss's
//   best for this shape: one fetch statement and one completion statement (each a commit)
//   per WORKERS jobs, the handlers of a batch running concurrently; a full batch fetches the
//   next at once, and an insert wakes an idle worker through LISTEN/NOTIFY. The per-job
//   alternative (`localConcurrency` WORKERS, `batchSize` 1) costs two statements per job,
//   and only skips the polling interval between jobs (`burstWhenReadyExceeds`) while the
//   queue's ready count, refreshed by pg-boss's monitoring, says there is a backlog: with
//   monitoring off it waited the notify backstop (30 s) between jobs, and a flood of 500
//   jobs did not finish in 100 s. 2 x 8 and 4 x 4 measured within the noise of 1 x 16.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { PgBoss } from 'pg-boss';

const url = process.env.WQ_POSTGRES_URL;
const [workload, sizeText] = process.argv.slice(2);
const size = Number(sizeText);
if (workload === 'W7-worker') {
  await fleetWorker(...process.argv.slice(4));
  process.exit(0);
}
const emit = (metric, value) =>
  console.log(JSON.stringify({ workload, impl: 'pg-boss', metric, value }));
const name = `wq-bench-${workload.toLowerCase()}-${process.pid}`;
const BATCH = 100;
// pg-boss's least polling interval (MIN_POLLING_INTERVAL_MS).
const POLL_MS = 500;

const boss = new PgBoss({ connectionString: url, schedule: false, supervise: false });
boss.on('error', (e) => console.error(`pg-boss: ${e.message}`));
await boss.start();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const consumers = [];
let stopping = false;

// A consumer: fetches one job, runs `handle` on it, completes it; waits POLL_MS after an
// empty fetch.
function consume(handle) {
  const loop = (async () => {
    while (!stopping) {
      const [job] = await boss.fetch(name, { batchSize: 1 });
      if (!job) {
        await sleep(POLL_MS);
        continue;
      }
      handle(job);
      await boss.complete(name, job.id);
    }
  })();
  consumers.push(loop);
}

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function w1() {
  // 1 producer inserts SIZE jobs in batches; 1 worker completes them.
  await boss.createQueue(name, { policy: 'standard' });
  let seen = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const started = Date.now();
  consume(() => {
    if (++seen === size) finish();
  });
  for (let i = 0; i < size; i += BATCH) {
    const jobs = [];
    for (let k = i; k < Math.min(size, i + BATCH); k++) {
      jobs.push({ data: { key: k } });
    }
    await boss.insert(name, jobs);
  }
  await finished;
  emit('items_per_s', size / ((Date.now() - started) / 1000));
}

async function w3(unique = true) {
  // 4 producers add the same 1,000 keys over and over (policy `short` folds a key already
  // queued); 2 workers complete them. W3P (`unique` false): distinct keys on a `standard`
  // queue, every add a job; only the adds are timed, and nothing is drained.
  await boss.createQueue(name, { policy: unique ? 'short' : 'standard' });
  const keys = 1000;
  let deliveries = 0;
  for (let w = 0; w < 2; w++) {
    consume(() => deliveries++);
  }
  const started = Date.now();
  const perProducer = Math.floor(size / 4);
  await Promise.all(
    [0, 1, 2, 3].map(async (p) => {
      for (let i = 0; i < perProducer; i += BATCH) {
        const jobs = [];
        for (let k = i; k < Math.min(perProducer, i + BATCH); k++) {
          if (unique) {
            const key = (k * 7 + p * 13) % keys;
            jobs.push({ data: { key }, singletonKey: `key-${key}` });
          } else {
            jobs.push({ data: { key: p * perProducer + k } });
          }
        }
        await boss.insert(name, jobs);
      }
    }),
  );
  const addsPerS = (perProducer * 4) / ((Date.now() - started) / 1000);
  if (!unique) {
    emit('adds_per_s', addsPerS);
    return;
  }
  // Drain: no job of the queue left before `completed` (created, retry, active).
  const db = boss.getDb();
  for (;;) {
    const { rows } = await db.executeSql(
      "SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state < 'completed'",
      [name],
    );
    if (rows[0].n === 0) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  emit('adds_per_s', addsPerS);
  emit('deliveries', deliveries);
  emit('wall_s', (Date.now() - started) / 1000);
}

async function w4() {
  // 1 producer inserts SIZE jobs with a random delay in [0, 2 s] (`startAfter`, an interval on
  // the database's clock, fixed seed); 2 workers record lateness = processing start - intended
  // ready time.
  await boss.createQueue(name, { policy: 'standard' });
  let seed = 42;
  const random = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648;
  };
  const lateness = [];
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  for (let w = 0; w < 2; w++) {
    consume((job) => {
      lateness.push(Math.max(0, Date.now() - job.data.due));
      if (lateness.length === size) finish();
    });
  }
  const started = Date.now();
  for (let i = 0; i < size; i += BATCH) {
    const jobs = [];
    for (let k = i; k < Math.min(size, i + BATCH); k++) {
      const delay = Math.floor(random() * 2000);
      jobs.push({
        data: { key: k, due: Date.now() + delay },
        startAfter: `${delay} milliseconds`,
      });
    }
    await boss.insert(name, jobs);
  }
  const addsPerS = size / ((Date.now() - started) / 1000);
  await finished;
  lateness.sort((a, b) => a - b);
  emit('add_after_per_s', addsPerS);
  emit('lateness_p50_ms', percentile(lateness, 50));
  emit('lateness_p99_ms', percentile(lateness, 99));
  emit('lateness_max_ms', lateness[lateness.length - 1]);
  emit('wall_s', (Date.now() - started) / 1000);
}

// The machine's real-time clock in nanoseconds, as every process of the run reads it.
function nowNs() {
  return Math.round((performance.timeOrigin + performance.now()) * 1e6);
}

function pause(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// The q-quantile (nearest rank) of sorted values, as `wq-bench` computes it.
function quantile(sorted, q) {
  if (sorted.length === 0) return 0;
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(Math.max(rank, 1), sorted.length) - 1];
}

// W7's pg-boss settings for WORKERS jobs in flight per process (see the top of this file).
function fleetSettings(workers) {
  return { localConcurrency: 1, batchSize: workers, burstWhenBatchFull: true };
}

// One W7 worker process: pg-boss workers on queue NAME until standard input ends, then one line
// per job handled: `ITEM START END`.
async function fleetWorker(queueName, workersText, handlerText, itemsText) {
  const handlerMs = Number(handlerText);
  const items = Number(itemsText);
  const workers = Number(workersText);
  const start = new Float64Array(items);
  const end = new Float64Array(items);
  const worker = new PgBoss({
    connectionString: url,
    schedule: false,
    supervise: false,
    useListenNotify: true,
    max: workers + 4,
  });
  worker.on('error', (e) => console.error(`pg-boss: ${e.message}`));
  await worker.start();
  const handle = async (job) => {
    const began = nowNs();
    if (handlerMs > 0) await pause(handlerMs);
    start[job.data.k] = began;
    end[job.data.k] = nowNs();
  };
  await worker.work(
    queueName,
    { ...fleetSettings(workers), pollingIntervalSeconds: 0.5 },
    async (jobs) => {
      await Promise.all(jobs.map(handle));
    },
  );
  process.stdout.write('ready\n');
  await new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.resume();
  });
  await worker.stop({ graceful: true, wait: true });
  const lines = [];
  for (let k = 0; k < items; k++) {
    if (start[k] > 0) lines.push(`${k} ${start[k]} ${end[k]}`);
  }
  await new Promise((resolve) => process.stdout.write(lines.join('\n') + '\n', resolve));
}

async function w7() {
  // One phase of the fleet workload: a flood (items/s) or a paced load (pickup latency).
  const [mode, itemsText, processesText, workersText, handlerText, rateText] =
    process.argv.slice(3);
  const items = Number(itemsText);
  await boss.createQueue(name, { policy: 'standard', notify: true });
  const children = [];
  for (let p = 0; p < Number(processesText); p++) {
    const child = spawn(
      process.execPath,
      [process.argv[1], 'W7-worker', '0', name, workersText, handlerText, itemsText],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    const lines = createInterface({ input: child.stdout });
    const iterator = lines[Symbol.asyncIterator]();
    const first = await iterator.next();
    if (first.done || first.value !== 'ready') throw new Error('a worker process did not start');
    children.push({ child, iterator });
  }
  const acks = new Float64Array(items);
  const jobs = (from, to) => {
    const batch = [];
    for (let k = from; k < to; k++) batch.push({ data: { k } });
    return batch;
  };
  const firstAdd = nowNs();
  if (mode === 'flood') {
    for (let i = 0; i < items; i += BATCH) {
      const to = Math.min(items, i + BATCH);
      await boss.insert(name, jobs(i, to));
      acks.fill(nowNs(), i, to);
    }
  } else {
    const rate = Number(rateText);
    const started = performance.now();
    let added = 0;
    while (added < items) {
      const due = Math.min(items, Math.floor(((performance.now() - started) / 1000) * rate) + 1);
      if (due > added) {
        await boss.insert(name, jobs(added, due));
        acks.fill(nowNs(), added, due);
        added = due;
      }
      await pause(2);
    }
  }
  // Drain: no job of the queue left before `completed` (created, retry, active).
  const db = boss.getDb();
  for (;;) {
    const { rows } = await db.executeSql(
      "SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state < 'completed'",
      [name],
    );
    if (rows[0].n === 0) break;
    await pause(5);
  }
  let lastEnd = firstAdd;
  const pickups = [];
  for (const { child, iterator } of children) {
    child.stdin.end();
    for (;;) {
      const line = await iterator.next();
      if (line.done) break;
      const [k, start, end] = line.value.split(' ').map(Number);
      if (!(k >= 0 && k < items)) continue;
      pickups.push(Math.max(0, start - acks[k]));
      lastEnd = Math.max(lastEnd, end);
    }
  }
  if (pickups.length < items) throw new Error(`${items - pickups.length} jobs were never handled`);
  if (mode === 'flood') {
    emit('items_per_s', items / ((lastEnd - firstAdd) / 1e9));
  } else {
    pickups.sort((a, b) => a - b);
    emit('pickup_p50_ms', quantile(pickups, 0.5) / 1e6);
    emit('pickup_p99_ms', quantile(pickups, 0.99) / 1e6);
    emit('pickup_max_ms', quantile(pickups, 1) / 1e6);
  }
}

try {
  await { W1: w1, W3: w3, W3P: () => w3(false), W4: w4, W7: w7 }[workload]();
} finally {
  stopping = true;
  await Promise.all(consumers).catch(() => {});
  await boss.deleteQueue(name).catch(() => {});
  await boss.stop({ graceful: false, wait: true });
}
