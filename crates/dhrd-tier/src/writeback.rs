//! Write-back over a non-volatile fast device (SPEC M4; the cache tier of T1).
//!
//! [`WriteBack`] is a [`Durable`] made of two: a fast device that survives power loss
//! (NVM, a pmem/DAX file, an SSD in front of a disk) and the slow backing. A write is
//! durable once it is on the fast device, so it is acknowledged then; background threads
//! copy dirty chunks to the slow device later. The engine sits on top unchanged: its RAM
//! tier (DRAM) still serves reads, and DRAM is never treated as non-volatile: the fast
//! device must be one that keeps its contents without power, which the caller declares.
//!
//! Fast device layout (direct-mapped: the fast device holds a copy of every chunk at the
//! chunk's own offset):
//! - `[0, HEADER_BYTES)`: the header: magic, version, chunk size, data size, checksum;
//!   and, from [`crate::pairing::RECORD_OFFSET`], the record of which slow device the
//!   fast device caches (`pairing.rs`);
//! - `[HEADER_BYTES, data_offset)`: the chunk map, one byte per chunk: [`CHUNK_INVALID`]
//!   (the fast copy is not current; read the slow device), [`CHUNK_DIRTY`] (the fast copy
//!   is the only current one), [`CHUNK_CLEAN`] (both copies are current);
//! - `[data_offset, data_offset + data_bytes)`: the chunks.
//!
//! Invariants:
//! - A chunk's map byte is `DIRTY` on the fast device before any write into it is
//!   acknowledged, and the bytes of the write are on the fast device too. A `CLEAN` chunk
//!   is marked `DIRTY` durably before its fast copy changes (so a `CLEAN` chunk's copies
//!   are equal even after a crash in the middle of a write); an `INVALID` chunk is first
//!   filled from the slow device and that fill is synced before the byte says `DIRTY`,
//!   so a crash never exposes a fast copy that is neither old nor new.
//! - A chunk becomes `CLEAN` only after its bytes, read from the fast device under the
//!   chunk's lock, were synced on the fast device, written to the slow device and the slow
//!   device synced, and only if no write began in the chunk since it was read (its write
//!   count, taken before a write changes anything, is unchanged).
//! - Reads of a `DIRTY` or `CLEAN` chunk come from the fast device, of an `INVALID` one
//!   from the slow device: after a crash nothing stale is served, and recovery is reading
//!   the map; the write-back simply continues.
//!
//! Crash semantics: every acknowledged write survives a power cut of both devices, and of
//! the slow device alone at any time (the fast copy stays dirty until the slow device
//! confirms). An unacknowledged write leaves each sector old or new. A write that failed
//! on the fast device fails the request, and every later one too: a failed sync may
//! have dropped writes of other requests that their own later syncs would report as
//! done, so after a failure of the fast device nothing is acknowledged or written back
//! until it is opened again (the map on the device still names every acknowledged
//! write). A failure of the slow device delays the write-back (retried with back-off,
//! reported by [`WriteBack::stats`]); only a write that must first fill its chunk from
//! the slow device (a partial write to a chunk whose fast copy is not current) fails with
//! the slow device's error, having changed nothing.

use crate::fastdev::{self, fnv64, invalid, Background, StickyFailure};
use crate::pairing::{self, LowerIdentity, Paired};
use dhrd_io::{Durable, Persistence};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Map byte: the fast copy of the chunk is not current.
pub const CHUNK_INVALID: u8 = 0;
/// Map byte: the fast copy is the only current copy.
pub const CHUNK_DIRTY: u8 = 1;
/// Map byte: both copies are current.
pub const CHUNK_CLEAN: u8 = 2;
/// Bytes of the header; the map starts here.
pub const HEADER_BYTES: u64 = 4096;
const MAGIC: &[u8; 8] = b"DHRDWB01";
// The header (36 bytes) and the two pairing records share the header page.
const _: () = assert!(
    36 <= crate::pairing::RECORD_OFFSET
        && crate::pairing::RECORD_OFFSET + 2 * crate::pairing::RECORD_BYTES <= HEADER_BYTES
);
const VERSION: u32 = 1;
/// Stripes of the chunk locks (a write and the write-back of the same chunk serialise).
const LOCK_STRIPES: usize = 256;
/// Write-back threads.
pub const WRITEBACK_THREADS_DEFAULT: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    chunk_bytes: u64,
    data_bytes: u64,
}

