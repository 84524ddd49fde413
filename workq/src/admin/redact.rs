//! [`redact_url`]: a server URL as it may be shown or logged, and [`redact_urls_in`]: the
//! same for every URL inside a message (feature `redact`).

use std::fmt::Write as _;

/// Query keys whose values are shown as they are: none of them can hold a secret. Every
/// other key keeps its name and loses its value (`pass=***`), whatever it is called, so a
/// parameter a client library adds later (`redis+unix:///...?pass=`, PostgreSQL's
/// `sslpassword=`, ...) is hidden before anyone knows it holds a password.
const SHOWN_KEYS: &[&str] = &[
    "db",
    "dbname",
    "protocol",
    "resp3",
    "sslmode",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "load_balance_hosts",
    "host",
    "hostaddr",
    "port",
];

/// What an unreadable URL is shown as: it may hold anything.
const UNREADABLE: &str = "(a URL that does not parse, not shown)";

/// `url` as it may be shown or logged: read as a URL, its user information (name and
/// password) becomes `***`, the value of every query parameter but a few known harmless ones
/// (`db`, `sslmode`, `application_name`, ...) becomes `***`, and a fragment is dropped. A
/// string that does not parse as a URL is not shown at all.
///
/// ```
/// use workq::admin::redact_url;
///
/// assert_eq!(redact_url("redis://:s3cret@cache:6379/0"), "redis://***@cache:6379/0");
/// assert_eq!(
///     redact_url("postgres://app@db/app?password=s3cret&sslmode=require"),
///     "postgres://***@db/app?password=***&sslmode=require"
/// );
/// assert_eq!(
///     redact_url("redis+unix:///run/redis.sock?db=2&pass=s3cret"),
///     "redis+unix:///run/redis.sock?db=2&pass=***"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let Ok(parsed) = url::Url::parse(url) else {
        return UNREADABLE.to_owned();
    };
    let mut out = format!("{}:", parsed.scheme());
    if parsed.has_authority() {
        out.push_str("//");
        if !parsed.username().is_empty() || parsed.password().is_some() {
            out.push_str("***@");
        }
        if let Some(host) = parsed.host_str() {
            out.push_str(host);
        }
        if let Some(port) = parsed.port() {
            let _ = write!(out, ":{port}");
        }
    }
    out.push_str(parsed.path());
    if parsed.query().is_some() {
        let shown: Vec<String> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let keep = SHOWN_KEYS.iter().any(|k| key.eq_ignore_ascii_case(k));
                let key: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
                if keep {
                    let value: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
                    format!("{key}={value}")
                } else {
                    format!("{key}=***")
                }
            })
            .collect();
        out.push('?');
        out.push_str(&shown.join("&"));
    }
    out
}

/// `text` with every URL in it (a word holding `://`) [redacted](redact_url): what an error
/// from a server may say, before it is shown or logged.
///
/// ```
/// use workq::admin::redact_urls_in;
///
/// assert_eq!(
///     redact_urls_in("cannot reach redis://:s3cret@cache:6379/0 (refused)"),
///     "cannot reach redis://***@cache:6379/0 (refused)"
/// );
/// ```
pub fn redact_urls_in(text: &str) -> String {
    if !text.contains("://") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The word around `://`: from after the last separator before it to the next one.
        let is_separator = |c: char| {
            c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>' | '(' | ')' | ',')
        };
        let start = rest[..at].rfind(is_separator).map_or(0, |i| {
            i + rest[i..].chars().next().map_or(1, char::len_utf8)
        });
        let end = rest[at..].find(is_separator).map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{redact_url, redact_urls_in};

    #[test]
    fn secrets_are_hidden_wherever_the_url_holds_them() {
        assert_eq!(
            redact_url("redis://user:pw@host:1/0"),
            "redis://***@host:1/0"
        );
        assert_eq!(redact_url("redis://host:1/0"), "redis://host:1/0");
        assert_eq!(
            redact_url("postgres://u:p@w@db:5432/app?sslmode=require"),
            "postgres://***@db:5432/app?sslmode=require",
            "the last @ ends the user information"
        );
        assert_eq!(
            redact_url("postgres://db?user=app&Password=x&sslpassword=y&sslmode=verify-full"),
            "postgres://db?user=***&Password=***&sslpassword=***&sslmode=verify-full"
        );
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?pass=hunter2&db=1"),
            "redis+unix:///tmp/r.sock?pass=***&db=1"
        );
        assert_eq!(
            redact_url("rediss://h:6380/#insecure-secret"),
            "rediss://h:6380/",
            "no fragment"
        );
        assert!(!redact_url("not a url with s3cret").contains("s3cret"));
        assert!(!redact_url("host=db password=s3cret").contains("s3cret"));
    }

    #[test]
    fn every_url_in_a_message_is_redacted() {
        assert_eq!(
            redact_urls_in("connect to redis://:pw@h:1/ failed (\"postgres://u:p@db/x\")"),
            "connect to redis://***@h:1/ failed (\"postgres://***@db/x\")"
        );
        assert_eq!(redact_urls_in("no URL here"), "no URL here");
        assert_eq!(
            redact_urls_in("é redis+unix:///s?pass=x"),
            "é redis+unix:///s?pass=***"
        );
    }
}
