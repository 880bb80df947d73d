//! Which slow device a fast device caches, recorded on the fast device: a cache must never
//! be served for, or written back over, a device it was not made for, nor serve copies
//! that went stale while the slow device was used without it.
//!
//! The caller names the slow device with a [`LowerIdentity`]: a key that stays the same
//! across restarts (a regular file's device and inode numbers, a block device's path, an
//! RBD image's pool and name) and, where one exists, a stamp that changes whenever the
//! device's contents may have changed (a regular file's modification time and size; an
//! RBD image's header version, which every other writer moves by taking the image's
//! exclusive lock, and so do a rollback, a resize and a snapshot).
//!
//! Records: two copies of [`RECORD_BYTES`] in the fast device's header page, at
//! [`RECORD_OFFSET`] and the sector after it; a change goes to the copy that does not hold
//! the newest record, with the next sequence number, and the newest valid copy wins (a torn
//! write costs only the change it was making, as with the tier's slot tables). A record says
//! which slow device (the key) and whether a process has the pair open (ATTACHED) or it was
//! closed cleanly (DETACHED, with the slow device's stamp taken after the last write-back).
//!
//! Both layers open in three steps: `begin` reads the record (a [`Verdict`]) and checks the
//! mark before anything changes; `plan` decides what to do about a foreign or changed
//! device (clean copies are dropped; dirty ones are refused unless the operator adopts
//! them), which the layer carries out on its own table or map; `finish` writes ATTACHED
//! durably and sets the mark before anything may write the slow device. At a clean close
//! `Paired::close` writes DETACHED with the stamp.
//!
//! The record is on the fast device, so it cannot stop a start that leaves the cache out.
//! A [`CacheMark`] on the slow device itself (a regular file's extended attribute
//! [`MARK_XATTR`], an RBD image's metadata key `dhrd.cache`) does: it names the cache (a
//! random id kept in the record) and is set, durably, at every open before the record says
//! ATTACHED and before anything is written, and removed at a clean close that left nothing
//! dirty. [`check_mark`] refuses a start without that cache, or with another. The record
//! notes whether the mark was set (MARKED); an ATTACHED, MARKED record whose device no
//! longer carries this cache's mark was used without the cache after a crash (the mark was
//! dropped with --drop-cache-mark, or replaced by another cache's): it is Changed, so its
//! dirty copies are never written back over what that writer stored unless adopted.
//!
//! Invariants: the slow device is written by the write-back only while the newest durable
//! record says ATTACHED with its key; so a DETACHED record's stamp was the slow device's
//! stamp when the pair was last closed, and a different stamp now means another writer.
//!
//! Crash semantics: a crash leaves ATTACHED, and the next open trusts the fast device (the
//! crashed process was the slow device's writer) as long as the device still carries this
//! cache's mark; a device without a mark (a block device) changed by another writer after
//! a crash and before the next open is not detected, nor is a writer that ignores the mark
//! without removing it. A close clears the mark before it writes DETACHED: a crash between
//! the two leaves an ATTACHED record of an unmarked device, which the next open takes for
//! Changed; nothing was dirty (the mark is cleared only then), so it only drops clean
//! copies. A torn record leaves the older
//! copy: an older DETACHED record whose stamp no longer matches makes the next open drop
//! clean copies or refuse dirty ones, which is the safe side. A fast device formatted by a
//! version without records has none; its first open records its slow device.

use crate::fastdev::fnv64;
use dhrd_io::Durable;
use std::io;
use std::sync::Arc;

