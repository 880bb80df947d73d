//! The crate's import structure holds the layering its lib.rs header writes down: no
//! circle of files or folders, no import upward, and fuser named only by the adapter (so
//! that another transport can sit beneath the same core).

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn imports_go_down_the_layers_of_lib_rs_without_a_circle() {
    if let Err(errors) = dhrd_testkit::layers::check(&src()) {
        panic!("{}", errors.join("\n"));
    }
}

#[test]
fn only_the_adapter_names_fuser() {
    let mut named = Vec::new();
    let mut stack = vec![src()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap_or_else(|e| panic!("{e}")).path();
            if p.is_dir() {
                if p != src().join("adapter") {
                    stack.push(p);
                }
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{e}"));
            let code = dhrd_testkit::layers::strip(&text);
            if code.contains("fuser") {
                named.push(p.display().to_string());
            }
        }
    }
    assert!(
        named.is_empty(),
        "fuser named outside the adapter: {named:?}"
    );
}
