//! The dashboard's settings: [`Config`], and the public URL read from it.

use std::time::Duration;

/// How the dashboard behaves.
#[derive(Clone)]
pub struct Config {
    /// The token every request must carry (see [`generate_token`]; [`check_token`] says what
    /// a given one needs). `None` answers clients on this machine only, and only when the
    /// server records the client's address ([`Server`] does): every process of this machine,
    /// and a reverse proxy on it, is trusted then.
    ///
    /// [`generate_token`]: crate::generate_token
    /// [`check_token`]: crate::check_token
    /// [`Server`]: crate::Server
    pub token: Option<String>,
    /// No actions: every `POST` is refused.
    pub read_only: bool,
    /// How often the figures are sampled for the charts.
    pub sample_every: Duration,
    /// How long samples are kept (the charts' span).
    pub keep: Duration,
    /// The items of one page when the page does not say (at most ten times this on request).
    pub page_limit: usize,
    /// At most this many queues have their samples kept (each source's totals always are):
    /// the ones the page looked at most recently, then the first listed. Bounds the memory
    /// whatever the number of queues.
    pub history_queues: usize,
    /// The URL operators open when the dashboard is served behind a reverse proxy
    /// (`https://ops.example.com/wq/`): its origin is accepted on actions, its host without a
    /// token, its path scopes the cookie, and an `https` URL makes the cookie `Secure`.
    pub public_url: Option<String>,
    /// The most bytes a request's body may have; a longer one is refused (413) before it is
    /// read, and before authentication.
    pub body_limit: usize,
    /// How long a request may take, reading its body included; then it is answered 408.
    /// `Duration::MAX` means no limit.
    pub request_timeout: Duration,
    /// The groups of a queue with flow control its page lists (and `/api/queues/{name}`
    /// answers): the ones with the most ready items, then the most in flight, then by name.
    pub groups_shown: usize,
    /// `/metrics` reports `workqueue_group_depth` and `workqueue_group_in_flight`, labelled
    /// `group`, for this many groups of each queue with flow control (the ones with the most
    /// ready items); 0, the default, reports none, so the number of series does not grow
    /// with the groups (as the in-process provider's `set_group_series`).
    pub group_series: usize,
    /// At most this many queues of each source have their flow control read per `/metrics`
    /// scrape (`workqueue_groups_ready`, `workqueue_group_saturated`): one `stats` call each,
    /// in the listing's order. A queue found without flow control is not asked again for a
    /// minute, so the calls go to the queues that have it.
    pub flow_queues: usize,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("read_only", &self.read_only)
            .field("sample_every", &self.sample_every)
            .field("keep", &self.keep)
            .field("page_limit", &self.page_limit)
            .field("history_queues", &self.history_queues)
            .field("public_url", &self.public_url)
            .field("body_limit", &self.body_limit)
            .field("request_timeout", &self.request_timeout)
            .field("groups_shown", &self.groups_shown)
            .field("group_series", &self.group_series)
            .field("flow_queues", &self.flow_queues)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            token: None,
            read_only: false,
            sample_every: Duration::from_secs(5),
            keep: Duration::from_secs(3600),
            page_limit: 50,
            history_queues: 100,
            public_url: None,
            body_limit: 64 * 1024,
            request_timeout: Duration::from_secs(30),
            groups_shown: 20,
            group_series: 0,
            flow_queues: 100,
        }
    }
}

/// The URL operators open, when the dashboard is served behind a reverse proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicUrl {
    /// `https` or `http`.
    pub(crate) scheme: String,
    /// The host and port as a browser sends them in `Host` (`ops.example.com`,
    /// `ops.example.com:8443`).
    pub(crate) host: String,
    /// The path the dashboard is served under, ending with `/` (`/`, `/wq/`).
    pub(crate) path: String,
}

impl PublicUrl {
    /// Reads `https://host[:port][/path]`.
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("{url:?} is no URL: give https://HOST[/PATH]"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "https" && scheme != "http" {
            return Err(format!("{url:?}: the scheme must be https or http"));
        }
        let (host, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if host.is_empty() || host.contains('@') || host.contains(['?', '#']) {
            return Err(format!("{url:?}: expected a host, with no user name"));
        }
        let path = path.split(['?', '#']).next().unwrap_or("/");
        let mut path = path.to_owned();
        if !path.ends_with('/') {
            path.push('/');
        }
        let host = host.to_ascii_lowercase();
        // A browser leaves the default port out of `Host` and `Origin`.
        let host = match (scheme.as_str(), host.rsplit_once(':')) {
            ("https", Some((h, "443"))) | ("http", Some((h, "80"))) => h.to_owned(),
            _ => host,
        };
        Ok(PublicUrl { scheme, host, path })
    }

    /// `scheme://host`, as a browser sends it in `Origin`.
    pub(crate) fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_url_is_read_as_a_browser_sends_it() {
        let p = PublicUrl::parse("https://Ops.Example.com:443/wq").unwrap();
        assert_eq!(
            (p.scheme.as_str(), p.host.as_str(), p.path.as_str()),
            ("https", "ops.example.com", "/wq/")
        );
        assert_eq!(p.origin(), "https://ops.example.com");
        let p = PublicUrl::parse("http://10.0.0.5:8080").unwrap();
        assert_eq!((p.host.as_str(), p.path.as_str()), ("10.0.0.5:8080", "/"));
        for bad in ["ops.example.com", "ftp://x/", "https://", "https://u:p@x/"] {
            assert!(PublicUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
