//! ReHypar: recursive hybrid chunk partitioning of the fast (SSD) tier's space (No, Park and
//! Lim, 2014; SPEC T2).
//!
//! The device is divided into data sections, each made of extents of one size (64 KiB and
//! 256 KiB by default). A request of at least an extent takes whole clean extents; a
//! smaller one goes into the free remainder of an extent that already holds data, chosen
//! from per-level reuse lists, or else into a clean extent. Inside an extent, allocations
//! follow one another in address order, each starting at a chunk boundary of the recursive
//! partitioning (`rehypar/chunk.rs`): after an allocation whose last block is `pos`, MAP gives the
//! chunk where the next one starts, and the rest of `pos`'s leaf chunk stays unused.
//!
//! Invariants (checked by [`ReHypar::check_invariants`]):
//! - an extent is either clean (no live data, in its section's clean set) or resident
//!   (at least one live allocation touches it); the last live allocation's free makes it
//!   clean again at once;
//! - every live allocation inside a resident extent lies below its fill offset, which is
//!   the start of the chunk MAP returned (or the extent's end when full);
//! - a resident extent is in exactly one reuse list, the one keyed by the chunk at its fill
//!   offset, if its unused remainder is at least `reuse_min_blocks` and it is not sealed
//!   (its reuse window, counted in allocations or ended by the caller's `seal`, has not
//!   expired); otherwise it is in none and its remainder is lost until the extent is
//!   wholly free;
//! - each reuse list is ordered by non-increasing unused blocks, entries with equal unused
//!   space in the order they joined (the paper: "in the decreasing order of the unused
//!   space size").
//!
//! The paper says nothing about deleting files. By default ([`FreePolicy::WholeExtent`])
//! freeing an allocation only lowers its extents' live counts: the freed blocks are not
//! reused until every allocation in the extent is freed (as a fixed-bucket allocator does).
//! [`FreePolicy::RewindToLastLive`] also moves the fill offset back behind the last live
//! allocation. Reusing holes in the middle of an extent would need per-extent free maps,
//! which is what the chunk scheme exists to avoid.

mod chunk;
mod section;

use section::{ExtentState, Resident, Section};

pub use chunk::{
    BlockOffset, Chunk, ChunkGeometry, ChunkIndex, ChunkPos, MapOutcome, EXTENT_SHIFT_MAX,
    EXTENT_SHIFT_MIN, THRESHOLD_SHIFT_MIN,
};

use crate::space::{
    first_run, longest_run, AllocOutcome, BlockAddr, BlockCount, Extent, FreeOutcome, LiveSet,
    Placement, SpaceAllocator, SpaceStats,
};
use crate::Error;
use std::collections::{BTreeMap, VecDeque};

/// The paper's block size ("The block size is 1 KB", section 4).
pub const BLOCK_BYTES_DEFAULT: u64 = 1024;
pub const BLOCK_BYTES_MIN: u64 = 512;
pub const BLOCK_BYTES_MAX: u64 = 1 << 20;
/// The paper's two data sections (section 4): 64 KiB and 256 KiB extents.
pub const EXTENT_BYTES_DEFAULT: [u64; 2] = [64 << 10, 256 << 10];
/// The paper tried v = 8 and v = 32 and saw no throughput difference; 8 wastes less of a
/// leaf chunk (a leaf is shorter than v, and its blocks after a file's end stay unused).
pub const THRESHOLD_BLOCKS_DEFAULT: u64 = 8;
/// Data sections per device: the paper uses two; a handful bounds the per-request scan.
pub const SECTIONS_MAX: usize = 8;
/// Extents per section: bounds the state (a few dozen bytes per extent) and keeps extent
/// numbers in a u32.
pub const EXTENTS_PER_SECTION_MAX: u64 = 1 << 24;

/// What freeing an allocation inside a resident extent gives back. The paper does not
/// say; both choices keep every allocation starting at a chunk boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FreePolicy {
    /// Freed blocks stay unused until every allocation in the extent is freed; then the
    /// extent is clean again. The extent's fill offset only ever grows, as in the paper.
    #[default]
    WholeExtent,
    /// As `WholeExtent`, and in addition the fill offset moves back to where MAP puts it
    /// after the extent's last live allocation, so a freed tail (and any dead space just
    /// before it) is reusable at once.
    RewindToLastLive,
}

/// Number of an extent within its data section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExtentNo(pub u32);

