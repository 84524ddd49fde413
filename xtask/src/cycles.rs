//! `cargo xtask cycles`: the files of a crate that import each other, round in a circle.
//!
//! For each library and binary of the workspace, a graph of its files: an edge A -> B when
//! A names an item of B through `crate::` or `super::`, in a `use` or in a path in its code
//! (`crate::a::f()`, `super::b::C`, or a name a `use crate::...` brought in), comments and
//! literals aside. A path is followed through the re-exports it meets to the file that
//! defines the item; the re-exports themselves (`pub use` in `lib.rs`, `main.rs`, `mod.rs`
//! and other files with file modules) are not edges, since they only pass names on. A
//! module's own children, named by relative paths (`use child::Item`, `child::f()`), are not
//! edges either: a module may use what it declares, and the circles this check is about are
//! between files that reach each other across the crate. Each elementary cycle of the graph
//! (Tarjan's components, then every cycle in each) is one line, starting at its smallest
//! file.
//!
//! The cycles that exist today are listed in `xtask/allowed-cycles.txt`, one line each. The
//! check fails on a cycle that is not listed, and on a listed one that is gone (remove its
//! line): the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cargo::{Kind, Workspace};
use crate::rust::{Crate, Imported, Vis};

/// The cycles allowed today, one per line (`#` starts a comment).
const ALLOWED: &str = include_str!("../allowed-cycles.txt");

/// Where [`ALLOWED`] is, for messages.
pub(crate) const ALLOWED_PATH: &str = "xtask/allowed-cycles.txt";

/// Past this many elementary cycles in one component, the component is reported whole.
const MOST_CYCLES: usize = 200;

/// Why one file depends on another: the first place it names the other's items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Evidence {
    pub(crate) line: usize,
    /// The `use` or the path, as written (`use crate::queue::Shared`).
    pub(crate) text: String,
}

/// One cycle of files in one package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cycle {
    pub(crate) package: String,
    /// Paths from the package's directory, starting at the smallest; the last imports the
    /// first.
    pub(crate) files: Vec<String>,
    /// Per edge (`files[i]` -> `files[i + 1]`, then the last -> the first).
    pub(crate) evidence: Vec<Evidence>,
}

impl Cycle {
    /// Its line in the allow-list: `package: a.rs -> b.rs -> a.rs`.
    pub(crate) fn key(&self) -> String {
        format!(
            "{}: {} -> {}",
            self.package,
            self.files.join(" -> "),
            self.files[0]
        )
    }

    /// The cycle and, per edge, the line that makes it.
    pub(crate) fn describe(&self) -> String {
        let mut text = self.key();
        for (i, evidence) in self.evidence.iter().enumerate() {
            let from = &self.files[i];
            let to = &self.files[(i + 1) % self.files.len()];
            text.push_str(&format!(
                "\n    {from}:{} -> {to}    {}",
                evidence.line, evidence.text
            ));
        }
        text
    }
}

/// The edges of `krate`'s file graph, with the first line that makes each.
pub(crate) fn edges(krate: &Crate) -> BTreeMap<(usize, usize), Evidence> {
    let mut edges: BTreeMap<(usize, usize), Evidence> = BTreeMap::new();
    let mut add = |from: usize, to: usize, evidence: Evidence| {
        if from != to {
            let slot = edges.entry((from, to)).or_insert_with(|| evidence.clone());
            if evidence.line < slot.line {
                *slot = evidence;
            }
        }
    };
    for u in &krate.uses {
        if krate.hubs[u.file] && u.module_level && u.vis != Vis::Private {
            continue; // a re-export
        }
        if !krate.across(u.module, &u.path) {
            continue;
        }
        let target = match u.imported {
            Imported::Glob => krate.resolve_module(u.module, &u.path),
            _ => krate.resolve(u.module, &u.path).map(|t| t.module),
        };
        if let Some(module) = target {
            let glob = if u.imported == Imported::Glob {
                "::*"
            } else {
                ""
            };
            add(
                u.file,
                krate.modules[module].file,
                Evidence {
                    line: u.line,
                    text: format!("use {}{glob}", u.path.join("::")),
                },
            );
        }
    }
    for p in &krate.paths {
        if !krate.across(p.module, &p.path) {
            continue;
        }
        if let Some(target) = krate.resolve(p.module, &p.path) {
            add(
                p.file,
                krate.modules[target.module].file,
                Evidence {
                    line: p.line,
                    text: p.path.join("::"),
                },
            );
        }
    }
    edges
}