/// Where the first copy of the record lives in the header page (the headers of both
/// layers end well before it); the second copy is in the next sector.
pub const RECORD_OFFSET: u64 = 1024;
/// Bytes of one copy.
pub const RECORD_BYTES: u64 = 512;
const COPIES: u64 = 2;
const MAGIC: &[u8; 8] = b"DHRDPR01";
/// Longest key kept (longer keys are cut; the checksum of the whole key is kept too).
pub const KEY_BYTES_MAX: usize = 440;
/// The extended attribute by which a cache marks a backing file that lacks data the cache
/// holds.
pub const MARK_XATTR: &str = "user.dhrd.cache";
const STATE_ATTACHED: u8 = 1;
const STATE_DETACHED: u8 = 2;
/// Flag bit: the mark was set durably before this record was written.
const FLAG_MARKED: u8 = 1;
// Field offsets inside a record.
const AT_SEQ: usize = 8;
const AT_STATE: usize = 16;
const AT_HAS_STAMP: usize = 17;
const AT_KEY_LEN: usize = 18;
const AT_FLAGS: usize = 20;
const AT_STAMP: usize = 24;
const AT_KEY_SUM: usize = 32;
const AT_CACHE_ID: usize = 40;
const AT_KEY: usize = 48;
const AT_SUM: usize = RECORD_BYTES as usize - 8;

/// A function returning the slow device's stamp now.
pub type StampFn = Arc<dyn Fn() -> io::Result<u64> + Send + Sync>;

/// The slow device a fast device caches, as the opener names it.
#[derive(Clone)]
pub struct LowerIdentity {
    /// Names the device, the same across restarts. Shown in messages.
    pub key: String,
    /// The device's stamp now: changes whenever its contents may have changed. None where
    /// no such value exists (block devices): then a change while detached is not detected.
    pub stamp: Option<StampFn>,
    /// The stamp a clean close records, where taking it is not just reading `stamp`: an
    /// RBD image's lock release moves its stamp, so the close releases the lock (which
    /// ends this process's writing) and records the stamp after it. None: `stamp`.
    pub stamp_at_close: Option<StampFn>,
    /// Keep the dirty copies of a fast device that recorded another device, or whose device
    /// changed while detached, and write them back over it (clean copies are dropped all
    /// the same). Without it such a device is refused while it holds dirty data.
    pub adopt: bool,
    /// Where the cache marks the device as lacking data the cache holds (a regular file's
    /// extended attribute [`MARK_XATTR`]), so that a start without this cache, or with
    /// another one, is refused. None where there is no such place.
    pub mark: Option<Arc<dyn CacheMark>>,
    /// Start although the device is marked by another cache (whose data is then lost for
    /// it); the mark is replaced.
    pub ignore_mark: bool,
}

/// A place on the slow device itself that says which cache holds data it lacks.
pub trait CacheMark: Send + Sync {
    /// The mark, if the device has one.
    fn get(&self) -> io::Result<Option<String>>;
    /// Sets the mark durably. `ErrorKind::Unsupported` where it cannot be kept.
    fn set(&self, text: &str) -> io::Result<()>;
    /// Removes the mark durably.
    fn clear(&self) -> io::Result<()>;
}

/// [`CacheMark`] as the extended attribute [`MARK_XATTR`] of a regular file.
struct XattrMark {
    file: std::fs::File,
}

impl CacheMark for XattrMark {
    fn get(&self) -> io::Result<Option<String>> {
        let v = dhrd_io::xattr::get(&self.file, MARK_XATTR)?;
        Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }
    fn set(&self, text: &str) -> io::Result<()> {
        dhrd_io::xattr::set(&self.file, MARK_XATTR, text.as_bytes())?;
        self.file.sync_all()
    }
    fn clear(&self) -> io::Result<()> {
        dhrd_io::xattr::remove(&self.file, MARK_XATTR)?;
        self.file.sync_all()
    }
}

/// [`CacheMark`] as an RBD image's metadata key [`dhrd_rbd::MARK_METADATA_KEY`] (kept in
/// the header object's omap: durable when set).
struct RbdMark {
    image: Arc<dhrd_rbd::RbdBacking>,
}

impl CacheMark for RbdMark {
    fn get(&self) -> io::Result<Option<String>> {
        self.image.metadata_get(dhrd_rbd::MARK_METADATA_KEY)
    }
    fn set(&self, text: &str) -> io::Result<()> {
        self.image.metadata_set(dhrd_rbd::MARK_METADATA_KEY, text)
    }
    fn clear(&self) -> io::Result<()> {
        self.image.metadata_remove(dhrd_rbd::MARK_METADATA_KEY)
    }
}

