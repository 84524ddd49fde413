//! A PostgreSQL server of the test's own: `initdb` once per test binary into a template data
//! directory, then for each server a copy of it, `postgres` on a free loopback port with its
//! socket in its own directory, stopped by PID (read from `postmaster.pid`) when dropped.
//!
//! `initdb` and `postgres` refuse to run as root; as root, they run as the user `postgres`
//! (which the Debian package creates) through `runuser`, on directories that user owns.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::free_port;

/// Set to `1` (outside CI) to skip the PostgreSQL tests knowingly when the server is missing.
pub const SKIP_VAR: &str = "WQ_SKIP_PG_TESTS";

/// The directory of `initdb`, `postgres` and `pg_ctl`: `$WQ_PG_BIN`, the `PATH`, or the
/// newest `/usr/lib/postgresql/<version>/bin` (where the Debian package puts them).
fn bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("WQ_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// The binaries, or `None` when the tests may be skipped; panics when they may not (under
/// `CI=true`, or without the opt-out).
pub fn require_binaries() -> Option<PathBuf> {
    if let Some(dir) = bin_dir() {
        return Some(dir);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("note: PostgreSQL not found; {SKIP_VAR}=1, so this test does not run");
        return None;
    }
    panic!(
        "PostgreSQL (initdb, postgres) not found: the tests start their own server. Install \
         the Debian package postgresql (apt-get install postgresql), point WQ_PG_BIN at its \
         bin directory, or set {SKIP_VAR}=1 to skip them knowingly (never under CI=true)"
    );
}

/// Whether this process runs as root (then the server runs as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A command that runs `program` as the server's user.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Gives `dir` to the server's user (as root), with the mode the server requires.
fn own(dir: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .expect("run chown");
        assert!(
            status.success(),
            "chown {} to postgres failed (does the user exist?)",
            dir.display()
        );
    }
    let status = Command::new("chmod")
        .args(["700"])
        .arg(dir)
        .status()
        .expect("run chmod");
    assert!(status.success());
}

/// The template data directory of this test process, made once.
fn template(bin: &Path) -> PathBuf {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            remove_stale_templates();
            let dir = std::env::temp_dir().join(format!("wq-pg-template-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create the template directory");
            own(&dir);
            let out = as_server_user(&bin.join("initdb"))
                .arg("-D")
                .arg(&dir)
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ])
                .stdin(Stdio::null())
                .output()
                .expect("run initdb");
            assert!(
                out.status.success(),
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            dir
        })
        .clone()
}

/// Removes the templates of test processes that are gone.
fn remove_stale_templates() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("wq-pg-template-"))
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One running server.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// The length of the log when the latest start began: what the log says before it is
    /// about an earlier server.
    log_from: u64,
}

impl PgServer {
    /// Starts a server, or `None` when PostgreSQL is missing and the tests may be skipped.
    pub fn start() -> Option<Self> {
        let bin = require_binaries()?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wq-pg-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let status = Command::new("cp")
            .arg("-a")
            .arg(template(&bin))
            .arg(&dir)
            .status()
            .expect("run cp");
        assert!(status.success(), "copy the template data directory");
        let mut server = PgServer {
            bin,
            dir,
            port: 0,
            child: None,
            log_from: 0,
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return Some(server);
            }
        }
        panic!("postgres would not start; see {}/log", server.dir.display());
    }

    /// Starts the server process on `self.port`; `true` once it accepts connections.
    fn spawn(&mut self) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .expect("open the server log");
        self.log_from = log.metadata().map_or(0, |m| m.len());
        let child = as_server_user(&self.bin.join("postgres"))
            .arg("-D")
            .arg(&self.dir)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                // Tests kill processes, not machines: the page cache keeps what fsync would.
                "-c",
                "fsync=off",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=32MB",
                // Statement counts and buffer reads per statement, nested ones included: the
                // tests of what a call costs the server read them.
                "-c",
                "shared_preload_libraries=pg_stat_statements",
                "-c",
                "pg_stat_statements.track=all",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            if self.accepts() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        false
    }

    /// Whether the server answers a query: `psql` if the client is installed beside the
    /// server, else `pg_isready` (the server package has it), else the log of this start.
    ///
    /// An open port alone proves nothing: a postmaster killed a moment ago still completes
    /// handshakes until it is gone.
    fn accepts(&self) -> bool {
        let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        drop(stream);
        // The port is open; the server may still be recovering (or going): ask it.
        let (program, ask): (&str, &[&str]) = if self.bin.join("psql").exists() {
            ("psql", &["-tAc", "SELECT 1"])
        } else {
            ("pg_isready", &["-t", "2"])
        };
        Command::new(self.bin.join(program))
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .args(ask)
            .arg("-p")
            .arg(self.port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_or_else(|_| self.ready_by_log(), |s| s.success())
    }

    /// Without `psql` or `pg_isready`: the log of this start says the server is ready (a
    /// start that fails early, on the lock file, writes no "starting" line, so the lines
    /// before this start are not read).
    fn ready_by_log(&self) -> bool {
        std::fs::read(self.dir.join("log")).is_ok_and(|log| {
            let from = usize::try_from(self.log_from).unwrap_or(usize::MAX);
            log.get(from..).is_some_and(|tail| {
                String::from_utf8_lossy(tail).contains("ready to accept connections")
            })
        })
    }

    /// The connection URL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster's PID (from `postmaster.pid`: under `runuser` the child is not it).
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// Sends `signal` (`-9`, `-STOP`, `-CONT`, ...) to the postmaster.
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(signal)
                .arg(pid.to_string())
                .status();
        }
    }

    /// `kill -9` of the postmaster (its backends exit when they notice), then waits for the
    /// process to be gone (up to 10 s).
    ///
    /// Under `runuser` the postmaster is not our child, so waiting for the child is not
    /// enough: until the postmaster has exited its port still completes handshakes and its
    /// PID still holds the data directory's lock file.
    pub fn kill(&mut self) {
        let pid = self.pid();
        self.signal("-9");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = pid {
            let deadline = Instant::now() + Duration::from_secs(10);
            while running(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// `kill -9` of the postmaster and, first, of every process it started (its backends), by
    /// their PIDs: nothing answers a query from then on, not even a connection already open
    /// (after [`kill`](Self::kill) alone, a backend may serve one more query before it notices).
    pub fn kill_with_backends(&mut self) {
        if let Some(pid) = self.pid() {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            // Quietly: once one backend is killed, the postmaster ends the others itself.
            for child in children.split_whitespace() {
                let _ = Command::new("kill")
                    .args(["-9", child])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        self.kill();
    }

    /// Starts the server again on the same port and data directory (crash recovery).
    pub fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        // Old backends may hold the shared memory for a moment after a kill -9.
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("postgres would not restart; see {}/log", self.dir.display());
    }
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown, backends included.
        self.signal("-QUIT");
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
