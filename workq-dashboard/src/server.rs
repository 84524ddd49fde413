//! [`Server`]: serves the dashboard's router bounded before anyone is authenticated: a cap
//! on connections in all and per client (an IPv4 address, an IPv6 /64), a timeout on reading
//! a request's headers (an idle or slow connection is closed), HTTPS with rustls (feature
//! `tls`), the client's address recorded for the loopback rule and the audit log, and a
//! graceful stop.
//!
//! The request timeout and the body limit are the router's own ([`Config::request_timeout`],
//! [`Config::body_limit`]), so they hold however it is served. The header timeout is
//! hyper's, and the accept loop axum's [`Listener`]'s. The connection caps and the TLS
//! handshake's timeout are written here: none of hyper-util, tower or tower-http bounds
//! connections (tower's `ConcurrencyLimit` and `tower_http`'s layers count requests, which
//! an idle socket never makes, and they hold a socket waiting instead of closing it), and
//! tokio-rustls has no handshake timeout, while hyper's header timeout starts after it.
//!
//! [`Config::request_timeout`]: crate::Config::request_timeout
//! [`Config::body_limit`]: crate::Config::body_limit

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::client::client_key;

/// How long requests on their way may finish after the stop signal.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves a dashboard [`Router`] on a listener, with bounds on what a client that is not
/// authenticated yet can hold: at most [`max_connections`](Self::max_connections)
/// connections (and [`max_connections_per_client`](Self::max_connections_per_client) from
/// one client: one IPv4 address, or one IPv6 /64, whose many addresses one machine may use;
/// a connection over either cap is closed as soon as it is accepted, so a flood of sockets
/// costs no file descriptors and does not keep other clients out), and
/// [`header_read_timeout`](Self::header_read_timeout) to send a request's headers (an idle
/// connection, or one that trickles its headers, is closed). Each request carries the
/// client's address (`ConnectInfo<SocketAddr>`), which the loopback rule and the audit log
/// read.
///
/// [`Server::new`] serves a [`TcpListener`]; [`Server::from_listener`] any axum
/// [`Listener`] whose addresses are socket addresses (one that reads the client's address
/// from the PROXY protocol, say: the rules above then apply to the address it gives).
///
/// ```no_run
/// use workq_dashboard::admin::MemoryAdmin;
/// use workq_dashboard::{Config, Server, generate_token};
///
/// # async fn run() -> std::io::Result<()> {
/// let token = generate_token();
/// let app = workq_dashboard::router(
///     MemoryAdmin::new(),
///     Config { token: Some(token.clone()), ..Config::default() },
/// );
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// println!("http://127.0.0.1:8080/?token={token}");
/// Server::new(listener).serve(app).await
/// # }
/// ```
pub struct Server<L: Listener = TcpListener> {
    listener: L,
    /// Run on each accepted connection before it is served.
    tap: fn(&mut L::Io),
    max_connections: usize,
    max_per_client: usize,
    header_read_timeout: Duration,
    #[cfg(feature = "tls")]
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl<L: Listener<Addr = SocketAddr>> std::fmt::Debug for Server<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listener", &self.listener.local_addr().ok())
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_client", &self.max_per_client)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("tls", &self.is_tls())
            .finish()
    }
}

/// The connections open, in all and by client ([`client_key`]; a client is kept only while
/// it has one open, so this is bounded by the cap).
#[derive(Default)]
struct Open {
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
    refused: AtomicU64,
}

/// One open connection; closing it frees its place.
struct Slot {
    open: Arc<Open>,
    client: IpAddr,
}

impl Open {
    /// A place for a connection from `peer`, if neither cap is reached.
    fn take(self: &Arc<Self>, peer: IpAddr, max: usize, per_client: usize) -> Option<Slot> {
        let client = client_key(peer);
        let mut counts = self.counts.lock();
        let (total, by_client) = &mut *counts;
        let mine = by_client.get(&client).copied().unwrap_or(0);
        if *total >= max || mine >= per_client {
            return None;
        }
        *total += 1;
        by_client.insert(client, mine + 1);
        Some(Slot {
            open: self.clone(),
            client,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.open.counts.lock();
        let (total, by_client) = &mut *counts;
        *total -= 1;
        if let Some(n) = by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                by_client.remove(&self.client);
            }
        }
    }
}

impl Server {
    /// The default of [`max_connections`](Self::max_connections): well under the usual limit
    /// of 1,024 open files.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
    /// The default of [`max_connections_per_client`](Self::max_connections_per_client).
    pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 64;
    /// The default of [`header_read_timeout`](Self::header_read_timeout).
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// A [`header_read_timeout`](Self::header_read_timeout) this long or longer means no
    /// limit: 100 years.
    pub const NO_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    /// A server on `listener`, plain HTTP, with the default bounds.
    pub fn new(listener: TcpListener) -> Self {
        let mut server = Server::from_listener(listener);
        server.tap = |stream: &mut TcpStream| {
            let _ = stream.set_nodelay(true);
        };
        server
    }
}

