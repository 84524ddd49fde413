//! The faults a real deployment meets, each on a `redis-server` of the test's own: dropped
//! leases, restarts from an older snapshot, a full server, transient server states, pinned and
//! poison items, one process's shutdown, dead-letter operations, cancelled gets and secrets.

mod support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::server::{Durability, RedisServer, require, require_with};
use workq::admin::End;
use workq::{AddKind, AddOptions, Queue, TryGet};
use workq_redis::{Error, RedisQueue};

fn builder(server: &RedisServer, name: &str) -> workq_redis::Builder<String> {
    RedisQueue::<String>::builder(name).url(server.url())
}

/// Waits until `check` holds, for at most 5 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ===== 1. a dropped lease is released, not done =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lease_is_released_at_once_and_counts_no_stall() {
    let Some(server) = require() else { return };
    let q = builder(&server, "drop").build().await.unwrap();
    q.add("a".to_string()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    let first = lease.token();
    drop(lease);
    // Released long before the 30 s lease could expire.
    let started = Instant::now();
    let again = loop {
        match q.try_get().await.unwrap() {
            TryGet::Leased(lease) => break lease,
            TryGet::Empty | TryGet::ShutDown => {
                assert!(started.elapsed() < Duration::from_secs(2), "not released");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    assert_eq!(again.item(), "a");
    assert!(again.token() > first);
    let stats = q.stats(10).await.unwrap();
    assert_eq!(stats.summary.stalled, 0, "a release is not a stall");
    again.done().await.unwrap();
    assert_eq!(q.len().await.unwrap(), 0);
    assert_eq!(q.processing_len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_handler_or_a_timeout_does_not_mark_the_item_done() {
    let Some(server) = require() else { return };
    let q = builder(&server, "abort").build().await.unwrap();
    q.add("a".to_string()).await.unwrap();
    let task = {
        let q = q.clone();
        tokio::spawn(async move {
            let lease = q.get().await.unwrap().unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            lease.done().await.unwrap();
        })
    };
    eventually("the task holds the item", || async {
        q.processing_len().await.unwrap() == 1
    })
    .await;
    // Re-added while the aborted task held it: folds into the one hand-out.
    q.add("a".to_string()).await.unwrap();
    task.abort();
    let lease = tokio::time::timeout(Duration::from_secs(2), q.get())
        .await
        .expect("handed out again at once")
        .unwrap()
        .unwrap();
    assert_eq!(lease.item(), "a");
    // A handler cut short by a timeout: the same.
    let cut = tokio::time::timeout(Duration::from_millis(50), async {
        let _held = lease;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    })
    .await;
    assert!(cut.is_err());
    let lease = tokio::time::timeout(Duration::from_secs(2), q.get())
        .await
        .expect("handed out again at once")
        .unwrap()
        .unwrap();
    lease.done().await.unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
}

#[test]
fn a_lease_dropped_after_its_runtime_is_gone_expires_instead() {
    let Some(server) = require() else { return };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (q, lease) = runtime.block_on(async {
        let q = builder(&server, "no-runtime")
            .lease_duration(Duration::from_millis(300))
            .auto_renew(false)
            .build()
            .await
            .unwrap();
        q.add("a".to_string()).await.unwrap();
        let lease = q.try_get().await.unwrap().into_lease().unwrap();
        (q, lease)
    });
    drop(runtime);
    // No runtime to send a release on: no panic, and the server still holds the lease.
    drop(lease);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let q = builder(&server, "no-runtime").build().await.unwrap();
        assert_eq!(q.processing_len().await.unwrap(), 1);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let lease = q
            .try_get()
            .await
            .unwrap()
            .into_lease()
            .expect("expired and reclaimed");
        assert_eq!(lease.item(), "a");
        lease.done().await.unwrap();
    });
    drop(q);
}

// ===== 2. fencing tokens never go backwards =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restart_keeps_tokens_growing_and_fences_the_stale_holder() {
    let Some(mut server) = require_with(Durability::None, &[]) else {
        return;
    };
    let q = builder(&server, "snap")
        .lease_duration(Duration::from_secs(30))
        .auto_renew(false)
        .retry_deadline(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    q.add("b".to_string()).await.unwrap();
    let _: () = redis::cmd("SAVE")
        .query_async(&mut support::raw(&server).await)
        .await
        .unwrap();
    let old = server.dir().join("snapshot.rdb");
    std::fs::copy(server.dir().join("dump.rdb"), &old).unwrap();

    // After the snapshot: b is handed out, and more tokens go out.
    let stale = q.try_get().await.unwrap().into_lease().unwrap();
    let mut highest = stale.token();
    for i in 0..20 {
        let added = q.add(format!("x{i}")).await.unwrap();
        highest = highest.max(added.seq);
    }

    // Restart from the older snapshot: the counter is back where it was.
    server.kill();
    std::fs::copy(&old, server.dir().join("dump.rdb")).unwrap();
    server.restart();

    let fresh = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(fresh.item(), "b", "the snapshot had b ready");
    assert!(
        fresh.token() > highest,
        "token {} after the restart, {highest} handed out before",
        fresh.token()
    );
    assert!(matches!(stale.done().await, Err(Error::LeaseLost)));
    // The new holder's claim survived the stale done.
    assert_eq!(q.processing_len().await.unwrap(), 1);
    fresh.done().await.unwrap();
    assert_eq!(q.processing_len().await.unwrap(), 0);
}

// ===== 3. a full server =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_a_full_server_keeps_renew_done_and_release_working() {
    let Some(server) = require_with(Durability::EverySec, &["--maxmemory", "3mb"]) else {
        return;
    };
    let q = builder(&server, "oom")
        .lease_duration(Duration::from_secs(30))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    for item in ["a", "b", "c"] {
        q.add(item.to_string()).await.unwrap();
    }
    let a = q.try_get().await.unwrap().into_lease().unwrap();
    let b = q.try_get().await.unwrap().into_lease().unwrap();
    // Fill the server until it refuses writes.
    let mut con = support::raw(&server).await;
    // Large blobs first, then small ones: a refused large write frees its own buffer, which
    // could leave room for a small add.
    let mut full = false;
    let mut i = 0;
    for size in [64 * 1024, 1024, 64] {
        let blob = "x".repeat(size);
        full = false;
        for _ in 0..5000 {
            i += 1;
            let set: redis::RedisResult<()> = con.set(format!("filler:{i}"), &blob).await;
            if let Err(e) = set {
                assert_eq!(e.code(), Some("OOM"), "{e}");
                full = true;
                break;
            }
        }
    }
    assert!(full, "the server never filled up");
    // Adds grow the data: refused, as back-pressure.
    let add = q.add("d".to_string()).await.unwrap_err();
    assert!(add.to_string().contains("OOM"), "{add}");
    // Leases live on.
    a.renew().await.unwrap();
    a.done().await.unwrap();
    b.release().await.unwrap();
    let b = q
        .try_get()
        .await
        .unwrap()
        .into_lease()
        .expect("get works on a full server");
    assert_eq!(b.item(), "b");
    b.done().await.unwrap();
    // A failed item's retry moves it from in flight back to waiting, as a release does.
    let c = q.try_get().await.unwrap().into_lease().unwrap();
    let retried = Queue::retry_and_done(&q, c, AddOptions::default().rate_limited(), false)
        .await
        .expect("a retry works on a full server");
    assert!(retried.is_none());
    assert_eq!(q.num_requeues("c".to_string()).await.unwrap(), 1);
    let c = loop {
        if let Some(c) = q.try_get().await.unwrap().into_lease() {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(c.item(), "c");
    drop(c);
    eventually("the dropped lease is released", || async {
        q.len().await.unwrap() == 1
    })
    .await;
}

// ===== 4. transient states =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_loop_rides_out_a_server_kill_and_restart() {
    let Some(mut server) = require() else { return };
    let q = builder(&server, "restart")
        .lease_duration(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let worker = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(lease) = q.get().await? {
                seen.push(lease.item().clone());
                lease.done().await?;
            }
            Ok::<_, Error>(seen)
        })
    };
    q.add_all((0..20).map(|i| format!("before-{i}")))
        .await
        .unwrap();
    eventually("the first batch is processed", || async {
        q.len().await.unwrap() == 0 && q.processing_len().await.unwrap() == 0
    })
    .await;
    // The worker waits in get while the server dies and comes back.
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart();
    q.add_all((0..20).map(|i| format!("after-{i}")))
        .await
        .unwrap();
    eventually("the second batch is processed", || async {
        q.len().await.unwrap() == 0 && q.processing_len().await.unwrap() == 0
    })
    .await;
    q.shut_down_fleet().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the loop ends")
        .unwrap()
        .expect("no Err through the restart");
    assert_eq!(seen.len(), 40, "{seen:?}");
}

/// Starts a script that keeps the server busy, on a connection of its own.
fn busy_script(server: &RedisServer) -> tokio::task::JoinHandle<()> {
    let url = server.url();
    tokio::spawn(async move {
        let mut con = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: redis::RedisResult<()> = redis::cmd("EVAL")
            .arg("local i = 0 while true do i = i + 1 end")
            .arg(0)
            .query_async(&mut con)
            .await;
    })
}

async fn script_kill(server: &RedisServer) {
    let mut con = support::raw(server).await;
    let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("KILL").query_async(&mut con).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_is_waited_out_up_to_the_retry_deadline() {
    let Some(server) = require_with(Durability::Always, &["--busy-reply-threshold", "50"]) else {
        return;
    };
    let patient = builder(&server, "busy")
        .retry_deadline(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    let hasty = builder(&server, "busy")
        .retry_deadline(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let script = busy_script(&server);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Past its deadline the error surfaces.
    let started = Instant::now();
    let error = hasty.add("a".to_string()).await.unwrap_err();
    assert!(error.to_string().contains("BUSY"), "{error}");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?} {error:?}",
        started.elapsed()
    );
    // Within it, the add waits for the server.
    let add = {
        let patient = patient.clone();
        tokio::spawn(async move { patient.add("a".to_string()).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!add.is_finished(), "waits while the server is busy");
    script_kill(&server).await;
    let added = tokio::time::timeout(Duration::from_secs(10), add)
        .await
        .unwrap()
        .unwrap()
        .expect("applied once the server is free");
    assert_eq!(added.kind, AddKind::Queued);
    script.await.unwrap();
}

/// A lease the server handed out as a pause longer than the lease ended (the `get` was sent
/// before the pause) is renewed, not taken for lost: nobody else takes the item for three
/// leases, and its `done` is accepted. Its clock counts from the call's sending, so it came
/// past its deadline; its renewals stopped, and the server's lease, which runs from the
/// answer, expired while the item was held (another handle took it: two holders).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_after_a_paused_server_is_renewed() {
    let Some(server) = require() else { return };
    let lease = Duration::from_millis(500);
    let q = builder(&server, "late")
        .lease_duration(lease)
        .build()
        .await
        .unwrap();
    let other = builder(&server, "late")
        .lease_duration(lease)
        .build()
        .await
        .unwrap();
    q.add("a".to_string()).await.unwrap();
    // Both connections open before the pause.
    assert_eq!(other.len().await.unwrap(), 1);
    server.signal("STOP");
    let get = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.signal("CONT");
    let held = get.await.unwrap().unwrap().expect("the item");
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            other.try_get().await.unwrap().into_lease().is_none(),
            "another handle took the held item"
        );
    }
    assert!(!held.is_lost());
    held.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_after_a_demotion_is_waited_out() {
    let Some(server) = require() else { return };
    let Some(primary) = require() else { return };
    let q = builder(&server, "ro")
        .retry_deadline(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    q.add("warm".to_string()).await.unwrap();
    // The server is demoted to a replica, as in a failover: writes answer READONLY.
    let mut con = support::raw(&server).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .query_async(&mut con)
        .await
        .unwrap();
    let add = {
        let q = q.clone();
        tokio::spawn(async move { q.add("a".to_string()).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!add.is_finished(), "waits while the server is read-only");
    // Promoted again (the address now reaches a primary): the add goes through.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut con)
        .await
        .unwrap();
    let added = tokio::time::timeout(Duration::from_secs(15), add)
        .await
        .expect("applied once the server is a primary")
        .unwrap()
        .unwrap();
    assert_eq!(added.kind, AddKind::Queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_a_large_aof_after_a_restart_is_waited_out() {
    let Some(server) = require_with(Durability::EverySec, &["--enable-debug-command", "yes"])
    else {
        return;
    };
    let q = builder(&server, "loading")
        .retry_deadline(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    q.add("before".to_string()).await.unwrap();
    // A big data set, rewritten into the AOF so that a restart takes a while to load it.
    let mut con = support::fill_aof(&server, 1_500_000).await;
    let old_run = run_id(&mut con).await;
    drop(con);
    let port = server.port();
    // The restart (which waits for the load to end) runs on a thread of its own...
    let mut server = server;
    let restarted = std::thread::spawn(move || {
        server.restart();
        server
    });
    // ...while a get and an add go on here, through refused connections and LOADING. The get
    // starts once the old server is gone: one served by the server being killed would lease
    // "before" and lose the reply (the lease then runs out in its own time).
    let spawn_worker = || {
        let q = q.clone();
        tokio::spawn(async move {
            let lease = q.get().await?.expect("an item");
            let item = lease.item().clone();
            lease.done().await?;
            Ok::<_, Error>(item)
        })
    };
    let mut worker = None;
    let mut saw_loading = false;
    let watch_deadline = Instant::now() + Duration::from_secs(60);
    while !restarted.is_finished() && Instant::now() < watch_deadline {
        let mut gone = true;
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            && let Ok(mut c) = client.get_multiplexed_async_connection().await
        {
            let ping: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
            match ping {
                Err(e) if e.code() == Some("LOADING") => saw_loading = true,
                Ok(_) => gone = run_id(&mut c).await != old_run,
                Err(_) => {}
            }
        }
        if gone && worker.is_none() {
            worker = Some(spawn_worker());
        }
        if saw_loading {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let worker = worker.unwrap_or_else(spawn_worker);
    let added = q.add("during".to_string()).await.expect("waited out");
    let _server = tokio::task::spawn_blocking(move || restarted.join().unwrap())
        .await
        .unwrap();
    assert_ne!(added.kind, AddKind::Ignored);
    let got = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("the get returns")
        .unwrap()
        .expect("no error through the restart");
    assert_eq!(got, "before");
    assert!(
        saw_loading,
        "the restart never answered LOADING: the data set is too small"
    );
}

/// The server's `run_id` (new at every start).
async fn run_id(con: &mut redis::aio::MultiplexedConnection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

// ===== 5. nothing pinned, nothing looping =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_stops_at_the_maximum_hold_time() {
    let Some(server) = require() else { return };
    let q = builder(&server, "hold")
        .lease_duration(Duration::from_millis(300))
        .renew_every(Duration::from_millis(50))
        .max_hold(Duration::from_millis(600))
        .build()
        .await
        .unwrap();
    q.add("a".to_string()).await.unwrap();
    let held = q.try_get().await.unwrap().into_lease().unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(!held.is_lost(), "renewed past one lease");
    assert!(q.try_get().await.unwrap().is_empty());
    eventually("the lease expires after the maximum hold", || async {
        q.processing_len().await.unwrap() == 0
    })
    .await;
    assert!(held.is_lost());
    let next = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(next.item(), "a");
    assert!(matches!(held.done().await, Err(Error::LeaseLost)));
    next.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_item_goes_to_the_dead_letters_by_default_with_its_history() {
    let Some(server) = require() else { return };
    let q = builder(&server, "poison")
        .lease_duration(Duration::from_millis(100))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    q.add_rate_limited("p".to_string()).await.unwrap();
    q.add("p".to_string()).await.unwrap();
    assert_eq!(q.num_requeues("p".to_string()).await.unwrap(), 1);
    let mut handed = 0;
    for _ in 0..20 {
        match q.try_get().await.unwrap() {
            TryGet::Leased(lease) => {
                handed += 1;
                lease.abandon(); // the worker dies
            }
            TryGet::Empty if handed > 0 && q.processing_len().await.unwrap() == 0 => {
                break;
            }
            TryGet::Empty | TryGet::ShutDown => {}
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(handed, 5, "the default max_stalls is 5");
    let dead = q.dead_letters(End::First, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].item, "\"p\"");
    assert_eq!(dead[0].stalls, 5);
    assert_eq!(dead[0].failures, 1);
    assert!(dead[0].token.is_some_and(|t| t > 0));
    assert_eq!(q.num_requeues("p".to_string()).await.unwrap(), 0, "cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_that_is_not_utf8_goes_to_the_dead_letters() {
    let Some(server) = require() else { return };
    let q = builder(&server, "utf8").build().await.unwrap();
    let mut con = support::raw(&server).await;
    let bad: &[u8] = b"\"\xff\xfe\"";
    let _: () = con.rpush("wq:{utf8}:ready", bad).await.unwrap();
    let _: () = con.sadd("wq:{utf8}:dirty", bad).await.unwrap();
    q.add("good".to_string()).await.unwrap();
    let lease = q
        .try_get()
        .await
        .unwrap()
        .into_lease()
        .expect("the bad item does not block get");
    assert_eq!(lease.item(), "good");
    lease.done().await.unwrap();
    let dead = q.dead_letters(End::First, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].error.contains("UTF-8"), "{}", dead[0].error);
    assert_eq!(q.processing_len().await.unwrap(), 0);
    // Requeued, it comes back as it was (and goes back to the dead letters).
    assert!(q.requeue_dead_letter(&dead[0]).await.unwrap());
    assert!(q.dead_letters(End::First, 10).await.unwrap().is_empty());
    assert!(q.try_get().await.unwrap().is_empty());
    assert_eq!(q.dead_letters(End::First, 10).await.unwrap().len(), 1);
}

// ===== 6. one process's shutdown =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handles_shut_down_stops_only_that_handle() {
    let Some(server) = require() else { return };
    let old = builder(&server, "deploy").build().await.unwrap();
    let other = builder(&server, "deploy").build().await.unwrap();
    old.add("a".to_string()).await.unwrap();
    let held = old.try_get().await.unwrap().into_lease().unwrap();
    let waiting = {
        let old = old.clone();
        tokio::spawn(async move { old.get().await.unwrap().is_none() })
    };
    let drain = {
        let old = old.clone();
        tokio::spawn(async move { old.shut_down_with_drain().await })
    };
    let woke = tokio::time::timeout(Duration::from_secs(2), waiting).await;
    assert!(
        woke.expect("a waiting get wakes").unwrap(),
        "and returns None"
    );
    assert!(old.is_shutting_down().await.unwrap());
    assert_eq!(
        old.add("c".to_string()).await.unwrap().kind,
        AddKind::Ignored
    );
    assert!(old.get().await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !drain.is_finished(),
        "the drain waits for this handle's lease"
    );
    // The rest of the fleet goes on.
    assert!(!other.is_shutting_down().await.unwrap());
    assert_eq!(
        other.add("b".to_string()).await.unwrap().kind,
        AddKind::Queued
    );
    let b = other.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(b.item(), "b");
    b.done().await.unwrap();
    assert_eq!(
        other.add("c".to_string()).await.unwrap().kind,
        AddKind::Queued
    );
    held.done().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), drain)
        .await
        .expect("drained once the lease is done")
        .unwrap()
        .unwrap();
    drop(old);
    // The next deployment works without delete().
    let new = builder(&server, "deploy").build().await.unwrap();
    let c = new.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(c.item(), "c");
    c.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_shut_down_stops_every_handle_until_resumed() {
    let Some(server) = require() else { return };
    let a = builder(&server, "fleet").build().await.unwrap();
    let b = builder(&server, "fleet").build().await.unwrap();
    a.add("queued".to_string()).await.unwrap();
    a.add_after("later".to_string(), Duration::from_millis(100))
        .await
        .unwrap();
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            let first = b.get().await.unwrap().unwrap();
            first.done().await.unwrap();
            b.get().await.unwrap().is_none()
        })
    };
    a.shut_down_fleet().await.unwrap();
    assert!(b.is_fleet_shut_down().await.unwrap());
    assert_eq!(
        b.add("ignored".to_string()).await.unwrap().kind,
        AddKind::Ignored
    );
    let woke = tokio::time::timeout(Duration::from_secs(3), waiting).await;
    assert!(
        woke.expect("woken").unwrap(),
        "queued items drain, then None"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(a.try_get().await.unwrap().is_shut_down());
    assert_eq!(
        a.delayed_len().await.unwrap(),
        1,
        "the delayed item is kept"
    );
    assert!(a.resume_fleet().await.unwrap());
    assert!(!b.is_shutting_down().await.unwrap());
    let later = tokio::time::timeout(Duration::from_secs(3), b.get())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(later.item(), "later");
    later.done().await.unwrap();
    assert_eq!(
        b.add("again".to_string()).await.unwrap().kind,
        AddKind::Queued
    );
}

// ===== 7. dead letters =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_capped_listed_requeued_and_purged() {
    let Some(server) = require() else { return };
    let q = RedisQueue::<u32>::builder("dead")
        .url(server.url())
        .dead_letter_cap(3)
        .build()
        .await
        .unwrap();
    let mut con = support::raw(&server).await;
    for i in 0..5 {
        let item = format!("\"not a number {i}\"");
        let _: () = con.rpush("wq:{dead}:ready", &item).await.unwrap();
        let _: () = con.sadd("wq:{dead}:dirty", &item).await.unwrap();
    }
    q.add(7).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(*lease.item(), 7);
    lease.done().await.unwrap();
    let dead = q.dead_letters(End::First, 10).await.unwrap();
    let items: Vec<&str> = dead.iter().map(|d| d.item.as_str()).collect();
    assert_eq!(
        items,
        [
            "\"not a number 2\"",
            "\"not a number 3\"",
            "\"not a number 4\""
        ],
        "the oldest were dropped"
    );
    let stats = q.stats(10).await.unwrap();
    assert_eq!((stats.summary.dead, stats.summary.dead_dropped), (3, 2));

    assert!(q.requeue_dead_letter(&dead[1]).await.unwrap());
    assert!(!q.requeue_dead_letter(&dead[1]).await.unwrap(), "only once");
    assert_eq!(q.len().await.unwrap(), 1);
    assert_eq!(q.dead_letters(End::First, 10).await.unwrap().len(), 2);
    assert_eq!(q.requeue_dead_letters().await.unwrap(), 2);
    assert_eq!(q.len().await.unwrap(), 3);
    // They still do not decode: back to the dead letters, then purged.
    assert!(q.try_get().await.unwrap().is_empty());
    assert_eq!(q.purge_dead_letters().await.unwrap(), 3);
    assert!(q.dead_letters(End::First, 10).await.unwrap().is_empty());
}

// ===== 8. cancelled gets =====

async fn connections_received(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut support::raw(server).await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_gets_open_no_connections() {
    let Some(server) = require() else { return };
    let q = builder(&server, "cancel").build().await.unwrap();
    q.add("warm".to_string()).await.unwrap();
    q.try_get()
        .await
        .unwrap()
        .into_lease()
        .unwrap()
        .done()
        .await
        .unwrap();
    let before = connections_received(&server).await;
    for _ in 0..500 {
        let got = tokio::time::timeout(Duration::from_millis(2), q.get()).await;
        assert!(got.is_err(), "nothing to get");
    }
    let opened = connections_received(&server).await - before;
    // The INFO calls themselves open two; the shared wait at most one more.
    assert!(opened <= 4, "{opened} connections for 500 cancelled gets");
    // And the handle still works.
    q.add("x".to_string()).await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(2), q.get())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    lease.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_get_does_not_swallow_another_waiters_wake_up() {
    let Some(server) = require() else { return };
    // Polls far apart: only a wake-up can deliver in time.
    let cancelled = builder(&server, "swallow")
        .poll_interval(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    let waiter = builder(&server, "swallow")
        .poll_interval(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    // The first handle's blocking wait is first in the server's line, then abandoned.
    let got = tokio::time::timeout(Duration::from_millis(100), cancelled.get()).await;
    assert!(got.is_err());
    let getter = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.get().await.unwrap().map(|l| l.item().clone()) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    waiter.add("x".to_string()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), getter)
        .await
        .expect("the other waiter is woken")
        .unwrap();
    assert_eq!(got.as_deref(), Some("x"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

// ===== 9. secrets and names =====

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_in_debug_display_or_errors() {
    let Some(server) = require_with(Durability::Always, &["--requirepass", "Hunter2-secret"])
    else {
        return;
    };
    let good = format!("redis://:Hunter2-secret@127.0.0.1:{}/", server.port());
    let builder = RedisQueue::<String>::builder("secret").url(good.as_str());
    assert!(!format!("{builder:?}").contains("Hunter2"));
    let q = builder.build().await.unwrap();
    assert!(!format!("{q:?}").contains("Hunter2"));
    let stats = q.stats(10).await.unwrap();
    assert!(!format!("{stats:?}").contains("Hunter2"));
    if let Some(p) = q.persistence() {
        assert!(!format!("{p} {p:?}").contains("Hunter2"));
    }
    // A wrong password, and a server that is not there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for url in [
        format!("redis://:Wrong-Hunter3@127.0.0.1:{}/", server.port()),
        format!("redis://user:Wrong-Hunter3@127.0.0.1:{closed}/"),
        "redis://:Wrong-Hunter3@[not a host/".to_string(),
    ] {
        let error = RedisQueue::<String>::builder("secret")
            .url(url.as_str())
            .response_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("Hunter3"), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_prefixes_are_validated() {
    let Some(server) = require() else { return };
    for (name, prefix) in [
        ("", "wq"),
        ("a{b}", "wq"),
        ("a b", "wq"),
        ("a\nb", "wq"),
        ("ok", ""),
        ("ok", "w{q"),
        ("ok", "w q"),
    ] {
        let error = builder(&server, name)
            .prefix(prefix)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::Config(_)),
            "{name:?} {prefix:?}: {error}"
        );
    }
    builder(&server, "ok:name-1.2")
        .prefix("app/wq")
        .build()
        .await
        .unwrap();
}
