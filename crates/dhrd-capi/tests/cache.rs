//! Cache mode through the C API (M1-M3): with a RAM budget of a quarter of the data, the
//! options choose the policy, admission and read-ahead, a bad value is `EINVAL`, and the
//! statistics report hits, admissions, evictions and read-ahead.
#![allow(clippy::expect_used)] // tests fail loudly by design

use dhrd_capi::*;
use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn options() -> dhrd_options {
    // SAFETY: `MaybeUninit` storage for one dhrd_options, filled by the call.
    let mut o = unsafe {
        let mut o = std::mem::MaybeUninit::<dhrd_options>::uninit();
        assert_eq!(
            dhrd_options_init(o.as_mut_ptr(), std::mem::size_of::<dhrd_options>()),
            0
        );
        o.assume_init()
    };
    o.ram_budget_bytes = 2 * MIB;
    o.chunk_bytes = 64 << 10;
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

fn stats(h: *mut dhrd_object) -> dhrd_stats {
    let mut s = dhrd_stats::default();
    // SAFETY: a live handle and an out-pointer.
    assert_eq!(unsafe { dhrd_get_stats(h, &mut s) }, 0);
    s
}

#[test]
fn cache_options_steer_the_ram_tier_and_stats_report_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("obj");
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&path, &data).expect("write backing");
    let cpath = CString::new(path.to_string_lossy().as_bytes()).expect("path");
    let mut o = options();
    o.cache_policy = c"clock".as_ptr();
    o.cache_admit = c"always".as_ptr();
    o.read_ahead = c"none".as_ptr();
    o.no_prefill = true;
    let h = open(&cpath, &o).expect("open");
    // A hot 1 MiB read again and again, and a cold sweep over the rest: the hot part
    // ends up served from RAM, the sweep evicts.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for off in (0..MIB).step_by(4096) {
            assert_eq!(read(h, off, 4096), data[off as usize..off as usize + 4096]);
        }
        let s = stats(h);
        if s.reads_ram > 1000 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for off in (MIB..8 * MIB).step_by(64 << 10) {
        assert_eq!(read(h, off, 4096), data[off as usize..off as usize + 4096]);
    }
    std::thread::sleep(Duration::from_millis(200));
    let s = stats(h);
    assert!(s.reads_ram > 1000, "{s:?}");
    assert!(s.admissions > 0 && s.evictions > 0, "{s:?}");
    assert!(s.hit_ratio > 0.0 && s.hit_ratio < 1.0, "{s:?}");
    assert_eq!(s.read_ahead_loaded, 0, "read-ahead was off");
    // SAFETY: a live handle, closed once.
    assert_eq!(unsafe { dhrd_close(h) }, 0);

    let mut bad = options();
    bad.read_ahead = c"sometimes".as_ptr();
    assert_eq!(open(&cpath, &bad).err(), Some(libc::EINVAL));
}
