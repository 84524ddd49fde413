//! The Debian packages the tests need, how to tell whether this machine has them, and their
//! installation with `apt-get` (as root, or through `sudo`).
//!
//! This is the one list of the project's system packages: `cargo xtask test` installs the
//! ones the tests need, `cargo xtask deps --ci` also the ones CI's own checks use.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

// What `wq demo` knows alike (where programs and PostgreSQL are, root, the `apt-get` line):
// one file, the CLI's, included here.
#[path = "../../workq-cli/src/demo/install.rs"]
mod install;

use install::{
    POSTGRES_PACKAGE, POSTGRES_ROOT, REDIS_PACKAGE, effective_uid, find_in, install_command,
    is_executable, newest_postgres, path_dirs,
};

/// How a package is found on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// An executable `program` in a `PATH` directory, or the file named by `var` when set (the
    /// tests read the same variable).
    Program {
        program: &'static str,
        var: Option<&'static str>,
    },
    /// A program outside a user's `PATH` (in `/usr/sbin`): the file named by `var` when set,
    /// else `program` on the `PATH`, else the file `path` (the tests look in the same places).
    Sbin {
        program: &'static str,
        var: &'static str,
        path: &'static str,
    },
    /// PostgreSQL's `initdb`: in the directory named by `WQ_PG_BIN` when set, else on the
    /// `PATH` or under `/usr/lib/postgresql/<version>/bin`, where the Debian package puts it
    /// (the tests look in the same places).
    Postgres,
}

/// A Debian package and why the project needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Package {
    /// The Debian package's name.
    pub(crate) name: &'static str,
    /// What shows it is installed.
    pub(crate) probe: Probe,
    /// Who uses it.
    pub(crate) used_by: &'static str,
    /// Needed by the test suite (`cargo xtask test`); otherwise only by CI's own checks.
    pub(crate) for_tests: bool,
}

/// Every system package the project uses. The tests start their own servers (on a free
/// loopback port, with a temporary data directory), so the packages' own services are not used.
pub(crate) const PACKAGES: &[Package] = &[
    Package {
        name: REDIS_PACKAGE,
        probe: Probe::Program {
            program: "redis-server",
            var: Some("WQ_REDIS_SERVER"),
        },
        used_by: "the Redis tests (workq-redis, the dashboard, wq, workq-kube, the bench)",
        for_tests: true,
    },
    Package {
        name: POSTGRES_PACKAGE,
        probe: Probe::Postgres,
        used_by: "the PostgreSQL tests (workq-postgres, the dashboard, wq, workq-kube, the bench)",
        for_tests: true,
    },
    Package {
        name: "chromium",
        probe: Program {
            program: "chromium",
            var: Some("WQ_CHROMIUM"),
        },
        used_by: "the dashboard's browser test",
        for_tests: true,
    },
    Package {
        name: "chromium-driver",
        probe: Program {
            program: "chromedriver",
            var: Some("WQ_CHROMEDRIVER"),
        },
        used_by: "the dashboard's browser test (WebDriver)",
        for_tests: true,
    },
    Package {
        name: "faketime",
        probe: Program {
            program: "faketime",
            var: None,
        },
        used_by: "the Redis crash test that steps a server's clock",
        for_tests: true,
    },
    Package {
        name: "openssl",
        probe: Program {
            program: "openssl",
            var: None,
        },
        used_by: "the Redis TLS test, which makes its certificates with it",
        for_tests: true,
    },
    Package {
        name: "nginx",
        probe: Probe::Sbin {
            program: "nginx",
            var: "WQ_NGINX",
            path: "/usr/sbin/nginx",
        },
        used_by: "the dashboard's test behind a reverse proxy",
        for_tests: true,
    },
    Package {
        name: "prometheus",
        probe: Program {
            program: "promtool",
            var: None,
        },
        used_by: "CI's check of the metrics scrapes (promtool)",
        for_tests: false,
    },
];

use Probe::Program;

