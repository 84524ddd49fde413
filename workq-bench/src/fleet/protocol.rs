//! What the bench and its W7 worker processes agree on: where a phase's queue lives
//! ([`Target`]), what a worker process is asked to do ([`Spec`], its one argument) and the
//! lines it reports ([`parse_record`]).

use std::fmt;
use std::str::FromStr;

use crate::server::{Backend, Server};

/// Where a phase's queue lives.
pub(crate) enum Target {
    /// In this process.
    Memory,
    /// On the Redis server at this URL.
    Redis(String),
    /// On the PostgreSQL server at this URL.
    Postgres(String),
}

impl Target {
    /// The queue on `server`.
    pub(crate) fn of(server: &Server) -> Self {
        match server.backend {
            Backend::Redis => Target::Redis(server.url.clone()),
            Backend::Postgres => Target::Postgres(server.url.clone()),
        }
    }

    /// The server's URL (empty in memory).
    pub(crate) fn url(&self) -> &str {
        match self {
            Target::Memory => "",
            Target::Redis(url) | Target::Postgres(url) => url,
        }
    }

    /// The backend's name for a worker process.
    pub(crate) fn id(&self) -> &'static str {
        match self {
            Target::Memory => "memory",
            Target::Redis(_) => "redis",
            Target::Postgres(_) => "postgres",
        }
    }

    /// The variable a worker process reads the URL from.
    pub(crate) fn url_var(&self) -> Option<&'static str> {
        match self {
            Target::Memory => None,
            Target::Redis(_) => Some("WQ_REDIS_URL"),
            Target::Postgres(_) => Some("WQ_POSTGRES_URL"),
        }
    }
}

/// What a worker process is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `redis` or `postgres`.
    pub(crate) backend: &'static str,
    pub(crate) queue: String,
    pub(crate) workers: u32,
    pub(crate) handler_ms: u32,
    /// Items of the phase: their ids are below this.
    pub(crate) items: usize,
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}",
            self.backend, self.queue, self.workers, self.handler_ms, self.items
        )
    }
}

impl FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected BACKEND:QUEUE:WORKERS:HANDLER_MS:ITEMS, got {s:?}");
        let mut parts = s.rsplitn(4, ':');
        let items = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let handler_ms = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let workers: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let (backend, queue) = parts
            .next()
            .and_then(|p| p.split_once(':'))
            .ok_or_else(bad)?;
        let backend = match backend {
            "redis" => "redis",
            "postgres" => "postgres",
            _ => return Err(format!("unknown backend {backend:?} in {s:?}")),
        };
        if workers == 0 || queue.is_empty() {
            return Err(bad());
        }
        Ok(Spec {
            backend,
            queue: queue.to_owned(),
            workers,
            handler_ms,
            items,
        })
    }
}

/// One line of a worker process's report: `(item, start, end)`.
pub(crate) fn parse_record(line: &str) -> Option<(u64, i64, i64)> {
    let mut fields = line.split_ascii_whitespace();
    let item = fields.next()?.parse().ok()?;
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    Some((item, start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_reads_back_what_it_wrote() {
        let spec = Spec {
            backend: "redis",
            queue: "wq-bench-w7-1-2".into(),
            workers: 16,
            handler_ms: 1,
            items: 100_000,
        };
        assert_eq!(spec.to_string().parse::<Spec>(), Ok(spec));
        assert!("redis:q:0:1:10".parse::<Spec>().is_err());
        assert!("mysql:q:1:1:10".parse::<Spec>().is_err());
        assert!("redis:q:1:1".parse::<Spec>().is_err());
        // A queue name may hold a colon.
        assert_eq!("postgres:a:b:2:0:5".parse::<Spec>().unwrap().queue, "a:b");
    }

    #[test]
    fn a_record_line_reads_back() {
        assert_eq!(parse_record("7 10 20\n"), Some((7, 10, 20)));
        assert_eq!(parse_record("ready"), None);
    }
}