impl std::fmt::Debug for LowerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LowerIdentity")
            .field("key", &self.key)
            .field("stamped", &self.stamp.is_some())
            .field("adopt", &self.adopt)
            .field("marked", &self.mark.is_some())
            .field("ignore_mark", &self.ignore_mark)
            .finish()
    }
}

impl LowerIdentity {
    /// A device known by `key` alone, without a stamp.
    pub fn named(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            stamp: None,
            stamp_at_close: None,
            adopt: false,
            mark: None,
            ignore_mark: false,
        }
    }

    /// An RBD image, by its spec (`rbd:POOL/IMAGE`), unstamped and unmarked: a snapshot,
    /// which no cache sits on and which lacks nothing a cache of the image holds.
    pub fn rbd_image(spec: impl std::fmt::Display) -> Self {
        Self::named(format!("RBD image {spec}"))
    }

    /// An RBD image: stamped by its header's version (as found before this open took the
    /// lock; at a clean close of a cache, after releasing the lock), marked by its
    /// metadata key [`dhrd_rbd::MARK_METADATA_KEY`] (read-only opens only read the mark).
    pub fn of_rbd(image: &Arc<dhrd_rbd::RbdBacking>) -> Self {
        let found = image.stamp_before_lock();
        let closing = Arc::clone(image);
        Self {
            stamp: Some(Arc::new(move || Ok(found))),
            stamp_at_close: Some(Arc::new(move || closing.release_for_detach())),
            mark: Some(Arc::new(RbdMark {
                image: Arc::clone(image),
            })),
            ..Self::rbd_image(image.spec())
        }
    }

    /// The identity of a file or block device opened as `backing`: a regular file by its
    /// device and inode numbers (so a rename keeps it, a copy or another file at the same
    /// path does not), stamped by its modification time and size; a block device by its
    /// path, unstamped. A regular file is marked by its extended attribute [`MARK_XATTR`].
    pub fn of_file(backing: &dhrd_io::FileBacking) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = backing.file().metadata()?;
        if backing.is_block_device() {
            let path = backing
                .path()
                .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            return Ok(Self::named(format!("block device {path}")));
        }
        let mark: Arc<dyn CacheMark> = Arc::new(XattrMark {
            file: backing.file().try_clone()?,
        });
        let file = backing.file().try_clone()?;
        let stamp: StampFn = Arc::new(move || {
            let m = file.metadata()?;
            let mut b = Vec::with_capacity(24);
            b.extend_from_slice(&m.mtime().to_le_bytes());
            b.extend_from_slice(&m.mtime_nsec().to_le_bytes());
            b.extend_from_slice(&m.size().to_le_bytes());
            Ok(fnv64(&b))
        });
        Ok(Self {
            key: format!("file on device {:#x}, inode {}", m.dev(), m.ino()),
            stamp: Some(stamp),
            stamp_at_close: None,
            adopt: false,
            mark: Some(mark),
            ignore_mark: false,
        })
    }

    fn stamp_now(&self) -> io::Result<Option<u64>> {
        self.stamp.as_ref().map(|f| f()).transpose()
    }

    fn stamp_closing(&self) -> io::Result<Option<u64>> {
        match &self.stamp_at_close {
            Some(f) => f().map(Some),
            None => self.stamp_now(),
        }
    }
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    seq: u64,
    /// Names the cache (the fast device's contents), random, kept from record to record
    /// until the fast device is formatted again.
    cache_id: u64,
    attached: bool,
    /// The mark was set before this record was written.
    marked: bool,
    stamp: Option<u64>,
    key_sum: u64,
    key: String,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut r = vec![0u8; RECORD_BYTES as usize];
        r[..8].copy_from_slice(MAGIC);
        r[AT_SEQ..AT_SEQ + 8].copy_from_slice(&self.seq.to_le_bytes());
        r[AT_STATE] = if self.attached {
            STATE_ATTACHED
        } else {
            STATE_DETACHED
        };
        r[AT_HAS_STAMP] = u8::from(self.stamp.is_some());
        r[AT_FLAGS] = if self.marked { FLAG_MARKED } else { 0 };
        let key = cut(&self.key);
        r[AT_KEY_LEN..AT_KEY_LEN + 2].copy_from_slice(&(key.len() as u16).to_le_bytes());
        r[AT_STAMP..AT_STAMP + 8].copy_from_slice(&self.stamp.unwrap_or(0).to_le_bytes());
        r[AT_KEY_SUM..AT_KEY_SUM + 8].copy_from_slice(&self.key_sum.to_le_bytes());
        r[AT_CACHE_ID..AT_CACHE_ID + 8].copy_from_slice(&self.cache_id.to_le_bytes());
        r[AT_KEY..AT_KEY + key.len()].copy_from_slice(key.as_bytes());
        let sum = fnv64(&r[..AT_SUM]);
        r[AT_SUM..].copy_from_slice(&sum.to_le_bytes());
        r
    }

    /// None for a torn, foreign or absent record.
    fn decode(r: &[u8]) -> Option<Self> {
        if r.len() < RECORD_BYTES as usize || &r[..8] != MAGIC {
            return None;
        }
        if fnv64(&r[..AT_SUM]) != u64_at(r, AT_SUM) {
            return None;
        }
        let attached = match r[AT_STATE] {
            STATE_ATTACHED => true,
            STATE_DETACHED => false,
            _ => return None,
        };
        let key_len = u16::from_le_bytes([r[AT_KEY_LEN], r[AT_KEY_LEN + 1]]) as usize;
        let key = String::from_utf8_lossy(r.get(AT_KEY..AT_KEY + key_len)?).into_owned();
        Some(Self {
            seq: u64_at(r, AT_SEQ),
            cache_id: u64_at(r, AT_CACHE_ID),
            attached,
            marked: r[AT_FLAGS] & FLAG_MARKED != 0,
            stamp: (r[AT_HAS_STAMP] == 1).then(|| u64_at(r, AT_STAMP)),
            key_sum: u64_at(r, AT_KEY_SUM),
            key,
        })
    }
}

