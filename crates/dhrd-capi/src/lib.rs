//! The C API of the dhrd engine: one hybrid object (a RAM tier plus a durable backing: a
//! file, a block device or a Ceph RBD image, optionally under NVM write-back or an SSD
//! cache tier) behind an opaque handle. The layers are built by `dhrd_stack`, as for
//! `dhrd nbd`, so the C API offers every backing and tier the command line does.
//!
//! Conventions, for every function:
//! - the return value is 0 on success or a positive errno value (`EIO`, `ENOSPC`,
//!   `EROFS`, `EINVAL`, `EFBIG`, `ENOMEM`, `ETIMEDOUT`, ...), as pthreads functions do;
//!   `errno` itself is not touched. A null pointer where a value is required is `EINVAL`.
//! - no panic crosses the boundary: each body runs under `catch_unwind`, and a panic
//!   (which would be a bug in dhrd) is returned as `EIO`.
//! - durability is the engine's: in `DHRD_DURABILITY_SYNC` a successful `dhrd_write`
//!   is on the device when it returns; in the other modes at `dhrd_flush` or
//!   `dhrd_close`. After a backing failure other than ENOSPC the object refuses every
//!   later write with `EIO`, for good, as the engine does (C4); reads go on.
//!
//! Device timing (E1): `dhrd_options.backing_timing`, or else the environment variable
//! `DHRD_BACKING_TIMING`, makes every backing operation take at least an emulated device's
//! latency plus its transfer time, so experiments on a slow or non-volatile device run on
//! any machine (docs/library.md).
//!
//! Ownership and threads: `dhrd_open` hands out a handle that the caller owns until
//! `dhrd_close`, which flushes and frees it; no call may use the handle after that, and
//! `dhrd_close` must not race other calls on the same handle. Every other function may be
//! called from many threads at once on the same handle.
//!
//! ABI: the shared library's soname is `libdhrd_capi.so.1` ([`DHRD_ABI_VERSION`]); it
//! changes only when a function or struct changes incompatibly. `struct dhrd_options`
//! carries the size the caller was compiled with (`struct_bytes`, set by
//! `dhrd_options_init`): fields are only ever appended, the library fills and reads only
//! that many bytes and gives fields past them their defaults, which are all zero.
//!
//! fork(): the library's threads do not exist in a child, and locks they held stay held
//! there. After a process that opened an object forks, every call in the child fails at
//! once with `ECHILD` (instead of hanging or acting on a copy); handles are the parent's.
//! A child that needs dhrd opens its objects after exec.
#![deny(clippy::undocumented_unsafe_blocks)]
// The exported types carry their C names (`dhrd_object`, `dhrd_options`, ...).
#![allow(non_camel_case_types)]

use dhrd_engine::{Durability, Error, ObjectConfig, RamBudget};
use dhrd_io::DeviceProfile;
use dhrd_rbd::RbdOptions;
use dhrd_stack::{BackingConfig, FastLayer, Stack, StackConfig};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Returned for a panic caught at the boundary (a bug in dhrd, never a normal outcome).
const PANIC_ERRNO: c_int = libc::EIO;

/// The ABI version: the number in the shared library's soname (`libdhrd_capi.so.1`).
pub const DHRD_ABI_VERSION: u32 = 1;

/// Bytes of the shortest `struct dhrd_options` this library accepts: the fields up to
/// `tier_adopt`, which every `dhrd.h` with `struct_bytes` has.
pub const DHRD_OPTIONS_BYTES_MIN: u32 =
    (std::mem::offset_of!(dhrd_options, tier_adopt) + std::mem::size_of::<bool>()) as u32;

/// `dhrd_options.durability`: every write is on the device before `dhrd_write` returns.
pub const DHRD_DURABILITY_SYNC: u32 = 0;
/// `dhrd_options.durability`: writes are durable at `dhrd_flush` and `dhrd_close`.
pub const DHRD_DURABILITY_FSYNC: u32 = 1;
/// `dhrd_options.durability`: as FSYNC, plus a flush every `periodic_secs` seconds.
pub const DHRD_DURABILITY_PERIODIC: u32 = 2;

