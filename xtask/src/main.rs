//! The project's tasks, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `cargo xtask test`: installs the Debian packages the tests need (`apt-get`, as root or
//!   through `sudo`; without either it prints the command and stops before compiling), then
//!   builds and runs every test of the workspace, printing each suite's counts and time as it
//!   ends and one summary line per crate. `.ci/run` calls it for its test step.
//! - `cargo xtask test --quick`: only the tests that need no server, for a quick loop; the
//!   binaries that start one are not even built, and the summary says how many were skipped.
//! - `cargo xtask deps`: only the packages (`--ci`: also those CI's own checks use;
//!   `--check`: say what is missing, install nothing).
//! - `cargo xtask publish-check`: what crates.io needs of the published packages, then
//!   `cargo publish --dry-run` for them all (`publish.rs`).
//! - `cargo xtask cycles`: the files of a crate that import each other in a circle, against
//!   the list of those allowed today (`xtask/allowed-cycles.txt`, which only shrinks).
//! - `cargo xtask names`: public names two published crates export for different things,
//!   against `xtask/allowed-name-repeats.txt`.
//!
//! The arguments are read by hand rather than with clap: this crate is the first thing a fresh
//! clone compiles, so it has no dependencies (see `Cargo.toml`).

mod cargo;
mod cycles;
mod json;
mod names;
mod packages;
mod publish;
mod run;
mod rust;
mod suites;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  test [--quick] [--jobs N]
      Installs what the tests need and is missing (the Debian packages redis-server,
      postgresql, chromium, chromium-driver, faketime and openssl, with apt-get, as root or
      through sudo), then builds and runs every test of the workspace, as
      `cargo test --workspace --all-features` would, and prints a line per suite and one
      per crate. Exit code 0 only if all passed.
      --quick   only the tests that need no server or browser: installs nothing, does not
                build the binaries that start a server, and says how many it skipped
      --jobs N  test binaries run at once, one per crate (default: the cores)
  deps [--ci] [--check]
      Installs the Debian packages the tests need (--ci: also prometheus, whose promtool
      CI uses). --check: only says what is missing (exit code 1 if anything is).
  publish-check [--offline] [--no-verify]
      Checks what crates.io needs of every published package (description, license and
      its text, repository, readme, keywords, categories, rust-version, docs.rs settings,
      versions on path dependencies), then runs `cargo publish --dry-run` for them all in
      one command, each built from its package against the others' packages.
      --offline    `cargo package` instead: no registry, the same packaging and builds
      --no-verify  package only, build nothing
  cycles
      Lists the import cycles between the files of each crate, with the lines that make
      them. Exit code 1 on a cycle not in xtask/allowed-cycles.txt, or on a line there
      whose cycle is gone (the list only shrinks).
  names
      Lists the public names that two published crates export for different things. Exit
      code 1 on one not in xtask/allowed-name-repeats.txt, or on a line there that is gone.
  help
      This text.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|task| task == "publish-check") {
        return exit(publish::run(&args[1..]));
    }
    match parse(&args) {
        Ok(Task::Help) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Task::Test(options)) => exit(test::main(&options)),
        Ok(Task::Deps { ci, check }) => exit(deps(ci, check)),
        Ok(Task::Cycles) => exit(cycles::main()),
        Ok(Task::Names) => exit(names::main()),
        Err(e) => {
            eprintln!("xtask: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// A task and its options.
#[derive(Debug, PartialEq)]
enum Task {
    Help,
    Test(test::Options),
    Deps { ci: bool, check: bool },
    Cycles,
    Names,
}

/// Suites at once by default: as many as cores. Most of a suite's time is spent waiting for
/// servers, timers and child processes, but more at once made timing-sensitive server tests
/// fail on a busy 2-core machine.
fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

fn parse(args: &[String]) -> Result<Task, String> {
    let Some((task, rest)) = args.split_first() else {
        return Ok(Task::Help);
    };
    match task.as_str() {
        "help" | "--help" | "-h" => Ok(Task::Help),
        "test" => {
            let mut options = test::Options {
                quick: false,
                jobs: default_jobs(),
            };
            let mut rest = rest.iter();
            while let Some(arg) = rest.next() {
                match arg.as_str() {
                    "--quick" => options.quick = true,
                    "--jobs" | "-j" => {
                        let value = rest.next().ok_or("--jobs needs a number")?;
                        options.jobs = value
                            .parse()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| format!("--jobs {value}: not a positive number"))?;
                    }
                    "--help" | "-h" => return Ok(Task::Help),
                    other => return Err(format!("test: unknown option {other}")),
                }
            }
            Ok(Task::Test(options))
        }
        "deps" => {
            let (mut ci, mut check) = (false, false);
            for arg in rest {
                match arg.as_str() {
                    "--ci" => ci = true,
                    "--check" => check = true,
                    "--help" | "-h" => return Ok(Task::Help),
                    other => return Err(format!("deps: unknown option {other}")),
                }
            }
            Ok(Task::Deps { ci, check })
        }
        "cycles" | "names" => {
            if let Some(other) = rest.first() {
                return match other.as_str() {
                    "--help" | "-h" => Ok(Task::Help),
                    _ => Err(format!("{task}: unknown option {other}")),
                };
            }
            Ok(if task == "cycles" {
                Task::Cycles
            } else {
                Task::Names
            })
        }
        other => Err(format!("unknown task {other}")),
    }
}

/// `cargo xtask deps`.
fn deps(ci: bool, check: bool) -> i32 {
    let wanted = packages::wanted(ci);
    if check {
        let missing = packages::Machine::current().missing(&wanted);
        for package in &wanted {
            match missing.iter().find(|(m, _)| m == package) {
                Some((_, why)) => println!("missing  {:<16} {why}", package.name),
                None => println!("present  {}", package.name),
            }
        }
        if missing.is_empty() {
            return 0;
        }
        let names: Vec<&packages::Package> = missing.iter().map(|(p, _)| *p).collect();
        println!(
            "\nto install them:\n\n    {}",
            packages::command_line(&names, false)
        );
        return 1;
    }
    let log = cargo::Workspace::load().map_or_else(
        |_| std::env::temp_dir().join("xtask-apt-get.log"),
        |w| w.target_dir.join("xtask").join("apt-get.log"),
    );
    match packages::ensure(&wanted, &log) {
        Ok(()) => 0,
        Err(packages::Failed) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn reads_the_tasks_and_their_options() {
        assert_eq!(parse(&[]), Ok(Task::Help));
        assert_eq!(
            parse(&args("test")),
            Ok(Task::Test(test::Options {
                quick: false,
                jobs: default_jobs()
            }))
        );
        assert_eq!(
            parse(&args("test --quick --jobs 1")),
            Ok(Task::Test(test::Options {
                quick: true,
                jobs: 1
            }))
        );
        assert_eq!(
            parse(&args("deps --ci")),
            Ok(Task::Deps {
                ci: true,
                check: false
            })
        );
        assert_eq!(
            parse(&args("deps --check")),
            Ok(Task::Deps {
                ci: false,
                check: true
            })
        );
        assert_eq!(parse(&args("cycles")), Ok(Task::Cycles));
        assert_eq!(parse(&args("names")), Ok(Task::Names));
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        for bad in [
            "tset",
            "test --fast",
            "test --jobs",
            "test --jobs 0",
            "test --jobs x",
            "deps --all",
            "cycles --all",
            "names x",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad}");
        }
    }
}
