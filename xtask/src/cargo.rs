//! What cargo says about the workspace (`cargo metadata`) and about a build
//! (`--message-format=json`): the packages, their test targets, and each test binary as it is
//! built.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::json::{self, Value};

/// The cargo that runs this (`cargo xtask` sets `$CARGO`).
pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// A target's kind, as far as the tests care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lib,
    Bin,
    /// An integration test (`tests/*.rs`).
    Test,
    Other,
}

impl Kind {
    fn of(kinds: &[Value]) -> Kind {
        let has = |k: &str| kinds.iter().any(|v| v.as_str() == Some(k));
        if has("test") {
            Kind::Test
        } else if has("bin") {
            Kind::Bin
        } else if has("lib") || has("rlib") || has("proc-macro") {
            Kind::Lib
        } else {
            Kind::Other
        }
    }
}

/// A target of a workspace package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    /// Its main source file, relative to the package's directory (`tests/crash.rs`).
    pub(crate) source: String,
}

impl Target {
    /// How cargo names its test run: `tests/crash.rs`, or `unittests src/lib.rs`.
    pub(crate) fn label(&self) -> String {
        match self.kind {
            Kind::Test => self.source.clone(),
            _ => format!("unittests {}", self.source),
        }
    }
}

/// A workspace package.
#[derive(Debug, Clone)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) targets: Vec<Target>,
    /// The directory of its `Cargo.toml`.
    pub(crate) dir: PathBuf,
    /// Whether it may be published (no `publish = false`).
    pub(crate) published: bool,
}

/// The workspace, from `cargo metadata`.
#[derive(Debug, Clone)]
pub(crate) struct Workspace {
    pub(crate) root: PathBuf,
    pub(crate) target_dir: PathBuf,
    /// In the order of the workspace's `members`.
    pub(crate) packages: Vec<Package>,
}

impl Workspace {
    /// Reads the workspace (no build, no network).
    pub(crate) fn load() -> Result<Workspace, String> {
        let out = Command::new(cargo())
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .output()
            .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Workspace::from_metadata(&String::from_utf8_lossy(&out.stdout))
    }

    fn from_metadata(text: &str) -> Result<Workspace, String> {
        let value = json::parse(text)?;
        let members: Vec<&str> = value
            .get("workspace_members")
            .map(Value::as_array)
            .unwrap_or_default()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let mut packages = Vec::new();
        for id in &members {
            let Some(package) = value
                .get("packages")
                .map(Value::as_array)
                .unwrap_or_default()
                .iter()
                .find(|p| p.str_at("id") == *id)
            else {
                continue;
            };
            let dir = Path::new(package.str_at("manifest_path"))
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            let targets = package
                .get("targets")
                .map(Value::as_array)
                .unwrap_or_default()
                .iter()
                .map(|t| Target {
                    name: t.str_at("name").to_owned(),
                    kind: Kind::of(t.get("kind").map(Value::as_array).unwrap_or_default()),
                    source: relative(&dir, t.str_at("src_path")),
                })
                .collect();
            // `null` when unrestricted, `[]` for `publish = false`.
            let published =
                !matches!(package.get("publish"), Some(Value::Array(r)) if r.is_empty());
            packages.push(Package {
                name: package.str_at("name").to_owned(),
                targets,
                dir,
                published,
            });
        }
        Ok(Workspace {
            root: PathBuf::from(value.str_at("workspace_root")),
            target_dir: PathBuf::from(value.str_at("target_directory")),
            packages,
        })
    }

    /// The package named `name`.
    #[cfg(test)]
    fn package(&self, name: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.name == name)
    }
}

/// `path` relative to `dir`, when it is inside it.
fn relative(dir: &Path, path: &str) -> String {
    Path::new(path)
        .strip_prefix(dir)
        .map_or_else(|_| path.to_owned(), |p| p.display().to_string())
}

/// A test binary cargo has built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestBinary {
    pub(crate) package: String,
    pub(crate) target: Target,
    pub(crate) executable: PathBuf,
    pub(crate) dir: PathBuf,
}

/// One line of cargo's `--message-format=json` output, as far as the runner cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// A test binary is ready to run.
    TestBinary(TestBinary),
    /// A crate was compiled (or found fresh); `bin` names a workspace binary (not its unit
    /// tests) that is now in place, for the integration tests that run it.
    Compiled {
        fresh: bool,
        bin: Option<(String, String)>,
    },
    /// The build is over.
    Finished { success: bool },
    /// Anything else (diagnostics, build scripts).
    Other,
}

