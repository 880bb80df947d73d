//! Tests of the warm-up and pinning: budgets, demand before the walk, refresh, the
//! bounded queues, and completion.

use super::state::{page_ceil, Entry};
use super::*;
use dhrd_io::RamBudget;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct DirOpener(PathBuf);
impl Opener for DirOpener {
    fn open(&self, f: &FileRef) -> io::Result<File> {
        File::open(self.0.join(&f.path))
    }
}

fn make(dir: &Path, name: &str, len: usize) -> (FileRef, u64) {
    let p = dir.join(name);
    let mut f = File::create(&p).expect("create");
    f.write_all(&vec![1u8; len]).expect("write");
    f.sync_all().expect("sync");
    // Out of the cache, so the warm-up has something to do.
    let r = File::open(&p).expect("open");
    // SAFETY: fadvise on a descriptor we hold; a hint only.
    unsafe { libc::posix_fadvise(r.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let key = r
        .metadata()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .expect("ino");
    (
        FileRef {
            key,
            path: PathBuf::from(name),
        },
        len as u64,
    )
}

/// The defaults, with a refresh delay short enough for tests that wait for it.
fn quick() -> ResidentConfig {
    ResidentConfig {
        refresh_delay: Duration::from_millis(50),
        ..ResidentConfig::default()
    }
}

fn resident(dir: &Path, budget: u64, cfg: ResidentConfig) -> Resident {
    Resident::new(
        cfg,
        RamBudget::new(budget),
        Arc::new(DirOpener(dir.to_path_buf())),
    )
    .expect("resident")
}

#[test]
fn walked_files_are_warmed_and_pinned_within_the_budget() {
    let d = tempfile::tempdir().expect("tempdir");
    let r = resident(d.path(), 1 << 30, quick());
    let mut total = 0;
    for i in 0..5 {
        let (f, len) = make(d.path(), &format!("f{i}"), 100_000 + i * 4096);
        total += page_ceil(len);
        r.submit_walked(f, len);
    }
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    let s = r.stats();
    assert_eq!(
        (s.files_seen, s.files_warmed, s.files_failed),
        (5, 5, 0),
        "{s:?}"
    );
    assert_eq!(r.budget().used_bytes(), total);
    if s.pin_error.is_none() {
        assert_eq!((s.files_pinned, s.bytes_pinned), (5, total), "{s:?}");
    }
    for i in 0..5 {
        let f = File::open(d.path().join(format!("f{i}"))).expect("open");
        let len = f.metadata().expect("meta").len();
        assert_eq!(cached_bytes(&f).expect("cachestat"), page_ceil(len));
    }
    drop(r);
}

#[test]
fn the_budget_bounds_what_is_read_and_forget_gives_it_back() {
    let d = tempfile::tempdir().expect("tempdir");
    let r = resident(d.path(), 64 << 10, quick());
    let (a, alen) = make(d.path(), "a", 40 << 10);
    let (b, blen) = make(d.path(), "b", 40 << 10);
    let (akey, bkey) = (a.key, b.key);
    r.submit_walked(a, alen);
    r.submit_walked(b, blen);
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    let s = r.stats();
    assert_eq!(r.budget().used_bytes(), 64 << 10, "{s:?}");
    assert_eq!(s.files_over_budget, 1, "{s:?}");
    assert_eq!(s.bytes_over_budget, 16 << 10, "{s:?}");
    let fb = File::open(d.path().join("b")).expect("open");
    // The prefix at least (the kernel's readahead may bring a little more).
    assert!(cached_bytes(&fb).expect("cachestat") >= 24 << 10);
    r.forget(akey);
    r.forget(bkey);
    assert_eq!(r.budget().used_bytes(), 0);
    assert_eq!(r.stats().files_pinned, 0);
}

#[test]
fn demand_goes_first_and_refresh_follows_growth() {
    let d = tempfile::tempdir().expect("tempdir");
    let r = resident(d.path(), 1 << 30, quick());
    let (f, _) = make(d.path(), "g", 8192);
    let mut w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.path().join("g"))
        .expect("open");
    r.demand(f.key, &w);
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.stats().files_demanded, 1);
    assert_eq!(r.budget().used_bytes(), 8192);
    // The walk reaching it later reads nothing again.
    r.submit_walked(f.clone(), 8192);
    assert_eq!(r.stats().files_seen, 1);
    w.write_all_at(&[2u8; 20000], 8192).expect("grow");
    r.refresh(f.key, &w);
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.budget().used_bytes(), page_ceil(28192));
    w.set_len(100).expect("shrink");
    r.refresh(f.key, &w);
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.budget().used_bytes(), 4096);
    let _ = w.flush();
}

