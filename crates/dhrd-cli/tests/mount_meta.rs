//! Metadata durability in `sync` mode, checked against a power cut: the backing directory
//! lives on an ext4 file system on a loop device, and while threads create, rename and
//! unlink files and directories through the mount, the test shuts that file system down
//! without flushing its journal (`EXT4_IOC_SHUTDOWN`, NOLOGFLUSH): whatever the journal had
//! not committed is lost, as at a power cut. After the image is mounted again, every
//! acknowledged create, rename and unlink must be there, and nothing acknowledged as
//! removed may reappear. The same storm in `fsync` mode loses acknowledged changes, which
//! shows the check can fail. (A SIGKILL of the daemon alone cannot lose what the backing
//! file system's kernel already has; the power cut is the stronger test, and the daemon
//! is killed after it too.)
//!
//! An application's fsync on that journalled backing writes its file's pages, though the
//! committer makes metadata durable with one journal commit per round.
//!
//! And no head-of-line blocking: with every metadata sync stalled (fault injection), more
//! creates than the daemon has workers wait for their syncs while lookups and statfs
//! still complete.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const THREADS: usize = 4;

/// What a name must be after the power cut: present or absent, or either (an operation
/// on it was in flight and never acknowledged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Present,
    Absent,
    Either,
}

/// The names each thread works on, and what was acknowledged about them.
#[derive(Default)]
struct Model {
    names: BTreeMap<String, Want>,
}

impl Model {
    fn set(&mut self, name: &str, w: Want) {
        self.names.insert(name.to_string(), w);
    }
}

/// One thread's storm in its own directory: create, then rename or unlink, at random.
fn storm(root: &Path, t: usize, model: Arc<Mutex<Model>>, stop: Arc<AtomicBool>) {
    let dir = format!("t{t}");
    let mut rng = Rng(t as u64 + 1);
    let mut live: Vec<String> = Vec::new();
    for i in 0.. {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let op = rng.below(3);
        if op == 0 || live.len() < 3 {
            let name = format!("{dir}/f{i}");
            model.lock().unwrap().set(&name, Want::Either);
            let r = if i % 5 == 0 {
                fs::create_dir(root.join(&name))
            } else {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(root.join(&name))
                    .map(|_| ())
            };
            if r.is_err() {
                return;
            }
            model.lock().unwrap().set(&name, Want::Present);
            live.push(name);
        } else {
            let k = rng.below(live.len() as u64) as usize;
            let name = live.swap_remove(k);
            if op == 1 {
                let to = format!("{name}-r{i}");
                {
                    let mut m = model.lock().unwrap();
                    m.set(&name, Want::Either);
                    m.set(&to, Want::Either);
                }
                if fs::rename(root.join(&name), root.join(&to)).is_err() {
                    return;
                }
                let mut m = model.lock().unwrap();
                m.set(&name, Want::Absent);
                m.set(&to, Want::Present);
                live.push(to);
            } else {
                model.lock().unwrap().set(&name, Want::Either);
                let p = root.join(&name);
                let r = if p.is_dir() {
                    fs::remove_dir(&p)
                } else {
                    fs::remove_file(&p)
                };
                if r.is_err() {
                    return;
                }
                model.lock().unwrap().set(&name, Want::Absent);
            }
        }
    }
}