/// One data section of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionSpec {
    /// Extent size in bytes: a power-of-two multiple of the block size.
    pub extent_bytes: u64,
    /// Share of the device relative to the other sections' weights.
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReHyparConfig {
    pub block_bytes: u64,
    pub device_blocks: BlockCount,
    pub sections: Vec<SectionSpec>,
    /// The threshold v: chunks of at least v blocks are partitioned again.
    pub threshold_blocks: BlockCount,
    /// Smallest unused remainder for which an extent joins a reuse list; `None` = v / 2,
    /// the paper's "unused space of at least v/2" (its section 3.2 says "at least v"
    /// instead; section 3.3, which describes the lists, is followed here).
    pub reuse_min_blocks: Option<BlockCount>,
    /// How many allocations an extent may stay in the reuse lists after it first received
    /// data (the paper's expiry of the time an extent may stay in memory for reuse, whose
    /// value it does not give); `None` = until it is full.
    pub reuse_window_allocs: Option<u64>,
    /// The flash erase-block size when known: extents are then at least that large (so a
    /// power-of-two multiple of it) and sections start on its boundaries.
    pub flash_block_bytes: Option<u64>,
    pub free_policy: FreePolicy,
}

impl ReHyparConfig {
    /// The paper's configuration on a device of `device_blocks` 1 KiB blocks: two equal
    /// sections of 64 KiB and 256 KiB extents, v = 8.
    pub fn paper(device_blocks: BlockCount) -> Self {
        Self {
            block_bytes: BLOCK_BYTES_DEFAULT,
            device_blocks,
            sections: EXTENT_BYTES_DEFAULT
                .iter()
                .map(|&extent_bytes| SectionSpec {
                    extent_bytes,
                    weight: 1,
                })
                .collect(),
            threshold_blocks: BlockCount(THRESHOLD_BLOCKS_DEFAULT),
            reuse_min_blocks: None,
            reuse_window_allocs: None,
            flash_block_bytes: None,
            free_policy: FreePolicy::WholeExtent,
        }
    }
}

/// An extent in a reuse list, as [`ReHypar::reuse_lists`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedExtent {
    pub extent: ExtentNo,
    /// First block the next allocation in it would get.
    pub next_free: BlockAddr,
    pub unused: BlockCount,
}

/// Where a data section lies and how its extents are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionInfo {
    pub base: BlockAddr,
    pub extents: u32,
    pub geometry: ChunkGeometry,
}

impl SectionInfo {
    pub fn blocks(&self) -> BlockCount {
        BlockCount(u64::from(self.extents) * self.geometry.extent_blocks().0)
    }
}

/// The ReHypar allocator over one fast device.
#[derive(Debug)]
pub struct ReHypar {
    config: ReHyparConfig,
    sections: Vec<Section>,
    /// Section indices by ascending extent size (for the section choice).
    by_extent_size: Vec<usize>,
    reuse_min: BlockCount,
    live: LiveSet,
    /// Allocation requests so far: the clock of resident times.
    tick: u64,
    /// With a reuse window: (since_tick, section, extent) in order of becoming resident,
    /// to seal extents whose window expired. Entries of extents that became clean since
    /// are recognised by their tick and skipped.
    resident_order: VecDeque<(u64, usize, u32)>,
}

