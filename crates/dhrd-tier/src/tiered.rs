//! The tiered device (SPEC T1): an SSD cache tier in front of a large slow lower tier.
//!
//! [`Tiered`] is a [`Durable`] the engine sits on, so the whole is the paper's "DHRD +
//! HDD": the engine's RAM tier over an SSD cache over the disk. The SSD is divided into
//! slots of one chunk; a slot holds one chunk of the lower tier, clean or dirty. Hot chunks
//! are promoted into the SSD on their second miss (the engine's admission policy,
//! `dhrd_engine::cache`, which also picks the slot to reuse); writes go to the SSD and are
//! written back to the lower tier in the background (`writeback`), or, in
//! `writethrough` mode, go to the lower tier with the SSD copy dropped first.
//!
//! SSD layout: a header (magic, version, chunk size, slots, lower size, checksum), a slot
//! table of [`ENTRY_BYTES`] per slot (lower chunk, state, checksum), then the slots' data.
//!
//! Invariants:
//! - A lower chunk is in at most one slot, on the device too: a slot is reused only after
//!   its entry says FREE durably.
//! - An entry names a chunk only after the slot's data for it is durable, so a crash never
//!   pairs an entry with another chunk's bytes.
//! - A slot's entry says DIRTY durably before its data changes for a write (so a CLEAN
//!   slot's copy equals the lower tier's); it says CLEAN only after the data, read under
//!   the slot's lock and synced on the SSD, was written to the lower tier and synced, and
//!   no write began in the slot since.
//! - Dirty slots are never evicted; when no clean slot is left, a write goes to the lower
//!   tier directly (write-through for that write).
//!
//! - SSD syncs run one at a time, and none succeeds once a write or sync of the SSD
//!   failed: a failed sync may drop writes of other requests that their own later syncs
//!   would report as done (`sync_lock`).
//!
//! Crash semantics: every acknowledged write survives a power cut of both devices; after
//! a crash the slot table is read back and the chunks it names are served from the SSD
//! (dirty ones are written back), the others from the lower tier: nothing stale is served.
//! An unacknowledged write leaves each sector old or new.
//!
//! Why fixed slots and not ReHypar: the engine asks for whole chunks, so every allocation
//! has the same size and there is nothing for ReHypar's partitioning to do (it shines on a
//! file cache with varied sizes; `dhrd-bench rehypar` measures it there).

use crate::fastdev::{self, fnv64, invalid, Background, StickyFailure};
use dhrd_engine::cache::{AccessBits, Admission, Admit, CachePolicy, Residency, ACCESS_COUNT_MAX};
use dhrd_io::{read_full, Durable, Persistence};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of the header; the slot table starts here.
pub const HEADER_BYTES: u64 = 4096;
/// Bytes of one slot-table entry.
pub const ENTRY_BYTES: u64 = 16;
const MAGIC: &[u8; 8] = b"DHRDTC01";
const VERSION: u32 = 1;
const SLOT_FREE: u8 = 0;
const SLOT_CLEAN: u8 = 1;
const SLOT_DIRTY: u8 = 2;
/// Victims looked at before a promotion or an allocation gives up (dirty slots cannot be
/// evicted).
const VICTIM_TRIES_MAX: usize = 32;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    chunk_bytes: u64,
    slots: u64,
    lower_bytes: u64,
}

impl Geometry {
    fn data_offset(&self) -> u64 {
        (HEADER_BYTES + self.slots * ENTRY_BYTES).div_ceil(HEADER_BYTES) * HEADER_BYTES
    }
    fn ssd_bytes(&self) -> u64 {
        self.data_offset() + self.slots * self.chunk_bytes
    }
    fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(44);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.chunk_bytes, self.slots, self.lower_bytes] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        let c = fnv64(&h);
        h.extend_from_slice(&c.to_le_bytes());
        h
    }
    fn decode(h: &[u8]) -> io::Result<Option<Self>> {
        if h.len() < 44 || &h[..8] != MAGIC {
            return Ok(None);
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if fnv64(&h[..36]) != u64_at(36) {
            return Err(invalid(
                "tier SSD: the header's checksum does not match (torn or foreign)".into(),
            ));
        }
        Ok(Some(Self {
            chunk_bytes: u64_at(12),
            slots: u64_at(20),
            lower_bytes: u64_at(28),
        }))
    }
}

