//! The daemon is not in the data path (SPEC A3): SIGKILLs of the daemon, five in a row,
//! while a writer and a reader work in the directory make no call fail or hang, and lose
//! no acknowledged write; a new attach pins again what the page cache still holds without
//! reading the device (its read counter in /sys/dev/block), where the cold warm-up before
//! read all of it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod attach_common;
mod common;
use attach_common::*;
use common::*;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const RECORD: usize = 512;
/// How long the workers may take to finish once told to stop; beyond it they are hung.
const HANG_BOUND: Duration = Duration::from_secs(120);

/// Sectors read from the block device a file system is on (its /sys/dev/block stat).
fn sectors_read(dir: &Path) -> u64 {
    let dev = std::fs::metadata(dir).unwrap().dev();
    let stat = std::fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/stat",
        libc::major(dev),
        libc::minor(dev)
    ))
    .unwrap();
    stat.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn drop_cache(p: &Path) {
    let f = File::open(p).unwrap();
    // SAFETY: fadvise on a descriptor we hold; a hint only.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[test]
fn sigkills_of_the_daemon_under_load_fail_or_block_no_call_and_lose_no_write() {
    let s = Scratch::new("attach-kill");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..8 {
        std::fs::write(dir.join(format!("r{i}")), vec![i as u8; 1 << 20]).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let (done_tx, done_rx) = mpsc::channel::<Result<String, String>>();
    let mut a = Some(Attach::start(&dir, &["--durability", "sync"]));
    {
        let (dir, stop, written, tx) =
            (dir.clone(), stop.clone(), written.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let r = (|| -> Result<String, String> {
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("log"))
                    .map_err(|e| e.to_string())?;
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let mut rec = [0u8; RECORD];
                    rec[..8].copy_from_slice(&n.to_le_bytes());
                    use std::io::Write;
                    (&f).write_all(&rec)
                        .map_err(|e| format!("write {n}: {e}"))?;
                    n += 1;
                    written.store(n, Ordering::Release);
                    // New files too: a create, a write, a rename, in sync mode.
                    if n.is_multiple_of(50) {
                        let p = dir.join(format!("new{n}"));
                        std::fs::write(&p, b"x").map_err(|e| format!("create {n}: {e}"))?;
                        std::fs::rename(&p, dir.join(format!("kept{n}")))
                            .map_err(|e| format!("rename {n}: {e}"))?;
                    }
                }
                Ok(format!("writer: {n} records"))
            })();
            let _ = tx.send(r);
        });
    }
    {
        let (dir, stop, tx) = (dir.clone(), stop.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let r = (|| -> Result<String, String> {
                let mut reads = 0u64;
                let mut buf = vec![0u8; 4096];
                while !stop.load(Ordering::Acquire) {
                    let i = reads % 8;
                    let f = File::open(dir.join(format!("r{i}"))).map_err(|e| e.to_string())?;
                    f.read_exact_at(&mut buf, (reads * 4096) % (1 << 20))
                        .map_err(|e| format!("read {reads}: {e}"))?;
                    if buf.iter().any(|b| *b != i as u8) {
                        return Err(format!("r{i}: wrong bytes"));
                    }
                    reads += 1;
                }
                Ok(format!("reader: {reads} reads"))
            })();
            let _ = tx.send(r);
        });
    }
    drop(done_tx);
    for k in 0..5 {
        let before = written.load(Ordering::Acquire);
        while written.load(Ordering::Acquire) < before + 100 {
            std::thread::sleep(Duration::from_millis(5));
        }
        a.take().unwrap().kill9();
        // Writes go on with no daemon at all.
        let gone = written.load(Ordering::Acquire);
        while written.load(Ordering::Acquire) < gone + 100 {
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!(
            "kill {k}: {} records so far",
            written.load(Ordering::Acquire)
        );
        a = Some(Attach::start(&dir, &["--durability", "sync"]));
    }
    stop.store(true, Ordering::Release);
    for _ in 0..2 {
        match done_rx.recv_timeout(HANG_BOUND) {
            Ok(Ok(m)) => eprintln!("{m}"),
            Ok(Err(e)) => panic!("an application call failed: {e}"),
            Err(_) => panic!("an application call hung for {HANG_BOUND:?}"),
        }
    }
    let n = written.load(Ordering::Acquire);
    drop(a);
    // Every acknowledged record is on the disk: the disk is cut and mounted again.
    disk.cut();
    disk.remount();
    let log = std::fs::read(dir.join("log")).unwrap();
    assert!(
        log.len() as u64 >= n * RECORD as u64,
        "{} records of {n}",
        log.len() / RECORD
    );
    for (i, rec) in log.chunks(RECORD).take(n as usize).enumerate() {
        assert_eq!(u64::from_le_bytes(rec[..8].try_into().unwrap()), i as u64);
    }
}

#[test]
fn a_new_attach_pins_again_without_reading_the_device() {
    let s = Scratch::new("attach-repin");
    let disk = LoopFs::new(&s);
    let dir = disk.mnt.join("data");
    std::fs::create_dir(&dir).unwrap();
    let bytes: u64 = 24 << 20;
    for i in 0..6 {
        std::fs::write(
            dir.join(format!("f{i}")),
            vec![i as u8 + 1; (bytes / 6) as usize],
        )
        .unwrap();
    }
    let (ok, out) = sh(&format!("sync -f {}", dir.display()));
    assert!(ok, "{out}");
    for i in 0..6 {
        drop_cache(&dir.join(format!("f{i}")));
    }
    // Cold: the warm-up reads the data from the device.
    let r0 = sectors_read(&dir);
    let a = Attach::start(&dir, &["--durability", "fsync"]);
    let st = a.wait_warm();
    let cold = (sectors_read(&dir) - r0) * 512;
    assert!(
        cold >= bytes * 9 / 10,
        "the cold warm-up read {cold} of {bytes} bytes: {st}"
    );
    assert_eq!(st["ram"]["pinned_bytes"].as_u64(), Some(bytes), "{st}");
    a.kill9();
    // Warm: the pages outlived the daemon; pinning them again reads nothing.
    let r1 = sectors_read(&dir);
    let a = Attach::start(&dir, &["--durability", "fsync"]);
    let st = a.wait_warm();
    let warm = (sectors_read(&dir) - r1) * 512;
    assert_eq!(st["ram"]["pinned_bytes"].as_u64(), Some(bytes), "{st}");
    assert!(
        warm < bytes / 20,
        "re-attach read {warm} bytes of {bytes}: {st}"
    );
    assert_eq!(
        st["page_cache"]["cached_bytes"].as_u64(),
        Some(bytes),
        "{st}"
    );
    let (ok, out) = a.detach();
    assert!(ok, "{out}");
}
