//! Rules only a shared queue has: leases that expire, fencing tokens, reclaim, the server's
//! clock, restarts, dead letters, persistence checks, namespacing and auth. Each test starts
//! its own `redis-server` (a missing binary fails the test; see TESTING.md for the opt-out).

mod support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use support::server::{Durability, RedisServer};
use workq::admin::End;
use workq::{AddKind, AddOptions, DoneMany, Queue, TryGet};
use workq_redis::{Error, Lease, RateLimit, RedisQueue};

async fn queue(server: &RedisServer, name: &str, lease: Duration) -> RedisQueue<String> {
    RedisQueue::builder(name)
        .url(server.url())
        .lease_duration(lease)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_and_its_holder_fenced() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = RedisQueue::<String>::builder("fence")
        .url(server.url())
        .lease_duration(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    q.add("key".to_string()).await.unwrap();
    let stale = q.try_get().await.unwrap().into_lease().unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(stale.is_lost(), "the local deadline has passed too");

    // The next get reclaims the item and hands it out under a larger token.
    let fresh = q.try_get().await.unwrap().into_lease().unwrap();
    assert!(fresh.token() > stale.token());
    let stats = q.stats(10).await.unwrap();
    assert_eq!(stats.summary.stalled, 1);

    // The stale holder can neither renew nor mark the item done...
    assert!(stale.renew().await.unwrap_err().is_lease_lost());
    q.add("key".to_string()).await.unwrap(); // re-added while the fresh holder works
    assert!(matches!(stale.done().await, Err(Error::LeaseLost)));
    // ...so the fresh holder's claim and the pending re-add are intact.
    assert_eq!(q.processing_len().await.unwrap(), 1);
    assert!(q.try_get().await.unwrap().is_empty());
    fresh.done().await.unwrap();
    let again = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(again.item(), "key");
    again.done().await.unwrap();
}

#[tokio::test]
async fn a_held_lease_renews_itself_past_its_duration() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "renew", Duration::from_millis(900)).await;
    q.add("key".to_string()).await.unwrap();
    let lease = q.get().await.unwrap().unwrap();
    let other = q.clone();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(other.try_get().await.unwrap().is_empty());
    assert!(!lease.is_lost());
    assert!(lease.valid_until() > Instant::now());
    lease.done().await.unwrap();
    assert_eq!(q.stats(10).await.unwrap().summary.stalled, 0);
}

#[tokio::test]
async fn an_abandoned_item_is_handed_out_again_after_its_lease() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "abandon", Duration::from_millis(200)).await;
    q.add("key".to_string()).await.unwrap();
    let start = Instant::now();
    q.get().await.unwrap().unwrap().abandon();
    // A blocked getter wakes when the lease is due, without an add.
    let again = tokio::time::timeout(Duration::from_secs(5), q.get())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(190));
    assert_eq!(again.item(), "key");
}

#[tokio::test]
async fn lost_completes_when_the_lease_is_taken() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "lost", Duration::from_millis(300)).await;
    q.add("key".to_string()).await.unwrap();
    let lease = q.get().await.unwrap().unwrap();
    // Someone clears the claim behind the holder's back (as a reclaim after a pause would).
    let mut con = support::raw(&server).await;
    let _: () = con.hdel("wq:{lost}:lease", "\"key\"").await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("the renewal finds the lease gone");
    assert!(lease.is_lost());
}

#[tokio::test]
async fn deadlines_are_on_the_server_clock() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "clock", Duration::from_secs(10)).await;
    q.add("key".to_string()).await.unwrap();
    let _lease = q.get().await.unwrap().unwrap();
    let mut con = support::raw(&server).await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let now = secs * 1_000_000 + micros;
    let deadline: f64 = con.zscore("wq:{clock}:proc", "\"key\"").await.unwrap();
    let ahead = deadline as i64 - now as i64;
    assert!(
        (9_000_000..=10_000_000).contains(&ahead),
        "deadline {ahead} us after the server's now"
    );
}

