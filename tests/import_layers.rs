//! The VMM's modules import downwards only: reads every `crate::` path of
//! `vmm/src` (outside comments, strings and `#[cfg(test)]` code) and checks
//! it against the layer order `docs/architecture.md` gives, so that the doc
//! stays true. A module the doc does not place, an import that runs up the
//! order, and an import circle (also within one layer) each fail the test,
//! naming the files.
//!
//! The nodes are the crate's top-level modules, with `machine` split into
//! its core and its leaves (`machine::kvm`, ... each its own node, as the
//! doc lists them); `lib.rs` is `lib`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const DOC: &str = include_str!("../docs/architecture.md");

/// The layer order from the doc's block after "Imports point downwards
/// only": one set of nodes per layer, top first.
fn layers() -> Vec<BTreeSet<String>> {
    let after = DOC
        .split_once("Imports point downwards only")
        .expect("docs/architecture.md says \"Imports point downwards only\"")
        .1;
    let block = after
        .split("```")
        .nth(1)
        .expect("the layer block follows, in ``` fences");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (names, rest) = line.split_once("  ").unwrap_or((line, ""));
            let names = names.trim();
            if names == "machine's leaves" {
                rest.split([',', ';'])
                    .map(str::trim)
                    .filter(|w| !w.is_empty())
                    .map(|w| match w.strip_suffix(".rs") {
                        // A top-level file of vmm/src (`input.rs`).
                        Some(top) => top.to_string(),
                        None => format!("machine::{w}"),
                    })
                    .collect()
            } else {
                names
                    .split(',')
                    .map(|n| match n.trim() {
                        "lib.rs" => "lib".to_string(),
                        n => n.to_string(),
                    })
                    .collect()
            }
        })
        .collect()
}

