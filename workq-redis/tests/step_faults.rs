//! A transient fault loses no done: a batched step of `Workers` (the `done_get` script, with
//! the forgets of its successes) that meets a busy server (`BUSY` for 200 ms), a server
//! restarting from its AOF, a server still loading a large AOF (`LOADING`) or a server made a
//! replica for a moment (`READONLY`) waits it out, as a single `done` does. Every item is
//! handled exactly once, its `forget` is kept, no lease expires (no stall), and nothing is
//! counted as lost. A reply lost after the server applied a step, or a retry's step, is never
//! applied twice.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use workq::{AddOptions, AsyncWorkers, Queue, Workers};
use workq_redis::{Error, RateLimit, RedisQueue};

use support::server::{Durability, RedisServer, require_with};

const ITEMS: [&str; 4] = ["a", "b", "c", "d"];

/// The lease of the queues here (but the one loading a large AOF).
const LEASE: Duration = Duration::from_secs(2);

fn builder(url: String, name: &str) -> workq_redis::Builder<String> {
    RedisQueue::builder(name)
        .url(url)
        .lease_duration(LEASE)
        .rate_limit(RateLimit::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .check_persistence(false)
}

/// A pool of four workers, each holding one of [`ITEMS`] (each failed once before, so a
/// success must forget a failure), their handlers waiting for the gate to open.
struct Held {
    queue: RedisQueue<String>,
    workers: AsyncWorkers<String, RedisQueue<String>>,
    calls: Arc<Mutex<Vec<String>>>,
    gate: tokio::sync::watch::Sender<bool>,
    /// The queue's lease.
    lease: Duration,
}

async fn four_held(server: &RedisServer, name: &str) -> Held {
    four_held_on(builder(server.url(), name).build().await.unwrap(), LEASE).await
}

/// [`four_held`] on `queue`, whose lease is `lease`.
async fn four_held_on(queue: RedisQueue<String>, lease: Duration) -> Held {
    for item in ITEMS {
        queue.add_rate_limited(item.to_owned()).await.unwrap();
        assert_eq!(queue.num_requeues(item.to_owned()).await.unwrap(), 1);
    }
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (gate, open) = tokio::sync::watch::channel(false);
    let workers = {
        let calls = calls.clone();
        Workers::new(queue.clone())
            .count(ITEMS.len())
            .spawn_async(move |item: String| {
                let calls = calls.clone();
                let mut open = open.clone();
                async move {
                    calls.lock().unwrap().push(item);
                    let _ = open.wait_for(|open| *open).await;
                }
            })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.lock().unwrap().len() < ITEMS.len() {
        assert!(
            Instant::now() < deadline,
            "the workers did not take every item"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Held {
        queue,
        workers,
        calls,
        gate,
        lease,
    }
}

/// Waits until the queue holds nothing (queued, delayed or leased), checking that no lease
/// expired meanwhile; then checks that each item was handled once, its failure forgotten,
/// its `done` counted once, and nothing counted as lost.
async fn handled_exactly_once(held: Held, what: &str) {
    let Held {
        queue,
        workers,
        calls,
        lease,
        ..
    } = held;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = queue.stats(1).await.unwrap();
        assert_eq!(stats.summary.stalled, 0, "{what}: a lease expired");
        if stats.summary.depth == 0 && stats.summary.delayed == 0 && stats.summary.in_flight == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{what}: not drained: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Longer than the lease: a done that was dropped would have its item handed out again.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let summary = workers.shut_down().await;
    let mut calls = calls.lock().unwrap().clone();
    calls.sort();
    assert_eq!(calls, ITEMS, "{what}: handled more than once");
    assert_eq!(summary.succeeded, ITEMS.len() as u64, "{what}: {summary:?}");
    assert_eq!(summary.lease_lost, 0, "{what}: {summary:?}");
    for item in ITEMS {
        assert_eq!(
            queue.num_requeues(item.to_owned()).await.unwrap(),
            0,
            "{what}: the forget of {item} was lost"
        );
    }
    assert_eq!(
        queue.counters().await.unwrap().completions,
        ITEMS.len() as u64,
        "{what}: dones"
    );
    assert_eq!(queue.stats(1).await.unwrap().summary.stalled, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_during_a_batched_step_loses_no_done() {
    let Some(server) = require_with(Durability::Always, &["--busy-reply-threshold", "50"]) else {
        return;
    };
    let held = four_held(&server, "step-busy").await;
    // A script keeps the server busy: past 50 ms every other command is answered BUSY.
    let busy = {
        let url = server.url();
        tokio::spawn(async move {
            let mut con = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: redis::RedisResult<()> = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query_async(&mut con)
                .await;
        })
    };
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Until the server answers BUSY.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut con).await;
        match ping {
            Err(e) if e.code() == Some("BUSY") => break,
            _ => assert!(Instant::now() < deadline, "the server never got busy"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The handlers end: their dones go out in batched steps, which meet BUSY.
    held.gate.send_replace(true);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("KILL")
        .query_async(&mut con)
        .await
        .expect("the script was running");
    busy.await.unwrap();
    handled_exactly_once(held, "BUSY").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_during_a_batched_step_loses_no_done() {
    let Some(mut server) = require_with(Durability::Always, &[]) else {
        return;
    };
    let held = four_held(&server, "step-restart").await;
    server.kill();
    // The handlers end while the server is down: their steps fail to reach it.
    held.gate.send_replace(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Back from its AOF, on the same port.
    server.restart();
    handled_exactly_once(held, "a restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_loading_a_large_aof_during_a_batched_step_loses_no_done() {
    let Some(server) = require_with(Durability::Always, &["--enable-debug-command", "yes"]) else {
        return;
    };
    // A big data set, rewritten into the AOF, so that a restart takes a while to load it.
    drop(support::fill_aof(&server, 1_500_000).await);
    // A lease longer than the restart and its load, which a loaded machine stretches.
    let lease = Duration::from_secs(10);
    let queue = builder(server.url(), "step-loading")
        .lease_duration(lease)
        .retry_deadline(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let held = four_held_on(queue, lease).await;
    let port = server.port();
    // The restart (which returns once the load is over) runs on a thread of its own.
    let mut server = server;
    let restarted = std::thread::spawn(move || {
        server.restart();
        server
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            && let Ok(mut c) = client.get_multiplexed_async_connection().await
        {
            let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
            if matches!(ping, Err(e) if e.code() == Some("LOADING")) {
                break;
            }
        }
        assert!(
            !restarted.is_finished() && Instant::now() < deadline,
            "the restart never answered LOADING: the data set is too small"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The handlers end while the server loads: their steps meet LOADING.
    held.gate.send_replace(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !restarted.is_finished(),
        "the load ended before the steps went out: the data set is too small"
    );
    let _server = tokio::task::spawn_blocking(move || restarted.join().unwrap())
        .await
        .unwrap();
    handled_exactly_once(held, "LOADING").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_made_a_replica_during_a_batched_step_loses_no_done() {
    let Some(server) = require_with(Durability::Always, &[]) else {
        return;
    };
    let held = four_held(&server, "step-readonly").await;
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // A replica of a primary that does not answer (nothing listens on the port): it keeps
    // its data, and refuses writes with READONLY, as in a failover.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = nobody.local_addr().unwrap().port();
    drop(nobody);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(port)
        .query_async(&mut con)
        .await
        .unwrap();
    let write: redis::RedisResult<()> = redis::cmd("SET")
        .arg("step-readonly-probe")
        .arg(1)
        .query_async(&mut con)
        .await;
    assert!(
        matches!(&write, Err(e) if e.code() == Some("READONLY")),
        "{write:?}"
    );
    // The handlers end: their dones go out in batched steps, which meet READONLY.
    held.gate.send_replace(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A primary again, its data as it was.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut con)
        .await
        .unwrap();
    handled_exactly_once(held, "READONLY").await;
}

// ===== a lost reply =====

/// A TCP proxy in front of the server that can drop the connection instead of passing on
/// the next reply: the server applied the call, the client never hears of it.
struct Proxy {
    port: u16,
    drop_next_reply: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

impl Proxy {
    async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let drop_next_reply = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (armed, count) = (drop_next_reply.clone(), dropped.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                tokio::spawn(pump(client, server, armed.clone(), count.clone()));
            }
        });
        Proxy {
            port,
            drop_next_reply,
            dropped,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The next reply the server sends is dropped, with its connection.
    fn drop_next_reply(&self) {
        self.drop_next_reply.store(true, Ordering::SeqCst);
    }
}

async fn pump(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let down = async {
        let mut buf = vec![0_u8; 64 * 1024];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            if armed.swap(false, Ordering::SeqCst) {
                dropped.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            client_write.write_all(&buf[..n]).await?;
        }
    };
    // Either way ends both connections (the halves are dropped).
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_reply_was_lost_is_not_applied_twice() {
    let Some(server) = require_with(Durability::Always, &[]) else {
        return;
    };
    let proxy = Proxy::start(server.port()).await;
    let q = builder(proxy.url(), "lost-step")
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    let direct = builder(server.url(), "lost-step").build().await.unwrap();
    // The script is loaded first (the server answers an unknown one with NOSCRIPT, unapplied).
    q.add("warm".to_owned()).await.unwrap();
    let warm = q.try_get().await.unwrap().into_lease().unwrap();
    let step = q.done_and_get_many(vec![(warm, false)], 0).await.unwrap();
    assert!(step.done[0].is_ok());
    for item in ["a", "b", "c"] {
        q.add(item.to_owned()).await.unwrap();
    }
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(lease.item(), "a");
    proxy.drop_next_reply();
    // The server marks a done and leases b and c; the answer is lost. The retry takes nothing
    // more, and finds the done already applied (or the lease gone): it cannot tell which.
    let step = q.done_and_get_many(vec![(lease, false)], 2).await.unwrap();
    assert_eq!(
        proxy.dropped.load(Ordering::SeqCst),
        1,
        "the fault happened"
    );
    assert!(
        matches!(step.done[..], [Err(Error::OutcomeUnknown)]),
        "{:?}",
        step.done
    );
    assert!(step.next.is_empty(), "the retry took items again");
    assert_eq!(direct.counters().await.unwrap().completions, 2);
    // b and c are leased to nobody: reclaimed when their leases expire.
    assert_eq!(direct.processing_len().await.unwrap(), 2);
    assert_eq!(direct.len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_reply_was_lost_is_not_applied_twice() {
    let Some(server) = require_with(Durability::Always, &[]) else {
        return;
    };
    let proxy = Proxy::start(server.port()).await;
    let q = builder(proxy.url(), "lost-retry")
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    let direct = builder(server.url(), "lost-retry").build().await.unwrap();
    let next = || async {
        loop {
            if let Some(lease) = q.try_get().await.unwrap().into_lease() {
                break lease;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    // The script is loaded first (the server answers an unknown one with NOSCRIPT, unapplied).
    q.add("warm".to_owned()).await.unwrap();
    let warm = next().await;
    let after = AddOptions::default().after(Duration::from_secs(60));
    assert!(
        Queue::retry_and_done(&q, warm, after, false)
            .await
            .unwrap()
            .is_none()
    );
    q.add_rate_limited("r".to_owned()).await.unwrap();
    let lease = next().await;
    assert_eq!(lease.item(), "r");
    proxy.drop_next_reply();
    let out = Queue::retry_and_done(&q, lease, AddOptions::default().rate_limited(), false).await;
    assert_eq!(
        proxy.dropped.load(Ordering::SeqCst),
        1,
        "the fault happened"
    );
    assert!(matches!(out, Err(Error::OutcomeUnknown)), "{out:?}");
    // Applied once: one more failure, one re-add, one done.
    assert_eq!(direct.num_requeues("r".to_owned()).await.unwrap(), 2);
    assert_eq!(direct.counters().await.unwrap().completions, 2);
    assert_eq!(direct.processing_len().await.unwrap(), 0);
    // The warm-up item waits a minute; r was re-added once.
    let pending = direct.delayed_len().await.unwrap() + direct.len().await.unwrap();
    assert_eq!(pending, 2, "re-added once");
}

/// Through `Workers`: the reply to the pool's first step after four items are finished is
/// lost after the server applied it (the proxy drops it with its connection). The step's
/// dones applied, so those items are never handled again; the next items the step took for
/// the pool's workers were leased to nobody, and come back once their leases expire, each
/// handled once, by one worker at a time. The pool goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_whose_step_reply_was_lost_handle_every_item_once() {
    let Some(server) = require_with(Durability::Always, &[]) else {
        return;
    };
    let proxy = Proxy::start(server.port()).await;
    let lease = Duration::from_millis(800);
    let name = "lost-step-workers";
    // No renewal: after the fault, nothing but the step is on its way when the reply is
    // dropped.
    let q = builder(proxy.url(), name)
        .lease_duration(lease)
        .auto_renew(false)
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let direct = builder(server.url(), name).build().await.unwrap();
    // The scripts are loaded first (the server answers an unknown one with NOSCRIPT,
    // unapplied: that reply would be the one dropped).
    q.add("warm".to_owned()).await.unwrap();
    let warm = q.try_get().await.unwrap().into_lease().unwrap();
    let step = q.done_and_get_many(vec![(warm, false)], 0).await.unwrap();
    assert!(step.done[0].is_ok());
    let first = ["a", "b", "c", "d"];
    let second = ["e", "f", "g", "h"];
    for item in first.iter().chain(&second) {
        q.add((*item).to_owned()).await.unwrap();
    }
    // Per item: how many times handled, and whether two handlers ever held it at once.
    let handled: Arc<Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
    let started_at: Arc<Mutex<std::collections::HashMap<String, Instant>>> = Arc::default();
    let holding: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (gate, open) = tokio::sync::watch::channel(false);
    let workers = {
        let (handled, holding, overlaps) = (handled.clone(), holding.clone(), overlaps.clone());
        let started_at = started_at.clone();
        Workers::new(q.clone())
            .count(first.len())
            .spawn_async(move |item: String| {
                let (handled, holding, overlaps) =
                    (handled.clone(), holding.clone(), overlaps.clone());
                started_at
                    .lock()
                    .unwrap()
                    .insert(item.clone(), Instant::now());
                let mut open = open.clone();
                async move {
                    if !holding.lock().unwrap().insert(item.clone()) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    *handled.lock().unwrap().entry(item.clone()).or_default() += 1;
                    let _ = open.wait_for(|open| *open).await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    holding.lock().unwrap().remove(&item);
                }
            })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while handled.lock().unwrap().len() < first.len() {
        assert!(Instant::now() < deadline, "the workers did not take a to d");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    proxy.drop_next_reply();
    let opened = Instant::now();
    gate.send_replace(true);
    // Everything comes back: the lost step's items after their leases.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = direct.stats(1).await.unwrap();
        let all = handled.lock().unwrap().len() == first.len() + second.len();
        if all && stats.summary.depth == 0 && stats.summary.in_flight == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not drained: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        proxy.dropped.load(Ordering::SeqCst),
        1,
        "the fault happened"
    );
    // Past another lease: an item whose done was dropped would be handed out again.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    // The pool goes on.
    q.add("after".to_owned()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !handled.lock().unwrap().contains_key("after") {
        assert!(Instant::now() < deadline, "the pool took no new work");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let summary = workers.shut_down().await;
    let handled = handled.lock().unwrap().clone();
    for item in first.iter().chain(&second).chain(&["after"]) {
        assert_eq!(handled.get(*item), Some(&1), "{item}: {handled:?}");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(summary.processed, 9, "{summary:?}");
    assert_eq!(summary.lease_lost, 0, "{summary:?}");
    // The items the lost step took came back once their leases expired.
    let started_at = started_at.lock().unwrap().clone();
    let late: Vec<_> = second
        .iter()
        .filter(|item| started_at[**item] >= opened + lease)
        .collect();
    assert!(
        !late.is_empty(),
        "no item of the lost step came back through its lease: {started_at:?}"
    );
    // The warm-up, a to h and the last item: each done applied once.
    assert_eq!(direct.counters().await.unwrap().completions, 10);
}
