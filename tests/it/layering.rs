//! The house's shape, read from the sources: modules import in one
//! direction (no circles, at the top level and inside `index/` and
//! `worker/`), the rules docs/architecture.md names hold, and no source file
//! is much over 700 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file: `src/index/elastic/shard.rs` is
/// `["index", "elastic", "shard"]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// A file's code without comments and without its unit tests.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The modules each file's code names: `crate::a::b` and, inside a
/// folder module, `super::x` (resolved to its full path).
fn imports() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut out: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for f in files {
        let m = module_of(&src, &f);
        if m == ["lib"] || m == ["main"] {
            continue;
        }
        let is_folder_module = f.file_name().is_some_and(|n| n == "mod.rs");
        let text = code(&std::fs::read_to_string(&f).unwrap());
        let deps = out.entry(m.clone()).or_default();
        let words = |prefix: &str| -> Vec<Vec<String>> {
            text.match_indices(prefix)
                .filter(|(i, _)| *i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric() && text.as_bytes()[i - 1] != b'_')
                .map(|(i, _)| {
                    text[i + prefix.len()..]
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                        .next()
                        .unwrap()
                        .split("::")
                        .filter(|s| !s.is_empty() && s.chars().next().unwrap().is_ascii_lowercase())
                        .map(String::from)
                        .collect()
                })
                .collect()
        };
        // The binary's modules (`cli`, `bench`) name the library as `denorm::`.
        for path in words("crate::").into_iter().chain(words("denorm::")) {
            deps.insert(path);
        }
        // `super::x` in a file module is a sibling; in a folder module, the parent's.
        let parent: Vec<String> = if is_folder_module { m[..m.len().saturating_sub(1)].to_vec() } else { m[..m.len() - 1].to_vec() };
        for path in words("super::") {
            deps.insert(parent.iter().cloned().chain(path).collect());
        }
    }
    out
}

/// The edges between modules at `depth` path segments under `within`.
fn graph(within: &[&str], depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let name = |p: &[String]| -> Option<String> { (p.len() > within.len() && p.iter().zip(within).all(|(a, b)| a == b)).then(|| p[within.len()..(within.len() + depth).min(p.len())].join("::")) };
    for (m, deps) in imports() {
        let Some(from) = name(&m) else { continue };
        for d in deps {
            if let Some(to) = name(&d) {
                if to != from && !from.starts_with(&format!("{to}::")) {
                    g.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    g
}

/// A circle in `g`, if there is one.
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            return Some(path[i..].iter().cloned().chain([n.to_string()]).collect());
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_import_in_one_direction() {
    for (within, depth) in [(&[][..], 1), (&["index"][..], 1), (&["index", "elastic"][..], 1), (&["index", "embedded"][..], 1), (&["worker"][..], 1), (&["worker", "applier"][..], 1)] {
        let g = graph(within, depth);
        assert!(g.len() > 1 || !within.is_empty(), "no imports found under {within:?}");
        assert_eq!(circle(&g), None, "an import circle under {within:?}: {g:#?}");
    }
    // The detector finds a circle when there is one.
    let mut g = graph(&[], 1);
    g.entry("command".into()).or_default().insert("worker".into());
    assert!(circle(&g).is_some());
}

#[test]
fn the_layers_docs_architecture_names_hold() {
    let g = graph(&[], 1);
    let imports = |m: &str, other: &str| g.get(m).is_some_and(|d| d.contains(other));
    for (m, never) in [
        ("command", &["codec", "kafka", "produce", "dlq", "index", "apply", "moves", "worker"][..]),
        ("codec", &["kafka", "produce", "dlq", "moves", "index", "worker"][..]),
        ("kafka", &["produce", "dlq", "worker"][..]),
        ("index", &["apply", "moves", "dlq", "worker", "kafka"][..]),
        ("apply", &["worker", "kafka", "dlq", "moves"][..]),
        ("moves", &["worker", "kafka", "dlq", "migrate"][..]),
    ] {
        for n in never {
            assert!(!imports(m, n), "{m} imports {n}: {:?}", g.get(m));
        }
    }
    assert!(imports("kafka", "codec") && imports("produce", "kafka") && imports("worker", "apply") && imports("moves", "apply") && imports("migrate", "moves"), "{g:#?}");
    // `cli` maps arguments to library calls: nothing of the library
    // imports it; retrying and waiting depend on nothing of the crate.
    for (m, deps) in &g {
        assert!(m == "cli" || m == "main" || !deps.contains("cli"), "{m} imports cli");
    }
    assert!(g.get("retry").is_none_or(|d| d.is_empty()), "retry imports {:?}", g.get("retry"));
    assert!(g.get("domain").is_none_or(|d| d.is_empty()), "domain imports {:?}", g.get("domain"));
    assert!(imports("cli", "rebuild") && !imports("worker", "rebuild"), "{g:#?}");
}

/// The library has its own error types and takes no command line: `anyhow`
/// and `clap` are the binary's (`main.rs`, `cli/`, `bench/`), which the
/// library never imports.
#[test]
fn the_library_names_neither_anyhow_nor_clap() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let binary = |m: &[String]| m == ["main"] || m.first().is_some_and(|f| f == "cli" || f == "bench");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    assert!(!lib.contains("mod cli") && !lib.contains("mod bench"), "lib.rs declares the binary's modules");
    let mut named = Vec::new();
    let mut checked = 0;
    for f in &files {
        let m = module_of(&src, f);
        let text = code(&std::fs::read_to_string(f).unwrap());
        if binary(&m) {
            continue;
        }
        checked += 1;
        for word in ["anyhow", "clap"] {
            if text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == word) {
                named.push(format!("{} names {word}", f.strip_prefix(&src).unwrap().display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} library files found");
    assert_eq!(named, Vec::<String>::new());
}

#[test]
fn no_source_file_is_much_over_700_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    sources(&root.join("tests"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 750).then(|| format!("{} ({n} lines)", f.strip_prefix(root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "over 750 lines: {long:?}");
}