/// A file opened empty (a create) is recorded at once, with no worker involved, and
/// warmed and pinned once it has grown.
#[test]
fn an_empty_file_is_done_at_once_and_warmed_when_it_grows() {
    let d = tempfile::tempdir().expect("tempdir");
    let r = resident(d.path(), 1 << 30, quick());
    let (f, _) = make(d.path(), "e", 0);
    let w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.path().join("e"))
        .expect("open");
    r.demand(f.key, &w);
    // Nothing was queued: the entry is done before any worker could have run.
    assert_eq!(r.inner.q.lock().demand.len(), 0);
    assert!(matches!(
        r.inner.q.lock().entries.get(&f.key),
        Some(Entry::Done { reserved: 0, .. })
    ));
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.stats().files_demanded, 1);
    w.write_all_at(&[3u8; 12288], 0).expect("grow");
    r.refresh(f.key, &w);
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.budget().used_bytes(), 12288);
    assert_eq!(cached_bytes(&w).expect("cachestat"), 12288);
}

/// A file that changed size gives back its pin at once and is warmed again only after
/// the delay; a file removed meanwhile is never pinned again.
#[test]
fn a_changed_file_is_pinned_again_after_the_delay_unless_removed() {
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = ResidentConfig {
        refresh_delay: Duration::from_millis(400),
        ..ResidentConfig::default()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    let (a, _) = make(d.path(), "a", 8192);
    let (b, _) = make(d.path(), "b", 8192);
    let open = |n: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.path().join(n))
            .expect("open")
    };
    let (wa, wb) = (open("a"), open("b"));
    r.demand(a.key, &wa);
    r.demand(b.key, &wb);
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.budget().used_bytes(), 16384);
    wa.write_all_at(&[5u8; 4096], 8192).expect("grow a");
    wb.write_all_at(&[5u8; 4096], 8192).expect("grow b");
    let t = Instant::now();
    r.refresh(a.key, &wa);
    r.refresh(b.key, &wb);
    // Both reservations came back at once; nothing is warmed before the delay.
    assert_eq!(r.budget().used_bytes(), 0);
    assert!(!r.stats().complete);
    r.forget(b.key);
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert_eq!(r.budget().used_bytes(), 12288, "only a is warmed again");
    assert_eq!(r.inner.q.lock().deferred.len(), 0);
}

/// A storm of opens cannot queue a descriptor per file: past the bound demands are
/// dropped, counted, and taken again at the file's next open.
#[test]
fn the_demand_queue_is_bounded_and_a_dropped_demand_comes_back() {
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = ResidentConfig {
        threads: 1,
        // 4 KiB/s: the worker takes a file, then sleeps about a second per file, so
        // the queue fills while the demands below arrive.
        rate_bytes_per_s: Some(4096),
        demand_queue_max: 2,
        ..quick()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    let files: Vec<_> = (0..10)
        .map(|i| {
            let (f, _) = make(d.path(), &format!("s{i}"), 4096);
            let h = File::open(d.path().join(&f.path)).expect("open");
            (f.key, h)
        })
        .collect();
    for (key, h) in &files {
        r.demand(*key, h);
    }
    let s = r.stats();
    assert_eq!(s.files_demanded + s.demands_dropped, 10, "{s:?}");
    // At most the queue's two plus what the one worker took meanwhile.
    assert!(s.demands_dropped >= 6, "{s:?}");
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(60)));
    let (key, h) = &files[9];
    r.demand(*key, h);
    assert_eq!(r.stats().files_demanded, s.files_demanded + 1);
}

