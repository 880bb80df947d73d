//! The tiered device (SPEC T1): an SSD cache tier in front of a large slow lower tier.
//!
//! [`Tiered`] is a [`Durable`] the engine sits on, so the whole is the paper's "DHRD +
//! HDD": the engine's RAM tier over an SSD cache over the disk. The SSD is divided into
//! slots of one chunk; a slot holds one chunk of the lower tier, clean or dirty, wholly or
//! in some of its parts (`parts.rs`). Hot chunks are promoted into the SSD on their second
//! miss (the engine's admission policy, `dhrd_engine::cache`, which also picks the slot to
//! reuse); writes go to the SSD and are written back to the lower tier in the background
//! (`writeback`), or, in `writethrough` mode, go to the lower tier with the SSD copy
//! dropped first. A write to a chunk the SSD does not hold fills only the parts it touches
//! (reading from the lower tier only the uncovered edges of a part it covers partly), so it
//! costs an SSD write, not a read of the slow tier; a read that needs a part the slot lacks
//! lays the slot's parts over the lower tier's bytes, and the write-back completes the slot
//! before it marks it clean (so a clean slot holds its whole chunk).
//!
//! SSD layout and its upgrade from the first format: `layout.rs`. Which lower tier the SSD
//! caches, and what happens when it is opened over another one: `pairing.rs`. The write
//! paths: `writes.rs`; the write-back: `clean.rs`.
//!
//! Invariants:
//! - A lower chunk is in at most one slot, on the device too: a slot is reused only after
//!   its entry says FREE durably.
//! - An entry names a chunk, or a part of it, only after the slot's bytes for it are
//!   durable, so a crash never pairs an entry with another chunk's bytes or with a part
//!   never written. A slot's newest entry is durable before the next change of it
//!   overwrites the other table copy, so a change that fails or is cut off leaves the
//!   newest entry, never an older one that may name the slot's previous chunk; and
//!   nothing is written to the SSD once a write or sync of it failed.
//! - The lower tier's bytes of a part the slot does not hold are current: every write to a
//!   cached chunk lands in its slot (or, in write-through, drops a clean slot first).
//! - Bytes read from the lower tier without a lock (a promotion, the edges of a write
//!   taking a new slot, the parts the write-back completes) go into a slot only if no
//!   write to the lower tier of the chunk was in flight when they were read or began
//!   since (`lower_writes.rs`); such a write counts itself before it looks for the slot,
//!   so it either spoils that check or finds the slot.
//! - A slot's entry says DIRTY durably before its data changes for a write (so a CLEAN
//!   slot's parts equal the lower tier's); it says CLEAN only after the parts it holds,
//!   read under the slot's lock and synced on the SSD, were written to the lower tier and
//!   synced, and no write into the slot began since (every write into a slot is counted
//!   first, whichever path it takes). The write-back makes a dirty slot whole first, so
//!   clean slots hold their whole chunk.
//! - Dirty slots are never evicted; when no clean slot is left, a write goes to the lower
//!   tier directly (write-through for that write). Such a write is acknowledged only once
//!   the FREE entry that dropped the chunk's last slot is durable, and never after the SSD
//!   failed: an entry that named the chunk could otherwise come back after a power cut
//!   with older bytes.
//! - Entries change under the state lock, so they change in the order memory sees.
//!
//! - SSD syncs run one at a time, and none succeeds once a write or sync of the SSD
//!   failed: a failed sync may drop writes of other requests that their own later syncs
//!   would report as done. Callers waiting meanwhile share the next sync
//!   (`fastdev::StickyFailure`).
//!
//! Crash semantics: every acknowledged write survives a power cut of both devices; after
//! a crash the slot table is read back and the parts it names are served from the SSD
//! (dirty ones are written back), everything else from the lower tier: nothing stale is
//! served. An unacknowledged write leaves each sector old or new.
//!
//! Why fixed slots and not ReHypar: the engine asks for whole chunks, so every allocation
//! has the same size and there is nothing for ReHypar's partitioning to do (it shines on a
//! file cache with varied sizes; `dhrd-bench rehypar` measures it there).

mod clean;
mod layout;
mod lower_writes;
mod parts;
mod requests;
mod writes;

