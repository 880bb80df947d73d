//! [`RbdBacking`]: the durable-I/O trait over one open RBD image.
//!
//! Invariants:
//! - the handles are created in the order cluster -> pool context -> image and destroyed
//!   in the reverse order, exactly once, in `Drop` (or by the partial-open guard when an
//!   open fails half-way);
//! - no buffer handed to an asynchronous read is released or reused before its completion
//!   has been waited for, on every path including errors;
//! - requests are clipped to the cached image size, which only this process changes while
//!   it holds the exclusive lock (librbd rejects a request that starts past the end).
//!
//! Crash semantics: with librbd's cache off, every completed write is on the OSDs; a
//! crash of this process loses nothing that `write_at` returned `Ok` for.

use crate::ffi::{self, CompletionT, ImageInfo, ImageT, IoctxT, Lib, RadosT};
use crate::owner::OwnerRecord;
use crate::{RbdError, RbdOptions, RbdSpec, BULK_PIECES_IN_FLIGHT, BULK_PIECE_BYTES};
use dhrd_io::Durable;
use parking_lot::{Mutex, RwLock};
use std::ffi::{c_char, c_int, CStr, CString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between attempts to take an exclusive lock another client holds.
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Largest single request handed to librbd (its length is a `size_t`, but one request
/// of many GiB would hold a huge buffer in librbd for a `write_zeroes`).
const MAX_REQUEST_BYTES: u64 = 1 << 30;
/// Shortest interval between two confirmations of a read lease.
const LEASE_CHECK_MIN: Duration = Duration::from_millis(100);
/// Order (log2 of the object size) for images this backing creates: 4 MiB, rbd's default.
const CREATE_ORDER: c_int = 22;

/// An open RBD image. Reads, writes and syncs may come from many threads at once.
pub struct RbdBacking {
    lib: &'static Lib,
    /// The cluster, pool and image handles; `None` once [`RbdBacking::close`] ran. Every
    /// request holds the read side for its whole duration, so `close` waits for requests
    /// in flight and no request ever sees a closed handle.
    handles: Arc<RwLock<Option<Partial>>>,
    /// The read lease, when one was asked for (`RbdOptions::read_lease`).
    lease: Option<Arc<Lease>>,
    /// Where this process records itself as the lock's owner (removed at close).
    owner_record: Option<PathBuf>,
    /// The dead owner whose lock the open broke, if it did.
    broke_lock_of: Option<String>,
    spec: RbdSpec,
    read_only: bool,
    object_bytes: u64,
    size_bytes: AtomicU64,
    /// Serialises resizes (growth on write, `set_len`) so the cached size follows them.
    resize: Mutex<()>,
}

// SAFETY: librados cluster and I/O context handles and librbd image handles may be used
// from several threads at once (librbd's documentation: an image handle is thread-safe for
// I/O); the raw pointers are only ever passed to librbd/librados and freed once, by
// `Partial`'s Drop, under the write lock of `RbdBacking::handles` or when no other
// reference exists.
unsafe impl Send for Partial {}
// SAFETY: see Send.
unsafe impl Sync for Partial {}

/// `-r` as an io::Error (librados and librbd return negative errno values). A full pool's
/// quota (EDQUOT) is reported as ENOSPC, the error the engine leaves writable (C5).
fn os_err(r: i64) -> io::Error {
    let errno = i32::try_from(-r).unwrap_or(libc::EIO);
    io::Error::from_raw_os_error(if errno == libc::EDQUOT {
        libc::ENOSPC
    } else {
        errno
    })
}

fn ceph(what: impl Into<String>, r: i64) -> RbdError {
    RbdError::Ceph {
        what: what.into(),
        source: os_err(r),
    }
}

fn cstring(s: &str) -> Result<CString, RbdError> {
    CString::new(s).map_err(|_| RbdError::Spec {
        spec: s.to_owned(),
        why: "a name with NUL",
    })
}

/// Handles of an open in progress; whatever was created is destroyed if the open fails.
struct Partial {
    lib: &'static Lib,
    cluster: RadosT,
    ioctx: IoctxT,
    image: ImageT,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // SAFETY: each handle is null or a live handle created by this open, destroyed once
        // here in reverse order of creation.
        unsafe {
            if !self.image.is_null() {
                (self.lib.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.lib.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.lib.rados_shutdown)(self.cluster);
            }
        }
    }
}

impl Partial {
    fn set(&self, key: &str, value: &str) -> Result<(), RbdError> {
        let (k, v) = (cstring(key)?, cstring(value)?);
        // SAFETY: a created, not yet connected cluster handle; valid C strings.
        let r = unsafe { (self.lib.rados_conf_set)(self.cluster, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(ceph(format!("setting {key}={value}"), r.into()));
        }
        Ok(())
    }

    /// The owners of the image's lock (empty when nobody holds it).
    fn owners(&self) -> io::Result<Vec<String>> {
        let mut mode: c_int = 0;
        let mut owners: [*mut c_char; 8] = [std::ptr::null_mut(); 8];
        let mut n: usize = owners.len();
        // SAFETY: an open image; `owners` has room for `n` pointers, which librbd fills
        // and which are released with the matching cleanup call.
        let r = unsafe {
            (self.lib.rbd_lock_get_owners)(self.image, &mut mode, owners.as_mut_ptr(), &mut n)
        };
        if r == -libc::ENOENT {
            return Ok(Vec::new());
        }
        if r < 0 {
            return Err(os_err(r.into()));
        }
        let names: Vec<String> = owners[..n]
            .iter()
            // SAFETY: librbd set the first `n` entries to NUL-terminated strings.
            .map(|p| unsafe { CStr::from_ptr(*p) }.to_string_lossy().into_owned())
            .collect();
        // SAFETY: the `n` strings librbd allocated above.
        unsafe { (self.lib.rbd_lock_get_owners_cleanup)(owners.as_mut_ptr(), n) };
        Ok(names)
    }

    /// Who holds the image's lock, for the error message.
    fn lock_owners(&self) -> String {
        match self.owners() {
            Ok(v) if v.is_empty() => String::from("no owner recorded"),
            Ok(v) => v.join(", "),
            Err(e) => format!("owner unknown: {e}"),
        }
    }

    /// Breaks the lock `owner` holds (librbd blocklists that client as it does so).
    fn break_lock(&self, owner: &str) -> io::Result<()> {
        let c = CString::new(owner).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: an open image; a valid C string.
        let r = unsafe {
            (self.lib.rbd_lock_break)(self.image, ffi::RBD_LOCK_MODE_EXCLUSIVE, c.as_ptr())
        };
        if r < 0 {
            return Err(os_err(r.into()));
        }
        Ok(())
    }
}

impl RbdBacking {
    /// Connects to the cluster, opens (and if asked creates or grows) the image and, unless
    /// read-only, takes its exclusive lock.
    pub fn open(spec: &RbdSpec, opts: &RbdOptions) -> Result<RbdBacking, RbdError> {
        let lib = ffi::lib().map_err(RbdError::Library)?;
        let read_only = opts.read_only || spec.snapshot.is_some();
        let name = cstring(&format!("client.{}", opts.id.as_deref().unwrap_or("admin")))?;
        let cluster_name = cstring("ceph")?;
        let mut p = Partial {
            lib,
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
            image: std::ptr::null_mut(),
        };
        // SAFETY: out-pointer to a handle; valid C strings.
        let r =
            unsafe { (lib.rados_create2)(&mut p.cluster, cluster_name.as_ptr(), name.as_ptr(), 0) };
        if r < 0 {
            p.cluster = std::ptr::null_mut();
            return Err(ceph("creating the cluster handle", r.into()));
        }
        let conf = match &opts.conf {
            Some(path) => Some(cstring(&path.to_string_lossy())?),
            None => None,
        };
        // SAFETY: a created handle; null (search the default places) or a valid C string.
        let r = unsafe {
            (lib.rados_conf_read_file)(
                p.cluster,
                conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            let which = opts.conf.as_ref().map_or(
                String::from("the default ceph.conf ($CEPH_CONF, /etc/ceph/ceph.conf)"),
                |c| c.display().to_string(),
            );
            return Err(ceph(format!("reading {which}"), r.into()));
        }
        // SAFETY: a created handle; null means the CEPH_ARGS variable.
        let r = unsafe { (lib.rados_conf_parse_env)(p.cluster, std::ptr::null()) };
        if r < 0 {
            return Err(ceph("parsing CEPH_ARGS", r.into()));
        }
        // dhrd's RAM tier is the cache; librbd's would be a second, volatile one that
        // acknowledges writes before the OSDs have them.
        p.set("rbd_cache", "false")?;
        p.set(
            "client_mount_timeout",
            &opts.connect_timeout.as_secs().max(1).to_string(),
        )?;
        if let Some(t) = opts.op_timeout {
            let secs = t.as_secs().max(1).to_string();
            p.set("rados_osd_op_timeout", &secs)?;
            p.set("rados_mon_op_timeout", &secs)?;
        }
        // SAFETY: a configured handle.
        let r = unsafe { (lib.rados_connect)(p.cluster) };
        if r < 0 {
            return Err(ceph("connecting to the Ceph cluster", r.into()));
        }
        let pool = cstring(&spec.pool)?;
        // SAFETY: a connected handle; a valid C string; out-pointer.
        let r = unsafe { (lib.rados_ioctx_create)(p.cluster, pool.as_ptr(), &mut p.ioctx) };
        if r < 0 {
            p.ioctx = std::ptr::null_mut();
            return Err(ceph(format!("opening pool {:?}", spec.pool), r.into()));
        }
        if let Some(ns) = &spec.namespace {
            let ns = cstring(ns)?;
            // SAFETY: a live I/O context; a valid C string (copied by librados).
            unsafe { (lib.rados_ioctx_set_namespace)(p.ioctx, ns.as_ptr()) };
        }
        let image = cstring(&spec.image)?;
        let snap = match &spec.snapshot {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let snap_ptr = snap.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let open = |p: &mut Partial| -> c_int {
            // SAFETY: a live I/O context; valid C strings or null; out-pointer.
            unsafe {
                if read_only {
                    (lib.rbd_open_read_only)(p.ioctx, image.as_ptr(), &mut p.image, snap_ptr)
                } else {
                    (lib.rbd_open)(p.ioctx, image.as_ptr(), &mut p.image, snap_ptr)
                }
            }
        };
        let mut r = open(&mut p);
        if r == -libc::ENOENT && opts.create && !read_only {
            if let Some(len) = opts.min_len.filter(|&n| n > 0) {
                let mut order = CREATE_ORDER;
                // SAFETY: a live I/O context; a valid C string; out-pointer.
                let c = unsafe { (lib.rbd_create)(p.ioctx, image.as_ptr(), len, &mut order) };
                if c < 0 && c != -libc::EEXIST {
                    return Err(ceph(
                        format!("creating image {spec} of {len} bytes"),
                        c.into(),
                    ));
                }
                r = open(&mut p);
            }
        }
        if r < 0 {
            p.image = std::ptr::null_mut();
            let hint = if r == -libc::ENOENT && !read_only && opts.min_len.is_none() {
                " (give a size to create it)"
            } else {
                ""
            };
            return Err(ceph(format!("opening image {spec}{hint}"), r.into()));
        }
        let mut broke_lock_of = None;
        // This client as the lock's owner, when the owner record or the read lease needs it.
        let mut me = None;
        if !read_only {
            if let Some(path) = &opts.owner_record {
                broke_lock_of = break_dead_owner(&p, spec, path)?;
            }
            take_lock(&p, spec, opts.lock_wait)?;
            if opts.owner_record.is_some() || opts.read_lease.is_some() {
                me = Some(sole_owner(&p, spec)?);
            }
            if let (Some(path), Some(me)) = (&opts.owner_record, &me) {
                OwnerRecord::current(me)
                    .and_then(|r| r.write(path))
                    .map_err(|e| RbdError::Ceph {
                        what: format!("writing the owner record {}", path.display()),
                        source: e,
                    })?;
            }
        }
        let mut info = ImageInfo {
            size: 0,
            obj_size: 0,
            num_objs: 0,
            order: 0,
            block_name_prefix: [0; 24],
            parent_pool: 0,
            parent_name: [0; 96],
        };
        // SAFETY: an open image; `info` is a writable rbd_image_info_t of the size passed.
        let r = unsafe { (lib.rbd_stat)(p.image, &mut info, std::mem::size_of::<ImageInfo>()) };
        if r < 0 {
            return Err(ceph(format!("stat of image {spec}"), r.into()));
        }
        let mut size = info.size;
        if let Some(min) = opts.min_len.filter(|&m| m > size && !read_only) {
            // SAFETY: an open image whose lock we hold.
            let r = unsafe { (lib.rbd_resize)(p.image, min) };
            if r < 0 {
                return Err(ceph(
                    format!("growing image {spec} to {min} bytes"),
                    r.into(),
                ));
            }
            size = min;
        }
        assert!(
            info.obj_size.is_power_of_two(),
            "rbd object size {}",
            info.obj_size
        );
        let lease = match (opts.read_lease, me) {
            (Some(period), Some(me)) => Some(Arc::new(Lease::new(period, me))),
            _ => None,
        };
        let handles = Arc::new(RwLock::new(Some(p)));
        if let Some(l) = &lease {
            spawn_lease_keeper(Arc::clone(l), Arc::clone(&handles), spec.to_string()).map_err(
                |e| RbdError::Ceph {
                    what: String::from("starting the read-lease thread"),
                    source: e,
                },
            )?;
        }
        Ok(RbdBacking {
            lib,
            handles,
            lease,
            owner_record: opts.owner_record.clone().filter(|_| !read_only),
            broke_lock_of,
            spec: spec.clone(),
            read_only,
            object_bytes: info.obj_size,
            size_bytes: AtomicU64::new(size),
            resize: Mutex::new(()),
        })
    }

    /// Closes the image now: flushes it, releases its exclusive lock (so the next dhrd on
    /// the image gets it at once instead of after the watch timeout) and disconnects.
    /// Waits for requests in flight; later requests fail with ESHUTDOWN. Dropping the
    /// backing does the same; this is for a process that exits with references left.
    pub fn close(&self) {
        if let Some(l) = &self.lease {
            l.stop.store(true, Ordering::Release);
        }
        let closed = self.handles.write().take();
        if closed.is_some() {
            drop(closed);
            if let Some(path) = &self.owner_record {
                // Gone with the lock: a record of a released lock helps nobody. A failure
                // leaves a record naming an owner that holds nothing, which is harmless.
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// The owner whose lock the open broke because its process was gone, if any.
    pub fn broke_lock_of(&self) -> Option<&str> {
        self.broke_lock_of.as_deref()
    }

    /// Runs `f` on the open image, holding it open meanwhile.
    fn with_image<R>(&self, f: impl FnOnce(ImageT) -> io::Result<R>) -> io::Result<R> {
        let g = self.handles.read();
        match g.as_ref() {
            Some(p) => f(p.image),
            None => Err(io::Error::from_raw_os_error(libc::ESHUTDOWN)),
        }
    }

    /// Runs one librbd call on the open image: its result, or the errno a negative result
    /// stands for.
    fn call(&self, f: impl FnOnce(ImageT) -> i64) -> io::Result<u64> {
        self.with_image(|img| match f(img) {
            r if r < 0 => Err(os_err(r)),
            r => Ok(r as u64),
        })
    }

    /// Resizes the image and the cached size; the caller holds `resize`.
    fn resize_locked(&self, len: u64) -> io::Result<()> {
        // SAFETY: an open image whose lock we hold.
        self.call(|img| unsafe { (self.lib.rbd_resize)(img, len) }.into())?;
        self.size_bytes.store(len, Ordering::Release);
        Ok(())
    }

    /// The image this backing serves.
    pub fn spec(&self) -> &RbdSpec {
        &self.spec
    }

    /// The image's object size (the unit in which RADOS stores it).
    pub fn object_bytes(&self) -> u64 {
        self.object_bytes
    }

    /// The RAM tier's chunk size that suits this image: one object, so a chunk load is
    /// whole objects' worth of requests and never shares an object with its neighbour.
    pub fn preferred_chunk_bytes(&self) -> u64 {
        self.object_bytes
    }

    /// Clips `[offset, offset+len)` to the image; the length that lies inside it.
    fn clip(&self, offset: u64, len: u64) -> u64 {
        let size = self.size_bytes.load(Ordering::Acquire);
        if offset >= size {
            0
        } else {
            len.min(size - offset)
        }
    }

    fn refuse_if_read_only(&self) -> io::Result<()> {
        if self.read_only {
            Err(io::Error::from_raw_os_error(libc::EROFS))
        } else {
            Ok(())
        }
    }

    /// Grows the image so that it ends at or after `end`.
    fn grow_to(&self, end: u64) -> io::Result<()> {
        if end <= self.size_bytes.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = self.resize.lock();
        if end <= self.size_bytes.load(Ordering::Acquire) {
            return Ok(());
        }
        self.resize_locked(end)
    }

    /// Reads `buf` (already clipped to the image) as pieces of at most `BULK_PIECE_BYTES`,
    /// up to `BULK_PIECES_IN_FLIGHT` in flight, every one waited for before returning.
    fn read_parallel(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with_image(|img| self.read_parallel_on(img, buf, offset))
    }

    fn read_parallel_on(&self, image: ImageT, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let piece = BULK_PIECE_BYTES as usize;
        let mut first_err: Option<io::Error> = None;
        for (wave_i, wave) in buf.chunks_mut(piece * BULK_PIECES_IN_FLIGHT).enumerate() {
            let wave_off = offset + (wave_i * piece * BULK_PIECES_IN_FLIGHT) as u64;
            let mut pending: Vec<(CompletionT, usize)> = Vec::with_capacity(BULK_PIECES_IN_FLIGHT);
            for (i, part) in wave.chunks_mut(piece).enumerate() {
                let mut c: CompletionT = std::ptr::null_mut();
                // SAFETY: out-pointer; no callback.
                let r = unsafe {
                    (self.lib.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c)
                };
                if r < 0 {
                    first_err.get_or_insert(os_err(r.into()));
                    break;
                }
                let off = wave_off + (i * piece) as u64;
                // SAFETY: an open image; `part` stays borrowed (not released or reused)
                // until the completion is waited for below, on every path.
                let r = unsafe {
                    (self.lib.rbd_aio_read)(image, off, part.len(), part.as_mut_ptr().cast(), c)
                };
                if r < 0 {
                    // SAFETY: a completion never submitted.
                    unsafe { (self.lib.rbd_aio_release)(c) };
                    first_err.get_or_insert(os_err(r.into()));
                    break;
                }
                pending.push((c, part.len()));
            }
            for (c, want) in pending {
                // SAFETY: a submitted completion, waited for and released exactly once.
                let got = unsafe {
                    (self.lib.rbd_aio_wait_for_complete)(c);
                    let got = (self.lib.rbd_aio_get_return_value)(c);
                    (self.lib.rbd_aio_release)(c);
                    got
                };
                if got < 0 {
                    first_err.get_or_insert(os_err(got as i64));
                } else if got as usize != want {
                    first_err.get_or_insert(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("rbd read returned {got} of {want} bytes inside the image"),
                    ));
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// If the one owner of the image's lock is the recorded owner and its process is gone,
/// breaks the lock and returns that owner (see `owner.rs` for why this is safe).
fn break_dead_owner(
    p: &Partial,
    spec: &RbdSpec,
    record: &Path,
) -> Result<Option<String>, RbdError> {
    let Some(rec) = OwnerRecord::read(record) else {
        return Ok(None);
    };
    let owners = p.owners().map_err(|e| RbdError::Ceph {
        what: format!("listing the lock owners of {spec}"),
        source: e,
    })?;
    if owners != [rec.owner.clone()] || !rec.holder_is_gone() {
        return Ok(None);
    }
    p.break_lock(&rec.owner).map_err(|e| RbdError::Ceph {
        what: format!(
            "breaking the lock of {spec} left by the dead process {}",
            rec.pid
        ),
        source: e,
    })?;
    Ok(Some(rec.owner))
}

/// This client as the owner of the lock it has just taken (the address librbd reports).
fn sole_owner(p: &Partial, spec: &RbdSpec) -> Result<String, RbdError> {
    let owners = p.owners().map_err(|e| RbdError::Ceph {
        what: format!("listing the lock owners of {spec}"),
        source: e,
    })?;
    match <[String; 1]>::try_from(owners) {
        Ok([me]) => Ok(me),
        Err(owners) => Err(RbdError::Ceph {
            what: format!("the lock of {spec} has owners {owners:?} after taking it"),
            source: io::Error::from_raw_os_error(libc::EIO),
        }),
    }
}

/// The read lease (`RbdOptions::read_lease`): RAM may serve reads only while this client
/// has confirmed at the OSD, within the lease period, that it still holds the image's
/// lock. Another client can take the lock only after this one's watch expired on the OSDs
/// (`osd_client_watch_timeout`) and after blocklisting it, so with a period shorter than
/// that timeout, no read is served from RAM after another client could have written.
struct Lease {
    period: Duration,
    /// This client as the lock's owner (the address librbd reports).
    me: String,
    base: Instant,
    /// Nanoseconds after `base` of the last confirmation.
    confirmed_ns: AtomicU64,
    /// Set for good once the lock is seen with another owner (or none), or this client
    /// is blocklisted.
    lost: AtomicBool,
    stop: AtomicBool,
}

impl Lease {
    fn new(period: Duration, me: String) -> Lease {
        Lease {
            period,
            me,
            base: Instant::now(),
            confirmed_ns: AtomicU64::new(0), // the open just took the lock
            lost: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    fn confirm(&self) {
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.confirmed_ns.fetch_max(ns, Ordering::AcqRel);
    }

    fn check(&self) -> io::Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(io::Error::other(RbdLeaseError(
                "lost the image's exclusive lock to another client: RAM may be stale",
            )));
        }
        let since = self.base.elapsed().saturating_sub(Duration::from_nanos(
            self.confirmed_ns.load(Ordering::Acquire),
        ));
        if since > self.period {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                RbdLeaseError("could not confirm the image's exclusive lock within the read lease"),
            ));
        }
        Ok(())
    }
}

/// The reason a read lease refuses reads.
#[derive(Debug)]
struct RbdLeaseError(&'static str);

impl std::fmt::Display for RbdLeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for RbdLeaseError {}

/// Confirms the lock every quarter of the lease period (an OSD round trip each) until the
/// backing closes or the lock is lost.
fn spawn_lease_keeper(
    lease: Arc<Lease>,
    handles: Arc<RwLock<Option<Partial>>>,
    name: String,
) -> io::Result<()> {
    let every = (lease.period / 4).max(LEASE_CHECK_MIN);
    std::thread::Builder::new()
        .name(String::from("dhrd-rbd-lease"))
        .spawn(move || loop {
            std::thread::sleep(every);
            if lease.stop.load(Ordering::Acquire) {
                return;
            }
            let g = handles.read();
            let Some(p) = g.as_ref() else { return };
            match p.owners() {
                Ok(owners) if owners.len() == 1 && owners[0] == lease.me => lease.confirm(),
                Ok(owners) => {
                    eprintln!(
                        "dhrd-rbd: {name}: the lock is now held by {owners:?}; reads refused"
                    );
                    lease.lost.store(true, Ordering::Release);
                    return;
                }
                Err(e) if e.raw_os_error() == Some(libc::ESHUTDOWN) => {
                    // EBLOCKLISTED: another client broke our lock.
                    eprintln!("dhrd-rbd: {name}: this client was blocklisted; reads refused");
                    lease.lost.store(true, Ordering::Release);
                    return;
                }
                Err(_) => {} // not confirmed; the lease runs out unless a later try succeeds
            }
        })?;
    Ok(())
}

/// Takes the exclusive lock, retrying while another client holds it, up to `wait`.
fn take_lock(p: &Partial, spec: &RbdSpec, wait: Duration) -> Result<(), RbdError> {
    let mut features: u64 = 0;
    // SAFETY: an open image; out-pointer.
    let r = unsafe { (p.lib.rbd_get_features)(p.image, &mut features) };
    if r < 0 {
        return Err(ceph(format!("reading the features of {spec}"), r.into()));
    }
    if features & ffi::RBD_FEATURE_EXCLUSIVE_LOCK == 0 {
        return Err(RbdError::NoExclusiveLock {
            image: spec.to_string(),
        });
    }
    let started = Instant::now();
    loop {
        // SAFETY: an open image.
        let r = unsafe { (p.lib.rbd_lock_acquire)(p.image, ffi::RBD_LOCK_MODE_EXCLUSIVE) };
        if r == 0 {
            return Ok(());
        }
        // EROFS: the owner refused to hand the lock over; EBUSY/EAGAIN: it is being
        // released or broken. Anything else is a real failure.
        let contended = [libc::EROFS, libc::EBUSY, libc::EAGAIN].contains(&-r);
        if !contended {
            return Err(ceph(
                format!("taking the exclusive lock of {spec}"),
                r.into(),
            ));
        }
        if started.elapsed() >= wait {
            return Err(RbdError::Locked {
                image: spec.to_string(),
                owners: p.lock_owners(),
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(LOCK_RETRY_PAUSE.min(wait.saturating_sub(started.elapsed())));
    }
}

impl Drop for RbdBacking {
    fn drop(&mut self) {
        self.close();
    }
}

impl Durable for RbdBacking {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.clip(offset, buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        if n as u64 > BULK_PIECE_BYTES {
            self.read_parallel(&mut buf[..n], offset)?;
            return Ok(n);
        }
        // SAFETY: an open image; `buf` has room for `n` bytes.
        let r = self.call(|img| unsafe {
            (self.lib.rbd_read)(img, offset, n, buf.as_mut_ptr().cast()) as i64
        })?;
        Ok(r as usize)
    }

    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.clip(offset, buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.read_parallel(&mut buf[..n], offset)?;
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.refuse_if_read_only()?;
        if buf.is_empty() {
            return Ok(());
        }
        self.grow_to(offset + buf.len() as u64)?;
        let mut done = 0usize;
        while done < buf.len() {
            let part = &buf[done..buf.len().min(done + MAX_REQUEST_BYTES as usize)];
            // SAFETY: an open image; `part` is readable for its length.
            let r = self.call(|img| unsafe {
                (self.lib.rbd_write)(img, offset + done as u64, part.len(), part.as_ptr().cast())
                    as i64
            })?;
            assert_eq!(r as usize, part.len(), "rbd_write wrote part of a request");
            done += part.len();
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        // SAFETY: an open image.
        self.call(|img| unsafe { (self.lib.rbd_flush)(img) }.into())?;
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.size_bytes.load(Ordering::Acquire))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.refuse_if_read_only()?;
        let _g = self.resize.lock();
        self.resize_locked(len)
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        // rbd_write_zeroes deallocates whole objects and writes zeros into partial ones;
        // rbd_discard may skip partial objects (rbd_skip_partial_discard), so it is not
        // used where zeros are promised.
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.refuse_if_read_only()?;
        let len = self.clip(offset, len);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(MAX_REQUEST_BYTES);
            // SAFETY: an open image; no buffer.
            self.call(|img| unsafe {
                (self.lib.rbd_write_zeroes)(img, offset + done, n as usize, 0, 0) as i64
            })?;
            done += n;
        }
        Ok(())
    }

    fn reads_allowed(&self) -> io::Result<()> {
        match &self.lease {
            None => Ok(()),
            Some(l) => l.check(),
        }
    }

    fn writes_are_durable(&self) -> bool {
        // librbd's cache is off (see `open`): a completed write is on the OSDs.
        true
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} bytes, objects of {} bytes{})",
            self.spec,
            self.size_bytes.load(Ordering::Acquire),
            self.object_bytes,
            if self.read_only { ", read-only" } else { "" }
        )
    }
}