impl ReHypar {
    pub fn new(config: ReHyparConfig) -> Result<Self, Error> {
        let b = config.block_bytes;
        if !b.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&b) {
            return Err(Error::Config(format!(
                "block size {b} is not a power of two in [{BLOCK_BYTES_MIN}, {BLOCK_BYTES_MAX}]"
            )));
        }
        if config.sections.is_empty() || config.sections.len() > SECTIONS_MAX {
            return Err(Error::Config(format!(
                "{} data sections; 1 to {SECTIONS_MAX} are supported",
                config.sections.len()
            )));
        }
        let align_blocks = match config.flash_block_bytes {
            None => 1,
            Some(f) if f.is_power_of_two() && f >= b => f / b,
            Some(f) => {
                return Err(Error::Config(format!(
                    "flash block of {f} bytes is not a power of two of at least one block"
                )))
            }
        };
        let weight_sum: u64 = config.sections.iter().map(|s| u64::from(s.weight)).sum();
        if weight_sum == 0 {
            return Err(Error::Config("section weights sum to zero".into()));
        }
        let device = config.device_blocks.0;
        let mut sections = Vec::with_capacity(config.sections.len());
        let mut cursor = 0u64;
        for spec in &config.sections {
            if spec.extent_bytes % b != 0 {
                return Err(Error::Config(format!(
                    "extent of {} bytes is not a multiple of the {b}-byte block",
                    spec.extent_bytes
                )));
            }
            // Aligning to the flash block: an extent of at least one erase block, both
            // powers of two, is a whole number of erase blocks.
            let s = (spec.extent_bytes / b).max(align_blocks);
            let geometry = ChunkGeometry::new(BlockCount(s), config.threshold_blocks)?;
            let share =
                (u128::from(device) * u128::from(spec.weight) / u128::from(weight_sum)) as u64;
            let base = cursor.div_ceil(align_blocks) * align_blocks;
            let end = (cursor + share).min(device);
            let extents = end.saturating_sub(base) / s;
            if extents == 0 {
                return Err(Error::Config(format!(
                    "the section of {s}-block extents gets no whole extent of the device"
                )));
            }
            if extents > EXTENTS_PER_SECTION_MAX {
                return Err(Error::Config(format!(
                    "{extents} extents in one section exceed {EXTENTS_PER_SECTION_MAX}"
                )));
            }
            let extents = extents as u32;
            sections.push(Section {
                info: SectionInfo {
                    base: BlockAddr(base),
                    extents,
                    geometry,
                },
                states: vec![ExtentState::Clean; extents as usize],
                clean: (0..extents).collect(),
                lists: BTreeMap::new(),
                listed_unused_blocks: 0,
            });
            cursor = end;
        }
        let reuse_min = config
            .reuse_min_blocks
            .unwrap_or(BlockCount((config.threshold_blocks.0 / 2).max(1)));
        if reuse_min.0 == 0 {
            return Err(Error::Config("reuse_min_blocks must be at least 1".into()));
        }
        let mut by_extent_size: Vec<usize> = (0..sections.len()).collect();
        by_extent_size.sort_by_key(|&i| sections[i].s());
        Ok(Self {
            config,
            sections,
            by_extent_size,
            reuse_min,
            live: LiveSet::default(),
            tick: 0,
            resident_order: VecDeque::new(),
        })
    }

    pub fn config(&self) -> &ReHyparConfig {
        &self.config
    }

    /// The whole extent holding block `addr`, and whether it is still open: resident and
    /// in a reuse list, so that later allocations may land in it. `None` for a block of a
    /// clean extent or outside every section. A caller that fills extents in memory writes
    /// one out once it is no longer open (the paper: "after either the entire chunks of
    /// extents are filled with data or the time for which extents are allowed to stay at
    /// memory for reuse is expired").
    pub fn extent_at(&self, addr: BlockAddr) -> Option<(Extent, bool)> {
        let sid = self.section_of(addr)?;
        let sec = &self.sections[sid];
        let x = ((addr.0 - sec.info.base.0) / sec.s()) as u32;
        match sec.states[x as usize] {
            ExtentState::Clean => None,
            ExtentState::Resident(r) => Some((
                Extent::new(sec.extent_addr(x), BlockCount(sec.s())),
                r.listed.is_some(),
            )),
        }
    }

    /// Seals the extent holding `addr` now: its reuse window ended by the caller's clock
    /// (the paper's time in memory, where `reuse_window_allocs` counts allocations). It
    /// leaves its reuse list, its remainder is given up until the extent is wholly free,
    /// and it is never listed again. True when it was open.
    pub fn seal(&mut self, addr: BlockAddr) -> bool {
        let Some(sid) = self.section_of(addr) else {
            return false;
        };
        let sec = &mut self.sections[sid];
        let x = ((addr.0 - sec.info.base.0) / sec.s()) as u32;
        let ExtentState::Resident(r) = sec.states[x as usize] else {
            return false;
        };
        if let Some(pos) = r.listed {
            sec.unlink(x, pos);
        }
        sec.states[x as usize] = ExtentState::Resident(Resident {
            listed: None,
            sealed: true,
            ..r
        });
        r.listed.is_some()
    }

    pub fn sections(&self) -> Vec<SectionInfo> {
        self.sections.iter().map(|s| s.info).collect()
    }

    /// The reuse lists of section `section` in key order, each in list order.
    pub fn reuse_lists(&self, section: usize) -> Vec<(ChunkPos, Vec<ListedExtent>)> {
        let Some(sec) = self.sections.get(section) else {
            return Vec::new();
        };
        sec.lists
            .iter()
            .map(|(pos, list)| {
                let entries = list
                    .iter()
                    .map(|e| ListedExtent {
                        extent: e.extent,
                        next_free: BlockAddr(sec.extent_addr(e.extent.0).0 + sec.s() - e.unused.0),
                        unused: e.unused,
                    })
                    .collect();
                (*pos, entries)
            })
            .collect()
    }

    /// Sections to try for `len` blocks: first the one with the largest extent not longer
    /// than the request (so a file fills whole extents where it can and small files share
    /// small extents), or the smallest-extent section if the request is shorter than every
    /// extent; then the rest by ascending extent size when the first is full. The paper
    /// maps files to sections "according to their length, access pattern and usage"
    /// without a rule; this is the length part of it.
    fn section_order(&self, len: BlockCount) -> Vec<usize> {
        let first = self
            .by_extent_size
            .iter()
            .rev()
            .find(|&&i| self.sections[i].s() <= len.0)
            .or(self.by_extent_size.first())
            .copied();
        let mut order: Vec<usize> = first.into_iter().collect();
        order.extend(self.by_extent_size.iter().filter(|&&i| Some(i) != first));
        order
    }

    /// Seals extents whose reuse window ran out: they leave the lists and their remainder
    /// is given up (in the paper, such an extent is written to the SSD and not reopened).
    fn expire(&mut self) {
        let Some(window) = self.config.reuse_window_allocs else {
            return;
        };
        while let Some(&(since, sid, x)) = self.resident_order.front() {
            if self.tick - since <= window {
                break;
            }
            self.resident_order.pop_front();
            let sec = &mut self.sections[sid];
            if let ExtentState::Resident(r) = sec.states[x as usize] {
                if r.since_tick == since {
                    if let Some(pos) = r.listed {
                        sec.unlink(x, pos);
                    }
                    sec.states[x as usize] = ExtentState::Resident(Resident {
                        listed: None,
                        sealed: true,
                        ..r
                    });
                }
            }
        }
    }

    /// Step 10 of Algorithm 1: among the first extent of every reuse list, one whose unused
    /// space is at least `len`, with the smallest d / t: d = blocks between `hint` and the
    /// extent's next free block (0 without a hint), t = allocations since it became
    /// resident. Ties go to the longer-resident extent, then the lower address.
    fn choose_reuse(&self, sid: usize, len: BlockCount, hint: Option<BlockAddr>) -> Option<u32> {
        let sec = &self.sections[sid];
        let mut best: Option<(u128, u128, u32)> = None; // (d, t, extent)
        for list in sec.lists.values() {
            let Some(head) = list.first() else { continue };
            if head.unused < len {
                continue;
            }
            let x = head.extent.0;
            let ExtentState::Resident(r) = sec.states[x as usize] else {
                unreachable!("clean extent {x} in a reuse list");
            };
            let next_free = sec.extent_addr(x).plus(BlockCount(r.fill.0));
            let d = hint.map_or(0, |h| u128::from(h.distance_blocks(next_free).0));
            let t = u128::from((self.tick - r.since_tick).max(1));
            let better = match best {
                None => true,
                // d/t < bd/bt, cross-multiplied to stay in integers.
                Some((bd, bt, bx)) => {
                    let (l, r) = (d * bt, bd * t);
                    l < r || (l == r && (t > bt || (t == bt && x < bx)))
                }
            };
            if better {
                best = Some((d, t, x));
            }
        }
        best.map(|(_, _, x)| x)
    }

    /// After an allocation whose last block in extent `x` is `last`: MAP gives the new fill
    /// offset, and the extent rejoins the list of that chunk if enough is left.
    fn settle(&mut self, sid: usize, x: u32, last: BlockOffset) {
        let reuse_min = self.reuse_min;
        let window = self.config.reuse_window_allocs;
        let tick = self.tick;
        let sec = &mut self.sections[sid];
        let ExtentState::Resident(mut r) = sec.states[x as usize] else {
            unreachable!("settling clean extent {x}");
        };
        debug_assert!(r.listed.is_none(), "extent {x} settled while listed");
        let Some(outcome) = sec.info.geometry.map(last) else {
            unreachable!("last block {} outside extent {x}", last.0);
        };
        match outcome {
            MapOutcome::Full { .. } => r.fill = BlockOffset(sec.s()),
            MapOutcome::Next { next, .. } => {
                r.fill = next.start;
                let unused = BlockCount(sec.s() - next.start.0);
                if unused >= reuse_min && window_open(window, r.since_tick, tick) {
                    sec.link(x, next.pos(), unused);
                    r.listed = Some(next.pos());
                }
            }
        }
        sec.states[x as usize] = ExtentState::Resident(r);
    }

    /// Tries to place `len` blocks in section `sid`.
    fn place_in(
        &mut self,
        sid: usize,
        len: BlockCount,
        hint: Option<BlockAddr>,
    ) -> Option<(Extent, Placement)> {
        let s = self.sections[sid].s();
        let near = hint.map(|h| {
            let info = self.sections[sid].info;
            let rel = h.0.saturating_sub(info.base.0) / s;
            rel.min(u64::from(info.extents) - 1) as u32
        });
        if len.0 < s {
            if let Some(x) = self.choose_reuse(sid, len, hint) {
                let sec = &mut self.sections[sid];
                let ExtentState::Resident(mut r) = sec.states[x as usize] else {
                    unreachable!("clean extent {x} chosen for reuse");
                };
                if let Some(pos) = r.listed.take() {
                    sec.unlink(x, pos);
                }
                let start = r.fill;
                r.live_allocs += 1;
                r.live_blocks += len.0;
                sec.states[x as usize] = ExtentState::Resident(r);
                let extent = Extent::new(sec.extent_addr(x).plus(BlockCount(start.0)), len);
                self.settle(sid, x, BlockOffset(start.0 + len.0 - 1));
                return Some((extent, Placement::Reused));
            }
        }
        // Steps 1-2 of Algorithm 1 (and the fallback of the small-file path): clean extents,
        // the last of which may keep a reusable remainder.
        let m = len.0.div_ceil(s);
        let first = if m == 1 {
            self.sections[sid].clean_near(near)?
        } else {
            first_run(&self.sections[sid].clean, m, near.unwrap_or(0))?
        };
        let tick = self.tick;
        let window = self.config.reuse_window_allocs.is_some();
        let sec = &mut self.sections[sid];
        for k in 0..m {
            let x = first + k as u32;
            let taken = sec.clean.remove(&x);
            debug_assert!(taken, "extent {x} of a clean run was not clean");
            let blocks = (len.0 - k * s).min(s);
            sec.states[x as usize] = ExtentState::Resident(Resident {
                fill: BlockOffset(blocks),
                live_allocs: 1,
                live_blocks: blocks,
                since_tick: tick,
                listed: None,
                sealed: false,
            });
            if window {
                self.resident_order.push_back((tick, sid, x));
            }
        }
        let extent = Extent::new(sec.extent_addr(first), len);
        let last_x = first + (m - 1) as u32;
        let last_blocks = len.0 - (m - 1) * s;
        self.settle(sid, last_x, BlockOffset(last_blocks - 1));
        Some((extent, Placement::Fresh))
    }

    fn section_of(&self, addr: BlockAddr) -> Option<usize> {
        self.sections
            .iter()
            .position(|s| s.info.base <= addr && addr < s.end())
    }
}

