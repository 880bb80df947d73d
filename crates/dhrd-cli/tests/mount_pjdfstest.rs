//! pjdfstest on a dhrd mount gives ext4's own result: the mount (page cache read path, the
//! default; `sync` durability; `--allow-other`, since the suite switches to unprivileged
//! users) is made over a directory of a fresh ext4, and the same suite runs in a plain
//! directory of another fresh ext4. Without `--allow-other` the kernel refuses every
//! request of a process whose credentials are not the mounter's (fs/fuse's
//! `fuse_allow_current_process`) before the daemon or the permission check sees it, so the
//! 22 cases that act or stat as another user fail with EACCES; that is FUSE's rule for a
//! mount without the option, not a difference of the daemon's. Every case's outcome must be the same in both places,
//! except the differences listed in `EXPECTED_DIFFERENCES` with the reason each cannot be
//! removed; those are printed, and any other difference fails the test.
//!
//! pjdfstest is the Rust form of the suite from crates.io (scripts/install-deps.sh installs
//! it). Needs root, /dev/fuse, loop devices and mkfs.ext4.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;

/// Cases whose outcome on the mount is known to differ from ext4: the case, its outcome on
/// the mount, and the reason the difference cannot be removed in the daemon. The same case
/// with another outcome is an unexpected difference.
const EXPECTED_DIFFERENCES: &[(&str, &str, &str)] = &[(
    // The link limit itself is ext4's (the daemon makes every link on the backing), but
    // glibc's pathconf(_PC_LINK_MAX) knows a limit only by the statfs magic number, and the
    // kernel reports FUSE_SUPER_MAGIC for every FUSE mount whatever the daemon answers; for
    // an unknown magic glibc says 127 (LINUX_LINK_MAX), which the suite takes for "limit
    // unknown" and skips the case.
    "link::link_count_max",
    "skipped",
    "pathconf(_PC_LINK_MAX) cannot know the limit of a FUSE mount",
)];

#[test]
fn pjdfstest_on_a_mount_matches_plain_ext4() {
    let s = Scratch::new("mount-pjd-plain");
    let plain_fs = LoopFs::new(&s);
    let plain = plain_fs.mnt.join("plain");
    std::fs::create_dir(&plain).unwrap();
    let reference = pjdfstest::outcomes(&plain);
    assert!(
        reference.values().any(|o| o == "ok"),
        "nothing passed on plain ext4"
    );

    let s2 = Scratch::new("mount-pjd-mounted");
    let disk = LoopFs::new(&s2);
    let backing = disk.mnt.join("backing");
    std::fs::create_dir(&backing).unwrap();
    let mnt = s2.sub("mnt");
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--allow-other", "--durability", "sync"],
    );
    assert!(m.status().contains("page cache"), "{}", m.status());
    let dir = mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let mounted = pjdfstest::outcomes(&dir);
    drop(m);

    for (place, cases) in [("ext4", &reference), ("mount", &mounted)] {
        let n = |o: &str| cases.values().filter(|v| *v == o).count();
        println!(
            "{place}: {} ok, {} FAILED, {} skipped",
            n("ok"),
            n("FAILED"),
            n("skipped")
        );
    }
    let diff = pjdfstest::differences(&mounted, &reference);
    let (expected, unexpected): (Vec<&String>, Vec<&String>) = diff.iter().partition(|d| {
        EXPECTED_DIFFERENCES.iter().any(|(case, outcome, _)| {
            case_of(d) == *case && mounted.get(*case).map(String::as_str) == Some(*outcome)
        })
    });
    for (case, outcome, why) in EXPECTED_DIFFERENCES {
        let seen = expected.iter().any(|d| case_of(d) == *case);
        println!(
            "expected difference ({}): {case} {outcome} on the mount: {why}",
            if seen { "seen" } else { "not seen" }
        );
    }
    assert!(
        unexpected.is_empty(),
        "pjdfstest differs on the mount ({} cases):\n{}",
        unexpected.len(),
        unexpected
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The case a line of `pjdfstest::differences` is about.
fn case_of(difference: &str) -> &str {
    difference
        .split_once(": ")
        .map_or(difference, |(case, _)| case)
}