impl Geometry {
    fn chunks(&self) -> u64 {
        self.data_bytes.div_ceil(self.chunk_bytes)
    }
    fn data_offset(&self) -> u64 {
        (HEADER_BYTES + self.chunks()).div_ceil(HEADER_BYTES) * HEADER_BYTES
    }
    fn fast_bytes(&self) -> u64 {
        self.data_offset() + self.data_bytes
    }
    fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(40);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&self.chunk_bytes.to_le_bytes());
        h.extend_from_slice(&self.data_bytes.to_le_bytes());
        let c = fnv64(&h);
        h.extend_from_slice(&c.to_le_bytes());
        h
    }
    /// `Ok(None)` for a device that was never formatted (no magic).
    fn decode(h: &[u8]) -> io::Result<Option<Self>> {
        if h.len() < 36 || &h[..8] != MAGIC {
            return Ok(None);
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let mut v = [0u8; 4];
        v.copy_from_slice(&h[8..12]);
        if u32::from_le_bytes(v) != VERSION {
            return Err(invalid(format!(
                "write-back device: header version {} (this dhrd writes {VERSION})",
                u32::from_le_bytes(v)
            )));
        }
        if fnv64(&h[..28]) != u64_at(28) {
            return Err(invalid(
                "write-back device: the header's checksum does not match (torn or foreign)".into(),
            ));
        }
        Ok(Some(Self {
            chunk_bytes: u64_at(12),
            data_bytes: u64_at(20),
        }))
    }
}

/// Write-back statistics, serialised under the names of `dhrd nbd`'s status file
/// (docs/nbd.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteBackStats {
    pub chunks: u64,
    pub chunks_dirty: u64,
    /// Chunks copied to the slow device since open.
    pub chunks_written_back: u64,
    /// Chunks that were dirty when the device was opened (recovered after a crash or an
    /// undrained stop).
    pub chunks_dirty_at_open: u64,
    #[serde(rename = "failures")]
    pub writeback_failures: u64,
    /// Writes of a chunk whose fast copy had to be filled from the slow device first.
    pub fills: u64,
    /// Clean chunks dropped at open because the fast device was made for another slow
    /// device, or the slow device changed while detached (`pairing.rs`).
    pub chunks_dropped_at_open: u64,
    /// Dirty chunks kept at open in such a case because the opener adopted them.
    pub chunks_adopted_dirty: u64,
}

struct State {
    map: Vec<u8>,
    /// Writes into each chunk since open (see the header: "its write count").
    writes: Vec<u64>,
    dirty: u64,
    /// Round-robin position of the write-back.
    cursor: u64,
    /// Chunks being written back now.
    busy: Vec<bool>,
}

struct Shared<F: Durable, S: Durable> {
    fast: F,
    slow: S,
    geo: Geometry,
    data_offset: u64,
    state: Mutex<State>,
    /// Wakes the write-back threads (work) and `drain` (progress).
    cv: Condvar,
    locks: Vec<Mutex<()>>,
    stop: AtomicBool,
    /// A write or sync of the fast device failed: no write is acknowledged any more and
    /// nothing is written back (sticky, SPEC C4); a write acknowledged, or a chunk written
    /// back and marked clean, on the strength of a sync after such a failure could be lost
    /// or differ from the fast copy after a crash. Also runs the fast device's syncs one
    /// at a time (`fastdev::StickyFailure`).
    failed: StickyFailure,
    written_back: AtomicU64,
    failures: AtomicU64,
    fills: AtomicU64,
    dirty_at_open: u64,
    /// The slow device as the opener named it, and the number of the pairing record
    /// written at open; a clean close writes the next one.
    paired: Paired,
}

/// See the module documentation.
pub struct WriteBack<F: Durable, S: Durable> {
    shared: Arc<Shared<F, S>>,
    threads: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// `close` ran.
    closed: std::sync::atomic::AtomicBool,
}

