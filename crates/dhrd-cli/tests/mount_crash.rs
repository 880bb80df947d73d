//! Crash test: writers do sync-mode writes of self-verifying records through the mount
//! (appends to per-round files they create, and random overwrites of a large file that is
//! still loading); the daemon is SIGKILLed at random moments, also right after the mount
//! while the initial load runs; after a remount every acknowledged record must be intact.
//! 20 rounds by default, 100 with DHRD_SOAK=1, on the page cache path and on the engine.
//!
//! On the page cache path, files already open keep working after the daemon died: the
//! kernel serves their reads and writes from the backing file, and the backing inode's
//! sync flag keeps every such write durable. The writers therefore stop when told to, not
//! when a write fails, and what they wrote after the kill counts as acknowledged too.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Log records: unaligned, so they take the buffered write + fdatasync path.
const REC: usize = 512;
/// Big-file records: block-aligned, so they take the O_DIRECT|O_DSYNC path.
const BIG_REC: usize = 4096;
const MAGIC: u64 = 0x4448_5244_5245_4331; // "DHRDREC1"
const BIG_BYTES: u64 = 64 << 20;
const WRITERS: u64 = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Id {
    round: u64,
    thread: u64,
    seq: u64,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn record(id: Id) -> Vec<u8> {
    record_len(id, REC)
}

fn record_len(id: Id, len: usize) -> Vec<u8> {
    let mut r = vec![0u8; len];
    let words = [MAGIC, id.round, id.thread, id.seq];
    for (i, w) in words.iter().enumerate() {
        r[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let mut h = mix(id.round ^ (id.thread << 20) ^ (id.seq << 32));
    for chunk in r[32..len - 8].chunks_mut(8) {
        h = mix(h);
        chunk.copy_from_slice(&h.to_le_bytes()[..chunk.len()]);
    }
    let sum = r[..len - 8]
        .iter()
        .fold(0u64, |a, b| mix(a ^ u64::from(*b)));
    r[len - 8..].copy_from_slice(&sum.to_le_bytes());
    r
}

#[derive(Default)]
struct Acked {
    /// Per (round, thread): number of records acknowledged in its log file.
    logs: HashMap<(u64, u64), u64>,
    /// Big-file slot -> allowed contents: the last acknowledged record, plus a write that
    /// was in flight when the daemon died (it may or may not have landed).
    slots: HashMap<u64, Vec<Option<Id>>>,
}

fn log_name(round: u64, thread: u64) -> String {
    format!("log-{round}-{thread}")
}

fn writer(mnt: &Path, round: u64, thread: u64, acked: Arc<Mutex<Acked>>, stop: Arc<AtomicBool>) {
    let Ok(log) = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mnt.join(log_name(round, thread)))
    else {
        return;
    };
    acked.lock().unwrap().logs.insert((round, thread), 0);
    let Ok(big) = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("big"))
    else {
        return;
    };
    let mut rng = Rng(mix(round * 1000 + thread + 1));
    for seq in 0.. {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let id = Id { round, thread, seq };
        if seq % 2 == 0 {
            let rec = record(id);
            if log.write_all_at(&rec, seq / 2 * REC as u64).is_err() {
                return;
            }
            acked
                .lock()
                .unwrap()
                .logs
                .insert((round, thread), seq / 2 + 1);
        } else {
            let rec = record_len(id, BIG_REC);
            let slot = rng.below(BIG_BYTES / BIG_REC as u64);
            {
                let mut a = acked.lock().unwrap();
                let e = a.slots.entry(slot).or_insert_with(|| vec![None]);
                e.push(Some(id));
            }
            let ok = big.write_all_at(&rec, slot * BIG_REC as u64).is_ok();
            let mut a = acked.lock().unwrap();
            if ok {
                // Acknowledged: from now on only this record is allowed in the slot.
                a.slots.insert(slot, vec![Some(id)]);
            } else {
                return;
            }
        }
    }
}

fn verify(mnt: &Path, acked: &Acked) -> usize {
    let mut checked = 0;
    for (&(round, thread), &n) in &acked.logs {
        let data = fs::read(mnt.join(log_name(round, thread)))
            .unwrap_or_else(|e| panic!("acknowledged file {} lost: {e}", log_name(round, thread)));
        assert!(
            data.len() as u64 >= n * REC as u64,
            "log {round}/{thread}: {} bytes < {n} records",
            data.len()
        );
        for i in 0..n {
            let want = record(Id {
                round,
                thread,
                seq: i * 2,
            });
            let got = &data[(i as usize) * REC..(i as usize + 1) * REC];
            assert!(
                got == want.as_slice(),
                "log {round}/{thread} record {i} damaged"
            );
            checked += 1;
        }
    }
    let big = OpenOptions::new()
        .read(true)
        .open(mnt.join("big"))
        .expect("big");
    let mut buf = vec![0u8; BIG_REC];
    for (&slot, allowed) in &acked.slots {
        big.read_exact_at(&mut buf, slot * BIG_REC as u64)
            .expect("read slot");
        let ok = allowed.iter().any(|a| match a {
            None => buf.iter().all(|b| *b == 0),
            Some(id) => buf == record_len(*id, BIG_REC),
        });
        assert!(ok, "big slot {slot}: content matches none of {allowed:?}");
        checked += 1;
    }
    checked
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write() {
    sigkill_rounds("pagecache");
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write_on_the_engine() {
    sigkill_rounds("engine-direct");
}

fn sigkill_rounds(read_path: &str) {
    let rounds: u64 = if std::env::var("DHRD_SOAK").is_ok() {
        100
    } else {
        20
    };
    let s = Scratch::new(&format!("crash-{read_path}"));
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    {
        let f = fs::File::create(backing.join("big")).expect("big");
        f.set_len(BIG_BYTES).expect("len");
        // Real blocks, so the loader has work to do.
        for i in 0..(BIG_BYTES / (1 << 20)) {
            f.write_all_at(&vec![0u8; 1 << 20], i << 20).expect("fill");
        }
        f.sync_all().expect("sync");
    }
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut rng = Rng(42);
    let mut total_checked = 0;
    for round in 0..rounds {
        // Slow loader: the kill often lands while `big` is still loading.
        let m = Mount::start(
            &backing,
            &mnt,
            &["--quiet", "--load-rate", "64M", "--read-path", read_path],
        );
        total_checked += verify(&mnt, &acked.lock().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..WRITERS)
            .map(|t| {
                let (mnt, acked, stop) = (mnt.clone(), acked.clone(), stop.clone());
                std::thread::spawn(move || writer(&mnt, round, t, acked, stop))
            })
            .collect();
        // A third of the rounds die within the first 50 ms (during the load).
        let wait = if round % 3 == 0 {
            rng.below(50)
        } else {
            rng.below(400)
        };
        std::thread::sleep(Duration::from_millis(wait));
        // Writers finish (ENOTCONN on the engine; told to on the page cache path) on the
        // dead mount before it is removed, so none of them creates a file in the bare
        // mountpoint directory.
        let dead = m.kill9_keep_mount();
        std::thread::sleep(Duration::from_millis(rng.below(20)));
        stop.store(true, Ordering::Release);
        for h in handles {
            h.join().expect("writer thread");
        }
        force_unmount(&dead);
    }
    let m = Mount::start(&backing, &mnt, &["--quiet", "--read-path", read_path]);
    total_checked += verify(&mnt, &acked.lock().unwrap());
    drop(m);
    let a = acked.lock().unwrap();
    let recs: u64 = a.logs.values().sum();
    eprintln!(
        "{read_path}: {rounds} rounds, {recs} acknowledged log records, {} big slots, {total_checked} checks",
        a.slots.len()
    );
    assert!(
        recs > rounds,
        "writers made too little progress to test anything"
    );
}