use crate::fastdev::{self, invalid, read_padded, Background, StickyFailure};
use crate::pairing::{self, LowerIdentity, Paired};
use dhrd_engine::cache::{AccessBits, Admission, Admit, CachePolicy, Residency, ACCESS_COUNT_MAX};
use dhrd_io::{read_full, Durable, Persistence};
use layout::{Entry, Found, Geometry, SLOT_CLEAN, SLOT_DIRTY, SLOT_FREE};
pub use layout::{ENTRY_BYTES, HEADER_BYTES};
use lower_writes::{LowerWrites, Seen};
use parking_lot::{Condvar, Mutex};
use parts::Parts;
use requests::{Reached, RequestCounts};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Victims looked at before a promotion or an allocation gives up (dirty slots cannot be
/// evicted).
const VICTIM_TRIES_MAX: usize = 32;
/// Times a write that takes a new slot fills it and finds a write to the lower tier began
/// meanwhile, before it writes the lower tier itself instead (so that it cannot be kept
/// waiting for ever by a stream of them).
const FILL_TRIES_MAX: usize = 4;

/// How writes reach the lower tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierMode {
    /// Durable on the SSD, written back later.
    #[default]
    WriteBack,
    /// Durable on the lower tier before the acknowledgement.
    WriteThrough,
}

impl std::str::FromStr for TierMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "writeback" => Ok(TierMode::WriteBack),
            "writethrough" => Ok(TierMode::WriteThrough),
            _ => Err(format!(
                "bad tier mode {s:?}: use writeback or writethrough"
            )),
        }
    }
}

impl std::fmt::Display for TierMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TierMode::WriteBack => "writeback",
            TierMode::WriteThrough => "writethrough",
        })
    }
}

/// When a write into a slot is synced on the SSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotSync {
    /// Before the write returns: every write is durable on return.
    #[default]
    EachWrite,
    /// At the next `sync` (a FLUSH): for an engine in `fsync` durability, whose writes
    /// need to be durable only at FLUSH. Only a write's last sync waits: the syncs that
    /// order a slot's bytes before the entry naming them, and a DIRTY entry before a
    /// CLEAN slot's bytes change, are made as always, so a power cut loses at most writes
    /// since the last sync and never leaves an entry naming bytes nobody wrote.
    AtFlush,
}

/// Tier statistics, serialised under the names of `dhrd nbd`'s status file (docs/nbd.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    pub slots: u64,
    pub slots_used: u64,
    pub slots_dirty: u64,
    /// Chunk reads served by the SSD and by the lower tier.
    #[serde(rename = "chunk_reads_ssd")]
    pub reads_ssd: u64,
    #[serde(rename = "chunk_reads_lower")]
    pub reads_lower: u64,
    pub promotions: u64,
    pub evictions: u64,
    pub written_back: u64,
    pub writeback_failures: u64,
    /// Writes sent to the lower tier because no clean slot could be had.
    pub writes_bypassed: u64,
    pub dirty_at_open: u64,
    /// Writes that took a slot without reading the rest of the chunk from the lower tier.
    pub partial_fills: u64,
    /// Slots holding some parts that the write-back completed from the lower tier.
    pub completions: u64,
    /// Dirty chunks of a first-format SSD written back when it was upgraded at open.
    pub upgraded_dirty: u64,
    /// Clean chunks dropped at open because the SSD was made for another lower tier, or
    /// the lower tier changed while the SSD was detached (`pairing.rs`).
    pub dropped_at_open: u64,
    /// Dirty chunks kept at open in such a case because the opener adopted them.
    pub adopted_dirty: u64,
    /// Read requests served by the SSD alone, and those that read the lower tier
    /// (`requests.rs`): the cache tier's hit share as the device sees it.
    pub read_requests_ssd: u64,
    pub read_requests_lower: u64,
    /// Write requests served by the SSD alone, and those that read or wrote the lower
    /// tier (edges of a part filled from there, a bypass, write-through).
    pub write_requests_ssd: u64,
    pub write_requests_lower: u64,
}

struct Slot {
    chunk: u64,
    state: u8,
    /// The parts holding the chunk's bytes (what the entry says, or will once durable).
    parts: Parts,
    writes: u64,
    busy: bool,
    /// The sequence number of the slot's newest entry on the device (`layout.rs`).
    seq: u64,
    /// The SSD's sync number after which the newest entry is durable (`None`: it is).
    entry_ticket: Option<u64>,
}

impl Slot {
    /// Holds `chunk` in `state` with `parts`, after `writes` writes.
    fn hold(&mut self, chunk: u64, state: u8, parts: Parts, writes: u64) {
        self.chunk = chunk;
        self.state = state;
        self.parts = parts;
        self.writes = writes;
        self.busy = false;
    }

    fn clear(&mut self) {
        self.hold(0, SLOT_FREE, Parts::NONE, 0);
    }
}

struct State {
    slots: Vec<Slot>,
    by_chunk: HashMap<u64, usize>,
    free: Vec<usize>,
    policy: Residency,
    counts: HashMap<u64, u8>,
    /// Chunks whose slot was freed by an entry that may not be durable yet, with the SSD
    /// sync number after which it is: a write of such a chunk to the lower tier alone
    /// waits for it (`write_lower`). Covered ones are pruned as it grows.
    dropped: HashMap<u64, u64>,
    dirty: u64,
    cursor: usize,
}