#[test]
fn a_missing_file_counts_as_failed_and_completes() {
    let d = tempfile::tempdir().expect("tempdir");
    let r = resident(d.path(), 1 << 30, quick());
    r.submit_walked(
        FileRef {
            key: 1,
            path: PathBuf::from("nope"),
        },
        10,
    );
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.stats().files_failed, 1);
    assert_eq!(r.budget().used_bytes(), 0);
}

/// A file truncated while it is being warmed (after it was sized, before it is pinned):
/// the pin must cover only what is left, pinning must go on for later files, and the
/// budget must hold exactly the files' current sizes. Before, the mlock of the old length
/// reached past EOF, failed with ENOMEM and stopped pinning for good ("mlock: Cannot
/// allocate memory", blamed on the memlock limit), the stale reservation stayed charged,
/// and the file counted as warmed twice.
#[test]
fn a_truncate_during_the_warm_up_keeps_pinning_on_and_the_budget_exact() {
    let d = tempfile::tempdir().expect("tempdir");
    const BIG: usize = 32 << 20;
    let cfg = ResidentConfig {
        // Slow enough that the truncate lands while the file is read.
        rate_bytes_per_s: Some(16 << 20),
        ..quick()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    r.walk_done();
    let (big, _) = make(d.path(), "big", BIG);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.path().join("big"))
        .expect("open");
    r.demand(big.key, &f);
    // Sized and being read: some bytes are in.
    while r.stats().bytes_warmed == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!r.stats().complete, "warmed before the truncate");
    f.set_len(4096).expect("truncate");
    r.refresh(big.key, &f);
    assert!(r.wait_complete(Duration::from_secs(30)), "warm-up stuck");
    let (small, len) = make(d.path(), "later", 8192);
    let g = File::open(d.path().join("later")).expect("open");
    r.demand(small.key, &g);
    assert!(r.wait_complete(Duration::from_secs(30)), "warm-up stuck");
    let st = r.stats();
    assert_eq!(st.pin_error, None, "{st:?}");
    assert_eq!(st.files_pinned, 2, "both files pinned: {st:?}");
    assert_eq!(st.bytes_pinned, 4096 + len, "{st:?}");
    assert_eq!(
        r.budget().used_bytes(),
        4096 + len,
        "the budget holds the current sizes: {st:?}"
    );
    assert!(st.files_warmed <= st.files_seen, "{st:?}");
}

/// A file demanded after it was forgotten (an open or a writer's close racing the unlink
/// of its last name): nothing of the deleted inode may be warmed, pinned or charged.
#[test]
fn a_demand_after_the_file_was_forgotten_holds_nothing() {
    let d = tempfile::tempdir().expect("tempdir");
    let r = resident(d.path(), 1 << 30, quick());
    r.walk_done();
    let (f, _) = make(d.path(), "gone", 1 << 20);
    let file = File::open(d.path().join("gone")).expect("open");
    std::fs::remove_file(d.path().join("gone")).expect("unlink");
    r.forget(f.key);
    r.demand(f.key, &file);
    assert!(r.wait_complete(Duration::from_secs(30)), "warm-up stuck");
    // The writer's last close: its refresh of a file it believes still linked.
    r.refresh_sized(f.key, &file, 1 << 20);
    assert!(r.wait_complete(Duration::from_secs(30)), "warm-up stuck");
    let st = r.stats();
    assert_eq!(
        (r.budget().used_bytes(), st.files_pinned),
        (0, 0),
        "the deleted file holds budget or a pin: {st:?}"
    );
}

