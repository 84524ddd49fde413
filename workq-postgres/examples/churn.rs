//! Churn: items flowing through one queue for minutes, to watch what vacuum leaves behind.
//!
//! ```sh
//! cargo run --release -p workq-postgres --example churn -- \
//!     --url postgres://postgres@127.0.0.1/postgres --minutes 10 --items 1000000
//! ```
//!
//! A producer adds `--items` distinct items over `--minutes` (in batches of 500, paced), and
//! four workers take and complete them 50 at a time (`done_and_get_many`), renewing nothing
//! (the items are short). Every 30 s, and at the end, it prints the items done, the items
//! table's live and dead tuples, its size with its indexes, and how often autovacuum ran on
//! it: with the table's settings, dead tuples and size stay bounded however long it runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use workq_postgres::PgQueue;

/// The command line: `--url URL --minutes N --items N`.
struct Args {
    url: String,
    minutes: u64,
    items: u64,
}

fn args() -> Args {
    let mut args = Args {
        url: std::env::var("WQ_POSTGRES_URL").unwrap_or_default(),
        minutes: 10,
        items: 1_000_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--url" => args.url = value,
            "--minutes" => args.minutes = value.parse().expect("--minutes N"),
            "--items" => args.items = value.parse().expect("--items N"),
            other => panic!("unknown option {other}: --url URL --minutes N --items N"),
        }
    }
    assert!(!args.url.is_empty(), "--url URL (or WQ_POSTGRES_URL)");
    args
}

/// One line of the table's state.
async fn report(pool: &PgPool, started: Instant, done: u64) {
    let (live, dead, vacuums, size): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count + vacuum_count,
                pg_total_relation_size('workqueue_items')
         FROM pg_stat_user_tables WHERE relname = 'workqueue_items'",
    )
    .fetch_one(pool)
    .await
    .expect("table statistics");
    println!(
        "{:>6.0} s  {:>9} done  {:>8} live  {:>8} dead tuples  {:>7.1} MB with indexes  {:>3} vacuums",
        started.elapsed().as_secs_f64(),
        done,
        live,
        dead,
        size as f64 / 1e6,
        vacuums
    );
}

#[tokio::main]
async fn main() -> Result<(), workq_postgres::Error> {
    let args = args();
    let queue: PgQueue<u64> = PgQueue::builder("churn")
        .url(&args.url)
        .max_connections(8)
        .build()
        .await?;
    queue.delete().await?;
    let pool = queue.pool().clone();
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Duration::from_secs(args.minutes * 60);
    let started = Instant::now();
    println!(
        "churn: {} items over {} minutes through queue {:?}",
        args.items,
        args.minutes,
        queue.name()
    );
    let producer = {
        let queue = queue.clone();
        let items = args.items;
        tokio::spawn(async move {
            const BATCH: u64 = 500;
            let batches = items.div_ceil(BATCH);
            for b in 0..batches {
                // Paced over the run, so the table churns all along.
                let due = deadline.mul_f64(b as f64 / batches as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let keys: Vec<u64> = (b * BATCH..((b + 1) * BATCH).min(items)).collect();
                queue.add_all(&keys).await?;
            }
            Ok::<_, workq_postgres::Error>(())
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (queue, done) = (queue.clone(), done.clone());
            tokio::spawn(async move {
                while let Some(first) = queue.get().await? {
                    let mut current = vec![first];
                    while !current.is_empty() {
                        done.fetch_add(current.len() as u64, Ordering::Relaxed);
                        current = queue
                            .done_and_get_many(
                                current.into_iter().map(|l| (l, false)).collect(),
                                50,
                            )
                            .await?
                            .next;
                    }
                }
                Ok::<_, workq_postgres::Error>(())
            })
        })
        .collect();
    let mut ticker = tokio::time::interval(Duration::from_secs(30));
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let n = done.load(Ordering::Relaxed);
        report(&pool, started, n).await;
        if n >= args.items || started.elapsed() > deadline + Duration::from_secs(120) {
            break;
        }
    }
    producer.await.expect("producer")?;
    queue.shut_down();
    for worker in workers {
        worker.await.expect("worker")?;
    }
    report(&pool, started, done.load(Ordering::Relaxed)).await;
    queue.delete().await?;
    Ok(())
}
