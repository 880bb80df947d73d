//! The [`Tiered`] device itself: its reads and writes as a [`Durable`], its counters,
//! and its clean close.
//!
//! Invariants:
//! - The lower tier's bytes of a part the slot does not hold are current: every write to a
//!   cached chunk lands in its slot (or, in write-through, drops a clean slot first), so a
//!   read lays a slot's parts over the lower tier's bytes.
//! - When no clean slot is left, a write goes to the lower tier directly (write-through
//!   for that write), acknowledged only once the FREE entry that dropped the chunk's last
//!   slot is durable, and never after the SSD failed.
//! - `close` runs once (dropping does it too), after the write-back threads stopped.
//!
//! Crash semantics: every acknowledged write survives a power cut of both devices; an
//! unacknowledged write leaves each sector old or new.

use super::mode::{SlotSync, TierMode};
use super::parts;
use super::requests::Reached;
use super::shared::Shared;
use super::stats::TierStats;
use super::writes;
use crate::fastdev::{self, read_padded};
use dhrd_engine::cache::{Admit, ACCESS_COUNT_MAX};
use dhrd_io::{Durable, Persistence};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// See the module documentation.
pub struct Tiered<F: Durable, S: Durable> {
    pub(super) shared: Arc<Shared<F, S>>,
    pub(super) threads: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// `close` ran.
    pub(super) closed: std::sync::atomic::AtomicBool,
}

/// The tiered device over any backing, with its SSD a file: what `dhrd nbd --tier-ssd`
/// and the C API's `tier_ssd_path` open.
pub type SsdTier = Tiered<Arc<dyn Durable>, Arc<dyn Durable>>;

impl<F: Durable, S: Durable> Tiered<F, S> {
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

impl<F: Durable, S: Durable> Drop for Tiered<F, S> {
    fn drop(&mut self) {
        self.close();
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
