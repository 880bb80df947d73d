//! A simulated disk for deterministic crash and fault testing.
//!
//! It keeps two images: `volatile` (what reads see, like a disk's cache plus media) and
//! `durable` (what survives a crash). Every `write_at`, `set_len` and `zero_range` is
//! appended to a pending log; a successful `sync` applies the log to `durable` and clears it.
//!
//! A crash (see [`SimBacking::crash_image`] and [`SimBacking::crash_at_op`]) builds the
//! surviving image from `durable` plus each pending operation independently dropped, kept,
//! or, for writes, torn at 512-byte sector granularity: any subset of the write's sectors
//! survives. All choices come from a seeded [`SplitMix64`], so a run replays exactly.
//!
//! Faults are injected by operation index. Mutating operations (`write_at`, `sync`,
//! `set_len`, `zero_range`) are numbered 0, 1, 2, ... in one sequence; reads are numbered in
//! a separate one, so a background loader's reads do not shift where a crash or fault lands
//! in a foreground workload. EIO or ENOSPC, once or from then on. A failing write may leave a torn prefix behind in
//! the volatile image, and a failing sync pushes a random subset of the pending log to the
//! durable image and then forgets the rest (the Linux "fsyncgate" behaviour), which is the
//! hostile case the engine must survive.

use crate::{Durable, Persistence, SplitMix64, SECTOR_BYTES};
use parking_lot::Mutex;
use std::io;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `EIO`.
    Eio,
    /// `ENOSPC`.
    Enospc,
}

impl FaultKind {
    fn to_error(self) -> io::Error {
        match self {
            FaultKind::Eio => io::Error::from_raw_os_error(libc::EIO),
            FaultKind::Enospc => io::Error::from_raw_os_error(libc::ENOSPC),
        }
    }
}

/// A scheduled fault: operation number `at_op` (0-based, in the mutating sequence, or in the
/// read sequence when `reads`) fails with `kind`; with `persist`, every later one fails too.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    pub at_op: u64,
    pub kind: FaultKind,
    pub persist: bool,
    /// Whether reads are affected. Faults usually target writes and syncs only.
    pub reads: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Mutating operations started (the numbering faults and crashes use).
    pub ops: u64,
    /// Read operations started (their own numbering).
    pub read_ops: u64,
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub set_lens: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// The bytes that survived a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashImage {
    pub data: Vec<u8>,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
    Zero { offset: u64, len: u64 },
}

#[derive(Debug)]
struct Inner {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    rng: SplitMix64,
    faults: Vec<Fault>,
    crash_at: Option<u64>,
    crashed: Option<CrashImage>,
    capacity_bytes: Option<u64>,
    /// Writes are durable on return (an O_DSYNC file); the pending log holds only the
    /// other operations.
    dsync: bool,
    /// Writes of whole aligned blocks of this size are durable on return (O_DIRECT with
    /// RWF_DSYNC); other writes stay pending until a sync.
    direct_block_bytes: Option<u64>,
    stats: SimStats,
}

/// The simulated durable backing. Cheap to clone the images out of for oracles.
#[derive(Debug)]
pub struct SimBacking {
    inner: Mutex<Inner>,
}

fn resize_to(v: &mut Vec<u8>, len: u64) {
    v.resize(len as usize, 0);
}

fn write_into(v: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if v.len() < end {
        v.resize(end, 0);
    }
    v[offset as usize..end].copy_from_slice(data);
}

fn zero_into(v: &mut [u8], offset: u64, len: u64) {
    let start = (offset as usize).min(v.len());
    let end = ((offset + len) as usize).min(v.len());
    v[start..end].fill(0);
}