impl<L: Listener<Addr = SocketAddr>> Server<L> {
    /// A server on any axum `listener` that gives each connection's client address, plain
    /// HTTP, with the default bounds.
    pub fn from_listener(listener: L) -> Self {
        Server {
            listener,
            tap: |_| {},
            max_connections: Server::DEFAULT_MAX_CONNECTIONS,
            max_per_client: Server::DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            header_read_timeout: Server::DEFAULT_HEADER_READ_TIMEOUT,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// At most `n` connections open at once (at least 1).
    #[must_use]
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// At most `n` connections open at once from one client (at least 1): one IPv4 address,
    /// or one IPv6 /64, however many of its addresses the connections come from. Behind a
    /// reverse proxy every request comes from the proxy's address: give the proxy room, and
    /// let it limit its own clients.
    #[must_use]
    pub fn max_connections_per_client(mut self, n: usize) -> Self {
        self.max_per_client = n.max(1);
        self
    }

    /// How long a connection may take to send a request's headers, from when it opens or
    /// its last answer was sent; then it is closed. With TLS, the handshake has as long.
    /// A timeout of [`NO_LIMIT`](Server::NO_LIMIT) or more (`Duration::MAX` say) means no
    /// limit: a deadline that far off cannot be told from none (and would overflow the
    /// clock).
    #[must_use]
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// HTTPS with `config`'s certificates (feature `tls`).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tokio_rustls::TlsAcceptor::from(config));
        self
    }

    /// HTTPS with the certificate chain in the PEM file `cert` and the private key in the
    /// PEM file `key` (feature `tls`; rustls with the `ring` provider, TLS 1.2 and 1.3).
    ///
    /// # Errors
    ///
    /// A file that cannot be read, holds no certificate or key, or a key that does not go
    /// with the certificate.
    #[cfg(feature = "tls")]
    pub fn tls_pem(self, cert: &std::path::Path, key: &std::path::Path) -> Result<Self, String> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("the certificate file {}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!(
                "the certificate file {} holds no certificate",
                cert.display()
            ));
        }
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| format!("the key file {}: {e}", key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| {
                format!(
                    "the certificate {} and the key {}: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(self.tls(Arc::new(config)))
    }

    /// Whether it serves HTTPS.
    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.tls.is_some()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }

    /// The address it listens on.
    ///
    /// # Errors
    ///
    /// The listener's.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `app` until the process ends.
    ///
    /// # Errors
    ///
    /// None so far: a failed accept (too many open files, say) is logged and retried.
    pub async fn serve(self, app: Router) -> io::Result<()> {
        self.serve_with_shutdown(app, std::future::pending()).await
    }

    /// Serves `app` until `signal` completes; then it takes no new connection, closes the
    /// idle ones, and gives the requests on their way up to 10 s to finish.
    ///
    /// # Errors
    ///
    /// None so far: a failed accept (too many open files, say) is logged and retried (by
    /// the listener: axum's `TcpListener` waits a second first).
    pub async fn serve_with_shutdown(
        mut self,
        app: Router,
        signal: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        let mut http = hyper::server::conn::http1::Builder::new();
        // hyper adds the timeout to the clock's now, which overflows (and panics in every
        // connection's task) for a timeout such as `Duration::MAX`: beyond `NO_LIMIT`, none.
        let header_read_timeout =
            (self.header_read_timeout < Server::NO_LIMIT).then_some(self.header_read_timeout);
        http.timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .keep_alive(true);
        let graceful = GracefulShutdown::new();
        let open = Arc::new(Open::default());
        let mut signal = std::pin::pin!(signal);
        loop {
            let (mut stream, peer) = tokio::select! {
                accepted = self.listener.accept() => accepted,
                () = &mut signal => break,
            };
            let Some(slot) = open.take(peer.ip(), self.max_connections, self.max_per_client) else {
                // Over a cap: closed at once, so its file descriptor is free again.
                drop(stream);
                let n = open.refused.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        target: "workq_dashboard::audit",
                        client = %peer,
                        refused = n,
                        "connections over the cap ({} in all, {} per client) are closed",
                        self.max_connections,
                        self.max_per_client
                    );
                }
                continue;
            };
            (self.tap)(&mut stream);
            let app = app.clone();
            let service = tower::service_fn(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                app.clone().oneshot(request.map(Body::new))
            });
            let service = TowerToHyperService::new(service);
            let http = http.clone();
            let watcher = graceful.watcher();
            #[cfg(feature = "tls")]
            let tls = self.tls.clone();
            let handshake = self.header_read_timeout;
            tokio::spawn(async move {
                let _slot = slot;
                #[cfg(feature = "tls")]
                if let Some(tls) = tls {
                    // hyper's header timeout starts after the handshake: the handshake has
                    // one of its own, or a client that never finishes it would hold its slot.
                    let Ok(Ok(stream)) = tokio::time::timeout(handshake, tls.accept(stream)).await
                    else {
                        return;
                    };
                    let _ = watcher
                        .watch(http.serve_connection(TokioIo::new(stream), service))
                        .await;
                    return;
                }
                let _ = handshake;
                let _ = watcher
                    .watch(http.serve_connection(TokioIo::new(stream), service))
                    .await;
            });
        }
        drop(self.listener);
        if tokio::time::timeout(DRAIN, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                "workq-dashboard: requests still on their way after {} s are dropped",
                DRAIN.as_secs()
            );
        }
        Ok(())
    }
}