/// What the probes look at: the `PATH`, a few variables, and where Debian puts PostgreSQL.
/// A value rather than the process's own environment, so that the tests can make up machines.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    /// The `PATH`'s directories.
    pub(crate) path: Vec<PathBuf>,
    /// The variables that name the programs (`WQ_REDIS_SERVER`, `WQ_PG_BIN`, ...), when set.
    pub(crate) vars: HashMap<String, String>,
    /// `/usr/lib/postgresql`.
    pub(crate) postgres_root: PathBuf,
}

impl Machine {
    /// This machine, as the tests will see it.
    pub(crate) fn current() -> Machine {
        let path = path_dirs();
        let vars = [
            "WQ_REDIS_SERVER",
            "WQ_PG_BIN",
            "WQ_CHROMIUM",
            "WQ_CHROMEDRIVER",
            "WQ_NGINX",
        ]
        .into_iter()
        .filter_map(|var| Some((var.to_owned(), std::env::var(var).ok()?)))
        .collect();
        Machine {
            path,
            vars,
            postgres_root: PathBuf::from(POSTGRES_ROOT),
        }
    }

    /// Where `program` is on the `PATH`.
    pub(crate) fn on_path(&self, program: &str) -> Option<PathBuf> {
        find_in(&self.path, program)
    }

    /// Where the package's program is, or why it is not found.
    pub(crate) fn find(&self, package: &Package) -> Result<PathBuf, String> {
        match package.probe {
            Program { program, var } => {
                if let Some((var, value)) = var.and_then(|v| Some((v, self.vars.get(v)?))) {
                    let file = PathBuf::from(value);
                    return if is_executable(&file) {
                        Ok(file)
                    } else {
                        Err(format!("{var}={value} is not a program"))
                    };
                }
                self.on_path(program)
                    .ok_or_else(|| format!("no {program} on the PATH"))
            }
            Probe::Sbin { program, var, path } => {
                if let Some(value) = self.vars.get(var) {
                    let file = PathBuf::from(value);
                    return if is_executable(&file) {
                        Ok(file)
                    } else {
                        Err(format!("{var}={value} is not a program"))
                    };
                }
                self.on_path(program)
                    .or_else(|| Some(PathBuf::from(path)).filter(|f| is_executable(f)))
                    .ok_or_else(|| format!("no {program} on the PATH or at {path}"))
            }
            Probe::Postgres => {
                if let Some(value) = self.vars.get("WQ_PG_BIN") {
                    let dir = PathBuf::from(value);
                    return if is_executable(&dir.join("initdb")) {
                        Ok(dir)
                    } else {
                        Err(format!("WQ_PG_BIN={value} holds no initdb"))
                    };
                }
                if let Some(initdb) = self.on_path("initdb") {
                    return Ok(initdb.parent().map(Path::to_path_buf).unwrap_or_default());
                }
                newest_postgres(&self.postgres_root).ok_or_else(|| {
                    format!(
                        "no initdb on the PATH or in {}/<version>/bin",
                        self.postgres_root.display()
                    )
                })
            }
        }
    }

    /// The packages (of `wanted`) this machine lacks, with why each is counted missing.
    pub(crate) fn missing<'a>(&self, wanted: &[&'a Package]) -> Vec<(&'a Package, String)> {
        wanted
            .iter()
            .filter_map(|package| Some((*package, self.find(package).err()?)))
            .collect()
    }
}

/// The packages wanted: the tests', and with `ci` also those of CI's own checks.
pub(crate) fn wanted(ci: bool) -> Vec<&'static Package> {
    PACKAGES.iter().filter(|p| p.for_tests || ci).collect()
}

/// Who runs this, and how they could become root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Who {
    Root,
    User { name: String, sudo: Sudo },
}

/// A normal user's way to root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sudo {
    /// No `sudo` on the `PATH`.
    Missing,
    /// `sudo -n true` works: no password needed.
    NoPassword,
    /// `sudo` wants a password; it can ask only with a terminal.
    Password { terminal: bool },
}