/// The first `KEY_BYTES_MAX` bytes of `key`, cut at a character boundary.
fn cut(key: &str) -> &str {
    let mut end = key.len().min(KEY_BYTES_MAX);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn offset_of(seq: u64) -> u64 {
    RECORD_OFFSET + (seq % COPIES) * RECORD_BYTES
}

/// What the fast device's record says of the slow device being opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No record: a device just formatted, or formatted by a version without records.
    Unrecorded,
    /// The record names this device, and it has not changed since (as far as its stamp
    /// tells), or the pair was not closed cleanly.
    Same,
    /// The record names another device (its key, as recorded).
    Foreign(String),
    /// The record names this device, closed cleanly, and its stamp changed since; or it
    /// was left attached, marked, and no longer carries this cache's mark: another writer
    /// used it without this cache.
    Changed,
}

impl Verdict {
    /// Whether the fast device's clean copies may be served.
    pub fn trusted(&self) -> bool {
        matches!(self, Verdict::Unrecorded | Verdict::Same)
    }

    /// Why the copies are not trusted, for messages.
    pub fn why(&self, lower: &LowerIdentity) -> String {
        match self {
            Verdict::Unrecorded | Verdict::Same => String::new(),
            Verdict::Foreign(k) => format!("it was made for {k}, not for {}", lower.key),
            Verdict::Changed => format!(
                "{} was changed while the cache was not attached to it",
                lower.key
            ),
        }
    }
}

/// The newest valid record of `fast`, if any.
fn newest<F: Durable + ?Sized>(fast: &F) -> io::Result<Option<Record>> {
    let mut best: Option<Record> = None;
    for copy in 0..COPIES {
        let mut r = vec![0u8; RECORD_BYTES as usize];
        let n = dhrd_io::read_full(fast, &mut r, RECORD_OFFSET + copy * RECORD_BYTES)?;
        r.truncate(n);
        if let Some(rec) = Record::decode(&r) {
            if offset_of(rec.seq) != RECORD_OFFSET + copy * RECORD_BYTES {
                continue; // a copy at the wrong place is not ours
            }
            if best.as_ref().is_none_or(|b| rec.seq > b.seq) {
                best = Some(rec);
            }
        }
    }
    Ok(best)
}

