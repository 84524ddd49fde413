//! BullMQ (npm package `bullmq`), the reference of `wq bench --redis URL`: installed and run in
//! `node` from a private directory of this user (`$WQ_BULLMQ_DIR`, default
//! `~/.cache/wq/bullmq-VERSION`, mode 0700, owner checked) where npm installs exactly what the
//! manifest and lockfile in `wq/benchmarks/bullmq/` pin (both compiled into `wq`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::report::{BULLMQ, METRICS, Sample};

/// The BullMQ side, run by `node`.
const BULLMQ_SCRIPT: &str = include_str!("../../benchmarks/bullmq/bench.mjs");
/// The BullMQ release measured (pinned by the manifest below).
const BULLMQ_VERSION: &str = "6.7.0";
/// The manifest of the BullMQ directory: one exact version of `bullmq`.
const BULLMQ_MANIFEST: &str = include_str!("../../benchmarks/bullmq/package.json");
/// The lockfile committed beside it: every transitive package at an exact version with its
/// integrity hash.
const BULLMQ_LOCKFILE: &str = include_str!("../../benchmarks/bullmq/package-lock.json");

/// The directory BullMQ is installed in: `$WQ_BULLMQ_DIR`, or a directory of this user's
/// cache (`$XDG_CACHE_HOME` or `~/.cache`), never a shared temporary directory where another
/// user could plant code that `node` would run.
fn bullmq_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("WQ_BULLMQ_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .ok_or("neither XDG_CACHE_HOME nor HOME is set; set WQ_BULLMQ_DIR")?;
    Ok(cache.join("wq").join(format!("bullmq-{BULLMQ_VERSION}")))
}

/// Creates `dir` (mode 0700) if needed and checks that it is this user's and private: code
/// installed there is run.
#[cfg(unix)]
fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // This process's user: the owner of its /proc entry (Linux), else of a file it creates.
    let me = match std::fs::metadata("/proc/self") {
        Ok(own) => own.uid(),
        Err(_) => {
            let probe = dir.join(".owner-probe");
            std::fs::write(&probe, b"").map_err(|e| format!("{}: {e}", probe.display()))?;
            let uid = std::fs::metadata(&probe).map(|m| m.uid());
            let _ = std::fs::remove_file(&probe);
            uid.map_err(|e| e.to_string())?
        }
    };
    if !meta.is_dir() || meta.uid() != me {
        return Err(format!(
            "{} is not a directory of this user; refusing to run code from it",
            dir.display()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is open to other users (mode {:o}); make it 0700 or remove it",
            dir.display(),
            meta.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Installs BullMQ in its private directory if needed; returns the script's path.
pub(super) fn ready() -> Result<PathBuf, String> {
    let dir = bullmq_dir()?;
    private_dir(&dir)?;
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err("node is not installed".into());
    }
    // The committed manifest and lockfile decide what is installed: when either differs from
    // what the directory holds, the directory is reinstalled from them.
    let manifest = dir.join("package.json");
    let lockfile = dir.join("package-lock.json");
    let current = std::fs::read_to_string(&manifest).ok().as_deref() == Some(BULLMQ_MANIFEST)
        && std::fs::read_to_string(&lockfile).ok().as_deref() == Some(BULLMQ_LOCKFILE);
    if !current {
        std::fs::write(&manifest, BULLMQ_MANIFEST).map_err(|e| e.to_string())?;
        std::fs::write(&lockfile, BULLMQ_LOCKFILE).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(dir.join("node_modules"));
    }
    if !dir.join("node_modules/bullmq").exists() || !dir.join("node_modules/ioredis").exists() {
        eprintln!("installing bullmq@{BULLMQ_VERSION} into {}", dir.display());
        // `npm install --no-save` follows the lockfile's versions and integrity hashes and
        // writes nothing back. (`npm ci` would be the usual choice, but it refuses a lockfile
        // that lists only the native builds of msgpackr-extract for the platforms the
        // registry served when it was written.)
        let status = Command::new("npm")
            .args([
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--silent",
            ])
            .arg("--ignore-scripts")
            .current_dir(&dir)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("npm: {e}"))?;
        if !status.success() {
            return Err("npm install of bullmq from its lockfile failed".into());
        }
    }
    let script = dir.join("bench.mjs");
    std::fs::write(&script, BULLMQ_SCRIPT).map_err(|e| e.to_string())?;
    Ok(script)
}

/// Runs `workload` of `size` in BullMQ on the server at `url`; its figures, for the metrics
/// the report knows.
pub(super) fn run(
    script: &PathBuf,
    url: &str,
    workload: &'static str,
    size: usize,
) -> Result<Vec<Sample>, String> {
    // The URL goes through the environment: a password in it stays out of the process list.
    let output = Command::new("node")
        .arg(script)
        .env("WQ_REDIS_URL", url)
        .arg(workload)
        .arg(size.to_string())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!("node exited with {}", output.status));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| {
            let metric = METRICS.iter().find(|m| Some(**m) == v["metric"].as_str())?;
            Some(Sample::new(
                workload,
                BULLMQ,
                metric,
                v["value"].as_f64().unwrap_or(f64::NAN),
            ))
        })
        .collect())
}