/// The strongly connected components of a graph of `n` nodes with more than one node
/// (Tarjan's algorithm).
fn components(n: usize, next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.next[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(index) if s.on_stack[w] => s.low[v] = s.low[v].min(index),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort_unstable();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if state.index[v].is_none() {
            visit(&mut state, v);
        }
    }
    state.found
}

/// Every elementary cycle inside `component`, each from its smallest node (in `order`), at
/// most [`MOST_CYCLES`] (`None` past it).
fn elementary_cycles(
    component: &[usize],
    next: &[Vec<usize>],
    order: &dyn Fn(usize) -> String,
) -> Option<Vec<Vec<usize>>> {
    let mut members: Vec<usize> = component.to_vec();
    members.sort_by_key(|&v| order(v));
    let rank: BTreeMap<usize, usize> = members.iter().enumerate().map(|(r, &v)| (v, r)).collect();
    let mut cycles = Vec::new();
    for (r, &start) in members.iter().enumerate() {
        // Paths from `start` through members ranked after it, back to `start`.
        let mut path = vec![start];
        let mut choices: Vec<usize> = vec![0];
        while let Some(&v) = path.last() {
            let at = choices.last_mut().expect("one per node on the path");
            let Some(&w) = next[v].get(*at) else {
                path.pop();
                choices.pop();
                continue;
            };
            *at += 1;
            if w == start {
                cycles.push(path.clone());
                if cycles.len() > MOST_CYCLES {
                    return None;
                }
            } else if rank.get(&w).is_some_and(|&rw| rw > r) && !path.contains(&w) {
                path.push(w);
                choices.push(0);
            }
        }
    }
    Some(cycles)
}

/// The cycles of one crate (a library or a binary of `package`, whose directory is `dir`).
pub(crate) fn crate_cycles(package: &str, dir: &Path, krate: &Crate) -> Vec<Cycle> {
    let edges = edges(krate);
    let n = krate.files.len();
    let mut next = vec![Vec::new(); n];
    for &(from, to) in edges.keys() {
        next[from].push(to);
    }
    let name = |v: usize| {
        let path = &krate.files[v];
        path.strip_prefix(dir).unwrap_or(path).display().to_string()
    };
    let mut cycles = Vec::new();
    for component in components(n, &next) {
        match elementary_cycles(&component, &next, &name) {
            Some(found) => {
                for files in found {
                    let evidence = (0..files.len())
                        .map(|i| edges[&(files[i], files[(i + 1) % files.len()])].clone())
                        .collect();
                    cycles.push(Cycle {
                        package: package.to_owned(),
                        files: files.into_iter().map(name).collect(),
                        evidence,
                    });
                }
            }
            None => {
                // Too many to list: the component, as one line.
                let mut files: Vec<String> = component.iter().map(|&v| name(v)).collect();
                files.sort();
                cycles.push(Cycle {
                    package: package.to_owned(),
                    evidence: vec![
                        Evidence {
                            line: 0,
                            text: format!("more than {MOST_CYCLES} cycles among these files"),
                        };
                        files.len()
                    ],
                    files,
                });
            }
        }
    }
    cycles
}

/// Reads a file of the workspace.
pub(crate) fn read_file(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Every crate of the workspace (its libraries and binaries), read: package, its
/// directory, the crate.
pub(crate) fn crates(workspace: &Workspace) -> Vec<(String, std::path::PathBuf, Crate)> {
    let mut crates = Vec::new();
    for package in &workspace.packages {
        for target in &package.targets {
            if matches!(target.kind, Kind::Lib | Kind::Bin) {
                let root = package.dir.join(&target.source);
                let krate = Crate::read(&root, &read_file);
                crates.push((package.name.clone(), package.dir.clone(), krate));
            }
        }
    }
    crates
}

/// The lines of an allow-list: no comments, no blank lines; an error for a repeated line.
pub(crate) fn allow_list(text: &str) -> Result<BTreeSet<String>, String> {
    let mut lines = BTreeSet::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if !lines.insert(line.clone()) {
            return Err(format!("listed twice: {line}"));
        }
    }
    Ok(lines)
}

