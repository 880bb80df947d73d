//! The librados and librbd handles of one open image, and what is done with them beside
//! I/O: configuration, the exclusive lock (taking it, breaking a dead owner's, confirming
//! it in the keeper thread), the header object's version.
//!
//! Invariants: the handles are created in the order cluster -> pool context -> image and
//! destroyed in the reverse order, exactly once, by [`Partial`]'s Drop; a lock is broken
//! only on the proof `owner.rs` states; the keeper holds the handles' read lock for each
//! check, so a close waits for it and it never sees a closed image.
//!
//! Crash semantics: none of its own (the lock dies with the process's watch).

use crate::ffi::{self, ImageT, IoctxT, Lib, RadosT};
use crate::hold::{self, boottime_ns, Hold};
use crate::owner::OwnerRecord;
use crate::{RbdError, RbdOptions, RbdSpec};
use parking_lot::{Mutex, RwLock};
use std::ffi::{c_char, c_int, CStr, CString};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between attempts to take an exclusive lock another client holds.
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(500);

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
pub(crate) fn os_err(r: i64) -> io::Error {
    let errno = i32::try_from(-r).unwrap_or(libc::EIO);
    io::Error::from_raw_os_error(if errno == libc::EDQUOT {
        libc::ENOSPC
    } else {
        errno
    })
}

pub(crate) fn ceph(what: impl Into<String>, r: i64) -> RbdError {
    RbdError::Ceph {
        what: what.into(),
        source: os_err(r),
    }
}

pub(crate) fn cstring(s: &str) -> Result<CString, RbdError> {
    CString::new(s).map_err(|_| RbdError::Spec {
        spec: s.to_owned(),
        why: "a name with NUL",
    })
}

