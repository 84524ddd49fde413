//! Serving a `prometheus-client` registry over HTTP: the classic text format (0.0.4) that
//! Kubernetes components serve and promtool lints, or OpenMetrics when the scraper asks for
//! it. This lives beside the HTTP servers (here and in `wq`), not in the `workq` core,
//! which only registers metrics.

use std::fmt;

use prometheus_client::registry::Registry;

/// The `Content-Type` of [`encode_prometheus_text`]'s output.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `Content-Type` of `prometheus_client::encoding::text::encode`'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encodes `registry` in the classic Prometheus text format (version 0.0.4), the one
/// Kubernetes components serve.
///
/// Hand-written because `prometheus-client` writes only OpenMetrics: this encodes
/// OpenMetrics and rewrites the three things that differ for the metric types `workq`
/// registers: a counter's `# HELP` and `# TYPE` lines take the `_total` sample name,
/// `# UNIT` lines go, and so does the closing `# EOF`.
///
/// # Errors
///
/// Whatever the registry's encoders return.
pub fn encode_prometheus_text(registry: &Registry) -> Result<String, fmt::Error> {
    let mut open_metrics = String::new();
    prometheus_client::encoding::text::encode(&mut open_metrics, registry)?;
    let mut out = String::with_capacity(open_metrics.len() + 256);
    // The HELP line comes before the TYPE line that says whether the family is a counter.
    let mut help: Option<&str> = None;
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(pending) = help.replace(rest) {
                push_line(&mut out, "# HELP ", pending);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let counter = kind == "counter" && !name.ends_with("_total");
            if let Some(pending) = help.take() {
                match (counter, pending.split_once(' ')) {
                    (true, Some((help_name, text))) if help_name == name => {
                        out.push_str(&format!("# HELP {name}_total {text}\n"));
                    }
                    _ => push_line(&mut out, "# HELP ", pending),
                }
            }
            if counter {
                out.push_str(&format!("# TYPE {name}_total counter\n"));
            } else {
                push_line(&mut out, "# TYPE ", rest);
            }
            continue;
        }
        if let Some(pending) = help.take() {
            push_line(&mut out, "# HELP ", pending);
        }
        push_line(&mut out, "", line);
    }
    if let Some(pending) = help {
        push_line(&mut out, "# HELP ", pending);
    }
    Ok(out)
}

/// Encodes `registry` in the format a scraper asked for with its `Accept` header:
/// OpenMetrics if it accepts `application/openmetrics-text`, the classic text format
/// otherwise. Returns the `Content-Type` to answer with and the body.
///
/// # Errors
///
/// Whatever the registry's encoders return.
pub fn encode_for_accept(
    registry: &Registry,
    accept: Option<&str>,
) -> Result<(&'static str, String), fmt::Error> {
    if accept.is_some_and(|accept| accept.contains("application/openmetrics-text")) {
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, registry)?;
        Ok((OPENMETRICS_CONTENT_TYPE, body))
    } else {
        Ok((
            PROMETHEUS_TEXT_CONTENT_TYPE,
            encode_prometheus_text(registry)?,
        ))
    }
}

fn push_line(out: &mut String, prefix: &str, line: &str) {
    out.push_str(prefix);
    out.push_str(line);
    out.push('\n');
}
