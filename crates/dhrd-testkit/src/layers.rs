//! The import structure of a crate, checked against the layering its `lib.rs` header
//! writes down ([`check`]).
//!
//! What counts as an import of file A from file B: a path `crate::...`, `super::...` or
//! `self::...` in A's code (in `use` lines and anywhere else, brace groups expanded) that
//! names B's module or something inside it; `mod` declarations are structure, not
//! imports. Comments, strings and character literals are left out; `super::` inside an
//! inline `mod name { ... }` is taken relative to that inline module.
//!
//! The rules:
//! - No circle of files: no file reaches itself through imports.
//! - No circle of units (a unit is a top-level module: a file or folder under `src/`).
//! - Every unit is on a floor of the header's table, and every import between two units
//!   goes to a strictly lower floor. No file imports the crate root.
//!
//! The table, in the `//!` header of `src/lib.rs`: one row per floor, its number and its
//! units in backticks, as in
//! `//! | 3 | `mount` | the owner of a mount's state |`.
//!
//! No state and no crash semantics: it only reads source files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One import: the file and line it is on, the path as written (expanded), the file it
/// resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub from: PathBuf,
    pub line: usize,
    pub path: String,
    pub to: PathBuf,
}

/// Every import between two different files of the crate at `src` (its `src/` folder),
/// with file paths relative to `src`.
pub fn imports(src: &Path) -> Result<Vec<Import>, String> {
    let mut files = Vec::new();
    collect_rs(src, src, &mut files)?;
    let known: BTreeSet<PathBuf> = files.iter().cloned().collect();
    let mut out = Vec::new();
    for rel in &files {
        let text = std::fs::read_to_string(src.join(rel))
            .map_err(|e| format!("{}: {e}", rel.display()))?;
        let module = module_of(rel);
        let code = strip(&text);
        let children = child_modules(&code);
        for (line, inline, path) in paths_in(&code, &children) {
            let mut base: Vec<String> = module.clone();
            base.extend(inline.iter().cloned());
            let Some(segs) = absolute(&base, &path) else {
                continue;
            };
            if let Some(to) = resolve(&known, &segs) {
                if &to != rel {
                    out.push(Import {
                        from: rel.clone(),
                        line,
                        path: path.join("::"),
                        to,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Checks the crate at `src` against the rules in the module header. Returns every
/// breach found, each naming the files, lines and paths involved.
pub fn check(src: &Path) -> Result<(), Vec<String>> {
    let lib =
        std::fs::read_to_string(src.join("lib.rs")).map_err(|e| vec![format!("lib.rs: {e}")])?;
    let floors = floors(&lib);
    if floors.is_empty() {
        return Err(vec![
            "lib.rs states no layering table (see dhrd_testkit::layers)".into(),
        ]);
    }
    let imports = imports(src).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut units = BTreeSet::new();
    let mut files = Vec::new();
    collect_rs(src, src, &mut files).map_err(|e| vec![e])?;
    for f in &files {
        if let Some(u) = unit_of(f) {
            units.insert(u);
        }
    }
    for u in &units {
        if !floors.contains_key(u) {
            errors.push(format!("unit `{u}` is on no floor of the table in lib.rs"));
        }
    }
    for i in &imports {
        let (Some(fu), tu) = (unit_of(&i.from), unit_of(&i.to)) else {
            continue;
        };
        let Some(tu) = tu else {
            errors.push(format!(
                "{}:{} imports the crate root ({})",
                i.from.display(),
                i.line,
                i.path
            ));
            continue;
        };
        if fu == tu {
            continue;
        }
        if let (Some(a), Some(b)) = (floors.get(&fu), floors.get(&tu)) {
            if a <= b {
                errors.push(format!(
                    "{}:{}: `{fu}` (floor {a}) imports `{tu}` (floor {b}) through {}: \
                     imports go to lower floors only",
                    i.from.display(),
                    i.line,
                    i.path
                ));
            }
        }
    }
    let file_edges: Vec<(String, String, &Import)> = imports
        .iter()
        .map(|i| (show(&i.from), show(&i.to), i))
        .collect();
    errors.extend(circles("files", &file_edges));
    let unit_edges: Vec<(String, String, &Import)> = imports
        .iter()
        .filter_map(|i| Some((unit_of(&i.from)?, unit_of(&i.to)?, i)))
        .filter(|(a, b, _)| a != b)
        .collect();
    errors.extend(circles("units", &unit_edges));
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

/// The floors of the table in lib.rs's header: unit -> floor.
pub fn floors(lib: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let cells: Vec<&str> = row.trim().split('|').map(str::trim).collect();
        // "| 3 | `a`, `b` | what |" splits into ["", "3", "`a`, `b`", "what", ""].
        if cells.len() < 4 || !cells[0].is_empty() {
            continue;
        }
        let Ok(floor) = cells[1].parse::<u32>() else {
            continue;
        };
        for name in cells[2].split('`').skip(1).step_by(2) {
            out.insert(name.to_string(), floor);
        }
    }
    out
}

/// Every circle (strongly connected component of more than one node) of the graph, each
/// with the imports that tie it.
fn circles(what: &str, edges: &[(String, String, &Import)]) -> Vec<String> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b, _) in edges {
        next.entry(a).or_default().insert(b);
        next.entry(b).or_default();
    }
    let mut out = Vec::new();
    for scc in strongly_connected(&next) {
        if scc.len() < 2 {
            continue;
        }
        let members: BTreeSet<&str> = scc.iter().copied().collect();
        let ties: Vec<String> = edges
            .iter()
            .filter(|(a, b, _)| members.contains(a.as_str()) && members.contains(b.as_str()))
            .map(|(a, b, i)| format!("  {a} -> {b} ({}:{} {})", i.from.display(), i.line, i.path))
            .collect();
        out.push(format!(
            "a circle of {what}: {}\n{}",
            scc.join(", "),
            ties.join("\n")
        ));
    }
    out
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected<'a>(next: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, next: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in next.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, next, s);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let mut s = State {
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in next.keys() {
        if !s.index.contains_key(v) {
            visit(v, next, &mut s);
        }
    }
    s.out
}

/// Every `.rs` file below `dir`, relative to `root`, sorted.
fn collect_rs(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect_rs(root, &p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).map_err(|e| e.to_string())?;
            out.push(rel.to_path_buf());
        }
    }
    Ok(())
}

/// The module path of a file: `lib.rs` -> [], `a.rs` -> [a], `a/mod.rs` -> [a],
/// `a/b.rs` -> [a, b].
fn module_of(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = segs.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" {
            segs.push(stem.to_string());
        }
    }
    segs
}

/// The unit (top-level module) a file belongs to; None for the crate root.
fn unit_of(rel: &Path) -> Option<String> {
    module_of(rel).into_iter().next()
}

/// The file of the longest module prefix of `segs` that exists.
fn resolve(known: &BTreeSet<PathBuf>, segs: &[String]) -> Option<PathBuf> {
    for n in (0..=segs.len()).rev() {
        let prefix = &segs[..n];
        if prefix.is_empty() {
            return Some(PathBuf::from("lib.rs"));
        }
        let joined: PathBuf = prefix.iter().collect();
        let file = joined.with_extension("rs");
        if known.contains(&file) {
            return Some(file);
        }
        let folder = joined.join("mod.rs");
        if known.contains(&folder) {
            return Some(folder);
        }
    }
    None
}

/// `path` (starting with `crate`, `super` or `self`) as an absolute module path, seen
/// from module `base`.
fn absolute(base: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut segs = path.iter().peekable();
    let mut out: Vec<String> = match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            Vec::new()
        }
        Some("self") => {
            segs.next();
            base.to_vec()
        }
        Some("super") => {
            let mut b = base.to_vec();
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                b.pop()?;
            }
            b
        }
        _ => return None,
    };
    out.extend(segs.cloned());
    Some(out)
}

