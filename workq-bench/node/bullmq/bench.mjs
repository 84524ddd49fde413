// BullMQ doing what `wq-bench --redis` does with workq-redis, on the same server:
// WQ_REDIS_URL=URL node bench.mjs WORKLOAD SIZE  ->  one JSON object per line and
// figure. The URL comes through the environment, so a password is not in the process list.
//
// W7 (the fleet) takes more arguments: W7 MODE ITEMS PROCESSES CONCURRENCY HANDLER_MS RATE.
// This process is the producer; PROCESSES worker processes (this script again, as
// `W7-worker`) each run one Worker with `concurrency` CONCURRENCY whose processor sleeps
// HANDLER_MS and records when it started and ended, on the machine's real-time clock.
//
// W8 (noisy neighbour) takes W8 NOISY QUIET CONCURRENCY HANDLER_MS, and runs in this process.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const url = process.env.WQ_REDIS_URL;
const [workload, sizeText] = process.argv.slice(2);
const size = Number(sizeText);
if (workload === 'W7-worker') {
  await fleetWorker(...process.argv.slice(4));
  process.exit(0);
}
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const emit = (metric, value) =>
  console.log(JSON.stringify({ workload, impl: 'bullmq', metric, value }));
const name = `wq-bench-${workload.toLowerCase()}-${process.pid}`;
const queue = new Queue(name, { connection });
const BATCH = 100;

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function w1() {
  // 1 producer adds SIZE distinct keys; 1 worker (concurrency 1) completes them.
  let seen = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const started = Date.now();
  const worker = new Worker(name, async () => {}, { connection, concurrency: 1 });
  worker.on('completed', () => {
    if (++seen === size) finish();
  });
  for (let i = 0; i < size; i += BATCH) {
    const jobs = [];
    for (let k = i; k < Math.min(size, i + BATCH); k++) {
      jobs.push({ name: 'item', data: {}, opts: { jobId: `key-${k}`, removeOnComplete: true } });
    }
    await queue.addBulk(jobs);
  }
  await finished;
  emit('items_per_s', size / ((Date.now() - started) / 1000));
  await worker.close();
}

async function w3(unique = true) {
  // 4 producers add the same 1,000 keys over and over (jobId dedups while a job exists);
  // 2 workers complete them. W3P (`unique` false): distinct keys, every add a job; only the
  // adds are timed, and nothing is drained.
  const keys = 1000;
  let deliveries = 0;
  const workers = [0, 1].map(() => {
    const w = new Worker(name, async () => {}, { connection, concurrency: 1 });
    w.on('completed', () => deliveries++);
    return w;
  });
  const started = Date.now();
  const perProducer = Math.floor(size / 4);
  await Promise.all(
    [0, 1, 2, 3].map(async (p) => {
      for (let i = 0; i < perProducer; i += BATCH) {
        const jobs = [];
        for (let k = i; k < Math.min(perProducer, i + BATCH); k++) {
          const key = unique ? (k * 7 + p * 13) % keys : p * perProducer + k;
          jobs.push({ name: 'item', data: {}, opts: { jobId: `key-${key}`, removeOnComplete: true } });
        }
        await queue.addBulk(jobs);
      }
    }),
  );
  const addsPerS = (perProducer * 4) / ((Date.now() - started) / 1000);
  if (!unique) {
    emit('adds_per_s', addsPerS);
    await Promise.all(workers.map((w) => w.close()));
    return;
  }
  // Drain.
  for (;;) {
    const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
    if (Object.values(counts).every((n) => n === 0)) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  emit('adds_per_s', addsPerS);
  emit('deliveries', deliveries);
  emit('wall_s', (Date.now() - started) / 1000);
  await Promise.all(workers.map((w) => w.close()));
}

async function w4() {
  // 1 producer adds SIZE distinct keys with a random delay in [0, 2 s] (fixed seed);
  // 2 workers record lateness = processing start - intended ready time.
  let seed = 42;
  const random = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648;
  };
  const lateness = [];
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const workers = [0, 1].map(
    () =>
      new Worker(
        name,
        async (job) => {
          lateness.push(Date.now() - job.data.due);
          if (lateness.length === size) finish();
        },
        { connection, concurrency: 1 },
      ),
  );
  const started = Date.now();
  for (let i = 0; i < size; i += BATCH) {
    const jobs = [];
    for (let k = i; k < Math.min(size, i + BATCH); k++) {
      const delay = Math.floor(random() * 2000);
      jobs.push({
        name: 'item',
        data: { due: Date.now() + delay },
        opts: { jobId: `key-${k}`, delay, removeOnComplete: true },
      });
    }
    await queue.addBulk(jobs);
  }
  const addsPerS = size / ((Date.now() - started) / 1000);
  await finished;
  lateness.sort((a, b) => a - b);
  emit('add_after_per_s', addsPerS);
  emit('lateness_p50_ms', percentile(lateness, 50));
  emit('lateness_p99_ms', percentile(lateness, 99));
  emit('lateness_max_ms', lateness[lateness.length - 1]);
  emit('wall_s', (Date.now() - started) / 1000);
  await Promise.all(workers.map((w) => w.close()));
}

