//! `SIGTERM` to a running controller process: the example `configmap_controller` in cluster
//! mode, against the in-process API server through a kubeconfig.
//!
//! The process is this test binary run again as a child with `WQ_KUBE_EXAMPLE_CHILD` set,
//! which calls the example's own `main` (the example's file is compiled in below), so what is
//! signalled is the example's code, with its own exit code. Without a test harness
//! (`harness = false` in `Cargo.toml`), since the child must own the process.
//!
//! - a `SIGTERM` lets the reconciles in flight finish, prints the summary and exits 0;
//! - on a Redis queue, a reconcile cut off by the shutdown timeout has its lease handed back:
//!   another consumer gets the key at once (`try_get`), not after the lease expires;
//! - a second `SIGTERM` forces the stop: the reconcile is cancelled, its lease handed back,
//!   and the process exits 1 with the summary.

#[path = "../examples/configmap_controller.rs"]
mod example;

mod support;

use std::io::{BufRead, BufReader};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use workq_conformance::servers::redis as server;
use workq_kube::testing::FakeApiServer;
use workq_redis::RedisQueue;

/// Set in the child's environment: run the example instead of the tests.
const CHILD: &str = "WQ_KUBE_EXAMPLE_CHILD";

/// How long to wait for a line or an exit before calling the child hung.
const PATIENCE: Duration = Duration::from_secs(60);

/// The example, running as a child process, with its output read line by line.
struct Example {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Everything it printed so far.
    seen: Vec<String>,
    /// Its kubeconfig, removed on drop.
    kubeconfig: PathBuf,
}