/// Pins stop at the mapping limit unless it may be raised; raised, every file is pinned,
/// the sysctl grows by doubling and never past what the budget could use. A file stands
/// in for /proc/sys/vm/max_map_count.
#[test]
fn the_mapping_limit_is_raised_when_the_pins_reach_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let files = d.path().join("files");
    std::fs::create_dir(&files).expect("dir");
    let sysctl = d.path().join("max_map_count");
    let run = |raise: bool| {
        // Room for 3 pins.
        std::fs::write(&sysctl, format!("{}\n", MAP_COUNT_RESERVE + 3)).expect("sysctl");
        let cfg = ResidentConfig {
            pin_limit: PinLimit::Sysctl {
                path: sysctl.clone(),
                raise,
            },
            ..quick()
        };
        let r = resident(&files, 1 << 30, cfg);
        for i in 0..8 {
            let (f, len) = make(&files, &format!("m{i}"), 4096);
            r.submit_walked(f, len);
        }
        r.walk_done();
        assert!(r.wait_complete(Duration::from_secs(30)));
        r.stats()
    };
    let s = run(false);
    if s.pin_error.is_some() {
        dhrd_testkit::skip(format!("mlock refused here: {:?}", s.pin_error));
        return;
    }
    assert_eq!((s.files_pinned, s.files_unpinned), (3, 5), "{s:?}");
    assert_eq!(s.map_count, MapCountNote::default());
    let s = run(true);
    assert_eq!((s.files_pinned, s.files_unpinned), (8, 0), "{s:?}");
    let now = crate::sys::read_sysctl(&sysctl).expect("sysctl");
    let before = (MAP_COUNT_RESERVE + 3) as u64;
    assert_eq!(now, 2 * before, "one doubling is room for 8");
    assert_eq!(s.map_count.raised, Some((before, now)), "{s:?}");
    assert_eq!(s.pins_max, now - MAP_COUNT_RESERVE as u64);
}