/// Makes the pending changes of `[offset, offset + len)` durable, in their order, and keeps
/// only their parts outside it pending. A pending size change is settled with everything
/// before it: replayed after a write that is already durable it would cut that write off
/// (a file system commits size changes in order with the writes that follow). That
/// settles more than the kernel may, never less than a later durable write relies on.
fn settle_range(g: &mut Inner, offset: u64, len: u64) {
    if let Some(last) = g
        .pending
        .iter()
        .rposition(|op| matches!(op, Pending::SetLen(_)))
    {
        let before: Vec<Pending> = g.pending.drain(..=last).collect();
        for op in &before {
            apply(&mut g.durable, op, &mut g.rng, false);
        }
    }
    let end = offset + len;
    let mut kept = Vec::with_capacity(g.pending.len());
    for op in std::mem::take(&mut g.pending) {
        let (o, n) = match &op {
            Pending::Write { offset, data } => (*offset, data.len() as u64),
            Pending::Zero { offset, len } => (*offset, *len),
            Pending::SetLen(_) => {
                kept.push(op);
                continue;
            }
        };
        let (lo, hi) = (o.max(offset), (o + n).min(end));
        if lo >= hi {
            kept.push(op);
            continue;
        }
        let part = |from: u64, to: u64| match &op {
            Pending::Write { data, .. } => Pending::Write {
                offset: from,
                data: data[(from - o) as usize..(to - o) as usize].to_vec(),
            },
            _ => Pending::Zero {
                offset: from,
                len: to - from,
            },
        };
        apply(&mut g.durable, &part(lo, hi), &mut g.rng, false);
        if o < lo {
            kept.push(part(o, lo));
        }
        if hi < o + n {
            kept.push(part(hi, o + n));
        }
    }
    g.pending = kept;
}

/// Applies `op` to `img`; writes keep each sector with probability 1/2 when `tear` is set.
fn apply(img: &mut Vec<u8>, op: &Pending, rng: &mut SplitMix64, tear: bool) {
    match op {
        Pending::Write { offset, data } => {
            if !tear {
                write_into(img, *offset, data);
                return;
            }
            let end = offset + data.len() as u64;
            let mut pos = *offset;
            while pos < end {
                let sector_end = ((pos / SECTOR_BYTES) + 1) * SECTOR_BYTES;
                let piece_end = sector_end.min(end);
                if rng.chance(1, 2) {
                    let s = (pos - offset) as usize;
                    let e = (piece_end - offset) as usize;
                    write_into(img, pos, &data[s..e]);
                }
                pos = piece_end;
            }
        }
        Pending::SetLen(len) => {
            if !tear || rng.chance(1, 2) {
                resize_to(img, *len);
            }
        }
        Pending::Zero { offset, len } => {
            if !tear || rng.chance(1, 2) {
                zero_into(img, *offset, *len);
            }
        }
    }
}

impl SimBacking {
    /// A new empty disk; `seed` drives every random choice (tearing, fsyncgate subsets).
    pub fn new(seed: u64) -> Self {
        Self::from_bytes(Vec::new(), seed)
    }

    /// A disk whose durable and volatile images both start as `data`.
    pub fn from_bytes(data: Vec<u8>, seed: u64) -> Self {
        Self {
            inner: Mutex::new(Inner {
                volatile: data.clone(),
                durable: data,
                pending: Vec::new(),
                rng: SplitMix64::new(seed),
                faults: Vec::new(),
                crash_at: None,
                crashed: None,
                capacity_bytes: None,
                dsync: false,
                direct_block_bytes: None,
                stats: SimStats::default(),
            }),
        }
    }

    pub fn from_image(image: CrashImage, seed: u64) -> Self {
        Self::from_bytes(image.data, seed)
    }

    pub fn inject(&self, fault: Fault) {
        self.inner.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.inner.lock().faults.clear();
    }

    /// Makes writes durable on return, like a file opened with O_DSYNC.
    pub fn set_dsync(&self, dsync: bool) {
        self.inner.lock().dsync = dsync;
    }

    /// Makes writes of whole aligned `block`-byte blocks durable on return, like a file
    /// written through O_DIRECT with RWF_DSYNC; other writes keep needing a sync. None
    /// turns it off.
    pub fn set_direct_dsync(&self, block: Option<u64>) {
        if let Some(b) = block {
            assert!(b.is_power_of_two() && b >= SECTOR_BYTES, "block {b}");
        }
        self.inner.lock().direct_block_bytes = block;
    }