fn encode_entry(chunk: u64, state: u8) -> [u8; ENTRY_BYTES as usize] {
    let mut e = [0u8; ENTRY_BYTES as usize];
    e[..8].copy_from_slice(&chunk.to_le_bytes());
    e[8] = state;
    let c = (fnv64(&e[..9]) & 0xffff_ffff) as u32;
    e[12..16].copy_from_slice(&c.to_le_bytes());
    e
}

/// `None` for an entry that fails its checksum (a torn entry write: treated as FREE,
/// which is safe because the slot's data became the chunk's only after the entry did).
fn decode_entry(e: &[u8]) -> Option<(u64, u8)> {
    let mut c = [0u8; 4];
    c.copy_from_slice(&e[12..16]);
    if (fnv64(&e[..9]) & 0xffff_ffff) as u32 != u32::from_le_bytes(c) {
        return None;
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&e[..8]);
    Some((u64::from_le_bytes(v), e[8]))
}

/// Tier statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    pub slots: u64,
    pub slots_used: u64,
    pub slots_dirty: u64,
    /// Chunk reads served by the SSD and by the lower tier.
    pub reads_ssd: u64,
    pub reads_lower: u64,
    pub promotions: u64,
    pub evictions: u64,
    pub written_back: u64,
    pub writeback_failures: u64,
    /// Writes sent to the lower tier because no clean slot could be had.
    pub writes_bypassed: u64,
    pub dirty_at_open: u64,
}

struct Slot {
    chunk: u64,
    state: u8,
    writes: u64,
    busy: bool,
}

struct State {
    slots: Vec<Slot>,
    by_chunk: HashMap<u64, usize>,
    free: Vec<usize>,
    policy: Residency,
    counts: HashMap<u64, u8>,
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
    dirty_at_open: u64,
}

