//! The file-level workloads (`fileserver`, `video`) run end to end on a temporary
//! directory with tiny sizes, and their JSON is internally consistent: op counts per
//! flowop group agree, the file count at the end matches the files on disk, the video
//! checksum verifies and the modification lands exactly in the middle region. Speed is
//! never asserted.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

type R<T> = Result<T, Box<dyn std::error::Error>>;

fn bench(args: &[&str], dir: &Path) -> R<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dhrd-bench"))
        .args(args)
        .arg("--dir")
        .arg(dir)
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
    assert_eq!(
        stdout.lines().count(),
        1,
        "stdout is not one line: {stdout}"
    );
    Ok(serde_json::from_str(&stdout)?)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(u64::MAX)
}

fn count_files(dir: &Path) -> R<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            n += count_files(&e.path())?;
        } else {
            n += 1;
        }
    }
    Ok(n)
}

fn check_fileserver(j: &Value) {
    let f = &j["flowops"];
    let ops = |name: &str| u(&f[name]["ops"]);
    let total: u64 = f
        .as_object()
        .map_or(0, |m| m.values().map(|v| u(&v["ops"])).sum());
    assert_eq!(f.as_object().map_or(0, |m| m.len()), 11, "eleven flowops");
    assert_eq!(u(&j["ops"]), total);
    assert!(total > 0, "no ops: {j}");
    // A group (create+write+close, ...) always completes, so its counts agree.
    for group in [
        ["createfile1", "wrtfile1", "closefile1"],
        ["openfile1", "appendfilerand1", "closefile2"],
        ["openfile2", "readfile1", "closefile3"],
    ] {
        assert!(
            group.iter().all(|g| ops(g) == ops(group[0])),
            "{group:?}: {f}"
        );
    }
    assert_eq!(u(&j["files_created"]), ops("createfile1"));
    assert_eq!(u(&j["files_deleted"]), ops("deletefile1"));
    assert_eq!(
        u(&j["files_end"]) + u(&j["files_deleted"]),
        u(&j["files_start"]) + u(&j["files_created"])
    );
    assert_eq!(u(&j["files_start"]), 160, "80% of 200 preallocated");
    assert_eq!(u(&j["errors"]), 0);
    assert_eq!(
        u(&j["written_bytes"]),
        u(&f["wrtfile1"]["bytes"]) + u(&f["appendfilerand1"]["bytes"])
    );
    assert_eq!(u(&j["read_bytes"]), u(&f["readfile1"]["bytes"]));
    assert!(j["ops_per_sec"].as_f64().is_some_and(|v| v > 0.0));
}

#[test]
fn fileserver_runs_keeps_and_cleans_up() -> R<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("dhrd-fileserver");
    let small = [
        "fileserver",
        "--files",
        "200",
        "--threads",
        "4",
        "--secs",
        "0.5",
    ];

    // --keep: the files on disk are exactly the ones the run says exist.
    let kept = [&small[..], &["--keep", "--fsync"][..]].concat();
    let j = json_of(&bench(&kept, dir.path())?)?;
    check_fileserver(&j);
    assert_eq!(j["kept"], Value::Bool(true));
    assert!(j["cleanup_secs"].is_null());
    assert_eq!(count_files(&root)?, u(&j["files_end"]));

    // A leftover fileset is refused, not reused.
    let again = bench(&small, dir.path())?;
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    std::fs::remove_dir_all(&root)?;

    // Default: removed at the end, cleanup timed.
    let j = json_of(&bench(&small, dir.path())?)?;
    check_fileserver(&j);
    assert!(j["cleanup_secs"].as_f64().is_some());
    assert!(!root.exists(), "fileset not removed");
    Ok(())
}

#[test]
fn video_verifies_and_modifies_the_middle() -> R<()> {
    let dir = tempfile::tempdir()?;
    let bytes = 8u64 << 20;
    let args = ["video", "--bytes", "8M", "--rounds", "2", "--block", "1M"];
    let j = json_of(&bench(&args, dir.path())?)?;
    assert_eq!(j["verified"], Value::Bool(true), "{j}");
    assert_eq!(j["checksum_expected"], j["checksum_read_back"]);
    assert_eq!(j["rounds"].as_array().map_or(0, |r| r.len()), 2);
    assert!(j["total_secs"].as_f64().is_some_and(|s| s > 0.0));
    assert_eq!(
        std::fs::read_dir(dir.path())?.count(),
        0,
        "files not removed"
    );

    // --keep: video-1 differs from video-0 exactly in the centred 25% region.
    let kept = [
        &args[..],
        &["--keep", "--fsync", "--modify-percent", "25"][..],
    ]
    .concat();
    let j = json_of(&bench(&kept, dir.path())?)?;
    assert_eq!(j["verified"], Value::Bool(true), "{j}");
    let (off, len) = (u(&j["modify_offset_bytes"]), u(&j["modify_bytes"]));
    assert_eq!((off, len), ((bytes - bytes / 4) / 2, bytes / 4));
    let v0 = std::fs::read(dir.path().join("video-0"))?;
    let v1 = std::fs::read(dir.path().join("video-1"))?;
    assert_eq!(v0.len() as u64, bytes);
    assert_eq!(v1.len() as u64, bytes);
    for (i, (a, b)) in v0.iter().zip(&v1).enumerate() {
        let inside = (off..off + len).contains(&(i as u64));
        assert_eq!(a != b, inside, "byte {i}");
    }
    assert!(dir.path().join("video-2").exists());
    Ok(())
}