    /// Growing the image past this many bytes fails with ENOSPC (a full disk).
    pub fn set_capacity(&self, capacity_bytes: Option<u64>) {
        self.inner.lock().capacity_bytes = capacity_bytes;
    }

    /// Power is cut when mutating operation number `op` starts: the crash image is taken then, and
    /// that operation and every later one fail with EIO.
    pub fn crash_at_op(&self, op: u64) {
        self.inner.lock().crash_at = Some(op);
    }

    /// The image taken by a `crash_at_op` crash, if it happened.
    pub fn crashed_image(&self) -> Option<CrashImage> {
        self.inner.lock().crashed.clone()
    }

    /// Simulates a crash now and returns what survives (the simulation itself goes on).
    pub fn crash_image(&self) -> CrashImage {
        let mut g = self.inner.lock();
        Self::take_crash(&mut g)
    }

    fn take_crash(g: &mut Inner) -> CrashImage {
        let mut img = g.durable.clone();
        let pending = g.pending.clone();
        for op in &pending {
            apply(&mut img, op, &mut g.rng, true);
        }
        CrashImage { data: img }
    }

    pub fn volatile(&self) -> Vec<u8> {
        self.inner.lock().volatile.clone()
    }

    pub fn durable(&self) -> Vec<u8> {
        self.inner.lock().durable.clone()
    }

    pub fn stats(&self) -> SimStats {
        self.inner.lock().stats
    }

    /// Counts the op and returns the fault to apply to it, if any.
    fn begin_op(g: &mut Inner, is_read: bool) -> Option<FaultKind> {
        let op = if is_read {
            g.stats.read_ops
        } else {
            g.stats.ops
        };
        if is_read {
            g.stats.read_ops += 1;
        } else {
            g.stats.ops += 1;
        }
        if let Some(at) = g.crash_at {
            if g.crashed.is_some() || (!is_read && op >= at) {
                if g.crashed.is_none() {
                    let img = Self::take_crash(g);
                    g.crashed = Some(img);
                }
                return Some(FaultKind::Eio);
            }
        }
        g.faults
            .iter()
            .find(|f| (f.at_op == op || (f.persist && op >= f.at_op)) && is_read == f.reads)
            .map(|f| f.kind)
    }