/// Options of `dhrd_open`; fill with `dhrd_options_init(&o, sizeof o)` (or the
/// `dhrd_options_default(&o)` macro) first, then change fields. New fields are only ever
/// appended, and their zero value is their default.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dhrd_options {
    /// The size of this struct as the caller was compiled with it (`sizeof`), set by
    /// `dhrd_options_init`: the library reads and writes only that many bytes.
    pub struct_bytes: u32,
    /// One of the `DHRD_DURABILITY_*` values (a plain integer: any value C passes is
    /// defined behaviour, and an unknown one is `EINVAL`).
    pub durability: u32,
    /// Flush period for `DHRD_DURABILITY_PERIODIC`, in seconds (at least 1).
    pub periodic_secs: u32,
    /// RAM the object may use; 0 for no limit. Data beyond it is served from the backing.
    pub ram_budget_bytes: u64,
    /// Chunk size of the RAM tier (a power of two); 0 for the engine's default.
    pub chunk_bytes: u64,
    /// Create the backing file if it does not exist.
    pub create: bool,
    /// Extend the backing file to at least this many bytes at open (0: leave it).
    pub min_len_bytes: u64,
    /// Open read-only: writes fail with `EROFS`.
    pub read_only: bool,
    /// Device timing of the backing: "ssd", "hdd", "nvm" or "READ_US,WRITE_US,SYNC_US,MBPS"
    /// (microseconds; MB/s, 0 for unlimited). Each backing operation then takes at least
    /// that latency plus its transfer time on a bandwidth shared by all requests. NULL
    /// (the default): the environment variable `DHRD_BACKING_TIMING` if set and not
    /// empty, else none; "": none, whatever the environment says. A value not in that
    /// syntax is `EINVAL`. Read during `dhrd_open` only.
    pub backing_timing: *const c_char,
    /// Cache mode, when `ram_budget_bytes` is smaller than the data: which chunk leaves RAM
    /// when a read needs room, "s3fifo" (scan resistant), "clock" or "off". NULL: s3fifo.
    pub cache_policy: *const c_char,
    /// Which read misses bring their chunk into RAM once the budget is full: "second" (on
    /// a second miss; one-off reads bypass RAM) or "always". NULL: second.
    pub cache_admit: *const c_char,
    /// Read-ahead into RAM: "none", "sequential" or "history". NULL: history.
    pub read_ahead: *const c_char,
    /// Do not copy the backing into RAM in the background at open: RAM fills only with
    /// what is read and written (a pure cache).
    pub no_prefill: bool,
    /// Tiered device (T1): an SSD cache tier in this file (created if missing) between the
    /// RAM tier and the backing, which becomes the slow lower tier. Hot chunks are
    /// promoted to it; writes are durable on it before they return and are written back
    /// in the background. Its contents survive a crash and are used at the next open.
    /// NULL: no SSD tier.
    pub tier_ssd_path: *const c_char,
    /// Size of the SSD tier in bytes (header and slot table included); required with
    /// `tier_ssd_path`.
    pub tier_ssd_bytes: u64,
    /// How writes reach the backing through the SSD tier: "writeback" or "writethrough".
    /// NULL: writeback.
    pub tier_mode: *const c_char,
    /// Device timing of the SSD tier's file, in `backing_timing`'s syntax. NULL or "":
    /// none (no environment variable applies).
    pub tier_ssd_timing: *const c_char,
    /// The SSD tier records which backing it caches. When it was made for another backing
    /// (or this one was moved or copied), or the backing was changed while no object was
    /// open over it, its clean chunks are dropped; while it holds dirty chunks `dhrd_open`
    /// fails with `EINVAL`, unless this is true: then the dirty chunks are kept and written
    /// back over the backing. While an SSD tier holds data its backing file lacks, the
    /// file carries the extended attribute `user.dhrd.cache`, and `dhrd_open` of it without
    /// that SSD tier fails with `EBUSY` (remove the attribute to use the file as it is).
    pub tier_adopt: bool,
    /// An RBD image only: serve reads from RAM only while the image's exclusive lock was
    /// confirmed at the cluster within this many milliseconds (a read lease, docs/rbd.md);
    /// reads fail with `EIO` otherwise. It must be below the cluster's watch timeout less a
    /// ping interval and a margin, else `dhrd_open` fails with `EINVAL`. 0: no lease (RAM
    /// serves reads until the object learns that it lost the lock).
    pub rbd_read_lease_ms: u64,
    /// NVM write-back (M4): a file on non-volatile memory (a pmem/DAX mount; created if
    /// missing) between the RAM tier and the backing. A write returns once it is durable
    /// in this file and is written back to the backing in the background; after a crash
    /// the next open serves the dirty chunks from it and writes them back. DRAM is never
    /// taken for non-volatile: a file on tmpfs or ramfs is `EINVAL`, as are a read-only
    /// open and `tier_ssd_path` beside it. It records which backing it caches and marks
    /// the backing as `tier_ssd_path` does (`tier_adopt` applies to it too). NULL: none.
    pub nvm_path: *const c_char,
    /// Device timing of the NVM file, in `backing_timing`'s syntax. NULL or "": none (no
    /// environment variable applies).
    pub nvm_timing: *const c_char,
}

/// What `dhrd_options_default` fills in, and what a null `opts` means.
const OPTIONS_DEFAULT: dhrd_options = dhrd_options {
    struct_bytes: std::mem::size_of::<dhrd_options>() as u32,
    durability: DHRD_DURABILITY_SYNC,
    periodic_secs: 0,
    ram_budget_bytes: 0,
    chunk_bytes: 0,
    create: false,
    min_len_bytes: 0,
    read_only: false,
    backing_timing: std::ptr::null(),
    cache_policy: std::ptr::null(),
    cache_admit: std::ptr::null(),
    read_ahead: std::ptr::null(),
    no_prefill: false,
    tier_ssd_path: std::ptr::null(),
    tier_ssd_bytes: 0,
    tier_mode: std::ptr::null(),
    tier_ssd_timing: std::ptr::null(),
    tier_adopt: false,
    rbd_read_lease_ms: 0,
    nvm_path: std::ptr::null(),
    nvm_timing: std::ptr::null(),
};

