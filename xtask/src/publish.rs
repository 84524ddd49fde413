//! `cargo xtask publish-check`: every package that is published (no `publish = false`) has
//! what crates.io needs and a good crates.io page shows, and packages and builds as it would
//! be uploaded.
//!
//! First the metadata, from `cargo metadata`: a description, a license and its text in the
//! package, a repository, a readme that exists, at most five valid keywords, one to five
//! categories among crates.io's, a `rust-version`, docs.rs settings naming only features that
//! exist (for a library), a version on every path dependency that is kept on upload, and no
//! such dependency on a package that is not published. Then one `cargo publish --dry-run` for
//! all of them, in dependency order: cargo packages each one, then builds each from its
//! package against the packages of the others (an overlay of the packaged siblings), so a
//! dependent is checked before its dependencies are on crates.io. That needs the crates.io
//! index; `--offline` runs `cargo package` instead, which does the same packaging and builds
//! without asking the registry (nor checking that the versions are new there).
//! `--no-verify` packages without building.
//!
//! The dry run builds in `target/publish-check`, and first forgets what an earlier run left of
//! our packages there and in cargo's home: cargo takes a registry crate of an unchanged name
//! and version as unchanged, so without that a second run checked the first run's sources.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::cargo::cargo;
use crate::json::{self, Value};

/// Options of `cargo xtask publish-check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Options {
    /// Build each package from its packaged sources (cargo's verification).
    verify: bool,
    /// `cargo package` instead of `cargo publish --dry-run`: no registry.
    offline: bool,
}

/// Reads the options of `publish-check`.
fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        verify: true,
        offline: false,
    };
    for arg in args {
        match arg.as_str() {
            "--no-verify" => options.verify = false,
            "--offline" => options.offline = true,
            other => return Err(format!("publish-check: unknown option {other}")),
        }
    }
    Ok(options)
}

/// Runs `cargo xtask publish-check ARGS`; the exit code.
pub(crate) fn run(args: &[String]) -> i32 {
    match parse(args) {
        Ok(options) => main(options),
        Err(e) => {
            eprintln!("xtask: {e}\n\nusage: cargo xtask publish-check [--offline] [--no-verify]");
            2
        }
    }
}

/// Runs `cargo xtask publish-check` with `options`; the exit code.
fn main(options: Options) -> i32 {
    let packages = match load() {
        Ok(packages) => packages,
        Err(e) => {
            eprintln!("publish-check: {e}");
            return 1;
        }
    };
    let published: Vec<&Package> = packages.iter().filter(|p| p.publish).collect();
    if published.is_empty() {
        eprintln!("publish-check: no package is published");
        return 1;
    }
    let mut failed = false;
    for package in &published {
        let problems = problems(package, &packages);
        if problems.is_empty() {
            println!("metadata ok  {}", package.name);
        } else {
            failed = true;
            for problem in problems {
                println!("metadata     {}: {problem}", package.name);
            }
        }
    }
    if failed {
        println!("\npublish-check: fix the metadata above (the packages' Cargo.toml)");
        return 1;
    }
    let order = match publish_order(&packages) {
        Ok(order) => order,
        Err(e) => {
            eprintln!("publish-check: {e}");
            return 1;
        }
    };
    // The dry run builds in a target directory of its own, where nothing but our packages'
    // earlier builds can be stale (see `remove_stale_builds`).
    let target = crate::cargo::Workspace::load()
        .map_or_else(|_| PathBuf::from("target"), |w| w.target_dir)
        .join("publish-check");
    let names: Vec<(String, String)> = published
        .iter()
        .map(|p| (p.name.clone(), p.version.clone()))
        .collect();
    let mut stale = remove_stale_builds(&target, &names);
    if let Some(home) = cargo_home() {
        stale.extend(remove_stale_unpacked(&home, &names));
    }
    for path in stale {
        println!("removed an earlier run's copy: {}", path.display());
    }
    let args = command_args(&order, options);
    println!(
        "\nCARGO_TARGET_DIR={} {} {}",
        target.display(),
        cargo(),
        args.join(" ")
    );
    let started = Instant::now();
    let status = Command::new(cargo())
        .args(&args)
        .env("CARGO_TARGET_DIR", &target)
        .status();
    let took = started.elapsed().as_secs();
    match status {
        Ok(status) if status.success() => {
            println!(
                "publish-check: {} packages ready to publish, in this order: {} ({took} s)",
                order.len(),
                order.join(", ")
            );
            0
        }
        Ok(status) => {
            println!("publish-check: cargo failed ({status}, {took} s)");
            1
        }
        Err(e) => {
            eprintln!("publish-check: cannot run cargo: {e}");
            1
        }
    }
}

