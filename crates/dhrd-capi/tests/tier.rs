//! The tiered device (T1) through the C API: `tier_ssd_path` puts an SSD cache tier
//! between the RAM tier and the backing. Written data is served after a close and a
//! reopen (from the SSD while it is not yet written back), a chunk read twice is promoted,
//! the statistics report the tier, and bad tier options are `EINVAL`.
#![allow(clippy::expect_used)] // tests fail loudly by design

use dhrd_capi::*;
use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

const CHUNK: u64 = 64 << 10;
const CHUNKS: u64 = 64;

fn options(ssd: &CStr) -> dhrd_options {
    // SAFETY: `MaybeUninit` storage for one dhrd_options, filled by the call.
    let mut o = unsafe {
        let mut o = std::mem::MaybeUninit::<dhrd_options>::uninit();
        assert_eq!(
            dhrd_options_init(o.as_mut_ptr(), std::mem::size_of::<dhrd_options>()),
            0
        );
        o.assume_init()
    };
    o.chunk_bytes = CHUNK;
    o.ram_budget_bytes = 4 * CHUNK;
    o.no_prefill = true;
    o.tier_ssd_path = ssd.as_ptr();
    o.tier_ssd_bytes = 16 * CHUNK + 4096 * 2;
    // A slow lower tier, so the write-back is still going on at the close.
    o.backing_timing = c"20000,20000,20000,0".as_ptr();
    o
}

fn open(path: &CStr, o: &dhrd_options) -> Result<*mut dhrd_object, i32> {
    let mut h: *mut dhrd_object = std::ptr::null_mut();
    // SAFETY: a C string, valid options whose strings outlive the call, an out-pointer.
    match unsafe { dhrd_open(path.as_ptr(), o, &mut h) } {
        0 => Ok(h),
        e => Err(e),
    }
}

fn read(h: *mut dhrd_object, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut n = 0usize;
    // SAFETY: a live handle; `buf` is writable for its length; out-pointer.
    let r = unsafe { dhrd_read(h, buf.as_mut_ptr().cast(), len, offset, &mut n) };
    assert_eq!(r, 0);
    buf.truncate(n);
    buf
}

fn write(h: *mut dhrd_object, offset: u64, data: &[u8]) {
    // SAFETY: a live handle; `data` is readable for its length.
    let r = unsafe { dhrd_write(h, data.as_ptr().cast(), data.len(), offset) };
    assert_eq!(r, 0);
}

fn stats(h: *mut dhrd_object) -> dhrd_stats {
    let mut s = dhrd_stats::default();
    // SAFETY: a live handle and an out-pointer.
    assert_eq!(unsafe { dhrd_get_stats(h, &mut s) }, 0);
    s
}

fn close(h: *mut dhrd_object) {
    // SAFETY: a handle from dhrd_open, used by nobody else and not again.
    assert_eq!(unsafe { dhrd_close(h) }, 0);
}

#[test]
fn writes_survive_a_reopen_through_the_ssd_tier_and_reads_promote() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lower");
    let data: Vec<u8> = (0..CHUNKS * CHUNK).map(|i| (i % 251) as u8 | 1).collect();
    std::fs::write(&path, &data).expect("write backing");
    let cpath = CString::new(path.to_string_lossy().as_bytes()).expect("path");
    let cssd = CString::new(dir.path().join("ssd").to_string_lossy().as_bytes()).expect("ssd");
    let o = options(&cssd);

    let h = open(&cpath, &o).expect("open with a tier");
    let mut model = data.clone();
    for c in [3u64, 9, 17, 40] {
        let piece = vec![c as u8 + 100; 5000];
        let at = c * CHUNK + 123;
        write(h, at, &piece);
        model[at as usize..at as usize + piece.len()].copy_from_slice(&piece);
    }
    let s = stats(h);
    assert!(s.tier_slots_dirty + s.tier_written_back >= 4, "{s:?}");
    // A chunk read twice is promoted into the SSD tier (its second miss).
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats(h).tier_promotions == 0 {
        assert!(Instant::now() < deadline, "no promotion: {:?}", stats(h));
        assert_eq!(
            read(h, 50 * CHUNK, 4096),
            model[(50 * CHUNK) as usize..][..4096]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(stats(h).tier_chunk_reads_lower > 0);
    close(h);

    // Reopened: every write is served, from the SSD where it is not yet written back.
    let h = open(&cpath, &o).expect("reopen");
    assert_eq!(read(h, 0, model.len()), model);
    close(h);

    // Without a tier the statistics say nothing of one.
    let mut plain = options(&cssd);
    plain.tier_ssd_path = std::ptr::null();
    plain.backing_timing = c"".as_ptr();
    let h = open(&cpath, &plain).expect("open without a tier");
    let s = stats(h);
    assert_eq!(
        (
            s.tier_chunk_reads_ssd,
            s.tier_promotions,
            s.tier_slots_dirty
        ),
        (0, 0, 0)
    );
    close(h);
}

#[test]
fn bad_tier_options_are_einval() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lower");
    std::fs::write(&path, vec![1u8; (4 * CHUNK) as usize]).expect("write backing");
    let cpath = CString::new(path.to_string_lossy().as_bytes()).expect("path");
    let cssd = CString::new(dir.path().join("ssd").to_string_lossy().as_bytes()).expect("ssd");
    type Tweak = (&'static str, fn(&mut dhrd_options));
    let tweaks: [Tweak; 4] = [
        ("no size", |o| o.tier_ssd_bytes = 0),
        ("bad mode", |o| o.tier_mode = c"sometimes".as_ptr()),
        ("bad timing", |o| o.tier_ssd_timing = c"fast".as_ptr()),
        ("read-only", |o| o.read_only = true),
    ];
    for (what, tweak) in tweaks {
        let mut o = options(&cssd);
        tweak(&mut o);
        assert_eq!(open(&cpath, &o).err(), Some(libc::EINVAL), "{what}");
    }
    // A good mode and timing open.
    let mut o = options(&cssd);
    o.tier_mode = c"writethrough".as_ptr();
    o.tier_ssd_timing = c"ssd".as_ptr();
    let h = open(&cpath, &o).expect("writethrough with SSD timing");
    close(h);
}