/// Set in a child after fork() of a process that opened an object (see the crate doc).
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    FORKED.store(true, std::sync::atomic::Ordering::Release);
}

/// Registers the fork handler once, before the first object (and its threads) exists.
fn guard_fork() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain extern "C" function that only stores an atomic, which
        // is async-signal-safe as a child handler must be.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// The environment variable a NULL `dhrd_options.backing_timing` defers to, so that an
/// unmodified program can be run against an emulated device.
const BACKING_TIMING_ENV: &str = "DHRD_BACKING_TIMING";

/// Load progress of the RAM tier.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dhrd_progress {
    pub chunk_bytes: u64,
    pub chunks_total: u64,
    pub chunks_loaded: u64,
    /// Chunks whose load failed and that are retried, or failed for good.
    pub chunks_retrying: u64,
    pub chunks_failed: u64,
    /// Chunks left on the backing because the RAM budget is used up.
    pub chunks_over_budget: u64,
    pub bytes_total: u64,
    pub bytes_loaded: u64,
    pub ram_resident_bytes: u64,
    pub rate_bytes_per_s: f64,
    pub fully_loaded: bool,
}

/// Counters since open.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dhrd_stats {
    pub reads_ram: u64,
    pub reads_backing: u64,
    pub bytes_read_ram: u64,
    pub bytes_read_backing: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub writes_failed: u64,
    pub syncs: u64,
    pub sync_failures: u64,
    pub flushes: u64,
    /// Mean and largest number of writes one backing sync covered (group commit).
    pub commit_batch_writes_mean: f64,
    pub commit_batch_writes_max: u64,
    /// The object refuses writes after a backing failure (C4).
    pub read_only_after_failure: bool,
    /// Reads served from RAM over all reads.
    pub hit_ratio: f64,
    /// Cache mode: chunks evicted, misses admitted into RAM, misses served from the
    /// backing only.
    pub evictions: u64,
    pub admissions: u64,
    pub bypasses: u64,
    /// Read-ahead: chunks loaded ahead, used by a read, evicted unread.
    pub read_ahead_loaded: u64,
    pub read_ahead_used: u64,
    pub read_ahead_wasted: u64,
    /// SSD tier (all 0 without one): chunk reads it served and the lower tier served,
    /// chunks promoted, dirty slots now, chunks written back to the lower tier.
    pub tier_chunk_reads_ssd: u64,
    pub tier_chunk_reads_lower: u64,
    pub tier_promotions: u64,
    pub tier_slots_dirty: u64,
    pub tier_written_back: u64,
}

/// An open hybrid object and the layers under it. Opaque to C.
pub struct dhrd_object {
    stack: Stack,
}

/// The errno of an engine error: the one mapping used by every function.
fn errno_of(e: &Error) -> c_int {
    e.errno()
}

/// Runs `f` with panics turned into `PANIC_ERRNO`; in a forked child, `ECHILD` at once.
fn guarded(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    if FORKED.load(std::sync::atomic::Ordering::Acquire) {
        return libc::ECHILD;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e,
        Err(_) => PANIC_ERRNO,
    }
}

/// The object behind a handle; `EINVAL` for null.
///
/// # Safety
/// `obj` is null or a handle from `dhrd_open` not yet closed.
unsafe fn object<'a>(obj: *const dhrd_object) -> Result<&'a dhrd_object, c_int> {
    // SAFETY: per the function contract, non-null means a live handle.
    unsafe { obj.as_ref() }.ok_or(libc::EINVAL)
}

/// Fills the `struct_bytes` bytes at `opts` with the defaults (`sync` durability, no RAM
/// limit, the default chunk size, no creation, read-write: all zero) and sets
/// `opts->struct_bytes`. Pass `sizeof` of the struct the caller was compiled with; the
/// `dhrd_options_default(opts)` macro does. `EINVAL` for null or for fewer bytes than the
/// struct up to `tier_adopt` (the shortest this library accepts).
///
/// # Safety
/// `opts` is null or points to `struct_bytes` writable bytes, aligned for a
/// `dhrd_options`.
#[no_mangle]
pub unsafe extern "C" fn dhrd_options_init(opts: *mut dhrd_options, struct_bytes: usize) -> c_int {
    guarded(|| {
        if opts.is_null() || struct_bytes < DHRD_OPTIONS_BYTES_MIN as usize {
            return Err(libc::EINVAL);
        }
        let n = u32::try_from(struct_bytes).map_err(|_| libc::EINVAL)?;
        // SAFETY: `opts` points to `struct_bytes` writable, aligned bytes (the contract);
        // every default is the zero value (asserted by a test), so zeroed bytes are the
        // defaults, for the fields this library knows and for later ones alike.
        unsafe {
            std::ptr::write_bytes(opts.cast::<u8>(), 0, struct_bytes);
            std::ptr::addr_of_mut!((*opts).struct_bytes).write(n);
        }
        Ok(())
    })
}