/// What the fast device's record says at open (`check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub verdict: Verdict,
    /// The sequence number the next record takes.
    pub next_seq: u64,
    /// The cache's id as recorded, if there is a record.
    pub cache_id: Option<u64>,
}

/// Compares the fast device's record with `lower`.
pub(crate) fn check<F: Durable + ?Sized>(fast: &F, lower: &LowerIdentity) -> io::Result<Checked> {
    let Some(rec) = newest(fast)? else {
        return Ok(Checked {
            verdict: Verdict::Unrecorded,
            next_seq: 1,
            cache_id: None,
        });
    };
    let checked = |verdict| Checked {
        verdict,
        next_seq: rec.seq + 1,
        cache_id: Some(rec.cache_id),
    };
    if rec.key_sum != fnv64(lower.key.as_bytes()) {
        return Ok(checked(Verdict::Foreign(rec.key.clone())));
    }
    if rec.attached {
        // Left attached (a crash, or a close that did not finish): the device was the
        // cache's, unless it lost the cache's mark meanwhile.
        let ours = match (&lower.mark, rec.marked) {
            (Some(m), true) => m
                .get()?
                .is_some_and(|t| t.starts_with(&mark_prefix(rec.cache_id))),
            _ => true,
        };
        return Ok(checked(if ours {
            Verdict::Same
        } else {
            Verdict::Changed
        }));
    }
    let changed = match (rec.stamp, lower.stamp_now()?) {
        (Some(then), Some(now)) => then != now,
        // Stamped then and not now (or the reverse): the device is not what it was.
        (Some(_), None) | (None, Some(_)) => true,
        (None, None) => false,
    };
    Ok(checked(if changed {
        Verdict::Changed
    } else {
        Verdict::Same
    }))
}

/// A new cache id: the fast device was just formatted.
fn new_cache_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut r = dhrd_io::SplitMix64::new(t ^ (u64::from(std::process::id()) << 32));
    r.next_u64().max(1)
}

/// How a mark names cache `cache_id`: the start of its text.
fn mark_prefix(cache_id: u64) -> String {
    format!("dhrd cache {cache_id:016x} ")
}

/// What the mark of cache `cache_id` on the fast device `fast` (its description) says: the
/// id and what the device is, without the description's details of how it is opened.
fn mark_text(cache_id: u64, fast: &str) -> String {
    let what = fast.split([',', '(']).next().unwrap_or(fast).trim();
    format!("{}on {what}", mark_prefix(cache_id))
}

/// Refuses to go on when `lower` is marked by a cache other than `cache_id` (None: no
/// cache, a plain start), unless `lower.ignore_mark`. Call before anything changes.
pub fn check_mark(lower: &LowerIdentity, cache_id: Option<u64>) -> io::Result<()> {
    let Some(mark) = &lower.mark else {
        return Ok(());
    };
    let Some(text) = mark.get()? else {
        return Ok(());
    };
    let ours = cache_id.is_some_and(|id| text.starts_with(&mark_prefix(id)));
    if ours || lower.ignore_mark {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "{} lacks data that {text} holds (it was not stopped cleanly, or its write-back \
             did not finish): start with that cache to write the data back, or, to use the \
             backing as it is and lose that data for it, start with --drop-cache-mark",
            lower.key
        ),
    ))
}

/// Marks `lower` as lacking data cache `text` holds, durably (where it can be marked);
/// whether it is marked now.
fn set_mark(lower: &LowerIdentity, text: &str) -> io::Result<bool> {
    match lower.mark.as_ref().map(|m| m.set(text)) {
        Some(Err(e)) if e.kind() != io::ErrorKind::Unsupported => Err(e),
        Some(Ok(())) => Ok(true),
        _ => Ok(false),
    }
}

