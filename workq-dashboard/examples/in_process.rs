//! A service that mounts the dashboard of its in-process queues next to its own routes:
//! `cargo run -p workq-dashboard --example in_process`, then open the address it prints
//! (`http://127.0.0.1:8081/dashboard/?token=...`).
//!
//! The safe way to serve it: a token (a random one, printed once), and
//! [`workq_dashboard::Server`], which bounds connections and slow clients and records
//! the client's address for the audit log.

use std::time::Duration;

use workq_dashboard::admin::MemoryAdmin;
use workq_dashboard::{Config, Server, generate_token};

#[tokio::main]
async fn main() {
    let source = MemoryAdmin::new();
    let queue: workq::WorkQueue<u64> = workq::WorkQueue::builder()
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
    let token = generate_token();
    let config = Config {
        token: Some(token.clone()),
        ..Config::default()
    };
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .nest_service("/dashboard", workq_dashboard::router(source, config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8081")
        .await
        .expect("listen on 127.0.0.1:8081");
    println!("http://127.0.0.1:8081/dashboard/?token={token}");
    Server::new(listener).serve(app).await.expect("serve");
}
