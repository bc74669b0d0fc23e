//! The top-level modules of `src/` import one another without a circle, so each can be read
//! (and tested) on top of the ones below it: the config is plain data that knows no gateway,
//! and the upstream run time reads no config.
//!
//! Read from the source text: every `crate::NAME` outside comments and test-only modules is an
//! edge from the module of the file it is in to module `NAME`. The folders in [`PATH_FOLDERS`]
//! group the steps of one path (`request/`: normalize, identity, admission, forwarding, ...):
//! each of their children is a module of its own here (`wire::normalize`), named by
//! `crate::request::NAME` or, from a sibling, `super::NAME`, so that grouping them in a folder
//! hides no circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Folders whose children count as top-level modules of their own.
const PATH_FOLDERS: &[&str] = &["request", "connection", "wire"];

/// The top-level modules from the ground up: each imports only modules of the layers below
/// its own. A request travels down them: `server` accepts, `connection` caps the connection,
/// `request` runs the pipeline on the `wire` level's pieces, through `gateway`'s config in
/// force, `rules` and the `limiter` decide, `upstream` forwards; the rate-limit service
/// (`rls_server` on `rls`) and the admin port stand beside `request` and `connection`.
const LAYERS: &[&[&str]] = &[
    &["text", "threads"],
    &["metrics"],
    &["limiter", "shutdown"],
    &["wire"],
    &["jwt"],
    &["rules"],
    &["rls", "upstream", "webhooks"],
    &["config"],
    &["describe", "telemetry", "top"],
    &["gateway"],
    &["admin", "connection"],
    &["request", "rls_server"],
    &["logging", "server"],
];

/// Module name -> the modules it names, with a file that names each.
type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

#[test]
fn top_level_modules_have_no_import_circle() {
    let graph = graph(Path::new(SRC));
    assert!(graph.len() > 10, "too few modules read: {graph:?}");
    if let Some(circle) = circle(&graph) {
        let mut lines = Vec::new();
        for pair in circle.windows(2) {
            let file = &graph[&pair[0]][&pair[1]];
            lines.push(format!("  {} -> {} ({})", pair[0], pair[1], file.display()));
        }
        panic!(
            "an import circle between top-level modules:\n{}",
            lines.join("\n")
        );
    }
}

#[test]
fn config_names_no_gateway_and_upstream_names_no_config() {
    let graph = graph(Path::new(SRC));
    for (from, to) in [
        ("config", "gateway"),
        ("upstream", "config"),
        ("upstream", "gateway"),
        ("upstream", "describe"),
    ] {
        let uses = graph.get(from).and_then(|m| m.get(to));
        assert!(uses.is_none(), "{from} uses {to} in {uses:?}");
    }
}

