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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use workq::WorkQueue;
    use workq::metrics::prometheus::PrometheusMetrics;

    async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let accept = accept
            .map(|a| format!("Accept: {a}\r\n"))
            .unwrap_or_default();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{accept}\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn scrape_over_http_returns_parseable_series() {
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let queue: WorkQueue<u32> = WorkQueue::builder().name("demo").metrics(metrics).build();
        queue.add(7);
        let (addr, server) = serve("127.0.0.1:0".parse().unwrap(), Arc::new(registry))
            .await
            .unwrap();

        let response = get(addr, "/metrics", None).await;
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains("text/plain; version=0.0.4"));
        let mut samples = 0;
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("value of {series}"));
            samples += 1;
        }
        assert!(samples > 20);
        assert!(body.contains("workqueue_depth{name=\"demo\"} 1\n"));
        assert!(body.contains("# TYPE workqueue_adds_total counter\n"));
        assert!(body.contains("# HELP workqueue_adds_total "));
        assert!(!body.contains("# EOF") && !body.contains("# UNIT"));

        let response = get(addr, "/metrics", Some("application/openmetrics-text")).await;
        assert!(response.contains("application/openmetrics-text"));
        assert!(response.ends_with("# EOF\n"));

        let response = get(addr, "/other", None).await;
        assert!(response.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
