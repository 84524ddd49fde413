//! Which tests start a server (Redis, PostgreSQL) or a browser, and so are left out of
//! `cargo xtask test --quick`.
//!
//! Kept as a list, by test binary, so that the quick loop does not even compile them (most of
//! its time would go there). The list cannot drift silently: the quick run hides every server
//! binary (`WQ_REDIS_SERVER`, `WQ_PG_BIN`, `WQ_CHROMIUM`, `WQ_CHROMEDRIVER`, `WQ_NGINX` point
//! at nothing)
//! and sets `CI=true`, under which the tests' support code fails rather than skips. So a test
//! that starts a server and is not listed here fails the quick run, and the runner says to
//! list it.

use std::path::Path;

use crate::cargo::{Kind, Target, Workspace};

/// Test binaries that start a server: package, integration test (`None`: every one of the
/// package), and what they start.
const SERVER_BINARIES: &[(&str, Option<&str>, &str)] = &[
    ("workq-redis", None, "redis-server"),
    ("workq-postgres", None, "PostgreSQL"),
    ("workq-dashboard", Some("api"), "redis-server"),
    ("workq-dashboard", Some("postgres"), "PostgreSQL"),
    ("workq-dashboard", Some("operators"), "redis-server"),
    ("workq-dashboard", Some("security"), "redis-server"),
    ("workq-dashboard", Some("proxy"), "nginx and redis-server"),
    (
        "workq-dashboard",
        Some("browser"),
        "Chromium, redis-server and PostgreSQL",
    ),
    ("workq-kube", Some("redis"), "redis-server"),
    ("workq-kube", Some("postgres"), "PostgreSQL"),
    ("workq-kube", Some("signal"), "redis-server"),
    ("workq-cli", Some("redis_cli"), "redis-server"),
    ("workq-cli", Some("postgres_cli"), "PostgreSQL"),
    ("workq-cli", Some("queue"), "redis-server and PostgreSQL"),
    ("workq-bench", Some("redis"), "redis-server"),
    ("workq-bench", Some("postgres"), "PostgreSQL"),
    (
        "workq-cli",
        Some("dashboard"),
        "redis-server, PostgreSQL and nginx",
    ),
];

/// Tests that start a server inside binaries that otherwise need none (unit tests): package,
/// target, and the name filter libtest's `--skip` takes.
const SERVER_TESTS: &[(&str, &str, &str)] = &[("workq-cli", "wq", "demo::on_postgres::tests::")];

/// Test binaries that run alone, nothing beside them, after the build: fault injection whose
/// checks depend on timing windows (kills, stops, lease expiry), which a busy machine skews.
/// PostgreSQL's `faults` and `locks` hold rows and tables for a few lease durations of 1 s and
/// check that the leases were renewed meanwhile and that other work finished in the window.
const ALONE: &[(&str, &str)] = &[
    ("workq-redis", "crash"),
    ("workq-postgres", "crash"),
    ("workq-postgres", "faults"),
    ("workq-postgres", "locks"),
];

/// Whether the binary of `target` runs alone.
pub(crate) fn runs_alone(package: &str, target: &Target) -> bool {
    target.kind == Kind::Test && ALONE.contains(&(package, target.name.as_str()))
}

/// What starts a server, for [`Target`]s of `package`: `Some(what)` for a whole binary.
pub(crate) fn server_binary(package: &str, target: &Target) -> Option<&'static str> {
    if target.kind != Kind::Test {
        return None;
    }
    SERVER_BINARIES
        .iter()
        .find(|(p, t, _)| *p == package && t.is_none_or(|t| t == target.name))
        .map(|(_, _, what)| *what)
}

/// The `--skip` filters for the binary of `target` in the quick run.
pub(crate) fn server_tests(package: &str, target: &Target) -> Vec<String> {
    if !matches!(target.kind, Kind::Lib | Kind::Bin) {
        return Vec::new();
    }
    SERVER_TESTS
        .iter()
        .filter(|(p, t, _)| *p == package && *t == target.name)
        .flat_map(|(_, _, filter)| ["--skip".to_owned(), (*filter).to_owned()])
        .collect()
}