struct Counts(std::cell::RefCell<HashMap<u64, u8>>);

impl AccessBits for Counts {
    fn count(&self, c: u64) -> u8 {
        self.0.borrow().get(&c).copied().unwrap_or(0)
    }
    fn set_count(&self, c: u64, n: u8) {
        self.0.borrow_mut().insert(c, n);
    }
}

struct Shared<F: Durable, S: Durable> {
    ssd: F,
    lower: S,
    geo: Geometry,
    mode: TierMode,
    state: Mutex<State>,
    cv: Condvar,
    /// One lock per slot: data changes and write-back reads of a slot serialise.
    locks: Vec<Mutex<()>>,
    /// Writes to the lower tier, counted per chunk: bytes read from it without a lock go
    /// into a slot only if none began meanwhile (`lower_writes.rs`).
    lower_writes: LowerWrites,
    stop: AtomicBool,
    /// A write or sync of the SSD failed: its table may name chunks memory has dropped,
    /// so no write is acknowledged any more (a write to the lower tier alone could be
    /// shadowed by such an entry after a restart). Reads go on. Also runs the SSD's syncs
    /// one at a time (`fastdev::StickyFailure`).
    failed: StickyFailure,
    reads_ssd: AtomicU64,
    reads_lower: AtomicU64,
    promotions: AtomicU64,
    evictions: AtomicU64,
    written_back: AtomicU64,
    failures: AtomicU64,
    bypassed: AtomicU64,
    partial_fills: AtomicU64,
    completions: AtomicU64,
    requests: RequestCounts,
    /// `SlotSync::AtFlush`: a write into a slot skips its last sync.
    sync_at_flush: AtomicBool,
    dirty_at_open: u64,
    upgraded_dirty: u64,
    /// The lower tier as the opener named it, and the number of the SSD's pairing record
    /// written at open (`pairing.rs`); a clean close writes the next one.
    paired: Paired,
}

/// See the module documentation.
pub struct Tiered<F: Durable, S: Durable> {
    shared: Arc<Shared<F, S>>,
    threads: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// `close` ran.
    closed: std::sync::atomic::AtomicBool,
}

/// The tiered device over any backing, with its SSD a file: what `dhrd nbd --tier-ssd`
/// and the C API's `tier_ssd_path` open.
pub type SsdTier = Tiered<Arc<dyn Durable>, Arc<dyn Durable>>;

/// Bytes of a tier SSD with `slots` slots of `chunk_bytes`: header, tables and data. An SSD
/// of this size opens with exactly `slots` slots.
pub fn ssd_bytes_for(slots: u64, chunk_bytes: u64) -> u64 {
    Geometry {
        chunk_bytes,
        slots,
        lower_bytes: 0,
    }
    .ssd_bytes()
}

/// Write-back threads of a tier opened by [`open_ssd_file`].
pub const SSD_TIER_THREADS: usize = crate::writeback::WRITEBACK_THREADS_DEFAULT;

/// Opens (creating it if missing) the SSD file `ssd_path` as a cache tier of `ssd_bytes`
/// in front of `lower`, slowed to `timing` if given. One place for every frontend, so the
/// file options and the thread count cannot drift apart between them.
pub fn open_ssd_file(
    lower: Arc<dyn Durable>,
    identity: LowerIdentity,
    ssd_path: &std::path::Path,
    ssd_bytes: u64,
    chunk_bytes: u64,
    mode: TierMode,
    timing: Option<dhrd_io::DeviceProfile>,
) -> io::Result<SsdTier> {
    // Absolute, so that the backing's cache mark names it from anywhere.
    let ssd_path = std::path::absolute(ssd_path)?;
    let ssd = dhrd_io::FileBacking::open(
        &ssd_path,
        &dhrd_io::FileOptions {
            create: true,
            ..Default::default()
        },
    )?;
    let ssd: Arc<dyn Durable> = match timing {
        Some(p) => Arc::new(dhrd_io::Timed::new(ssd, p)),
        None => Arc::new(ssd),
    };
    Tiered::open(
        ssd,
        lower,
        identity,
        ssd_bytes,
        chunk_bytes,
        mode,
        SSD_TIER_THREADS,
    )
}