/// A file the walk has queued but not started moves ahead of the walk when an application
/// opens it: with one worker, it is warmed before every walked file queued after the one
/// being read (SPEC I10). Before, a demand of a queued file was taken for a known one and
/// did nothing: the file waited its turn behind the whole walk.
#[test]
fn a_demand_moves_a_file_the_walk_queued_ahead_of_the_walk() {
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = ResidentConfig {
        threads: 1,
        // 256 KiB/s: each 64 KiB file takes a quarter of a second.
        rate_bytes_per_s: Some(256 << 10),
        ..quick()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    let files: Vec<FileRef> = (0..8)
        .map(|i| {
            let (f, len) = make(d.path(), &format!("q{i}"), 64 << 10);
            r.submit_walked(f.clone(), len);
            f
        })
        .collect();
    r.walk_done();
    let last = File::open(d.path().join(&files[7].path)).expect("open");
    r.demand(files[7].key, &last);
    assert_eq!(r.stats().files_demanded, 1, "the demand was not taken");
    let t = std::time::Instant::now();
    while cached_bytes(&last).expect("cachestat") < 64 << 10 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the demanded file was never warmed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = File::open(d.path().join(&files[6].path)).expect("open");
    assert_eq!(
        cached_bytes(&before).expect("cachestat"),
        0,
        "a walked file queued before the demanded one was warmed first"
    );
    assert!(r.wait_complete(Duration::from_secs(60)));
    let s = r.stats();
    assert_eq!((s.files_seen, s.files_warmed), (8, 8), "{s:?}");
}

/// Pages of `path`'s page cache that belong to a folio of more than one page, counted
/// through a mapping of the file: /proc/self/pagemap gives each page's frame, and
/// /proc/kpageflags says whether that frame is part of a compound page (a large folio).
/// Needs root (frame numbers are hidden from others).
/// How a cached file's pages sit in folios (read through /proc/kpageflags).
struct FolioCensus {
    pages: u64,
    /// Pages in folios of more than one page.
    large: u64,
    /// Large folios (their head pages).
    heads: u64,
    /// The file's first page is in a large folio.
    first_large: bool,
}

fn pages_in_large_folios(path: &Path) -> (u64, u64) {
    let c = folio_census(path);
    (c.large, c.pages)
}

fn folio_census(path: &Path) -> FolioCensus {
    const KPF_COMPOUND_HEAD: u64 = 1 << 15;
    const KPF_COMPOUND_TAIL: u64 = 1 << 16;
    const PFN_MASK: u64 = (1 << 55) - 1;
    const PRESENT: u64 = 1 << 63;
    let f = File::open(path).expect("open");
    let len = f.metadata().expect("meta").len() as usize;
    // SAFETY: a read-only shared mapping of a file we hold open, read within its length
    // below and unmapped at the end.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap");
    let pagemap = File::open("/proc/self/pagemap").expect("pagemap");
    let kpageflags = File::open("/proc/kpageflags").expect("kpageflags (needs root)");
    let page = dhrd_io::PAGE_BYTES as usize;
    let mut c = FolioCensus {
        pages: 0,
        large: 0,
        heads: 0,
        first_large: false,
    };
    for off in (0..len).step_by(page) {
        // SAFETY: inside the mapping made above; a volatile read faults the page in.
        unsafe { std::ptr::read_volatile((addr as *const u8).add(off)) };
        let mut e = [0u8; 8];
        let vpn = (addr as usize + off) / page;
        pagemap
            .read_exact_at(&mut e, (vpn * 8) as u64)
            .expect("pagemap entry");
        let e = u64::from_ne_bytes(e);
        assert!(e & PRESENT != 0, "page at {off} not present after a read");
        let pfn = e & PFN_MASK;
        assert_ne!(pfn, 0, "frame numbers hidden: the test needs root");
        let mut fl = [0u8; 8];
        kpageflags
            .read_exact_at(&mut fl, pfn * 8)
            .expect("kpageflags entry");
        let fl = u64::from_ne_bytes(fl);
        c.pages += 1;
        if fl & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) != 0 {
            c.large += 1;
            c.first_large |= off == 0;
        }
        if fl & KPF_COMPOUND_HEAD != 0 {
            c.heads += 1;
        }
    }
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(addr, len) };
    c
}