/// The quick run's selection.
#[derive(Debug, Clone, Default)]
pub(crate) struct Quick {
    /// Target options for `cargo test --workspace --all-features --no-run`.
    pub(crate) cargo_args: Vec<String>,
    /// Server binaries left out: package, target.
    pub(crate) skipped: Vec<(String, Target)>,
    /// Server binaries that cargo builds anyway, because an integration test of the quick run
    /// has the same name in another package (`--test NAME` selects every package's NAME).
    /// They are not run.
    pub(crate) built_not_run: Vec<(String, Target)>,
}

/// The quick run's selection in `workspace`: unit tests of every library and binary (less
/// [`SERVER_TESTS`]), and every integration test not in [`SERVER_BINARIES`].
pub(crate) fn quick(workspace: &Workspace) -> Quick {
    let mut quick = Quick {
        cargo_args: vec!["--lib".into(), "--bins".into()],
        ..Quick::default()
    };
    let mut names: Vec<&str> = Vec::new();
    for package in &workspace.packages {
        for target in package.targets.iter().filter(|t| t.kind == Kind::Test) {
            if server_binary(&package.name, target).is_some() {
                quick.skipped.push((package.name.clone(), target.clone()));
            } else if !names.contains(&target.name.as_str()) {
                names.push(&target.name);
            }
        }
    }
    for name in &names {
        quick.cargo_args.push("--test".into());
        quick.cargo_args.push((*name).to_owned());
    }
    quick.built_not_run = quick
        .skipped
        .iter()
        .filter(|(_, t)| names.contains(&t.name.as_str()))
        .cloned()
        .collect();
    quick
}

/// Whether the quick run runs `target` of `package` (cargo may build more, see
/// [`Quick::built_not_run`]).
pub(crate) fn in_quick_run(package: &str, target: &Target) -> bool {
    match target.kind {
        Kind::Lib | Kind::Bin => true,
        Kind::Test => server_binary(package, target).is_none(),
        Kind::Other => false,
    }
}

/// The environment of a quick run's test binaries: no server can be found, and `CI=true`
/// turns "not found" into a failure, so that a test starting a server that is missing from
/// the lists above fails instead of passing unseen. `nowhere` is an empty directory.
pub(crate) fn quick_env(nowhere: &Path) -> Vec<(String, String)> {
    let nowhere = nowhere.display().to_string();
    vec![
        ("CI".into(), "true".into()),
        ("WQ_REDIS_SERVER".into(), format!("{nowhere}/redis-server")),
        ("WQ_PG_BIN".into(), nowhere.clone()),
        ("WQ_CHROMIUM".into(), format!("{nowhere}/chromium")),
        ("WQ_CHROMEDRIVER".into(), format!("{nowhere}/chromedriver")),
        ("WQ_NGINX".into(), format!("{nowhere}/nginx")),
    ]
}

/// Variables removed from a quick run's environment (opt-outs that would let a server test
/// pass without running).
pub(crate) const QUICK_ENV_REMOVE: &[&str] = &[
    "WQ_SKIP_REDIS_TESTS",
    "WQ_SKIP_PG_TESTS",
    "WQ_SKIP_BROWSER_TESTS",
    "WQ_SKIP_NGINX_TESTS",
];

