//! The part of librados and librbd that dhrd calls, loaded with `dlopen` at run time.
//!
//! Why at run time: dhrd must build and run on machines without Ceph. Only a process that
//! opens an `rbd:` backing needs the libraries, and it gets a clear error naming the
//! package when they are missing, instead of every binary of the workspace failing to
//! start for want of `librbd.so.1`.
//!
//! Invariants:
//! - the libraries are opened once per process and never closed: librados starts threads
//!   that run its code until the process exits, so unloading it would be unsound;
//! - every symbol is resolved when the table is built; a table that exists is complete, so
//!   no call site checks for a missing function;
//! - the signatures below are those of Ceph 16 (Pacific) `librados.h` and `librbd.h`;
//!   every function used here exists unchanged since Ceph 15.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

pub(crate) type RadosT = *mut c_void;
pub(crate) type IoctxT = *mut c_void;
pub(crate) type ImageT = *mut c_void;
pub(crate) type CompletionT = *mut c_void;
pub(crate) type CallbackT = Option<unsafe extern "C" fn(CompletionT, *mut c_void)>;

/// `RBD_LOCK_MODE_EXCLUSIVE` of librbd.h.
pub(crate) const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;
/// `RBD_FEATURE_EXCLUSIVE_LOCK` of rbd/features.h.
pub(crate) const RBD_FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;
/// The file names of the libraries (Debian: packages librados2 and librbd1).
const LIBRADOS: &str = "librados.so.2";
const LIBRBD: &str = "librbd.so.1";

/// `rbd_image_info_t` of librbd.h.
#[repr(C)]
pub(crate) struct ImageInfo {
    pub size: u64,
    pub obj_size: u64,
    pub num_objs: u64,
    pub order: c_int,
    pub block_name_prefix: [c_char; 24],
    pub parent_pool: i64,
    pub parent_name: [c_char; 96],
}

/// Resolved entry points. Field names are the C names.
pub(crate) struct Lib {
    pub rados_create2:
        unsafe extern "C" fn(*mut RadosT, *const c_char, *const c_char, u64) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(RadosT),
    pub rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    pub rados_ioctx_set_namespace: unsafe extern "C" fn(IoctxT, *const c_char),
    pub rados_conf_get: unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_stat:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut u64, *mut libc::time_t) -> c_int,
    pub rados_get_last_version: unsafe extern "C" fn(IoctxT) -> u64,
    pub rbd_create: unsafe extern "C" fn(IoctxT, *const c_char, u64, *mut c_int) -> c_int,
    pub rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    pub rbd_open_read_only:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    pub rbd_stat: unsafe extern "C" fn(ImageT, *mut ImageInfo, usize) -> c_int,
    pub rbd_get_features: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    pub rbd_resize: unsafe extern "C" fn(ImageT, u64) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    pub rbd_get_id: unsafe extern "C" fn(ImageT, *mut c_char, usize) -> c_int,
    pub rbd_metadata_get:
        unsafe extern "C" fn(ImageT, *const c_char, *mut c_char, *mut usize) -> c_int,
    pub rbd_metadata_set: unsafe extern "C" fn(ImageT, *const c_char, *const c_char) -> c_int,
    pub rbd_metadata_remove: unsafe extern "C" fn(ImageT, *const c_char) -> c_int,
    pub rbd_lock_release: unsafe extern "C" fn(ImageT) -> c_int,
    pub rbd_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char) -> isize,
    pub rbd_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char) -> isize,
    pub rbd_write_zeroes: unsafe extern "C" fn(ImageT, u64, usize, c_int, c_int) -> isize,
    pub rbd_flush: unsafe extern "C" fn(ImageT) -> c_int,
    pub rbd_lock_acquire: unsafe extern "C" fn(ImageT, c_int) -> c_int,
    pub rbd_lock_get_owners:
        unsafe extern "C" fn(ImageT, *mut c_int, *mut *mut c_char, *mut usize) -> c_int,
    pub rbd_lock_get_owners_cleanup: unsafe extern "C" fn(*mut *mut c_char, usize),
    pub rbd_lock_break: unsafe extern "C" fn(ImageT, c_int, *const c_char) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, CallbackT, *mut CompletionT) -> c_int,
    pub rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    pub rbd_aio_wait_for_complete: unsafe extern "C" fn(CompletionT) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(CompletionT),
}

/// The last `dlerror()` text, or a fallback.
fn dl_error(what: &str) -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        format!("{what}: unknown dlopen error")
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        format!("{what}: {}", unsafe { CStr::from_ptr(p) }.to_string_lossy())
    }
}

fn open_library(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name}: bad library name"))?;
    // SAFETY: a valid C string; RTLD_NOW resolves everything now so a broken library fails
    // here rather than at a later call.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        Err(dl_error(name))
    } else {
        Ok(h)
    }
}