/// In `Folios::Large` a range longer than one 2 MiB folio is warmed through a mapping
/// advised for huge pages (`populate.rs`): each fault reads one 2 MiB folio and nothing
/// ahead of it. Sequential reads would start with one-page folios (the first readahead
/// window is order 0) and grow their order window by window, so a first page in a large
/// folio and large folios of 256 pages and more on average tell the two apart.
#[test]
fn a_large_file_is_warmed_in_2_mib_folios() {
    let d = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let (f, len) = make(d.path(), "big", 16 << 20);
    let cfg = ResidentConfig {
        folios: Folios::Large,
        ..quick()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    r.submit_walked(f, len);
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    let c = folio_census(&d.path().join("big"));
    assert_eq!(c.pages, (16 << 20) / dhrd_io::PAGE_BYTES);
    assert!(c.first_large, "the first page is not in a large folio");
    assert!(
        c.heads > 0 && c.large / c.heads >= 256,
        "{} pages in {} large folios, of {} pages",
        c.large,
        c.heads,
        c.pages
    );
    drop(r);
}

/// `Folios::Order0` leaves one page per folio, which is what keeps small synchronous
/// writes cheap (see `Folios`); `Folios::Large`, the control, shows that the file system
/// under test makes large folios at all, so the first half cannot pass for want of them.
#[test]
fn the_warm_up_leaves_the_folios_it_is_asked_for() {
    // On the disk's file system: a tmpfs /tmp makes large folios only when mounted so.
    let d = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    for (folios, name) in [(Folios::Large, "large"), (Folios::Order0, "order0")] {
        let (f, len) = make(d.path(), name, 16 << 20);
        let cfg = ResidentConfig { folios, ..quick() };
        let r = resident(d.path(), 1 << 30, cfg);
        r.submit_walked(f, len);
        r.walk_done();
        assert!(r.wait_complete(Duration::from_secs(30)));
        let (large, pages) = pages_in_large_folios(&d.path().join(name));
        assert_eq!(pages, (16 << 20) / dhrd_io::PAGE_BYTES);
        match folios {
            // Some, not all: under memory fragmentation the kernel falls back to smaller
            // folios for part of a read.
            Folios::Large => assert!(
                large > 0,
                "control: only {large} of {pages} pages in large folios after sequential reads"
            ),
            Folios::Order0 => assert_eq!(large, 0, "{large} of {pages} pages in large folios"),
        }
        drop(r);
    }
}

/// A demanded file is handed over as a duplicate of its caller's descriptor; the order-0
/// advice must land on a description of the warm-up's own, or the caller's own reads
/// through that descriptor would lose their read-ahead (and their large folios).
#[test]
fn order0_warm_up_leaves_the_callers_read_ahead_alone() {
    let d = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let (f, len) = make(d.path(), "demanded", 16 << 20);
    let caller = File::open(d.path().join("demanded")).expect("open");
    let cfg = ResidentConfig {
        folios: Folios::Order0,
        ..quick()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    r.demand(f.key, &caller);
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    drop(r);
    // Out of the cache again, then read in through the caller's own descriptor.
    // SAFETY: fadvise on a descriptor we hold; a hint only.
    unsafe { libc::posix_fadvise(caller.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        at += caller.read_at(&mut buf, at).expect("read") as u64;
    }
    let (large, pages) = pages_in_large_folios(&d.path().join("demanded"));
    assert!(
        large > 0,
        "the caller's sequential reads left no large folio of {pages} pages: its read-ahead \
         was advised away"
    );
}

/// Puts `p`'s access time an hour before its modification time, where `relatime` (and
/// `strictatime`) makes the next read set it.
fn age_atime(p: &Path) -> std::time::SystemTime {
    let f = File::open(p).expect("open");
    let mtime = f.metadata().expect("meta").modified().expect("mtime");
    let old = mtime - Duration::from_secs(3600);
    f.set_times(std::fs::FileTimes::new().set_accessed(old))
        .expect("set atime");
    old
}

fn atime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p)
        .expect("meta")
        .accessed()
        .expect("atime")
}

#[test]
fn warming_and_pinning_leave_access_times_as_they_were() {
    let d = tempfile::tempdir().expect("tempdir");
    // The control: this file system sets the access time of a plain read here.
    let (_, _) = make(d.path(), "control", 4096);
    let aged = age_atime(&d.path().join("control"));
    File::open(d.path().join("control"))
        .expect("open")
        .read_at(&mut [0u8; 16], 0)
        .expect("read");
    if atime(&d.path().join("control")) == aged {
        dhrd_testkit::skip("reads do not set access times here (noatime)");
        return;
    }
    // Order-0 reads, large folios through a mapping (above WARM_POPULATE_BYTES) and by
    // reads: each through the description of an application's plain open.
    for (name, folios, len) in [
        ("order0", Folios::Order0, 64 << 10),
        ("large-mapped", Folios::Large, (3 << 20) + 100),
        ("large-read", Folios::Large, 64 << 10),
    ] {
        let (f, _) = make(d.path(), name, len);
        let p = d.path().join(name);
        let aged = age_atime(&p);
        let cfg = ResidentConfig { folios, ..quick() };
        let r = resident(d.path(), 1 << 30, cfg);
        let caller = File::open(&p).expect("open");
        r.demand(f.key, &caller);
        r.walk_done();
        assert!(r.wait_complete(Duration::from_secs(30)), "{name}");
        let s = r.stats();
        assert_eq!((s.files_warmed, s.files_failed), (1, 0), "{name}: {s:?}");
        assert_eq!(
            cached_bytes(&caller).expect("cachestat"),
            page_ceil(len as u64),
            "{name}"
        );
        assert_eq!(atime(&p), aged, "{name}: the warm-up set the access time");
        drop(r);
    }
}

/// Hands `r` a walked "file" whose every read fails: a directory (EISDIR), made in `dir`
/// (which `r` opens files from, with large folios: no order-0 advice). Returns its key.
fn submit_unreadable(r: &Resident, dir: &Path) -> u64 {
    std::fs::create_dir(dir.join("dir")).expect("mkdir");
    let key =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.join("dir")).expect("meta"));
    let f = FileRef {
        key,
        path: PathBuf::from("dir"),
    };
    r.submit_walked(f, 4096);
    key
}