#[tokio::test]
async fn tokens_keep_growing_when_the_server_lost_its_counter() {
    let Some(mut server) = support::server::require_with(Durability::None, &[]) else {
        return;
    };
    let q = queue(&server, "tokens", Duration::from_secs(5)).await;
    q.add("a".to_string()).await.unwrap();
    let before = q.try_get().await.unwrap().into_lease().unwrap();
    let token = before.token();
    before.abandon();
    server.kill();
    server.restart();
    // The queue reconnects by itself, and reloads its scripts.
    let added = loop {
        match q.add("a".to_string()).await {
            Ok(added) => break added,
            Err(e) => {
                assert!(e.is_connection(), "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(
        added.kind,
        AddKind::Queued,
        "everything was lost, as expected"
    );
    let after = q.try_get().await.unwrap().into_lease().unwrap();
    assert!(after.token() > token, "{} > {token}", after.token());
}

#[tokio::test]
async fn a_restart_with_aof_keeps_the_queue_and_its_leases() {
    let Some(mut server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "restart", Duration::from_secs(10)).await;
    for item in ["a", "b", "c"] {
        q.add(item.to_string()).await.unwrap();
    }
    let a = q.try_get().await.unwrap().into_lease().unwrap();
    q.add_after("d".to_string(), Duration::from_millis(100))
        .await
        .unwrap();
    server.kill();
    server.restart();
    let len = loop {
        match q.len().await {
            Ok(len) => break len,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert!(len >= 2, "b and c survived ({len})");
    a.done().await.expect("the lease survived too");
    let mut rest = Vec::new();
    while rest.len() < 3 {
        let lease = q.get().await.unwrap().unwrap();
        rest.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(rest, ["b", "c", "d"]);
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Pod {
    namespace: String,
    name: String,
}

#[tokio::test]
async fn an_item_that_does_not_deserialize_goes_to_the_dead_letters() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q: RedisQueue<Pod> = RedisQueue::connect(&server.url(), "pods").await.unwrap();
    // An entry written by an older version of the program, or by hand.
    let old: RedisQueue<String> = RedisQueue::connect(&server.url(), "pods").await.unwrap();
    old.add("default/web-0".to_string()).await.unwrap();
    let pod = Pod {
        namespace: "default".into(),
        name: "web-1".into(),
    };
    q.add(&pod).await.unwrap();

    let lease = q.get().await.unwrap().unwrap();
    assert_eq!(*lease, pod, "the bad entry was skipped, not handed out");
    lease.done().await.unwrap();
    let dead = q.dead_letters(End::First, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].item, "\"default/web-0\"");
    assert!(dead[0].error.contains("invalid type"), "{}", dead[0].error);
    let stats = q.stats(10).await.unwrap();
    assert_eq!(
        (
            stats.summary.dead,
            stats.summary.depth,
            stats.summary.in_flight
        ),
        (1, 0, 0)
    );
    assert!(q.try_get().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_persistence_check_reports_what_cannot_keep_the_promise() {
    let Some(durable) = support::server::require() else {
        return;
    };
    let q = queue(&durable, "p", Duration::from_secs(1)).await;
    let report = q.persistence().unwrap();
    assert!(report.is_durable(), "{report}: {:?}", report.problems());

    let Some(volatile) =
        support::server::require_with(Durability::None, &["--maxmemory-policy", "allkeys-lru"])
    else {
        return;
    };
    let q = queue(&volatile, "p", Duration::from_secs(1)).await;
    let problems = q.persistence().unwrap().problems();
    assert!(
        problems.iter().any(|p| p.contains("appendonly")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("maxmemory-policy")),
        "{problems:?}"
    );
}

/// How many lines of `log` hold `text`.
fn lines_with(log: &support::Log, text: &str) -> usize {
    log.text().lines().filter(|l| l.contains(text)).count()
}

/// `rounds` of an add, a get and a done on `q`, 50 ms apart.
async fn calls(q: &RedisQueue<String>, rounds: usize) {
    for i in 0..rounds {
        q.add(format!("x{i}")).await.unwrap();
        let lease = q.try_get().await.unwrap().into_lease().unwrap();
        lease.done().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sets `maxmemory-policy` to `policy` on the server of `q`, makes calls until `log` holds
/// `logged` (within 10 s), then ten more (several checks of the settings); the lines of
/// `log` that hold `logged` then.
async fn change_and_call(
    server: &RedisServer,
    q: &RedisQueue<String>,
    log: &support::Log,
    policy: &str,
    logged: &str,
) -> Vec<String> {
    support::set_eviction(&server.url(), policy).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines_with(log, logged) == 0 {
        assert!(Instant::now() < deadline, "not logged: {}", log.text());
        calls(q, 1).await;
    }
    calls(q, 10).await;
    log.text()
        .lines()
        .filter(|l| l.contains(logged))
        .map(str::to_owned)
        .collect()
}

/// A worker's handle reads the server's settings again while it lives: an eviction policy
/// set on the running server is logged once, however many calls the handle makes, and so
/// is its fix; a dropped handle reads nothing more.
#[tokio::test]
async fn a_handle_logs_an_eviction_policy_set_on_the_running_server_once() {
    let Some(server) = support::server::require() else {
        return;
    };
    // The handle's task runs on this (current-thread) runtime, so its events go here.
    let log = support::Log::default();
    let _logging = log.capture();
    let q: RedisQueue<String> = RedisQueue::builder("watched")
        .url(server.url())
        .settings_check_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    assert!(q.persistence().unwrap().is_durable());
    calls(&q, 6).await;
    assert_eq!(
        lines_with(&log, "persistence settings"),
        0,
        "{}",
        log.text()
    );

    let evicting = "maxmemory-policy is \"allkeys-lru\"";
    let warned = change_and_call(&server, &q, &log, "allkeys-lru", evicting).await;
    assert_eq!(warned.len(), 1, "once per change: {}", log.text());
    assert!(
        warned[0].contains("WARN") && warned[0].contains("queue=\"watched\""),
        "{}",
        warned[0]
    );
    let fixed = "they keep acknowledged work through a crash again";
    let noted = change_and_call(&server, &q, &log, "noeviction", fixed).await;
    assert_eq!(noted.len(), 1, "{}", log.text());
    assert_eq!(lines_with(&log, evicting), 1, "{}", log.text());

    drop(q);
    support::set_eviction(&server.url(), "allkeys-lru").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lines_with(&log, evicting),
        1,
        "the dropped handle's check ended: {}",
        log.text()
    );
}

#[tokio::test]
async fn keys_are_namespaced_per_queue_with_one_hash_tag() {
    let Some(server) = support::server::require() else {
        return;
    };
    let a = queue(&server, "orders", Duration::from_secs(5)).await;
    let b = queue(&server, "invoices", Duration::from_secs(5)).await;
    let c: RedisQueue<String> = RedisQueue::builder("orders")
        .url(server.url())
        .prefix("other")
        .build()
        .await
        .unwrap();
    a.add("x".to_string()).await.unwrap();
    b.add("x".to_string()).await.unwrap();
    assert_eq!(c.len().await.unwrap(), 0, "another prefix is another queue");
    let lease = a.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(b.len().await.unwrap(), 1, "another name is another queue");
    lease.done().await.unwrap();

    let mut con = support::raw(&server).await;
    let keys: Vec<String> = con.keys("*").await.unwrap();
    assert!(!keys.is_empty());
    for key in &keys {
        // Each prefix's index of queue names is the one key outside a queue's hash tag.
        assert!(
            key.starts_with("wq:{orders}:")
                || key.starts_with("wq:{invoices}:")
                || key == "wq:queues"
                || key == "other:queues",
            "{key}"
        );
    }
    let mut indexed: Vec<String> = con.smembers("wq:queues").await.unwrap();
    indexed.sort();
    assert_eq!(indexed, ["invoices", "orders"]);
    let other: Vec<String> = con.smembers("other:queues").await.unwrap();
    assert_eq!(other, ["orders"]);
    let keys: Vec<String> = keys.into_iter().filter(|k| k.contains('{')).collect();
    let slots = |name: &str| -> Vec<String> {
        keys.iter()
            .filter(|k| k.contains(name))
            .map(|k| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_string())
            .collect()
    };
    assert!(slots("orders").iter().all(|tag| tag == "{orders}"));
    assert!(
        RedisQueue::<String>::builder("a{b}")
            .url(server.url())
            .build()
            .await
            .is_err(),
        "braces would break the hash tag"
    );
}

#[tokio::test]
async fn a_password_in_the_url_is_used() {
    let Some(server) =
        support::server::require_with(Durability::Always, &["--requirepass", "s3cret"])
    else {
        return;
    };
    let url = format!("redis://:s3cret@127.0.0.1:{}/", server.port());
    let q: RedisQueue<String> = RedisQueue::connect(&url, "auth").await.unwrap();
    q.add("x".to_string()).await.unwrap();
    assert_eq!(q.len().await.unwrap(), 1);

    let wrong = format!("redis://:nope@127.0.0.1:{}/", server.port());
    assert!(
        RedisQueue::<String>::connect(&wrong, "auth").await.is_err(),
        "a wrong password is refused"
    );
}

#[tokio::test]
async fn stats_show_depth_delays_leases_and_failures() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q: RedisQueue<String> = RedisQueue::builder("stats")
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .rate_limit(RateLimit::exponential(
            Duration::from_secs(60),
            Duration::from_secs(600),
        ))
        .build()
        .await
        .unwrap();
    q.add("a".to_string()).await.unwrap();
    q.add("b".to_string()).await.unwrap();
    q.add_after("c".to_string(), Duration::from_secs(60))
        .await
        .unwrap();
    q.add_rate_limited("d".to_string()).await.unwrap();
    q.add_rate_limited("d".to_string()).await.unwrap();
    let a = q.try_get().await.unwrap().into_lease().unwrap();
    q.add("a".to_string()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = q.stats(10).await.unwrap();
    assert_eq!(stats.summary.depth, 1);
    assert_eq!(stats.summary.in_flight, 1);
    assert_eq!(stats.summary.in_flight_dirty, 1);
    assert_eq!(stats.summary.failing, 1);
    assert_eq!(stats.failures, [("\"d\"".to_string(), 2)]);
    assert_eq!(stats.summary.delayed, 2);
    assert_eq!(stats.leases.len(), 1);
    assert_eq!(stats.leases[0].item, "\"a\"");
    assert_eq!(stats.leases[0].lease.token, a.token());
    assert!(stats.leases[0].lease.age >= Duration::from_millis(40));
    assert!(stats.leases[0].lease.expires_in > Duration::from_secs(25));
    assert!(!stats.summary.shut_down);
    a.done().await.unwrap();
}

#[tokio::test]
async fn many_handles_in_one_process_never_share_an_item() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "many", Duration::from_secs(5)).await;
    let mut workers = Vec::new();
    for _ in 0..8 {
        let q = RedisQueue::<String>::connect(&server.url(), "many")
            .await
            .unwrap();
        workers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(lease) = q.get().await.unwrap() {
                seen.push(lease.item().clone());
                lease.done().await.unwrap();
            }
            seen
        }));
    }
    for i in 0..200 {
        q.add(format!("item-{i}")).await.unwrap();
    }
    while q.len().await.unwrap() > 0 || q.processing_len().await.unwrap() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stops every handle's getters (a handle's own shut_down would stop only `q`).
    q.shut_down_fleet().await.unwrap();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 200);
}

/// `rediss://` with a password in the URL, against a server with a self-signed certificate
/// (made with the `openssl` command; skipped without it).
#[cfg(feature = "tls")]
#[tokio::test]
async fn rediss_urls_with_a_password_work() {
    let dir = std::env::temp_dir().join(format!("wq-redis-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    // A test CA, and a server certificate it signs (webpki refuses a CA as the server's).
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=wq-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "key.pem",
            "-out",
            "req.csr",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "cert.pem",
        ],
    ];
    let made = steps.iter().all(|args| {
        std::process::Command::new("openssl")
            .args(*args)
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !made {
        eprintln!("note: openssl not found; skipping the TLS test");
        return;
    }
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let (ca_s, cert_s, key_s) = (
        ca.display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
    );
    let Some(server) = support::server::require_with(
        Durability::Always,
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert_s,
            "--tls-key-file",
            &key_s,
            "--tls-ca-cert-file",
            &ca_s,
            "--tls-auth-clients",
            "no",
            "--requirepass",
            "s3cret",
        ],
    ) else {
        return;
    };
    let url = format!("rediss://:s3cret@127.0.0.1:{tls_port}/");
    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&ca).unwrap()),
        },
    )
    .unwrap();
    let q: RedisQueue<String> = RedisQueue::builder("tls")
        .client(client)
        .build()
        .await
        .unwrap();
    q.add("x".to_string()).await.unwrap();
    let lease = q.get().await.unwrap().unwrap();
    assert_eq!(lease.item(), "x");
    lease.done().await.unwrap();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn batched_adds_give_the_answers_of_adds_one_by_one() {
    let Some(server) = support::server::require() else {
        return;
    };
    let batched = queue(&server, "batch", Duration::from_secs(10)).await;
    let single = queue(&server, "single", Duration::from_secs(10)).await;
    // More adds than one script run takes, with duplicates, delays, and duplicates of delayed
    // items (the earliest ready time wins). The delays outlast the adds one by one: an add of
    // an item whose delay ran out is a duplicate (it is queued from its due time on), so a
    // shorter delay would make the answers depend on how long the adds took.
    let adds: Vec<(String, Duration)> = (0..700_u64)
        .map(|i| {
            let delay = match i % 7 {
                0 => Duration::from_millis(6000 + i % 5),
                3 => Duration::from_millis(5000),
                _ => Duration::ZERO,
            };
            (format!("k{}", (i * 13) % 450), delay)
        })
        .collect();
    let added = batched.add_all_after(adds.clone()).await.unwrap();
    let mut expected = Vec::new();
    for (item, delay) in &adds {
        expected.push(single.add_after(item.clone(), *delay).await.unwrap().kind);
    }
    let kinds: Vec<AddKind> = added.iter().map(|a| a.kind).collect();
    assert_eq!(kinds, expected);
    assert!(added.windows(2).all(|w| w[0].seq < w[1].seq));
    // Every distinct item is queued or waiting for its delay, once.
    for q in [&batched, &single] {
        let held = q.len().await.unwrap() + q.delayed_len().await.unwrap();
        assert_eq!(held, 450);
    }
    // The same items come out in the same order.
    async fn drain(q: &RedisQueue<String>) -> Vec<String> {
        let mut order = Vec::new();
        while !q.is_empty().await.unwrap() || q.delayed_len().await.unwrap() > 0 {
            let lease = q.get().await.unwrap().unwrap();
            order.push(lease.item().clone());
            lease.done().await.unwrap();
        }
        order
    }
    let (mut a, mut b) = (drain(&batched).await, drain(&single).await);
    assert_eq!(a.len(), 450);
    // Items never added with a delay come out in the order of their first add, in both.
    let delayed: std::collections::HashSet<&String> = adds
        .iter()
        .filter(|(_, delay)| !delay.is_zero())
        .map(|(item, _)| item)
        .collect();
    let mut first_adds: Vec<&String> = Vec::new();
    for (item, _) in &adds {
        if !delayed.contains(item) && !first_adds.contains(&item) {
            first_adds.push(item);
        }
    }
    let undelayed = |order: &[String]| -> Vec<String> {
        order
            .iter()
            .filter(|item| !delayed.contains(item))
            .cloned()
            .collect()
    };
    assert_eq!(
        undelayed(&a),
        first_adds.iter().map(|&s| s.clone()).collect::<Vec<_>>()
    );
    assert_eq!(undelayed(&a), undelayed(&b));
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // A queue shut down for every process ignores every add of a batch.
    batched.shut_down_fleet().await.unwrap();
    let ignored = batched.add_all(["x", "y"].map(String::from)).await.unwrap();
    assert!(ignored.iter().all(|a| a.kind == AddKind::Ignored));
}