/// The caller's options: the `struct_bytes` it states (at least the minimum), fields past
/// them at their defaults; fields of a newer caller this library does not know must be
/// zero (their default), else `EINVAL`.
///
/// # Safety
/// `given` points to a `dhrd_options` of at least `given->struct_bytes` readable bytes.
unsafe fn options_from(given: *const dhrd_options) -> Result<dhrd_options, c_int> {
    // SAFETY: every version of the struct starts with `struct_bytes`.
    let n = unsafe { std::ptr::addr_of!((*given).struct_bytes).read() } as usize;
    if n < DHRD_OPTIONS_BYTES_MIN as usize {
        return Err(libc::EINVAL);
    }
    let ours = std::mem::size_of::<dhrd_options>();
    // SAFETY: the caller's struct holds `n` readable bytes (the contract).
    let bytes = unsafe { std::slice::from_raw_parts(given.cast::<u8>(), n) };
    if bytes
        .get(ours..)
        .is_some_and(|later| later.iter().any(|b| *b != 0))
    {
        return Err(libc::EINVAL);
    }
    let mut o = OPTIONS_DEFAULT;
    // SAFETY: copies the caller's bytes over the first min(n, ours) bytes of a valid
    // struct; the bytes are those of a `dhrd_options` of the same layout (C's bools are 0
    // or 1, pointers any value).
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            std::ptr::addr_of_mut!(o).cast::<u8>(),
            n.min(ours),
        );
    }
    Ok(o)
}

/// # Safety
/// The string fields of `o` are null or NUL-terminated.
unsafe fn config_of(o: &dhrd_options, path: &Path) -> Result<ObjectConfig, c_int> {
    let durability = match o.durability {
        DHRD_DURABILITY_SYNC => Durability::Sync,
        DHRD_DURABILITY_FSYNC => Durability::Fsync,
        DHRD_DURABILITY_PERIODIC if o.periodic_secs > 0 => {
            Durability::Periodic(Duration::from_secs(u64::from(o.periodic_secs)))
        }
        _ => return Err(libc::EINVAL),
    };
    let mut cfg = ObjectConfig {
        durability,
        read_only: o.read_only,
        budget: (o.ram_budget_bytes > 0).then(|| RamBudget::new(o.ram_budget_bytes)),
        name: format!("dhrd-capi:{}", path.display()),
        ..Default::default()
    };
    // SAFETY: null or NUL-terminated (this function's contract).
    if let Some(p) = unsafe { enum_of(o.cache_policy) }? {
        cfg.cache.policy = p;
    }
    // SAFETY: as above.
    if let Some(a) = unsafe { enum_of(o.cache_admit) }? {
        cfg.cache.admission = a;
    }
    // SAFETY: as above.
    if let Some(r) = unsafe { enum_of(o.read_ahead) }? {
        cfg.cache.read_ahead = r;
    }
    cfg.cache.prefill = !o.no_prefill;
    Ok(cfg)
}

/// Parses an optional C string option; NULL is `None`, a bad value `EINVAL`.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn enum_of<T: std::str::FromStr>(p: *const c_char) -> Result<Option<T>, c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated per the function contract.
    let c = unsafe { CStr::from_ptr(p) };
    let s = c.to_str().map_err(|_| libc::EINVAL)?;
    s.parse().map(Some).map_err(|_| libc::EINVAL)
}

/// The device timing `o` asks for: its `backing_timing`, else `$DHRD_BACKING_TIMING`.
///
/// # Safety
/// `o.backing_timing` is null or a NUL-terminated string.
unsafe fn timing_of(o: &dhrd_options) -> Result<Option<DeviceProfile>, c_int> {
    // SAFETY: null or NUL-terminated (this function's contract).
    unsafe { profile_of(o.backing_timing, Some(BACKING_TIMING_ENV)) }
}

/// A device timing option: `p`, else (when `p` is null) the environment variable `env`.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn profile_of(p: *const c_char, env: Option<&str>) -> Result<Option<DeviceProfile>, c_int> {
    let spec = if p.is_null() {
        let Some(env) = env else {
            return Ok(None);
        };
        match std::env::var_os(env) {
            // Not valid UTF-8 cannot be a profile; parse refuses the replacement chars.
            Some(v) => v.to_string_lossy().into_owned(),
            None => return Ok(None),
        }
    } else {
        // SAFETY: non-null and NUL-terminated per the function contract.
        let c = unsafe { CStr::from_ptr(p) };
        c.to_str().map_err(|_| libc::EINVAL)?.to_owned()
    };
    if spec.is_empty() {
        return Ok(None);
    }
    DeviceProfile::parse(&spec).map(Some).ok_or(libc::EINVAL)
}

/// A path option: NULL is `None`.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn path_of(p: *const c_char) -> Option<PathBuf> {
    // SAFETY: non-null and NUL-terminated per the function contract.
    let c = (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })?;
    Some(Path::new(std::ffi::OsStr::from_bytes(c.to_bytes())).to_path_buf())
}

