//! Read errors of the device under an attached directory, during the warm-up (a device
//! that fails reads on demand: `common::read_fault`). Expected: the daemon stays up and
//! keeps serving status, counts the failed reads and says so, reads each file again after
//! a delay (`READ_RETRIES_MAX`), and once the device reads again the files are warmed and
//! pinned, their contents intact. A file over 2 MiB is warmed through the populating
//! mapping in `fsync` mode, whose failed read is an `EFAULT` of `madvise`, never a SIGBUS;
//! a small one, and every file in `sync` mode, through `read(2)`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::read_fault::ReadFaultFs;
use common::*;

#[test]
fn reads_that_fail_during_the_warm_up_are_retried_and_the_files_pinned_once_the_device_reads() {
    for mode in ["fsync", "sync"] {
        let s = Scratch::new(&format!("attach-eio-{mode}"));
        let disk = ReadFaultFs::new(&s);
        let dir = disk.mnt.join("data");
        std::fs::create_dir(&dir).unwrap();
        let big: Vec<u8> = (0..(3u32 << 20) + 100).map(|i| (i % 251) as u8).collect();
        let small: Vec<u8> = (0..(64u32 << 10)).map(|i| (i % 241) as u8).collect();
        std::fs::write(dir.join("big"), &big).unwrap();
        std::fs::write(dir.join("small"), &small).unwrap();
        disk.uncache(&[&dir.join("big"), &dir.join("small")]);
        disk.fail_reads(true);
        let a = Attach::start(&dir, &["--durability", mode]);
        let st = a.wait_for("both files' reads failed", |s| {
            s["warmup"]["read_errors"].as_u64() >= Some(2)
        });
        assert_eq!(st["ram"]["pinned_files"], 0, "{mode}: {st}");
        assert_eq!(
            st["warmup"]["files_failed"], 0,
            "{mode}: retried, not given up: {st}"
        );
        let text = a.status_text();
        assert!(text.contains("failed reads"), "{mode}: {text}");
        disk.fail_reads(false);
        let st = a.wait_for("both files pinned after a retry", |s| {
            s["ram"]["pinned_files"] == 2 && s["warmup"]["complete"] == true
        });
        assert_eq!(st["warmup"]["files_failed"], 0, "{mode}: {st}");
        assert_eq!(
            st["ram"]["pinned_bytes"],
            (3 << 20) + (68 << 10),
            "{mode}: {st}"
        );
        assert!(
            std::fs::read(dir.join("big")).unwrap() == big,
            "{mode}: big"
        );
        assert!(
            std::fs::read(dir.join("small")).unwrap() == small,
            "{mode}: small"
        );
        let (ok, out) = a.detach();
        assert!(ok, "{mode}: {out}");
    }
}
