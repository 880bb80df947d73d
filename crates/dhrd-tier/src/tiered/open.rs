//! Opening the tiered device: sizing the slot layout to the SSD, reading back (or
//! formatting, or upgrading) the slot table, checking which lower tier the SSD caches
//! (`pairing.rs`), rebuilding the slots in memory and starting the write-back threads.
//!
//! Invariants:
//! - An SSD made for another lower tier, or whose lower tier changed while it was
//!   detached, has its clean chunks dropped, durably before the new pairing record is
//!   written (a crash in between repeats the decision); while it holds dirty chunks it is
//!   refused unless the opener adopts them.
//! - A lower chunk is in at most one slot after recovery: a table naming a chunk in two
//!   slots is corrupt and refused.
//!
//! Crash semantics: after a crash the slot table is read back and the parts it names are
//! served from the SSD (dirty ones are written back), everything else from the lower
//! tier: nothing stale is served.

use super::clean;
use super::device::{SsdTier, Tiered};
use super::layout::{self, Entry, Found, Geometry, ENTRY_BYTES, HEADER_BYTES};
use super::layout::{SLOT_CLEAN, SLOT_DIRTY, SLOT_FREE};
use super::lower_writes::LowerWrites;
use super::mode::TierMode;
use super::parts::Parts;
use super::requests::RequestCounts;
use super::shared::{Shared, Slot, State};
use crate::fastdev::{self, invalid, StickyFailure};
use crate::pairing::{self, LowerIdentity};
use dhrd_engine::cache::{Admission, CachePolicy, Residency};
use dhrd_io::{read_full, Durable};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

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
}

/// What [`Tiered::read_or_format`] found on the SSD.
pub(super) struct TableAtOpen {
    pub(super) entries: Vec<Entry>,
    /// Dirty chunks of a first-format SSD written to the lower tier before formatting.
    pub(super) upgraded_dirty: u64,
    pub(super) checked: pairing::Checked,
    pub(super) formatted: bool,
}

/// The most slots of `chunk_bytes` whose layout fits in `ssd_bytes` (the tables take whole
/// pages), over a lower tier of `lower_bytes`.
pub(super) fn fitting_geometry(
    ssd_bytes: u64,
    chunk_bytes: u64,
    lower_bytes: u64,
) -> io::Result<Geometry> {
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
pub(super) fn recovered_state(mut entries: Vec<Entry>, g: &Geometry) -> io::Result<State> {
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
