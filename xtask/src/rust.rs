//! A reader of Rust source as far as the layout checks (`cycles.rs`, `names.rs`) need it: the
//! modules of a crate and the files they live in, the items each module defines, its `use`
//! declarations, and the paths its code names, with comments and literals left out.
//!
//! Hand-written rather than `syn`: xtask has no dependencies (see `Cargo.toml`), and the
//! checks need only the token level, not a syntax tree. What it does not model (macros
//! expanding to items, `cfg` combinations) only makes it see a path as the file of the module
//! it names, which is where such items live anyway.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A token, with comments and whitespace dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    /// An identifier or keyword (`r#type` reads as `type`).
    Ident(String),
    /// `::`.
    Sep,
    /// Any other punctuation character.
    Punct(char),
    /// A string literal's text (escapes kept as written).
    Str(String),
    /// A number, a character, a byte or a lifetime: nothing the checks look into.
    Other,
}

/// A token and the line it starts on (from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) line: usize,
}

/// Splits `src` into tokens; comments (doc comments included) and the contents of character
/// literals are dropped.
pub(crate) fn lex(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        let start = line;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            let (text, next) = string(&chars, i + 1, &mut line);
            tokens.push(Token {
                tok: Tok::Str(text),
                line: start,
            });
            i = next;
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped character (`'\''`, `'\u{7f}'`): up to the closing quote.
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or a label.
                i += 1;
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
            }
            tokens.push(Token {
                tok: Tok::Other,
                line: start,
            });
        } else if c.is_ascii_digit() {
            while i < chars.len()
                && (is_ident_char(chars[i]) || (chars[i] == '.' && at(i + 1).is_ascii_digit()))
            {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Other,
                line: start,
            });
        } else if is_ident_start(c) {
            if let Some((text, next)) = prefixed_literal(&chars, i, &mut line) {
                tokens.push(Token {
                    tok: text.map_or(Tok::Other, Tok::Str),
                    line: start,
                });
                i = next;
                continue;
            }
            if c == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
                i += 2;
            }
            let begin = i;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Ident(chars[begin..i].iter().collect()),
                line: start,
            });
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token {
                tok: Tok::Sep,
                line: start,
            });
            i += 2;
        } else {
            tokens.push(Token {
                tok: Tok::Punct(c),
                line: start,
            });
            i += 1;
        }
    }
    tokens
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A plain string's text from just after its opening quote; returns the text and the index
/// after the closing quote.
fn string(chars: &[char], mut i: usize, line: &mut usize) -> (String, usize) {
    let mut text = String::new();
    while i < chars.len() && chars[i] != '"' {
        if chars[i] == '\\' && i + 1 < chars.len() {
            text.push(chars[i]);
            i += 1;
        }
        if chars[i] == '\n' {
            *line += 1;
        }
        text.push(chars[i]);
        i += 1;
    }
    (text, i + 1)
}

/// A literal that starts with letters: `b"..."`, `c"..."`, `r"..."`, `r#"..."#`, `br#"..."#`,
/// `cr"..."`, `b'x'`. `None` when `chars[i..]` is an identifier. The text is `None` for a
/// byte.
fn prefixed_literal(chars: &[char], i: usize, line: &mut usize) -> Option<(Option<String>, usize)> {
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut j = i;
    if matches!(at(j), 'b' | 'c') {
        j += 1;
    }
    if at(i) == 'b' && at(j) == '\'' {
        // A byte: b'x' or b'\n'.
        let mut k = j + 1;
        if at(k) == '\\' {
            k += 1;
        }
        k += 1;
        while k < chars.len() && chars[k] != '\'' {
            k += 1;
        }
        return Some((None, k + 1));
    }
    if at(j) == '"' && j > i {
        let (text, next) = string(chars, j + 1, line);
        return Some((Some(text), next));
    }
    if at(j) != 'r' {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while at(j) == '#' {
        hashes += 1;
        j += 1;
    }
    if at(j) != '"' {
        return None;
    }
    j += 1;
    let mut text = String::new();
    while j < chars.len() {
        if chars[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#') {
            return Some((Some(text), j + 1 + hashes));
        }
        if chars[j] == '\n' {
            *line += 1;
        }
        text.push(chars[j]);
        j += 1;
    }
    Some((Some(text), j))
}

/// Who may name an item or a `use`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vis {
    Private,
    /// `pub(crate)`, `pub(super)`, `pub(in path)`.
    Restricted,
    Pub,
}

