//! Power cuts under an attached directory: threads create files with data, overwrite,
//! rename and unlink them, and make directories, in DIR, while the ext4 under it is shut
//! down without flushing its journal and its image copied as the device holds it (the
//! power cut of `LoopFs::cut`). After the image is mounted again, in `sync` mode every
//! acknowledged create, rename, unlink and write is there, both where DIR is the root of
//! its file system (dhrd mounts it `sync`) and where it is a subdirectory (inode flags);
//! the same storm in `fsync` mode loses acknowledged changes (the control, which shows the
//! check can fail). In `periodic` mode the storm's changes are all there once a period
//! that began after them has completed, and some are lost after the same wait with a
//! period that never ends (its control).
//!
//! An operation counts as acknowledged only if it returned before the cut began: ext4
//! ignores the result of the synchronous journal commit in some calls (rmdir's
//! `ext4_journal_stop`), so a call whose commit the shutdown aborted may still return 0,
//! after the cut; at a real power cut no call returns after it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const THREADS: usize = 4;
const BLOCK: usize = 4096;

/// What a name must be after the cut: absent, or present with one of the allowed contents
/// (tags; a write in flight allows the old and the new), or either (in flight).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    Present(BTreeSet<u8>),
    Dir,
    Absent,
    Either,
}

type Model = BTreeMap<String, Want>;

fn storm(root: &Path, t: usize, model: Arc<Mutex<Model>>, stop: Arc<AtomicBool>) {
    // `stop` is set before the cut: a call that returns after that is not acknowledged.
    let dir = format!("t{t}");
    let mut rng = Rng(t as u64 + 7);
    let mut live: Vec<(String, bool)> = Vec::new();
    let set = |n: &str, w: Want| {
        model.lock().unwrap().insert(n.to_string(), w);
    };
    let get = |n: &str| model.lock().unwrap().get(n).cloned();
    for i in 0u64.. {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let tag = (i % 250) as u8 + 1;
        let op = rng.below(4);
        if op == 0 || live.len() < 3 {
            let name = format!("{dir}/f{i}");
            set(&name, Want::Either);
            let is_dir = i.is_multiple_of(7);
            let r = if is_dir {
                fs::create_dir(root.join(&name))
            } else {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(root.join(&name))
                    .and_then(|f| f.write_all_at(&[tag; BLOCK], 0))
            };
            if r.is_err() || stop.load(Ordering::Acquire) {
                return;
            }
            set(
                &name,
                if is_dir {
                    Want::Dir
                } else {
                    Want::Present([tag].into())
                },
            );
            live.push((name, is_dir));
        } else {
            let k = rng.below(live.len() as u64) as usize;
            let (name, is_dir) = live[k].clone();
            match op {
                1 => {
                    let to = format!("{name}-r{i}");
                    let was = get(&name).unwrap_or(Want::Either);
                    set(&name, Want::Either);
                    set(&to, Want::Either);
                    if fs::rename(root.join(&name), root.join(&to)).is_err()
                        || stop.load(Ordering::Acquire)
                    {
                        return;
                    }
                    set(&name, Want::Absent);
                    set(&to, was);
                    live[k] = (to, is_dir);
                }
                2 => {
                    live.swap_remove(k);
                    set(&name, Want::Either);
                    let p = root.join(&name);
                    let r = if is_dir {
                        fs::remove_dir(&p)
                    } else {
                        fs::remove_file(&p)
                    };
                    if r.is_err() || stop.load(Ordering::Acquire) {
                        return;
                    }
                    set(&name, Want::Absent);
                }
                _ if !is_dir => {
                    let Some(Want::Present(mut old)) = get(&name) else {
                        continue;
                    };
                    old.insert(tag);
                    set(&name, Want::Present(old));
                    let r = fs::OpenOptions::new()
                        .write(true)
                        .open(root.join(&name))
                        .and_then(|f| f.write_all_at(&[tag; BLOCK], 0));
                    if r.is_err() || stop.load(Ordering::Acquire) {
                        return;
                    }
                    set(&name, Want::Present([tag].into()));
                }
                _ => {}
            }
        }
    }
}

/// What happens between the end of the storm and the cut.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settle {
    /// The cut comes while the threads' last calls are in flight.
    Nothing,
    /// The threads are joined, then two periodic syncs complete (the second began after
    /// every acknowledged call).
    TwoPeriods,
    /// The threads are joined, then this many seconds pass with no sync.
    Seconds(u64),
}