/// Handles of an open in progress; whatever was created is destroyed if the open fails.
pub(crate) struct Partial {
    pub lib: &'static Lib,
    pub cluster: RadosT,
    pub ioctx: IoctxT,
    pub image: ImageT,
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
    pub(crate) fn set(&self, key: &str, value: &str) -> Result<(), RbdError> {
        let (k, v) = (cstring(key)?, cstring(value)?);
        // SAFETY: a created, not yet connected cluster handle; valid C strings.
        let r = unsafe { (self.lib.rados_conf_set)(self.cluster, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(ceph(format!("setting {key}={value}"), r.into()));
        }
        Ok(())
    }

    /// A configuration value of this client, as text.
    pub(crate) fn get(&self, key: &str) -> Result<String, RbdError> {
        let k = cstring(key)?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: a created cluster handle; a valid C string; `buf` writable for its length.
        let r = unsafe {
            (self.lib.rados_conf_get)(self.cluster, k.as_ptr(), buf.as_mut_ptr(), buf.len())
        };
        if r < 0 {
            return Err(ceph(format!("reading {key}"), r.into()));
        }
        // SAFETY: librados wrote a NUL-terminated value into `buf`.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The owners of the image's lock (empty when nobody holds it).
    pub(crate) fn owners(&self) -> io::Result<Vec<String>> {
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
    pub(crate) fn lock_owners(&self) -> String {
        match self.owners() {
            Ok(v) if v.is_empty() => String::from("no owner recorded"),
            Ok(v) => v.join(", "),
            Err(e) => format!("owner unknown: {e}"),
        }
    }

    /// Breaks the lock `owner` holds (librbd blocklists that client as it does so).
    pub(crate) fn break_lock(&self, owner: &str) -> io::Result<()> {
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

/// If the one owner of the image's lock is the recorded owner and its process is gone,
/// breaks the lock and returns that owner (see `owner.rs` for why this is safe).
pub(crate) fn break_dead_owner(
    p: &Partial,
    spec: &RbdSpec,
    record: &Path,
) -> Result<Option<String>, RbdError> {
    if let Some(dir) = record.parent().filter(|d| d.exists()) {
        crate::owner::check_dir(dir).map_err(|e| RbdError::Ceph {
            what: String::from("checking the owner record directory"),
            source: e,
        })?;
    }
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
pub(crate) fn sole_owner(p: &Partial, spec: &RbdSpec) -> Result<String, RbdError> {
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

/// The message of an image found smaller than this process made it.
pub(crate) fn shrunk_message(spec: &RbdSpec, cached: u64, now: u64) -> String {
    format!(
        "image {spec} shrank from {cached} to {now} bytes under this process (another \
         client resized it, e.g. rbd resize --allow-shrink): RAM past the new end holds \
         bytes the image no longer has, so the export stops; restart it to serve the image \
         as it now is"
    )
}

/// The keeper thread of a writable open: confirms the lock (`hold.rs`) and checks that the
/// image keeps its size, until the backing closes or the lock is lost.
pub(crate) struct Keeper {
    pub lib: &'static Lib,
    pub hold: Arc<Hold>,
    pub handles: Arc<RwLock<Option<Partial>>>,
    pub size_bytes: Arc<AtomicU64>,
    pub resize: Arc<Mutex<()>>,
    pub spec: RbdSpec,
    pub name: String,
}

impl Keeper {
    pub(crate) fn spawn(self) -> io::Result<()> {
        std::thread::Builder::new()
            .name(String::from("dhrd-rbd-lock"))
            .spawn(move || {
                let every = self.hold.interval();
                while !self.hold.stop.load(Ordering::Acquire) && !self.hold.is_lost() {
                    std::thread::sleep(every);
                    if !self.round() {
                        return;
                    }
                }
            })?;
        Ok(())
    }

    /// One check; false once the image is closed.
    fn round(&self) -> bool {
        let g = self.handles.read();
        let Some(p) = g.as_ref() else { return false };
        if self.hold.stop.load(Ordering::Acquire) {
            return false;
        }
        let sent = boottime_ns();
        match p.owners() {
            Ok(owners) if owners.len() == 1 && owners[0] == self.hold.me => self.hold.confirm(sent),
            Ok(owners) => self.hold.lose(
                &self.name,
                format!("the image's lock is now held by {owners:?}"),
            ),
            Err(e) if e.raw_os_error() == Some(libc::ESHUTDOWN) => self.hold.lose(
                &self.name,
                String::from("this client was blocklisted: another client broke the image's lock"),
            ),
            Err(_) => {} // not confirmed; a lease runs out unless a later try succeeds
        }
        // The cached size follows this process's own resizes under `resize`; another size
        // is another client's resize, carried out by librbd for it.
        let _r = self.resize.lock();
        let cached = self.size_bytes.load(Ordering::Acquire);
        match hold::image_size(self.lib, p.image) {
            Ok(now) if now < cached => self
                .hold
                .lose(&self.name, shrunk_message(&self.spec, cached, now)),
            Ok(now) if now > cached => {
                self.size_bytes.store(now, Ordering::Release);
            }
            _ => {}
        }
        true
    }
}

/// The lease asked for must fit under the watch timeout this client knows of (its
/// configuration's `osd_client_watch_timeout`, which must match the OSDs') less a ping
/// interval (`objecter_tick_interval`) and a margin (`hold.rs`).
pub(crate) fn check_lease(p: &Partial, period: Duration) -> Result<(), RbdError> {
    let secs = |key: &str| -> Result<Duration, RbdError> {
        let v = p.get(key)?;
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| ceph(format!("reading {key} ({v:?})"), -i64::from(libc::EINVAL)))
    };
    let watch = secs("osd_client_watch_timeout")?;
    let ping = secs("objecter_tick_interval")?;
    let bound = hold::lease_bound(watch, ping);
    if period > bound {
        return Err(RbdError::LeaseTooLong {
            lease: period,
            bound,
            watch,
            ping,
        });
    }
    Ok(())
}

/// The name of the image's header object (`rbd_header.ID`, format 2 images).
pub(crate) fn header_oid(p: &Partial, spec: &RbdSpec) -> Result<CString, RbdError> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: an open image; `buf` is writable for its length.
    let r = unsafe { (p.lib.rbd_get_id)(p.image, buf.as_mut_ptr(), buf.len()) };
    if r < 0 {
        return Err(ceph(format!("reading the id of {spec}"), r.into()));
    }
    // SAFETY: librbd wrote a NUL-terminated id into `buf`.
    let id = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    cstring(&format!("rbd_header.{id}"))
}

/// The version of the header object now (RADOS's user version of it, which every write
/// to it moves and nothing else does).
pub(crate) fn header_version(p: &Partial, oid: &CStr) -> io::Result<u64> {
    let (mut size, mut mtime) = (0u64, 0 as libc::time_t);
    // SAFETY: a live I/O context (used by this backing only, so the version read below is
    // this stat's); a valid C string; out-pointers.
    let r = unsafe { (p.lib.rados_stat)(p.ioctx, oid.as_ptr(), &mut size, &mut mtime) };
    if r < 0 {
        return Err(os_err(r.into()));
    }
    // SAFETY: a live I/O context.
    Ok(unsafe { (p.lib.rados_get_last_version)(p.ioctx) })
}

/// Takes the exclusive lock, retrying while another client holds it, up to `wait`.
pub(crate) fn take_lock(p: &Partial, spec: &RbdSpec, wait: Duration) -> Result<(), RbdError> {
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

/// Order (log2 of the object size) for images an open creates: 4 MiB, rbd's default.
const CREATE_ORDER: c_int = 22;

/// Connects to the cluster, opens the pool and the image (creating it when `opts` asks
/// for a size and it is missing), with librbd's cache off: the handles of an open, before
/// any lock or lease. `read_only` opens without taking part in the exclusive lock.
pub(crate) fn open_handles(
    lib: &'static Lib,
    spec: &RbdSpec,
    opts: &RbdOptions,
    read_only: bool,
) -> Result<Partial, RbdError> {
    let mut p = connect(lib, opts)?;
    open_image(&mut p, spec, opts, read_only)?;
    Ok(p)
}

/// A cluster handle connected as `opts` says, with librbd's cache off.
fn connect(lib: &'static Lib, opts: &RbdOptions) -> Result<Partial, RbdError> {
    let name = cstring(&format!("client.{}", opts.id.as_deref().unwrap_or("admin")))?;
    let cluster_name = cstring("ceph")?;
    let mut p = Partial {
        lib,
        cluster: std::ptr::null_mut(),
        ioctx: std::ptr::null_mut(),
        image: std::ptr::null_mut(),
    };
    // SAFETY: out-pointer to a handle; valid C strings.
    let r = unsafe { (lib.rados_create2)(&mut p.cluster, cluster_name.as_ptr(), name.as_ptr(), 0) };
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
    Ok(p)
}

/// Opens the pool context and the image (creating the image when asked and missing).
fn open_image(
    p: &mut Partial,
    spec: &RbdSpec,
    opts: &RbdOptions,
    read_only: bool,
) -> Result<(), RbdError> {
    let lib = p.lib;
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
    let mut r = open(p);
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
            r = open(p);
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
    Ok(())
}
