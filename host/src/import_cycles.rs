//! The check that `host/src` has no import cycles: modules import one way,
//! down the data flow, and a value a lower module needs from a higher one
//! is handed in (STYLE.md). Reads the sources as text; never compiles them
//! and never runs in the server (tests only).
//!
//! The graph's nodes are the crate's module files. A file depends on each
//! module file its paths name (`crate::`, `super::`, `self::`, in `use`
//! trees and inline), a path resolved to the deepest module file that
//! exists (an item `runtime` re-exports is `runtime/mod.rs`'s), and on its
//! child modules' files (a module is made of its children). Its paths to
//! itself and to its ancestors are left out: a child using its parent's
//! types is the ordinary layout. Every strongly connected set of two files
//! or more is a cycle.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// A module's path below the crate root: `fetch/source.rs` is
/// `["fetch", "source"]`, `fetch/mod.rs` and `lib.rs` end at their folder.
type Module = Vec<String>;

#[test]
fn host_src_has_no_import_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = BTreeMap::new();
    read_sources(&src, &src, &mut sources);
    let graph = Graph::of(&sources);
    let cycles = graph.cycles();
    let report: Vec<String> = cycles
        .iter()
        .map(|cycle| {
            format!(
                "- {} files: {}\n  for instance {}",
                cycle.len(),
                cycle.join(", "),
                graph.example_loop(cycle).join(" → ")
            )
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "host/src has {} import cycle(s); hand the value in instead of importing it \
         (a callback, an encoder), or move it down:\n{}",
        cycles.len(),
        report.join("\n")
    );
}

/// The `.rs` files under `dir`, by their path relative to `src`, with their
/// text. `main.rs` is the binary's root, not the library's.
fn read_sources(src: &Path, dir: &Path, sources: &mut BTreeMap<String, String>) {
    let entries = std::fs::read_dir(dir).expect("host/src is readable");
    for entry in entries {
        let path = entry.expect("host/src is readable").path();
        if path.is_dir() {
            read_sources(src, &path, sources);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if relative != "main.rs" {
                let text = std::fs::read_to_string(&path).expect("a source file is readable");
                sources.insert(relative, text);
            }
        }
    }
}

/// Which files depend on which, by their paths relative to `src`.
struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn of(sources: &BTreeMap<String, String>) -> Self {
        let files: BTreeMap<Module, String> = sources
            .keys()
            .filter(|file| is_module(file, sources))
            .map(|file| (module_of(file), file.clone()))
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, file) in &files {
            let depends = edges.entry(file.clone()).or_default();
            for path in named_paths(&code_only(&sources[file]), module) {
                let target = (0..=path.len())
                    .rev()
                    .map(|len| &path[..len])
                    .find(|prefix| files.contains_key(*prefix))
                    .expect("the crate root is a module file");
                if !module.starts_with(target) {
                    depends.insert(files[target].clone());
                }
            }
            let children = files
                .iter()
                .filter(|(child, _)| child.len() == module.len() + 1 && child.starts_with(module));
            depends.extend(children.map(|(_, child)| child.clone()));
        }
        Self { edges }
    }

    /// Each set of files that reach each other, its files in name order.
    fn cycles(&self) -> Vec<Vec<String>> {
        let mut tarjan = Tarjan {
            edges: &self.edges,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for file in self.edges.keys() {
            if !tarjan.index.contains_key(file.as_str()) {
                tarjan.visit(file);
            }
        }
        let mut cycles: Vec<Vec<String>> = tarjan
            .found
            .into_iter()
            .filter(|set| set.len() > 1)
            .map(|set| {
                let mut files: Vec<String> = set.into_iter().map(str::to_string).collect();
                files.sort();
                files
            })
            .collect();
        cycles.sort();
        cycles
    }

    /// One shortest loop through the cycle's first file, for the reader.
    fn example_loop(&self, cycle: &[String]) -> Vec<String> {
        let start = &cycle[0];
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start.as_str()]);
        while let Some(file) = queue.pop_front() {
            for next in &self.edges[file] {
                if next == start {
                    let mut back = Vec::new();
                    let mut at = file;
                    while at != start {
                        back.push(at.to_string());
                        at = came_from[at];
                    }
                    back.reverse();
                    let mut path = vec![start.clone()];
                    path.extend(back);
                    path.push(start.clone());
                    return path;
                }
                if cycle.contains(next) && !came_from.contains_key(next.as_str()) {
                    came_from.insert(next, file);
                    queue.push_back(next);
                }
            }
        }
        unreachable!("a file of a cycle reaches itself")
    }
}