/// What a `use` brings in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Imported {
    /// A name (the alias when renamed): `use a::b::C;`, `use a::b::{self}` (the module `b`).
    Name(String),
    /// `use a::b::*;`.
    Glob,
    /// `use a::Trait as _;`.
    Nothing,
}

/// One leaf of a `use` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Use {
    /// The path, from the tree's root to the leaf (for a glob, to the module it opens).
    pub(crate) path: Vec<String>,
    pub(crate) imported: Imported,
    pub(crate) vis: Vis,
    /// The module it is in.
    pub(crate) module: usize,
    pub(crate) file: usize,
    pub(crate) line: usize,
    /// Declared in a module's body, not inside a function or block: it names something for
    /// the whole module.
    pub(crate) module_level: bool,
}

/// A path in code (outside `use`): `crate::a::b`, `super::x`, `child::f`, `Alias::new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CodePath {
    pub(crate) path: Vec<String>,
    pub(crate) module: usize,
    pub(crate) file: usize,
    pub(crate) line: usize,
}

/// An item a module defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub(crate) vis: Vis,
    pub(crate) kind: String,
    pub(crate) line: usize,
}

/// A module: a file's, or an inline `mod name { ... }` in one.
#[derive(Debug, Clone)]
pub(crate) struct Module {
    pub(crate) parent: Option<usize>,
    /// The file its body is in.
    pub(crate) file: usize,
    /// Where the files of its `mod name;` children are.
    dir: PathBuf,
    pub(crate) children: BTreeMap<String, usize>,
    pub(crate) items: BTreeMap<String, Item>,
}

/// One crate's modules, read from its root file.
#[derive(Debug, Clone, Default)]
pub(crate) struct Crate {
    pub(crate) files: Vec<PathBuf>,
    pub(crate) modules: Vec<Module>,
    pub(crate) uses: Vec<Use>,
    pub(crate) paths: Vec<CodePath>,
    /// Files that declare file modules (`lib.rs`, `main.rs`, `mod.rs` and the like): their
    /// `pub use`s are re-exports.
    pub(crate) hubs: Vec<bool>,
    /// `mod x;` declarations whose file is not there.
    pub(crate) missing: Vec<String>,
}

/// Where a path leads inside the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) module: usize,
    /// `None`: the module itself.
    pub(crate) item: Option<String>,
}

/// The keywords that start an item with a name.
const ITEM_KEYWORDS: &[&str] = &[
    "struct",
    "enum",
    "union",
    "trait",
    "type",
    "fn",
    "const",
    "static",
    "macro_rules",
];