/// See the module documentation.
pub struct Tiered<F: Durable, S: Durable> {
    shared: Arc<Shared<F, S>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The tiered device over any backing, with its SSD a file: what `dhrd nbd --tier-ssd`
/// and the C API's `tier_ssd_path` open.
pub type SsdTier = Tiered<Arc<dyn Durable>, Arc<dyn Durable>>;

/// Write-back threads of a tier opened by [`open_ssd_file`].
pub const SSD_TIER_THREADS: usize = crate::writeback::WRITEBACK_THREADS_DEFAULT;

/// Opens (creating it if missing) the SSD file `ssd_path` as a cache tier of `ssd_bytes`
/// in front of `lower`, slowed to `timing` if given. One place for every frontend, so the
/// file options and the thread count cannot drift apart between them.
pub fn open_ssd_file(
    lower: Arc<dyn Durable>,
    ssd_path: &std::path::Path,
    ssd_bytes: u64,
    chunk_bytes: u64,
    mode: TierMode,
    timing: Option<dhrd_io::DeviceProfile>,
) -> io::Result<SsdTier> {
    let ssd = dhrd_io::FileBacking::open(
        ssd_path,
        &dhrd_io::FileOptions {
            create: true,
            ..Default::default()
        },
    )?;
    let ssd: Arc<dyn Durable> = match timing {
        Some(p) => Arc::new(dhrd_io::Timed::new(ssd, p)),
        None => Arc::new(ssd),
    };
    Tiered::open(ssd, lower, ssd_bytes, chunk_bytes, mode, SSD_TIER_THREADS)
}

impl<F: Durable, S: Durable> Tiered<F, S> {
    /// Opens (or formats) the SSD `ssd` of `ssd_bytes` as the cache of `lower`.
    pub fn open(
        ssd: F,
        lower: S,
        ssd_bytes: u64,
        chunk_bytes: u64,
        mode: TierMode,
        threads: usize,
    ) -> io::Result<Self> {
        if chunk_bytes < 512 || !chunk_bytes.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tier chunk size {chunk_bytes} is not a power of two >= 512"),
            ));
        }
        let lower_bytes = lower.len()?;
        let per_slot = chunk_bytes + ENTRY_BYTES;
        let slots = ssd_bytes.saturating_sub(2 * HEADER_BYTES) / per_slot;
        if slots == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a tier SSD of {ssd_bytes} bytes holds no chunk of {chunk_bytes}"),
            ));
        }
        let want = Geometry {
            chunk_bytes,
            slots,
            lower_bytes,
        };
        let mut head = vec![0u8; 64];
        let n = read_full(&ssd, &mut head, 0)?;
        head.truncate(n);
        let mut entries = Vec::new();
        match Geometry::decode(&head)? {
            Some(g) => {
                let mut table = vec![0u8; (g.slots * ENTRY_BYTES) as usize];
                let got = read_full(&ssd, &mut table, HEADER_BYTES)?;
                table.truncate(got);
                entries = table
                    .chunks(ENTRY_BYTES as usize)
                    .map(|e| decode_entry(e).unwrap_or((0, SLOT_FREE)))
                    .collect();
                let dirty = entries.iter().filter(|e| e.1 == SLOT_DIRTY).count();
                if g != want {
                    if dirty > 0 {
                        return Err(invalid(format!(
                            "tier SSD holds {dirty} dirty chunks for another configuration \
                             ({} slots of {} bytes over {} bytes); open it as it was made",
                            g.slots, g.chunk_bytes, g.lower_bytes
                        )));
                    }
                    entries.clear();
                    Self::format(&ssd, want)?;
                }
            }
            None => Self::format(&ssd, want)?,
        }
        entries.resize(slots as usize, (0, SLOT_FREE));
        let mut st = State {
            slots: Vec::with_capacity(slots as usize),
            by_chunk: HashMap::new(),
            free: Vec::new(),
            policy: Residency::new(CachePolicy::Clock, Admission::SecondAccess, slots),
            counts: HashMap::new(),
            dirty: 0,
            cursor: 0,
        };
        let chunks = lower_bytes.div_ceil(chunk_bytes);
        for (i, (chunk, state)) in entries.into_iter().enumerate() {
            let used = state != SLOT_FREE && chunk < chunks;
            if used && st.by_chunk.insert(chunk, i).is_some() {
                return Err(invalid(format!(
                    "tier SSD: chunk {chunk} is in two slots (the table is corrupt)"
                )));
            }
            if used {
                st.policy.insert(chunk);
                if state == SLOT_DIRTY {
                    st.dirty += 1;
                }
            } else {
                st.free.push(i);
            }
            st.slots.push(Slot {
                chunk,
                state: if used { state } else { SLOT_FREE },
                writes: 0,
                busy: false,
            });
        }
        st.free.reverse();
        let dirty_at_open = st.dirty;
        let shared = Arc::new(Shared {
            ssd,
            lower,
            geo: want,
            mode,
            state: Mutex::new(st),
            cv: Condvar::new(),
            locks: (0..slots).map(|_| Mutex::new(())).collect(),
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
            dirty_at_open,
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("dhrd-tier-wb-{i}"))
                    .spawn(move || writeback_loop(&s))?,
            );
        }
        Ok(Self {
            shared,
            threads: handles,
        })
    }

    fn format(ssd: &F, g: Geometry) -> io::Result<()> {
        fastdev::format(ssd, g.encode(), HEADER_BYTES, g.ssd_bytes())
    }

    pub fn stats(&self) -> TierStats {
        let s = &self.shared;
        let st = s.state.lock();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
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
        }
    }

    /// Waits until no slot is dirty (or `timeout` passes); true when clean.
    pub fn drain(&self, timeout: Duration) -> bool {
        self.shared.background().drain(timeout, |st| st.dirty)
    }

    pub fn lower(&self) -> &S {
        &self.shared.lower
    }
}

impl<F: Durable, S: Durable> Drop for Tiered<F, S> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl<F: Durable, S: Durable> Shared<F, S> {
    fn background(&self) -> Background<'_, State> {
        Background {
            state: &self.state,
            cv: &self.cv,
            stop: &self.stop,
            failures: &self.failures,
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

    fn write_entry(&self, slot: usize, chunk: u64, state: u8) -> io::Result<()> {
        self.ssd_write(
            &encode_entry(chunk, state),
            HEADER_BYTES + slot as u64 * ENTRY_BYTES,
        )
    }

    /// Every change of the SSD goes through here and `ssd_sync`: a failure is sticky.
    fn ssd_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.failed.write(self.ssd.write_at(buf, offset))
    }