/// The fast layer `o` asks for: an SSD tier (`tier_ssd_path`), NVM write-back
/// (`nvm_path`) or none. Both at once, an SSD tier of size 0, a fast layer under a
/// read-only object, or a bad mode or timing is `EINVAL`.
///
/// # Safety
/// The tier and NVM fields of `o` are null or NUL-terminated strings.
unsafe fn fast_layer_of(o: &dhrd_options) -> Result<Option<FastLayer>, c_int> {
    // SAFETY: null or NUL-terminated (this function's contract), for each string below.
    let (ssd, nvm) = unsafe { (path_of(o.tier_ssd_path), path_of(o.nvm_path)) };
    // A fast layer takes writes; an SSD tier without a size is no tier.
    let refused = (ssd.is_some() && nvm.is_some())
        || ((ssd.is_some() || nvm.is_some()) && o.read_only)
        || (ssd.is_some() && o.tier_ssd_bytes == 0);
    if refused {
        return Err(libc::EINVAL);
    }
    if let Some(file) = ssd {
        return Ok(Some(FastLayer::Ssd {
            file,
            bytes: o.tier_ssd_bytes,
            // SAFETY: as above.
            mode: unsafe { enum_of(o.tier_mode) }?.unwrap_or_default(),
            // SAFETY: as above.
            timing: unsafe { profile_of(o.tier_ssd_timing, None) }?,
        }));
    }
    // SAFETY: as above.
    let timing = unsafe { profile_of(o.nvm_timing, None) }?;
    Ok(nvm.map(|file| FastLayer::Nvm { file, timing }))
}

/// The stack `o` describes over the backing `path`: a Ceph RBD image for
/// `rbd:POOL/IMAGE` (the cluster from `$CEPH_CONF` or /etc/ceph/ceph.conf, the client from
/// `$CEPH_ARGS`, e.g. `--id NAME`), else a file or block device. Every option is parsed
/// before anything is opened, so a bad value creates nothing and takes no lock.
///
/// # Safety
/// The string fields of `o` are null or NUL-terminated.
unsafe fn stack_config_of(o: &dhrd_options, path: &Path) -> Result<StackConfig, c_int> {
    let rbd = RbdOptions {
        read_lease: (o.rbd_read_lease_ms > 0).then(|| Duration::from_millis(o.rbd_read_lease_ms)),
        ..Default::default()
    };
    let backing = BackingConfig {
        create: o.create,
        min_len: (o.min_len_bytes > 0).then_some(o.min_len_bytes),
        rbd,
        // SAFETY: null or NUL-terminated (this function's contract).
        timing: unsafe { timing_of(o) }?,
        ..BackingConfig::new(path)
    };
    Ok(StackConfig {
        backing,
        // SAFETY: as above.
        fast: unsafe { fast_layer_of(o) }?,
        adopt_cache: o.tier_adopt,
        drop_cache_mark: false,
        chunk_bytes: (o.chunk_bytes > 0).then_some(o.chunk_bytes),
        // SAFETY: as above.
        object: unsafe { config_of(o, path) }?,
    })
}

/// Opens the backing at `path` (a file, a block device or `rbd:POOL/IMAGE`), with the
/// fast layer the options ask for, as a hybrid object and stores its handle in `*out`.
/// Returns at once; the RAM tier fills in the background while reads and writes are
/// served (`dhrd_get_progress`, `dhrd_wait_loaded`). `opts` may be null for the defaults
/// (then `DHRD_BACKING_TIMING` alone decides the device timing, see `backing_timing`).
///
/// A backing file is locked against a second open (an OFD lock, exclusive or shared for
/// `read_only`): a second `dhrd_open` of it, in this process or another, fails with
/// `EBUSY`, as does one of an RBD image another client holds (after waiting 45 s for its
/// lock) or of a backing marked by a cache this open lacks.
///
/// # Safety
/// `path` is a NUL-terminated string; `opts` is null or points to a `dhrd_options` of at
/// least `opts->struct_bytes` readable bytes (filled by `dhrd_options_init`) whose nine
/// strings (`backing_timing`, `cache_policy`, `cache_admit`, `read_ahead`,
/// `tier_ssd_path`, `tier_mode`, `tier_ssd_timing`, `nvm_path`, `nvm_timing`) are each
/// null or NUL-terminated; `out` points to writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn dhrd_open(
    path: *const c_char,
    opts: *const dhrd_options,
    out: *mut *mut dhrd_object,
) -> c_int {
    guarded(|| {
        if path.is_null() || out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-null and NUL-terminated per the function contract.
        let path = unsafe { CStr::from_ptr(path) };
        let path = Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
        guard_fork();
        let o = match opts.is_null() {
            true => OPTIONS_DEFAULT,
            // SAFETY: per the function contract, non-null means a `dhrd_options` of at
            // least its stated size.
            false => unsafe { options_from(opts) }?,
        };
        // SAFETY: dhrd_open's contract: the option strings are null or NUL-terminated.
        let cfg = unsafe { stack_config_of(&o, path) }?;
        let stack = Stack::open(cfg).map_err(|e| e.errno())?;
        let handle = Box::into_raw(Box::new(dhrd_object { stack }));
        // SAFETY: `out` is non-null and writable per the function contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Makes every write durable, stops the loader and frees the handle. With an SSD tier or
/// NVM write-back it waits up to `DRAIN_ON_CLOSE` (60 s, as `dhrd nbd`'s clean stop) for
/// the write-back; what is left stays safe in that layer, is written back at the next
/// open, and keeps the backing marked until then. An RBD image's lock is released last.
/// The handle is gone even when the flush fails (the error is returned): close exactly
/// once.
///
/// # Safety
/// `obj` is null (then `EINVAL`) or a handle from `dhrd_open` that no other thread is
/// using and that is not used again.
#[no_mangle]
pub unsafe extern "C" fn dhrd_close(obj: *mut dhrd_object) -> c_int {
    guarded(|| {
        if obj.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a handle from `dhrd_open` (Box::into_raw), closed once per the contract.
        let b = unsafe { Box::from_raw(obj) };
        let (flushed, _released) = b.stack.close(DRAIN_ON_CLOSE);
        flushed.map_err(|e| errno_of(&e))
    })
}

/// How long `dhrd_close` waits for a fast layer's write-back.
const DRAIN_ON_CLOSE: Duration = Duration::from_secs(60);

/// Reads up to `len` bytes at `offset` into `buf`, like pread(2): `*nread` is less than
/// `len` only at the end of the object (0 at or past it).
///
/// # Safety
/// `obj` is a live handle; `buf` points to `len` writable bytes; `nread` to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn dhrd_read(
    obj: *const dhrd_object,
    buf: *mut c_void,
    len: usize,
    offset: u64,
    nread: *mut usize,
) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        if (buf.is_null() && len > 0) || nread.is_null() {
            return Err(libc::EINVAL);
        }
        let dst: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: `buf` holds `len` writable bytes per the function contract.
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) }
        };
        let r = o
            .stack
            .object()
            .read_at(dst, offset)
            .map_err(|e| errno_of(&e))?;
        // SAFETY: `nread` is non-null and writable per the function contract.
        unsafe { nread.write(r.bytes) };
        Ok(())
    })
}