/// Cargo's home: `$CARGO_HOME`, else `~/.cargo`.
fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
}

/// Removes the copies of `packages` (name, version) that an earlier dry run unpacked from its
/// temporary registry; the paths removed.
///
/// The dry run builds each dependent against its siblings' packages, served from a local
/// registry at `target/package/tmp-registry`, and cargo unpacks them under
/// `$CARGO_HOME/registry/src/-HASH/NAME-VERSION`, where HASH comes from the registry's path. A
/// registry's crates are immutable to cargo: when that directory exists it is used as it is,
/// never unpacked again. So a second run from the same checkout path, after the code changed
/// but not the version, built the dependents against the first run's sources (CI with a kept
/// cargo home: "could not find `periodic` in `workq`" for code that had it). Only the
/// directories of local registries (named `-HASH`, no host) are touched; crates.io's never.
fn remove_stale_unpacked(home: &Path, packages: &[(String, String)]) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(registries) = std::fs::read_dir(home.join("registry").join("src")) else {
        return removed;
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for (name, version) in packages {
            let unpacked = registry.path().join(format!("{name}-{version}"));
            if unpacked.is_dir() && std::fs::remove_dir_all(&unpacked).is_ok() {
                removed.push(unpacked);
            }
        }
    }
    removed
}

/// Removes the build records (fingerprints) of `packages` in the dry run's target directory
/// `target`; the paths removed.
///
/// Cargo takes a registry crate's build as fresh when its name and version are unchanged,
/// whatever its sources: the packages built from the temporary registry (0.1.0 each time)
/// would keep an earlier run's build. Without their records they are compiled again.
fn remove_stale_builds(target: &Path, packages: &[(String, String)]) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(target.join("debug").join(".fingerprint")) else {
        return removed;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let ours = packages.iter().any(|(name, _)| {
            file.strip_prefix(name.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|hash| !hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit()))
        });
        if ours && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// The arguments of the one cargo command that packages (and builds) `order`.
fn command_args(order: &[String], options: Options) -> Vec<String> {
    let mut args: Vec<String> = if options.offline {
        vec!["package".into(), "--offline".into()]
    } else {
        vec!["publish".into(), "--dry-run".into()]
    };
    // What is checked is the packages' content, whatever git says of the working tree (CI's
    // checkout is clean anyway).
    args.push("--allow-dirty".into());
    if !options.verify {
        args.push("--no-verify".into());
    }
    for name in order {
        args.push("-p".into());
        args.push(name.clone());
    }
    args
}

/// How a package depends on another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Normal,
    Build,
    Dev,
}

/// A dependency, as far as publishing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dependency {
    name: String,
    kind: Kind,
    /// For a path dependency, the directory.
    path: Option<PathBuf>,
    /// Whether it names a version (cargo says `*` when it does not).
    versioned: bool,
}

/// A workspace package and its crates.io metadata.
#[derive(Debug, Clone)]
struct Package {
    name: String,
    version: String,
    dir: PathBuf,
    publish: bool,
    description: String,
    license: String,
    repository: String,
    readme: Option<String>,
    rust_version: String,
    keywords: Vec<String>,
    categories: Vec<String>,
    /// Whether it has a library (docs.rs documents libraries only).
    library: bool,
    features: Vec<String>,
    /// `[package.metadata.docs.rs]`, if any.
    docs_rs: Option<Value>,
    dependencies: Vec<Dependency>,
}