impl Crate {
    /// Reads the crate whose root module is `root` (`src/lib.rs`, `src/main.rs`), following
    /// its `mod` declarations. `read` gives a file's text (`None`: no such file).
    pub(crate) fn read(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Crate {
        let mut krate = Crate::default();
        let Some(text) = read(root) else {
            krate.missing.push(root.display().to_string());
            return krate;
        };
        let dir = root.parent().map(Path::to_path_buf).unwrap_or_default();
        krate.modules.push(Module {
            parent: None,
            file: 0,
            dir,
            children: BTreeMap::new(),
            items: BTreeMap::new(),
        });
        let mut queue = vec![(root.to_path_buf(), text, 0)];
        while let Some((path, text, module)) = queue.pop() {
            let file = krate.files.len();
            krate.files.push(path.clone());
            krate.hubs.push(matches!(
                path.file_name().and_then(|n| n.to_str()),
                Some("lib.rs" | "main.rs" | "mod.rs")
            ));
            krate.modules[module].file = file;
            let declared = krate.parse(&lex(&text), module, file, &path);
            for (child, candidates) in declared {
                krate.hubs[file] = true;
                if let Some(again) = candidates
                    .iter()
                    .find(|p| krate.files.contains(p) || queue.iter().any(|q| &q.0 == *p))
                {
                    // A module whose file is already read (rustc refuses it): not read again,
                    // or this would never end.
                    krate
                        .missing
                        .push(format!("{} (read twice)", again.display()));
                    continue;
                }
                match candidates
                    .iter()
                    .find_map(|p| read(p).map(|text| (p.clone(), text)))
                {
                    Some((child_path, text)) => {
                        krate.modules[child].dir = module_dir(&child_path);
                        queue.push((child_path, text, child));
                    }
                    None => krate.missing.push(candidates[0].display().to_string()),
                }
            }
        }
        krate
    }

    /// Reads `file`'s tokens into `module` and the modules inside it; returns the file
    /// modules it declares (`mod name;`), each with the files it may be in.
    fn parse(
        &mut self,
        tokens: &[Token],
        module: usize,
        file: usize,
        path: &Path,
    ) -> Vec<(usize, Vec<PathBuf>)> {
        // (module, brace depth of its body); blocks are (None, depth).
        let mut scopes: Vec<(Option<usize>, usize)> = vec![(Some(module), 0)];
        let mut depth = 0;
        let mut vis = Vis::Private;
        let mut path_attr: Option<String> = None;
        let mut inline: Option<usize> = None;
        let mut declared = Vec::new();
        let file_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let ident = |i: usize| match tokens.get(i).map(|t| &t.tok) {
            Some(Tok::Ident(s)) => Some(s.as_str()),
            _ => None,
        };
        let punct = |i: usize, c: char| tokens.get(i).is_some_and(|t| t.tok == Tok::Punct(c));
        let sep = |i: usize| tokens.get(i).is_some_and(|t| t.tok == Tok::Sep);
        let mut i = 0;
        while i < tokens.len() {
            let (scope_module, scope_depth) = *scopes.last().expect("the file's module");
            let current = scopes.iter().rev().find_map(|s| s.0).expect("a module");
            let module_level = scope_module.is_some() && scope_depth == depth;
            let line = tokens[i].line;
            match &tokens[i].tok {
                Tok::Punct('#') => {
                    // An attribute: skipped, but `#[path = "..."]` is kept for the next `mod`.
                    let mut j = i + 1;
                    if punct(j, '!') {
                        j += 1;
                    }
                    if punct(j, '[') {
                        if ident(j + 1) == Some("path")
                            && punct(j + 2, '=')
                            && let Some(Tok::Str(p)) = tokens.get(j + 3).map(|t| &t.tok)
                        {
                            path_attr = Some(p.clone());
                        }
                        i = closing(tokens, j, '[', ']') + 1;
                        continue;
                    }
                }
                Tok::Punct('{') => {
                    depth += 1;
                    scopes.push((inline.take(), depth));
                    vis = Vis::Private;
                }
                Tok::Punct('}') => {
                    if scopes.len() > 1 && scopes.last().is_some_and(|s| s.1 == depth) {
                        scopes.pop();
                    }
                    depth = depth.saturating_sub(1);
                    vis = Vis::Private;
                }
                Tok::Punct(';') => {
                    vis = Vis::Private;
                    path_attr = None;
                }
                Tok::Ident(word) if word == "pub" && module_level => {
                    if punct(i + 1, '(') {
                        vis = Vis::Restricted;
                        i = closing(tokens, i + 1, '(', ')') + 1;
                        continue;
                    }
                    vis = Vis::Pub;
                }
                // `use<'a>` in `impl Trait + use<'a>` is a bound, not a declaration.
                Tok::Ident(word) if word == "use" && !punct(i + 1, '<') => {
                    let end = (i..tokens.len())
                        .find(|&j| punct(j, ';'))
                        .unwrap_or(tokens.len());
                    let mut leaves = Vec::new();
                    use_tree(&tokens[i + 1..end], &mut Vec::new(), &mut leaves);
                    for (path, imported) in leaves {
                        self.uses.push(Use {
                            path,
                            imported,
                            vis: if module_level { vis } else { Vis::Private },
                            module: current,
                            file,
                            line,
                            module_level,
                        });
                    }
                    vis = Vis::Private;
                    path_attr = None;
                    i = end + 1;
                    continue;
                }
                Tok::Ident(word) if word == "mod" && module_level => {
                    if let Some(name) = ident(i + 1) {
                        let child = self.add_module(current, name, file);
                        self.modules[current]
                            .items
                            .entry(name.to_owned())
                            .or_insert(Item {
                                vis,
                                kind: "mod".to_owned(),
                                line,
                            });
                        if punct(i + 2, ';') {
                            let candidates = match path_attr.take() {
                                Some(p) => vec![file_dir.join(p)],
                                None => {
                                    let dir = &self.modules[current].dir;
                                    vec![
                                        dir.join(format!("{name}.rs")),
                                        dir.join(name).join("mod.rs"),
                                    ]
                                }
                            };
                            declared.push((child, candidates));
                        } else {
                            inline = Some(child);
                        }
                        vis = Vis::Private;
                        i += 2;
                        continue;
                    }
                }
                Tok::Ident(word) if module_level && ITEM_KEYWORDS.contains(&word.as_str()) => {
                    let mut j = i + 1;
                    if word == "macro_rules" && punct(j, '!') {
                        j += 1;
                    }
                    if word == "static" && ident(j) == Some("mut") {
                        j += 1;
                    }
                    let union_ok = word != "union" || punct(j + 1, '{') || punct(j + 1, '<');
                    if let Some(name) = ident(j)
                        && name != "_"
                        && name != "fn"
                        && union_ok
                    {
                        self.modules[current]
                            .items
                            .entry(name.to_owned())
                            .or_insert(Item {
                                vis,
                                kind: word.clone(),
                                line,
                            });
                        vis = Vis::Private;
                        path_attr = None;
                    }
                }
                Tok::Ident(first) if sep(i + 1) => {
                    let after_sep = i > 0 && sep(i - 1);
                    let macro_var = i > 0 && punct(i - 1, '$');
                    // `pub(in crate::a)` is a visibility, not a use.
                    let visibility = i > 1 && ident(i - 1) == Some("in") && punct(i - 2, '(');
                    if !after_sep && !macro_var && !visibility {
                        let mut segments = vec![first.clone()];
                        let mut j = i + 1;
                        while sep(j) {
                            match ident(j + 1) {
                                Some(s) => segments.push(s.to_owned()),
                                None => break,
                            }
                            j += 2;
                        }
                        if segments.len() > 1 {
                            self.paths.push(CodePath {
                                path: segments,
                                module: current,
                                file,
                                line,
                            });
                        }
                        i = j;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        declared
    }

    fn add_module(&mut self, parent: usize, name: &str, file: usize) -> usize {
        if let Some(&existing) = self.modules[parent].children.get(name) {
            return existing;
        }
        let id = self.modules.len();
        let dir = self.modules[parent].dir.join(name);
        self.modules.push(Module {
            parent: Some(parent),
            file,
            dir,
            children: BTreeMap::new(),
            items: BTreeMap::new(),
        });
        self.modules[parent].children.insert(name.to_owned(), id);
        id
    }

    /// Whether `path`, named in module `from`, goes through `crate::` or `super::`: itself,
    /// or through the `use` that brought its first name in (`use crate::queue;` then
    /// `queue::Shared`). Paths to the module's own children (`child::f`, `self::child`) do
    /// not.
    pub(crate) fn across(&self, from: usize, path: &[String]) -> bool {
        self.across_in(from, path, 0)
    }

    fn across_in(&self, from: usize, path: &[String], depth: usize) -> bool {
        match path.first().map(String::as_str) {
            Some("crate" | "super") => true,
            Some("self") | None => false,
            Some(first) => {
                depth < 8
                    && self.uses.iter().any(|u| {
                        u.module == from
                            && u.module_level
                            && u.imported == Imported::Name(first.to_owned())
                            && self.across_in(u.module, &u.path, depth + 1)
                    })
            }
        }
    }

    /// Where `path`, named in module `from`, leads: `None` when it leaves the crate (another
    /// crate, the prelude, a local name). A name the reader cannot find in a module it can
    /// (made by a macro, say) leads to that module.
    pub(crate) fn resolve(&self, from: usize, path: &[String]) -> Option<Target> {
        self.resolve_in(from, path, false, 0)
    }

    /// The module a glob `use` opens.
    pub(crate) fn resolve_module(&self, from: usize, path: &[String]) -> Option<usize> {
        match self.resolve(from, path)? {
            Target { module, item: None } => Some(module),
            Target {
                module,
                item: Some(name),
            } => self.modules[module].children.get(&name).copied(),
        }
    }

    /// `strict`: a name not found is `None` (for lookups through globs).
    fn resolve_in(
        &self,
        from: usize,
        path: &[String],
        strict: bool,
        depth: usize,
    ) -> Option<Target> {
        if depth > 24 || path.is_empty() {
            return None;
        }
        let (mut current, rest, relative) = match path[0].as_str() {
            "crate" => (0, &path[1..], false),
            "super" => (self.modules[from].parent?, &path[1..], false),
            "self" => (from, &path[1..], false),
            _ => (from, path, true),
        };
        for (index, segment) in rest.iter().enumerate() {
            let module = &self.modules[current];
            if segment == "super" {
                current = module.parent?;
                continue;
            }
            if segment == "self" {
                continue;
            }
            if let Some(&child) = module.children.get(segment) {
                current = child;
                continue;
            }
            let remaining = &rest[index + 1..];
            if module.items.contains_key(segment) {
                return Some(Target {
                    module: current,
                    item: Some(segment.clone()),
                });
            }
            let named = self.uses.iter().find(|u| {
                u.module == current
                    && u.module_level
                    && u.imported == Imported::Name(segment.clone())
            });
            if let Some(import) = named {
                let target = self.resolve_in(import.module, &import.path, strict, depth + 1)?;
                return match (&target.item, remaining.is_empty()) {
                    (None, false) => {
                        let mut more = vec!["self".to_owned()];
                        more.extend(remaining.iter().cloned());
                        self.resolve_in(target.module, &more, strict, depth + 1)
                    }
                    _ => Some(target),
                };
            }
            let globs = self
                .uses
                .iter()
                .filter(|u| u.module == current && u.module_level && u.imported == Imported::Glob);
            for glob in globs {
                let Some(opened) = self
                    .resolve_in(glob.module, &glob.path, true, depth + 1)
                    .and_then(|t| match t.item {
                        None => Some(t.module),
                        Some(name) => self.modules[t.module].children.get(&name).copied(),
                    })
                else {
                    continue;
                };
                let mut more = vec!["self".to_owned()];
                more.extend(rest[index..].iter().cloned());
                if let Some(found) = self.resolve_in(opened, &more, true, depth + 1) {
                    return Some(found);
                }
            }
            if strict || (relative && index == 0) {
                return None;
            }
            return Some(Target {
                module: current,
                item: Some(segment.clone()),
            });
        }
        Some(Target {
            module: current,
            item: None,
        })
    }
}

/// The directory where the files of a file module's `mod name;` children are: beside a
/// `mod.rs`, `lib.rs` or `main.rs`; in `name/` beside any other `name.rs`.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
    match file.file_name().and_then(|n| n.to_str()) {
        Some("mod.rs" | "lib.rs" | "main.rs") | None => parent,
        Some(name) => parent.join(name.strip_suffix(".rs").unwrap_or(name)),
    }
}

/// The index of the token that closes the bracket opened at `open`.
fn closing(tokens: &[Token], open: usize, left: char, right: char) -> usize {
    let mut depth = 0;
    for (j, token) in tokens.iter().enumerate().skip(open) {
        if token.tok == Tok::Punct(left) {
            depth += 1;
        } else if token.tok == Tok::Punct(right) {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    tokens.len()
}

/// The leaves of a `use` tree (the tokens between `use` and `;`).
fn use_tree(tokens: &[Token], prefix: &mut Vec<String>, leaves: &mut Vec<(Vec<String>, Imported)>) {
    let mut i = 0;
    let depth_at_start = prefix.len();
    if tokens.first().is_some_and(|t| t.tok == Tok::Sep) {
        i += 1;
    }
    while i < tokens.len() {
        match &tokens[i].tok {
            Tok::Ident(segment) => {
                if tokens.get(i + 1).is_some_and(|t| t.tok == Tok::Sep) {
                    prefix.push(segment.clone());
                    i += 2;
                    continue;
                }
                let mut path = prefix.clone();
                let mut name = segment.clone();
                if segment == "self" {
                    name = prefix.last().cloned().unwrap_or_default();
                } else {
                    path.push(segment.clone());
                }
                let imported = match (&tokens.get(i + 1), &tokens.get(i + 2)) {
                    (
                        Some(Token {
                            tok: Tok::Ident(k), ..
                        }),
                        Some(Token {
                            tok: Tok::Ident(alias),
                            ..
                        }),
                    ) if k == "as" => {
                        if alias == "_" {
                            Imported::Nothing
                        } else {
                            Imported::Name(alias.clone())
                        }
                    }
                    _ => Imported::Name(name),
                };
                leaves.push((path, imported));
                break;
            }
            Tok::Punct('*') => {
                leaves.push((prefix.clone(), Imported::Glob));
                break;
            }
            Tok::Punct('{') => {
                let end = closing(tokens, i, '{', '}');
                let inner = &tokens[i + 1..end.min(tokens.len())];
                // Split at the commas of this level.
                let mut start = 0;
                let mut level = 0;
                for (j, token) in inner.iter().enumerate() {
                    match token.tok {
                        Tok::Punct('{') => level += 1,
                        Tok::Punct('}') => level -= 1,
                        Tok::Punct(',') if level == 0 => {
                            use_tree(&inner[start..j], &mut prefix.clone(), leaves);
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                if start < inner.len() {
                    use_tree(&inner[start..], &mut prefix.clone(), leaves);
                }
                break;
            }
            _ => break,
        }
    }
    prefix.truncate(depth_at_start);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A crate of in-memory files: (path under `src/`, text).
    pub(crate) fn crate_of(files: &[(&str, &str)]) -> Crate {
        let files: Vec<(PathBuf, String)> = files
            .iter()
            .map(|(p, t)| (Path::new("/c/src").join(p), (*t).to_owned()))
            .collect();
        let read = move |path: &Path| {
            files
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, t)| t.clone())
        };
        Crate::read(Path::new("/c/src/lib.rs"), &read)
    }

    fn idents(src: &str) -> Vec<String> {
        lex(src)
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_and_characters_are_not_code() {
        let src = "a // crate::x\n/* b /* nested */ crate::y */ c \"crate::z\" r#\"q\"\"# \
                   '\\'' 'x' d<'life> b'\\n' br\"e\" r#type";
        assert_eq!(idents(src), ["a", "c", "d", "type"]);
        let strings: Vec<String> = lex(src)
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Str(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(strings, ["crate::z", "q\"", "e"]);
        let lines: Vec<usize> = lex("a\n/* \n */ b\n\"x\ny\" c")
            .iter()
            .map(|t| t.line)
            .collect();
        assert_eq!(lines, [1, 3, 4, 5]);
    }

    #[test]
    fn use_trees_are_read_to_their_leaves() {
        let mut leaves = Vec::new();
        let tokens = lex("crate::a::{self, b::{C, D as E}, f::*, G as _}");
        use_tree(&tokens, &mut Vec::new(), &mut leaves);
        let shown: Vec<String> = leaves
            .iter()
            .map(|(p, i)| format!("{} {i:?}", p.join("::")))
            .collect();
        assert_eq!(
            shown,
            [
                "crate::a Name(\"a\")",
                "crate::a::b::C Name(\"C\")",
                "crate::a::b::D Name(\"E\")",
                "crate::a::f Glob",
                "crate::a::G Nothing",
            ]
        );
    }

    #[test]
    fn modules_items_and_re_exports_are_found_where_they_live() {
        let krate = crate_of(&[
            (
                "lib.rs",
                "mod queue;\n#[path = \"odd_name.rs\"]\nmod odd;\npub use queue::Shared;\n\
                 pub(crate) mod inline { pub struct Inside; }\n",
            ),
            ("queue/mod.rs", "mod locked;\npub use locked::Shared;\n"),
            (
                "queue/locked.rs",
                "pub struct Shared;\nimpl Shared { fn f() {} const C: u8 = 1; }\n",
            ),
            (
                "odd_name.rs",
                "use crate::Shared;\nfn g() { super::inline::Inside; }\n",
            ),
        ]);
        assert!(krate.missing.is_empty(), "{:?}", krate.missing);
        let file = |t: Option<Target>| {
            t.map(|t| {
                let path = &krate.files[krate.modules[t.module].file];
                format!(
                    "{} {}",
                    path.strip_prefix("/c/src").unwrap().display(),
                    t.item.unwrap_or_default()
                )
            })
        };
        let s = |p: &str| p.split("::").map(str::to_owned).collect::<Vec<_>>();
        // Through two re-exports to the defining file.
        assert_eq!(
            file(krate.resolve(0, &s("crate::Shared"))),
            Some("queue/locked.rs Shared".into())
        );
        let odd = krate.modules[0].children["odd"];
        assert_eq!(
            file(krate.resolve(odd, &s("super::inline::Inside"))),
            Some("lib.rs Inside".into())
        );
        // Another crate's path, and a method of an item.
        assert_eq!(krate.resolve(odd, &s("std::sync::Arc")), None);
        let locked = krate.modules[krate.modules[0].children["queue"]].children["locked"];
        assert_eq!(
            file(krate.resolve(locked, &s("Shared::f"))),
            Some("queue/locked.rs Shared".into())
        );
        // `f` and `C` are not module items; `Shared` is.
        let items: Vec<&String> = krate.modules[locked].items.keys().collect();
        assert_eq!(items, ["Shared"]);
        assert_eq!(krate.paths.len(), 1, "{:?}", krate.paths);
    }

    #[test]
    fn a_module_file_read_twice_is_reported_not_followed() {
        let krate = crate_of(&[
            ("lib.rs", "mod a;\n#[path = \"lib.rs\"]\nmod again;\n"),
            ("a.rs", "#[path = \"a.rs\"]\nmod me;\n"),
        ]);
        assert_eq!(krate.files.len(), 2);
        assert_eq!(
            krate.missing,
            ["/c/src/lib.rs (read twice)", "/c/src/a.rs (read twice)"]
        );
    }
}