impl<F: Durable, S: Durable> Tiered<F, S> {
    /// Opens (or formats) the SSD `ssd` of `ssd_bytes` as the cache of `lower`, which
    /// `identity` names. An SSD made for another lower tier, or whose lower tier changed
    /// while it was detached, has its clean chunks dropped; while it holds dirty chunks it
    /// is refused, unless `identity.adopt` (then they are written back over the lower tier).
    pub fn open(
        ssd: F,
        lower: S,
        identity: LowerIdentity,
        ssd_bytes: u64,
        chunk_bytes: u64,
        mode: TierMode,
        threads: usize,
    ) -> io::Result<Self> {
        let lower_bytes = lower.len()?;
        let want = fitting_geometry(ssd_bytes, chunk_bytes, lower_bytes)?;
        let found = Self::read_or_format(&ssd, &lower, &identity, want)?;
        let mut entries = found.entries;
        let count = |state| entries.iter().filter(|e| e.state == state).count() as u64;
        let (clean, dirty) = (count(SLOT_CLEAN), count(SLOT_DIRTY));
        let plan = pairing::plan(
            &identity,
            found.checked,
            found.formatted,
            clean,
            dirty,
            "tier SSD",
        )?;
        match plan.action {
            pairing::Action::Keep => {}
            pairing::Action::Format => {
                entries.clear();
                Self::format(&ssd, want)?;
            }
            pairing::Action::DropClean => Self::drop_clean(&ssd, &want, &mut entries)?,
        }
        let paired = pairing::finish(&ssd, identity, plan)?;
        let slots = want.slots;
        let st = recovered_state(entries, &want)?;
        let upgraded_dirty = found.upgraded_dirty;
        let dirty_at_open = st.dirty;
        let shared = Arc::new(Shared {
            ssd,
            lower,
            geo: want,
            mode,
            state: Mutex::new(st),
            cv: Condvar::new(),
            locks: (0..slots).map(|_| Mutex::new(())).collect(),
            lower_writes: LowerWrites::for_slots(slots),
            stop: AtomicBool::new(false),
            failed: StickyFailure::new(
                "the tier's SSD failed earlier: writes are refused (its slot table may be stale)",
            ),
            reads_ssd: AtomicU64::new(0),
            reads_lower: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            bypassed: AtomicU64::new(0),
            partial_fills: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            requests: RequestCounts::default(),
            sync_at_flush: AtomicBool::new(false),
            dirty_at_open,
            upgraded_dirty,
            paired,
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("dhrd-tier-wb-{i}"))
                    .spawn(move || clean::writeback_loop(&s))?,
            );
        }
        Ok(Self {
            shared,
            threads: parking_lot::Mutex::new(handles),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Reads the SSD's slot table, or formats the SSD for `want` when it holds none, holds
    /// one of another configuration (refused while dirty) or is of the first format (its
    /// dirty chunks written to the lower tier first). What the SSD records of its lower
    /// tier, and the lower tier's mark, are checked before anything changes (`pairing.rs`).
    fn read_or_format(
        ssd: &F,
        lower: &S,
        identity: &LowerIdentity,
        want: Geometry,
    ) -> io::Result<TableAtOpen> {
        let mut head = vec![0u8; 64];
        let n = read_full(ssd, &mut head, 0)?;
        head.truncate(n);
        let found = Geometry::decode(&head)?;
        let checked = pairing::begin(ssd, identity, matches!(found, Found::Current(_)))?;
        let mut t = TableAtOpen {
            entries: Vec::new(),
            upgraded_dirty: 0,
            checked,
            // Formatting wipes the pairing records with the header page.
            formatted: true,
        };
        match found {
            Found::Current(g) => {
                t.entries = layout::read_table(ssd, &g)?;
                // What was read may not be durable yet (a restart without a power cut):
                // the next change of an entry overwrites the other copy (`write_entry`).
                ssd.sync()?;
                let dirty = t.entries.iter().filter(|e| e.state == SLOT_DIRTY).count();
                if g == want {
                    t.formatted = false;
                    return Ok(t);
                }
                if dirty > 0 {
                    return Err(invalid(format!(
                        "tier SSD holds {dirty} dirty chunks for another configuration \
                         ({} slots of {} bytes over {} bytes); open it as it was made",
                        g.slots, g.chunk_bytes, g.lower_bytes
                    )));
                }
                t.entries.clear();
            }
            Found::Format1(g) => {
                if g.lower_bytes != want.lower_bytes {
                    return Err(invalid(format!(
                        "tier SSD (format 1) caches a lower tier of {} bytes, not {}",
                        g.lower_bytes, want.lower_bytes
                    )));
                }
                t.upgraded_dirty = layout::write_back_format1(ssd, lower, &g)?;
            }
            Found::Nothing => {}
        }
        Self::format(ssd, want)?;
        Ok(t)
    }

    fn format(ssd: &F, g: Geometry) -> io::Result<()> {
        fastdev::format(ssd, g.encode(), HEADER_BYTES, g.ssd_bytes())
    }

    /// Frees the clean slots of `entries` durably (at open, before anything is served).
    fn drop_clean(ssd: &F, g: &Geometry, entries: &mut [Entry]) -> io::Result<()> {
        for (i, e) in entries.iter_mut().enumerate() {
            if e.state != SLOT_CLEAN {
                continue;
            }
            let free = Entry {
                seq: e.seq + 1,
                ..Entry::FREE
            };
            ssd.write_at(&layout::encode_entry(&free), g.entry_offset(i, free.seq))?;
            *e = free;
        }
        ssd.sync()
    }

    /// Sets when a write into a slot is synced (`SlotSync`); before the first write.
    pub fn set_slot_sync(&self, when: SlotSync) {
        self.shared
            .sync_at_flush
            .store(when == SlotSync::AtFlush, Ordering::SeqCst);
    }

    /// Why the SSD's copies were not trusted at open (it was made for another lower tier,
    /// or the lower tier changed while it was detached), if they were not.
    pub fn distrusted_at_open(&self) -> Option<&str> {
        self.shared.paired.distrust.as_deref()
    }

    pub fn stats(&self) -> TierStats {
        let s = &self.shared;
        let st = s.state.lock();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (read_requests_ssd, read_requests_lower, write_requests_ssd, write_requests_lower) =
            s.requests.get();
        TierStats {
            slots: st.slots.len() as u64,
            slots_used: (st.slots.len() - st.free.len()) as u64,
            slots_dirty: st.dirty,
            reads_ssd: g(&s.reads_ssd),
            reads_lower: g(&s.reads_lower),
            promotions: g(&s.promotions),
            evictions: g(&s.evictions),
            written_back: g(&s.written_back),
            writeback_failures: g(&s.failures),
            writes_bypassed: g(&s.bypassed),
            dirty_at_open: s.dirty_at_open,
            partial_fills: g(&s.partial_fills),
            completions: g(&s.completions),
            upgraded_dirty: s.upgraded_dirty,
            dropped_at_open: s.paired.dropped_at_open,
            adopted_dirty: s.paired.adopted_dirty,
            read_requests_ssd,
            read_requests_lower,
            write_requests_ssd,
            write_requests_lower,
        }
    }

    /// Why writes are refused, once a write or sync of the fast device failed or the
    /// write-back stopped on a panic.
    pub fn failure(&self) -> Option<String> {
        self.shared.failed.failure()
    }

    /// Waits until no slot is dirty (or `timeout` passes); true when clean.
    pub fn drain(&self, timeout: Duration) -> bool {
        self.shared.background().drain(timeout, |st| st.dirty)
    }

    pub fn lower(&self) -> &S {
        &self.shared.lower
    }
}

impl<F: Durable, S: Durable> Tiered<F, S> {
    /// Stops the write-back threads and, unless the device failed, closes the pair
    /// cleanly (`pairing.rs`): the lower device's mark is removed when nothing is dirty
    /// and its stamp recorded. Call after the last write and `drain`, before the lower
    /// device closes (an RBD image releases its lock here); later writes are not written
    /// back. Runs once; dropping does it too.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cv.notify_all();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        let s = &self.shared;
        if !s.failed.is_failed() {
            s.paired
                .close(&s.ssd, s.lower.sync(), || s.state.lock().dirty);
        }
    }
}

/// What [`Tiered::read_or_format`] found on the SSD.
struct TableAtOpen {
    entries: Vec<Entry>,
    /// Dirty chunks of a first-format SSD written to the lower tier before formatting.
    upgraded_dirty: u64,
    checked: pairing::Checked,
    formatted: bool,
}

/// The most slots of `chunk_bytes` whose layout fits in `ssd_bytes` (the tables take whole
/// pages), over a lower tier of `lower_bytes`.
fn fitting_geometry(ssd_bytes: u64, chunk_bytes: u64, lower_bytes: u64) -> io::Result<Geometry> {
    if chunk_bytes < 512 || !chunk_bytes.is_power_of_two() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("tier chunk size {chunk_bytes} is not a power of two >= 512"),
        ));
    }
    let per_slot = chunk_bytes + layout::TABLE_COPIES * ENTRY_BYTES;
    let mut slots = ssd_bytes.saturating_sub(HEADER_BYTES) / per_slot;
    while slots > 0 && ssd_bytes_for(slots, chunk_bytes) > ssd_bytes {
        slots -= 1;
    }
    if slots == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a tier SSD of {ssd_bytes} bytes holds no chunk of {chunk_bytes}"),
        ));
    }
    Ok(Geometry {
        chunk_bytes,
        slots,
        lower_bytes,
    })
}

