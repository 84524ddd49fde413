//! A `redis-server` of the test's own: a free loopback port, a fresh data directory, stopped
//! by PID when dropped. The binary is `$WQ_REDIS_SERVER`, or `redis-server` on the `PATH`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::free_port;

/// The server binary: `$WQ_REDIS_SERVER`, or `redis-server` on the `PATH`.
fn binary() -> String {
    std::env::var("WQ_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// Whether the server binary can be run. When it cannot, tests are skipped with a note, except
/// under `CI=true`, where that is a failure.
pub fn available() -> bool {
    let found = Command::new(binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "{} not found: CI must run the Redis tests (apt-get install redis-server)",
                binary()
            );
        }
        eprintln!(
            "note: {} not found; skipping a Redis test (install the redis-server package)",
            binary()
        );
    }
    found
}

/// How a test server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `appendonly yes`, `appendfsync always`.
    Always,
    /// `appendonly yes`, `appendfsync everysec`.
    EverySec,
    /// No persistence at all (the control runs).
    None,
}

/// A running `redis-server` (or one [`killed`](RedisServer::kill) to be
/// [`restarted`](RedisServer::restart)).
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    durability: Durability,
    extra: Vec<String>,
    /// Environment of the server process (a preloaded libfaketime, say).
    env: Vec<(String, String)>,
}

impl RedisServer {
    /// A server with AOF and `appendfsync always`; `None` when the binary is missing (see
    /// [`available`]).
    pub fn start() -> Option<Self> {
        Self::start_with(Durability::Always, &[])
    }

    /// A server with `durability` and the further arguments `extra`; `None` when the binary
    /// is missing (see [`available`]). Panics if it does not come up on any of ten ports.
    pub fn start_with(durability: Durability, extra: &[&str]) -> Option<Self> {
        if !available() {
            return None;
        }
        let mut server = Self::unstarted(durability, extra, &[]);
        if server.spawn_on_a_free_port(10) {
            return Some(server);
        }
        panic!("redis-server would not start; see {}", server.dir.display());
    }

    /// A server whose process runs with `env` (for example libfaketime preloaded), or `None`
    /// if it does not come up with it (after three ports).
    pub fn try_start_with_env(
        durability: Durability,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Option<Self> {
        if !available() {
            return None;
        }
        let mut server = Self::unstarted(durability, extra, env);
        server.spawn_on_a_free_port(3).then_some(server)
    }

    /// A server not yet running, with a fresh data directory of its own.
    fn unstarted(durability: Durability, extra: &[&str], env: &[(&str, String)]) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wq-redis-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's data directory");
        RedisServer {
            child: None,
            port: 0,
            dir,
            durability,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// Starts the process on a free port, trying up to `tries` ports.
    fn spawn_on_a_free_port(&mut self, tries: usize) -> bool {
        for _ in 0..tries {
            self.port = free_port();
            if self.spawn() {
                return true;
            }
        }
        false
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server process's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its data directory (the AOF, `redis.log`).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Starts the process on `self.port` and waits until it answers; `false` if it exited
    /// (the port was taken).
    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(binary());
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--protected-mode", "yes"])
            .args(["--daemonize", "no"])
            .args(["--dir", &self.dir.display().to_string()])
            .args(["--logfile", "redis.log"])
            .args(["--save", ""])
            .args(["--maxmemory-policy", "noeviction"]);
        match self.durability {
            Durability::Always => {
                cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
            }
            Durability::EverySec => {
                cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"]);
            }
            Durability::None => {
                cmd.args(["--appendonly", "no"]);
            }
        }
        cmd.args(&self.extra);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            if ping(self.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    /// `kill -9` of the server process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the server process.
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string())
                .status();
        }
    }

    /// Starts the server again on the same port and data directory (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server would not restart on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a server answers `PING` with `PONG` (not `LOADING`) on `port`.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0_u8; 64];
    match stream.read(&mut buf) {
        // `-NOAUTH` means it is up, behind a password.
        Ok(n) => buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"),
        Err(_) => false,
    }
}

/// A Redis Cluster of three primaries on loopback ports, made with `redis-cli --cluster
/// create` (package redis-tools, which redis-server depends on).
#[derive(Debug)]
pub struct RedisCluster {
    /// The three nodes.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the nodes and joins them; `None` (after a note) without the binaries, unless CI.
    pub fn start() -> Option<Self> {
        let cli = Command::new("redis-cli")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !available() {
            return None;
        }
        if !cli {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("redis-cli not found: CI must run the cluster tests");
            }
            eprintln!("note: redis-cli not found; skipping a cluster test");
            return None;
        }
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        ];
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_with(Durability::Always, &args).expect("a node"))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(created, "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &node.port().to_string(), "cluster", "info"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster did not become ready"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(RedisCluster { nodes })
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// The opt-out of the Redis tests on a machine without `redis-server`.
pub const SKIP_VAR: &str = "WQ_SKIP_REDIS_TESTS";

/// Checks that the server binary runs. Without it a test fails with a message naming the
/// Debian package to install, so `cargo test` never reports a pass it did not run; only with
/// `WQ_SKIP_REDIS_TESTS=1`, outside CI, does it return `false` (the caller returns early).
pub fn require_binary() -> bool {
    let found = Command::new(binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!(
            "note: {} not found; {SKIP_VAR}=1, so this Redis test does not run",
            binary()
        );
        return false;
    }
    panic!(
        "{} not found: the Redis tests start their own server. Install the Debian package \
         redis-server (apt-get install redis-server), or set {SKIP_VAR}=1 to skip them \
         knowingly (never under CI=true)",
        binary()
    );
}

/// [`RedisServer::start_with`], failing (see [`require_binary`]) when the binary is missing.
pub fn require_with(durability: Durability, extra: &[&str]) -> Option<RedisServer> {
    if !require_binary() {
        return None;
    }
    RedisServer::start_with(durability, extra)
}

/// [`RedisServer::start`], failing (see [`require_binary`]) when the binary is missing.
pub fn require() -> Option<RedisServer> {
    require_with(Durability::Always, &[])
}
