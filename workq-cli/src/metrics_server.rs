//! `--metrics-addr`: serves the queue's metrics at `/metrics` over HTTP while `wq` runs,
//! with the exposition encoder and the bounded server (connection caps, header read
//! timeout) of the dashboard, which `wq dashboard` serves in full.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use workq_dashboard::exposition::encode_for_accept;

/// Binds `addr` and serves `registry` until the task is dropped or aborted. Returns the
/// bound address (useful with port 0) and the serving task.
pub(crate) async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let scrape = move |headers: HeaderMap| async move {
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        match encode_for_accept(&registry, accept) {
            Ok((content_type, body)) => {
                ([(header::CONTENT_TYPE, content_type)], body).into_response()
            }
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    };
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .fallback(|| async { (StatusCode::NOT_FOUND, "try /metrics\n") });
    let task = tokio::spawn(async move {
        let _ = workq_dashboard::Server::new(listener).serve(app).await;
    });
    Ok((local, task))
}
