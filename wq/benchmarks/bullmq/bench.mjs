// BullMQ doing what `wq bench --redis` does with workqueue-redis, on the same server:
// WQ_REDIS_URL=URL node bench.mjs WORKLOAD SIZE  ->  one JSON object per line and
// figure. The URL comes through the environment, so a password is not in the process list.
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';

const url = process.env.WQ_REDIS_URL;
const [workload, sizeText] = process.argv.slice(2);
const size = Number(sizeText);
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

async function w3() {
  // 4 producers add the same 1,000 keys over and over (jobId dedups while a job exists);
  // 2 workers complete them.
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
          const key = (k * 7 + p * 13) % keys;
          jobs.push({ name: 'item', data: {}, opts: { jobId: `key-${key}`, removeOnComplete: true } });
        }
        await queue.addBulk(jobs);
      }
    }),
  );
  const addsPerS = (perProducer * 4) / ((Date.now() - started) / 1000);
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

try {
  await { W1: w1, W3: w3, W4: w4 }[workload]();
} finally {
  await queue.obliterate({ force: true });
  await queue.close();
  await connection.quit();
}
