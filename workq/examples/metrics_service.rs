//! A service that exposes its queues' metrics to Prometheus.
//!
//! Two named queues report into one `prometheus-client` registry; a plain `std` HTTP server
//! answers `GET /metrics` in the format the scraper asks for (OpenMetrics, or the classic
//! text format Kubernetes serves). Workers process items meanwhile.
//!
//! ```sh
//! cargo run -p workq --features prometheus --example metrics_service -- --serve 127.0.0.1:9898
//! curl -s localhost:9898/metrics | grep workqueue_depth
//! ```
//!
//! Without `--serve`, it serves on a free port, scrapes itself once over HTTP, prints the
//! scrape and exits (this is what CI runs, piping the output into `promtool check metrics`).

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use prometheus_client::registry::Registry;
use workq::WorkQueue;
use workq::metrics::prometheus::PrometheusMetrics;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let serve_forever = match args.next().as_deref() {
        Some("--serve") => Some(args.next().unwrap_or_else(|| "127.0.0.1:9898".to_owned())),
        Some(other) => {
            eprintln!("usage: metrics_service [--serve ADDR]  (unknown argument {other:?})");
            std::process::exit(2);
        }
        None => None,
    };

    let mut registry = Registry::default();
    let metrics = PrometheusMetrics::new(&mut registry);
    let pods: WorkQueue<String> = WorkQueue::builder()
        .name("pods")
        .metrics(metrics.clone())
        .build();
    let nodes: WorkQueue<String> = WorkQueue::builder().name("nodes").metrics(metrics).build();

    // Some work: every key of `pods` is processed once, a few of `nodes` are retried.
    for i in 0..100 {
        pods.add(format!("default/web-{i}"));
    }
    for i in 0..10 {
        nodes.add_rate_limited(format!("node-{i}"));
    }
    let worker = {
        let pods = pods.clone();
        thread::spawn(move || {
            while let Some(lease) = pods.blocking_get() {
                thread::sleep(Duration::from_micros(50));
                pods.forget(&lease);
            }
        })
    };

    let listener = TcpListener::bind(serve_forever.as_deref().unwrap_or("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let registry = Arc::new(registry);
    {
        let registry = registry.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &registry);
            }
        });
    }

    if serve_forever.is_some() {
        eprintln!("serving http://{addr}/metrics; Ctrl-C to stop");
        loop {
            thread::park();
        }
    }

    // Wait for the worker to finish the pods, then scrape ourselves once.
    while !pods.is_empty() || pods.processing_len() > 0 {
        thread::sleep(Duration::from_millis(5));
    }
    let mut stream = TcpStream::connect(addr)?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    eprintln!("{}", head.lines().next().unwrap_or_default());
    print!("{body}");

    pods.shut_down();
    nodes.shut_down();
    worker.join().expect("worker panicked");
    Ok(())
}

/// Answers one HTTP request: `GET /metrics`, or 404.
fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut accept = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("accept")
        {
            accept = Some(value.trim().to_owned());
        }
    }
    let (status, content_type, body) = if request_line.starts_with("GET /metrics ") {
        match encode_for_accept(registry, accept.as_deref()) {
            Ok((content_type, body)) => ("200 OK", content_type, body),
            Err(_) => ("500 Internal Server Error", "text/plain", String::new()),
        }
    } else {
        ("404 Not Found", "text/plain", "try /metrics\n".to_owned())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Encodes `registry` in the format the scraper's `Accept` header asks for: OpenMetrics
/// (what `prometheus-client` writes) if it accepts it, else the classic Prometheus text
/// format (version 0.0.4) that Kubernetes components serve and `promtool` reads. Returns
/// the `Content-Type` and the body.
fn encode_for_accept(
    registry: &Registry,
    accept: Option<&str>,
) -> Result<(&'static str, String), fmt::Error> {
    let mut open_metrics = String::new();
    prometheus_client::encoding::text::encode(&mut open_metrics, registry)?;
    if accept.is_some_and(|accept| accept.contains("application/openmetrics-text")) {
        return Ok((
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            open_metrics,
        ));
    }
    Ok((
        "text/plain; version=0.0.4; charset=utf-8",
        classic_text(&open_metrics),
    ))
}

/// Rewrites OpenMetrics text into the classic format, for the metric types `workq`
/// registers (counters, gauges, histograms): a counter family's `# HELP` and `# TYPE`
/// lines name the `_total` sample, and `# UNIT` and `# EOF` lines go. `prometheus-client`
/// writes OpenMetrics only, hence this.
fn classic_text(open_metrics: &str) -> String {
    // Counter families, from their TYPE lines, which follow the HELP lines.
    let counters: Vec<&str> = open_metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .filter(|name| !name.ends_with("_total"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len() + 256);
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| Some((prefix, line.strip_prefix(prefix)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(&name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                } else {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}