impl Who {
    /// The current user.
    pub(crate) fn current(machine: &Machine) -> Who {
        if effective_uid() == Some(0) {
            return Who::Root;
        }
        let name = std::env::var("USER")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                let out = Command::new("id").arg("-un").output().ok()?;
                Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
            })
            .unwrap_or_else(|| "this user".to_owned());
        let sudo = match machine.on_path("sudo") {
            None => Sudo::Missing,
            Some(sudo) => {
                let quiet = Command::new(&sudo)
                    .args(["-n", "true"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if quiet {
                    Sudo::NoPassword
                } else {
                    // sudo asks on the controlling terminal, not on stdin.
                    Sudo::Password {
                        terminal: std::fs::File::open("/dev/tty").is_ok(),
                    }
                }
            }
        };
        Who::User { name, sudo }
    }
}

/// What to do about the missing packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing is missing.
    Ready,
    /// Install them with `apt-get`, through `sudo` unless root.
    Install { sudo: bool },
    /// They cannot be installed from here: why, and the command that would.
    Cannot { why: String },
    /// No `apt-get`: not a Debian-like machine.
    NoApt,
}

/// Decides how to get `missing` onto the machine.
pub(crate) fn plan(missing: &[&Package], apt: bool, who: &Who) -> Plan {
    if missing.is_empty() {
        return Plan::Ready;
    }
    if !apt {
        return Plan::NoApt;
    }
    match who {
        Who::Root => Plan::Install { sudo: false },
        Who::User { sudo, name } => match sudo {
            Sudo::NoPassword | Sudo::Password { terminal: true } => Plan::Install { sudo: true },
            Sudo::Missing => Plan::Cannot {
                why: format!("running as {name}, not root, and there is no sudo"),
            },
            Sudo::Password { terminal: false } => Plan::Cannot {
                why: format!(
                    "running as {name}, not root, and sudo wants a password but there is no \
                     terminal to ask it on"
                ),
            },
        },
    }
}

/// The command line that installs `packages`, for a person to run (with `sudo` unless root).
pub(crate) fn command_line(packages: &[&Package], root: bool) -> String {
    let names: Vec<&str> = packages.iter().map(|p| p.name).collect();
    install_command(&names, root)
}

/// Why a set-up step failed; what to tell the user was printed already.
#[derive(Debug)]
pub(crate) struct Failed;

/// Makes sure the machine has the `wanted` packages: reports what it finds, installs what is
/// missing (logging `apt-get`'s output to `log`), and checks again. On failure the message,
/// and the command to run by hand, were printed.
pub(crate) fn ensure(wanted: &[&Package], log: &Path) -> Result<(), Failed> {
    let machine = Machine::current();
    let missing = machine.missing(wanted);
    let present: Vec<&str> = wanted
        .iter()
        .filter(|p| !missing.iter().any(|(m, _)| m == *p))
        .map(|p| p.name)
        .collect();
    if missing.is_empty() {
        println!(
            "packages: all {} present ({})",
            wanted.len(),
            present.join(", ")
        );
        return Ok(());
    }
    let names: Vec<&Package> = missing.iter().map(|(p, _)| *p).collect();
    let mut text = String::new();
    for (package, why) in &missing {
        let _ = writeln!(
            text,
            "  {:<16} {why}; used by {}",
            package.name, package.used_by
        );
    }
    print!(
        "packages: {} of {} missing:\n{text}",
        missing.len(),
        wanted.len()
    );
    let apt = machine.on_path("apt-get").is_some();
    let who = Who::current(&machine);
    let root = who == Who::Root;
    match plan(&names, apt, &who) {
        Plan::Ready => return Ok(()),
        Plan::NoApt => {
            eprintln!(
                "\nThis machine has no apt-get, so they cannot be installed from here. Install \
                 the programs above with its package manager (or point the variables named \
                 above at them), then run `cargo xtask test` again; `cargo xtask test --quick` \
                 runs the tests that need none of them."
            );
            return Err(Failed);
        }
        Plan::Cannot { why } => {
            eprintln!(
                "\nCannot install them: {why}. Run this as root (or ask someone who can), then \
                 `cargo xtask test` again:\n\n    {}\n\n`cargo xtask test --quick` runs the \
                 tests that need none of them.",
                command_line(&names, false)
            );
            return Err(Failed);
        }
        Plan::Install { sudo } => install(&names, sudo, log)?,
    }
    let still = Machine::current().missing(&names);
    if !still.is_empty() {
        for (package, why) in &still {
            eprintln!(
                "packages: {} still missing after apt-get: {why}",
                package.name
            );
        }
        eprintln!(
            "\nInstall by hand ({}), then run `cargo xtask test` again:\n\n    {}",
            log.display(),
            command_line(&names, root)
        );
        return Err(Failed);
    }
    Ok(())
}