/// Reads the workspace's packages (no build, no network).
fn load() -> Result<Vec<Package>, String> {
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
    from_metadata(&String::from_utf8_lossy(&out.stdout))
}

/// The workspace members of `cargo metadata --no-deps`, in the order of `members`.
fn from_metadata(text: &str) -> Result<Vec<Package>, String> {
    let value = json::parse(text)?;
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.map(Value::as_array)
            .unwrap_or_default()
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let members = strings(value.get("workspace_members"));
    let all = value
        .get("packages")
        .map(Value::as_array)
        .unwrap_or_default();
    let mut packages = Vec::new();
    for id in &members {
        let Some(p) = all.iter().find(|p| p.str_at("id") == id) else {
            continue;
        };
        let dir = Path::new(p.str_at("manifest_path"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        // `publish`: null when any registry may have it, a list of registries otherwise
        // (`publish = false` is the empty list).
        let publish = match p.get("publish") {
            None | Some(Value::Null) => true,
            Some(registries) => strings(Some(registries)).iter().any(|r| r == "crates-io"),
        };
        let dependencies = p
            .get("dependencies")
            .map(Value::as_array)
            .unwrap_or_default()
            .iter()
            .map(|d| Dependency {
                name: d.str_at("name").to_owned(),
                kind: match d.get("kind").and_then(Value::as_str) {
                    Some("dev") => Kind::Dev,
                    Some("build") => Kind::Build,
                    _ => Kind::Normal,
                },
                path: d.get("path").and_then(Value::as_str).map(PathBuf::from),
                versioned: d.str_at("req") != "*",
            })
            .collect();
        let features = match p.get("features") {
            Some(Value::Object(members)) => members.iter().map(|(k, _)| k.clone()).collect(),
            _ => Vec::new(),
        };
        let library = p
            .get("targets")
            .map(Value::as_array)
            .unwrap_or_default()
            .iter()
            .any(|t| {
                t.get("kind")
                    .map(Value::as_array)
                    .unwrap_or_default()
                    .iter()
                    .any(|k| matches!(k.as_str(), Some("lib" | "rlib" | "proc-macro")))
            });
        packages.push(Package {
            name: p.str_at("name").to_owned(),
            version: p.str_at("version").to_owned(),
            publish,
            description: p.str_at("description").trim().to_owned(),
            license: p.str_at("license").to_owned(),
            repository: p.str_at("repository").to_owned(),
            readme: p.get("readme").and_then(Value::as_str).map(str::to_owned),
            rust_version: p.str_at("rust_version").to_owned(),
            keywords: strings(p.get("keywords")),
            categories: strings(p.get("categories")),
            library,
            features,
            docs_rs: p
                .get("metadata")
                .and_then(|m| m.get("docs"))
                .and_then(|d| d.get("rs"))
                .cloned(),
            dependencies,
            dir,
        });
    }
    Ok(packages)
}

/// What `package` lacks to be published well; empty when nothing.
fn problems(package: &Package, workspace: &[Package]) -> Vec<String> {
    let mut problems = Vec::new();
    if package.description.is_empty() {
        problems.push("no description".to_owned());
    }
    if package.license.is_empty() {
        problems.push("no license (an SPDX expression)".to_owned());
    }
    if !has_license_text(&package.dir) {
        problems.push(
            "no license text in the package (a LICENSE file, or a link to the root's)".to_owned(),
        );
    }
    if !package.repository.starts_with("https://") {
        problems.push("no repository (an https:// URL)".to_owned());
    }
    match &package.readme {
        None => problems.push("no readme".to_owned()),
        Some(readme) if !package.dir.join(readme).is_file() => {
            problems.push(format!("readme {readme} does not exist"));
        }
        Some(_) => {}
    }
    if package.rust_version.is_empty() {
        problems.push("no rust-version".to_owned());
    }
    if package.keywords.len() > MAX_KEYWORDS {
        problems.push(format!(
            "{} keywords: crates.io takes at most {MAX_KEYWORDS}",
            package.keywords.len()
        ));
    }
    for keyword in &package.keywords {
        if !valid_keyword(keyword) {
            problems.push(format!(
                "keyword {keyword:?}: crates.io takes at most 20 ASCII letters, digits, `_`, `-` \
                 or `+`, starting with a letter or digit"
            ));
        }
    }
    if package.categories.is_empty() || package.categories.len() > MAX_CATEGORIES {
        problems.push(format!(
            "{} categories: give 1 to {MAX_CATEGORIES}",
            package.categories.len()
        ));
    }
    for category in &package.categories {
        if !CATEGORIES.contains(&category.as_str()) {
            problems.push(format!("category {category:?} is not one of crates.io's"));
        }
    }
    if package.library {
        problems.extend(docs_rs_problems(package));
    }
    for dependency in &package.dependencies {
        let Some(path) = &dependency.path else {
            continue;
        };
        // A dev-dependency without a version is dropped from the upload; with one, it stays,
        // and crates.io must have it like any other.
        let kept = dependency.kind != Kind::Dev || dependency.versioned;
        if !kept {
            continue;
        }
        if !dependency.versioned {
            problems.push(format!(
                "the path dependency {} has no version (crates.io needs one)",
                dependency.name
            ));
        }
        if let Some(target) = workspace.iter().find(|p| &p.dir == path)
            && !target.publish
        {
            problems.push(format!(
                "depends on {}, which is not published{}",
                target.name,
                if dependency.kind == Kind::Dev {
                    " (a dev-dependency without a version would be dropped)"
                } else {
                    ""
                }
            ));
        }
    }
    problems
}

/// What is wrong with `[package.metadata.docs.rs]`.
fn docs_rs_problems(package: &Package) -> Vec<String> {
    let Some(docs_rs) = &package.docs_rs else {
        return vec!["no [package.metadata.docs.rs] (which features docs.rs documents)".to_owned()];
    };
    let mut problems = Vec::new();
    let listed: Vec<&str> = docs_rs
        .get("features")
        .map(Value::as_array)
        .unwrap_or_default()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let all = docs_rs.get("all-features").and_then(Value::as_bool) == Some(true);
    if !all && listed.is_empty() && !package.features.is_empty() {
        problems.push(
            "[package.metadata.docs.rs] names no features (`features = [...]` or \
             `all-features = true`)"
                .to_owned(),
        );
    }
    for feature in listed {
        if !package.features.iter().any(|f| f == feature) {
            problems.push(format!(
                "[package.metadata.docs.rs] names the feature {feature:?}, which the package does \
                 not have"
            ));
        }
    }
    problems
}

/// Whether the package's directory holds a license text (a file or a link to one).
fn has_license_text(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name().to_string_lossy().to_ascii_uppercase();
        (name.starts_with("LICENSE") || name.starts_with("LICENCE") || name.starts_with("COPYING"))
            // `is_file` follows a link, so a dangling one does not count.
            && entry.path().is_file()
    })
}

