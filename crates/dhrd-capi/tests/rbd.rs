//! The C API on an `rbd:POOL/IMAGE` backing, against the one-node test cluster: the
//! cluster comes from `$CEPH_CONF`, as for any librbd program; data written through one
//! handle is read back through the next, from Rust and from a C program, alone and under
//! each fast layer. (The exclusive lock is tested in dhrd-rbd.)
#![allow(clippy::expect_used)] // tests fail loudly by design

mod cc;
#[path = "../../dhrd-rbd/tests/cluster/mod.rs"]
mod cluster;

use dhrd_capi::*;
use std::ffi::CString;

#[test]
fn an_rbd_image_through_the_c_api() {
    let (c, _g) = cluster::shared();
    // The only test of this binary that reads the environment's Ceph settings.
    std::env::set_var("CEPH_CONF", &c.conf);
    let name = c.image_name("capi");
    let path = CString::new(format!("rbd:rbd/{name}")).expect("path");
    // SAFETY: `MaybeUninit` storage for one dhrd_options, filled by the call.
    let mut opts = unsafe {
        let mut o = std::mem::MaybeUninit::<dhrd_options>::uninit();
        assert_eq!(
            dhrd_options_init(o.as_mut_ptr(), std::mem::size_of::<dhrd_options>()),
            0
        );
        o.assume_init()
    };
    opts.create = true;
    opts.min_len_bytes = 8 << 20;
    let mut obj: *mut dhrd_object = std::ptr::null_mut();
    // SAFETY: valid C string, options and out-pointer.
    assert_eq!(unsafe { dhrd_open(path.as_ptr(), &opts, &mut obj) }, 0);
    let data = b"written through the C API onto RBD";
    // SAFETY: a live handle; `data` is readable for its length.
    let r = unsafe { dhrd_write(obj, data.as_ptr().cast(), data.len(), 4096) };
    assert_eq!(r, 0);
    let mut len = 0u64;
    // SAFETY: a live handle; out-pointer.
    assert_eq!(unsafe { dhrd_len(obj, &mut len) }, 0);
    assert_eq!(len, 8 << 20);
    // SAFETY: a live handle, closed once.
    assert_eq!(unsafe { dhrd_close(obj) }, 0);
    let mut obj: *mut dhrd_object = std::ptr::null_mut();
    // SAFETY: a valid C string, null options (the defaults) and an out-pointer.
    let r = unsafe { dhrd_open(path.as_ptr(), std::ptr::null(), &mut obj) };
    assert_eq!(r, 0);
    let mut buf = vec![0u8; data.len()];
    let mut n = 0usize;
    // SAFETY: a live handle; `buf` is writable for its length; out-pointer.
    let r = unsafe { dhrd_read(obj, buf.as_mut_ptr().cast(), buf.len(), 4096, &mut n) };
    assert_eq!(r, 0);
    assert_eq!(&buf[..n], data);
    // SAFETY: a live handle, closed once.
    assert_eq!(unsafe { dhrd_close(obj) }, 0);
    c.remove_image(&name);
}

/// Another client shrinks the image (`rbd resize --allow-shrink`, which the lock owner
/// carries out): a write across the new end must fail, and the object must turn
/// read-only for good (C4) with reads refused, so that RAM and the image never diverge
/// silently.
#[test]
fn an_image_shrunk_by_another_client_fails_the_object() {
    let (c, _g) = cluster::shared();
    std::env::set_var("CEPH_CONF", &c.conf);
    let name = c.image_name("capishrink");
    let path = CString::new(format!("rbd:rbd/{name}")).expect("path");
    // SAFETY: `MaybeUninit` storage for one dhrd_options, filled by the call.
    let mut opts = unsafe {
        let mut o = std::mem::MaybeUninit::<dhrd_options>::uninit();
        assert_eq!(
            dhrd_options_init(o.as_mut_ptr(), std::mem::size_of::<dhrd_options>()),
            0
        );
        o.assume_init()
    };
    opts.create = true;
    opts.min_len_bytes = 16 << 20;
    let mut obj: *mut dhrd_object = std::ptr::null_mut();
    // SAFETY: valid C string, options and out-pointer.
    assert_eq!(unsafe { dhrd_open(path.as_ptr(), &opts, &mut obj) }, 0);
    let data = vec![7u8; 64 << 10];
    let last = (16 << 20) - data.len() as u64;
    // SAFETY: a live handle; `data` is readable for its length.
    let r = unsafe { dhrd_write(obj, data.as_ptr().cast(), data.len(), last) };
    assert_eq!(r, 0);
    c.rbd(&[
        "resize",
        "--no-progress",
        "--size",
        "8M",
        "--allow-shrink",
        &format!("rbd/{name}"),
    ]);
    // SAFETY: a live handle; `data` is readable for its length.
    let r = unsafe { dhrd_write(obj, data.as_ptr().cast(), data.len(), (8 << 20) - 4096) };
    assert_ne!(r, 0, "a write across the shrunk image's end succeeded");
    let mut st = dhrd_stats::default();
    // SAFETY: a live handle; out-pointer.
    assert_eq!(unsafe { dhrd_get_stats(obj, &mut st) }, 0);
    assert!(
        st.read_only_after_failure,
        "the object stayed writable after its image shrank under it (error {r})"
    );
    let mut buf = vec![0u8; data.len()];
    let mut n = 0usize;
    // SAFETY: a live handle; `buf` is writable for its length; out-pointer.
    let r = unsafe { dhrd_read(obj, buf.as_mut_ptr().cast(), buf.len(), last, &mut n) };
    assert!(
        r != 0 || buf[..n] != data[..n],
        "RAM served bytes the image no longer has"
    );
    // SAFETY: a live handle, closed once.
    unsafe { dhrd_close(obj) };
    c.remove_image(&name);
}

/// `examples/c/stacks.c` on an image alone, under NVM write-back and under an SSD tier:
/// what it wrote is in the image after each close, which writes the fast layer back.
#[test]
fn an_rbd_image_alone_and_under_each_fast_layer_from_c() {
    let (c, _g) = cluster::shared();
    std::env::set_var("CEPH_CONF", &c.conf);
    // On a disk: NVM write-back refuses a file on tmpfs.
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on a disk file system");
    let exe = cc::compile("stacks", dir.path());
    for kind in [None, Some("nvm"), Some("ssd")] {
        let name = c.image_name(&format!("capic{}", kind.unwrap_or("plain")));
        let spec = std::ffi::OsString::from(format!("rbd:rbd/{name}"));
        let fast = dir.path().join(format!("fast-{}", kind.unwrap_or("plain")));
        let mut args = vec![spec.as_os_str()];
        if let Some(k) = kind {
            args.extend([std::ffi::OsStr::new(k), fast.as_os_str()]);
        }
        cc::run_ok(&exe, &args);
        let image = c.export_image(&name, &dir.path().join(format!("{name}.img")));
        for (at, piece) in cc::stacks_pieces() {
            let at = at as usize;
            assert!(
                image[at..at + piece.len()] == piece[..],
                "{kind:?}: the bytes written at {at} are not in the image after the close"
            );
        }
        c.remove_image(&name);
    }
}
