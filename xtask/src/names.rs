//! `cargo xtask names`: public names that two of our published crates export for different
//! things.
//!
//! A name a user reaches at a crate's root (`pub struct|enum|union|trait|type|fn|const|static`
//! there, or `pub use` there) may repeat in another crate only for the same concept on each
//! backend (`Error`, `Builder`, `Lease`, ...). Two crates exporting one item (`pub use
//! workq::X` beside `workq::X`) is not a repeat. The repeats that exist are listed in
//! `xtask/allowed-name-repeats.txt`, one line per name (`Name: crate crate ...`); the check
//! fails on a repeat not listed, and on a listed one that is gone.

use std::collections::{BTreeMap, BTreeSet};

use crate::cargo::{Kind, Workspace};
use crate::cycles::{Verdict, allow_list, read_file, report};
use crate::rust::{Crate, Imported, Vis};

/// The repeats allowed, one per line (`#` starts a comment).
const ALLOWED: &str = include_str!("../allowed-name-repeats.txt");

/// Where [`ALLOWED`] is, for messages.
const ALLOWED_PATH: &str = "xtask/allowed-name-repeats.txt";

/// The kinds of item a user names by their path (modules and macros aside).
const KINDS: &[&str] = &[
    "struct", "enum", "union", "trait", "type", "fn", "const", "static",
];

/// The public names at the root of `krate` (the library `lib`), each with what it is: the
/// crate and name of its definition as far as a path shows it (`workq::Lease` for `pub use
/// workq::Lease`; `kube::Api` for another crate's item).
pub(crate) fn root_names(lib: &str, krate: &Crate) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    if krate.modules.is_empty() {
        return names;
    }
    exported(lib, krate, 0, &mut names, 0);
    names
}

/// The public names of `module` (items and `pub use`s), into `names`.
fn exported(
    lib: &str,
    krate: &Crate,
    module: usize,
    names: &mut BTreeMap<String, String>,
    depth: usize,
) {
    for (name, item) in &krate.modules[module].items {
        if item.vis == Vis::Pub && KINDS.contains(&item.kind.as_str()) {
            names.insert(name.clone(), format!("{lib}::{name}"));
        }
    }
    for u in krate
        .uses
        .iter()
        .filter(|u| u.module == module && u.module_level && u.vis == Vis::Pub)
    {
        match &u.imported {
            Imported::Name(name) => {
                let origin = match krate.resolve(u.module, &u.path) {
                    Some(target) => {
                        let m = &krate.modules[target.module];
                        match target.item {
                            // A module: not a name this check is about.
                            None => continue,
                            Some(item) if m.children.contains_key(&item) => continue,
                            Some(item) => format!("{lib}::{item}"),
                        }
                    }
                    // Another crate's item: its crate and name.
                    None => format!(
                        "{}::{}",
                        u.path[0],
                        u.path.last().expect("a path has a segment")
                    ),
                };
                names.insert(name.clone(), origin);
            }
            Imported::Glob if depth < 4 => {
                if let Some(opened) = krate.resolve_module(u.module, &u.path) {
                    exported(lib, krate, opened, names, depth + 1);
                }
            }
            _ => {}
        }
    }
}

/// The repeats among `crates` (package, its root names): `Name: crate crate`, for each name
/// that crates export as different items.
pub(crate) fn repeats(crates: &[(String, BTreeMap<String, String>)]) -> BTreeSet<String> {
    let mut by_name: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (package, names) in crates {
        for (name, origin) in names {
            by_name
                .entry(name)
                .or_default()
                .push((package.as_str(), origin.as_str()));
        }
    }
    let mut lines = BTreeSet::new();
    for (name, exporters) in by_name {
        let origins: BTreeSet<&str> = exporters.iter().map(|(_, o)| *o).collect();
        if origins.len() > 1 {
            let packages: BTreeSet<&str> = exporters.iter().map(|(p, _)| *p).collect();
            let packages: Vec<&str> = packages.into_iter().collect();
            lines.insert(format!("{name}: {}", packages.join(" ")));
        }
    }
    lines
}