/// Tarjan's strongly connected components, over file names.
struct Tarjan<'a> {
    edges: &'a BTreeMap<String, BTreeSet<String>>,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    on_stack: BTreeSet<&'a str>,
    found: Vec<Vec<&'a str>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, file: &'a str) {
        let index = self.index.len();
        self.index.insert(file, index);
        self.low.insert(file, index);
        self.stack.push(file);
        self.on_stack.insert(file);
        for next in &self.edges[file] {
            let next = next.as_str();
            if !self.index.contains_key(next) {
                self.visit(next);
                let low = self.low[file].min(self.low[next]);
                self.low.insert(file, low);
            } else if self.on_stack.contains(next) {
                let low = self.low[file].min(self.index[next]);
                self.low.insert(file, low);
            }
        }
        if self.low[file] == index {
            let mut set = Vec::new();
            loop {
                let member = self.stack.pop().expect("the file itself is on the stack");
                self.on_stack.remove(member);
                set.push(member);
                if member == file {
                    break;
                }
            }
            self.found.push(set);
        }
    }
}

/// Whether `file` is one of the crate's modules: each folder above it has
/// its module file (`dir.rs` or `dir/mod.rs`). The scaffold's templates
/// are not.
fn is_module(file: &str, sources: &BTreeMap<String, String>) -> bool {
    let folders: Vec<&str> = file.split('/').collect();
    (1..folders.len()).all(|depth| {
        let folder = folders[..depth].join("/");
        sources.contains_key(&format!("{folder}.rs"))
            || sources.contains_key(&format!("{folder}/mod.rs"))
    })
}

fn module_of(file: &str) -> Module {
    let mut module: Module = file
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
        module.pop();
    }
    module
}

/// The text with comments, strings and character literals blanked, so
/// that what remains is code.
fn code_only(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut code = String::with_capacity(text.len());
    let mut i = 0;
    while i < s.len() {
        let next = s.get(i + 1).copied();
        match s[i] {
            '/' if next == Some('/') => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < s.len() {
                    if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                code.push(' ');
            }
            'r' if (i == 0 || !ident(s[i - 1]) || s[i - 1] == 'b') && raw_string(&s[i..]) => {
                let hashes = s[i + 1..].iter().take_while(|c| **c == '#').count();
                i += 2 + hashes;
                while i < s.len()
                    && !(s[i] == '"' && s[i + 1..].iter().take(hashes).all(|c| *c == '#'))
                {
                    i += 1;
                }
                i += 1 + hashes;
                code.push_str("\"\"");
            }
            '"' => {
                i += 1;
                while i < s.len() && s[i] != '"' {
                    i += if s[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                code.push_str("\"\"");
            }
            '\'' if next == Some('\\') => {
                i += 3;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
                code.push_str("' '");
            }
            '\'' if s.get(i + 2) == Some(&'\'') => {
                i += 3;
                code.push_str("' '");
            }
            c => {
                code.push(c);
                i += 1;
            }
        }
    }
    code
}

/// Whether `s` opens a raw string (`r"`, `r#"`), not a raw identifier.
fn raw_string(s: &[char]) -> bool {
    let hashes = s[1..].iter().take_while(|c| **c == '#').count();
    s.get(1 + hashes) == Some(&'"')
}

/// Every path `code` names from `crate`, `super` or `self`, made absolute
/// for a file of `module` (an inline `mod tests { … }` counts as a level).
fn named_paths(code: &str, module: &[String]) -> Vec<Module> {
    let b = code.as_bytes();
    let mut paths = Vec::new();
    let mut depth: usize = 0;
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' {
            depth += 1;
            i += 1;
            continue;
        }
        if b[i] == b'}' {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(at, _)| *at == depth) {
                inline.pop();
            }
            i += 1;
            continue;
        }
        let Some((word, end)) = ident_at(b, i).filter(|_| i == 0 || !is_ident(b[i - 1])) else {
            i += 1;
            continue;
        };
        let after_path = i > 0 && matches!(b[i - 1], b':' | b'$');
        if word == "mod" {
            let name_at = skip_space(b, end);
            if let Some((name, name_end)) = ident_at(b, name_at) {
                let open = skip_space(b, name_end);
                if b.get(open) == Some(&b'{') {
                    inline.push((depth, name.to_string()));
                    depth += 1;
                    i = open + 1;
                    continue;
                }
            }
        } else if !after_path
            && matches!(word, "crate" | "super" | "self")
            && b[skip_space(b, end)..].starts_with(b"::")
        {
            let here: Module = module
                .iter()
                .cloned()
                .chain(inline.iter().map(|(_, name)| name.clone()))
                .collect();
            let mut trees = Vec::new();
            i = use_tree(b, i, Vec::new(), &mut trees);
            paths.extend(trees.into_iter().map(|tree| absolute(tree, &here)));
            continue;
        }
        i = end;
    }
    paths
}