/// Leases to finish without forgetting their items' failures.
fn unforgotten<T>(leases: Vec<Lease<T>>) -> Vec<(Lease<T>, bool)> {
    leases.into_iter().map(|lease| (lease, false)).collect()
}

#[tokio::test]
async fn done_and_get_many_finishes_a_batch_and_takes_the_next() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "many", Duration::from_secs(10)).await;
    q.add_all((0..10).map(|i| format!("i{i}"))).await.unwrap();
    // No leases: a try_get of up to three, in FIFO order.
    let DoneMany { done, next, .. } = q.done_and_get_many(Vec::new(), 3).await.unwrap();
    assert!(done.is_empty());
    let items: Vec<&String> = next.iter().map(|l| l.item()).collect();
    assert_eq!(items, ["i0", "i1", "i2"]);
    // i1 is re-added while processing: done re-queues it at the tail.
    q.add("i1".to_string()).await.unwrap();
    assert_eq!(q.processing_len().await.unwrap(), 3);
    let DoneMany { done, next, .. } = q.done_and_get_many(unforgotten(next), 4).await.unwrap();
    assert!(done.iter().all(Result::is_ok));
    assert_eq!(done.len(), 3);
    let items: Vec<&String> = next.iter().map(|l| l.item()).collect();
    assert_eq!(items, ["i3", "i4", "i5", "i6"]);
    // Fewer ready than asked for: all of them, i1 last.
    let DoneMany { done, next, .. } = q.done_and_get_many(unforgotten(next), 100).await.unwrap();
    assert_eq!(done.len(), 4);
    let items: Vec<&String> = next.iter().map(|l| l.item()).collect();
    assert_eq!(items, ["i7", "i8", "i9", "i1"]);
    assert!(q.is_empty().await.unwrap());
    // A lease lost meanwhile (i8's) is refused and changes nothing; the others are done.
    assert_eq!(next[1].item(), "i8");
    let con = &mut support::raw(&server).await;
    let _: () = redis::cmd("HDEL")
        .arg("wq:{many}:lease")
        .arg("\"i8\"")
        .query_async(con)
        .await
        .unwrap();
    let DoneMany { done, next, .. } = q.done_and_get_many(unforgotten(next), 5).await.unwrap();
    assert!(next.is_empty());
    assert!(done[0].is_ok() && done[2].is_ok() && done[3].is_ok());
    assert!(matches!(done[1], Err(Error::LeaseLost)));
    // Once this handle is shut down nothing more is handed out.
    q.add("late".to_string()).await.unwrap();
    q.shut_down();
    let DoneMany { next, .. } = q.done_and_get_many(Vec::new(), 5).await.unwrap();
    assert!(next.is_empty());
}