/// Writes `len` bytes from `buf` at `offset` (extending the object if needed). In
/// `sync` durability the bytes are on the device when this returns 0.
///
/// # Safety
/// `obj` is a live handle; `buf` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn dhrd_write(
    obj: *const dhrd_object,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        if buf.is_null() && len > 0 {
            return Err(libc::EINVAL);
        }
        let src: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: `buf` holds `len` readable bytes per the function contract.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
        };
        o.stack
            .object()
            .write_at(src, offset)
            .map_err(|e| errno_of(&e))
    })
}

/// Makes every write that returned before this call durable.
///
/// # Safety
/// `obj` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn dhrd_flush(obj: *const dhrd_object) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        o.stack.object().flush().map_err(|e| errno_of(&e))
    })
}

/// Sets the object's length (truncating or extending with zeros), durably per the mode.
///
/// # Safety
/// `obj` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn dhrd_set_len(obj: *const dhrd_object, len_bytes: u64) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        o.stack
            .object()
            .set_len(len_bytes)
            .map_err(|e| errno_of(&e))
    })
}

/// Stores the object's length in `*out`.
///
/// # Safety
/// `obj` is a live handle; `out` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dhrd_len(obj: *const dhrd_object, out: *mut u64) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: per the function contract, non-null means writable.
        let out = unsafe { out.as_mut() }.ok_or(libc::EINVAL)?;
        *out = o.stack.object().len();
        Ok(())
    })
}

/// Waits until the RAM tier holds every chunk it can (0), or `timeout_ms` passed
/// (`ETIMEDOUT`); 0 waits without limit.
///
/// # Safety
/// `obj` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn dhrd_wait_loaded(obj: *const dhrd_object, timeout_ms: u64) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        let timeout = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms));
        if o.stack.object().wait_loaded(timeout) {
            Ok(())
        } else {
            Err(libc::ETIMEDOUT)
        }
    })
}

/// Stores the load progress in `*out`.
///
/// # Safety
/// `obj` is a live handle; `out` points to a writable `dhrd_progress`.
#[no_mangle]
pub unsafe extern "C" fn dhrd_get_progress(
    obj: *const dhrd_object,
    out: *mut dhrd_progress,
) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: per the function contract, non-null means writable.
        let out = unsafe { out.as_mut() }.ok_or(libc::EINVAL)?;
        let p = o.stack.object().progress();
        *out = dhrd_progress {
            chunk_bytes: p.chunk_bytes,
            chunks_total: p.chunks_total,
            chunks_loaded: p.chunks_loaded,
            chunks_retrying: p.chunks_retrying,
            chunks_failed: p.chunks_failed,
            chunks_over_budget: p.chunks_over_budget,
            bytes_total: p.bytes_total,
            bytes_loaded: p.bytes_loaded,
            ram_resident_bytes: p.ram_resident_bytes,
            rate_bytes_per_s: p.rate_bytes_per_s,
            fully_loaded: o.stack.object().is_fully_loaded(),
        };
        Ok(())
    })
}