/// Reads a path or a `use` tree (`a::{b, c::{self, D}}`) at `i` into the
/// paths it names, after `prefix`; returns where it ended.
fn use_tree(
    b: &[u8],
    mut i: usize,
    mut prefix: Vec<String>,
    paths: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        i = skip_space(b, i);
        if b.get(i) == Some(&b'{') {
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                match b.get(i) {
                    None => return i,
                    Some(b'}') => return i + 1,
                    Some(_) => {
                        let end = use_tree(b, i, prefix.clone(), paths);
                        i = if end == i { i + 1 } else { end };
                    }
                }
            }
        }
        let Some((word, end)) = ident_at(b, i) else {
            paths.push(prefix);
            return i;
        };
        prefix.push(word.to_string());
        let next = skip_space(b, end);
        if b[next..].starts_with(b"::") {
            i = next + 2;
            continue;
        }
        paths.push(prefix);
        return end;
    }
}

/// `path` (starting at `crate`, `super` or `self`) seen from `here`.
fn absolute(path: Vec<String>, here: &[String]) -> Module {
    let mut parts = path.into_iter();
    let mut absolute = match parts.next().as_deref() {
        Some("crate") => Module::new(),
        Some("super") => here[..here.len().saturating_sub(1)].to_vec(),
        _ => here.to_vec(),
    };
    for part in parts {
        match part.as_str() {
            "super" => {
                absolute.pop();
            }
            "self" => {}
            _ => absolute.push(part),
        }
    }
    absolute
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn ident_at(b: &[u8], i: usize) -> Option<(&str, usize)> {
    if !b
        .get(i)
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
    {
        return None;
    }
    let end = (i..b.len()).find(|at| !is_ident(b[*at])).unwrap_or(b.len());
    Some((std::str::from_utf8(&b[i..end]).unwrap(), end))
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        let sources = files
            .iter()
            .map(|(file, text)| (file.to_string(), text.to_string()))
            .collect();
        Graph::of(&sources)
    }

    fn module(path: &str) -> Module {
        path.split("::").map(str::to_string).collect()
    }

    #[test]
    fn use_trees_and_inline_paths_are_read_from_code_only() {
        let code = code_only(
            r#"use crate::{a::b, c::{self, D}};
            use super::e::F as G;
            // crate::in_a_comment
            fn f() { let s = "crate::in_a_string"; crate::h::i(&s); self::j::K { x: '{' }; }
            mod tests { use super::*; use super::super::l; }"#,
        );
        let paths = named_paths(&code, &module("x::y"));
        let expected: Vec<Module> = [
            "a::b",
            "c",
            "c::D",
            "x::e::F",
            "h::i",
            "x::y::j::K",
            "x::y",
            "x::l",
        ]
        .into_iter()
        .map(module)
        .collect();
        assert_eq!(paths, expected);
    }

    #[test]
    fn a_child_using_its_parent_is_no_cycle_but_siblings_using_each_other_are() {
        let graph = graph(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a/mod.rs", "mod x; mod y; pub struct E; use self::x::X;"),
            ("a/x.rs", "use super::E; use super::y::Y;"),
            ("a/y.rs", "use super::x::X;"),
            ("b.rs", "use crate::c::C;"),
            ("c.rs", "fn f() { crate::a::E; }"),
            ("templates/lib.rs", "use crate::b::Nothing;"),
        ]);
        assert_eq!(
            graph.cycles(),
            vec![vec!["a/x.rs".to_string(), "a/y.rs".to_string()]]
        );
        assert_eq!(
            graph.example_loop(&graph.cycles()[0]),
            ["a/x.rs", "a/y.rs", "a/x.rs"]
        );
    }

    #[test]
    fn a_cycle_through_a_folder_counts_its_children() {
        // `events` names `http`'s root, whose child names `events`.
        let graph = graph(&[
            ("lib.rs", "mod events; mod http;"),
            ("events.rs", "fn f() { crate::http::event_data(); }"),
            ("http/mod.rs", "mod deployments; pub fn event_data() {}"),
            ("http/deployments.rs", "use crate::events::Event;"),
        ]);
        assert_eq!(
            graph.cycles(),
            vec![vec![
                "events.rs".to_string(),
                "http/deployments.rs".to_string(),
                "http/mod.rs".to_string(),
            ]]
        );
    }
}