/// A batch of adds now without priorities (add_many's batched path) does what the same adds
/// one by one do: items being processed (clean and dirty), queued, delayed with a priority,
/// new, and named twice in the batch.
#[tokio::test]
async fn add_all_now_keeps_the_rules_of_one_add_at_a_time() {
    let Some(server) = support::server::require() else {
        return;
    };
    let batched = queue(&server, "now-batched", Duration::from_secs(10)).await;
    let single = queue(&server, "now-single", Duration::from_secs(10)).await;
    let mut held = Vec::new();
    for q in [&batched, &single] {
        q.add("p1".to_string()).await.unwrap();
        q.add("p2".to_string()).await.unwrap();
        let p1 = q.get().await.unwrap().unwrap();
        let p2 = q.get().await.unwrap().unwrap();
        q.add("p2".to_string()).await.unwrap(); // dirty while processing
        q.add_with(
            "d".to_string(),
            AddOptions::default()
                .after(Duration::from_secs(60))
                .priority(5),
        )
        .await
        .unwrap();
        q.add("q".to_string()).await.unwrap();
        held.push((p1, p2));
    }
    let batch = ["new", "p1", "p2", "d", "q", "new", "p1"].map(String::from);
    let kinds: Vec<AddKind> = batched
        .add_all(&batch)
        .await
        .unwrap()
        .iter()
        .map(|a| a.kind)
        .collect();
    let mut one_by_one = Vec::new();
    for item in &batch {
        one_by_one.push(single.add(item.clone()).await.unwrap().kind);
    }
    assert_eq!(kinds, one_by_one);
    assert_eq!(
        kinds,
        [
            AddKind::Queued,
            AddKind::Deferred,
            AddKind::Duplicate,
            AddKind::Queued,
            AddKind::Duplicate,
            AddKind::Duplicate,
            AddKind::Duplicate,
        ]
    );
    // The same items come out in the same order: d first (its priority), then the queue's
    // order, then the re-adds as their leases end.
    let mut orders = Vec::new();
    for (q, (p1, p2)) in [&batched, &single].into_iter().zip(held) {
        assert_eq!(q.delayed_len().await.unwrap(), 0);
        p1.done().await.unwrap();
        p2.done().await.unwrap();
        let mut order = Vec::new();
        while let TryGet::Leased(lease) = q.try_get().await.unwrap() {
            order.push(lease.item().clone());
            lease.done().await.unwrap();
        }
        orders.push(order);
    }
    assert_eq!(orders[0], ["d", "q", "new", "p1", "p2"]);
    assert_eq!(orders[0], orders[1]);
}