/// Removes `lower`'s mark (after a clean stop that left nothing dirty).
pub fn clear_mark(lower: &LowerIdentity) -> io::Result<()> {
    lower.mark.as_ref().map_or(Ok(()), |m| m.clear())
}

fn write_record<F: Durable + ?Sized>(fast: &F, rec: &Record) -> io::Result<()> {
    fast.write_at(&rec.encode(), offset_of(rec.seq))?;
    fast.sync()
}

/// Records durably that `lower` is attached to cache `cache_id` (and `marked` by it), as
/// record `seq`. Call before anything may write the slow device.
pub(crate) fn attach<F: Durable + ?Sized>(
    fast: &F,
    lower: &LowerIdentity,
    seq: u64,
    cache_id: u64,
    marked: bool,
) -> io::Result<()> {
    let mut rec = record_of(lower, seq, cache_id, true, None);
    rec.marked = marked;
    write_record(fast, &rec)
}

/// Records durably that `lower` was detached cleanly from cache `cache_id`, with its stamp
/// now, as record `seq`. Call after the last write to the slow device and its sync.
pub(crate) fn detach<F: Durable + ?Sized>(
    fast: &F,
    lower: &LowerIdentity,
    seq: u64,
    cache_id: u64,
) -> io::Result<()> {
    let stamp = lower.stamp_closing()?;
    write_record(fast, &record_of(lower, seq, cache_id, false, stamp))
}

fn record_of(
    lower: &LowerIdentity,
    seq: u64,
    cache_id: u64,
    attached: bool,
    stamp: Option<u64>,
) -> Record {
    Record {
        seq,
        cache_id,
        attached,
        marked: false,
        stamp,
        key_sum: fnv64(lower.key.as_bytes()),
        key: lower.key.clone(),
    }
}

/// What an open does about a foreign or changed slow device, decided by [`plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// The fast device's copies are trusted.
    Keep,
    /// Nothing dirty: format the fast device (dropping every clean copy).
    Format,
    /// Dirty copies adopted: free the clean ones durably, keep the dirty ones.
    DropClean,
}

/// An open's decision, before it is carried out.
pub(crate) struct Plan {
    pub action: Action,
    checked: Checked,
    why: Option<String>,
    clean: u64,
    dirty: u64,
}

/// The pairing of an open fast device with its slow device: what its open found and
/// decided, and what its clean close records.
pub(crate) struct Paired {
    pub identity: LowerIdentity,
    record_seq: u64,
    cache_id: u64,
    /// Why the fast device's copies were not trusted at open, if they were not.
    pub distrust: Option<String>,
    /// Clean units dropped, and dirty units adopted, at open.
    pub dropped_at_open: u64,
    pub adopted_dirty: u64,
}

/// The first step of an open, before anything changes: the fast device's record (if it
/// has a header of its layer, else it is unrecorded) and the slow device's mark.
pub(crate) fn begin<F: Durable + ?Sized>(
    fast: &F,
    lower: &LowerIdentity,
    has_header: bool,
) -> io::Result<Checked> {
    let checked = match has_header {
        true => check(fast, lower)?,
        false => Checked {
            verdict: Verdict::Unrecorded,
            next_seq: 1,
            cache_id: None,
        },
    };
    check_mark(lower, checked.cache_id)?;
    Ok(checked)
}

