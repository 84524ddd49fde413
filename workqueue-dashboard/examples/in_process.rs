//! A service that mounts the dashboard of its in-process queues next to its own routes:
//! `cargo run -p workqueue-dashboard --example in_process`, then open
//! <http://127.0.0.1:8081/dashboard/>.

use std::time::Duration;

use workqueue_dashboard::{Config, MemorySource};

#[tokio::main]
async fn main() {
    let source = MemorySource::new();
    let queue: workqueue::WorkQueue<u64> = workqueue::WorkQueue::builder()
        .name("reconcile")
        .metrics(source.clone())
        .build();
    // A producer and a slow worker, so the page has something to show.
    let producer = queue.clone();
    tokio::spawn(async move {
        for i in 0.. {
            producer.add(i % 500);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let worker = queue.clone();
    tokio::spawn(async move {
        while let Some(lease) = worker.get().await {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(lease);
        }
    });
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .nest_service(
            "/dashboard",
            workqueue_dashboard::router(source, Config::default()),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8081")
        .await
        .expect("listen on 127.0.0.1:8081");
    println!("http://127.0.0.1:8081/dashboard/");
    axum::serve(listener, app).await.expect("serve");
}
