//! W8's driver, written once over [`workq::Queue`] and [`Workers`]: what each backend adds
//! to it is [`NoisyQueue`] (how to open a queue with a [`Setup`], and delete it).
//!
//! One *phase* is one queue: the workers start, the noisy group's burst goes in (batches of
//! [`ADD_BATCH`], each as soon as the last is acknowledged), then the quiet items at their
//! pace, and the phase ends when every item is done. The workers take their items through
//! [`Counted`], which tells the phase's [`Book`] of every hand-out and every end of a lease.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use workq::{AddOptions, Queue, WorkQueue, Workers};
use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

use super::book::{Book, Measured};
use super::counted::Counted;
use super::shape::{
    HANDLER, Limits, QUIET_PER_S, Setup, Sizes, WORKERS, group_of, noisy_item, quiet_item,
};
use crate::util::text;

/// Items per batch of the noisy group's adds.
const ADD_BATCH: usize = 100;

/// How often the quiet producer adds what is due.
const TICK: Duration = Duration::from_millis(1);

/// The longest a phase may take to drain before the run is given up.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// What the driver needs of a backend beyond [`Queue`].
pub(crate) trait NoisyQueue: Queue<Item = String> {
    /// A new queue `name` at `url` (ignored in memory), set up as `setup` says.
    fn open(
        url: &str,
        name: &str,
        setup: Setup,
    ) -> impl Future<Output = Result<Self, String>> + Send;

    /// Deletes the queue and everything in it.
    fn delete(&self) -> impl Future<Output = Result<(), String>> + Send;
}

/// The queues' group function: an item's group, owned.
fn group() -> impl Fn(&String) -> String + Send + Sync + 'static {
    |item| group_of(item).to_owned()
}

/// `builder` (any backend's: they share the flow control methods) set up as `setup` says.
macro_rules! set_up {
    ($builder:expr, $setup:expr) => {
        match $setup {
            Setup::Fifo => $builder,
            Setup::Grouped => $builder.group_by(group()),
            Setup::Limited(Limits { per_group, total }) => $builder
                .group_by(group())
                .max_in_flight_per_group(per_group)
                .max_in_flight(total),
        }
    };
}

impl NoisyQueue for WorkQueue<String> {
    async fn open(_url: &str, _name: &str, setup: Setup) -> Result<Self, String> {
        Ok(set_up!(WorkQueue::builder(), setup).build())
    }

    async fn delete(&self) -> Result<(), String> {
        Ok(())
    }
}

impl NoisyQueue for RedisQueue<String> {
    async fn open(url: &str, name: &str, setup: Setup) -> Result<Self, String> {
        let builder = RedisQueue::builder(name)
            .url(url)
            .lease_duration(Duration::from_secs(30))
            .check_persistence(false);
        set_up!(builder, setup).build().await.map_err(text)
    }

    async fn delete(&self) -> Result<(), String> {
        RedisQueue::delete(self).await.map_err(text)
    }
}

impl NoisyQueue for PgQueue<String> {
    async fn open(url: &str, name: &str, setup: Setup) -> Result<Self, String> {
        let builder = PgQueue::builder(name)
            .url(url)
            .lease_duration(Duration::from_secs(30));
        set_up!(builder, setup).build().await.map_err(text)
    }

    async fn delete(&self) -> Result<(), String> {
        PgQueue::delete(self).await.map_err(text)
    }
}

/// A queue name no other phase uses.
fn queue_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "wq-bench-w8-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One phase on a new queue at `url` set up as `setup`; the queue is deleted after, whatever
/// happened.
pub(crate) async fn phase<Q: NoisyQueue>(
    url: &str,
    setup: Setup,
    sizes: Sizes,
) -> Result<Measured, String> {
    let queue = Q::open(url, &queue_name(), setup).await?;
    let measured = run(&queue, setup, sizes).await;
    let deleted = queue.delete().await;
    let measured = measured?;
    deleted?;
    Ok(measured)
}

/// The workers, the burst, the quiet items, the drain.
async fn run<Q: NoisyQueue>(queue: &Q, setup: Setup, sizes: Sizes) -> Result<Measured, String> {
    let book = Arc::new(Book::new(sizes.noisy, sizes.quiet, setup.limits()));
    let counted = Counted::new(queue.clone(), book.clone());
    let workers = Workers::new(counted.clone())
        .count(WORKERS)
        .spawn_async(|_item: String| async {
            // A thread's sleep, as W7's handler (tokio's timer would make 1 ms about 2).
            let _ = tokio::task::spawn_blocking(|| std::thread::sleep(HANDLER)).await;
        });
    let drained = match produce(&counted, &book, sizes).await {
        Ok(()) => drain(&book, sizes.noisy + sizes.quiet).await,
        Err(e) => Err(e),
    };
    workers.shut_down().await;
    drained?;
    book.figures()
}

/// Adds `items` as one batch; an error unless every add was accepted.
async fn add<Q: Queue<Item = String>>(queue: &Q, items: Vec<String>) -> Result<(), String> {
    let count = items.len();
    match queue.add_all_with(items, AddOptions::default()).await {
        Ok(added) if added == count => Ok(()),
        Ok(added) => Err(format!("{} of {count} adds were refused", count - added)),
        Err(e) => Err(format!("an add failed: {e}")),
    }
}

/// The noisy group's burst, then the quiet items: every [`TICK`], the ones due by then at
/// [`QUIET_PER_S`], in one batch, their acknowledgement noted in `book`.
async fn produce<Q: Queue<Item = String>>(
    queue: &Q,
    book: &Book,
    sizes: Sizes,
) -> Result<(), String> {
    let mut next = 0;
    while next < sizes.noisy {
        let end = (next + ADD_BATCH).min(sizes.noisy);
        add(queue, (next..end).map(noisy_item).collect()).await?;
        next = end;
    }
    let started = Instant::now();
    let mut added = 0;
    while added < sizes.quiet {
        let due = ((started.elapsed().as_secs_f64() * QUIET_PER_S) as usize + 1).min(sizes.quiet);
        if due > added {
            add(queue, (added..due).map(quiet_item).collect()).await?;
            book.acknowledged(added, due);
            added = due;
        }
        tokio::time::sleep(TICK).await;
    }
    Ok(())
}

/// Waits until `items` are done.
async fn drain(book: &Book, items: usize) -> Result<(), String> {
    let started = Instant::now();
    while book.completed_count() < items {
        if started.elapsed() > DRAIN_LIMIT {
            return Err(format!(
                "{} of {items} items done after {DRAIN_LIMIT:?}",
                book.completed_count()
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