    /// Syncs the SSD, one sync at a time, and fails once any write or sync of it failed:
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
            st.slots[i].state = SLOT_FREE;
            self.write_entry(i, 0, SLOT_FREE)?;
            drop(st);
            self.ssd_sync()?;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(i));
        }
        Ok(None)
    }

    /// Gives a slot taken by `take_slot` back unused.
    fn untake(&self, i: usize) {
        self.state.lock().free.push(i);
    }

    /// Copies chunk `c` (whose bytes `whole` holds) into a new slot as CLEAN.
    fn promote(&self, c: u64, whole: &[u8]) -> io::Result<()> {
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
        // The check and the entry under one lock: a chunk is never named by two entries.
        let mut st = self.state.lock();
        if st.by_chunk.contains_key(&c) {
            st.free.push(i); // a write cached it meanwhile; this slot's entry is still FREE
            return Ok(());
        }
        if let Err(e) = self.write_entry(i, c, SLOT_CLEAN) {
            st.free.push(i);
            return Err(e);
        }
        st.slots[i] = Slot {
            chunk: c,
            state: SLOT_CLEAN,
            writes: 0,
            busy: false,
        };
        st.by_chunk.insert(c, i);
        st.policy.insert(c);
        self.promotions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Write-back mode: writes the piece of chunk `c` into its slot (taking one if needed).
    /// Returns false if no slot could be had (the caller writes to the lower tier).
    fn write_cached(&self, c: u64, buf: &[u8], offset: u64) -> io::Result<bool> {
        let (start, end) = self.chunk_range(c);
        loop {
            let found = self.state.lock().by_chunk.get(&c).copied();
            if let Some(i) = found {
                let _g = self.locks[i].lock();
                let mut st = self.state.lock();
                if st.by_chunk.get(&c) != Some(&i) {
                    continue; // evicted meanwhile
                }
                st.slots[i].writes += 1;
                if st.slots[i].state == SLOT_CLEAN {
                    st.slots[i].state = SLOT_DIRTY;
                    st.dirty += 1;
                    self.write_entry(i, c, SLOT_DIRTY)?;
                    drop(st);
                    self.ssd_sync()?;
                } else {
                    drop(st);
                }
                self.ssd_write(buf, self.slot_offset(i) + (offset - start))?;
                return Ok(true);
            }
            let Some(i) = self.take_slot()? else {
                return Ok(false);
            };
            let _g = self.locks[i].lock();
            let mut whole = vec![0u8; (end - start) as usize];
            if !(offset == start && buf.len() as u64 == end - start) {
                let n =
                    read_full(&self.lower, &mut whole, start).inspect_err(|_| self.untake(i))?;
                whole[n..].fill(0);
            }
            let at = (offset - start) as usize;
            whole[at..at + buf.len()].copy_from_slice(buf);
            let r = (|| {
                self.ssd_write(&whole, self.slot_offset(i))?;
                self.ssd_sync()
            })();
            if let Err(e) = r {
                self.untake(i);
                return Err(e);
            }
            let mut st = self.state.lock();
            if st.by_chunk.contains_key(&c) {
                // Another writer cached it first: retry on that slot.
                st.free.push(i);
                continue;
            }
            self.write_entry(i, c, SLOT_DIRTY)?;
            st.slots[i] = Slot {
                chunk: c,
                state: SLOT_DIRTY,
                writes: 1,
                busy: false,
            };
            st.by_chunk.insert(c, i);
            st.dirty += 1;
            st.policy.insert(c);
            return Ok(true);
        }
    }

    /// Write-through (and the write-back mode's fallback): drops the chunk's slot, durably,
    /// then writes the lower tier.
    fn write_lower(&self, c: u64, buf: &[u8], offset: u64) -> io::Result<()> {
        let found = self.state.lock().by_chunk.get(&c).copied();
        if let Some(i) = found {
            let _g = self.locks[i].lock();
            let mut st = self.state.lock();
            if st.by_chunk.get(&c) == Some(&i) {
                if st.slots[i].state == SLOT_DIRTY {
                    // Its newer bytes must reach the lower tier first: write into the
                    // slot instead (write-back keeps it; write-through drains below).
                    drop(st);
                    let (start, _) = self.chunk_range(c);
                    self.ssd_write(buf, self.slot_offset(i) + (offset - start))?;
                    self.ssd_sync()?;
                    return Ok(());
                }
                st.by_chunk.remove(&c);
                st.policy.remove(c);
                st.slots[i].state = SLOT_FREE;
                st.free.push(i);
                self.write_entry(i, 0, SLOT_FREE)?;
                drop(st);
                self.ssd_sync()?;
            }
        }
        self.lower.write_at(buf, offset)?;
        self.lower.sync()
    }

    fn next_dirty(&self, st: &mut State) -> Option<usize> {
        let n = st.slots.len();
        if st.dirty == 0 {
            return None;
        }
        for k in 0..n {
            let i = (st.cursor + k) % n;
            if st.slots[i].state == SLOT_DIRTY && !st.slots[i].busy {
                st.cursor = i + 1;
                st.slots[i].busy = true;
                return Some(i);
            }
        }
        None
    }

    fn write_back(&self, i: usize) -> io::Result<()> {
        let (chunk, before, buf) = {
            let _g = self.locks[i].lock();
            let (chunk, before) = {
                let st = self.state.lock();
                (st.slots[i].chunk, st.slots[i].writes)
            };
            let (start, end) = self.chunk_range(chunk);
            let mut buf = vec![0u8; (end - start) as usize];
            read_full(&self.ssd, &mut buf, self.slot_offset(i))?;
            (chunk, before, buf)
        };
        self.ssd_sync()?;
        let (start, _) = self.chunk_range(chunk);
        self.lower.write_at(&buf, start)?;
        self.lower.sync()?;
        let mut st = self.state.lock();
        if st.slots[i].chunk == chunk
            && st.slots[i].writes == before
            && st.slots[i].state == SLOT_DIRTY
        {
            self.write_entry(i, chunk, SLOT_CLEAN)?;
            st.slots[i].state = SLOT_CLEAN;
            st.dirty -= 1;
            self.written_back.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn writeback_loop<F: Durable, S: Durable>(s: &Shared<F, S>) {
    s.background().run(
        |st| s.next_dirty(st),
        |i| s.write_back(i),
        |st, i| st.slots[i].busy = false,
    );
}

impl<F: Durable, S: Durable> Durable for Tiered<F, S> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = &self.shared;
        let end = (offset + buf.len() as u64).min(s.geo.lower_bytes);
        let mut pos = offset;
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
                if s.state.lock().by_chunk.get(&c) == Some(&i) {
                    let n = read_full(&s.ssd, dst, s.slot_offset(i) + (pos - start))?;
                    dst[n..].fill(0);
                    s.reads_ssd.fetch_add(1, Ordering::Relaxed);
                    served = true;
                }
            }
            if !served {
                let admit =
                    !s.failed.is_failed() && s.state.lock().policy.on_miss(c) == Admit::Load;
                if admit {
                    // Read the whole chunk once: it serves this read and fills the slot.
                    let mut whole = vec![0u8; (cend - start) as usize];
                    let n = read_full(&s.lower, &mut whole, start)?;
                    whole[n..].fill(0);
                    dst.copy_from_slice(
                        &whole[(pos - start) as usize..(piece_end - start) as usize],
                    );
                    // A failed promotion only costs the caching.
                    let _ = s.promote(c, &whole);
                } else {
                    let n = read_full(&s.lower, dst, pos)?;
                    dst[n..].fill(0);
                }
                s.reads_lower.fetch_add(1, Ordering::Relaxed);
            }
            pos = piece_end;
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
        while pos < end {
            let c = pos / s.geo.chunk_bytes;
            let (_, cend) = s.chunk_range(c);
            let piece_end = cend.min(end);
            let src = &buf[(pos - offset) as usize..(piece_end - offset) as usize];
            let cached = s.mode == TierMode::WriteBack && s.write_cached(c, src, pos)?;
            if cached {
                ssd_written = true;
            } else {
                if s.mode == TierMode::WriteBack {
                    s.bypassed.fetch_add(1, Ordering::Relaxed);
                }
                s.write_lower(c, src, pos)?;
            }
            pos = piece_end;
        }
        if ssd_written {
            s.ssd_sync()?;
        }
        s.cv.notify_all();
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
        true
    }

    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        self.write_at(buf, offset)?;
        Ok(Persistence::Durable)
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
mod tests;
