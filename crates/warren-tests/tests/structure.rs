//! The shape of the source tree: no source file (Rust, or Python of the SDK) over 1,000
//! lines, and no circular imports between the modules of a crate (the parts of a crate form
//! layers, each using only the ones below it). Needs no privileges.
//!
//! Modules are the files of a crate's `src/` (`a/b.rs` and `a/b/mod.rs` are `a::b`). A
//! `use` or path through `crate::`, `super::` or `self::` from module `m` to module `t` is
//! an edge between the two siblings where their paths part (so `a::x → b::y` counts as
//! `a → b`; a module using its own parent or child is no edge). Test-only modules
//! (`#[cfg(test)] mod …;`) and `#[cfg(test)]` blocks are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 1_000;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    files_ending(dir, "rs", out)
}

fn files_ending(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            files_ending(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let mut files = Vec::new();
    for dir in ["crates", "tests", "fuzz/fuzz_targets"] {
        rust_files(&repo().join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} Rust files", files.len());
    files_ending(&repo().join("sdk"), "py", &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:#?}");
}

type Module = Vec<String>;

/// A file's module path inside its crate.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

/// The code of a file without comments, string contents and `#[cfg(test)]` blocks.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                '\n' => out.push('\n'),
                _ => {}
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                in_str = true;
                out.push('"');
            }
            // A char literal such as '"' or '{' must not open a string or a block.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\\") || rest.chars().nth(1) == Some('\'') {
                    for c in chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                    }
                    out.push_str("' '");
                } else {
                    out.push(c);
                }
            }
            _ => out.push(c),
        }
    }
    strip_test_blocks(&out)
}