impl Message {
    /// Reads one line.
    pub(crate) fn parse(line: &str) -> Message {
        let Ok(value) = json::parse(line) else {
            return Message::Other;
        };
        match value.str_at("reason") {
            "build-finished" => Message::Finished {
                success: value
                    .get("success")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            },
            "compiler-artifact" => {
                let test = value
                    .get("profile")
                    .and_then(|p| p.get("test"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                match value.get("executable").and_then(Value::as_str) {
                    Some(executable) if test => {
                        let dir = Path::new(value.str_at("manifest_path"))
                            .parent()
                            .map(Path::to_path_buf)
                            .unwrap_or_default();
                        let target = value.get("target").unwrap_or(&Value::Null);
                        Message::TestBinary(TestBinary {
                            package: package_name(value.str_at("package_id")),
                            target: Target {
                                name: target.str_at("name").to_owned(),
                                kind: Kind::of(
                                    target.get("kind").map(Value::as_array).unwrap_or_default(),
                                ),
                                source: relative(&dir, target.str_at("src_path")),
                            },
                            executable: PathBuf::from(executable),
                            dir,
                        })
                    }
                    executable => {
                        let target = value.get("target").unwrap_or(&Value::Null);
                        let kind =
                            Kind::of(target.get("kind").map(Value::as_array).unwrap_or_default());
                        Message::Compiled {
                            fresh: value.get("fresh").and_then(Value::as_bool).unwrap_or(false),
                            bin: (kind == Kind::Bin && executable.is_some()).then(|| {
                                (
                                    package_name(value.str_at("package_id")),
                                    target.str_at("name").to_owned(),
                                )
                            }),
                        }
                    }
                }
            }
            _ => Message::Other,
        }
    }
}

/// The package's name in a package id: `path+file:///src/wq#0.1.0` (the directory names it)
/// or `path+file:///src/cli#wq@0.1.0`.
fn package_name(id: &str) -> String {
    let (url, fragment) = id.rsplit_once('#').unwrap_or((id, ""));
    match fragment.split_once('@') {
        Some((name, _)) => name.to_owned(),
        None => url.rsplit('/').next().unwrap_or(url).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_ids_name_their_package() {
        assert_eq!(package_name("path+file:///src/wq#0.1.0"), "wq");
        assert_eq!(package_name("path+file:///src/cli#wq@0.1.0"), "wq");
        assert_eq!(
            package_name("registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0"),
            "serde"
        );
    }

    #[test]
    fn a_test_artifact_is_a_test_binary_and_a_library_is_not() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/workq-redis#workq-redis@0.1.0","manifest_path":"/w/workq-redis/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"crash","src_path":"/w/workq-redis/tests/crash.rs"},"profile":{"test":true},"executable":"/w/target/debug/deps/crash-0a","fresh":true}"#;
        let Message::TestBinary(binary) = Message::parse(line) else {
            panic!("not a test binary");
        };
        assert_eq!(binary.package, "workq-redis");
        assert_eq!(binary.target.label(), "tests/crash.rs");
        assert_eq!(binary.target.kind, Kind::Test);
        assert_eq!(binary.dir, Path::new("/w/workq-redis"));
        assert_eq!(
            binary.executable,
            Path::new("/w/target/debug/deps/crash-0a")
        );

        let unit = line
            .replace(r#""kind":["test"]"#, r#""kind":["lib"]"#)
            .replace("tests/crash.rs", "src/lib.rs");
        let Message::TestBinary(binary) = Message::parse(&unit) else {
            panic!("unit tests are a test binary");
        };
        assert_eq!(binary.target.label(), "unittests src/lib.rs");

        let library = r#"{"reason":"compiler-artifact","package_id":"p#x@1.0.0","target":{"kind":["lib"],"name":"x","src_path":"/x/src/lib.rs"},"profile":{"test":false},"executable":null,"fresh":false}"#;
        assert_eq!(
            Message::parse(library),
            Message::Compiled {
                fresh: false,
                bin: None
            }
        );
        // The binary itself (not its unit tests), which integration tests run.
        let bin = library
            .replace(r#""kind":["lib"]"#, r#""kind":["bin"]"#)
            .replace(
                r#""executable":null"#,
                r#""executable":"/w/target/debug/x""#,
            );
        assert_eq!(
            Message::parse(&bin),
            Message::Compiled {
                fresh: false,
                bin: Some(("x".into(), "x".into()))
            }
        );
        assert_eq!(
            Message::parse(r#"{"reason":"build-finished","success":false}"#),
            Message::Finished { success: false }
        );
        assert_eq!(Message::parse("not json"), Message::Other);
    }

    #[test]
    fn metadata_lists_members_in_order_with_their_targets() {
        let text = r#"{"packages":[
            {"name":"b","id":"path+file:///w/b#0.1.0","manifest_path":"/w/b/Cargo.toml","publish":[],"targets":[
                {"kind":["bin"],"name":"b","src_path":"/w/b/src/main.rs"},
                {"kind":["test"],"name":"cli","src_path":"/w/b/tests/cli.rs"}]},
            {"name":"a","id":"path+file:///w/a#0.1.0","manifest_path":"/w/a/Cargo.toml","publish":null,"targets":[
                {"kind":["lib"],"name":"a","src_path":"/w/a/src/lib.rs"},
                {"kind":["example"],"name":"demo","src_path":"/w/a/examples/demo.rs"}]}],
            "workspace_members":["path+file:///w/a#0.1.0","path+file:///w/b#0.1.0"],
            "target_directory":"/w/target","workspace_root":"/w"}"#;
        let ws = Workspace::from_metadata(text).unwrap();
        let names: Vec<&str> = ws.packages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(ws.target_dir, Path::new("/w/target"));
        let b = ws.package("b").unwrap();
        assert_eq!(b.targets[1].kind, Kind::Test);
        assert_eq!(b.targets[1].source, "tests/cli.rs");
        assert_eq!(b.targets[0].label(), "unittests src/main.rs");
        assert_eq!(ws.package("a").unwrap().targets[1].kind, Kind::Other);
        assert_eq!(b.dir, Path::new("/w/b"));
        assert!(!b.published);
        assert!(ws.package("a").unwrap().published);
    }
}