/// `Queue::done_and_next_many`, the batched step of `Workers`: each item's failures are
/// forgotten only where its flag says so, the hand-outs are FIFO with increasing tokens, and
/// a stale lease of an item beside its current one is refused without touching the current.
#[tokio::test]
async fn done_and_next_many_forgets_where_asked_and_fences_each_lease() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "step", Duration::from_secs(10)).await;
    q.add_all(["a", "b", "c", "d", "e", "f"].map(String::from))
        .await
        .unwrap();
    let DoneMany { next: held, .. } = q.done_and_get_many(Vec::new(), 3).await.unwrap();
    let last_token = held.iter().map(|l| l.token()).max().unwrap();
    // A failure counted for each item being processed (a rate-limited re-add).
    for lease in &held {
        q.add_rate_limited(lease.item().clone()).await.unwrap();
        assert_eq!(q.num_requeues(lease.item().clone()).await.unwrap(), 1);
    }
    let steps: Vec<(_, bool)> = held.into_iter().zip([true, false, true]).collect();
    let DoneMany { done, next } = Queue::done_and_next_many(&q, steps, 2).await.unwrap();
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_eq!(q.num_requeues("a".to_string()).await.unwrap(), 0);
    assert_eq!(q.num_requeues("b".to_string()).await.unwrap(), 1);
    assert_eq!(q.num_requeues("c".to_string()).await.unwrap(), 0);
    let items: Vec<&str> = next.iter().map(|l| l.item().as_str()).collect();
    assert_eq!(items, ["d", "e"]);
    assert!(next[0].token() > last_token && next[1].token() > next[0].token());
    // The rate-limited re-adds come due after their backoff, behind f.
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.delayed_len().await.unwrap() > 0 || q.len().await.unwrap() < 4 {
        assert!(Instant::now() < deadline, "the re-adds never came due");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // An empty step with room for more takes the rest, in order.
    let DoneMany { done, next: rest } =
        Queue::done_and_next_many(&q, Vec::new(), 10).await.unwrap();
    assert!(done.is_empty());
    let items: Vec<&str> = rest.iter().map(|l| l.item().as_str()).collect();
    assert_eq!(items, ["f", "a", "b", "c"]);
    let steps = next.into_iter().chain(rest).map(|l| (l, false)).collect();
    let DoneMany { done, .. } = Queue::done_and_next_many(&q, steps, 0).await.unwrap();
    assert_eq!(done.len(), 6);
    assert!(done.iter().all(Result::is_ok));

    // A lease that expired and the one that reclaimed its item, in one step.
    let short = RedisQueue::<String>::builder("step-stale")
        .url(server.url())
        .lease_duration(Duration::from_millis(100))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    short.add("x".to_string()).await.unwrap();
    let stale = short.get().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = short.get().await.unwrap().unwrap();
    assert_eq!(current.item(), "x");
    short.add("x".to_string()).await.unwrap(); // re-added while processing
    let DoneMany { done, next } =
        Queue::done_and_next_many(&short, vec![(stale, false), (current, false)], 1)
            .await
            .unwrap();
    assert!(matches!(done[0], Err(Error::LeaseLost)), "{done:?}");
    assert!(done[1].is_ok(), "{done:?}");
    // The current holder's done re-queued the re-add, which is handed out again.
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].item(), "x");
}

