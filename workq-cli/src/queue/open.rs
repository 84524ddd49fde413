//! A server's URL to its backend's [`Admin`]: the scheme picks the backend.

use workq::admin::{Admin, redact_url};

/// Which command was typed: `wq queue`, or one of its backend-named aliases, which read
/// their own variable first and take only their backend's URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alias {
    /// `wq queue`.
    Queue,
    /// `wq redis`.
    Redis,
    /// `wq postgres`.
    Postgres,
}

impl Alias {
    /// The command as typed, for messages (`wq redis resume undoes it`).
    pub(crate) fn tool(self) -> &'static str {
        match self {
            Alias::Queue => "wq queue",
            Alias::Redis => "wq redis",
            Alias::Postgres => "wq postgres",
        }
    }

    /// The variables the URL is read from when `--url` is not given, in order.
    fn variables(self) -> &'static [&'static str] {
        match self {
            Alias::Queue => &["WQ_URL"],
            Alias::Redis => &["WQ_REDIS_URL", "WQ_URL"],
            Alias::Postgres => &["WQ_POSTGRES_URL", "WQ_URL"],
        }
    }
}

/// The backend of a URL, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Redis,
    Postgres,
}

/// The backend `url`'s scheme names, or why none.
pub(crate) fn backend_of(url: &str) -> Result<Backend, String> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    match scheme.to_ascii_lowercase().as_str() {
        "redis" | "rediss" | "redis+unix" | "unix" => Ok(Backend::Redis),
        "postgres" | "postgresql" => Ok(Backend::Postgres),
        _ => Err(format!(
            "URL scheme `{}` is neither redis nor postgres (redis://, rediss://, \
             redis+unix://, postgres://, postgresql://)",
            super::print::escape(scheme)
        )),
    }
}

/// The URL: `--url`, else the alias's variables in order.
pub(crate) fn url(given: Option<String>, alias: Alias) -> Result<String, String> {
    if let Some(url) = given.filter(|u| !u.is_empty()) {
        return Ok(url);
    }
    for var in alias.variables() {
        if let Ok(url) = std::env::var(var)
            && !url.is_empty()
        {
            return Ok(url);
        }
    }
    Err(format!(
        "no server: give --url URL or set {}",
        alias.variables().join(" or ")
    ))
}

/// The operator contract of the queues at `url` (no connection yet: the first call makes
/// it). `prefix` is Redis's key prefix (default `wq`); refused with a PostgreSQL URL.
pub(crate) fn open(
    url: &str,
    prefix: Option<&str>,
    alias: Alias,
) -> Result<Box<dyn Admin>, String> {
    let backend = backend_of(url)?;
    // An alias takes its own backend's URLs only.
    let wanted = match (alias, backend) {
        (Alias::Redis, Backend::Postgres) => Some("redis"),
        (Alias::Postgres, Backend::Redis) => Some("postgres"),
        _ => None,
    };
    if let Some(scheme) = wanted {
        let (tool, url) = (alias.tool(), redact_url(url));
        return Err(format!(
            "{tool} takes a {scheme} URL, not {url} (wq queue takes either)"
        ));
    }
    if backend == Backend::Postgres && prefix.is_some() {
        return Err("--prefix is for Redis: a PostgreSQL queue has no key prefix".into());
    }
    admin_for(url, prefix.unwrap_or("wq"), "wq")
}

/// The operator contract of the queues at `url`, whichever backend its scheme names:
/// Redis's under `prefix`, PostgreSQL's with connections named `application` (what
/// `pg_stat_activity` shows). Also how `wq dashboard --url` opens its sources.
pub(crate) fn admin_for(
    url: &str,
    prefix: &str,
    application: &str,
) -> Result<Box<dyn Admin>, String> {
    Ok(match backend_of(url)? {
        Backend::Redis => {
            Box::new(workq_redis::RedisAdmin::new(url, prefix).map_err(|e| e.to_string())?)
        }
        Backend::Postgres => Box::new(
            workq_postgres::PgAdmin::new(url)
                .map_err(|e| e.to_string())?
                .application_name(application),
        ),
    })
}