/// Code without comments, strings and character literals (each replaced by spaces, so
/// lines keep their numbers).
pub fn strip(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let n = b.get(i + 1).copied();
        if c == '/' && n == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && n == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (n == Some('"') || n == Some('#')) && !ident_before(&b, i) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(b[i..j.min(b.len())].iter().map(|c| blank(*c)));
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                if b[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            let end = (j + 1).min(b.len());
            out.extend(b[i..end].iter().map(|c| blank(*c)));
            i = end;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let end = if n == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                Some(j + 1)
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(e) => {
                    let e = e.min(b.len());
                    out.extend(b[i..e].iter().map(|c| blank(*c)));
                    i = e;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// A token of stripped code: an identifier, `::`, or one other character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Colons,
    Other(char),
}

fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' || c == '$' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '$') {
                i += 1;
            }
            out.push((line, Tok::Ident(b[s..i].iter().collect())));
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push((line, Tok::Colons));
            i += 2;
        } else {
            out.push((line, Tok::Other(c)));
            i += 1;
        }
    }
    out
}

/// The modules `code` declares in files of their own (`mod name;`).
fn child_modules(code: &str) -> BTreeSet<String> {
    let toks = tokens(code);
    toks.windows(3)
        .filter_map(|w| match (&w[0].1, &w[1].1, &w[2].1) {
            (Tok::Ident(m), Tok::Ident(name), Tok::Other(';')) if m == "mod" => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// Every `crate::`, `super::` and `self::` path in stripped code, and every path that
/// starts with a child module of the file (`children`, taken as `self::`), brace groups
/// expanded: (line, the inline modules it is inside, the path's segments).
fn paths_in(code: &str, children: &BTreeSet<String>) -> Vec<(usize, Vec<String>, Vec<String>)> {
    let toks = tokens(code);
    let mut out = Vec::new();
    // Inline modules open at a brace depth: (name, depth inside).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].1 {
            Tok::Other('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Other('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some((_, Tok::Ident(name))), Some((_, Tok::Other('{')))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Tok::Ident(k)
                if (k == "crate" || k == "super" || k == "self")
                    && toks.get(i + 1).is_some_and(|t| t.1 == Tok::Colons)
                    && !(i > 0 && toks[i - 1].1 == Tok::Colons) =>
            {
                let line = toks[i].0;
                let names: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                let (paths, end) = path_at(&toks, i, Vec::new());
                for p in paths {
                    out.push((line, names.clone(), p));
                }
                i = end.max(i + 1);
            }
            Tok::Ident(k)
                if inline.is_empty()
                    && children.contains(k)
                    && toks.get(i + 1).is_some_and(|t| t.1 == Tok::Colons)
                    && !(i > 0 && toks[i - 1].1 == Tok::Colons) =>
            {
                let line = toks[i].0;
                let (paths, end) = path_at(&toks, i, vec!["self".to_string()]);
                for p in paths {
                    out.push((line, Vec::new(), p));
                }
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// The path (or brace group of paths) starting at token `i`, after `prefix`; the token
/// after it.
fn path_at(toks: &[(usize, Tok)], mut i: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut segs = prefix;
    loop {
        match toks.get(i).map(|t| &t.1) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                i += 1;
            }
            Some(Tok::Other('*')) => {
                return (vec![segs], i + 1);
            }
            Some(Tok::Other('{')) => {
                // A group: each member after `segs`, separated by commas.
                let mut out = Vec::new();
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.1) {
                        Some(Tok::Other('}')) | None => return (out, i + 1),
                        Some(Tok::Other(',')) => i += 1,
                        _ => {
                            let (more, next) = path_at(toks, i, segs.clone());
                            out.extend(more);
                            // Skip `as name` and anything else up to the member's end.
                            i = next;
                            while let Some(t) = toks.get(i).map(|t| &t.1) {
                                if matches!(t, Tok::Other(',') | Tok::Other('}')) {
                                    break;
                                }
                                i += 1;
                            }
                        }
                    }
                }
            }
            _ => return (vec![segs], i),
        }
        if toks.get(i).map(|t| &t.1) == Some(&Tok::Colons) {
            i += 1;
        } else {
            return (vec![segs], i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (p, text) in files {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap_or(root)).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(p, text).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dhrd-layers-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    const LIB: &str = "//! | floor | units | what |\n//! | 2 | `top` | |\n//! | 1 | `low`, `side` | |\nmod top;\nmod low;\nmod side;\n";

    #[test]
    fn paths_are_found_in_use_lines_groups_and_code_but_not_in_comments_or_strings() {
        let code = strip(
            "use crate::a::{b::{C, D}, e as f};\n// crate::x::y\nlet s = \"crate::z::w\";\nfn g() { super::h::i(); let c = '{'; h::j(); }\nmod tests { use super::*; }\n",
        );
        let children = child_modules("mod h;");
        let got: Vec<(usize, Vec<String>, String)> = paths_in(&code, &children)
            .into_iter()
            .map(|(l, m, p)| (l, m, p.join("::")))
            .collect();
        let want = vec![
            (1, vec![], "crate::a::b::C".to_string()),
            (1, vec![], "crate::a::b::D".to_string()),
            (1, vec![], "crate::a::e".to_string()),
            (4, vec![], "super::h::i".to_string()),
            (4, vec![], "self::h::j".to_string()),
            (5, vec!["tests".to_string()], "super".to_string()),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_layered_crate_passes() {
        let d = scratch("ok");
        write(
            &d,
            &[
                ("lib.rs", LIB),
                ("top/mod.rs", "mod x;\nuse crate::low::Thing;\nuse x::Y;\n"),
                (
                    "top/x.rs",
                    "use crate::side::S;\npub struct Y;\nmod tests { use super::*; }\n",
                ),
                ("low.rs", "pub struct Thing;\n"),
                ("side.rs", "pub struct S;\n"),
            ],
        );
        assert_eq!(check(&d), Ok(()));
    }

    #[test]
    fn an_upward_import_a_circle_of_files_and_an_unplaced_unit_fail() {
        let d = scratch("bad");
        write(
            &d,
            &[
                ("lib.rs", &format!("{LIB}mod stray;\n")),
                (
                    "top/mod.rs",
                    "mod x;\nuse x::Y;\nuse crate::low::Q;\npub struct Z;\n",
                ),
                ("top/x.rs", "use super::Z;\npub struct Y;\n"),
                ("low.rs", "use crate::top::Z;\n"),
                ("side.rs", "use crate::low::T;\n"),
                ("stray.rs", "use crate::S;\n"),
            ],
        );
        let Err(errors) = check(&d) else {
            panic!("a crate that breaks every rule passed");
        };
        let all = errors.join("\n");
        assert!(
            all.contains("`low` (floor 1) imports `top` (floor 2)"),
            "{all}"
        );
        assert!(
            all.contains("`side` (floor 1) imports `low` (floor 1)"),
            "{all}"
        );
        assert!(
            all.contains("a circle of files: low.rs, top/mod.rs, top/x.rs"),
            "{all}"
        );
        assert!(
            all.contains("top/x.rs -> top/mod.rs (top/x.rs:1 super::Z)"),
            "{all}"
        );
        assert!(all.contains("a circle of units: low, top"), "{all}");
        assert!(all.contains("unit `stray` is on no floor"), "{all}");
        assert!(all.contains("stray.rs:1 imports the crate root"), "{all}");
    }
}