/// The slots as the table `entries` (after the pairing plan) left them: each chunk in at
/// most one slot (a chunk in two is a corrupt table, refused), entries past the lower
/// tier's end or without parts free.
fn recovered_state(mut entries: Vec<Entry>, g: &Geometry) -> io::Result<State> {
    let slots = g.slots;
    entries.resize(slots as usize, Entry::FREE);
    let mut st = State {
        slots: Vec::with_capacity(slots as usize),
        by_chunk: HashMap::new(),
        free: Vec::new(),
        policy: Residency::new(CachePolicy::Clock, Admission::SecondAccess, slots),
        counts: HashMap::new(),
        dropped: HashMap::new(),
        dirty: 0,
        cursor: 0,
    };
    let chunks = g.lower_bytes.div_ceil(g.chunk_bytes);
    for (i, e) in entries.into_iter().enumerate() {
        let used = e.state != SLOT_FREE && e.chunk < chunks && !e.parts.is_empty();
        if used && st.by_chunk.insert(e.chunk, i).is_some() {
            return Err(invalid(format!(
                "tier SSD: chunk {} is in two slots (the table is corrupt)",
                e.chunk
            )));
        }
        let mut slot = Slot {
            chunk: 0,
            state: SLOT_FREE,
            parts: Parts::NONE,
            writes: 0,
            busy: false,
            seq: e.seq,
            entry_ticket: None,
        };
        if !used {
            st.free.push(i);
            st.slots.push(slot);
            continue;
        }
        st.policy.insert(e.chunk);
        if e.state == SLOT_DIRTY {
            st.dirty += 1;
        }
        slot.hold(e.chunk, e.state, e.parts, 0);
        st.slots.push(slot);
    }
    st.free.reverse();
    Ok(st)
}

