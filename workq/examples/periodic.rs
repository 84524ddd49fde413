//! Periodic work, once per fleet: three replicas of a program run the same schedule on one
//! queue, and each tick's item is added once between them and processed once.
//!
//! Here the replicas share an in-memory queue; on Redis or PostgreSQL they are processes on
//! different machines, and nothing in this code changes but the queue's type. Also shown: a
//! cron schedule in a time zone, jitter, and a pause for the whole fleet.
//!
//! ```sh
//! cargo run -p workq --features periodic --example periodic
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use workq::periodic::{Periodic, Schedule};
use workq::{WorkQueue, Workers};

/// The tick's instant, as a short key: milliseconds since the Unix epoch.
fn key(tick: SystemTime) -> String {
    let ms = tick
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!("compact/{ms}")
}

/// An instant in RFC 3339, UTC.
fn when(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at).map_or_else(|e| e.to_string(), |t| t.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A nightly job in Paris: 03:00 local time, whatever the daylight saving time.
    let nightly = Schedule::cron_in("0 3 * * *", "Europe/Paris")?;
    let now = SystemTime::now();
    if let Some(next) = nightly.next_after(now) {
        println!("{nightly}: next at {}", when(next));
    }

    // What this example runs: every 200 ms (a real program would say every 5 minutes).
    let every = Schedule::every(Duration::from_millis(200));
    let queue: WorkQueue<String> = WorkQueue::builder().name("maintenance").build();

    let processed: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let seen = processed.clone();
    let workers = Workers::new(queue.clone())
        .count(2)
        .spawn_async(move |item: String| {
            *seen.lock().unwrap().entry(item.clone()).or_default() += 1;
            println!("processed {item}");
            async {}
        });

    // Three replicas start the same runner (same queue, same schedule name). Each claims
    // each tick after a random jitter of up to 50 ms; the first claim adds the item.
    let replicas: Vec<_> = (0..3)
        .map(|_| {
            Periodic::new(queue.clone(), "compact", every.clone(), key)
                .jitter(Duration::from_millis(50))
                .spawn()
        })
        .collect();

    // Five ticks, then a pause for the whole fleet (through any replica) for two ticks.
    replicas[0].wait_for(|s| s.last_tick.is_some()).await;
    let first = replicas[0].status().last_tick.expect("a tick");
    let fifth = first + Duration::from_millis(800);
    for replica in &replicas {
        replica.wait_for(|s| s.last_tick >= Some(fifth)).await;
    }
    let paused = replicas[1].pause().await?;
    println!("paused: {}", paused.paused);
    let seventh = fifth + Duration::from_millis(400);
    for replica in &replicas {
        replica.wait_for(|s| s.last_tick >= Some(seventh)).await;
    }
    let resumed = replicas[2].resume().await?;
    println!(
        "resumed; the ticks up to {} are never caught up",
        when(resumed.since)
    );
    let ninth = seventh + Duration::from_millis(400);
    for replica in &replicas {
        replica.wait_for(|s| s.last_tick >= Some(ninth)).await;
    }

    let mut added = 0;
    let mut skipped = 0;
    for replica in replicas {
        let status = replica.status();
        added += status.added;
        skipped += status.paused;
        replica.stop().await;
    }
    let summary = workers
        .run_until(async {
            while !queue.is_empty() || queue.processing_len() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    println!("{summary}");

    let processed = processed.lock().unwrap();
    println!(
        "{} ticks added by three replicas, {skipped} skipped while paused, {} processed",
        added,
        processed.len()
    );
    // Once per tick: no item twice, one item per tick added.
    assert!(processed.values().all(|&n| n == 1), "{processed:?}");
    assert_eq!(processed.len() as u64, added);
    assert!(skipped >= 1, "the pause skipped no tick");
    Ok(())
}