impl<F: Durable, S: Durable> WriteBack<F, S> {
    /// Opens (or formats, if the fast device holds no write-back header) the pair. The
    /// export's size is the slow device's. A header for another size or chunk size is
    /// refused while any chunk is dirty (that data exists nowhere else); without dirty
    /// chunks the fast device is formatted anew. A fast device made for another slow
    /// device than `identity` names, or whose slow device changed while it was detached,
    /// has its clean chunks dropped and is refused while it holds dirty ones, unless
    /// `identity.adopt` (then they are written back over the slow device).
    pub fn open(
        fast: F,
        slow: S,
        identity: LowerIdentity,
        chunk_bytes: u64,
        threads: usize,
    ) -> io::Result<Self> {
        if chunk_bytes == 0 || !chunk_bytes.is_power_of_two() || chunk_bytes < 512 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("write-back chunk size {chunk_bytes} is not a power of two >= 512"),
            ));
        }
        let data_bytes = slow.len()?;
        let want = Geometry {
            chunk_bytes,
            data_bytes,
        };
        let (mut map, checked, formatted) = Self::read_or_format(&fast, &identity, want)?;
        let count = |state| map.iter().filter(|b| **b == state).count() as u64;
        let (clean, dirty) = (count(CHUNK_CLEAN), count(CHUNK_DIRTY));
        let plan = pairing::plan(
            &identity,
            checked,
            formatted,
            clean,
            dirty,
            "write-back device",
        )?;
        match plan.action {
            pairing::Action::Keep => {}
            pairing::Action::Format => {
                Self::format(&fast, want)?;
                map.fill(CHUNK_INVALID);
            }
            pairing::Action::DropClean => {
                for b in map.iter_mut().filter(|b| **b == CHUNK_CLEAN) {
                    *b = CHUNK_INVALID;
                }
                fast.write_at(&map, HEADER_BYTES)?;
                fast.sync()?;
            }
        }
        if fast.len()? < want.fast_bytes() {
            fast.set_len(want.fast_bytes())?;
            fast.sync()?;
        }
        // Dropping clean chunks, or formatting with none dirty, leaves `dirty` as counted.
        let paired = pairing::finish(&fast, identity, plan)?;
        let chunks = map.len();
        let shared = Arc::new(Shared {
            fast,
            slow,
            geo: want,
            data_offset: want.data_offset(),
            state: Mutex::new(State {
                map,
                writes: vec![0; chunks],
                dirty,
                cursor: 0,
                busy: vec![false; chunks],
            }),
            cv: Condvar::new(),
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            stop: AtomicBool::new(false),
            failed: StickyFailure::new(
                "the write-back device failed earlier: writes are refused and nothing is written back until it is opened again",
            ),
            written_back: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            dirty_at_open: dirty,
            paired,
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("dhrd-wb-{i}"))
                    .spawn(move || writeback_loop(&s))?,
            );
        }
        Ok(Self {
            shared,
            threads: parking_lot::Mutex::new(handles),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Reads the fast device's chunk map, or formats the device for `want` when it holds
    /// no header, or one for another size or chunk size (refused while dirty: that data
    /// exists nowhere else). What the fast device records of its slow device, and the slow
    /// device's mark, are checked before anything changes (`pairing.rs`). The map, the
    /// pairing check, and whether the device was formatted (which wipes the pairing
    /// records with the header page: a formatted device is unrecorded, and a new cache).
    fn read_or_format(
        fast: &F,
        identity: &LowerIdentity,
        want: Geometry,
    ) -> io::Result<(Vec<u8>, pairing::Checked, bool)> {
        let mut header = vec![0u8; 64];
        let n = dhrd_io::read_full(fast, &mut header, 0)?;
        header.truncate(n);
        let found = Geometry::decode(&header)?;
        let checked = pairing::begin(fast, identity, found.is_some())?;
        if let Some(g) = found {
            let mut old_map = vec![0u8; g.chunks() as usize];
            let got = dhrd_io::read_full(fast, &mut old_map, HEADER_BYTES)?;
            old_map.truncate(got);
            let dirty = old_map.iter().filter(|b| **b == CHUNK_DIRTY).count();
            if g == want {
                if got as u64 != g.chunks() {
                    return Err(invalid(
                        "write-back device: the chunk map is cut short".into(),
                    ));
                }
                return Ok((old_map, checked, false));
            }
            if dirty > 0 {
                return Err(invalid(format!(
                    "write-back device holds {dirty} dirty chunks for {} bytes in chunks of {}, \
                     but the backing is {} bytes in chunks of {}: \
                     open it with the backing and chunk size it was made for",
                    g.data_bytes, g.chunk_bytes, want.data_bytes, want.chunk_bytes
                )));
            }
        }
        Self::format(fast, want)?;
        Ok((vec![CHUNK_INVALID; want.chunks() as usize], checked, true))
    }

    fn format(fast: &F, g: Geometry) -> io::Result<()> {
        // Map first (all INVALID), then the header: a crash in between leaves no header.
        fastdev::format(fast, g.encode(), HEADER_BYTES, g.fast_bytes())
    }

    pub fn stats(&self) -> WriteBackStats {
        let s = &self.shared;
        let st = s.state.lock();
        WriteBackStats {
            chunks: st.map.len() as u64,
            chunks_dirty: st.dirty,
            chunks_written_back: s.written_back.load(Ordering::Relaxed),
            chunks_dirty_at_open: s.dirty_at_open,
            writeback_failures: s.failures.load(Ordering::Relaxed),
            fills: s.fills.load(Ordering::Relaxed),
            chunks_dropped_at_open: s.paired.dropped_at_open,
            chunks_adopted_dirty: s.paired.adopted_dirty,
        }
    }

    /// Why the fast device's copies were not trusted at open (it was made for another slow
    /// device, or that changed while detached), if they were not.
    pub fn distrusted_at_open(&self) -> Option<&str> {
        self.shared.paired.distrust.as_deref()
    }

    /// Why writes are refused, once a write or sync of the fast device failed or the
    /// write-back stopped on a panic.
    pub fn failure(&self) -> Option<String> {
        self.shared.failed.failure()
    }

    /// Waits until no chunk is dirty (or `timeout` passes); true when clean.
    pub fn drain(&self, timeout: Duration) -> bool {
        self.shared.background().drain(timeout, |st| st.dirty)
    }

    pub fn fast(&self) -> &F {
        &self.shared.fast
    }

    pub fn slow(&self) -> &S {
        &self.shared.slow
    }
}

impl<F: Durable, S: Durable> WriteBack<F, S> {
    /// Stops the write-back threads and, unless the device failed, closes the pair
    /// cleanly (`pairing.rs`): the slow device's mark is removed when nothing is dirty
    /// and its stamp recorded. Call after the last write and `drain`, before the slow
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
                .close(&s.fast, s.slow.sync(), || s.state.lock().dirty);
        }
    }
}

