//! The library's top-level modules import one another in one direction only: no cycle. Read
//! from the source as text: a module's edges are the `crate::MODULE` paths in its code and
//! the names it takes from the crate root (`crate::{Volume, ...}`), each traced to the module
//! that `lib.rs` re-exports it from. Comments and doc links do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `path` (or `path` itself).
fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(path).unwrap() {
        out.extend(sources(&e.unwrap().path()));
    }
    out
}

/// The code of a file without its comments (line comments and doc comments).
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers in `text` that follow `prefix` (`crate::` paths and `crate::{...}` lists).
fn crate_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            for item in list[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn top_level_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = code(&src.join("lib.rs"));
    // The modules, and where each root re-export comes from.
    let mut modules = BTreeSet::new();
    let mut from: BTreeMap<String, String> = BTreeMap::new();
    for stmt in lib.split(';') {
        let s = stmt.trim();
        let s = s.rsplit(']').next().unwrap_or(s).trim();
        if let Some(m) = s
            .strip_prefix("pub mod ")
            .or_else(|| s.strip_prefix("mod "))
        {
            modules.insert(m.trim().to_owned());
        } else if let Some(u) = s.strip_prefix("pub use ") {
            let module = u.split("::").next().unwrap().trim().to_owned();
            let names = u.rsplit("::").next().unwrap();
            for n in names.trim_matches(|c| c == '{' || c == '}').split(',') {
                let n = n.trim();
                if !n.is_empty() {
                    from.insert(n.to_owned(), module.clone());
                }
            }
        }
    }
    assert!(modules.len() >= 8, "modules found in lib.rs: {modules:?}");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in &modules {
        let dir = src.join(m);
        let path = if dir.is_dir() {
            dir
        } else {
            src.join(format!("{m}.rs"))
        };
        let mut to = BTreeSet::new();
        for f in sources(&path) {
            for name in crate_names(&code(&f)) {
                let target = if modules.contains(&name) {
                    Some(name)
                } else {
                    from.get(&name).cloned()
                };
                if let Some(t) = target.filter(|t| t != m && modules.contains(t)) {
                    to.insert(t);
                }
            }
        }
        edges.insert(m.clone(), to);
    }
    // A depth-first search for a cycle, naming it if there is one.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for t in &edges[m] {
            if let Some(c) = visit(t, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        if let Some(cycle) = visit(m, &edges, &mut Vec::new(), &mut done) {
            panic!(
                "import cycle between top-level modules: {} (all edges: {edges:?})",
                cycle.join(" -> ")
            );
        }
    }
    // The edges the architecture document draws.
    assert!(edges["volume"].contains("layers"), "{edges:?}");
    assert!(!edges["layers"].contains("volume"), "{edges:?}");
}