    fn check_capacity(g: &Inner, end: u64) -> io::Result<()> {
        match g.capacity_bytes {
            Some(cap) if end > cap && end > g.volatile.len() as u64 => {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            _ => Ok(()),
        }
    }
}

impl Durable for SimBacking {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut g = self.inner.lock();
        if let Some(k) = Self::begin_op(&mut g, true) {
            return Err(k.to_error());
        }
        g.stats.reads += 1;
        let len = g.volatile.len() as u64;
        if offset >= len {
            return Ok(0);
        }
        let n = (len - offset).min(buf.len() as u64) as usize;
        buf[..n].copy_from_slice(&g.volatile[offset as usize..offset as usize + n]);
        g.stats.bytes_read += n as u64;
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_durably(buf, offset).map(|_| ())
    }

    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let op = Pending::Write {
            offset,
            data: buf.to_vec(),
        };
        if let Some(k) = Self::begin_op(g, false) {
            // A failing write may still have put a torn prefix of sectors on the way to
            // the media: hostile, and what real devices may do.
            if g.crashed.is_none() && g.rng.chance(1, 2) {
                let keep = g.rng.below(buf.len() as u64 + 1) as usize;
                let part = Pending::Write {
                    offset,
                    data: buf[..keep].to_vec(),
                };
                apply(&mut g.volatile, &part, &mut g.rng, false);
                g.pending.push(part);
            }
            return Err(k.to_error());
        }
        Self::check_capacity(g, offset + buf.len() as u64)?;
        g.stats.writes += 1;
        g.stats.bytes_written += buf.len() as u64;
        apply(&mut g.volatile, &op, &mut g.rng, false);
        let whole_blocks = g.direct_block_bytes.is_some_and(|b| {
            offset.is_multiple_of(b) && (buf.len() as u64).is_multiple_of(b) && !buf.is_empty()
        });
        if g.dsync || whole_blocks {
            // Durable on return. Earlier unsynced changes of the same bytes reach the media
            // first (the kernel writes the range back before a direct write, and the
            // write's own flush covers them); the rest stay pending.
            settle_range(g, offset, buf.len() as u64);
            apply(&mut g.durable, &op, &mut g.rng, false);
            Ok(Persistence::Durable)
        } else {
            g.pending.push(op);
            Ok(Persistence::NeedsSync)
        }
    }

    fn sync(&self) -> io::Result<()> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        if let Some(k) = Self::begin_op(g, false) {
            if g.crashed.is_none() {
                // fsyncgate: some pending writes reach the media, the rest are forgotten
                // (the volatile image keeps them, as the page cache would).
                let pending = std::mem::take(&mut g.pending);
                for op in &pending {
                    apply(&mut g.durable, op, &mut g.rng, true);
                }
            }
            return Err(k.to_error());
        }
        g.stats.syncs += 1;
        let pending = std::mem::take(&mut g.pending);
        for op in &pending {
            apply(&mut g.durable, op, &mut g.rng, false);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.inner.lock().volatile.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        if let Some(k) = Self::begin_op(g, false) {
            return Err(k.to_error());
        }
        Self::check_capacity(g, len)?;
        g.stats.set_lens += 1;
        resize_to(&mut g.volatile, len);
        g.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        if let Some(k) = Self::begin_op(g, false) {
            return Err(k.to_error());
        }
        zero_into(&mut g.volatile, offset, len);
        g.pending.push(Pending::Zero { offset, len });
        Ok(())
    }

    /// Models evicting the page cache: clean pages go, so what reads see becomes the
    /// durable image plus the writes still pending (dirty). After a failed sync the pending
    /// log was forgotten, so bytes that never reached the media disappear here, as they do
    /// on Linux once the cache drops them.
    fn drop_cache(&self, _offset: u64, _len: u64) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let mut img = g.durable.clone();
        for op in &g.pending {
            apply(&mut img, op, &mut g.rng, false);
        }
        g.volatile = img;
    }

    fn writes_are_durable(&self) -> bool {
        self.inner.lock().dsync
    }

    fn durable_write_block_bytes(&self) -> Option<u64> {
        self.inner.lock().direct_block_bytes
    }

    fn describe(&self) -> String {
        String::from("simulated disk")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_may_vanish_synced_survive() -> io::Result<()> {
        let d = SimBacking::new(1);
        d.write_at(&[1u8; 1024], 0)?;
        d.sync()?;
        d.write_at(&[2u8; 4096], 0)?;
        let img = d.crash_image();
        assert!(img.data.len() >= 1024);
        for (i, b) in img.data.iter().enumerate() {
            if i < 1024 {
                assert!(*b == 1 || *b == 2);
            } else {
                assert!(*b == 0 || *b == 2);
            }
        }
        d.sync()?;
        assert_eq!(d.crash_image().data, vec![2u8; 4096]);
        Ok(())
    }

    #[test]
    fn injected_faults_fire_at_op() -> io::Result<()> {
        let d = SimBacking::new(2);
        d.inject(Fault {
            at_op: 1,
            kind: FaultKind::Enospc,
            persist: false,
            reads: false,
        });
        d.write_at(b"a", 0)?;
        let e = d.write_at(b"b", 1).err().map(|e| e.raw_os_error());
        assert_eq!(e, Some(Some(libc::ENOSPC)));
        d.write_at(b"c", 2)?;
        Ok(())
    }

    #[test]
    fn crash_at_op_freezes_image() -> io::Result<()> {
        let d = SimBacking::new(3);
        d.crash_at_op(2);
        d.write_at(b"x", 0)?;
        d.sync()?;
        assert!(d.write_at(b"y", 0).is_err());
        assert!(d.sync().is_err());
        assert_eq!(d.crashed_image().map(|c| c.data), Some(b"x".to_vec()));
        Ok(())
    }
}
