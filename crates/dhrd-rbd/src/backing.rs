//! [`RbdBacking`]: the durable-I/O trait over one open RBD image.
//!
//! Invariants:
//! - the handles (`image.rs`) are created in the order cluster -> pool context -> image
//!   and destroyed in the reverse order, exactly once, in `Drop` (or by the partial-open
//!   guard when an open fails half-way);
//! - no buffer handed to an asynchronous read is released or reused before its completion
//!   has been waited for, on every path including errors;
//! - requests are clipped to the cached image size. Only the lock owner changes the size,
//!   but it also carries out resizes other clients ask for (`rbd resize`): a short
//!   request, or the keeper seeing another size, re-reads it; a smaller image than this
//!   process made is a failure (`hold.rs`), never an assertion.
//! - a writable open has a [`Hold`]: what it knows of its lock, and whether RAM may serve
//!   reads (`hold.rs`); a lock-loss error of any request is recorded there.
//!
//! Crash semantics: with librbd's cache off, every completed write is on the OSDs; a
//! crash of this process loses nothing that `write_at` returned `Ok` for.

use crate::ffi::{self, CompletionT, ImageInfo, ImageT, Lib};
use crate::hold::{self, boottime_ns, Hold};
use crate::image::{
    break_dead_owner, ceph, check_lease, header_oid, header_version, open_handles, os_err,
    shrunk_message, sole_owner, take_lock, Keeper, Partial,
};
use crate::owner::OwnerRecord;
use crate::{RbdError, RbdOptions, RbdSpec, BULK_PIECES_IN_FLIGHT, BULK_PIECE_BYTES};
use dhrd_io::Durable;
use parking_lot::{Mutex, RwLock};
use std::ffi::{c_char, CStr, CString};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Largest single request handed to librbd (its length is a `size_t`, but one request
/// of many GiB would hold a huge buffer in librbd for a `write_zeroes`).
const MAX_REQUEST_BYTES: u64 = 1 << 30;
/// The image metadata key of the cache mark (`dhrd_tier::pairing`).
pub const MARK_METADATA_KEY: &str = "dhrd.cache";
/// Longest metadata value read back.
const METADATA_VALUE_MAX: usize = 4096;

/// An open RBD image. Reads, writes and syncs may come from many threads at once.
pub struct RbdBacking {
    lib: &'static Lib,
    /// The cluster, pool and image handles; `None` once [`RbdBacking::close`] ran. Every
    /// request holds the read side for its whole duration, so `close` waits for requests
    /// in flight and no request ever sees a closed handle.
    handles: Arc<RwLock<Option<Partial>>>,
    /// What a writable open knows of its lock (`hold.rs`); None for a read-only one.
    hold: Option<Arc<Hold>>,
    /// The image header's object, whose version every lock change and header update
    /// (resize, snapshot, metadata) moves: the image's stamp.
    header_oid: CString,
    /// The header's version before this open took the lock.
    version_before_lock: u64,
    /// Where this process records itself as the lock's owner (removed at close).
    owner_record: Option<PathBuf>,
    /// The dead owner whose lock the open broke, if it did.
    broke_lock_of: Option<String>,
    spec: RbdSpec,
    read_only: bool,
    object_bytes: u64,
    size_bytes: Arc<AtomicU64>,
    /// Serialises resizes (growth on write, `set_len`, the keeper's size check) so the
    /// cached size follows them.
    resize: Arc<Mutex<()>>,
}

impl RbdBacking {
    /// Connects to the cluster, opens (and if asked creates or grows) the image and, unless
    /// read-only, takes its exclusive lock.
    pub fn open(spec: &RbdSpec, opts: &RbdOptions) -> Result<RbdBacking, RbdError> {
        let lib = ffi::lib().map_err(RbdError::Library)?;
        let read_only = opts.read_only || spec.snapshot.is_some();
        let p = open_handles(lib, spec, opts, read_only)?;
        if let (Some(period), false) = (opts.read_lease, read_only) {
            check_lease(&p, period)?;
        }
        let header_oid = header_oid(&p, spec)?;
        let version_before_lock = header_version(&p, &header_oid).map_err(|e| RbdError::Ceph {
            what: format!("reading the header version of {spec}"),
            source: e,
        })?;
        let (broke_lock_of, hold) = match read_only {
            true => (None, None),
            false => lock(&p, spec, opts)?,
        };
        let (size, object_bytes) = size_and_grow(&p, spec, opts, read_only)?;
        let handles = Arc::new(RwLock::new(Some(p)));
        let size_bytes = Arc::new(AtomicU64::new(size));
        let resize = Arc::new(Mutex::new(()));
        if let Some(h) = &hold {
            let k = Keeper {
                lib,
                hold: Arc::clone(h),
                handles: Arc::clone(&handles),
                size_bytes: Arc::clone(&size_bytes),
                resize: Arc::clone(&resize),
                spec: spec.clone(),
                name: spec.to_string(),
            };
            k.spawn().map_err(|e| RbdError::Ceph {
                what: String::from("starting the lock keeper thread"),
                source: e,
            })?;
        }
        Ok(RbdBacking {
            lib,
            handles,
            hold,
            header_oid,
            version_before_lock,
            owner_record: opts.owner_record.clone().filter(|_| !read_only),
            broke_lock_of,
            spec: spec.clone(),
            read_only,
            object_bytes,
            size_bytes,
            resize,
        })
    }

    /// Closes the image now: flushes it, releases its exclusive lock (so the next dhrd on
    /// the image gets it at once instead of after the watch timeout) and disconnects.
    /// Waits for requests in flight; later requests fail with ESHUTDOWN. Dropping the
    /// backing does the same; this is for a process that exits with references left.
    pub fn close(&self) {
        if let Some(h) = &self.hold {
            h.stop.store(true, Ordering::Release);
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

    /// The image's stamp as this open found it: the version of its header object before
    /// this open took the lock. Any other writer must take the lock, which moves it; so do
    /// a resize, a snapshot, a rollback and a metadata change (`dhrd_tier::pairing`).
    pub fn stamp_before_lock(&self) -> u64 {
        self.version_before_lock
    }

    /// Ends this open's writing for a clean close of a cache over it: flushes, releases
    /// the exclusive lock and returns the header's version after the release, which the
    /// next open finds unchanged unless another client took the lock or changed the
    /// header meanwhile. Later writes fail (EROFS); reads of RAM are refused.
    pub fn release_for_detach(&self) -> io::Result<u64> {
        if let Some(h) = &self.hold {
            h.release();
        }
        self.sync()?;
        self.with_image(|img| {
            // SAFETY: an open image.
            let r = unsafe { (self.lib.rbd_lock_release)(img) };
            if r < 0 && r != -libc::ENOENT && r != -libc::EINVAL {
                return Err(os_err(r.into()));
            }
            Ok(())
        })?;
        let g = self.handles.read();
        let p = g
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESHUTDOWN))?;
        header_version(p, &self.header_oid)
    }

    /// The image metadata value of `key`, if it has one.
    pub fn metadata_get(&self, key: &str) -> io::Result<Option<String>> {
        let k = CString::new(key).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        self.with_image(|img| {
            let mut buf = vec![0 as c_char; METADATA_VALUE_MAX];
            let mut len = buf.len();
            // SAFETY: an open image; a valid C string; `buf` writable for `len` bytes.
            let r =
                unsafe { (self.lib.rbd_metadata_get)(img, k.as_ptr(), buf.as_mut_ptr(), &mut len) };
            if r == -libc::ENOENT {
                return Ok(None);
            }
            if r < 0 {
                return Err(self.noted(os_err(r.into()), false));
            }
            // SAFETY: librbd wrote a NUL-terminated value into `buf`.
            let v = unsafe { CStr::from_ptr(buf.as_ptr()) };
            Ok(Some(v.to_string_lossy().into_owned()))
        })
    }

    /// Sets image metadata `key` (stored in the header object's omap: durable on return;
    /// needs the lock, which this open holds).
    pub fn metadata_set(&self, key: &str, value: &str) -> io::Result<()> {
        self.refuse_if_read_only()?;
        let bad = |_| io::Error::from_raw_os_error(libc::EINVAL);
        let (k, v) = (
            CString::new(key).map_err(bad)?,
            CString::new(value).map_err(bad)?,
        );
        self.call(true, |img| {
            // SAFETY: an open image; valid C strings.
            unsafe { (self.lib.rbd_metadata_set)(img, k.as_ptr(), v.as_ptr()) }.into()
        })?;
        Ok(())
    }

    /// Removes image metadata `key` (absent already is success).
    pub fn metadata_remove(&self, key: &str) -> io::Result<()> {
        self.refuse_if_read_only()?;
        let k = CString::new(key).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let r = self.call(true, |img| {
            // SAFETY: an open image; a valid C string.
            unsafe { (self.lib.rbd_metadata_remove)(img, k.as_ptr()) }.into()
        });
        match r {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map(|_| ()),
        }
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
    /// stands for. A result that means the lock is gone is recorded in the hold.
    fn call(&self, is_write: bool, f: impl FnOnce(ImageT) -> i64) -> io::Result<u64> {
        self.with_image(|img| match f(img) {
            r if r < 0 => Err(self.noted(os_err(r), is_write)),
            r => Ok(r as u64),
        })
    }

    /// `e` from librbd, after recording in the hold what it says of the lock.
    fn noted(&self, e: io::Error, is_write: bool) -> io::Error {
        if let (Some(h), Some(errno)) = (&self.hold, e.raw_os_error()) {
            if hold::means_lock_lost(errno, is_write) {
                let why = if errno == libc::ESHUTDOWN {
                    "this client was blocklisted: another client broke the image's lock"
                } else {
                    "librbd refused a write for want of the image's lock"
                };
                h.lose(&self.spec.to_string(), String::from(why));
            }
        }
        e
    }

    /// A request came back short inside the cached size: the image changed size under
    /// this process. A smaller image fails the backing (RAM past its new end holds bytes
    /// the image no longer has); the error to return.
    fn size_changed(&self, what: &str) -> io::Error {
        let _g = self.resize.lock();
        let cached = self.size_bytes.load(Ordering::Acquire);
        let now = self.with_image(|img| hold::image_size(self.lib, img));
        match now {
            Ok(now) if now < cached => {
                let why = shrunk_message(&self.spec, cached, now);
                if let Some(h) = &self.hold {
                    h.lose(&self.spec.to_string(), why.clone());
                }
                io::Error::other(why)
            }
            Ok(now) => {
                self.size_bytes.fetch_max(now, Ordering::AcqRel);
                io::Error::other(format!("{what} on {} came back short", self.spec))
            }
            Err(e) => e,
        }
    }

    /// Resizes the image and the cached size; the caller holds `resize`.
    fn resize_locked(&self, len: u64) -> io::Result<()> {
        self.call(true, |img| {
            // SAFETY: an open image whose lock we hold.
            unsafe { (self.lib.rbd_resize)(img, len) }.into()
        })?;
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
        match self.with_image(|img| self.read_parallel_on(img, buf, offset)) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(self.size_changed("a read")),
            Err(e) => Err(self.noted(e, false)),
            Ok(()) => Ok(()),
        }
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

/// Takes the image's exclusive lock (breaking a dead owner's first, where the owner record
/// proves it dead): whose lock was broken, and what this open knows of its lock.
fn lock(
    p: &Partial,
    spec: &RbdSpec,
    opts: &RbdOptions,
) -> Result<(Option<String>, Option<Arc<Hold>>), RbdError> {
    let mut broke_lock_of = None;
    if let Some(path) = &opts.owner_record {
        broke_lock_of = break_dead_owner(p, spec, path)?;
    }
    let asked_at = boottime_ns();
    take_lock(p, spec, opts.lock_wait)?;
    let me = sole_owner(p, spec)?;
    if let Some(path) = &opts.owner_record {
        OwnerRecord::current(&me)
            .and_then(|r| r.write(path))
            .map_err(|e| RbdError::Ceph {
                what: format!("writing the owner record {}", path.display()),
                source: e,
            })?;
    }
    let hold = Arc::new(Hold::new(opts.read_lease, me, asked_at));
    Ok((broke_lock_of, Some(hold)))
}

/// The image's size (grown to `opts.min_len` when writable) and object size.
fn size_and_grow(
    p: &Partial,
    spec: &RbdSpec,
    opts: &RbdOptions,
    read_only: bool,
) -> Result<(u64, u64), RbdError> {
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
    let r = unsafe { (p.lib.rbd_stat)(p.image, &mut info, std::mem::size_of::<ImageInfo>()) };
    if r < 0 {
        return Err(ceph(format!("stat of image {spec}"), r.into()));
    }
    let mut size = info.size;
    if let Some(min) = opts.min_len.filter(|&m| m > size && !read_only) {
        // SAFETY: an open image whose lock we hold.
        let r = unsafe { (p.lib.rbd_resize)(p.image, min) };
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
    Ok((size, info.obj_size))
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
        let r = self.call(false, |img| unsafe {
            (self.lib.rbd_read)(img, offset, n, buf.as_mut_ptr().cast()) as i64
        })?;
        if r < n as u64 {
            return Err(self.size_changed("a read"));
        }
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
            let r = self.call(true, |img| unsafe {
                (self.lib.rbd_write)(img, offset + done as u64, part.len(), part.as_ptr().cast())
                    as i64
            });
            match r {
                Ok(n) if n == part.len() as u64 => {}
                // librbd clips a request at the image's end (and refuses one past it): the
                // image is smaller than this process made it.
                Ok(_) => return Err(self.size_changed("a write")),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return Err(self.size_changed("a write"))
                }
                Err(e) => return Err(e),
            }
            done += part.len();
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        // SAFETY: an open image.
        self.call(true, |img| unsafe { (self.lib.rbd_flush)(img) }.into())?;
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
            self.call(true, |img| unsafe {
                (self.lib.rbd_write_zeroes)(img, offset + done, n as usize, 0, 0) as i64
            })?;
            done += n;
        }
        Ok(())
    }

    fn reads_allowed(&self) -> io::Result<()> {
        match &self.hold {
            None => Ok(()),
            Some(h) => h.check(),
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