fn symbol(handle: *mut c_void, lib: &str, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name}: bad symbol name"))?;
    // SAFETY: `handle` is a live dlopen handle; `c` a valid C string.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        Err(dl_error(&format!("{lib}: symbol {name}")))
    } else {
        Ok(p)
    }
}

/// A resolved symbol as the function pointer type `F`.
///
/// # Safety
/// `p` is the address of a function whose C signature is `F`.
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    // Function and data pointers have the same size on every target dhrd builds for.
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (asserted); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

impl Lib {
    fn load() -> Result<Lib, String> {
        let rados = open_library(LIBRADOS)?;
        let rbd = open_library(LIBRBD)?;
        macro_rules! sym {
            ($h:expr, $lib:expr, $name:ident) => {{
                let p = symbol($h, $lib, stringify!($name))?;
                // SAFETY: the symbol is the C function of that name, whose signature is
                // the field's type (Ceph 16 headers, checked against librbd.h).
                unsafe { as_fn(p) }
            }};
        }
        Ok(Lib {
            rados_create2: sym!(rados, LIBRADOS, rados_create2),
            rados_conf_read_file: sym!(rados, LIBRADOS, rados_conf_read_file),
            rados_conf_parse_env: sym!(rados, LIBRADOS, rados_conf_parse_env),
            rados_conf_set: sym!(rados, LIBRADOS, rados_conf_set),
            rados_connect: sym!(rados, LIBRADOS, rados_connect),
            rados_shutdown: sym!(rados, LIBRADOS, rados_shutdown),
            rados_ioctx_create: sym!(rados, LIBRADOS, rados_ioctx_create),
            rados_ioctx_destroy: sym!(rados, LIBRADOS, rados_ioctx_destroy),
            rados_ioctx_set_namespace: sym!(rados, LIBRADOS, rados_ioctx_set_namespace),
            rados_conf_get: sym!(rados, LIBRADOS, rados_conf_get),
            rados_stat: sym!(rados, LIBRADOS, rados_stat),
            rados_get_last_version: sym!(rados, LIBRADOS, rados_get_last_version),
            rbd_create: sym!(rbd, LIBRBD, rbd_create),
            rbd_open: sym!(rbd, LIBRBD, rbd_open),
            rbd_open_read_only: sym!(rbd, LIBRBD, rbd_open_read_only),
            rbd_close: sym!(rbd, LIBRBD, rbd_close),
            rbd_stat: sym!(rbd, LIBRBD, rbd_stat),
            rbd_get_features: sym!(rbd, LIBRBD, rbd_get_features),
            rbd_resize: sym!(rbd, LIBRBD, rbd_resize),
            rbd_get_size: sym!(rbd, LIBRBD, rbd_get_size),
            rbd_get_id: sym!(rbd, LIBRBD, rbd_get_id),
            rbd_metadata_get: sym!(rbd, LIBRBD, rbd_metadata_get),
            rbd_metadata_set: sym!(rbd, LIBRBD, rbd_metadata_set),
            rbd_metadata_remove: sym!(rbd, LIBRBD, rbd_metadata_remove),
            rbd_lock_release: sym!(rbd, LIBRBD, rbd_lock_release),
            rbd_read: sym!(rbd, LIBRBD, rbd_read),
            rbd_write: sym!(rbd, LIBRBD, rbd_write),
            rbd_write_zeroes: sym!(rbd, LIBRBD, rbd_write_zeroes),
            rbd_flush: sym!(rbd, LIBRBD, rbd_flush),
            rbd_lock_acquire: sym!(rbd, LIBRBD, rbd_lock_acquire),
            rbd_lock_get_owners: sym!(rbd, LIBRBD, rbd_lock_get_owners),
            rbd_lock_get_owners_cleanup: sym!(rbd, LIBRBD, rbd_lock_get_owners_cleanup),
            rbd_lock_break: sym!(rbd, LIBRBD, rbd_lock_break),
            rbd_aio_create_completion: sym!(rbd, LIBRBD, rbd_aio_create_completion),
            rbd_aio_read: sym!(rbd, LIBRBD, rbd_aio_read),
            rbd_aio_wait_for_complete: sym!(rbd, LIBRBD, rbd_aio_wait_for_complete),
            rbd_aio_get_return_value: sym!(rbd, LIBRBD, rbd_aio_get_return_value),
            rbd_aio_release: sym!(rbd, LIBRBD, rbd_aio_release),
        })
    }
}

/// The process-wide table, loaded on first use; the error says what is missing.
pub(crate) fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(Lib::load).as_ref().map_err(Clone::clone)
}