/// Whether an extent resident since `since` may still be reused at `tick`.
fn window_open(window: Option<u64>, since: u64, tick: u64) -> bool {
    match window {
        Some(w) => tick - since <= w,
        None => true,
    }
}

impl SpaceAllocator for ReHypar {
    fn name(&self) -> String {
        let sizes: Vec<String> = self.sections.iter().map(|s| format!("{}", s.s())).collect();
        let free = match self.config.free_policy {
            FreePolicy::WholeExtent => "whole-extent",
            FreePolicy::RewindToLastLive => "rewind",
        };
        let window = self
            .config
            .reuse_window_allocs
            .map_or(String::new(), |w| format!(", window={w}"));
        format!(
            "rehypar(s={} blocks, v={}, reuse>={}{window}, free={free})",
            sizes.join("+"),
            self.config.threshold_blocks.0,
            self.reuse_min.0,
        )
    }

    fn place(&mut self, len: BlockCount, hint: Option<BlockAddr>) -> AllocOutcome {
        let largest = self
            .sections
            .iter()
            .map(|s| s.info.blocks().0)
            .max()
            .unwrap_or(0);
        if len.0 == 0 || len.0 > largest {
            return AllocOutcome::Invalid;
        }
        self.tick += 1;
        self.expire();
        for sid in self.section_order(len) {
            if let Some((extent, how)) = self.place_in(sid, len, hint) {
                self.live.insert(extent);
                return AllocOutcome::Placed { extent, how };
            }
        }
        AllocOutcome::NoSpace
    }