/// Whether a failed quick-run binary's output looks like a test that wanted a server.
pub(crate) fn wanted_a_server(output: &str, nowhere: &Path) -> bool {
    output.contains(&nowhere.display().to_string())
        || output.contains("CI must run")
        || output.contains("run initdb")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cargo::Package;

    fn target(name: &str, kind: Kind) -> Target {
        let source = match kind {
            Kind::Lib => "src/lib.rs".to_owned(),
            Kind::Bin => "src/main.rs".to_owned(),
            _ => format!("tests/{name}.rs"),
        };
        Target {
            name: name.into(),
            kind,
            source,
        }
    }

    fn package(name: &str, targets: Vec<Target>) -> Package {
        Package {
            name: name.into(),
            targets,
            dir: format!("/w/{name}").into(),
            published: true,
        }
    }

    fn workspace() -> Workspace {
        Workspace {
            root: "/w".into(),
            target_dir: "/w/target".into(),
            packages: vec![
                package(
                    "workq",
                    vec![
                        target("workq", Kind::Lib),
                        target("queue", Kind::Test),
                        target("workers", Kind::Test),
                    ],
                ),
                package(
                    "workq-redis",
                    vec![
                        target("workq_redis", Kind::Lib),
                        target("workers", Kind::Test),
                        target("crash", Kind::Test),
                        target("a_new_one", Kind::Test),
                    ],
                ),
                package(
                    "workq-cli",
                    vec![
                        target("wq", Kind::Bin),
                        target("demo", Kind::Test),
                        target("redis_cli", Kind::Test),
                    ],
                ),
            ],
        }
    }

    #[test]
    fn the_quick_run_leaves_out_every_server_binary_and_nothing_else() {
        let quick = quick(&workspace());
        assert_eq!(
            quick.cargo_args,
            [
                "--lib", "--bins", "--test", "queue", "--test", "workers", "--test", "demo"
            ]
        );
        let skipped: Vec<String> = quick
            .skipped
            .iter()
            .map(|(p, t)| format!("{p} {}", t.label()))
            .collect();
        // Every integration test of workq-redis, even one added since the list was made.
        assert_eq!(
            skipped,
            [
                "workq-redis tests/workers.rs",
                "workq-redis tests/crash.rs",
                "workq-redis tests/a_new_one.rs",
                "workq-cli tests/redis_cli.rs"
            ]
        );
        // `--test workers` builds workq-redis's `workers` too; the runner does not run it.
        let built: Vec<&str> = quick
            .built_not_run
            .iter()
            .map(|(p, _)| p.as_str())
            .collect();
        assert_eq!(built, ["workq-redis"]);
        assert!(!in_quick_run("workq-redis", &target("workers", Kind::Test)));
        assert!(in_quick_run("workq", &target("workers", Kind::Test)));
        assert!(in_quick_run(
            "workq-redis",
            &target("workq_redis", Kind::Lib)
        ));
    }

    /// The shared suites (`workq-conformance`) run in memory in `workq`'s own
    /// `tests/conformance.rs`, which the quick run keeps; on a server in each backend's
    /// tests, which it leaves out.
    #[test]
    fn the_shared_suites_run_in_memory_in_the_quick_run_and_on_servers_outside_it() {
        assert!(in_quick_run("workq", &target("conformance", Kind::Test)));
        for (package, test) in [
            ("workq-redis", "behaviour"),
            ("workq-redis", "workers"),
            ("workq-postgres", "behaviour"),
            ("workq-postgres", "workers"),
        ] {
            assert!(
                !in_quick_run(package, &target(test, Kind::Test)),
                "{package} {test}"
            );
        }
    }

    #[test]
    fn the_crash_tests_run_alone() {
        assert!(runs_alone("workq-redis", &target("crash", Kind::Test)));
        assert!(runs_alone("workq-postgres", &target("crash", Kind::Test)));
        assert!(!runs_alone("workq-redis", &target("faults", Kind::Test)));
        assert!(runs_alone("workq-postgres", &target("faults", Kind::Test)));
        assert!(!runs_alone("workq", &target("crash", Kind::Test)));
    }

    #[test]
    fn server_tests_inside_unit_test_binaries_are_skipped_by_name() {
        assert_eq!(
            server_tests("workq-cli", &target("wq", Kind::Bin)),
            ["--skip", "demo::on_postgres::tests::"]
        );
        assert!(server_tests("workq-cli", &target("demo", Kind::Test)).is_empty());
        assert!(server_tests("workq", &target("workq", Kind::Lib)).is_empty());
    }

    #[test]
    fn the_quick_environment_hides_every_server_and_fails_on_a_missing_one() {
        let nowhere = Path::new("/w/target/xtask/no-server");
        let env = quick_env(nowhere);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CI"), Some("true"));
        for var in [
            "WQ_REDIS_SERVER",
            "WQ_PG_BIN",
            "WQ_CHROMIUM",
            "WQ_CHROMEDRIVER",
        ] {
            assert!(
                get(var).unwrap().starts_with("/w/target/xtask/no-server"),
                "{var}"
            );
        }
        assert!(wanted_a_server(
            "redis-server not found: CI must run the Redis tests",
            nowhere
        ));
        assert!(wanted_a_server(
            "spawn /w/target/xtask/no-server/initdb: No such file",
            nowhere
        ));
        assert!(!wanted_a_server("assertion failed: left == right", nowhere));
    }
}