#[tokio::test]
async fn pipelined_adds_and_done_and_get_keep_the_rules() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "pipe", Duration::from_secs(10)).await;
    // The scripts are not loaded yet on a fresh server: the pipeline loads them and retries.
    let mut con = support::raw(&server).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let added = q
        .add_all(["a", "b", "a", "c"].map(String::from))
        .await
        .unwrap();
    let kinds: Vec<AddKind> = added.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        [
            AddKind::Queued,
            AddKind::Queued,
            AddKind::Duplicate,
            AddKind::Queued
        ]
    );
    assert!(added.windows(2).all(|w| w[0].seq < w[1].seq));
    let delayed = q
        .add_all_after([("d".to_string(), Duration::from_millis(100))])
        .await
        .unwrap();
    assert_eq!(delayed[0].kind, AddKind::Delayed);

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut lease = q.get().await.unwrap().unwrap();
    q.add("a".to_string()).await.unwrap(); // re-added while processing
    let mut order = vec![lease.item().clone()];
    while let Some(next) = q.done_and_get(lease, false).await.unwrap() {
        order.push(next.item().clone());
        lease = next;
    }
    assert_eq!(order, ["a", "b", "c", "a"]);
    let d = q.get().await.unwrap().unwrap();
    assert_eq!(d.item(), "d");

    // A stale holder's done in the pipeline is refused and changes nothing.
    let stale_queue = RedisQueue::<String>::builder("pipe2")
        .url(server.url())
        .lease_duration(Duration::from_millis(100))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    stale_queue.add("x".to_string()).await.unwrap();
    let stale = stale_queue.try_get().await.unwrap().into_lease().unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let fresh = stale_queue.try_get().await.unwrap().into_lease().unwrap();
    let refused = stale_queue.done_and_get(stale, false).await;
    assert!(
        refused.unwrap_err().is_lease_lost(),
        "and nothing handed out"
    );
    assert_eq!(stale_queue.processing_len().await.unwrap(), 1);
    fresh.done().await.unwrap();
}