/// Runs the storm in `sub` (a path inside the loop file system, "" for its root) attached
/// with `durability`, settles, cuts the power, mounts the image again; returns what was
/// lost and how many names were checked.
fn storm_and_cut(tag: &str, sub: &str, durability: &str, settle: Settle) -> (Vec<String>, usize) {
    let s = Scratch::new(&format!("attach-cut-{tag}"));
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join(sub);
    for t in 0..THREADS {
        fs::create_dir_all(dir.join(format!("t{t}"))).unwrap();
    }
    let (ok, out) = sh(&format!("sync -f {}", dir.display()));
    assert!(ok, "{out}");
    let a = Attach::start(&dir, &["--durability", durability]);
    let model = Arc::new(Mutex::new(Model::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (dir, model, stop) = (dir.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || storm(&dir, t, model, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Release);
    let syncs = |s: &serde_json::Value| s["periodic_syncs"].as_u64();
    match settle {
        Settle::Nothing => disk.cut(),
        Settle::TwoPeriods | Settle::Seconds(_) => {
            for t in threads.drain(..) {
                t.join().unwrap();
            }
            let before = syncs(&a.status_json()).expect("periodic_syncs in the status");
            if let Settle::Seconds(n) = settle {
                std::thread::sleep(Duration::from_secs(n));
                assert_eq!(syncs(&a.status_json()), Some(before), "a sync ran");
            } else {
                a.wait_for("two more periodic syncs", |s| {
                    syncs(s).is_some_and(|n| n >= before + 2)
                });
            }
            disk.cut();
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    a.kill9();
    disk.remount();
    let model = model.lock().unwrap();
    let mut lost = Vec::new();
    for (name, want) in model.iter() {
        let p = dir.join(name);
        let ok = match want {
            Want::Either => true,
            Want::Absent => fs::symlink_metadata(&p).is_err(),
            Want::Dir => p.is_dir(),
            Want::Present(tags) => fs::File::open(&p).is_ok_and(|f| {
                let mut b = [0u8; BLOCK];
                f.read_exact_at(&mut b, 0).is_ok()
                    && tags.contains(&b[0])
                    && b.iter().all(|x| *x == b[0])
            }),
        };
        if !ok {
            lost.push(format!("{name}: want {want:?}"));
        }
    }
    (lost, model.len())
}

#[test]
fn sync_at_a_file_system_root_keeps_every_acknowledged_change_across_a_power_cut() {
    let (lost, checked) = storm_and_cut("root", "", "sync", Settle::Nothing);
    eprintln!("root, sync: {checked} names checked");
    assert!(
        checked > 30,
        "the storm did too little to test anything: {checked}"
    );
    assert!(lost.is_empty(), "acknowledged changes lost: {lost:?}");
}

#[test]
fn sync_in_a_subdirectory_keeps_every_acknowledged_change_across_a_power_cut() {
    let (lost, checked) = storm_and_cut("sub", "data", "sync", Settle::Nothing);
    eprintln!("subdirectory, sync: {checked} names checked");
    assert!(
        checked > 30,
        "the storm did too little to test anything: {checked}"
    );
    assert!(lost.is_empty(), "acknowledged changes lost: {lost:?}");
}

/// The control: in `fsync` mode nothing is durable before an fsync, and the cut loses
/// acknowledged changes.
#[test]
fn fsync_mode_loses_acknowledged_changes_at_a_power_cut() {
    let (lost, checked) = storm_and_cut("fsync", "", "fsync", Settle::Nothing);
    eprintln!("fsync: {checked} names checked, {} lost", lost.len());
    assert!(
        !lost.is_empty(),
        "fsync mode lost nothing: the cut did not bite"
    );
}

/// `periodic:1`: once a period that began after the storm's last acknowledged call has
/// completed, every change is there, with no sync call from the threads.
#[test]
fn periodic_mode_keeps_every_change_a_completed_period_covered() {
    let (lost, checked) = storm_and_cut("periodic", "", "periodic:1", Settle::TwoPeriods);
    eprintln!("periodic:1: {checked} names checked");
    assert!(
        checked > 30,
        "the storm did too little to test anything: {checked}"
    );
    assert!(
        lost.is_empty(),
        "changes a completed period covered lost: {lost:?}"
    );
}

/// The control of the test above: the same wait with a period that never ends loses
/// changes, so the wait alone (the file system's own writeback) did not keep them.
#[test]
fn periodic_mode_loses_changes_no_period_covered() {
    let (lost, checked) = storm_and_cut("periodic-none", "", "periodic:3600", Settle::Seconds(3));
    eprintln!(
        "periodic:3600: {checked} names checked, {} lost",
        lost.len()
    );
    assert!(
        !lost.is_empty(),
        "nothing lost with no period completed: the cut did not bite"
    );
}
