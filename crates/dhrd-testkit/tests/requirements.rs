//! docs/requirements.md names, for every requirement ID of the specification, the tests that
//! check it, or says why none does ("not tested", "not built yet"). This test keeps that
//! true as the code moves: every requirement has its row, and every test a row names, as
//! `crate/tests/file.rs::name` or `crate/src/file.rs::module::name`, still exists there as
//! a `#[test]` function (a renamed, moved or deleted test fails here, naming the row).

use std::path::{Path, PathBuf};

/// Every requirement ID of the specification, and the durability modes.
const IDS: &[&str] = &[
    "C1",
    "C2",
    "C3",
    "C4",
    "C5",
    "I1",
    "I2",
    "I3",
    "I4",
    "I5",
    "I6",
    "I7",
    "I8",
    "I9",
    "I10",
    "I11",
    "D1",
    "D2",
    "D3",
    "D4",
    "D5",
    "D6",
    "sync",
    "fsync",
    "periodic:N",
    "group commit",
    "M1",
    "M2",
    "M3",
    "M4",
    "M5",
    "T1",
    "T2",
    "T3",
    "E1",
    "E2",
    "R1",
    "R2",
    "A1",
    "A2",
    "A3",
    "A4",
];

/// What a tests cell says when it names no test.
const NO_TEST: [&str; 2] = ["not tested", "not built yet"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A table row's cells, without the outer bars; None for a line that is not a row.
fn cells(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_string()).collect())
}

/// The backticked spans of `text` that name a test: `crate/(src|tests)/...rs::...::name`.
fn test_refs(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.split_once("::").is_some_and(|(file, _)| {
                file.starts_with("dhrd-")
                    && file.ends_with(".rs")
                    && (file.contains("/tests/") || file.contains("/src/"))
            })
        })
        .map(str::to_string)
        .collect()
}

/// Checks that `reference` names a `#[test]` function that exists; the error says why not.
fn check_ref(root: &Path, reference: &str) -> Result<(), String> {
    let mut parts = reference.split("::");
    let file = parts.next().unwrap_or_default();
    let path: Vec<&str> = parts.collect();
    let (name, modules) = path.split_last().ok_or("no test name")?;
    let source = std::fs::read_to_string(root.join("crates").join(file))
        .map_err(|e| format!("crates/{file}: {e}"))?;
    for m in modules {
        if !source.contains(&format!("mod {m} ")) && !source.contains(&format!("mod {m}{{")) {
            return Err(format!("crates/{file} has no `mod {m}`"));
        }
    }
    let lines: Vec<&str> = source.lines().collect();
    let at = lines
        .iter()
        .position(|l| {
            let l = l.trim_start();
            [format!("fn {name}("), format!("fn {name}<")]
                .iter()
                .any(|p| l.starts_with(p.as_str()) || l.contains(&format!(" {p}")))
        })
        .ok_or_else(|| format!("crates/{file} has no `fn {name}`"))?;
    // Above the function: its attributes and doc comments, one of them `#[test]`.
    let is_test = lines[..at]
        .iter()
        .rev()
        .take_while(|l| {
            let l = l.trim();
            l.starts_with("#[") || l.starts_with("//") || l.ends_with(']') || l.ends_with(')')
        })
        .any(|l| l.trim() == "#[test]");
    if !is_test {
        return Err(format!("`fn {name}` in crates/{file} is not a #[test]"));
    }
    Ok(())
}

#[test]
fn every_requirement_names_its_tests_and_every_named_test_exists() {
    let root = workspace();
    let doc_path = root.join("docs/requirements.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let rows: Vec<Vec<String>> = doc.lines().filter_map(cells).collect();
    let mut problems = Vec::new();
    for id in IDS {
        let want = [id.to_string(), format!("`{id}`")];
        let found: Vec<&Vec<String>> = rows.iter().filter(|r| want.contains(&r[0])).collect();
        let row = match found.as_slice() {
            [row] => row,
            [] => {
                problems.push(format!("{id}: no row"));
                continue;
            }
            _ => {
                problems.push(format!("{id}: {} rows", found.len()));
                continue;
            }
        };
        let Some(tests) = row.last().filter(|_| row.len() >= 4) else {
            problems.push(format!("{id}: the row has no tests column"));
            continue;
        };
        if test_refs(tests).is_empty() && !NO_TEST.iter().any(|n| tests.contains(n)) {
            problems.push(format!(
                "{id}: names no test and does not say `not tested` (and why) or `not built yet`"
            ));
        }
    }
    let refs = test_refs(&doc);
    if refs.len() < IDS.len() {
        problems.push(format!(
            "only {} test references in the document: is the parser still reading it?",
            refs.len()
        ));
    }
    for r in &refs {
        if let Err(e) = check_ref(&root, r) {
            problems.push(format!("`{r}`: {e}"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/requirements.md:\n  {}",
        problems.join("\n  ")
    );
}

/// The checks themselves can fail: a test that is not there, a helper that is not a test,
/// a module that is not there.
#[test]
fn a_missing_or_wrong_reference_is_caught() {
    let root = workspace();
    let me = "dhrd-testkit/tests/requirements.rs";
    assert_eq!(
        check_ref(
            &root,
            &format!("{me}::a_missing_or_wrong_reference_is_caught")
        ),
        Ok(())
    );
    assert!(check_ref(&root, &format!("{me}::no_such_test")).is_err());
    assert!(check_ref(&root, &format!("{me}::check_ref")).is_err());
    assert!(check_ref(&root, &format!("{me}::tests::check_ref")).is_err());
    assert!(check_ref(&root, "dhrd-testkit/tests/gone.rs::x").is_err());
    assert_eq!(
        test_refs("`dhrd-a/tests/b.rs::c` and `d::e` and `dhrd-f/src/g.rs`"),
        vec!["dhrd-a/tests/b.rs::c".to_string()]
    );
}
