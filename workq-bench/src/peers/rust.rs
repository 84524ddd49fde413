//! The Rust peers of `wq-bench --compare`: `bullmq-official` and `apalis-redis` on Redis,
//! `riverqueue` and `apalis-postgres` on PostgreSQL, in one program, `wq-bench-peers`, built
//! from `workq-bench/peers/` (a workspace of its own with its own lockfile, so that no build
//! of the main workspace compiles them) with `cargo build --release --locked`, or taken from
//! `$WQ_BENCH_PEERS`. `wq-bench-peers describe` says each one's version and settings.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Peer, Program};
use crate::report::{APALIS_POSTGRES, APALIS_REDIS, BULLMQ_OFFICIAL, RIVERQUEUE};
use crate::server::Backend;

/// The peers' workspace, in this source tree.
const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers");

/// The program, and what `describe` said of each peer.
pub(crate) struct RustPeers {
    exe: PathBuf,
    described: Vec<Described>,
}

/// One peer as `wq-bench-peers describe` describes it.
struct Described {
    name: &'static str,
    backend: Backend,
    version: String,
    settings: String,
}

/// The `impl` names the program knows.
const NAMES: &[&str] = &[BULLMQ_OFFICIAL, APALIS_REDIS, RIVERQUEUE, APALIS_POSTGRES];

impl RustPeers {
    /// Builds the program (a no-op when it is up to date) or takes `$WQ_BENCH_PEERS`, and asks
    /// it to describe the peers.
    pub(crate) fn ready() -> Result<Self, String> {
        let exe = match std::env::var_os("WQ_BENCH_PEERS") {
            Some(exe) => PathBuf::from(exe),
            None => build(Path::new(WORKSPACE))?,
        };
        let output = Command::new(&exe)
            .arg("describe")
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} describe exited with {}",
                exe.display(),
                output.status
            ));
        }
        let described = describe(&String::from_utf8_lossy(&output.stdout))?;
        Ok(Self { exe, described })
    }

    /// The peers on `backend`.
    pub(crate) fn on(&self, backend: Backend) -> Vec<Peer> {
        self.described
            .iter()
            .filter(|d| d.backend == backend)
            .map(|d| Peer {
                name: d.name,
                version: d.version.clone(),
                settings: d.settings.clone(),
                workloads: None,
                program: Program::Rust(self.exe.clone()),
                url_var: backend.url_var(),
            })
            .collect()
    }
}

/// `cargo build --release --locked` of the peers' workspace; the program's path.
fn build(workspace: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = workspace.join("Cargo.toml");
    if !manifest.exists() {
        return Err(format!(
            "{} is missing: the Rust peers are built from a source checkout, or set \
             WQ_BENCH_PEERS to a built wq-bench-peers",
            manifest.display()
        ));
    }
    let target = workspace.join("target");
    eprintln!(
        "building the Rust peers (cargo build --release --locked --manifest-path {}; the \
         first build takes minutes)",
        manifest.display()
    );
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        return Err(format!("the build of the Rust peers failed ({status})"));
    }
    Ok(target.join("release").join("wq-bench-peers"))
}

/// The peers in `describe`'s output, one JSON object per line.
fn describe(stdout: &str) -> Result<Vec<Described>, String> {
    let mut described = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("describe: {line:?}: {e}"))?;
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
        let name = NAMES
            .iter()
            .find(|n| **n == value["impl"].as_str().unwrap_or_default())
            .ok_or_else(|| format!("describe: unknown peer in {line}"))?;
        let backend = match value["backend"].as_str() {
            Some("redis") => Backend::Redis,
            Some("postgres") => Backend::Postgres,
            _ => return Err(format!("describe: unknown backend in {line}")),
        };
        described.push(Described {
            name,
            backend,
            version: text("version"),
            settings: text("settings"),
        });
    }
    Ok(described)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_of_the_peers_reads_back() {
        let out = r#"{"impl":"riverqueue","crate":"riverqueue","version":"0.5.0","backend":"postgres","settings":"s"}
{"impl":"bullmq-official","crate":"bullmq-official","version":"1.4.4","backend":"redis","settings":"t"}
"#;
        let described = describe(out).unwrap();
        assert_eq!(described.len(), 2);
        assert_eq!(described[0].name, RIVERQUEUE);
        assert_eq!(described[0].backend, Backend::Postgres);
        assert_eq!(described[1].version, "1.4.4");
        assert!(describe(r#"{"impl":"sidekiq","backend":"redis"}"#).is_err());
    }
}
