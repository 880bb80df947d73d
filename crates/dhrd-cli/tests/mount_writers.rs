//! Concurrent writers through the mount reach the engine at once: N writers of one file
//! (the kernel sends their direct writes in parallel, FOPEN_PARALLEL_DIRECT_WRITES) are
//! all inside the daemon together, none waiting in the kernel's queue for a free FUSE
//! worker. The backing is an ext4 on a loop device that the test freezes (FIFREEZE via
//! `fsfreeze`): every write to it then blocks until the thaw, so the writes pile up in the
//! daemon and `dhrd status` counts how many got there (`in the daemon at once: at most N`), without any
//! timing. After the thaw every write is acknowledged, readable through the mount and on
//! the backing (C3: backing before the reply).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::freeze::{wait_for_writes_at_once, writes_at_once, Frozen};
use common::*;
use std::fs;
use std::os::unix::fs::FileExt;

/// More writers than the old default of 8 workers, fewer than a mount should serve.
const WRITERS: usize = 16;
const BLOCK_BYTES: usize = 4096;
fn pattern(writer: usize) -> Vec<u8> {
    vec![b'a' + (writer % 26) as u8; BLOCK_BYTES]
}

#[test]
fn sixteen_writers_of_one_file_are_in_the_daemon_at_once_on_the_engine() {
    let s = Scratch::new("writers-engine");
    let disk = LoopFs::new(&s);
    let backing = disk.mnt.join("backing");
    fs::create_dir_all(&backing).expect("backing");
    fs::write(backing.join("f"), vec![0u8; 1 << 20]).expect("f");
    let mnt = s.sub("mnt");
    let m = Mount::start(
        &backing,
        &mnt,
        &[
            "--quiet",
            "--read-path",
            "engine-direct",
            "--durability",
            "sync",
        ],
    );
    m.wait_loaded();
    // Opens (and the object's first write, which opens its O_DIRECT descriptor) before
    // the freeze: only the writes themselves are to wait on the frozen backing.
    let files: Vec<fs::File> = (0..WRITERS)
        .map(|_| {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.path("f"))
                .expect("open")
        })
        .collect();
    files[0]
        .write_all_at(&[1u8; BLOCK_BYTES], 0)
        .expect("first write");
    let before = writes_at_once(&m);
    assert_eq!(before, 1, "one write so far");

    let frozen = Frozen::new(&disk.mnt);
    // Disjoint 4 KiB blocks of one chunk: the engine's range locks let them all through.
    let writers: Vec<_> = files
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            std::thread::spawn(move || f.write_all_at(&pattern(i), ((i + 1) * BLOCK_BYTES) as u64))
        })
        .collect();
    let seen = wait_for_writes_at_once(&m, WRITERS as u64);
    drop(frozen);
    for w in writers {
        w.join().expect("writer").expect("write through the mount");
    }
    assert_eq!(
        seen, WRITERS as u64,
        "{seen} of {WRITERS} concurrent writes reached the daemon at once; the rest waited \
         in the kernel's queue for a FUSE worker"
    );

    let via_mount = fs::read(m.path("f")).expect("read through the mount");
    let on_backing = fs::read(backing.join("f")).expect("read the backing");
    for i in 0..WRITERS {
        let at = (i + 1) * BLOCK_BYTES;
        assert_eq!(
            &via_mount[at..at + BLOCK_BYTES],
            &pattern(i)[..],
            "writer {i} via mount"
        );
        assert_eq!(
            &on_backing[at..at + BLOCK_BYTES],
            &pattern(i)[..],
            "writer {i} on backing"
        );
    }
    assert!(m.umount().success(), "daemon exit");
}
