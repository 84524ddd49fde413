//! What `wq demo` and the project's `cargo xtask` know alike about this machine's system
//! packages: where a program is, where Debian puts PostgreSQL, whether this runs as root,
//! and the `apt-get` line that installs packages. Written once, here: `xtask` includes this
//! file (`#[path]`), so the demo's advice and the test set-up never drift apart.

use std::path::{Path, PathBuf};

/// The Debian package of `redis-server`.
pub(crate) const REDIS_PACKAGE: &str = "redis-server";
/// The Debian package of PostgreSQL's server (`initdb`, `pg_ctl`, `postgres`).
pub(crate) const POSTGRES_PACKAGE: &str = "postgresql";
/// Where Debian's PostgreSQL packages put their versions (`<root>/<version>/bin`).
pub(crate) const POSTGRES_ROOT: &str = "/usr/lib/postgresql";

/// The directories of this process's `PATH`.
pub(crate) fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default()
}

/// Where `program` is among `dirs` (a `PATH`), if it is there and executable.
pub(crate) fn find_in(dirs: &[PathBuf], program: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(program))
        .find(|file| is_executable(file))
}

/// Whether `file` is a file someone may execute.
pub(crate) fn is_executable(file: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(file).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The newest `<root>/<version>/bin` that holds an `initdb`.
pub(crate) fn newest_postgres(root: &Path) -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            is_executable(&bin.join("initdb")).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// The effective user id, from `/proc/self/status` (Linux; `apt-get` machines are).
pub(crate) fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The command line that installs the Debian packages `names`, for a person to run (through
/// `sudo` unless `root`).
pub(crate) fn install_command(names: &[&str], root: bool) -> String {
    let sudo = if root { "" } else { "sudo " };
    format!(
        "{sudo}apt-get update && {sudo}apt-get install -y --no-install-recommends {}",
        names.join(" ")
    )
}