#[tokio::test]
async fn an_item_whose_workers_keep_dying_goes_to_the_dead_letters() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q: RedisQueue<String> = RedisQueue::builder("poison")
        .url(server.url())
        .lease_duration(Duration::from_millis(100))
        .auto_renew(false)
        .max_stalls(2)
        .build()
        .await
        .unwrap();
    q.add("poison".to_string()).await.unwrap();
    q.add("fine".to_string()).await.unwrap();
    // "fine" stalls once, then is done: its count starts over.
    for round in 0..2 {
        let first = q.try_get().await.unwrap().into_lease().unwrap();
        let second = q.try_get().await.unwrap().into_lease().unwrap();
        assert_eq!(
            (first.item().as_str(), second.item().as_str()),
            ("poison", "fine")
        );
        first.abandon();
        if round == 0 {
            second.abandon();
        } else {
            second.done().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        if round == 0 {
            // Reclaimed: both go back to the head, oldest lease first.
            assert_eq!(q.len().await.unwrap(), 2);
        }
    }
    // The second expiry of "poison" dead-letters it.
    assert_eq!(q.len().await.unwrap(), 0);
    assert!(q.try_get().await.unwrap().is_empty());
    let dead = q.dead_letters(End::First, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].item, "\"poison\"");
    assert!(
        dead[0].error.contains("expired 2 times"),
        "{}",
        dead[0].error
    );
    assert_eq!(q.stats(10).await.unwrap().summary.stalled, 0);
}