impl Example {
    /// Starts the example with `args`, on a kubeconfig naming `server`.
    fn start(server: &FakeApiServer, args: &[&str]) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let kubeconfig = std::env::temp_dir().join(format!(
            "wq-kube-signal-{}-{}.yaml",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
                 current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
                server.url()
            ),
        )
        .expect("write a kubeconfig");
        let mut child = Command::new(std::env::current_exe().expect("this test's path"))
            .args(args)
            .env(CHILD, "1")
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the example");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            kubeconfig,
        }
    }

    /// Waits for a line starting with `prefix`; returns it.
    fn wait_for(&mut self, prefix: &str) -> String {
        if let Some(line) = self.seen.iter().find(|line| line.starts_with(prefix)) {
            return line.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line {prefix:?} from the example; it printed {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Sends `SIGTERM`.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit; returns its status and everything it printed.
    fn exit(mut self) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the example did not exit; it printed {:#?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        // The reader thread ends with the pipe; take what is left.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status, std::mem::take(&mut self.seen))
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        // A failed test leaves no process behind (this child's PID, nothing broader).
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// The summary line the example prints when it stops.
fn summary(lines: &[String]) -> &str {
    lines
        .iter()
        .find_map(|line| line.strip_prefix("stopped: "))
        .unwrap_or_else(|| panic!("no summary in {lines:#?}"))
}

fn sigterm_lets_reconciles_finish_and_exits_0_with_the_summary() {
    runtime().block_on(async {
        let server = FakeApiServer::start().await;
        for name in ["web-0", "web-1", "web-2"] {
            server.apply(&support::configmap(name, "v1"));
        }
        let mut example = Example::start(&server, &["--work", "300"]);
        example.wait_for("ready: 3 ConfigMaps listed");
        example.wait_for("reconciling default/web-0");
        example.terminate();
        let (status, lines) = example.exit();
        assert_eq!(status.code(), Some(0), "{lines:#?}");
        assert!(
            lines.iter().any(|line| line.starts_with("stopping:")),
            "{lines:#?}"
        );
        // The reconcile in flight at the signal finished; nothing was cut off.
        assert!(
            lines
                .iter()
                .any(|line| line.starts_with("reconciled default/web-0")),
            "{lines:#?}"
        );
        let summary = summary(&lines);
        assert!(summary.contains(", 0 in flight,"), "{summary}");
        let reconciled = lines
            .iter()
            .filter(|line| line.starts_with("reconciled "))
            .count();
        assert!(
            summary.starts_with(&format!("processed {reconciled} (succeeded {reconciled},")),
            "{summary}"
        );
    });
}

/// Starts a Redis server, or returns `None` to skip (see `server::require_binary`).
fn redis() -> Option<server::RedisServer> {
    server::require_binary().then(|| {
        server::RedisServer::start_with(server::Durability::None, &[]).expect("redis-server starts")
    })
}

/// Whether another consumer of the example's queue gets `key` at once.
async fn handed_back(url: &str, key: &str) -> bool {
    let queue: RedisQueue<String> = RedisQueue::connect(url, "configmaps").await.unwrap();
    match queue.try_get().await.unwrap().into_lease() {
        Some(lease) => {
            let same = *lease == key;
            lease.done().await.unwrap();
            same
        }
        None => false,
    }
}

fn sigterm_hands_a_cut_off_reconciles_lease_back_to_redis() {
    let Some(redis) = redis() else { return };
    runtime().block_on(async {
        let server = FakeApiServer::start().await;
        server.apply(&support::configmap("stuck", "v1"));
        // Ten minutes of work, a stop that waits 300 ms: the reconcile is cut off.
        let mut example = Example::start(
            &server,
            &[
                "--redis",
                &redis.url(),
                "--work",
                "600000",
                "--shutdown-timeout",
                "300",
            ],
        );
        example.wait_for("reconciling default/stuck");
        example.terminate();
        let (status, lines) = example.exit();
        assert_eq!(status.code(), Some(0), "{lines:#?}");
        assert!(summary(&lines).contains("1 in flight"), "{lines:#?}");
        // The lease lasts 30 s; the key is handed out again at once.
        assert!(
            handed_back(&redis.url(), "default/stuck").await,
            "the lease was not handed back"
        );
    });
}

fn a_second_sigterm_forces_the_stop_and_hands_the_lease_back() {
    let Some(redis) = redis() else { return };
    runtime().block_on(async {
        let server = FakeApiServer::start().await;
        server.apply(&support::configmap("stuck", "v1"));
        let mut example = Example::start(&server, &["--redis", &redis.url(), "--work", "600000"]);
        example.wait_for("reconciling default/stuck");
        example.terminate();
        // The stop has begun (the default shutdown timeout is 25 s): force it.
        example.wait_for("stopping:");
        example.terminate();
        let (status, lines) = example.exit();
        assert_eq!(status.code(), Some(1), "{lines:#?}");
        assert!(summary(&lines).starts_with("processed 1 "), "{lines:#?}");
        assert!(
            handed_back(&redis.url(), "default/stuck").await,
            "the lease was not handed back"
        );
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        // The example's own main, as its binary runs it.
        return example::main();
    }
    let tests: [(&str, fn()); 3] = [
        (
            "sigterm_lets_reconciles_finish_and_exits_0_with_the_summary",
            sigterm_lets_reconciles_finish_and_exits_0_with_the_summary,
        ),
        (
            "sigterm_hands_a_cut_off_reconciles_lease_back_to_redis",
            sigterm_hands_a_cut_off_reconciles_lease_back_to_redis,
        ),
        (
            "a_second_sigterm_forces_the_stop_and_hands_the_lease_back",
            a_second_sigterm_forces_the_stop_and_hands_the_lease_back,
        ),
    ];
    // `cargo test --test signal -- NAME` runs the tests whose name contains NAME.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let selected =
        |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let chosen = tests.iter().filter(|(name, _)| selected(name)).count();
    println!("\nrunning {chosen} tests");
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for (name, test) in tests {
        if !selected(name) {
            continue;
        }
        println!("test {name} ...");
        match panic::catch_unwind(AssertUnwindSafe(test)) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(name);
            }
        }
    }
    // The summary line libtest prints, which test runners (`cargo xtask test`) read.
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out; \
         finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        chosen - failed.len(),
        failed.len(),
        tests.len() - chosen,
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failed: {failed:?}");
        ExitCode::FAILURE
    }
}
