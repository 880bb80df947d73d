//! The real `dhrd-bench rehypar` process with small workloads: one JSON line on stdout,
//! the same events for every allocator, figures in range, and the same output again for
//! the same seed (the comparison has no timing in it, so it must reproduce exactly).

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

type R<T> = Result<T, Box<dyn std::error::Error>>;

fn traces_dir() -> PathBuf {
    std::env::var_os("DHRD_TRACES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/traces"
            ))
        })
}

fn run(seed: &str, workloads: &str) -> R<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dhrd-bench"))
        .args([
            "rehypar",
            "--device-mib",
            "64",
            "--seed",
            seed,
            "--workloads",
            workloads,
            "--postmark-files",
            "500",
            "--postmark-transactions",
            "2000",
            "--iozone-written-mib",
            "96",
            "--traces-dir",
        ])
        .arg(traces_dir())
        .output()?)
}

fn json_of(out: &Output) -> R<Value> {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone())?;
    assert_eq!(stdout.lines().count(), 1, "stdout is not one line");
    Ok(serde_json::from_str(&stdout)?)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

#[test]
fn compares_all_allocators_on_the_same_events_and_reproduces() -> R<()> {
    let workloads = if traces_dir().is_dir() {
        "postmark,iozone,traces"
    } else {
        dhrd_testkit::skip(format!(
            "trace directory {} not found (set DHRD_TRACES_DIR): the allocators ran without \
             the block traces",
            traces_dir().display()
        ));
        "postmark,iozone"
    };
    let out = run("3", workloads)?;
    let j = json_of(&out)?;
    let ws = j["workloads"].as_array().ok_or("no workloads")?;
    assert!(ws.len() >= 2);
    for w in ws {
        let rows = w["results"].as_array().ok_or("no results")?;
        assert!(rows.len() >= 5, "{}", w["workload"]);
        for r in rows {
            assert_eq!(r["allocations"], w["allocations"], "{}", r["allocator"]);
            let u = f(&r["utilisation"]);
            assert!(
                u > 0.0 && u <= 1.0,
                "{} {}: {u}",
                w["workload"],
                r["allocator"]
            );
            for k in ["internal_fragmentation", "external_fragmentation"] {
                let x = f(&r[k]);
                assert!((0.0..=1.0).contains(&x), "{k} = {x}");
            }
            let held = r["held_blocks"].as_u64().ok_or("held")?;
            let live = r["live_blocks"].as_u64().ok_or("live")?;
            assert!(live <= held);
        }
        let ff = rows
            .iter()
            .find(|r| r["allocator"] == "extent first-fit")
            .ok_or("no first-fit row")?;
        assert_eq!(ff["internal_fragmentation"], 0.0);
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("util"));
    let again = run("3", workloads)?;
    assert_eq!(out.stdout, again.stdout, "same seed, different result");
    let other = run("4", "postmark")?;
    assert_ne!(
        json_of(&other)?["workloads"][0],
        j["workloads"][0],
        "the seed changes nothing"
    );
    Ok(())
}