/// The second step, once the layer knows whether it formatted the fast device already
/// (`formatted`, which wipes the record) and counts the `clean` and `dirty` units it holds:
/// what to do about a foreign or changed slow device. A dirty unit is refused unless
/// adopted; `what` names the fast device in that refusal.
pub(crate) fn plan(
    lower: &LowerIdentity,
    mut checked: Checked,
    formatted: bool,
    clean: u64,
    dirty: u64,
    what: &str,
) -> io::Result<Plan> {
    if formatted {
        checked = Checked {
            verdict: Verdict::Unrecorded,
            next_seq: 1,
            cache_id: None,
        };
    }
    if checked.verdict.trusted() {
        return Ok(Plan {
            action: Action::Keep,
            checked,
            why: None,
            clean,
            dirty,
        });
    }
    let why = checked.verdict.why(lower);
    if dirty > 0 && !lower.adopt {
        return Err(crate::fastdev::invalid(format!(
            "{what} holds {dirty} dirty chunks, but {why}: open it over the device it was \
             made for, or adopt its dirty chunks to write them back over this one (dhrd: \
             --adopt-cache)"
        )));
    }
    Ok(Plan {
        action: if dirty == 0 {
            Action::Format
        } else {
            Action::DropClean
        },
        checked,
        why: Some(why),
        clean,
        dirty,
    })
}

/// The last step, after the layer carried out `plan.action`: records durably that `lower`
/// is attached and marks it, before anything may write it.
pub(crate) fn finish<F: Durable + ?Sized>(
    fast: &F,
    lower: LowerIdentity,
    plan: Plan,
) -> io::Result<Paired> {
    let fresh = plan.action == Action::Format || plan.checked.cache_id.is_none();
    let (record_seq, cache_id) = match (fresh, plan.checked.cache_id) {
        (false, Some(id)) => (plan.checked.next_seq, id),
        _ => (1, new_cache_id()),
    };
    // The mark first: an ATTACHED, MARKED record then always had its mark set.
    let marked = set_mark(&lower, &mark_text(cache_id, &fast.describe()))?;
    attach(fast, &lower, record_seq, cache_id, marked)?;
    let (dropped_at_open, adopted_dirty) = match plan.action {
        Action::Keep => (0, 0),
        Action::Format => (plan.clean, 0),
        Action::DropClean => (plan.clean, plan.dirty),
    };
    Ok(Paired {
        identity: lower,
        record_seq,
        cache_id,
        distrust: plan.why,
        dropped_at_open,
        adopted_dirty,
    })
}