/// Runs the storm on `durability`, cuts the power, mounts the image again; returns the
/// names whose acknowledged state was lost, and how many were checked.
fn storm_and_cut(durability: &str) -> (Vec<String>, usize) {
    let s = Scratch::new(&format!("meta-{durability}"));
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    for t in 0..THREADS {
        fs::create_dir_all(backing.join(format!("t{t}"))).unwrap();
    }
    // The directories themselves are durable before the storm.
    let (ok, out) = sh(&format!("sync -f {}", backing.display()));
    assert!(ok, "{out}");
    let mnt = s.sub("mnt");
    let m = Mount::start(
        &backing,
        &mnt,
        &["--quiet", "--no-preload", "--durability", durability],
    );
    let model = Arc::new(Mutex::new(Model::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (mnt, model, stop) = (mnt.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || storm(&mnt, t, model, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    // The power cut: the storm is running; what the journal had not committed is gone.
    disk.shut_down();
    stop.store(true, Ordering::Release);
    for t in threads {
        t.join().unwrap();
    }
    m.kill9();
    disk.remount();
    let model = model.lock().unwrap();
    let mut lost = Vec::new();
    for (name, want) in &model.names {
        let present = fs::symlink_metadata(backing.join(name)).is_ok();
        let ok = match want {
            Want::Present => present,
            Want::Absent => !present,
            Want::Either => true,
        };
        if !ok {
            lost.push(format!("{name}: want {want:?}"));
        }
    }
    (lost, model.names.len())
}

#[test]
fn acknowledged_metadata_changes_survive_a_power_cut() {
    let (lost, checked) = storm_and_cut("sync");
    eprintln!("sync: {checked} names checked");
    assert!(
        checked > 50,
        "the storm did too little to test anything: {checked}"
    );
    assert!(lost.is_empty(), "acknowledged changes lost: {lost:?}");
}

/// The control: without syncs the same cut loses acknowledged changes, so the check above
/// is able to fail.
#[test]
fn without_sync_mode_the_cut_loses_acknowledged_changes() {
    let (lost, checked) = storm_and_cut("fsync");
    eprintln!("fsync: {checked} names checked, {} lost", lost.len());
    assert!(
        !lost.is_empty(),
        "fsync mode lost nothing: the cut did not bite"
    );
}

/// On a journalled backing the committer makes a round durable with one journal commit,
/// which writes no file's pages: an application's fsync must still write its file (here
/// stores into a shared mapping, which only the page cache holds until then).
#[test]
fn an_fsync_writes_its_file_where_rounds_are_journal_commits() {
    use dhrd_pagecache as pagecache;
    use std::os::fd::AsFd;
    let s = Scratch::new("meta-fsync-data");
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).unwrap();
    let len = 64 << 10;
    fs::write(backing.join("f"), vec![0u8; len]).unwrap();
    let mnt = s.sub("mnt");
    let m = Mount::start(&backing, &mnt, &["--quiet", "--no-preload"]);
    assert!(
        m.status().contains("one journal commit per round"),
        "not the journal-commit policy: {}",
        m.status()
    );
    // A metadata change in the same round as the fsync below is likely: a create.
    fs::write(m.path("g"), b"g").unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    let map = SharedMap::new(&f, len);
    map.fill(4096, 0x3C, 8192);
    f.sync_all().unwrap();
    let b = fs::File::open(backing.join("f")).unwrap();
    let (c, src) = pagecache::cachestat(b.as_fd(), 0, 0).unwrap();
    if src == pagecache::CacheStatSource::Cachestat {
        assert_eq!(c.dirty_pages + c.writeback_pages, 0, "after fsync: {c:?}");
    } else {
        dhrd_testkit::skip("no cachestat(2) (Linux 6.5): dirty pages after fsync");
    }
    drop(b);
    drop(map);
    drop(f);
    // Gone with the disk: what the fsync wrote must be on the image.
    disk.shut_down();
    m.kill9();
    disk.remount();
    let got = fs::read(backing.join("f")).unwrap();
    assert!(
        got[4096..4096 + 8192].iter().all(|b| *b == 0x3C),
        "lost the stores"
    );
}

/// The daemon's FUSE worker threads by default (dhrd_fuse::daemon::FUSE_THREADS_DEFAULT).
const WORKERS: usize = 8;

#[test]
fn lookups_complete_while_metadata_syncs_are_stalled() {
    let s = Scratch::new("meta-stall");
    let backing = s.sub("backing");
    for i in 0..WORKERS + 4 {
        fs::create_dir_all(backing.join(format!("d{i}"))).unwrap();
    }
    fs::create_dir_all(backing.join("e")).unwrap();
    fs::write(backing.join("e/present"), b"x").unwrap();
    let gate = s.0.join("stall");
    fs::write(&gate, b"").unwrap();
    let mnt = s.sub("mnt");
    let m = Mount::start_env(
        &backing,
        &mnt,
        &["--quiet", "--no-preload", "--durability", "sync"],
        &[("DHRD_FAULT_SYNC_STALL_FILE", gate.to_str().unwrap())],
    );
    // More creates than workers, each in a directory of its own (the kernel lets one
    // create at a time into a directory): with syncs held on the workers, every worker
    // would now be stuck and nothing else could be served.
    let done = Arc::new(AtomicUsize::new(0));
    let creators: Vec<_> = (0..WORKERS + 4)
        .map(|i| {
            let (p, done) = (m.path(&format!("d{i}/new")), done.clone());
            std::thread::spawn(move || {
                fs::write(&p, b"y").unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    // Requests that need the daemon: lookups of names that do not exist (a negative
    // lookup is not cached), of a present file, and statfs. In another directory: the
    // kernel holds a directory's lock while a create in it waits for its reply, so
    // lookups there wait for the create whatever the daemon does (as on ext4 mounted
    // dirsync).
    // They run in a thread so a regression fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let root = mnt.clone();
    std::thread::spawn(move || {
        for i in 0..50 {
            assert!(fs::symlink_metadata(root.join(format!("e/missing{i}"))).is_err());
        }
        assert!(fs::symlink_metadata(root.join("e/present")).is_ok());
        let (ok, out) = sh(&format!("stat -f {} >/dev/null", root.display()));
        assert!(ok, "{out}");
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("lookups and statfs did not complete while syncs were stalled");
    assert_eq!(
        done.load(Ordering::SeqCst),
        0,
        "a create was acknowledged before its sync"
    );
    fs::remove_file(&gate).unwrap();
    for c in creators {
        c.join().unwrap();
    }
    for i in 0..WORKERS + 4 {
        assert_eq!(fs::read(backing.join(format!("d{i}/new"))).unwrap(), b"y");
    }
    drop(m);
}