/// Stores the counters in `*out`.
///
/// # Safety
/// `obj` is a live handle; `out` points to a writable `dhrd_stats`.
#[no_mangle]
pub unsafe extern "C" fn dhrd_get_stats(obj: *const dhrd_object, out: *mut dhrd_stats) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: per the function contract, non-null means writable.
        let out = unsafe { out.as_mut() }.ok_or(libc::EINVAL)?;
        let s = o.stack.object().stats();
        *out = dhrd_stats {
            reads_ram: s.reads_ram,
            reads_backing: s.reads_backing,
            bytes_read_ram: s.bytes_read_ram,
            bytes_read_backing: s.bytes_read_backing,
            writes: s.writes,
            bytes_written: s.bytes_written,
            writes_failed: s.writes_failed,
            syncs: s.syncs,
            sync_failures: s.sync_failures,
            flushes: s.flushes,
            commit_batch_writes_mean: s.commit_batch_writes_mean,
            commit_batch_writes_max: s.commit_batch_writes_max,
            read_only_after_failure: o.stack.object().failure().is_some(),
            hit_ratio: s.hit_ratio(),
            evictions: s.evictions,
            admissions: s.admissions,
            bypasses: s.bypasses,
            read_ahead_loaded: s.ahead_loaded,
            read_ahead_used: s.ahead_used,
            read_ahead_wasted: s.ahead_wasted,
            ..Default::default()
        };
        if let Some(ts) = o.stack.layers().tier.as_ref().map(|t| t.stats()) {
            out.tier_chunk_reads_ssd = ts.reads_ssd;
            out.tier_chunk_reads_lower = ts.reads_lower;
            out.tier_promotions = ts.promotions;
            out.tier_slots_dirty = ts.slots_dirty;
            out.tier_written_back = ts.written_back;
        }
        Ok(())
    })
}

/// Stores the status document of the object and the layers under it in `buf` as JSON,
/// NUL-terminated: every counter of the engine, the load, and of NVM write-back or the SSD
/// tier, under the stable names of `dhrd nbd`'s status file (docs/nbd.md, "Status for
/// monitoring"; fields are only ever added). `*json_bytes` is set to the document's
/// length without the NUL; when `buf_bytes` is not more than that, nothing is written and
/// the call returns `ERANGE`: call again with a larger buffer, and some room to spare, since
/// the counters may grow longer between two calls.
///
/// # Safety
/// `obj` is a live handle; `buf` is null (with `buf_bytes` 0) or points to `buf_bytes`
/// writable bytes; `json_bytes` points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn dhrd_get_status_json(
    obj: *const dhrd_object,
    buf: *mut c_char,
    buf_bytes: usize,
    json_bytes: *mut usize,
) -> c_int {
    guarded(|| {
        // SAFETY: per the function contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: per the function contract, non-null means writable.
        let len_out = unsafe { json_bytes.as_mut() }.ok_or(libc::EINVAL)?;
        if buf.is_null() && buf_bytes > 0 {
            return Err(libc::EINVAL);
        }
        let doc = serde_json::Value::Object(o.stack.status()).to_string();
        *len_out = doc.len();
        if doc.len() >= buf_bytes {
            return Err(libc::ERANGE);
        }
        // SAFETY: `buf` holds `buf_bytes` writable bytes, more than the document and its
        // NUL (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(doc.as_ptr(), buf.cast::<u8>(), doc.len());
            buf.add(doc.len()).write(0);
        }
        Ok(())
    })
}