impl Paired {
    /// At a clean close, once nothing writes the slow device any more (`slow_synced`: its
    /// final sync): with `dirty` units left 0 it lacks nothing, so its mark goes; then its
    /// stamp (`stamp_at_close`) is what the next open compares with. Best effort: without
    /// the record the next open trusts the fast device, as after a crash, if the mark is
    /// still there; a mark left in place only refuses a start without this cache.
    pub(crate) fn close<F: Durable + ?Sized>(
        &self,
        fast: &F,
        slow_synced: io::Result<()>,
        dirty: impl FnOnce() -> u64,
    ) {
        if slow_synced.is_err() {
            return;
        }
        if dirty() == 0 && clear_mark(&self.identity).is_err() {
            return;
        }
        let _ = detach(fast, &self.identity, self.record_seq + 1, self.cache_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhrd_io::SimBacking;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn stamped(key: &str, stamp: Arc<AtomicU64>) -> LowerIdentity {
        LowerIdentity {
            key: key.into(),
            stamp: Some(Arc::new(move || Ok(stamp.load(Ordering::SeqCst)))),
            ..LowerIdentity::named(key)
        }
    }

    #[test]
    fn the_record_tells_same_foreign_and_changed() -> io::Result<()> {
        let fast = SimBacking::from_bytes(vec![0; 4096], 1);
        let stamp = Arc::new(AtomicU64::new(7));
        let a = stamped("a", stamp.clone());
        let c = check(&fast, &a)?;
        assert_eq!((c.verdict, c.cache_id), (Verdict::Unrecorded, None));
        attach(&fast, &a, c.next_seq, 42, false)?;
        // Attached (or crashed while attached): trusted whatever the stamp says.
        stamp.store(8, Ordering::SeqCst);
        let c = check(&fast, &a)?;
        assert_eq!((c.verdict, c.cache_id), (Verdict::Same, Some(42)));
        detach(&fast, &a, c.next_seq, 42)?;
        let c2 = check(&fast, &a)?;
        assert_eq!((c2.verdict, c2.next_seq), (Verdict::Same, c.next_seq + 1));
        let v = check(&fast, &LowerIdentity::named("b"))?.verdict;
        assert_eq!(v, Verdict::Foreign("a".into()));
        stamp.store(9, Ordering::SeqCst);
        let v = check(&fast, &a)?.verdict;
        assert_eq!(v, Verdict::Changed);
        assert!(!v.trusted());
        Ok(())
    }

    /// A mark kept in memory.
    struct MemMark(parking_lot::Mutex<Option<String>>);

    impl CacheMark for MemMark {
        fn get(&self) -> io::Result<Option<String>> {
            Ok(self.0.lock().clone())
        }
        fn set(&self, text: &str) -> io::Result<()> {
            *self.0.lock() = Some(text.to_owned());
            Ok(())
        }
        fn clear(&self) -> io::Result<()> {
            *self.0.lock() = None;
            Ok(())
        }
    }

    /// A device left attached by a crash and then used without the cache (its mark
    /// dropped, or replaced by another cache's) is Changed, not Same: the cache's dirty
    /// copies would overwrite what the other writer stored.
    #[test]
    fn an_attached_record_of_a_device_that_lost_its_mark_is_changed() -> io::Result<()> {
        let fast = SimBacking::from_bytes(vec![0; 4096], 1);
        let mark = Arc::new(MemMark(parking_lot::Mutex::new(None)));
        let a = LowerIdentity {
            mark: Some(mark.clone()),
            ..LowerIdentity::named("a")
        };
        let c = begin(&fast, &a, true)?;
        let plan = plan(&a, c, false, 0, 0, "fast")?;
        let paired = finish(&fast, a.clone(), plan)?;
        assert!(mark.get()?.is_some(), "not marked at open");
        // A crash: the record stays ATTACHED; the mark is still the cache's.
        assert_eq!(check(&fast, &a)?.verdict, Verdict::Same);
        // Another writer drops the mark (--drop-cache-mark) and writes.
        mark.clear()?;
        assert_eq!(check(&fast, &a)?.verdict, Verdict::Changed);
        // Or another cache marks it.
        mark.set("dhrd cache 0000000000000001 on another")?;
        assert_eq!(check(&fast, &a)?.verdict, Verdict::Changed);
        // A clean close of a device with nothing dirty clears the mark and detaches.
        mark.set(&mark_text(paired.cache_id, "fast"))?;
        paired.close(&fast, Ok(()), || 0);
        assert!(mark.get()?.is_none());
        assert_eq!(check(&fast, &a)?.verdict, Verdict::Same);
        Ok(())
    }

    #[test]
    fn a_torn_record_leaves_the_one_before() -> io::Result<()> {
        let fast = SimBacking::from_bytes(vec![0; 4096], 1);
        let a = LowerIdentity::named("a");
        attach(&fast, &a, 1, 7, false)?;
        detach(&fast, &a, 2, 7)?;
        // Record 3 torn half-way: record 2 (detached) is the newest valid one.
        let rec = Record {
            seq: 3,
            cache_id: 7,
            attached: true,
            marked: false,
            stamp: None,
            key_sum: fnv64(b"a"),
            key: "a".into(),
        }
        .encode();
        fast.write_at(&rec[..100], offset_of(3))?;
        let got = newest(&fast)?.map(|r| (r.seq, r.attached));
        assert_eq!(got, Some((2, false)));
        Ok(())
    }

    #[test]
    fn long_keys_are_cut_but_compared_whole() -> io::Result<()> {
        let fast = SimBacking::from_bytes(vec![0; 4096], 1);
        let long = "é".repeat(400);
        let a = LowerIdentity::named(long.clone());
        attach(&fast, &a, 1, 7, false)?;
        assert_eq!(check(&fast, &a)?.verdict, Verdict::Same);
        let other = LowerIdentity::named(format!("{long}x"));
        match check(&fast, &other)?.verdict {
            Verdict::Foreign(k) => assert!(k.len() <= KEY_BYTES_MAX && long.starts_with(&k)),
            v => panic!("{v:?}"),
        }
        Ok(())
    }
}