/// A read that fails is tried again after growing delays, and the file is then left to the
/// device and forgotten. (The opener hands in a directory, whose reads fail with EISDIR
/// every time; `attach_eio.rs` fails real reads, and shows a file read once the device
/// reads again.)
#[test]
fn a_file_whose_reads_fail_is_read_again_then_left_to_the_device() {
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = ResidentConfig {
        folios: Folios::Large,
        ..quick()
    };
    let delay = cfg.refresh_delay;
    let r = resident(d.path(), 1 << 30, cfg);
    let t = Instant::now();
    let key = submit_unreadable(&r, d.path());
    r.walk_done();
    assert!(r.wait_complete(Duration::from_secs(30)));
    let s = r.stats();
    let reads = 1 + u64::from(config::READ_RETRIES_MAX);
    assert_eq!(
        (s.read_errors, s.files_failed, s.files_warmed),
        (reads, 1, 0),
        "{s:?}"
    );
    // The retries waited their delays: 1, 4 and 16 times the refresh delay.
    assert!(t.elapsed() >= delay * 21, "{:?}", t.elapsed());
    let q = r.inner.q.lock();
    assert!(q.read_failures.is_empty() && !q.entries.contains_key(&key));
    drop(q);
    assert_eq!(r.budget().used_bytes(), 0);
    assert!(r
        .stats()
        .failures_text()
        .contains("1 files left to the device"));
}

/// A refresh queued while a failed read waits for a longer retry is warmed after its own
/// delay, not behind the retry: the deferred queue is kept in due order, and a first
/// entry due sooner wakes the thread timing the later one.
#[test]
fn a_refresh_is_not_held_behind_a_longer_read_retry() {
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = ResidentConfig {
        folios: Folios::Large,
        refresh_delay: Duration::from_millis(100),
        threads: 1,
        ..ResidentConfig::default()
    };
    let r = resident(d.path(), 1 << 30, cfg);
    let (f, len) = make(d.path(), "g", 8192);
    let w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.path().join("g"))
        .expect("open");
    r.demand(f.key, &w);
    // The directory's reads fail: retried after 100, 400 and 1,600 ms.
    submit_unreadable(&r, d.path());
    r.walk_done();
    let t = Instant::now();
    while r.stats().read_errors < 2 {
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", r.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    // The directory's next retry is 400 ms away at least; the refresh is due in 100.
    assert_eq!(r.budget().used_bytes(), len);
    w.write_all_at(&[2u8; 20000], 8192).expect("grow");
    r.refresh(f.key, &w);
    let t = Instant::now();
    while r.budget().used_bytes() != page_ceil(28192) {
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", r.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = r.stats();
    assert!(s.read_errors < 3, "the refresh waited for the retry: {s:?}");
    assert!(r.wait_complete(Duration::from_secs(30)));
    assert_eq!(r.stats().files_failed, 1);
}
