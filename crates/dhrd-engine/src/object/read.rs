//! The object's read side: copies out of RAM, the backing for what is not Loaded, and
//! zero-copy views of RAM.
//!
//! Invariants:
//! - A read takes no chunk lock: it reads a chunk's state word, copies, and checks the word
//!   again, so it never returns RAM bytes of a chunk that was not Loaded throughout (a
//!   chunk that left Loaded meanwhile is read from the backing, I5).
//! - The length is read only under the layout lock, which a shrinking `set_len` takes
//!   exclusively: no copy or view reaches past the memfd's size (SIGBUS).
//! - A view counts itself live before it checks the chunk states, and an eviction changes
//!   the state before it counts the live views: either the eviction waits for the view
//!   before zeroing the chunk's RAM, or the view sees the chunk gone.
//!
//! Crash semantics: none; reads change nothing durable.

use super::*;

impl<D: Durable> Inner<D> {
    pub(super) fn check_reads_allowed(&self) -> Result<()> {
        self.backing
            .reads_allowed()
            .map_err(|source| Error::Backing {
                op: BackingOp::Read,
                source,
            })
    }

    pub(super) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<ReadOutcome> {
        if buf.is_empty() {
            return Ok(ReadOutcome {
                bytes: 0,
                served: Served::Eof,
            });
        }
        let timed = sample_read().then(Instant::now);
        // The length is read under the layout lock: a shrinking `set_len` takes it
        // exclusively, so no shrink can fall between reading the length and touching RAM
        // below it (past the memfd size a RAM access raises SIGBUS and kills the process).
        let layout = read_guard(&self.layout);
        let len = self.len.load(Ordering::Acquire);
        if offset >= len {
            return Ok(ReadOutcome {
                bytes: 0,
                served: Served::Eof,
            });
        }
        let n = (len - offset).min(buf.len() as u64);
        let end = offset + n;
        let (mut ram_bytes, mut backing_bytes) = (0u64, 0u64);
        let mut demanded: Option<ChunkIndex> = None;
        let mut ahead_hit: Option<ChunkIndex> = None;
        let mut pos = offset;
        while pos < end {
            let c = self.geo.index_of(pos);
            let piece_end = self.geo.end_of(c).min(end);
            let w = layout.word(c);
            if state_of(w) == ChunkState::Loaded {
                let dst = &mut buf[(pos - offset) as usize..(piece_end - offset) as usize];
                layout.ram.copy_out(pos, dst);
                fence(Ordering::Acquire);
                if layout.word(c) == w {
                    // M1: a hit. Counted for the cache policy with one relaxed store.
                    if layout.slot(c).touch() && ahead_hit.is_none() {
                        ahead_hit = Some(c);
                    }
                    ram_bytes += piece_end - pos;
                    pos = piece_end;
                    continue;
                }
            }
            // I5: not Loaded (or left Loaded while we copied): the backing answers. Batch
            // the run of consecutive non-Loaded chunks into one backing read.
            let mut run_end = piece_end;
            while run_end < end {
                let c2 = self.geo.index_of(run_end);
                if layout.state(c2) == ChunkState::Loaded {
                    break;
                }
                run_end = self.geo.end_of(c2).min(end);
            }
            let t = Instant::now();
            let dst = &mut buf[(pos - offset) as usize..(run_end - offset) as usize];
            let got =
                read_full(&self.backing, dst, pos).map_err(|e| backing_err(BackingOp::Read, e))?;
            // The backing is shorter than we think only if it was truncated behind our back;
            // what is not there reads as zeros.
            dst[got..].fill(0);
            self.stats.record(Lat::ReadBacking, t.elapsed());
            if demanded.is_none() {
                demanded = Some(c);
            }
            backing_bytes += run_end - pos;
            pos = run_end;
        }
        drop(layout);
        if ram_bytes > 0 {
            self.stats.add(C::ReadsRam, 1);
            self.stats.add(C::BytesReadRam, ram_bytes);
        }
        if backing_bytes > 0 {
            self.stats.add(C::ReadsBacking, 1);
            self.stats.add(C::BytesReadBacking, backing_bytes);
        }
        if let Some(c) = demanded {
            self.on_read_miss(c);
        }
        if let Some(c) = ahead_hit {
            self.on_ahead_hit(c);
        }
        if let Some(t) = timed {
            if backing_bytes == 0 {
                self.stats.record(Lat::ReadRam, t.elapsed());
            }
        }
        let served = match (ram_bytes > 0, backing_bytes > 0) {
            (true, false) => Served::Ram,
            (false, true) => Served::Backing,
            _ => Served::Mixed,
        };
        Ok(ReadOutcome {
            bytes: n as usize,
            served,
        })
    }

    /// I10: a foreground read hit an unloaded chunk; load it ahead of the sequence.
    pub(super) fn demand(&self, c: ChunkIndex) {
        {
            let mut q = self.lq.lock();
            if q.demand.len() >= DEMAND_QUEUE_MAX || q.demand.contains(&c) {
                return;
            }
            q.demand.push_back(c);
        }
        if let Some(l) = &self.loader {
            l.prioritize(self.weak_target(), self.id);
        }
    }

    pub(super) fn view(&self, offset: u64, len: usize) -> Result<View<'_>> {
        if len == 0 {
            return Ok(View::Eof);
        }
        // As in `read_at`: the length only under the layout lock, which the view keeps.
        let g = read_guard(&self.layout);
        let size = self.len.load(Ordering::Acquire);
        if offset >= size {
            return Ok(View::Eof);
        }
        let n = (size - offset).min(len as u64);
        // Counted live before the states are checked, and an eviction changes the state
        // before it counts the live views (both sides fenced): either the eviction sees
        // this view and waits for it before zeroing, or this view sees the chunk gone.
        let live = self.enter_view();
        fence(Ordering::SeqCst);
        let mut ahead_hit = None;
        for p in self.geo.pieces(offset, n) {
            if g.state(p.chunk) != ChunkState::Loaded {
                live.fetch_sub(1, Ordering::SeqCst);
                return Ok(View::NotLoaded(p.chunk));
            }
            if g.slot(p.chunk).touch() && ahead_hit.is_none() {
                ahead_hit = Some(p.chunk);
            }
        }
        if let Some(c) = ahead_hit {
            self.on_ahead_hit(c);
        }
        // SAFETY: below the length, hence below the memfd size; the guard moves into the
        // view and pins the mapping.
        let ptr = unsafe { g.ram.slice(offset, n as usize) }.as_ptr();
        self.stats.add(C::ReadsRam, 1);
        self.stats.add(C::BytesReadRam, n);
        Ok(View::Ram(RamView {
            _guard: g,
            live,
            ptr,
            len: n as usize,
        }))
    }
}
