//! A controller in one page: the handler is all you write.
//!
//! Events name objects (`"namespace/name"` keys); the queue merges repeated events for an
//! object; four workers reconcile, retry failures with client-go's backoff, give up on what
//! cannot succeed, and stop cleanly.
//!
//! ```sh
//! cargo run -p workq --features tokio --example controller
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use workq::{Outcome, WorkQueue, Workers};

/// The reconciler: make the world match the object named `key`.
async fn reconcile(key: &str) -> Result<Outcome, String> {
    tokio::time::sleep(Duration::from_millis(5)).await; // talk to the API server
    match key {
        // Transient: fails once, then succeeds on its backoff retry (5 ms later).
        "default/flaky" if !FLAKED.swap(true, Ordering::Relaxed) => {
            Err("connection reset".to_owned())
        }
        // Permanent: retrying cannot help.
        "default/invalid" => Ok(Outcome::GiveUp),
        _ => Ok(Outcome::Done),
    }
}

static FLAKED: AtomicBool = AtomicBool::new(false);

#[tokio::main]
async fn main() {
    let queue = WorkQueue::new();
    let workers = Workers::new(queue.clone())
        .count(4)
        .max_retries(5)
        .timeout(Duration::from_secs(30))
        .shutdown_timeout(Duration::from_secs(10))
        .on_give_up(|gave_up| println!("gave up on {} ({})", gave_up.item, gave_up.reason))
        .spawn_async(|key: String| async move {
            let outcome = reconcile(&key).await;
            println!("reconciled {key}: {outcome:?}");
            outcome
        });

    // Your informer's event handlers add keys; repeated events for one object are merged.
    for key in [
        "default/web-0",
        "default/web-1",
        "default/web-0",
        "default/flaky",
    ] {
        queue.add(key.to_owned());
    }
    queue.add("default/invalid".to_owned());

    // A real controller runs until a signal: `workers.run_until(tokio::signal::ctrl_c())`.
    // This example stops once everything has settled.
    let settled = {
        let queue = queue.clone();
        async move {
            while !queue.is_empty() || queue.delayed_len() > 0 || queue.processing_len() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let summary = workers.run_until(settled).await;
    println!("{summary}");

    assert!(summary.is_drained());
    assert_eq!(summary.given_up, 1);
}