impl<F: Durable, S: Durable> Drop for Tiered<F, S> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<F: Durable, S: Durable> Shared<F, S> {
    fn background(&self) -> Background<'_, State> {
        Background {
            state: &self.state,
            cv: &self.cv,
            stop: &self.stop,
            failures: &self.failures,
            failed: &self.failed,
        }
    }

    fn chunk_range(&self, c: u64) -> (u64, u64) {
        let start = c * self.geo.chunk_bytes;
        (
            start,
            (start + self.geo.chunk_bytes).min(self.geo.lower_bytes),
        )
    }

    fn slot_offset(&self, slot: usize) -> u64 {
        self.geo.data_offset() + slot as u64 * self.geo.chunk_bytes
    }

    /// All parts of chunk `c` (the device's last chunk may be short).
    fn chunk_parts(&self, c: u64) -> Parts {
        let (start, end) = self.chunk_range(c);
        Parts::all((end - start).div_ceil(self.geo.part_bytes()))
    }

    /// Writes slot `slot`'s entry `e` into the copy that does not hold its newest one
    /// (`layout.rs`); under the state lock (`st`), so that entries change in the order
    /// memory sees.
    ///
    /// The copy it overwrites holds the entry before the newest. Should this write fail
    /// or be cut off, the newest entry decides what the slot holds after a restart, so it
    /// must be durable first: else a power cut could leave only the older entry valid,
    /// which may name the slot's previous chunk while the slot holds another's bytes. So
    /// when no sync has covered the newest entry yet (a promotion or a write-back names
    /// a slot without one of its own), this syncs first, under the lock. That is rare:
    /// nearly every change of an entry is followed by a sync anyway.
    fn write_entry(&self, st: &mut State, slot: usize, mut e: Entry) -> io::Result<()> {
        if let Some(t) = st.slots[slot].entry_ticket {
            if !self.failed.covered(t) {
                self.ssd_sync()?;
            }
        }
        e.seq = st.slots[slot].seq + 1;
        self.ssd_write(
            &layout::encode_entry(&e),
            self.geo.entry_offset(slot, e.seq),
        )?;
        // Only after the write: a failed one changed nothing in memory (and nothing is
        // written to the SSD after a failure).
        st.slots[slot].seq = e.seq;
        st.slots[slot].entry_ticket = Some(self.failed.ticket());
        Ok(())
    }

    /// Every change of the SSD goes through here and `ssd_sync`: a failure is sticky, and
    /// after one nothing more is written (a later entry could overwrite the only valid
    /// copy of an older one).
    fn ssd_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.failed.check()?;
        self.failed.write(self.ssd.write_at(buf, offset))
    }

    /// Syncs the SSD (or shares a sync that began after the call), one sync at a time, and
    /// fails once any write or sync of it failed:
    /// what a sync that returns Ok vouches for (an acknowledgement, a slot marked CLEAN,
    /// a slot reused) was not dropped by an earlier failure.
    fn ssd_sync(&self) -> io::Result<()> {
        self.failed.sync(&self.ssd)
    }

    fn check(&self) -> io::Result<()> {
        self.failed.check()
    }

    /// A free slot, evicting a clean one if needed (its FREE entry made durable before
    /// the slot can be reused). `None` when every slot is dirty or busy.
    fn take_slot(&self) -> io::Result<Option<usize>> {
        let mut st = self.state.lock();
        if let Some(i) = st.free.pop() {
            return Ok(Some(i));
        }
        for _ in 0..VICTIM_TRIES_MAX {
            let bits = Counts(std::cell::RefCell::new(std::mem::take(&mut st.counts)));
            let v = st.policy.victim(&bits);
            st.counts = bits.0.into_inner();
            let Some(chunk) = v else {
                return Ok(None);
            };
            let Some(&i) = st.by_chunk.get(&chunk) else {
                continue;
            };
            if st.slots[i].state != SLOT_CLEAN || st.slots[i].busy {
                // Dirty or being written back: keep it, try another.
                st.policy.insert(chunk);
                continue;
            }
            st.by_chunk.remove(&chunk);
            st.counts.remove(&chunk);
            st.slots[i].clear();
            self.write_entry(&mut st, i, Entry::FREE)?;
            self.note_dropped(&mut st, chunk);
            drop(st);
            self.ssd_sync()?;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(i));
        }
        Ok(None)
    }

    /// Notes that the slot of `chunk` was just freed by an entry not yet synced.
    fn note_dropped(&self, st: &mut State, chunk: u64) {
        if st.dropped.len() as u64 >= self.geo.slots {
            st.dropped.retain(|_, t| !self.failed.covered(*t));
        }
        st.dropped.insert(chunk, self.failed.ticket());
    }

    /// Gives a slot taken by `take_slot` back unused.
    fn untake(&self, i: usize) {
        self.state.lock().free.push(i);
    }

    /// Copies chunk `c` (whose bytes `whole` holds, read from the lower tier after `seen`)
    /// into a new slot as CLEAN, unless a write to the lower tier of the chunk began since:
    /// `whole` may then be older than an acknowledged write.
    fn promote(&self, c: u64, whole: &[u8], seen: Seen) -> io::Result<()> {
        let Some(i) = self.take_slot()? else {
            return Ok(());
        };
        let _g = self.locks[i].lock();
        let r = (|| {
            self.ssd_write(whole, self.slot_offset(i))?;
            self.ssd_sync()
        })();
        if let Err(e) = r {
            self.untake(i);
            return Err(e);
        }
        // The checks and the entry under one lock: a chunk is never named by two entries,
        // and a write to the lower tier that begins after the check finds this slot.
        let mut st = self.state.lock();
        if st.by_chunk.contains_key(&c) || !self.lower_writes.unchanged(seen) {
            // A write cached it, or reached the lower tier, meanwhile; this slot's entry is
            // still FREE.
            st.free.push(i);
            return Ok(());
        }
        let parts = self.chunk_parts(c);
        let e = Entry::new(c, SLOT_CLEAN, parts);
        if let Err(e) = self.write_entry(&mut st, i, e) {
            st.free.push(i);
            return Err(e);
        }
        st.slots[i].hold(c, SLOT_CLEAN, parts, 0);
        st.by_chunk.insert(c, i);
        st.policy.insert(c);
        self.promotions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Serves `dst`, at chunk-relative byte `a` of chunk `c`, from slot `i`, whose lock the
    /// caller holds and which lacks some of the parts `dst` needs: the lower tier's bytes
    /// with the slot's parts laid over them. (The write-back completes the slot.)
    fn read_merged(&self, i: usize, c: u64, held: Parts, dst: &mut [u8], a: u64) -> io::Result<()> {
        let (start, end) = self.chunk_range(c);
        let mut whole = vec![0u8; (end - start) as usize];
        read_padded(&self.lower, &mut whole, start)?;
        self.lay_parts_over(i, held, &mut whole)?;
        dst.copy_from_slice(&whole[a as usize..a as usize + dst.len()]);
        Ok(())
    }

    /// Copies the parts `held` of slot `i` over `whole`, a buffer of its whole chunk.
    fn lay_parts_over(&self, i: usize, held: Parts, whole: &mut [u8]) -> io::Result<()> {
        let base = self.slot_offset(i);
        for (x, y) in self.byte_runs(held, whole.len()) {
            read_padded(&self.ssd, &mut whole[x..y], base + x as u64)?;
        }
        Ok(())
    }

    /// Byte ranges, relative to the chunk, of the runs of `parts` in a chunk of `len` bytes.
    fn byte_runs(&self, parts: Parts, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let pb = self.geo.part_bytes() as usize;
        parts
            .runs()
            .map(move |(p, q)| (p as usize * pb, (q as usize * pb).min(len)))
    }
}