    fn free(&mut self, extent: Extent) -> Result<FreeOutcome, Error> {
        self.live.remove(extent)?;
        let Some(sid) = self.section_of(extent.start) else {
            unreachable!("live extent {extent} outside every section");
        };
        let window = self.config.reuse_window_allocs;
        let sec = &mut self.sections[sid];
        let s = sec.s();
        let a = extent.start.0 - sec.info.base.0;
        let z = extent.end().0 - sec.info.base.0;
        let mut reclaimed = 0u64;
        for x in a / s..z.div_ceil(s) {
            let blocks = z.min((x + 1) * s) - a.max(x * s);
            let x = x as u32;
            let ExtentState::Resident(mut r) = sec.states[x as usize] else {
                unreachable!("live extent {extent} covers clean extent {x}");
            };
            r.live_allocs -= 1;
            r.live_blocks -= blocks;
            if r.live_allocs == 0 {
                if let Some(pos) = r.listed {
                    sec.unlink(x, pos);
                }
                sec.states[x as usize] = ExtentState::Clean;
                sec.clean.insert(x);
                reclaimed += 1;
            } else {
                sec.states[x as usize] = ExtentState::Resident(r);
                if self.config.free_policy == FreePolicy::RewindToLastLive {
                    let listable = !r.sealed && window_open(window, r.since_tick, self.tick);
                    sec.rewind(x, &self.live, self.reuse_min, listable);
                }
            }
        }
        Ok(if reclaimed > 0 {
            FreeOutcome::UnitsReclaimed { units: reclaimed }
        } else {
            FreeOutcome::HeldUntilUnitEmpty
        })
    }