/// `src` with comments removed and string and character literals emptied
/// (newlines kept, so that line numbers stay).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, x)| c.get(i + k) == Some(&x));
    while i < c.len() {
        if at(i, "//") {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let mut depth = 0;
            loop {
                if i >= c.len() {
                    break;
                }
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                if depth == 0 {
                    break;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
            && matches!(c.get(i + 1), Some('"' | '#'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while j < c.len() && !at(j, &close) {
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j + close.chars().count();
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{..}'), else a lifetime.
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// `src` (stripped) without its `#[cfg(test)]` items; the names of the
/// test modules declared as files (`#[cfg(test)] mod tests;`).
fn drop_tests(src: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    let mut test_files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < lines.len() && lines[j].trim().is_empty() {
            j += 1;
        }
        let item = lines.get(j).map_or("", |l| l.trim());
        if let Some(name) = item
            .trim_start_matches("pub ")
            .strip_prefix("mod ")
            .and_then(|r| r.strip_suffix(';'))
        {
            test_files.push(name.trim().to_string());
            i = j + 1;
            continue;
        }
        let mut depth = 0i32;
        let mut opened = false;
        while j < lines.len() {
            depth += lines[j].matches('{').count() as i32 - lines[j].matches('}').count() as i32;
            opened |= lines[j].contains('{');
            if (opened && depth <= 0) || (!opened && lines[j].trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        i = j + 1;
    }
    (out.join("\n"), test_files)
}

/// The leaves of `machine`, as the doc lists them.
fn machine_leaves(layers: &[BTreeSet<String>]) -> BTreeSet<String> {
    layers
        .iter()
        .flatten()
        .filter_map(|n| n.strip_prefix("machine::").map(str::to_string))
        .collect()
}

/// The node a source file belongs to (`rel` is relative to `vmm/src`).
fn node_of(rel: &Path, leaves: &BTreeSet<String>) -> String {
    let parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [lib] if lib == "lib" => "lib".into(),
        [m, leaf, ..] if m == "machine" && leaves.contains(leaf) => format!("machine::{leaf}"),
        [top, ..] => top.clone(),
        [] => unreachable!(),
    }
}

/// The nodes the `crate::` (and, in `machine`, `super::`) paths of `src` name.
fn targets(
    src: &str,
    me: &str,
    leaves: &BTreeSet<String>,
    modules: &BTreeSet<String>,
) -> Vec<String> {
    let mut firsts: Vec<(String, Option<String>)> = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (k, _) in src.match_indices("crate::") {
        if k > 0 {
            let prev = src[..k].chars().next_back().unwrap();
            if prev.is_alphanumeric() || prev == '_' {
                continue; // `$crate::` or `foo_crate::`
            }
        }
        let rest = &src[k + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let item = item.trim();
                let first = ident(item);
                let second = item
                    .strip_prefix(first.as_str())
                    .and_then(|r| r.strip_prefix("::"))
                    .map(ident);
                firsts.push((first, second));
            }
        } else {
            let first = ident(rest);
            let second = rest[first.len()..].strip_prefix("::").map(|r| {
                if r.starts_with('{') {
                    String::new()
                } else {
                    ident(r)
                }
            });
            // `crate::machine::{kvm, memory}`: each name of the group.
            if first == "machine" && rest[first.len()..].starts_with("::{") {
                let g = &rest[first.len() + 3..];
                for item in g[..g.find('}').unwrap_or(g.len())].split(',') {
                    firsts.push((first.clone(), Some(ident(item.trim()))));
                }
                continue;
            }
            firsts.push((first, second));
        }
    }
    if me == "machine" || me.starts_with("machine::") {
        for (k, _) in src.match_indices("super::") {
            let r = &src[k + "super::".len()..];
            if !r.starts_with("super::") {
                firsts.push(("machine".into(), Some(ident(r))));
            }
        }
    }
    firsts
        .into_iter()
        .filter(|(f, _)| !f.is_empty())
        .map(|(first, second)| match (first.as_str(), second) {
            ("machine", Some(s)) if leaves.contains(&s) => format!("machine::{s}"),
            (m, _) if modules.contains(m) => m.to_string(),
            // `crate::run_vm`, `crate::GUEST_X86_64`, `crate::test_support`.
            _ => "lib".to_string(),
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every node's imports: node -> (target node -> files that import it).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn graph(layers: &[BTreeSet<String>]) -> (Graph, BTreeSet<String>) {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let leaves = machine_leaves(layers);
    let mut files = Vec::new();
    rust_files(&src_dir, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(&src_dir).ok()?;
            let first = rel.iter().next()?.to_string_lossy().into_owned();
            Some(first.trim_end_matches(".rs").to_string())
        })
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut stripped = BTreeMap::new();
    let mut test_files = BTreeSet::new();
    for p in &files {
        let rel = p.strip_prefix(&src_dir).unwrap().to_path_buf();
        let (code, tests) = drop_tests(&strip(&fs::read_to_string(p).unwrap()));
        let dir = if rel.file_name().is_some_and(|f| f == "mod.rs") {
            rel.parent().unwrap().to_path_buf()
        } else {
            rel.with_extension("")
        };
        for t in tests {
            test_files.insert(dir.join(format!("{t}.rs")));
            test_files.insert(dir.join(&t).join("mod.rs"));
        }
        stripped.insert(rel, code);
    }
    let mut g = Graph::new();
    let mut nodes = BTreeSet::new();
    for (rel, code) in &stripped {
        // main.rs is the binary, a crate of its own; test files are tests.
        if rel == Path::new("main.rs") || test_files.contains(rel) {
            continue;
        }
        let me = node_of(rel, &leaves);
        nodes.insert(me.clone());
        for t in targets(code, &me, &leaves, &modules) {
            if t != me {
                g.entry(me.clone())
                    .or_default()
                    .entry(t)
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    (g, nodes)
}

/// A circle of imports, if there is one.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(k) = path.iter().position(|p| p == n) {
            let mut c = path[k..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for t in g.get(n).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(t, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn imports_point_downwards_only() {
    let layers = layers();
    assert!(
        layers.len() >= 5,
        "the doc's layer block parsed to {layers:?}"
    );
    let layer_of = |n: &str| layers.iter().position(|l| l.contains(n));
    let (g, nodes) = graph(&layers);
    assert!(
        nodes.contains("machine::kvm") && nodes.contains("spec") && nodes.contains("cli"),
        "the source walk found {nodes:?}"
    );
    let unplaced: Vec<&String> = nodes.iter().filter(|n| layer_of(n).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules docs/architecture.md's layer block does not place: {unplaced:?}"
    );
    let mut upward = Vec::new();
    for (from, tos) in &g {
        for (to, files) in tos {
            let (a, b) = (layer_of(from).unwrap(), layer_of(to));
            if b.is_none_or(|b| b < a) {
                upward.push(format!("{from} -> {to} in {files:?}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports running up docs/architecture.md's layer order:\n{}",
        upward.join("\n")
    );
    if let Some(c) = find_cycle(&g) {
        let files: Vec<String> = c
            .windows(2)
            .map(|w| format!("{} -> {}: {:?}", w[0], w[1], g[&w[0]][&w[1]]))
            .collect();
        panic!("an import circle: {}\n{}", c.join(" -> "), files.join("\n"));
    }
}

/// What the order must keep, whatever else the doc's block says, so that an
/// import running up cannot be made legal by moving a line: the machine
/// sits below the host facts (`probe`) and the seccomp filters (`sandbox`),
/// which its caller hands it, and below `observe`, whose `Measurer` it
/// reports to through a trait; `input` and `output` use no module of the
/// machine, and the signals they wait on sit in the bottom layer.
#[test]
fn the_machine_is_handed_host_facts_and_filters_from_above() {
    let layers = layers();
    let layer_of = |n: &str| {
        layers
            .iter()
            .position(|l| l.contains(n))
            .unwrap_or_else(|| panic!("the doc's layer block does not place {n}"))
    };
    for above in ["probe", "sandbox", "observe", "preflight"] {
        assert!(
            layer_of(above) < layer_of("machine"),
            "docs/architecture.md must keep {above} above machine: machine is handed what \
             {above} makes, it never asks for it"
        );
    }
    assert_eq!(
        layer_of("signals"),
        layers.len() - 1,
        "signals belongs to the bottom layer (input, output and the machine use it)"
    );
    let (g, _) = graph(&layers);
    for user in ["input", "output"] {
        let into_machine: Vec<String> = g
            .get(user)
            .into_iter()
            .flatten()
            .filter(|(to, _)| *to == "machine" || to.starts_with("machine::"))
            .map(|(to, files)| format!("{to} in {files:?}"))
            .collect();
        assert!(
            into_machine.is_empty(),
            "{user} imports the machine: {into_machine:?}"
        );
    }
    let machine_core = g.get("machine").cloned().unwrap_or_default();
    for host_side in ["probe", "sandbox", "observe", "preflight", "report", "cli"] {
        assert!(
            !machine_core.contains_key(host_side),
            "machine imports {host_side} ({:?}): hand it what it needs from there instead",
            machine_core[host_side]
        );
    }
}

#[test]
fn the_scanner_sees_imports_and_skips_comments_strings_and_tests() {
    let layers = layers();
    let leaves = machine_leaves(&layers);
    let modules: BTreeSet<String> = ["machine", "report", "probe", "spec"]
        .map(String::from)
        .into();
    let src = r##"
use crate::machine::{kvm, memory::Layout};
use crate::{report::X, spec};
// use crate::probe::host;
/* use crate::probe::host; /* nested */ */
const S: &str = "crate::probe::host";
const R: &str = r#"crate::probe::host "quoted""#;
fn f<'a>(c: char) -> bool { c == '"' || c == '\'' }
fn g() { crate::machine::RunOutcome::x(); crate::run_vm(); }
#[cfg(test)]
mod tests {
    use crate::probe::host;
}
"##;
    let (code, tests) = drop_tests(&strip(src));
    assert!(tests.is_empty());
    let t: BTreeSet<String> = targets(&code, "cli", &leaves, &modules)
        .into_iter()
        .collect();
    let want: BTreeSet<String> = [
        "machine::kvm",
        "machine::memory",
        "report",
        "spec",
        "machine",
        "lib",
    ]
    .map(String::from)
    .into();
    assert_eq!(t, want);
    let (_, tests) = drop_tests("#[cfg(test)]\nmod tests;\n");
    assert_eq!(tests, ["tests"]);
    let mut g = Graph::new();
    g.entry("a".into())
        .or_default()
        .insert("b".into(), BTreeSet::new());
    assert_eq!(find_cycle(&g), None);
    g.entry("b".into())
        .or_default()
        .insert("a".into(), BTreeSet::new());
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}