/// crates.io's limit of keywords per crate.
const MAX_KEYWORDS: usize = 5;

/// crates.io's limit of categories per crate.
const MAX_CATEGORIES: usize = 5;

/// crates.io's rule for a keyword.
fn valid_keyword(keyword: &str) -> bool {
    keyword.len() <= 20
        && keyword
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && keyword
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
}

/// The category slugs crates.io accepts (its `src/boot/categories.toml`); an upload with any
/// other is accepted with a warning and the category dropped, which a dry run does not show.
const CATEGORIES: &[&str] = &[
    "algorithms",
    "api-bindings",
    "asynchronous",
    "authentication",
    "caching",
    "command-line-interface",
    "command-line-utilities",
    "compression",
    "computer-vision",
    "concurrency",
    "config",
    "cryptography",
    "cryptography::cryptocurrencies",
    "data-structures",
    "database",
    "database-implementations",
    "date-and-time",
    "development-tools",
    "development-tools::build-utils",
    "development-tools::cargo-plugins",
    "development-tools::debugging",
    "development-tools::ffi",
    "development-tools::procedural-macro-helpers",
    "development-tools::profiling",
    "development-tools::testing",
    "email",
    "embedded",
    "emulators",
    "encoding",
    "external-ffi-bindings",
    "filesystem",
    "game-development",
    "game-engines",
    "games",
    "graphics",
    "gui",
    "hardware-support",
    "internationalization",
    "localization",
    "mathematics",
    "memory-management",
    "multimedia",
    "multimedia::audio",
    "multimedia::encoding",
    "multimedia::images",
    "multimedia::video",
    "network-programming",
    "no-std",
    "os",
    "os::linux-apis",
    "os::macos-apis",
    "os::unix-apis",
    "os::windows-apis",
    "parser-implementations",
    "parsing",
    "rendering",
    "rendering::data-formats",
    "rendering::engine",
    "rendering::graphics-api",
    "rust-patterns",
    "science",
    "science::robotics",
    "simulation",
    "template-engine",
    "text-editors",
    "text-processing",
    "value-formatting",
    "visualization",
    "wasm",
    "web-programming",
    "web-programming::http-client",
    "web-programming::http-server",
    "web-programming::websocket",
];

