//! `--metrics-addr`: serves the queue's metrics at `/metrics` over HTTP while `wq` runs.
//!
//! A small HTTP/1.1 responder of its own: it answers one `GET` per connection on one path,
//! with the exposition encoder the dashboard uses (`wq dashboard` serves the full page with
//! axum). Each connection is read up to the end of its headers (at most 16 KiB, at most
//! 5 s), answered, and closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use workq_dashboard::exposition::encode_for_accept;

/// The most a request's head may take.
const MAX_REQUEST: usize = 16 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr` and serves `registry` until the task is dropped or aborted. Returns the
/// bound address (useful with port 0) and the serving task.
pub(crate) async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _peer)) = listener.accept().await else {
                continue;
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(READ_TIMEOUT, answer(stream, &registry)).await;
            });
        }
    });
    Ok((local, task))
}

async fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
        if request.len() > MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            )
            .await;
        }
    }
    let head = String::from_utf8_lossy(&request);
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let accept = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("accept"))
        .map(|(_, value)| value.trim().to_owned());
    match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => match encode_for_accept(registry, accept.as_deref()) {
            Ok((content_type, body)) => respond(&mut stream, "200 OK", content_type, &body).await,
            Err(_) => respond(&mut stream, "500 Internal Server Error", "text/plain", "").await,
        },
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "try /metrics\n").await,
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", "").await,
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use workq::WorkQueue;
    use workq::metrics::prometheus::PrometheusMetrics;

    async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let accept = accept
            .map(|a| format!("Accept: {a}\r\n"))
            .unwrap_or_default();
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{accept}\r\n");
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