/// The outcome of a check against an allow-list.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Found and listed.
    pub(crate) allowed: Vec<String>,
    /// Found, not listed: the check fails.
    pub(crate) new: Vec<String>,
    /// Listed, not found: the check fails until the line goes.
    pub(crate) gone: Vec<String>,
}

impl Verdict {
    pub(crate) fn of(found: &BTreeSet<String>, allowed: &BTreeSet<String>) -> Verdict {
        Verdict {
            allowed: found.intersection(allowed).cloned().collect(),
            new: found.difference(allowed).cloned().collect(),
            gone: allowed.difference(found).cloned().collect(),
        }
    }

    pub(crate) fn passed(&self) -> bool {
        self.new.is_empty() && self.gone.is_empty()
    }
}

/// The workspace's cycles, and the verdict against [`ALLOWED`]; warnings for module files
/// that were not found.
pub(crate) fn check(workspace: &Workspace) -> Result<(Vec<Cycle>, Verdict, Vec<String>), String> {
    let mut cycles: Vec<Cycle> = Vec::new();
    let mut warnings = Vec::new();
    for (package, dir, krate) in crates(workspace) {
        for missing in &krate.missing {
            warnings.push(format!("{package}: no file for a module: {missing}"));
        }
        for cycle in crate_cycles(&package, &dir, &krate) {
            if !cycles.iter().any(|c| c.key() == cycle.key()) {
                cycles.push(cycle);
            }
        }
    }
    let found: BTreeSet<String> = cycles.iter().map(Cycle::key).collect();
    let allowed = allow_list(ALLOWED).map_err(|e| format!("{ALLOWED_PATH}: {e}"))?;
    Ok((cycles, Verdict::of(&found, &allowed), warnings))
}

/// `cargo xtask cycles`: prints every cycle with the lines that make it; exit code 1 on a new
/// one or on a listed one that is gone.
pub(crate) fn main() -> i32 {
    let workspace = match Workspace::load() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("xtask cycles: {e}");
            return 1;
        }
    };
    let (cycles, verdict, warnings) = match check(&workspace) {
        Ok(out) => out,
        Err(e) => {
            eprintln!("xtask cycles: {e}");
            return 1;
        }
    };
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    for cycle in &cycles {
        let mark = if verdict.new.contains(&cycle.key()) {
            "NEW"
        } else {
            "allowed"
        };
        println!("{mark}: {}", cycle.describe());
    }
    println!(
        "\n{} import cycles: {} allowed by {ALLOWED_PATH}, {} new; {} listed there and gone",
        cycles.len(),
        verdict.allowed.len(),
        verdict.new.len(),
        verdict.gone.len()
    );
    report(&verdict, "import cycle", ALLOWED_PATH)
}