    fn stats(&self) -> SpaceStats {
        let mut st = SpaceStats {
            live_blocks: self.live.blocks(),
            live_allocs: self.live.len(),
            ..SpaceStats::default()
        };
        for sec in &self.sections {
            let s = sec.s();
            st.managed_blocks.0 += sec.info.blocks().0;
            st.free_blocks.0 += sec.clean.len() as u64 * s + sec.listed_unused_blocks;
            let head_max = sec
                .lists
                .values()
                .filter_map(|l| l.first())
                .map(|e| e.unused.0)
                .max()
                .unwrap_or(0);
            let largest = (longest_run(&sec.clean) * s).max(head_max);
            st.largest_free_blocks.0 = st.largest_free_blocks.0.max(largest);
        }
        st
    }

    fn check_invariants(&self) -> Result<(), Error> {
        let limit = self.sections.last().map_or(BlockAddr(0), |s| s.end());
        self.live.check(limit)?;
        for sid in 0..self.sections.len() {
            self.sections[sid].check(sid, &self.live, self.reuse_min)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    fn one_section(extent_blocks: u64, v: u64, extents: u64) -> ReHypar {
        ReHypar::new(ReHyparConfig {
            block_bytes: 1024,
            device_blocks: BlockCount(extent_blocks * extents),
            sections: vec![SectionSpec {
                extent_bytes: extent_blocks * 1024,
                weight: 1,
            }],
            threshold_blocks: BlockCount(v),
            reuse_min_blocks: None,
            reuse_window_allocs: None,
            flash_block_bytes: None,
            free_policy: FreePolicy::WholeExtent,
        })
        .unwrap()
    }

    #[test]
    fn paper_layout_splits_the_device_in_two_sections() {
        let r = ReHypar::new(ReHyparConfig::paper(BlockCount(1 << 20))).unwrap();
        let secs = r.sections();
        assert_eq!(secs.len(), 2);
        assert_eq!(secs[0].geometry.extent_blocks(), BlockCount(64));
        assert_eq!(secs[1].geometry.extent_blocks(), BlockCount(256));
        assert_eq!(secs[0].blocks().0 + secs[1].blocks().0, 1 << 20);
        assert_eq!(secs[1].base, BlockAddr(1 << 19));
    }

    #[test]
    fn flash_alignment_grows_extents_and_aligns_sections() {
        let mut c = ReHyparConfig::paper(BlockCount(10_000));
        c.flash_block_bytes = Some(128 << 10);
        let r = ReHypar::new(c).unwrap();
        let secs = r.sections();
        assert_eq!(secs[0].geometry.extent_blocks(), BlockCount(128));
        assert_eq!(secs[1].geometry.extent_blocks(), BlockCount(256));
        for s in &secs {
            assert_eq!(s.base.0 % 128, 0);
        }
        let mut bad = ReHyparConfig::paper(BlockCount(10_000));
        bad.flash_block_bytes = Some(3 << 10);
        assert!(matches!(ReHypar::new(bad), Err(Error::Config(_))));
    }

    #[test]
    fn small_files_share_an_extent_at_chunk_boundaries() {
        let mut r = one_section(64, 8, 4);
        // 5 blocks: last block 4 is in c_0^2 [4, 8), a leaf; the next file starts at 8.
        let a = r.allocate(BlockCount(5), None).unwrap();
        assert_eq!(a, Extent::new(BlockAddr(0), BlockCount(5)));
        let b = r.allocate(BlockCount(7), None).unwrap();
        assert_eq!(b.start, BlockAddr(8));
        // Last block 14: c_0^3 [8, 16) is partitioned (8 >= v), 14 is in c_1^2 [12, 16).
        let c = r.allocate(BlockCount(1), None).unwrap();
        assert_eq!(c.start, BlockAddr(16));
        r.check_invariants().unwrap();
        let st = r.stats();
        assert_eq!(st.live_blocks, BlockCount(13));
        // Held: blocks 0..17 of the first extent (16 is a one-block head, 17 is next).
        assert_eq!(st.held_blocks(), BlockCount(17));
    }

    #[test]
    fn freeing_the_last_allocation_of_an_extent_cleans_it() {
        let mut r = one_section(64, 8, 2);
        let a = r.allocate(BlockCount(5), None).unwrap();
        let b = r.allocate(BlockCount(5), None).unwrap();
        assert_eq!(r.free(a), Ok(FreeOutcome::HeldUntilUnitEmpty));
        assert_eq!(
            r.free(a),
            Err(Error::NotAllocated {
                start: a.start,
                len: a.len
            })
        );
        assert_eq!(r.free(b), Ok(FreeOutcome::UnitsReclaimed { units: 1 }));
        let st = r.stats();
        assert_eq!(st.free_blocks, st.managed_blocks);
        assert!(r.reuse_lists(0).is_empty());
        r.check_invariants().unwrap();
    }

    #[test]
    fn rewinding_makes_a_freed_tail_reusable() {
        let mut c = one_section(64, 8, 2).config().clone();
        c.free_policy = FreePolicy::RewindToLastLive;
        let mut r = ReHypar::new(c).unwrap();
        let a = r.allocate(BlockCount(5), None).unwrap(); // [0, 5), next chunk at 8
        let b = r.allocate(BlockCount(7), None).unwrap(); // [8, 15), next chunk at 16
        let c = r.allocate(BlockCount(3), None).unwrap(); // [16, 19), next chunk at 20

        // Freeing b (not the last) changes nothing; freeing c then rewinds past both.
        r.free(b).unwrap();
        assert_eq!(r.reuse_lists(0)[0].1[0].next_free, BlockAddr(20));
        r.free(c).unwrap();
        assert_eq!(r.reuse_lists(0)[0].1[0].next_free, BlockAddr(8));
        assert_eq!(r.allocate(BlockCount(9), None).unwrap().start, BlockAddr(8));
        r.check_invariants().unwrap();
        assert_eq!(r.free(a), Ok(FreeOutcome::HeldUntilUnitEmpty));
    }

    #[test]
    fn large_files_take_whole_extents_and_list_the_last() {
        let mut r = one_section(64, 8, 8);
        let a = r.allocate(BlockCount(64 * 2 + 10), None).unwrap();
        assert_eq!(a, Extent::new(BlockAddr(0), BlockCount(138)));
        // Last block 9 of the third extent: c_0^3 [8, 16) -> c_1^0 [9, 10); next at 10.
        let lists = r.reuse_lists(0);
        assert_eq!(lists.len(), 1);
        assert_eq!(lists[0].1[0].next_free, BlockAddr(128 + 10));
        let b = r.allocate(BlockCount(3), None).unwrap();
        assert_eq!(b.start, BlockAddr(138));
        assert_eq!(r.free(a), Ok(FreeOutcome::UnitsReclaimed { units: 2 }));
        r.check_invariants().unwrap();
    }

    #[test]
    fn reuse_prefers_the_extent_near_the_hint() {
        let mut r = one_section(64, 8, 16);
        // Extent 0: blocks 0..3, next free chunk c_0^2 at 4 (60 unused).
        let _a = r.allocate(BlockCount(3), None).unwrap();
        // Extents 1..=11, the last holding 5 blocks: next free chunk c_0^3 at 8 (56 unused).
        let big = r.allocate(BlockCount(64 * 10 + 5), None).unwrap();
        assert_eq!(big.start, BlockAddr(64));
        assert_eq!(r.reuse_lists(0).len(), 2);
        // Extent 0 has waited longer, but extent 11 is next to the hint: d/t is 3/1
        // against 705/2.
        let c = r.allocate(BlockCount(2), Some(big.end())).unwrap();
        assert_eq!(c.start, BlockAddr(11 * 64 + 8));
        // Without a hint d = 0 for all, and the longest resident (extent 0) wins.
        let d = r.allocate(BlockCount(2), None).unwrap();
        assert_eq!(d.start, BlockAddr(4));
        r.free(big).unwrap();
        r.check_invariants().unwrap();
    }

    #[test]
    fn remainders_below_reuse_min_are_sealed() {
        let mut r = one_section(16, 8, 2);
        // 13 blocks: last block 12 in c_0^3 [8, 16) -> c_1^2 [12, 16); 0 left: full.
        r.allocate(BlockCount(13), None).unwrap();
        assert!(r.reuse_lists(0).is_empty());
        // 10 blocks (0..9): 9 is in c_1^0 [9, 10); next 10 = c_1^1, 6 left >= v/2: listed.
        r.allocate(BlockCount(10), None).unwrap();
        assert_eq!(r.reuse_lists(0)[0].1[0].unused, BlockCount(6));
        r.check_invariants().unwrap();
    }

    #[test]
    fn the_reuse_window_seals_old_extents() {
        let mut c = ReHyparConfig::paper(BlockCount(64 * 16));
        c.sections.truncate(1);
        c.reuse_window_allocs = Some(2);
        let mut r = ReHypar::new(c).unwrap();
        let a = r.allocate(BlockCount(3), None).unwrap();
        for _ in 0..3 {
            r.allocate(BlockCount(64), None).unwrap();
        }
        assert!(r.reuse_lists(0).is_empty(), "extent of {a} still listed");
        let b = r.allocate(BlockCount(3), None).unwrap();
        assert_ne!(b.start.0 / 64, a.start.0 / 64);
        r.check_invariants().unwrap();
    }

    /// A caller that holds extents in memory and writes each one out when it seals (the
    /// paper: when it is full or its time in memory expires) asks which extent a block is
    /// in and whether it is still open, and seals one itself when its clock says so.
    #[test]
    fn an_extent_is_open_until_it_is_full_or_sealed() {
        let mut r = one_section(64, 8, 4);
        let a = r.allocate(BlockCount(5), None).unwrap();
        let whole = Extent::new(BlockAddr(0), BlockCount(64));
        assert_eq!(r.extent_at(a.start), Some((whole, true)));
        assert!(r.seal(a.start));
        assert!(!r.seal(a.start), "sealing twice");
        assert_eq!(r.extent_at(a.start), Some((whole, false)));
        // The next small file goes to a clean extent, not into the sealed one.
        let b = r.allocate(BlockCount(5), None).unwrap();
        assert_eq!(b.start, BlockAddr(64));
        // A file that fills its extent leaves it closed at once.
        let c = r.allocate(BlockCount(64), None).unwrap();
        assert_eq!(r.extent_at(c.start).map(|(_, open)| open), Some(false));
        assert_eq!(r.extent_at(BlockAddr(3 * 64)), None, "a clean extent");
        r.check_invariants().unwrap();

        // Freeing the tail of a sealed extent does not reopen it, even with rewinding.
        let mut cfg = one_section(64, 8, 4).config().clone();
        cfg.free_policy = FreePolicy::RewindToLastLive;
        let mut r = ReHypar::new(cfg).unwrap();
        let a = r.allocate(BlockCount(5), None).unwrap();
        let b = r.allocate(BlockCount(5), None).unwrap();
        assert!(r.seal(b.start));
        r.free(b).unwrap();
        assert_eq!(r.extent_at(a.start).map(|(_, open)| open), Some(false));
        assert!(r.reuse_lists(0).is_empty());
        r.check_invariants().unwrap();
    }

    #[test]
    fn requests_that_can_never_fit_are_invalid() {
        let mut r = one_section(64, 8, 2);
        assert_eq!(r.place(BlockCount(0), None), AllocOutcome::Invalid);
        assert_eq!(r.place(BlockCount(129), None), AllocOutcome::Invalid);
        assert!(r.allocate(BlockCount(128), None).is_some());
        assert_eq!(r.place(BlockCount(1), None), AllocOutcome::NoSpace);
    }
}
