//! The layers of the crate, checked from its source: every `crate::` and `super::` path in
//! `src/` (comments left out) is a dependency of its file's module on another module, and
//! - a module uses only its own layer and those below it, in the order of `LAYERS`;
//! - modules of one layer that are separate top-level modules never use each other (the commands
//!   `inspect` and `compact`, say);
//! - no two modules use each other, directly or around a longer cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first; modules in one string share a layer.
const LAYERS: &[&str] = &[
    "format logging metrics progress",
    "store",
    "error view",
    "write",
    "fs",
    "fuse",
    "inspect compact",
    "mount",
    "demo cli",
    "csi",
];

fn layer_of(module: &str) -> usize {
    let top = module.split('/').next().unwrap();
    LAYERS
        .iter()
        .position(|layer| layer.split(' ').any(|m| m == top))
        .unwrap_or_else(|| panic!("module {module} is in no layer of tests/layers.rs"))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module of the crate as `a/b` (from `src/a/b.rs`), with its source.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            let module = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            if path.is_dir() {
                walk(&path, &module, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src(), "", &mut out);
    out.remove("main");
    out.remove("lib");
    out
}

/// The code of a source file without comments and without its `#[cfg(test)]` module.
fn code(source: &str) -> String {
    let end = source.find("#[cfg(test)]\nmod tests").unwrap_or(source.len());
    source[..end].lines().map(|line| line.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The identifiers of a path like `a::b::{c, d::e}`, each as its list of segments.
fn paths_after(text: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let first = ident(text);
    if first.is_empty() {
        if let Some(group) = text.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            return inner.split(',').map(|p| p.trim().split("::").map(ident).collect()).collect();
        }
        return Vec::new();
    }
    let mut segments = vec![first.clone()];
    let mut rest = &text[first.len()..];
    while let Some(next) = rest.strip_prefix("::") {
        let seg = ident(next);
        if seg.is_empty() {
            break;
        }
        rest = &next[seg.len()..];
        segments.push(seg);
    }
    vec![segments]
}

/// The modules `module` uses.
fn uses(module: &str, source: &str, all: &BTreeMap<String, String>) -> BTreeSet<String> {
    let resolve = |base: Vec<String>, segments: &[String]| {
        let mut path = base;
        // `super::Item` names the parent module itself.
        let mut found = Some(path.join("/")).filter(|m| all.contains_key(m));
        for seg in segments {
            path.push(seg.clone());
            let candidate = path.join("/");
            if all.contains_key(&candidate) {
                found = Some(candidate);
            } else {
                break;
            }
        }
        found
    };
    let code = code(source);
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        for segments in paths_after(&code[at + 7..]) {
            out.extend(resolve(Vec::new(), &segments));
        }
    }
    // `super` is the parent of the file's module: `a/b` -> `a`, and a top-level module -> the crate.
    let parent: Vec<String> =
        module.split('/').map(String::from).collect::<Vec<_>>()[..module.matches('/').count()].to_vec();
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") {
            continue;
        }
        let mut base = parent.clone();
        let mut rest = &code[at + 7..];
        while let Some(more) = rest.strip_prefix("super::") {
            base.pop();
            rest = more;
        }
        for segments in paths_after(rest) {
            out.extend(resolve(base.clone(), &segments));
        }
    }
    out.remove(module);
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let all = modules();
    all.iter().map(|(module, source)| (module.clone(), uses(module, source, &all))).collect()
}

#[test]
fn modules_use_only_their_own_layer_and_those_below() {
    let mut wrong = Vec::new();
    for (module, used) in graph() {
        for other in used {
            let (mine, theirs) = (layer_of(&module), layer_of(&other));
            let top = |m: &str| m.split('/').next().unwrap().to_string();
            if theirs > mine || (theirs == mine && top(&module) != top(&other)) {
                wrong.push(format!("{module} uses {other}"));
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that point the wrong way:\n{}", wrong.join("\n"));
}

#[test]
fn no_module_cycles() {
    let graph = graph();
    // Depth-first search; a module met again on the current path closes a cycle.
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_string());
            return Some(cycle);
        }
        if !done.insert(module.to_string()) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            panic!("a module cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_dependencies() {
    let all = modules();
    let used = uses("view/namespace", &all["view/namespace"], &all);
    assert!(used.contains("view/documents") && used.contains("store"), "{used:?}");
    let used = uses("store/faulty", &all["store/faulty"], &all);
    assert!(used.contains("store"), "{used:?}");
}
