//! The benchmark harness runs end to end on its quick profile (small sizes, short runs), so
//! it cannot rot. Numbers are not checked: speed is never asserted in tests.

use std::process::Command;

#[test]
fn engine_quick_profile_runs_and_writes_results() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("out");
    let st = Command::new(env!("CARGO_BIN_EXE_dhrd-bench"))
        .args(["engine", "--quick", "--dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .status()?;
    assert!(st.success(), "dhrd-bench engine --quick failed: {st}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json"))?)?;
    let rows = json["rows"].as_array().ok_or("no rows")?;
    for exp in [
        "read 4 KiB random",
        "write 4 KiB random",
        "full load",
        "open to ready",
        "chunk sweep",
        "I10",
    ] {
        assert!(
            rows.iter()
                .any(|r| r["experiment"].as_str().is_some_and(|e| e.starts_with(exp))),
            "no rows for {exp}"
        );
    }
    assert!(std::fs::read_to_string(out.join("report.md"))?.contains("Machine:"));
    Ok(())
}