/// The published packages, each after the published packages it depends on (normal and build
/// dependencies), otherwise in the workspace's order. Cargo orders a multi-package publish
/// itself; the order is printed so that a release by hand can follow it.
fn publish_order(packages: &[Package]) -> Result<Vec<String>, String> {
    let published: Vec<&Package> = packages.iter().filter(|p| p.publish).collect();
    let needs = |p: &Package| -> Vec<String> {
        p.dependencies
            .iter()
            .filter(|d| d.kind != Kind::Dev)
            .filter_map(|d| {
                let path = d.path.as_ref()?;
                published
                    .iter()
                    .find(|q| &q.dir == path && q.name != p.name)
                    .map(|q| q.name.clone())
            })
            .collect()
    };
    let mut order: Vec<String> = Vec::new();
    while order.len() < published.len() {
        let next = published
            .iter()
            .find(|p| !order.contains(&p.name) && needs(p).iter().all(|n| order.contains(n)));
        match next {
            Some(p) => order.push(p.name.clone()),
            None => {
                let left: Vec<&str> = published
                    .iter()
                    .filter(|p| !order.contains(&p.name))
                    .map(|p| p.name.as_str())
                    .collect();
                return Err(format!(
                    "the published packages depend on each other in a circle: {}",
                    left.join(", ")
                ));
            }
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace as `cargo metadata --no-deps` describes it: a library `a` with all it
    /// needs, `b` depending on it, and the unpublished `tool`. `dir` holds their directories.
    fn metadata(dir: &Path) -> String {
        let package = |name: &str, publish: &str, extra: &str, deps: &str, targets: &str| {
            format!(
                r#"{{"name": "{name}", "id": "path+file://{root}/{name}#0.1.0",
                "manifest_path": "{root}/{name}/Cargo.toml", "publish": {publish},
                "description": "The {name} crate", "license": "Apache-2.0",
                "repository": "https://example.com/repo", "readme": "README.md",
                "rust_version": "1.95", "keywords": ["queue", "work-queue"],
                "categories": ["concurrency"], "features": {{"tls": [], "default": []}},
                "targets": [{targets}], "dependencies": [{deps}], {extra} "edition": "2024"}}"#,
                root = dir.display()
            )
        };
        let lib = r#"{"kind": ["lib"], "name": "x", "src_path": "/src/lib.rs"}"#;
        let bin = r#"{"kind": ["bin"], "name": "x", "src_path": "/src/main.rs"}"#;
        let docs = r#""metadata": {"docs": {"rs": {"features": ["tls"]}}},"#;
        let on_a = format!(
            r#"{{"name": "a", "req": "^0.1.0", "kind": null, "path": "{}/a"}}"#,
            dir.display()
        );
        let on_tool_dev = format!(
            r#"{{"name": "tool", "req": "*", "kind": "dev", "path": "{}/tool"}}"#,
            dir.display()
        );
        let packages = [
            package("a", "null", docs, "", lib),
            package("b", "null", "", &format!("{on_a}, {on_tool_dev}"), bin),
            package("tool", "[]", "", &on_a, bin),
        ];
        format!(
            r#"{{"packages": [{}], "workspace_members": [{}], "version": 1}}"#,
            packages.join(","),
            ["b", "a", "tool"]
                .map(|n| format!(r#""path+file://{}/{n}#0.1.0""#, dir.display()))
                .join(",")
        )
    }

    /// A directory with the packages' files: each a README.md and a LICENSE.
    fn workspace() -> (PathBuf, Vec<Package>) {
        let dir = std::env::temp_dir().join(format!(
            "xtask-publish-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        for name in ["a", "b", "tool"] {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(dir.join(name).join("README.md"), "# readme\n").unwrap();
            std::fs::write(dir.join(name).join("LICENSE"), "license\n").unwrap();
        }
        let packages = from_metadata(&metadata(&dir)).unwrap();
        (dir, packages)
    }

    fn named<'a>(packages: &'a [Package], name: &str) -> &'a Package {
        packages.iter().find(|p| p.name == name).unwrap()
    }

    #[test]
    fn reads_the_packages_from_cargo_metadata() {
        let (dir, packages) = workspace();
        let names: Vec<&str> = packages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["b", "a", "tool"]);
        let a = named(&packages, "a");
        assert!(a.publish && a.library);
        assert_eq!(a.keywords, ["queue", "work-queue"]);
        assert_eq!(a.dir, dir.join("a"));
        assert!(!named(&packages, "tool").publish);
        let b = named(&packages, "b");
        assert!(!b.library);
        assert_eq!(
            b.dependencies,
            [
                Dependency {
                    name: "a".into(),
                    kind: Kind::Normal,
                    path: Some(dir.join("a")),
                    versioned: true
                },
                Dependency {
                    name: "tool".into(),
                    kind: Kind::Dev,
                    path: Some(dir.join("tool")),
                    versioned: false
                }
            ]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_complete_package_passes() {
        let (dir, packages) = workspace();
        assert_eq!(
            problems(named(&packages, "a"), &packages),
            Vec::<String>::new()
        );
        // A binary needs no docs.rs settings; an unversioned dev-dependency on an
        // unpublished package is dropped on upload.
        assert_eq!(
            problems(named(&packages, "b"), &packages),
            Vec::<String>::new()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Takes something away from a package.
    type Breaks = fn(&mut Package);

    /// Each thing crates.io needs, taken away in turn, is reported.
    #[test]
    fn each_missing_field_is_reported() {
        let (dir, packages) = workspace();
        let a = named(&packages, "a");
        let cases: [(&str, Breaks); 15] = [
            ("no description", |p| p.description.clear()),
            ("no license", |p| p.license.clear()),
            ("no repository", |p| p.repository.clear()),
            ("no readme", |p| p.readme = None),
            ("readme README.txt does not exist", |p| {
                p.readme = Some("README.txt".into());
            }),
            ("no rust-version", |p| p.rust_version.clear()),
            ("6 keywords", |p| p.keywords = vec!["k".into(); 6]),
            ("keyword \"work queue\"", |p| {
                p.keywords = vec!["work queue".into()];
            }),
            ("keyword \"-queue\"", |p| p.keywords = vec!["-queue".into()]),
            ("keyword \"averyveryverylongkeyword\"", |p| {
                p.keywords = vec!["averyveryverylongkeyword".into()];
            }),
            ("0 categories", |p| p.categories.clear()),
            ("category \"queues\" is not one of crates.io's", |p| {
                p.categories = vec!["queues".into()];
            }),
            ("no [package.metadata.docs.rs]", |p| p.docs_rs = None),
            ("names the feature \"serde\"", |p| {
                p.docs_rs = Some(json::parse(r#"{"features": ["tls", "serde"]}"#).unwrap());
            }),
            ("names no features", |p| {
                p.docs_rs = Some(json::parse("{}").unwrap());
            }),
        ];
        for (expected, break_it) in cases {
            let mut broken = a.clone();
            break_it(&mut broken);
            let found = problems(&broken, &packages);
            assert!(
                found.iter().any(|p| p.contains(expected)),
                "{expected}: {found:?}"
            );
        }
        // docs.rs settings for every feature are fine too.
        let mut all = a.clone();
        all.docs_rs = Some(json::parse(r#"{"all-features": true}"#).unwrap());
        assert_eq!(problems(&all, &packages), Vec::<String>::new());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_license_text_is_needed_and_a_link_to_one_counts() {
        let (dir, packages) = workspace();
        let a = named(&packages, "a");
        std::fs::remove_file(dir.join("a/LICENSE")).unwrap();
        let found = problems(a, &packages);
        assert!(
            found.iter().any(|p| p.contains("no license text")),
            "{found:?}"
        );
        std::fs::write(dir.join("LICENSE"), "license\n").unwrap();
        std::os::unix::fs::symlink("../LICENSE", dir.join("a/LICENSE")).unwrap();
        assert_eq!(problems(a, &packages), Vec::<String>::new());
        // A link to nothing is no license.
        std::fs::remove_file(dir.join("LICENSE")).unwrap();
        let found = problems(a, &packages);
        assert!(
            found.iter().any(|p| p.contains("no license text")),
            "{found:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn path_dependencies_need_a_version_and_a_published_package() {
        let (dir, packages) = workspace();
        let mut b = named(&packages, "b").clone();
        b.dependencies[0].versioned = false;
        let found = problems(&b, &packages);
        assert!(
            found
                .iter()
                .any(|p| p.contains("path dependency a has no version")),
            "{found:?}"
        );
        // The same on a build-dependency.
        b.dependencies[0].kind = Kind::Build;
        assert!(
            problems(&b, &packages)
                .iter()
                .any(|p| p.contains("has no version"))
        );

        // A normal dependency on an unpublished package.
        let mut b = named(&packages, "b").clone();
        b.dependencies[1].kind = Kind::Normal;
        b.dependencies[1].versioned = true;
        let found = problems(&b, &packages);
        assert!(
            found
                .iter()
                .any(|p| p.contains("depends on tool, which is not published")),
            "{found:?}"
        );
        // A versioned dev-dependency stays in the upload, so it needs a published package too.
        b.dependencies[1].kind = Kind::Dev;
        let found = problems(&b, &packages);
        assert!(
            found.iter().any(|p| p.contains("depends on tool")),
            "{found:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn dependencies_come_first_in_the_publish_order() {
        let (dir, mut packages) = workspace();
        // `b` is listed before `a` in the workspace, and depends on it.
        assert_eq!(publish_order(&packages).unwrap(), ["a", "b"]);
        // A circle cannot be published.
        let on_b = Dependency {
            name: "b".into(),
            kind: Kind::Normal,
            path: Some(dir.join("b")),
            versioned: true,
        };
        packages
            .iter_mut()
            .find(|p| p.name == "a")
            .unwrap()
            .dependencies
            .push(on_b);
        let error = publish_order(&packages).unwrap_err();
        assert!(error.contains("circle: b, a"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_command_publishes_all_at_once_or_packages_offline() {
        let order = ["a".to_owned(), "b".to_owned()];
        let online = Options {
            verify: true,
            offline: false,
        };
        assert_eq!(
            command_args(&order, online).join(" "),
            "publish --dry-run --allow-dirty -p a -p b"
        );
        let offline = Options {
            verify: false,
            offline: true,
        };
        assert_eq!(
            command_args(&order, offline).join(" "),
            "package --offline --allow-dirty --no-verify -p a -p b"
        );
    }

    #[test]
    fn an_earlier_runs_unpacked_siblings_are_removed_and_nothing_else() {
        let home = std::env::temp_dir().join(format!("xtask-cargo-home-{}", std::process::id()));
        let src = home.join("registry").join("src");
        let make = |path: PathBuf| {
            std::fs::create_dir_all(&path).unwrap();
            std::fs::write(path.join("lib.rs"), "").unwrap();
            path
        };
        let local = make(src.join("-14cd1cce6819ff87").join("a-0.1.0"));
        let other_version = make(src.join("-14cd1cce6819ff87").join("a-0.0.9"));
        let stranger = make(src.join("-14cd1cce6819ff87").join("zzz-0.1.0"));
        let crates_io = make(src.join("index.crates.io-1949cf8c6b5b557f").join("a-0.1.0"));
        let packages = [("a".to_owned(), "0.1.0".to_owned())];
        assert_eq!(remove_stale_unpacked(&home, &packages), vec![local.clone()]);
        assert!(!local.exists());
        assert!(other_version.exists() && stranger.exists() && crates_io.exists());
        // A home without a registry: nothing to do.
        assert!(remove_stale_unpacked(&home.join("none"), &packages).is_empty());
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn an_earlier_runs_builds_of_our_packages_are_forgotten_and_nothing_else() {
        let target = std::env::temp_dir().join(format!("xtask-target-{}", std::process::id()));
        let fingerprints = target.join("debug").join(".fingerprint");
        let make = |name: &str| {
            let path = fingerprints.join(name);
            std::fs::create_dir_all(&path).unwrap();
            path
        };
        let ours = make("a-0123456789abcdef");
        let sibling = make("a-b-0123456789abcdef");
        let dependency = make("tokio-0123456789abcdef");
        let packages = [("a".to_owned(), "0.1.0".to_owned())];
        assert_eq!(remove_stale_builds(&target, &packages), vec![ours.clone()]);
        assert!(!ours.exists() && sibling.exists() && dependency.exists());
        std::fs::remove_dir_all(target).unwrap();
    }

    #[test]
    fn reads_its_options() {
        let args =
            |text: &str| -> Vec<String> { text.split_whitespace().map(str::to_owned).collect() };
        assert_eq!(
            parse(&args("")),
            Ok(Options {
                verify: true,
                offline: false
            })
        );
        assert_eq!(
            parse(&args("--offline --no-verify")),
            Ok(Options {
                verify: false,
                offline: true
            })
        );
        assert!(parse(&args("--dry-run")).is_err());
    }

    #[test]
    fn keywords_follow_crates_io_rules() {
        for good in ["queue", "rate-limit", "k8s", "c++", "work_queue", "9p"] {
            assert!(valid_keyword(good), "{good}");
        }
        for bad in [
            "",
            "-queue",
            "work queue",
            "wörk",
            "a.b",
            "abcdefghijklmnopqrstu",
        ] {
            assert!(!valid_keyword(bad), "{bad}");
        }
    }

    #[test]
    fn the_workspace_itself_passes() {
        // The real workspace: every published package has its metadata (the dry run itself
        // is CI's step, not a unit test).
        let packages = load().unwrap();
        let published: Vec<&Package> = packages.iter().filter(|p| p.publish).collect();
        assert!(published.iter().any(|p| p.name == "workq"), "{packages:?}");
        for package in published {
            assert_eq!(
                problems(package, &packages),
                Vec::<String>::new(),
                "{}",
                package.name
            );
        }
        let order = publish_order(&packages).unwrap();
        let at = |name: &str| order.iter().position(|n| n == name).unwrap();
        // The dashboard serves any `workq::admin::Admin`: it depends on the core only; the
        // CLI, which opens the backends' admins, comes after all of them.
        assert!(at("workq") < at("workq-redis"));
        assert!(at("workq") < at("workq-dashboard"));
        assert!(at("workq-redis") < at("workq-cli"));
        assert!(at("workq-postgres") < at("workq-cli"));
        assert!(at("workq-dashboard") < at("workq-cli"));
    }
}