impl<F: Durable, S: Durable> Drop for WriteBack<F, S> {
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

    fn lock_of(&self, c: u64) -> &Mutex<()> {
        &self.locks[(c % LOCK_STRIPES as u64) as usize]
    }

    fn chunk_range(&self, c: u64) -> (u64, u64) {
        let start = c * self.geo.chunk_bytes;
        (
            start,
            (start + self.geo.chunk_bytes).min(self.geo.data_bytes),
        )
    }

    fn set_map(&self, c: u64, v: u8) -> io::Result<()> {
        self.fast_write(&[v], HEADER_BYTES + c)
    }

    /// Every change of the fast device goes through here and `fast_sync`: a failure is
    /// sticky (`failed`).
    fn fast_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.failed.write(self.fast.write_at(buf, offset))
    }

    /// Syncs the fast device, one sync at a time, refusing once any write or sync of it
    /// failed.
    fn fast_sync(&self) -> io::Result<()> {
        self.failed.sync(&self.fast)
    }

    fn check(&self) -> io::Result<()> {
        self.failed.check()
    }

    /// Writes `buf` at `offset`, all inside chunk `c`, with the chunk's lock held.
    fn write_piece(&self, c: u64, buf: &[u8], offset: u64) -> io::Result<()> {
        let (start, end) = self.chunk_range(c);
        // Counted before anything changes: a write-back that read the chunk before this
        // write must not mark it clean afterwards.
        let was = {
            let mut st = self.state.lock();
            st.writes[c as usize] += 1;
            st.map[c as usize]
        };
        match was {
            CHUNK_DIRTY => self.fast_write(buf, self.data_offset + offset)?,
            CHUNK_CLEAN => {
                // The map must say DIRTY on the device before the fast copy changes: a
                // crash must not leave a CLEAN chunk whose fast copy differs from the slow.
                self.mark_dirty(c)?;
                self.fast_sync()?;
                self.fast_write(buf, self.data_offset + offset)?;
            }
            _ => {
                // The fast copy is not current: bring the whole chunk over (unless the
                // write covers it) and make it durable before the map points at it.
                if offset == start && offset + buf.len() as u64 == end {
                    self.fast_write(buf, self.data_offset + offset)?;
                } else {
                    let mut whole = vec![0u8; (end - start) as usize];
                    fastdev::read_padded(&self.slow, &mut whole, start)?;
                    let at = (offset - start) as usize;
                    whole[at..at + buf.len()].copy_from_slice(buf);
                    self.fast_write(&whole, self.data_offset + start)?;
                    self.fills.fetch_add(1, Ordering::Relaxed);
                }
                self.fast_sync()?;
                self.mark_dirty(c)?;
            }
        }
        Ok(())
    }

    /// Marks chunk `c` dirty in memory and on the device (not synced). The map byte is
    /// written under the state lock, so map bytes reach the device in the order of the
    /// transitions (a late CLEAN never overwrites a newer DIRTY).
    fn mark_dirty(&self, c: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.map[c as usize] != CHUNK_DIRTY {
            st.map[c as usize] = CHUNK_DIRTY;
            st.dirty += 1;
            self.set_map(c, CHUNK_DIRTY)?;
        }
        Ok(())
    }

    /// Picks a dirty chunk nobody is writing back; None when there is none.
    fn next_dirty(&self, st: &mut State) -> Option<u64> {
        let n = st.map.len() as u64;
        if st.dirty == 0 || n == 0 {
            return None;
        }
        for i in 0..n {
            let c = (st.cursor + i) % n;
            if st.map[c as usize] == CHUNK_DIRTY && !st.busy[c as usize] {
                st.cursor = c + 1;
                st.busy[c as usize] = true;
                return Some(c);
            }
        }
        None
    }

    /// Copies chunk `c` to the slow device and marks it clean if nothing wrote it since.
    fn write_back(&self, c: u64) -> io::Result<()> {
        let (start, end) = self.chunk_range(c);
        let mut buf = vec![0u8; (end - start) as usize];
        let writes_before = {
            let _g = self.lock_of(c).lock();
            let w = self.state.lock().writes[c as usize];
            let n = dhrd_io::read_full(&self.fast, &mut buf, self.data_offset + start)?;
            if n != buf.len() {
                return Err(invalid(format!("write-back device: chunk {c} cut short")));
            }
            w
        };
        // What was read may include a write not yet synced by its writer: make it durable
        // on the fast device before the map can call the copies equal.
        self.fast_sync()?;
        self.slow.write_at(&buf, start)?;
        self.slow.sync()?;
        let mut st = self.state.lock();
        if st.writes[c as usize] == writes_before && st.map[c as usize] == CHUNK_DIRTY {
            // Written under the state lock (see `write_piece`); not synced: if it is lost,
            // the chunk is written back again.
            self.set_map(c, CHUNK_CLEAN)?;
            st.map[c as usize] = CHUNK_CLEAN;
            st.dirty -= 1;
            self.written_back.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn writeback_loop<F: Durable, S: Durable>(s: &Shared<F, S>) {
    s.background().run(
        |st| s.next_dirty(st).map(|c| c as usize),
        |c| s.write_back(c as u64),
        |st, c| st.busy[c] = false,
    );
}

impl<F: Durable, S: Durable> Durable for WriteBack<F, S> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = &self.shared;
        let end = (offset + buf.len() as u64).min(s.geo.data_bytes);
        let mut pos = offset;
        while pos < end {
            let c = pos / s.geo.chunk_bytes;
            let (_, cend) = s.chunk_range(c);
            let piece_end = cend.min(end);
            let dst = &mut buf[(pos - offset) as usize..(piece_end - offset) as usize];
            let on_fast = s.state.lock().map[c as usize] != CHUNK_INVALID;
            if on_fast {
                fastdev::read_padded(&s.fast, dst, s.data_offset + pos)?;
            } else {
                fastdev::read_padded(&s.slow, dst, pos)?;
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
            .filter(|e| *e <= s.geo.data_bytes)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "write of {} bytes at {offset} past the end of a {}-byte write-back device",
                        buf.len(),
                        s.geo.data_bytes
                    ),
                )
            })?;
        let mut pos = offset;
        while pos < end {
            let c = pos / s.geo.chunk_bytes;
            let (_, cend) = s.chunk_range(c);
            let piece_end = cend.min(end);
            let src = &buf[(pos - offset) as usize..(piece_end - offset) as usize];
            let _g = s.lock_of(c).lock();
            s.write_piece(c, src, pos)?;
            pos = piece_end;
        }
        // One sync makes the bytes and the map durable (see the header).
        s.fast_sync()?;
        s.cv.notify_all();
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.shared.fast_sync()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.shared.geo.data_bytes)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        fastdev::fixed_size(
            len,
            self.shared.geo.data_bytes,
            "a write-back device has the fixed size of its backing",
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
        self.shared.slow.reads_allowed()
    }

    fn describe(&self) -> String {
        format!(
            "{} written back from {}",
            self.shared.slow.describe(),
            self.shared.fast.describe()
        )
    }
}

#[cfg(test)]
mod tests;