/// The published libraries' root names, and the verdict against [`ALLOWED`].
pub(crate) fn check(workspace: &Workspace) -> Result<(BTreeSet<String>, Verdict), String> {
    let mut crates = Vec::new();
    for package in workspace.packages.iter().filter(|p| p.published) {
        for target in package.targets.iter().filter(|t| t.kind == Kind::Lib) {
            let krate = Crate::read(&package.dir.join(&target.source), &read_file);
            crates.push((package.name.clone(), root_names(&target.name, &krate)));
        }
    }
    let found = repeats(&crates);
    let allowed = allow_list(ALLOWED).map_err(|e| format!("{ALLOWED_PATH}: {e}"))?;
    let verdict = Verdict::of(&found, &allowed);
    Ok((found, verdict))
}

/// `cargo xtask names`: prints every repeat; exit code 1 on a new one or on a listed one that
/// is gone.
pub(crate) fn main() -> i32 {
    let checked = Workspace::load().and_then(|w| check(&w));
    let (found, verdict) = match checked {
        Ok(out) => out,
        Err(e) => {
            eprintln!("xtask names: {e}");
            return 1;
        }
    };
    for line in &found {
        let mark = if verdict.new.contains(line) {
            "NEW"
        } else {
            "allowed"
        };
        println!("{mark}: {line}");
    }
    println!(
        "\n{} public names repeat across crates: {} allowed by {ALLOWED_PATH}, {} new; {} listed there and gone",
        found.len(),
        verdict.allowed.len(),
        verdict.new.len(),
        verdict.gone.len()
    );
    report(&verdict, "public name repeated across crates", ALLOWED_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rust::tests::crate_of;

    #[test]
    fn root_names_are_items_and_re_exports_with_their_origin() {
        let krate = crate_of(&[
            (
                "lib.rs",
                "mod inner;\npub mod open;\npub use inner::{Summary, helper as assist};\n\
                 pub use workq::Lease;\npub use open::*;\npub struct Error;\npub(crate) struct Hidden;\n\
                 pub use inner as renamed;\n",
            ),
            ("inner.rs", "pub struct Summary;\npub fn helper() {}\n"),
            ("open.rs", "pub enum ItemState {}\nstruct Private;\n"),
        ]);
        let names = root_names("redis", &krate);
        let shown: Vec<String> = names.iter().map(|(n, o)| format!("{n}={o}")).collect();
        assert_eq!(
            shown,
            [
                "Error=redis::Error",
                "ItemState=redis::ItemState",
                "Lease=workq::Lease",
                "Summary=redis::Summary",
                "assist=redis::helper",
            ]
        );
    }

    #[test]
    fn a_name_repeats_only_when_it_names_two_things() {
        let names = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(n, o)| ((*n).to_owned(), (*o).to_owned()))
                .collect()
        };
        let crates = vec![
            (
                "workq".to_owned(),
                names(&[("Summary", "workq::Summary"), ("AddKind", "workq::AddKind")]),
            ),
            (
                "workq-redis".to_owned(),
                names(&[
                    ("Summary", "workq_redis::Summary"),
                    ("AddKind", "workq::AddKind"),
                    ("Error", "workq_redis::Error"),
                ]),
            ),
            (
                "workq-postgres".to_owned(),
                names(&[("Error", "workq_postgres::Error")]),
            ),
        ];
        let found: Vec<String> = repeats(&crates).into_iter().collect();
        assert_eq!(
            found,
            [
                "Error: workq-postgres workq-redis",
                "Summary: workq workq-redis"
            ]
        );
    }

    /// The published crates against `xtask/allowed-name-repeats.txt`.
    #[test]
    fn public_names_repeat_only_per_backend() {
        let workspace = Workspace::load().expect("cargo metadata");
        let (_, verdict) = check(&workspace).expect("the allow-list reads");
        assert!(
            verdict.new.is_empty(),
            "public names that two crates export for different things (rename one, or list \
             the name in {ALLOWED_PATH} if it is the same concept on each backend):\n{}",
            verdict.new.join("\n")
        );
        assert!(
            verdict.gone.is_empty(),
            "repeats listed in {ALLOWED_PATH} that are gone (remove their lines):\n{}",
            verdict.gone.join("\n")
        );
    }
}