/// Every top-level module imports only modules of lower layers ([`LAYERS`]): the folders
/// read in order, not only without circles. A new module has to be placed in a layer.
#[test]
fn top_level_modules_import_only_lower_layers() {
    let graph = graph(Path::new(SRC));
    let folder = |m: &str| m.split("::").next().unwrap_or(m).to_string();
    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&folder(m).as_str()));
    let mut wrong = Vec::new();
    for (from, tos) in &graph {
        let Some(a) = layer(from) else {
            wrong.push(format!("  {from} is in no layer of LAYERS"));
            continue;
        };
        for (to, file) in tos {
            if folder(to) == folder(from) {
                continue;
            }
            match layer(to) {
                Some(b) if b < a => {}
                _ => wrong.push(format!(
                    "  {from} -> {to} ({}): not a lower layer",
                    file.display()
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// The detector itself: a circle through three modules is found, a chain is not.
#[test]
fn a_circle_is_found_and_a_chain_is_not() {
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), PathBuf::from(format!("{a}.rs")));
    };
    let mut g = Graph::new();
    edge(&mut g, "a", "b");
    edge(&mut g, "b", "c");
    assert_eq!(circle(&g), None);
    edge(&mut g, "c", "a");
    let found = circle(&g).expect("a circle");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4, "{found:?}");
}

/// The module graph of the crate rooted at `src`.
fn graph(src: &Path) -> Graph {
    let module_names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                let name = p.file_stem()?.to_str()?.to_string();
                let is_module = p.is_dir() || p.extension().is_some_and(|x| x == "rs");
                (is_module && !["lib", "main", "bin", "mod"].contains(&name.as_str()))
                    .then_some(name)
            })
            .collect()
    };
    let mut modules = BTreeSet::new();
    for name in module_names(src) {
        if PATH_FOLDERS.contains(&name.as_str()) {
            for child in module_names(&src.join(&name)) {
                modules.insert(format!("{name}::{child}"));
            }
            // Its mod.rs, and what is named at the folder's own path.
            modules.insert(name);
        } else {
            modules.insert(name);
        }
    }
    let mut files = Vec::new();
    collect(src, &mut files);
    let test_only = test_only_files(&files);
    let mut g = Graph::new();
    // A test-only module's own child modules (`engine/tests/*.rs` under `engine/tests.rs`)
    // are test-only too.
    let under_test_only = |f: &Path| {
        test_only
            .iter()
            .any(|t| f.starts_with(t.with_extension("")) || t == f)
    };
    for file in files.iter().filter(|f| !under_test_only(f)) {
        let rel = file.strip_prefix(src).unwrap();
        let mut parts = rel.components().map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        });
        let first = parts.next().unwrap();
        let from = if PATH_FOLDERS.contains(&first.as_str()) {
            match parts.next() {
                Some(child) if child != "mod" => format!("{first}::{child}"),
                _ => first,
            }
        } else {
            first
        };
        if !modules.contains(&from) {
            continue;
        }
        // A file directly in a path folder names its siblings as `super::NAME`.
        // (Not mod.rs, whose `super::` is the crate.)
        let sibling_of = PATH_FOLDERS
            .iter()
            .find(|f| rel.parent() == Some(Path::new(f)) && !rel.ends_with("mod.rs"))
            .copied();
        let text = code_of(&std::fs::read_to_string(file).unwrap());
        for to in named_modules(&text, sibling_of) {
            // `crate::connection::GuardedApp`: an item of the folder's mod.rs.
            let to = match to.split_once("::") {
                Some((folder, _)) if !modules.contains(&to) => folder.to_string(),
                _ => to,
            };
            if to != from && modules.contains(&to) {
                g.entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| file.clone());
            }
        }
        g.entry(from).or_default();
    }
    g
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Files of modules declared `#[cfg(test)] mod NAME;` (unit tests kept in their own file).
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let stem = file.file_stem().unwrap().to_string_lossy();
        // The folder a file's child modules live in.
        let dir = if stem == "mod" || stem == "lib" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        let mut lines = text.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line != "#[cfg(test)]" {
                continue;
            }
            let mut next = lines.next().unwrap_or_default();
            let mut path = None;
            if let Some(p) = next.strip_prefix("#[path = \"") {
                path = p
                    .strip_suffix("\"]")
                    .map(|p| file.parent().unwrap().join(p));
                next = lines.next().unwrap_or_default();
            }
            if let Some(name) = next.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                out.insert(path.unwrap_or_else(|| dir.join(format!("{name}.rs"))));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// `text` without comments and without its inline `#[cfg(test)]` modules (which come last).
fn code_of(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| match l.find("//") {
            // `"redis://"` is not a comment.
            Some(i) if l[..i].matches('"').count() % 2 == 0 => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `NAME` of `crate::NAME` and of `crate::{NAME, OTHER::...}` in `text`; for a path
/// folder's `crate::FOLDER::NAME` (and, in a file of folder `sibling_of`, `super::NAME`), the
/// child `FOLDER::NAME`.
fn named_modules(text: &str, sibling_of: Option<&str>) -> BTreeSet<String> {
    let ident = |s: &str| {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    // `request::admission::admit` names `request::admission`; `limiter::store` names `limiter`.
    let module_at = |s: &str| {
        let first = ident(s);
        match s[first.len()..].strip_prefix("::") {
            Some(rest) if PATH_FOLDERS.contains(&first.as_str()) => {
                format!("{first}::{}", ident(rest))
            }
            _ => first,
        }
    };
    let mut out = BTreeSet::new();
    if let Some(folder) = sibling_of {
        for (i, _) in text.match_indices("super::") {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| c == ':' || c.is_ascii_alphanumeric()) {
                continue;
            }
            out.insert(format!("{folder}::{}", ident(&text[i + "super::".len()..])));
        }
    }
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        out.insert(module_at(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(module_at(rest));
        }
    }
    out
}

/// A circle in `g` as the modules along it, the first repeated last.
fn circle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in g.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(found) = visit(g, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|start| visit(g, start, &mut Vec::new(), &mut done))
}