/// Cuts every `#[cfg(test)]` item that has a `{ ... }` body.
fn strip_test_blocks(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(at) = out.find("#[cfg(test)]") {
        let after = &out[at..];
        let (Some(brace), semi) = (after.find('{'), after.find(';')) else {
            out.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        };
        if semi.is_some_and(|s| s < brace) {
            // `#[cfg(test)] mod x;` — handled as a test-only module.
            out.replace_range(at..at + "#[cfg(test)]".len(), "");
            continue;
        }
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after[brace..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = brace + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(at..at + end, "");
    }
    out
}

/// `#[cfg(test)] mod name;` declarations of a file.
fn test_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for w in lines.windows(2) {
        if w[0] == "#[cfg(test)]" {
            let decl = w[1]
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

/// Expands `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.to_string()];
    };
    let mut depth = 0;
    let mut close = path.len();
    for (i, c) in path[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = open + i;
                    break;
                }
            }
            _ => {}
        }
    }
    let (pre, inner) = (&path[..open], &path[open + 1..close.min(path.len())]);
    let post = path.get(close + 1..).unwrap_or("");
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in inner.chars() {
        match c {
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            '{' => {
                depth += 1;
                cur.push(c)
            }
            '}' => {
                depth -= 1;
                cur.push(c)
            }
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{pre}{p}{post}")))
        .collect()
}

/// Every `crate::`/`super::`/`self::` path a file's code names.
fn paths_of(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` statements, with their groups expanded.
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let word_start = i == 0 || !rest[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        rest = &rest[i + 4..];
        if !word_start {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let body: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
        out.extend(expand(&body));
    }
    // Paths written inline.
    let bytes: Vec<char> = code.chars().collect();
    let text: String = bytes.iter().collect();
    for start_word in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(start_word) {
            let at = from + i;
            from = at + start_word.len();
            if at > 0 {
                let prev = text[..at].chars().last().unwrap_or(' ');
                if prev.is_alphanumeric() || prev == '_' || prev == ':' {
                    continue;
                }
            }
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(path);
        }
    }
    out
}

/// The module `path` (as written in module `from`) points into, if it is one of `known`.
fn target(from: &Module, path: &str, known: &BTreeSet<Module>) -> Option<Module> {
    let path = path.split(" as ").next().unwrap_or(path);
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut base, mut rest): (Module, &[&str]) = match segs.first() {
        Some(&"crate") => (Vec::new(), &segs[1..]),
        Some(&"super") | Some(&"self") => (from.clone(), &segs[..]),
        _ => return None,
    };
    while let Some(first) = rest.first() {
        match *first {
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    let mut full = base;
    full.extend(rest.iter().map(|s| s.to_string()));
    (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| known.contains(m))
}

/// Sibling edges `a → b` of one crate.
fn edges_of(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let texts: Vec<(Module, String)> = files
        .iter()
        .map(|f| (module_of(src, f), std::fs::read_to_string(f).unwrap()))
        .collect();
    let known: BTreeSet<Module> = texts.iter().map(|(m, _)| m.clone()).collect();
    let mut test_only: BTreeSet<Module> = BTreeSet::new();
    for (m, text) in &texts {
        for t in test_modules(text) {
            let mut child = m.clone();
            child.push(t);
            test_only.insert(child);
        }
    }
    let is_test = |m: &Module| (1..=m.len()).any(|n| test_only.contains(&m[..n]));
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, text) in &texts {
        if is_test(m) {
            continue;
        }
        for p in paths_of(&code_of(text)) {
            let Some(t) = target(m, &p, &known) else {
                continue;
            };
            if is_test(&t) {
                continue;
            }
            let common = m.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common == m.len() || common == t.len() {
                continue;
            }
            edges
                .entry(m[..=common].to_vec())
                .or_default()
                .insert(t[..=common].to_vec());
        }
    }
    edges
}

/// One cycle of `edges`, if there is any.
fn find_cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        n: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        stack: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.clone());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.clone());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

fn show(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn no_crate_has_circular_imports_between_its_modules() {
    let mut cycles = Vec::new();
    let mut crates = 0;
    for e in std::fs::read_dir(repo().join("crates")).unwrap().flatten() {
        let src = e.path().join("src");
        if !src.is_dir() {
            continue;
        }
        crates += 1;
        if let Some(c) = find_cycle(&edges_of(&src)) {
            let names: Vec<String> = c.iter().map(show).collect();
            cycles.push(format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                names.join(" → ")
            ));
        }
    }
    assert!(crates > 5, "found only {crates} crates");
    assert!(cycles.is_empty(), "circular imports: {cycles:#?}");
}

#[test]
fn the_checker_sees_a_cycle_and_its_parts() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n#[cfg(test)]\nmod t;\n").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "//! uses crate::b in a comment only\nmod x;\npub use x::X;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/x.rs"), "use super::super::b::{self, B};\n").unwrap();
    std::fs::write(src.join("b.rs"), "fn f() { let _ = \"crate::a\"; }\n").unwrap();
    std::fs::write(src.join("t.rs"), "use crate::a; use crate::b;\n").unwrap();
    assert_eq!(find_cycle(&edges_of(src)), None);
    std::fs::write(
        src.join("b.rs"),
        "#[cfg(test)]\nmod tests { use crate::a; }\nfn f() { crate::a::X::new(); }\n",
    )
    .unwrap();
    let c = find_cycle(&edges_of(src)).expect("a → b → a");
    assert_eq!(c.len(), 3, "{c:?}");
}

/// The manager keeps the sandbox registry and the lifecycle; every other capability is a part
/// of its own beside it (see `crates/warren-node/src/node.rs`). These bounds hold it there.
const MANAGER_MAX_METHODS: usize = 40;
const MANAGER_MAX_FIELDS: usize = 8;

/// The bodies (`{ ... }`, braces left out) of every item of `code` that starts with `head`.
fn bodies_after<'a>(code: &'a str, head: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(head) {
        let after = &rest[at + head.len()..];
        let Some(open) = after.find('{') else { break };
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push(&after[open + 1..end]);
        rest = &after[end..];
    }
    out
}

/// The lines of `body` at its own level (not inside a nested `{ ... }`).
fn top_level_lines(body: &str) -> Vec<&str> {
    let mut depth = 0usize;
    let mut out = Vec::new();
    for line in body.lines() {
        if depth == 0 {
            out.push(line.trim());
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    out
}

/// (methods of every `impl Manager` in the node crate, fields of the manager's state).
fn manager_size() -> (Vec<String>, Vec<String>) {
    let src = repo().join("crates/warren-node/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut methods = Vec::new();
    for f in &files {
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        for body in bodies_after(&code, "impl Manager ") {
            for line in top_level_lines(body) {
                let Some(at) = line.find("fn ") else { continue };
                let before = &line[..at];
                if before
                    .split_whitespace()
                    .all(|w| w.starts_with("pub") || matches!(w, "async" | "const" | "unsafe"))
                {
                    let name: String = line[at + 3..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let file = f.strip_prefix(&src).unwrap().display();
                    methods.push(format!("{file}: {name}"));
                }
            }
        }
    }
    let code = code_of(&std::fs::read_to_string(src.join("manager/mod.rs")).unwrap());
    let state = bodies_after(&code, "struct Inner ");
    assert_eq!(
        state.len(),
        1,
        "the manager's state `struct Inner` in manager/mod.rs"
    );
    let fields = top_level_lines(state[0])
        .into_iter()
        .filter(|l| !l.is_empty() && !l.starts_with("#[") && l.contains(':'))
        .map(|l| l.split(':').next().unwrap().trim().to_string())
        .collect();
    (methods, fields)
}

#[test]
fn the_manager_keeps_the_registry_and_the_lifecycle_only() {
    let (methods, fields) = manager_size();
    assert!(methods.len() > 5, "found only {methods:?}");
    assert!(
        methods.len() <= MANAGER_MAX_METHODS,
        "Manager has {} methods (at most {MANAGER_MAX_METHODS}): give a capability a part of \
         its own beside it (crates/warren-node/src/node.rs)\n{methods:#?}",
        methods.len()
    );
    assert!(
        fields.len() <= MANAGER_MAX_FIELDS,
        "the manager's state has {} fields (at most {MANAGER_MAX_FIELDS}): {fields:?}",
        fields.len()
    );
}

#[test]
fn the_manager_counter_sees_methods_and_fields() {
    let code = code_of(
        "struct Inner {\n    /// a\n    a: u8,\n    b: Mutex<HashMap<u8, u8>>,\n}\n\
         impl Manager {\n    pub fn x(&self) {\n        let f = |y: u8| { y };\n    }\n\
         \n    pub(crate) async fn y(\n        &self,\n    ) {}\n    fn z() {}\n}\n",
    );
    let body = bodies_after(&code, "impl Manager ");
    assert_eq!(body.len(), 1);
    let fns: Vec<_> = top_level_lines(body[0])
        .into_iter()
        .filter(|l| l.contains("fn "))
        .collect();
    assert_eq!(fns.len(), 3, "{fns:?}");
    let state = bodies_after(&code, "struct Inner ");
    assert_eq!(
        top_level_lines(state[0])
            .into_iter()
            .filter(|l| l.contains(':'))
            .count(),
        2
    );
}
