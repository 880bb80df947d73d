//! Functions stay short: no function of the product crates is longer than
//! [`LINES_MAX`] lines (signature to closing brace) unless the comment line right above it
//! (above its doc and attributes) starts with [`WHY_LONG`] and says why it is not split.
//! On a failure it lists every function over the limit with its length and place, the
//! list `issues` work starts from.
//!
//! Not checked: `dhrd-bench` (measurement code, kept whole so a figure's method reads in
//! one place) and test code (`tests/`, `tests.rs`, `#[cfg(test)]` modules).

use std::path::{Path, PathBuf};

/// Longest function, in lines.
const LINES_MAX: usize = 100;
/// How the comment above a longer function starts.
const WHY_LONG: &str = "// Long on purpose:";
/// Crates not checked (see the header).
const SKIPPED_CRATES: [&str; 1] = ["dhrd-bench"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `line` without string and char literals and comments; `in_block` carries an open
/// block comment across lines. Good enough for brace counting in rustfmt'd code (raw
/// strings with braces are not used in product code).
fn code_of(line: &str, in_block: &mut bool) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        if *in_block {
            if b[i..].starts_with(b"*/") {
                *in_block = false;
                i += 2;
            } else {
                i += 1;
            }
        } else if in_str {
            match b[i] {
                b'\\' => i += 2,
                b'"' => {
                    in_str = false;
                    i += 1;
                }
                _ => i += 1,
            }
        } else if b[i..].starts_with(b"//") {
            break;
        } else if b[i..].starts_with(b"/*") {
            *in_block = true;
            i += 2;
        } else if b[i] == b'"' {
            in_str = true;
            i += 1;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('{', '\n', '\''); a lifetime has no closing quote there.
            let close = b[i + 2..]
                .iter()
                .position(|c| *c == b'\'')
                .map_or(2, |p| p + 2);
            i += close + 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Whether `code` declares a function (`fn name`, with any qualifiers before it).
fn declares_fn(code: &str) -> bool {
    let words: Vec<&str> = code.split_whitespace().collect();
    let quals = ["pub", "const", "async", "unsafe", "extern", "\"C\""];
    words.iter().position(|w| *w == "fn").is_some_and(|at| {
        words[..at]
            .iter()
            .all(|w| quals.contains(w) || w.starts_with("pub("))
    })
}

/// A function: its length in lines, its first line (1-based), its name.
struct Found {
    lines: usize,
    line: usize,
    name: String,
}

/// Every function body of `text` (test modules included; the caller drops them).
fn functions(text: &str) -> Vec<Found> {
    let lines: Vec<&str> = text.lines().collect();
    let mut in_block = false;
    let mut depth = 0usize;
    let mut open: Vec<(usize, usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let code = code_of(line, &mut in_block);
        if declares_fn(&code) {
            let name = code
                .split("fn ")
                .nth(1)
                .map(|r| r.chars().take_while(|c| c.is_alphanumeric() || *c == '_'))
                .map(|c| c.collect())
                .unwrap_or_default();
            pending = Some((n, name));
        }
        for c in code.chars() {
            match c {
                '{' => {
                    depth += 1;
                    if let Some((start, name)) = pending.take() {
                        open.push((start, depth, name));
                    }
                }
                '}' => {
                    if open.last().is_some_and(|(_, d, _)| *d == depth) {
                        if let Some((start, _, name)) = open.pop() {
                            out.push(Found {
                                lines: n - start + 1,
                                line: start + 1,
                                name,
                            });
                        }
                    }
                    depth = depth.saturating_sub(1);
                }
                // A declaration without a body (a trait method, an extern item).
                ';' if open.last().is_none_or(|(_, d, _)| *d < depth) => pending = None,
                _ => {}
            }
        }
    }
    out
}

/// Whether the comment above the function at `line` (1-based), past its doc comments and
/// attributes, says why it is long.
fn says_why(lines: &[&str], line: usize) -> bool {
    lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| !(l.starts_with("///") || l.starts_with("#[")))
        .is_some_and(|l| l.starts_with(WHY_LONG))
}

/// The first line of the `#[cfg(test)]` module of `text`, if it has one (test modules
/// come last in this code base's files).
fn test_module_start(text: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len().saturating_sub(1))
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]" && lines[i + 1].trim_start().starts_with("mod ")
        })
        .map(|i| i + 1)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            rust_files(&p, out);
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

/// Every function of the checked product code over the limit without a reason.
fn too_long() -> Vec<String> {
    let crates = workspace().join("crates");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&crates).unwrap_or_else(|e| panic!("{}: {e}", crates.display())) {
        let e = e.unwrap_or_else(|e| panic!("{e}"));
        let name = e.file_name().to_string_lossy().into_owned();
        if !SKIPPED_CRATES.contains(&name.as_str()) {
            rust_files(&e.path().join("src"), &mut files);
        }
    }
    assert!(
        files.len() > 50,
        "found only {} source files under {}",
        files.len(),
        crates.display()
    );
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let tests_from = test_module_start(&text).unwrap_or(usize::MAX);
        let lines: Vec<&str> = text.lines().collect();
        for found in functions(&text) {
            if found.lines > LINES_MAX && found.line < tests_from && !says_why(&lines, found.line) {
                let at = f.strip_prefix(&crates).unwrap_or(&f).display().to_string();
                out.push(format!(
                    "{:5} lines  {at}:{}  {}",
                    found.lines, found.line, found.name
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_product_function_is_longer_than_the_limit_without_a_reason() {
    let long = too_long();
    assert!(
        long.is_empty(),
        "functions over {LINES_MAX} lines: split them by concern, or put a comment line \
         starting with {WHY_LONG:?} right above each (above its doc) saying why not:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_counter_finds_long_functions_and_reads_the_reason() {
    let body = "    let x = 1;\n".repeat(LINES_MAX);
    let text = format!(
        "fn short() {{ let s = \"}}\"; }}\n\nfn long() {{\n{body}}}\n\n{WHY_LONG} one match.\n\
         /// Doc.\n#[inline]\npub(crate) fn excused() {{\n{body}}}\n"
    );
    let found = functions(&text);
    let names: Vec<(&str, usize)> = found.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    assert_eq!(
        names,
        [
            ("short", 1),
            ("long", LINES_MAX + 2),
            ("excused", LINES_MAX + 2)
        ]
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(!says_why(&lines, found[1].line));
    assert!(says_why(&lines, found[2].line));
}
