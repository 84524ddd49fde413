//! The references that run in `node`: BullMQ (npm package `bullmq`, beside `wq-bench --redis
//! URL`) and pg-boss (npm package `pg-boss`, beside `wq-bench --postgres URL`). Each is
//! installed from a private directory of this user (`$WQ_BULLMQ_DIR` / `$WQ_PGBOSS_DIR`,
//! default `~/.cache/wq/NAME-VERSION`, mode 0700, owner checked) where npm installs exactly
//! what the manifest and lockfile in `workq-bench/node/NAME/` pin (both compiled into
//! `wq-bench`), and runs a script of ours (`bench.mjs` beside them) that prints one JSON
//! object per figure.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::report::{BULLMQ, PGBOSS};

/// A reference queue run by `node`, pinned by a manifest and a lockfile.
pub(crate) struct NodePeer {
    /// The `impl` of its figures, and the name of its directories.
    name: &'static str,
    /// The release measured (pinned by the manifest).
    version: &'static str,
    /// Our script doing the workloads with it.
    script: &'static str,
    /// The manifest of its directory: exact versions.
    manifest: &'static str,
    /// The lockfile committed beside it: every transitive package at an exact version with
    /// its integrity hash.
    lockfile: &'static str,
    /// The variable that overrides its directory.
    dir_var: &'static str,
    /// Packages whose presence under `node_modules` means the install is complete.
    modules: &'static [&'static str],
    /// The variable the script reads the server's URL from.
    url_var: &'static str,
    /// How its script uses it, for the report.
    settings: &'static str,
    /// The workloads its script runs (the others are not applicable).
    workloads: &'static [&'static str],
}

/// BullMQ, beside `wq-bench --redis`.
pub(crate) const BULLMQ_PEER: NodePeer = NodePeer {
    name: BULLMQ,
    version: "6.7.0",
    script: include_str!("../../node/bullmq/bench.mjs"),
    manifest: include_str!("../../node/bullmq/package.json"),
    // (`npm ci` would refuse this lockfile: it lists only the native builds of
    // msgpackr-extract for the platforms the registry served when it was written.)
    lockfile: include_str!("../../node/bullmq/package-lock.json"),
    dir_var: "WQ_BULLMQ_DIR",
    modules: &["bullmq", "ioredis"],
    url_var: "WQ_REDIS_URL",
    settings: "node; Queue.addBulk of each batch (jobId per item, removeOnComplete); Worker \
               with concurrency = the workload's workers; jobId dedup for W3; W8 in one \
               process, no groups (the open edition has none)",
    workloads: &["W1", "W3", "W3P", "W4", "W7", "W8"],
};

/// pg-boss, beside `wq-bench --postgres`. Its manifest asks for node 22.12 or later; npm only
/// warns about an older node, and the bench's script runs on node 20 as well.
pub(crate) const PGBOSS_PEER: NodePeer = NodePeer {
    name: PGBOSS,
    version: "12.38.0",
    script: include_str!("../../node/pg-boss/bench.mjs"),
    manifest: include_str!("../../node/pg-boss/package.json"),
    lockfile: include_str!("../../node/pg-boss/package-lock.json"),
    dir_var: "WQ_PGBOSS_DIR",
    modules: &["pg-boss", "pg"],
    url_var: "WQ_POSTGRES_URL",
    settings: "node; insert of each batch; work() with the settings its script documents \
               (workq-bench/node/pg-boss/bench.mjs)",
    workloads: &["W1", "W3", "W3P", "W4", "W7"],
};

impl NodePeer {
    /// The directory it is installed in: `$dir_var`, or a directory of this user's cache
    /// (`$XDG_CACHE_HOME` or `~/.cache`), never a shared temporary directory where another
    /// user could plant code that `node` would run.
    fn dir(&self) -> Result<PathBuf, String> {
        if let Some(dir) = std::env::var_os(self.dir_var) {
            return Ok(PathBuf::from(dir));
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .ok_or_else(|| {
                format!(
                    "neither XDG_CACHE_HOME nor HOME is set; set {}",
                    self.dir_var
                )
            })?;
        Ok(cache
            .join("wq")
            .join(format!("{}-{}", self.name, self.version)))
    }
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

impl NodePeer {
    /// Installs it in its private directory if needed; returns the script's path.
    pub(crate) fn ready(&self) -> Result<PathBuf, String> {
        let dir = self.dir()?;
        private_dir(&dir)?;
        let node = Command::new("node").arg("--version").output();
        if !node.is_ok_and(|o| o.status.success()) {
            return Err("node is not installed".into());
        }
        // The committed manifest and lockfile decide what is installed: when either differs
        // from what the directory holds, the directory is reinstalled from them.
        let manifest = dir.join("package.json");
        let lockfile = dir.join("package-lock.json");
        let current = std::fs::read_to_string(&manifest).ok().as_deref() == Some(self.manifest)
            && std::fs::read_to_string(&lockfile).ok().as_deref() == Some(self.lockfile);
        if !current {
            std::fs::write(&manifest, self.manifest).map_err(|e| e.to_string())?;
            std::fs::write(&lockfile, self.lockfile).map_err(|e| e.to_string())?;
            let _ = std::fs::remove_dir_all(dir.join("node_modules"));
        }
        let installed = self
            .modules
            .iter()
            .all(|m| dir.join("node_modules").join(m).exists());
        if !installed {
            eprintln!(
                "installing {}@{} into {}",
                self.name,
                self.version,
                dir.display()
            );
            // `npm install --no-save` follows the lockfile's versions and integrity hashes and
            // writes nothing back; no install scripts run.
            let status = Command::new("npm")
                .args([
                    "install",
                    "--no-save",
                    "--no-audit",
                    "--no-fund",
                    "--silent",
                    "--ignore-scripts",
                ])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("npm: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "npm install of {} from its lockfile failed",
                    self.name
                ));
            }
        }
        let script = dir.join("bench.mjs");
        std::fs::write(&script, self.script).map_err(|e| e.to_string())?;
        Ok(script)
    }

    /// It as a peer of the run, installed (its script's path) or why not.
    pub(crate) fn peer(&self) -> Result<super::Peer, String> {
        let script = self.ready()?;
        Ok(super::Peer {
            name: self.name,
            version: self.version.to_owned(),
            settings: self.settings.to_owned(),
            workloads: Some(self.workloads),
            program: super::Program::Node(script),
            url_var: self.url_var,
        })
    }

    /// Its `impl` name.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}