/// A static description of an errno value this library returns (`strerror` without
/// locale or thread concerns); never null.
#[no_mangle]
pub extern "C" fn dhrd_strerror(err: c_int) -> *const c_char {
    let s: &'static CStr = match err {
        0 => c"success",
        libc::EINVAL => c"invalid argument",
        libc::EIO => {
            c"I/O error on the backing, or the object is read-only after one, or a read \
              refused because an RBD image's lock was lost or its read lease ran out"
        }
        libc::ENOSPC => c"the backing is full",
        libc::EROFS => c"the object is open read-only",
        libc::EFBIG => c"size beyond the maximum object size",
        libc::ENOMEM => c"the RAM tier could not be created or grown",
        libc::ETIMEDOUT => c"timed out",
        libc::ERANGE => c"the buffer is too small (the length needed was returned)",
        libc::ENOENT => c"no such file, or no such RBD image or pool",
        libc::EACCES => c"permission denied",
        libc::EBUSY => {
            c"in use: another open or client holds the backing's lock (a file's, or an RBD \
              image's exclusive lock), or the backing is marked as lacking data a cache holds \
              (open it with that cache)"
        }
        libc::ENOSYS => c"Ceph's client libraries (librbd1) are not installed",
        libc::EOPNOTSUPP => c"the RBD image lacks the exclusive-lock feature",
        libc::ESHUTDOWN => c"the RBD client was blocklisted: another client broke the image's lock",
        libc::ECHILD => {
            c"called in a child after fork(): dhrd objects and threads do not survive fork; \
              open objects after exec"
        }
        _ => c"error (see errno values)",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn errors_map_to_errno_and_panics_stay_inside() {
        assert_eq!(errno_of(&Error::NoSpace), libc::ENOSPC);
        assert_eq!(errno_of(&Error::ReadOnlyOpen), libc::EROFS);
        assert_eq!(
            errno_of(&Error::TooLarge {
                requested: 1,
                max: 0
            }),
            libc::EFBIG
        );
        assert_eq!(guarded(|| panic!("bug")), PANIC_ERRNO);
        assert_eq!(guarded(|| Err(libc::ENOSPC)), libc::ENOSPC);
    }

    #[test]
    fn every_default_is_zero_and_init_fills_only_the_given_bytes() {
        // dhrd_options_init writes zeros as the defaults: they must be.
        let d = OPTIONS_DEFAULT;
        assert!(d.durability == 0 && d.periodic_secs == 0 && d.ram_budget_bytes == 0);
        assert!(d.chunk_bytes == 0 && !d.create && d.min_len_bytes == 0 && !d.read_only);
        assert!(d.backing_timing.is_null() && d.cache_policy.is_null());
        assert!(d.cache_admit.is_null() && d.read_ahead.is_null() && !d.no_prefill);
        assert!(d.tier_ssd_path.is_null() && d.tier_ssd_bytes == 0 && d.tier_mode.is_null());
        assert!(d.tier_ssd_timing.is_null() && !d.tier_adopt && d.rbd_read_lease_ms == 0);
        assert!(d.nvm_path.is_null() && d.nvm_timing.is_null());
        /// Room for a struct, aligned as one.
        #[repr(C, align(8))]
        struct Buf([u8; 512]);
        let mut buf = Buf([0xA5u8; 512]);
        let n = DHRD_OPTIONS_BYTES_MIN as usize;
        let p = buf.0.as_mut_ptr().cast::<dhrd_options>();
        // SAFETY: `buf` has room for `n` bytes and the struct's alignment.
        let r = unsafe { dhrd_options_init(p, n) };
        assert_eq!(r, 0);
        assert!(
            buf.0[n..].iter().all(|b| *b == 0xA5),
            "wrote past the given size"
        );
        // A too-small size is refused before anything is written.
        // SAFETY: as above.
        let r = unsafe { dhrd_options_init(p, 4) };
        assert_eq!(r, libc::EINVAL);
    }

    #[test]
    fn every_errno_the_library_returns_has_its_own_text() {
        let generic = dhrd_strerror(-1);
        for e in [
            libc::EINVAL,
            libc::EIO,
            libc::ENOSPC,
            libc::EROFS,
            libc::EFBIG,
            libc::ENOMEM,
            libc::ETIMEDOUT,
            libc::ERANGE,
            libc::ENOENT,
            libc::EACCES,
            libc::EBUSY,
            libc::ENOSYS,
            libc::EOPNOTSUPP,
            libc::ESHUTDOWN,
            libc::ECHILD,
        ] {
            assert_ne!(
                dhrd_strerror(e),
                generic,
                "errno {e} has no text of its own"
            );
        }
    }

    #[test]
    fn null_pointers_are_einval() {
        // SAFETY: every pointer is null, which each function must refuse.
        unsafe {
            assert_eq!(dhrd_options_init(std::ptr::null_mut(), 64), libc::EINVAL);
            assert_eq!(dhrd_flush(std::ptr::null()), libc::EINVAL);
            assert_eq!(dhrd_close(std::ptr::null_mut()), libc::EINVAL);
            let mut h = std::ptr::null_mut();
            assert_eq!(
                dhrd_open(std::ptr::null(), std::ptr::null(), &mut h),
                libc::EINVAL
            );
        }
    }

    #[test]
    fn open_write_read_truncate_close() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = CString::new(dir.path().join("obj").to_string_lossy().as_bytes())?;
        let mut o = std::mem::MaybeUninit::<dhrd_options>::uninit();
        let mut h: *mut dhrd_object = std::ptr::null_mut();
        // SAFETY: valid pointers to live locals throughout; the handle is closed once.
        unsafe {
            assert_eq!(
                dhrd_options_init(o.as_mut_ptr(), size_of::<dhrd_options>()),
                0
            );
            let mut o = o.assume_init();
            o.create = true;
            o.durability = DHRD_DURABILITY_FSYNC;
            assert_eq!(dhrd_open(path.as_ptr(), &o, &mut h), 0);
            let data = b"hello, dhrd";
            assert_eq!(dhrd_write(h, data.as_ptr().cast(), data.len(), 4096), 0);
            assert_eq!(dhrd_flush(h), 0);
            let mut back = [0u8; 64];
            let mut n = 0usize;
            assert_eq!(
                dhrd_read(h, back.as_mut_ptr().cast(), back.len(), 4096, &mut n),
                0
            );
            assert_eq!(&back[..n], data);
            assert_eq!(dhrd_set_len(h, 4100), 0);
            let mut len = 0u64;
            assert_eq!(dhrd_len(h, &mut len), 0);
            assert_eq!(len, 4100);
            let mut st = dhrd_stats::default();
            assert_eq!(dhrd_get_stats(h, &mut st), 0);
            assert_eq!(st.writes, 1);
            assert_eq!(dhrd_close(h), 0);
        }
        assert_eq!(std::fs::read(dir.path().join("obj"))?.len(), 4100);
        Ok(())
    }
}