// The machine's real-time clock in nanoseconds, as every process of the run reads it.
function nowNs() {
  return Math.round((performance.timeOrigin + performance.now()) * 1e6);
}

// One W7 worker process: a Worker on queue NAME until standard input ends, then one line per
// job it handled: `ITEM START END`.
async function fleetWorker(queueName, concurrencyText, handlerText, itemsText) {
  const handlerMs = Number(handlerText);
  const items = Number(itemsText);
  const start = new Float64Array(items);
  const end = new Float64Array(items);
  const worker = new Worker(
    queueName,
    async (job) => {
      const began = nowNs();
      if (handlerMs > 0) await sleep(handlerMs);
      start[job.data.k] = began;
      end[job.data.k] = nowNs();
    },
    {
      connection: new IORedis(url, { maxRetriesPerRequest: null }),
      concurrency: Number(concurrencyText),
    },
  );
  await worker.waitUntilReady();
  process.stdout.write('ready\n');
  await new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.resume();
  });
  await worker.close();
  const lines = [];
  for (let k = 0; k < items; k++) {
    if (start[k] > 0) lines.push(`${k} ${start[k]} ${end[k]}`);
  }
  await new Promise((resolve) => process.stdout.write(lines.join('\n') + '\n', resolve));
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// The q-quantile (nearest rank) of sorted values, as `wq-bench` computes it.
function quantile(sorted, q) {
  if (sorted.length === 0) return 0;
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(Math.max(rank, 1), sorted.length) - 1];
}