/// Prints what fails a check; its exit code.
pub(crate) fn report(verdict: &Verdict, what: &str, list: &str) -> i32 {
    for line in &verdict.new {
        eprintln!(
            "error: a new {what}: {line}\n  cut it (or, only if that cannot wait, add the line to {list})"
        );
    }
    for line in &verdict.gone {
        eprintln!("error: no longer found, remove its line from {list}: {line}");
    }
    i32::from(!verdict.passed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rust::tests::crate_of;

    fn keys(files: &[(&str, &str)]) -> Vec<String> {
        crate_cycles("p", Path::new("/c"), &crate_of(files))
            .iter()
            .map(Cycle::key)
            .collect()
    }

    #[test]
    fn two_files_that_import_each_other_are_a_cycle_with_the_lines_that_make_it() {
        let files = [
            ("lib.rs", "mod lease;\nmod queue;\npub use lease::Lease;\n"),
            (
                "lease.rs",
                "// use crate::queue::Nothing\nuse crate::queue::Shared;\npub struct Lease;\n",
            ),
            (
                "queue.rs",
                "pub struct Shared;\nfn f() { let _ = crate::Lease; }\n",
            ),
        ];
        let cycles = crate_cycles("p", Path::new("/c"), &crate_of(&files));
        assert_eq!(cycles.len(), 1);
        assert_eq!(
            cycles[0].key(),
            "p: src/lease.rs -> src/queue.rs -> src/lease.rs"
        );
        assert_eq!(
            cycles[0].describe(),
            "p: src/lease.rs -> src/queue.rs -> src/lease.rs\n    \
             src/lease.rs:2 -> src/queue.rs    use crate::queue::Shared\n    \
             src/queue.rs:2 -> src/lease.rs    crate::Lease"
        );
    }

    #[test]
    fn re_exports_comments_and_strings_make_no_edge() {
        // lib.rs re-exports both files' items and names them in comments and strings only.
        let files = [
            (
                "lib.rs",
                "mod a;\nmod b;\npub use a::A;\npub(crate) use b::B;\n/// crate::a::A\n\
                 const S: &str = \"crate::b::B\";\n",
            ),
            ("a.rs", "use crate::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\n"),
        ];
        assert!(keys(&files).is_empty());
        // A module naming its own child by a relative path is no edge; through `crate::` it is,
        // and a.rs -> lib.rs then makes the cycle.
        let files = [
            ("lib.rs", "mod a;\npub struct Root;\nfn f() { a::g(); }\n"),
            ("a.rs", "pub fn g() { let _ = super::Root; }\n"),
        ];
        assert!(keys(&files).is_empty());
        let files = [
            (
                "lib.rs",
                "mod a;\npub struct Root;\nfn f() { crate::a::g(); }\n",
            ),
            ("a.rs", "pub fn g() { let _ = super::Root; }\n"),
        ];
        assert_eq!(keys(&files), ["p: src/a.rs -> src/lib.rs -> src/a.rs"]);
    }

    #[test]
    fn a_cycle_through_three_files_and_globs_is_one_line_per_elementary_cycle() {
        let files = [
            ("lib.rs", "mod queue;\nmod metrics;\nmod stats;\n"),
            (
                "queue/mod.rs",
                "mod locked;\nmod timer;\npub use locked::g;\nfn h() { timer::Timer; }\n",
            ),
            (
                "queue/locked.rs",
                "use super::timer::Timer;\nuse crate::metrics::*;\npub fn g() {}\n",
            ),
            (
                "queue/timer.rs",
                "use super::locked::g;\nuse super::h;\npub struct Timer;\n",
            ),
            (
                "metrics.rs",
                "use crate::stats::QueueStats;\npub struct Metrics;\n",
            ),
            (
                "stats.rs",
                "pub struct QueueStats;\nfn f() { crate::queue::g(); }\n",
            ),
        ];
        assert_eq!(
            keys(&files),
            [
                "p: src/metrics.rs -> src/stats.rs -> src/queue/locked.rs -> src/metrics.rs",
                "p: src/queue/locked.rs -> src/queue/timer.rs -> src/queue/locked.rs",
            ]
        );
    }

    #[test]
    fn the_allow_list_fails_on_a_new_cycle_and_on_a_gone_one() {
        let allowed =
            allow_list("# comment\np: a -> b -> a\n\np:  c -> d -> c  # cut soon\n").unwrap();
        let found: BTreeSet<String> = ["p: c -> d -> c", "p: e -> f -> e"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        let verdict = Verdict::of(&found, &allowed);
        assert_eq!(verdict.allowed, ["p: c -> d -> c"]);
        assert_eq!(verdict.new, ["p: e -> f -> e"]);
        assert_eq!(verdict.gone, ["p: a -> b -> a"]);
        assert!(!verdict.passed());
        assert!(allow_list("x\nx\n").is_err());
        let same: BTreeSet<String> = allowed.clone();
        assert!(Verdict::of(&same, &allowed).passed());
    }

    /// The workspace against `xtask/allowed-cycles.txt`: no new cycle, and none listed that is
    /// gone.
    #[test]
    fn no_file_imports_another_that_imports_it_back() {
        let workspace = Workspace::load().expect("cargo metadata");
        let (cycles, verdict, warnings) = check(&workspace).expect("the allow-list reads");
        assert!(warnings.is_empty(), "{warnings:#?}");
        let described: Vec<String> = cycles
            .iter()
            .filter(|c| verdict.new.contains(&c.key()))
            .map(Cycle::describe)
            .collect();
        assert!(
            verdict.new.is_empty(),
            "new import cycles (cut them; `cargo xtask cycles` lists them all):\n{}",
            described.join("\n")
        );
        assert!(
            verdict.gone.is_empty(),
            "cycles listed in {ALLOWED_PATH} that are gone (remove their lines):\n{}",
            verdict.gone.join("\n")
        );
    }
}