impl<F: Durable, S: Durable> Durable for Tiered<F, S> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = &self.shared;
        let end = (offset + buf.len() as u64).min(s.geo.lower_bytes);
        let mut pos = offset;
        let mut reached = Reached::Ssd;
        while pos < end {
            let c = pos / s.geo.chunk_bytes;
            let (start, cend) = s.chunk_range(c);
            let piece_end = cend.min(end);
            let dst = &mut buf[(pos - offset) as usize..(piece_end - offset) as usize];
            let slot = {
                let mut st = s.state.lock();
                let slot = st.by_chunk.get(&c).copied();
                if slot.is_some() {
                    let n = st.counts.entry(c).or_insert(0);
                    *n = (*n + 1).min(ACCESS_COUNT_MAX);
                }
                slot
            };
            let mut served = false;
            if let Some(i) = slot {
                let _g = s.locks[i].lock();
                let held = {
                    let st = s.state.lock();
                    (st.by_chunk.get(&c) == Some(&i)).then(|| st.slots[i].parts)
                };
                if let Some(held) = held {
                    let (need, _) = parts::touched(
                        s.geo.part_bytes(),
                        cend - start,
                        pos - start,
                        piece_end - start,
                    );
                    if need.minus(held).is_empty() {
                        read_padded(&s.ssd, dst, s.slot_offset(i) + (pos - start))?;
                        s.reads_ssd.fetch_add(1, Ordering::Relaxed);
                    } else {
                        s.read_merged(i, c, held, dst, pos - start)?;
                        s.reads_lower.fetch_add(1, Ordering::Relaxed);
                        reached = Reached::Lower;
                    }
                    served = true;
                }
            }
            if !served {
                // Admitted, the chunk is promoted from the bytes read below, if no write to
                // the lower tier was in flight now or begins before the slot is named.
                let seen = {
                    let mut st = s.state.lock();
                    let missed = !st.by_chunk.contains_key(&c) && !s.failed.is_failed();
                    match s.lower_writes.seen(c) {
                        Some(seen) if missed && st.policy.on_miss(c) == Admit::Load => Some(seen),
                        _ => None,
                    }
                };
                if let Some(seen) = seen {
                    // Read the whole chunk once: it serves this read and fills the slot.
                    let mut whole = vec![0u8; (cend - start) as usize];
                    read_padded(&s.lower, &mut whole, start)?;
                    dst.copy_from_slice(
                        &whole[(pos - start) as usize..(piece_end - start) as usize],
                    );
                    // A failed promotion only costs the caching.
                    let _ = s.promote(c, &whole, seen);
                } else {
                    read_padded(&s.lower, dst, pos)?;
                }
                s.reads_lower.fetch_add(1, Ordering::Relaxed);
                reached = Reached::Lower;
            }
            pos = piece_end;
        }
        if pos > offset {
            s.requests.read(reached);
        }
        Ok(end.saturating_sub(offset) as usize)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let s = &self.shared;
        s.check()?;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|e| *e <= s.geo.lower_bytes)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "write of {} bytes at {offset} past the end of a {}-byte tiered device",
                        buf.len(),
                        s.geo.lower_bytes
                    ),
                )
            })?;
        let mut pos = offset;
        let mut ssd_written = false;
        let mut reached = Reached::Ssd;
        while pos < end {
            let c = pos / s.geo.chunk_bytes;
            let (_, cend) = s.chunk_range(c);
            let piece_end = cend.min(end);
            let src = &buf[(pos - offset) as usize..(piece_end - offset) as usize];
            let cached = match s.mode {
                TierMode::WriteBack => s.write_cached(c, src, pos)?,
                TierMode::WriteThrough => writes::Cached::NoSlot,
            };
            match cached {
                writes::Cached::Slot(r) => {
                    ssd_written = true;
                    reached = reached.and(r);
                }
                writes::Cached::NoSlot => {
                    if s.mode == TierMode::WriteBack {
                        s.bypassed.fetch_add(1, Ordering::Relaxed);
                    }
                    reached = reached.and(s.write_lower(c, src, pos)?);
                }
            }
            pos = piece_end;
        }
        if ssd_written && !s.sync_at_flush.load(Ordering::Relaxed) {
            s.ssd_sync()?;
        }
        s.cv.notify_all();
        if end > offset {
            s.requests.write(reached);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.shared.ssd_sync()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.shared.geo.lower_bytes)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        fastdev::fixed_size(
            len,
            self.shared.geo.lower_bytes,
            "a tiered device has the fixed size of its lower tier",
        )
    }

    fn writes_are_durable(&self) -> bool {
        !self.shared.sync_at_flush.load(Ordering::Relaxed)
    }

    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        self.write_at(buf, offset)?;
        Ok(if self.writes_are_durable() {
            Persistence::Durable
        } else {
            Persistence::NeedsSync
        })
    }

    fn reads_allowed(&self) -> io::Result<()> {
        self.shared.lower.reads_allowed()
    }

    fn describe(&self) -> String {
        format!(
            "{} cached on {} ({} slots, {})",
            self.shared.lower.describe(),
            self.shared.ssd.describe(),
            self.shared.geo.slots,
            self.shared.mode
        )
    }
}

#[cfg(test)]
mod races;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