async function w7() {
  // One phase of the fleet workload: a flood (items/s) or a paced load (pickup latency).
  const [mode, itemsText, processesText, concurrencyText, handlerText, rateText] =
    process.argv.slice(3);
  const items = Number(itemsText);
  const children = [];
  for (let p = 0; p < Number(processesText); p++) {
    const child = spawn(
      process.execPath,
      [process.argv[1], 'W7-worker', '0', name, concurrencyText, handlerText, itemsText],
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
    for (let k = from; k < to; k++) {
      batch.push({ name: 'item', data: { k }, opts: { jobId: `key-${k}`, removeOnComplete: true } });
    }
    return batch;
  };
  const firstAdd = nowNs();
  if (mode === 'flood') {
    for (let i = 0; i < items; i += BATCH) {
      const to = Math.min(items, i + BATCH);
      await queue.addBulk(jobs(i, to));
      acks.fill(nowNs(), i, to);
    }
  } else {
    const rate = Number(rateText);
    const started = performance.now();
    let added = 0;
    while (added < items) {
      const due = Math.min(items, Math.floor(((performance.now() - started) / 1000) * rate) + 1);
      if (due > added) {
        await queue.addBulk(jobs(added, due));
        acks.fill(nowNs(), added, due);
        added = due;
      }
      await sleep(2);
    }
  }
  // Drain: every job handled (and removed on completion).
  for (;;) {
    const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized', 'paused');
    if (Object.values(counts).every((n) => n === 0)) break;
    await sleep(5);
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

async function w8() {
  // One group's burst of NOISY jobs (batches of BATCH, each as soon as the last is added),
  // then QUIET jobs of 100 quiet groups at 1,000 a second (every millisecond, the ones due
  // by then in one addBulk); one Worker with `concurrency` CONCURRENCY in this process, its
  // processor sleeping HANDLER_MS. The open edition has no groups: one FIFO order, the quiet
  // jobs behind the burst. Pickup: from the acknowledgement of a quiet job's add to the
  // start of its processor (the closest this side of the hand-out), 0 if that came first.
  const [noisyText, quietText, concurrencyText, handlerText] = process.argv.slice(3);
  const noisy = Number(noisyText);
  const quiet = Number(quietText);
  const handlerMs = Number(handlerText);
  const quietGroups = 100;
  const quietPerS = 1000;
  const total = noisy + quiet;
  const acked = new Float64Array(quiet);
  const handed = new Float64Array(quiet);
  let done = 0;
  let lastDone = 0;
  let lastNoisyDone = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const started = performance.now();
  const worker = new Worker(
    name,
    async (job) => {
      const q = job.data.q;
      if (q !== undefined && handed[q] === 0) handed[q] = performance.now();
      if (handlerMs > 0) await sleep(handlerMs);
    },
    { connection, concurrency: Number(concurrencyText) },
  );
  worker.on('completed', (job) => {
    const now = performance.now();
    lastDone = now;
    if (job.data.q === undefined) lastNoisyDone = now;
    if (++done === total) finish();
  });
  const opts = (jobId) => ({ jobId, removeOnComplete: true });
  for (let i = 0; i < noisy; i += BATCH) {
    const jobs = [];
    for (let k = i; k < Math.min(noisy, i + BATCH); k++) {
      jobs.push({ name: 'item', data: {}, opts: opts(`noisy-${k}`) });
    }
    await queue.addBulk(jobs);
  }
  const quietStart = performance.now();
  let added = 0;
  while (added < quiet) {
    const elapsed = (performance.now() - quietStart) / 1000;
    const due = Math.min(quiet, Math.floor(elapsed * quietPerS) + 1);
    if (due > added) {
      const jobs = [];
      for (let q = added; q < due; q++) {
        jobs.push({ name: 'item', data: { q }, opts: opts(`quiet${q % quietGroups}-${q}`) });
      }
      await queue.addBulk(jobs);
      acked.fill(performance.now(), added, due);
      added = due;
    }
    await sleep(1);
  }
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${done} of ${total} jobs done after 300 s`)), 300_000);
  });
  try {
    await Promise.race([finished, limit]);
  } finally {
    clearTimeout(timer);
  }
  await worker.close();
  const pickups = [];
  for (let q = 0; q < quiet; q++) {
    if (handed[q] === 0) throw new Error(`quiet job ${q} never ran`);
    pickups.push(Math.max(0, handed[q] - acked[q]));
  }
  pickups.sort((a, b) => a - b);
  emit('quiet_pickup_p50_ms', quantile(pickups, 0.5));
  emit('quiet_pickup_p99_ms', quantile(pickups, 0.99));
  emit('quiet_pickup_max_ms', quantile(pickups, 1));
  emit('items_per_s', total / ((lastDone - started) / 1000));
  emit('noisy_items_per_s', noisy / ((lastNoisyDone - started) / 1000));
}

try {
  await { W1: w1, W3: w3, W3P: () => w3(false), W4: w4, W7: w7, W8: w8 }[workload]();
} finally {
  await queue.obliterate({ force: true });
  await queue.close();
  await connection.quit();
}