/// The mutations exist to prove the fault tests can fail: each must really break its rule.
#[tokio::test]
async fn mutations_break_the_rules_they_name() {
    let Some(server) = support::server::require() else {
        return;
    };
    // NoFencing: a stale holder's done is accepted and clears the new holder's claim.
    let q = RedisQueue::<String>::builder("mut-fence")
        .url(server.url())
        .lease_duration(Duration::from_millis(200))
        .auto_renew(false)
        .mutation(workq_redis::Mutation::NoFencing)
        .build()
        .await
        .unwrap();
    q.add("a".to_string()).await.unwrap();
    let stale = q.try_get().await.unwrap().into_lease().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fresh = q.try_get().await.unwrap().into_lease().unwrap();
    assert!(fresh.token() > stale.token());
    stale
        .done()
        .await
        .expect("the mutation accepts a stale done");
    assert_eq!(
        q.processing_len().await.unwrap(),
        0,
        "the fresh claim is gone"
    );
    fresh.abandon();

    // NoDirtyRequeue: a re-add while processing is lost at done.
    let q = RedisQueue::<String>::builder("mut-dirty")
        .url(server.url())
        .mutation(workq_redis::Mutation::NoDirtyRequeue)
        .mutation(workq_redis::Mutation::NoFencing)
        .build()
        .await
        .unwrap();
    q.add("b".to_string()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(
        q.add("b".to_string()).await.unwrap().kind,
        AddKind::Deferred
    );
    lease.done().await.unwrap();
    assert_eq!(q.len().await.unwrap(), 0, "the re-add was lost");

    // Without mutations the same sequence keeps the re-add.
    let q = queue(&server, "mut-none", Duration::from_secs(10)).await;
    q.add("b".to_string()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    q.add("b".to_string()).await.unwrap();
    lease.done().await.unwrap();
    assert_eq!(q.len().await.unwrap(), 1);
}

#[tokio::test]
async fn a_released_or_reclaimed_item_keeps_its_priority_at_the_head() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = RedisQueue::<String>::builder("prio-release")
        .url(server.url())
        .lease_duration(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    let prio = |p| AddOptions::default().priority(p);
    q.add("low".to_string()).await.unwrap();
    q.add_with("hi".to_string(), prio(5)).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!((lease.item().as_str(), lease.priority()), ("hi", 5));
    q.add_with("other".to_string(), prio(5)).await.unwrap();

    // Released: back at the head of priority 5, ahead of the item added there meanwhile.
    lease.release().await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!((lease.item().as_str(), lease.priority()), ("hi", 5));

    // Reclaimed after its holder vanished: the same.
    lease.abandon();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!((lease.item().as_str(), lease.priority()), ("hi", 5));

    // A re-add with a higher priority while processing folds into the release.
    q.add_with("hi".to_string(), prio(9)).await.unwrap();
    lease.release().await.unwrap();
    assert_eq!(q.len().await.unwrap(), 3);
    let mut order = Vec::new();
    while let TryGet::Leased(lease) = q.try_get().await.unwrap() {
        order.push((lease.item().clone(), lease.priority()));
        lease.done().await.unwrap();
    }
    assert_eq!(
        order,
        [
            ("hi".to_string(), 9),
            ("other".to_string(), 5),
            ("low".to_string(), 0)
        ]
    );
    assert_eq!(
        q.stats(10).await.unwrap().summary.stalled,
        0,
        "done clears the stall"
    );
}

#[tokio::test]
async fn done_and_get_hands_out_the_highest_priority() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "prio-pipeline", Duration::from_secs(30)).await;
    let prio = |p| AddOptions::default().priority(p);
    q.add("zero".to_string()).await.unwrap();
    q.add_with("three".to_string(), prio(3)).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(lease.priority(), 3);
    q.add_with("seven".to_string(), prio(7)).await.unwrap();
    let next = q.done_and_get(lease, false).await.unwrap();
    let next = next.expect("a ready item");
    assert_eq!((next.item().as_str(), next.priority()), ("seven", 7));
    let next = q.done_and_get(next, false).await.unwrap();
    let next = next.expect("a ready item");
    assert_eq!((next.item().as_str(), next.priority()), ("zero", 0));
    next.done().await.unwrap();
}

#[tokio::test]
async fn stats_count_and_delete_removes_every_priority() {
    let Some(server) = support::server::require() else {
        return;
    };
    let q = queue(&server, "prio-delete", Duration::from_secs(30)).await;
    let prio = |p| AddOptions::default().priority(p);
    q.add_with("a".to_string(), prio(2)).await.unwrap();
    q.add_with("b".to_string(), prio(-1)).await.unwrap();
    q.add("c".to_string()).await.unwrap();
    q.add_with("d".to_string(), prio(4).after(Duration::from_secs(3600)))
        .await
        .unwrap();
    let stats = q.stats(10).await.unwrap();
    assert_eq!(
        (
            stats.summary.depth,
            stats.summary.delayed,
            stats.summary.in_flight_dirty
        ),
        (3, 1, 0)
    );
    assert_eq!(q.len().await.unwrap(), 3);

    let mut con = support::raw(&server).await;
    let keys: Vec<String> = con.keys("wq:{prio-delete}:ready:*").await.unwrap();
    assert_eq!(
        keys.len(),
        2,
        "one list per non-zero priority in use: {keys:?}"
    );
    q.delete().await.unwrap();
    let keys: Vec<String> = con.keys("wq:{prio-delete}:*").await.unwrap();
    assert!(keys.is_empty(), "left behind: {keys:?}");
    assert_eq!(q.len().await.unwrap(), 0);
}

/// An add, a get and a done on a plain queue run the commands they ran before flow control
/// and trace links existed (`INFO commandstats`), whatever the crate's features: built
/// without `otel`, and with it (the client then sends a trace context only from a recorded
/// span; `tests/trace_links.rs` counts that case too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_add_get_and_done_run_the_commands_they_always_ran() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue: RedisQueue<String> = RedisQueue::builder("commands")
        .url(server.url())
        .build()
        .await
        .unwrap();
    let con = support::raw(&server).await;
    // Warm up: the scripts are loaded.
    support::plain_commands(&con, &queue, "warm").await;
    assert_eq!(
        support::plain_commands(&con, &queue, "counted").await,
        support::PLAIN_COMMANDS
    );
}
