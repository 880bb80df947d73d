//! Device timing through the C API (E1): `dhrd_options.backing_timing` and, when it is
//! NULL, `$DHRD_BACKING_TIMING`. Times are checked from below only: a loaded machine is
//! slower, never faster. Only `environment_decides_when_the_option_is_null` touches the
//! environment; the other tests set the option, so the environment cannot reach them.
#![allow(clippy::expect_used)] // tests fail loudly by design

use dhrd_capi::*;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const LATENCY: Duration = Duration::from_micros(2000);
const PROFILE: &CStr = c"2000,2000,2000,0";

/// 8 MiB of non-zero bytes: a sparse file's holes may be answered without a (timed) read.
fn filled(dir: &Path) -> (CString, Vec<u8>) {
    let path = dir.join("obj");
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&path, &data).expect("write backing");
    (
        CString::new(path.to_string_lossy().as_bytes()).expect("path"),
        data,
    )
}

/// The defaults, with a RAM budget of one chunk: every other chunk stays on the backing,
/// so reads there reach it whatever the background load has done.
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
    o.ram_budget_bytes = MIB;
    o.chunk_bytes = MIB;
    o
}

fn open(path: &CStr, o: Option<&dhrd_options>) -> Result<*mut dhrd_object, i32> {
    let mut h: *mut dhrd_object = std::ptr::null_mut();
    let opts = o.map_or(std::ptr::null(), |o| o as *const dhrd_options);
    // SAFETY: a C string, null or valid options (their strings outlive the call), an
    // out-pointer.
    match unsafe { dhrd_open(path.as_ptr(), opts, &mut h) } {
        0 => Ok(h),
        e => Err(e),
    }
}

/// Reads `len` bytes at `offset` through `h`; returns them and how long the call took.
fn timed_read(h: *mut dhrd_object, offset: u64, len: usize) -> (Vec<u8>, Duration) {
    let mut buf = vec![0u8; len];
    let mut n = 0usize;
    let t = Instant::now();
    // SAFETY: a live handle; `buf` is writable for its length; out-pointer.
    let r = unsafe { dhrd_read(h, buf.as_mut_ptr().cast(), len, offset, &mut n) };
    let took = t.elapsed();
    assert_eq!(r, 0);
    buf.truncate(n);
    (buf, took)
}

fn close(h: *mut dhrd_object) {
    // SAFETY: a live handle, closed once.
    assert_eq!(unsafe { dhrd_close(h) }, 0);
}

#[test]
fn backing_timing_option_delays_backing_operations_and_keeps_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, data) = filled(dir.path());
    let mut o = options();
    o.backing_timing = PROFILE.as_ptr();
    let h = open(&path, Some(&o)).expect("open");
    let at = 6 * MIB;
    let (got, took) = timed_read(h, at, 4096);
    assert!(
        got[..] == data[at as usize..at as usize + 4096],
        "read differs"
    );
    assert!(took >= LATENCY, "backing read took only {took:?}");
    // Sync durability: the write is on the backing (a timed write and sync) at return.
    let msg = b"through an emulated device";
    let at = 7 * MIB + 100;
    let t = Instant::now();
    // SAFETY: a live handle; `msg` is readable for its length.
    let r = unsafe { dhrd_write(h, msg.as_ptr().cast(), msg.len(), at) };
    let took = t.elapsed();
    assert_eq!(r, 0);
    assert!(took >= LATENCY, "durable write took only {took:?}");
    let (got, took) = timed_read(h, at, msg.len());
    assert_eq!(&got, msg);
    assert!(took >= LATENCY, "backing read took only {took:?}");
    close(h);
    let disk = std::fs::read(dir.path().join("obj")).expect("read backing");
    assert_eq!(&disk[at as usize..at as usize + msg.len()], msg);
}

#[test]
fn a_bad_backing_timing_is_einval_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = CString::new(dir.path().join("new").to_string_lossy().as_bytes()).expect("path");
    for bad in [c"fast", c"1,2,3", c"1,2,3,x"] {
        let mut o = options();
        o.create = true;
        o.min_len_bytes = MIB;
        o.backing_timing = bad.as_ptr();
        assert_eq!(open(&path, Some(&o)).err(), Some(libc::EINVAL), "{bad:?}");
    }
    assert!(
        !dir.path().join("new").exists(),
        "a refused open created the file"
    );
}

#[test]
fn environment_decides_when_the_option_is_null() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, data) = filled(dir.path());
    // A bad value in the environment shows whether it was consulted.
    std::env::set_var("DHRD_BACKING_TIMING", "bogus");
    assert_eq!(open(&path, None).err(), Some(libc::EINVAL), "null options");
    assert_eq!(
        open(&path, Some(&options())).err(),
        Some(libc::EINVAL),
        "null backing_timing"
    );
    // "" and an explicit profile override the environment.
    for given in [c"", PROFILE] {
        let mut o = options();
        o.backing_timing = given.as_ptr();
        close(open(&path, Some(&o)).unwrap_or_else(|e| panic!("{given:?}: errno {e}")));
    }
    // A good value times the backing of a program that leaves the option NULL.
    std::env::set_var("DHRD_BACKING_TIMING", "2000,2000,2000,0");
    let mut o = options();
    o.backing_timing = std::ptr::null();
    let h = open(&path, Some(&o)).expect("open");
    let at = 5 * MIB;
    let (got, took) = timed_read(h, at, 4096);
    assert!(
        got[..] == data[at as usize..at as usize + 4096],
        "read differs"
    );
    assert!(took >= LATENCY, "backing read took only {took:?}");
    close(h);
    std::env::remove_var("DHRD_BACKING_TIMING");
}