/// Runs `apt-get update` and `apt-get install` for `packages`, output to `log`.
fn install(packages: &[&Package], sudo: bool, log: &Path) -> Result<(), Failed> {
    let names: Vec<&str> = packages.iter().map(|p| p.name).collect();
    let how = if sudo {
        "through sudo (it may ask for your password)"
    } else {
        "as root"
    };
    println!(
        "installing {} {how}: apt-get update && apt-get install -y --no-install-recommends {} \
         (log: {})",
        names.join(" "),
        names.join(" "),
        log.display()
    );
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let started = Instant::now();
    // A fresh machine may be running its own apt (unattended upgrades): wait for its lock.
    let lock = "DPkg::Lock::Timeout=300";
    let mut install = vec!["install", "-y", "-q", "-o", lock, "--no-install-recommends"];
    install.extend(&names);
    let Ok(file) = std::fs::File::create(log) else {
        eprintln!("packages: cannot write {}", log.display());
        return Err(Failed);
    };
    for args in [vec!["update", "-q", "-o", lock], install] {
        let (Ok(out), Ok(err)) = (file.try_clone(), file.try_clone()) else {
            eprintln!("packages: cannot write {}", log.display());
            return Err(Failed);
        };
        let mut command = if sudo {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        } else {
            Command::new("apt-get")
        };
        // apt-get must not stop to ask anything (sudo asks for its password on the terminal).
        let status = command
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            let output = std::fs::read_to_string(log).unwrap_or_default();
            eprintln!(
                "packages: apt-get {} failed:\n{output}\nInstall by hand, then run `cargo \
                 xtask test` again:\n\n    {}",
                args[0],
                command_line(packages, !sudo)
            );
            return Err(Failed);
        }
    }
    println!(
        "installed {} in {:.0} s",
        names.join(" "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up machine in a temporary directory: `programs` on its only `PATH` directory,
    /// and PostgreSQL under its own `postgresql/<version>/bin` when `postgres` is given.
    struct Fake {
        root: PathBuf,
        machine: Machine,
    }

    impl Fake {
        fn new(name: &str, programs: &[&str], postgres: Option<&str>) -> Fake {
            let root = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let bin = root.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            for program in programs {
                executable(&bin.join(program));
            }
            let postgres_root = root.join("postgresql");
            if let Some(version) = postgres {
                let dir = postgres_root.join(version).join("bin");
                std::fs::create_dir_all(&dir).unwrap();
                executable(&dir.join("initdb"));
            }
            let machine = Machine {
                path: vec![bin],
                vars: HashMap::new(),
                postgres_root,
            };
            Fake { root, machine }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn executable(file: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn names(missing: &[(&Package, String)]) -> Vec<&'static str> {
        missing.iter().map(|(p, _)| p.name).collect()
    }

    const TEST_PROGRAMS: &[&str] = &[
        "redis-server",
        "chromium",
        "chromedriver",
        "faketime",
        "openssl",
    ];

    #[test]
    fn a_fresh_machine_lacks_every_test_package() {
        let fake = Fake::new("fresh", &[], None);
        let missing = fake.machine.missing(&wanted(false));
        assert_eq!(
            names(&missing),
            [
                "redis-server",
                "postgresql",
                "chromium",
                "chromium-driver",
                "faketime",
                "openssl"
            ]
        );
        let with_ci = fake.machine.missing(&wanted(true));
        assert_eq!(names(&with_ci).last(), Some(&"prometheus"));
    }

    #[test]
    fn a_set_up_machine_lacks_nothing_and_finds_the_newest_postgres() {
        let mut programs = TEST_PROGRAMS.to_vec();
        programs.push("promtool");
        let fake = Fake::new("ready", &programs, Some("15"));
        let postgres_17 = fake.machine.postgres_root.join("17/bin");
        std::fs::create_dir_all(&postgres_17).unwrap();
        executable(&postgres_17.join("initdb"));
        // A version directory without initdb does not count.
        std::fs::create_dir_all(fake.machine.postgres_root.join("18/bin")).unwrap();
        assert!(fake.machine.missing(&wanted(true)).is_empty());
        let postgres = PACKAGES.iter().find(|p| p.name == "postgresql").unwrap();
        assert_eq!(fake.machine.find(postgres).unwrap(), postgres_17);
    }

    #[test]
    fn a_non_executable_file_is_not_a_program() {
        let fake = Fake::new("noexec", TEST_PROGRAMS, Some("15"));
        std::fs::write(fake.machine.path[0].join("faketime"), "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            fake.machine.path[0].join("faketime"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(names(&fake.machine.missing(&wanted(false))), ["faketime"]);
    }

    #[test]
    fn the_tests_variables_override_the_path() {
        let mut fake = Fake::new("vars", TEST_PROGRAMS, None);
        // PostgreSQL only through WQ_PG_BIN, the way the tests find it.
        let pg = fake.root.join("pg");
        std::fs::create_dir_all(&pg).unwrap();
        executable(&pg.join("initdb"));
        fake.machine
            .vars
            .insert("WQ_PG_BIN".into(), pg.display().to_string());
        assert!(fake.machine.missing(&wanted(false)).is_empty());
        // A variable naming nothing counts as missing, whatever the PATH holds.
        fake.machine
            .vars
            .insert("WQ_REDIS_SERVER".into(), "/nonexistent/redis-server".into());
        let missing = fake.machine.missing(&wanted(false));
        assert_eq!(names(&missing), ["redis-server"]);
        assert!(missing[0].1.contains("WQ_REDIS_SERVER"), "{}", missing[0].1);
    }

    #[test]
    fn postgres_on_the_path_counts() {
        let fake = Fake::new("pgpath", &["initdb"], None);
        let postgres = PACKAGES.iter().find(|p| p.name == "postgresql").unwrap();
        assert_eq!(fake.machine.find(postgres).unwrap(), fake.machine.path[0]);
    }

    #[test]
    fn the_plan_follows_who_can_install() {
        let redis = &PACKAGES[0];
        let user = |sudo| Who::User {
            name: "alice".into(),
            sudo,
        };
        assert_eq!(plan(&[], false, &user(Sudo::Missing)), Plan::Ready);
        assert_eq!(plan(&[redis], false, &Who::Root), Plan::NoApt);
        assert_eq!(
            plan(&[redis], true, &Who::Root),
            Plan::Install { sudo: false }
        );
        assert_eq!(
            plan(&[redis], true, &user(Sudo::NoPassword)),
            Plan::Install { sudo: true }
        );
        assert_eq!(
            plan(&[redis], true, &user(Sudo::Password { terminal: true })),
            Plan::Install { sudo: true }
        );
        let Plan::Cannot { why } = plan(&[redis], true, &user(Sudo::Missing)) else {
            panic!("a user without sudo cannot install");
        };
        assert!(why.contains("alice") && why.contains("no sudo"), "{why}");
        let Plan::Cannot { why } = plan(&[redis], true, &user(Sudo::Password { terminal: false }))
        else {
            panic!("sudo without a terminal cannot ask for the password");
        };
        assert!(why.contains("terminal"), "{why}");
    }

    #[test]
    fn the_command_line_installs_exactly_the_missing_packages() {
        let missing: Vec<&Package> = PACKAGES
            .iter()
            .filter(|p| p.name.contains("chromium"))
            .collect();
        assert_eq!(
            command_line(&missing, false),
            "sudo apt-get update && sudo apt-get install -y --no-install-recommends chromium \
             chromium-driver"
        );
        assert_eq!(
            command_line(&missing[..1], true),
            "apt-get update && apt-get install -y --no-install-recommends chromium"
        );
    }
}
