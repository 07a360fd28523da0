//! The module layering holds: no module imports one that imports it back
//! (siblings or unrelated modules; a parent and its own submodules may refer to
//! each other), and the top-level modules of the library form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every module of src/ by path (`[]` is lib.rs, `["<bin>", ...]` the binary's).
fn modules() -> BTreeMap<Module, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<Module, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(concat!(env!("CARGO_MANIFEST_DIR"), "/src")).unwrap();
                let mut m: Module = rel
                    .with_extension("")
                    .iter()
                    .map(|s| s.to_string_lossy().into())
                    .collect();
                if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                    m.pop();
                }
                if m.first().is_some_and(|f| f == "main" || f == "cli") {
                    m.retain(|s| s != "main");
                    m.insert(0, "<bin>".into());
                }
                out.insert(m, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")), &mut out);
    out
}

/// The modules each module refers to through `crate::`, `super::` or `wllm::` paths.
fn imports(mods: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let resolve = |path: &[String]| {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| mods.contains_key(p))
    };
    let mut edges = BTreeMap::new();
    for (m, src) in mods {
        let bin = m.first().is_some_and(|f| f == "<bin>");
        let mut out = BTreeSet::new();
        let code: Vec<&str> = src.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
        let grouped = expand_groups(&code.join("\n"));
        for line in code.into_iter().chain(grouped.iter().map(String::as_str)) {
            for (i, _) in line.match_indices("::") {
                let start = line[..i]
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(0, |s| s + 1);
                let head = &line[start..i];
                if !["crate", "super", "wllm"].contains(&head) {
                    continue;
                }
                let rest: Vec<String> = line[i + 2..]
                    .split("::")
                    .map(|s| {
                        s.chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect::<String>()
                    })
                    .take_while(|s| !s.is_empty())
                    .collect();
                let mut path: Module = match head {
                    "crate" if bin => vec!["<bin>".into()],
                    "crate" | "wllm" => vec![],
                    _ => m[..m.len().saturating_sub(1)].to_vec(),
                };
                // `super::super::x`: each further `super` goes one level up.
                let ups = rest.iter().take_while(|s| *s == "super").count();
                path.truncate(path.len().saturating_sub(ups));
                path.extend(rest.into_iter().skip(ups));
                if let Some(t) = resolve(&path).filter(|t| t != m) {
                    out.insert(t);
                }
            }
        }
        edges.insert(m.clone(), out);
    }
    edges
}

/// Each path of a grouped import (`use super::{a, b::c, d::{self, e}}`, over
/// any number of lines) as a path of its own: `super::a`, `super::b::c`,
/// `super::d::self`, `super::d::e`.
fn expand_groups(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("::{").map(|i| i + from) {
        from = at + 3;
        let start = code[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |s| s + 1);
        let prefix = &code[start..at];
        // The group's items, split at its top-level commas.
        let (mut depth, mut item, mut items) = (1, String::new(), Vec::new());
        for (i, c) in code[at + 3..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                // Nested groups are expanded with their prefix below, not again here.
                from = at + 3 + i;
                break;
            }
            if c == ',' && depth == 1 {
                items.push(std::mem::take(&mut item));
            } else {
                item.push(c);
            }
        }
        items.push(item);
        for it in items
            .iter()
            .map(|i| i.split_whitespace().collect::<String>())
            .filter(|i| !i.is_empty())
        {
            let path = format!("{prefix}::{it}");
            if path.contains("::{") {
                out.extend(expand_groups(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn grouped_imports_are_read_path_by_path() {
    let got = expand_groups("use super::{a, b::c,\n    d::{self, e}};\nuse crate::x::{Y as Z};");
    assert_eq!(
        got,
        [
            "super::a",
            "super::b::c",
            "super::d::self",
            "super::d::e",
            "crate::x::YasZ"
        ]
    );
}

fn is_ancestor(a: &Module, b: &Module) -> bool {
    a.len() < b.len() && b[..a.len()] == a[..]
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mods = modules();
    assert!(mods.len() > 40, "found only {} modules", mods.len());
    let edges = imports(&mods);
    let mut cycles = Vec::new();
    for (a, bs) in &edges {
        for b in bs {
            if a < b && edges[b].contains(a) && !is_ancestor(a, b) && !is_ancestor(b, a) {
                cycles.push(format!("{} <-> {}", a.join("::"), b.join("::")));
            }
        }
    }
    assert!(cycles.is_empty(), "modules importing each other: {cycles:?}");
}

#[test]
fn top_level_library_modules_form_no_cycle() {
    let edges = imports(&modules());
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in &edges {
        for b in bs {
            if let (Some(x), Some(y)) = (a.first(), b.first())
                && x != y
                && x != "<bin>"
                && y != "<bin>"
            {
                top.entry(x.clone()).or_default().insert(y.clone());
            }
        }
    }
    assert!(top.contains_key("engine") && top["engine"].contains("model"), "{top:?}");
    for start in top.keys() {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![start.clone()]);
        while let Some(x) = stack.pop() {
            for y in top.get(&x).into_iter().flatten() {
                assert!(y != start, "{start} reaches itself: {top:?}");
                if seen.insert(y.clone()) {
                    stack.push(y.clone());
                }
            }
        }
    }
}
