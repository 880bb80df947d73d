//! The tier SSD's on-device layout: header, slot table, slot data; and the upgrade of a
//! device made in the first format.
//!
//! Format 2 (written by this version): a header of [`HEADER_BYTES`] (magic, version, chunk
//! size, slots, lower size, checksum), two slot tables of [`ENTRY_BYTES`] per slot (lower
//! chunk, state, the parts of the slot that hold the chunk's bytes, a sequence number,
//! checksum), each starting on a page of its own, then the slots' data, each `chunk_bytes`
//! long. The header page also holds the pairing records (`pairing.rs`) from
//! [`crate::pairing::RECORD_OFFSET`].
//!
//! Why two tables: a slot's entry is rewritten while the slot is dirty (when a write adds
//! parts), and a failed or interrupted write may leave any prefix of its bytes. Each change
//! of a slot's entry goes to the copy that does not hold the newest one, with the next
//! sequence number; at open the valid copy with the higher number wins. A torn write thus
//! costs only the change it was making, which was not acknowledged, never the entry before
//! it (which may name acknowledged dirty data).
//!
//! Format 1 had entries of 16 bytes without parts (every named slot held its whole chunk).
//! A format-1 device is upgraded at open: its dirty chunks are copied to the lower tier and
//! synced there, then the device is formatted anew. A crash before the new header is
//! durable leaves either the old header (the upgrade runs again, copying the same bytes) or
//! none (formatting truncates first): no acknowledged write is lost either way.
//!
//! Invariants: a slot's newest entry is in copy `seq % 2`, and the other copy holds an older
//! one or garbage; an entry that fails its checksum is ignored, and a slot with no valid copy
//! is FREE.

use super::parts::{self, Parts, PARTS_BYTES};
use crate::fastdev::{fnv64, invalid, read_padded};
use dhrd_io::{read_full, Durable};
use std::io;

/// Bytes of the header; the slot table starts here.
pub const HEADER_BYTES: u64 = 4096;
/// Bytes of one slot-table entry.
pub const ENTRY_BYTES: u64 = 64;
/// Copies of the slot table.
pub const TABLE_COPIES: u64 = 2;
const MAGIC: &[u8; 8] = b"DHRDTC02";
const VERSION: u32 = 2;
const MAGIC_V1: &[u8; 8] = b"DHRDTC01";
const VERSION_V1: u32 = 1;
const ENTRY_BYTES_V1: u64 = 16;
/// Bytes of the header that its checksum covers.
const HEADER_SUMMED: usize = 36;
// The header and the two pairing records share the header page without overlapping.
const _: () = assert!(
    HEADER_SUMMED as u64 + 8 <= crate::pairing::RECORD_OFFSET
        && crate::pairing::RECORD_OFFSET + 2 * crate::pairing::RECORD_BYTES <= HEADER_BYTES
);

pub const SLOT_FREE: u8 = 0;
pub const SLOT_CLEAN: u8 = 1;
pub const SLOT_DIRTY: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub chunk_bytes: u64,
    pub slots: u64,
    pub lower_bytes: u64,
}

/// What `Geometry::decode` found at the start of a device.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// No header: a new or foreign device, formatted at open.
    Nothing,
    Current(Geometry),
    /// A format-1 device, upgraded at open.
    Format1(Geometry),
}

impl Geometry {
    fn data_offset_with(&self, entry_bytes: u64) -> u64 {
        (HEADER_BYTES + self.slots * entry_bytes).div_ceil(HEADER_BYTES) * HEADER_BYTES
    }

    /// Bytes of one copy of the slot table, whole pages.
    fn table_bytes(&self) -> u64 {
        (self.slots * ENTRY_BYTES).div_ceil(HEADER_BYTES) * HEADER_BYTES
    }

    /// Where copy `seq % 2` of slot `slot`'s entry lives.
    pub fn entry_offset(&self, slot: usize, seq: u64) -> u64 {
        HEADER_BYTES + (seq % TABLE_COPIES) * self.table_bytes() + slot as u64 * ENTRY_BYTES
    }

    pub fn data_offset(&self) -> u64 {
        HEADER_BYTES + TABLE_COPIES * self.table_bytes()
    }

    pub fn ssd_bytes(&self) -> u64 {
        self.data_offset() + self.slots * self.chunk_bytes
    }

    pub fn part_bytes(&self) -> u64 {
        parts::part_bytes(self.chunk_bytes)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_SUMMED + 8);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.chunk_bytes, self.slots, self.lower_bytes] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        let c = fnv64(&h);
        h.extend_from_slice(&c.to_le_bytes());
        h
    }

    pub fn decode(h: &[u8]) -> io::Result<Found> {
        if h.len() < HEADER_SUMMED + 8 {
            return Ok(Found::Nothing);
        }
        let current = match (&h[..8], u32_at(h, 8)) {
            (m, VERSION) if m == MAGIC => true,
            (m, VERSION_V1) if m == MAGIC_V1 => false,
            _ => return Ok(Found::Nothing),
        };
        if fnv64(&h[..HEADER_SUMMED]) != u64_at(h, HEADER_SUMMED) {
            return Err(invalid(
                "tier SSD: the header's checksum does not match (torn or foreign)".into(),
            ));
        }
        let g = Self {
            chunk_bytes: u64_at(h, 12),
            slots: u64_at(h, 20),
            lower_bytes: u64_at(h, 28),
        };
        Ok(if current {
            Found::Current(g)
        } else {
            Found::Format1(g)
        })
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[i..i + 4]);
    u32::from_le_bytes(x)
}

/// One slot-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub chunk: u64,
    pub state: u8,
    /// The parts of the slot that hold the chunk's bytes (empty when FREE).
    pub parts: Parts,
    /// Which change of the slot's entry this is: the higher valid copy wins.
    pub seq: u64,
}

impl Entry {
    /// An entry to write; `write_entry` gives it its sequence number.
    pub fn new(chunk: u64, state: u8, parts: Parts) -> Self {
        Self {
            chunk,
            state,
            parts,
            seq: 0,
        }
    }

    pub const FREE: Entry = Entry {
        chunk: 0,
        state: SLOT_FREE,
        parts: Parts::NONE,
        seq: 0,
    };
}

const ENTRY_PARTS_AT: usize = 16;
const ENTRY_SEQ_AT: usize = ENTRY_PARTS_AT + PARTS_BYTES;
const ENTRY_SUM_AT: usize = ENTRY_BYTES as usize - 8;

pub fn encode_entry(e: &Entry) -> [u8; ENTRY_BYTES as usize] {
    let mut b = [0u8; ENTRY_BYTES as usize];
    b[..8].copy_from_slice(&e.chunk.to_le_bytes());
    b[8] = e.state;
    b[ENTRY_PARTS_AT..ENTRY_PARTS_AT + PARTS_BYTES].copy_from_slice(&e.parts.to_bytes());
    b[ENTRY_SEQ_AT..ENTRY_SEQ_AT + 8].copy_from_slice(&e.seq.to_le_bytes());
    let c = fnv64(&b[..ENTRY_SUM_AT]);
    b[ENTRY_SUM_AT..].copy_from_slice(&c.to_le_bytes());
    b
}

/// `None` for an entry that fails its checksum.
pub fn decode_entry(b: &[u8]) -> Option<Entry> {
    if fnv64(&b[..ENTRY_SUM_AT]) != u64_at(b, ENTRY_SUM_AT) {
        return None;
    }
    let mut p = [0u8; PARTS_BYTES];
    p.copy_from_slice(&b[ENTRY_PARTS_AT..ENTRY_PARTS_AT + PARTS_BYTES]);
    Some(Entry {
        chunk: u64_at(b, 0),
        state: b[8],
        parts: Parts::from_bytes(&p),
        seq: u64_at(b, ENTRY_SEQ_AT),
    })
}

/// A format-1 entry: `(chunk, state)`, `None` when it fails its checksum.
fn decode_entry_v1(e: &[u8]) -> Option<(u64, u8)> {
    if (fnv64(&e[..9]) & 0xffff_ffff) as u32 != u32_at(e, 12) {
        return None;
    }
    Some((u64_at(e, 0), e[8]))
}

/// Reads both slot tables of a device in the current format and returns each slot's newest
/// valid entry ([`Entry::FREE`] with sequence 0 where neither copy is valid).
pub fn read_table<F: Durable>(ssd: &F, g: &Geometry) -> io::Result<Vec<Entry>> {
    let mut copies = Vec::new();
    for copy in 0..TABLE_COPIES {
        let mut table = vec![0u8; (g.slots * ENTRY_BYTES) as usize];
        read_padded(ssd, &mut table, g.entry_offset(0, copy))?;
        copies.push(table);
    }
    Ok((0..g.slots as usize)
        .map(|i| {
            let at = i * ENTRY_BYTES as usize..(i + 1) * ENTRY_BYTES as usize;
            copies
                .iter()
                .filter_map(|t| decode_entry(&t[at.clone()]))
                .max_by_key(|e| e.seq)
                .unwrap_or(Entry::FREE)
        })
        .collect())
}

/// Copies the dirty chunks of a format-1 device `g` to `lower` and syncs it; returns how
/// many. Afterwards the device holds nothing the lower tier lacks and may be formatted.
pub fn write_back_format1<F: Durable, S: Durable>(
    ssd: &F,
    lower: &S,
    g: &Geometry,
) -> io::Result<u64> {
    let mut table = vec![0u8; (g.slots * ENTRY_BYTES_V1) as usize];
    let got = read_full(ssd, &mut table, HEADER_BYTES)?;
    table.truncate(got);
    let chunks = g.lower_bytes.div_ceil(g.chunk_bytes);
    let mut copied = 0;
    let mut buf = Vec::new();
    for (slot, e) in table.chunks_exact(ENTRY_BYTES_V1 as usize).enumerate() {
        let Some((chunk, SLOT_DIRTY)) = decode_entry_v1(e) else {
            continue;
        };
        if chunk >= chunks {
            continue;
        }
        let start = chunk * g.chunk_bytes;
        let len = g.chunk_bytes.min(g.lower_bytes - start);
        buf.resize(len as usize, 0);
        let at = g.data_offset_with(ENTRY_BYTES_V1) + slot as u64 * g.chunk_bytes;
        let n = read_full(ssd, &mut buf, at)?;
        if n < buf.len() {
            return Err(invalid(format!(
                "tier SSD (format 1): slot {slot} of dirty chunk {chunk} is cut short at {n} bytes"
            )));
        }
        lower.write_at(&buf, start)?;
        copied += 1;
    }
    lower.sync()?;
    Ok(copied)
}

/// A format-1 device in `ssd` for tests: header, `entries` as `(slot, chunk, state)` and
/// their slots' data from `data(chunk)`.
#[cfg(test)]
pub fn make_format1<F: Durable>(
    ssd: &F,
    g: &Geometry,
    entries: &[(u64, u64, u8)],
    data: impl Fn(u64) -> Vec<u8>,
) -> io::Result<()> {
    let mut h = Vec::new();
    h.extend_from_slice(MAGIC_V1);
    h.extend_from_slice(&VERSION_V1.to_le_bytes());
    for v in [g.chunk_bytes, g.slots, g.lower_bytes] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    let c = fnv64(&h);
    h.extend_from_slice(&c.to_le_bytes());
    ssd.set_len(g.data_offset_with(ENTRY_BYTES_V1) + g.slots * g.chunk_bytes)?;
    ssd.write_at(&h, 0)?;
    for &(slot, chunk, state) in entries {
        let mut e = [0u8; ENTRY_BYTES_V1 as usize];
        e[..8].copy_from_slice(&chunk.to_le_bytes());
        e[8] = state;
        let c = (fnv64(&e[..9]) & 0xffff_ffff) as u32;
        e[12..16].copy_from_slice(&c.to_le_bytes());
        ssd.write_at(&e, HEADER_BYTES + slot * ENTRY_BYTES_V1)?;
        let at = g.data_offset_with(ENTRY_BYTES_V1) + slot * g.chunk_bytes;
        ssd.write_at(&data(chunk), at)?;
    }
    ssd.sync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_a_flipped_bit_reads_as_torn() {
        let e = Entry {
            chunk: 0x1234_5678_9abc,
            state: SLOT_DIRTY,
            parts: Parts::range(3, 9).union(Parts::range(250, 256)),
            seq: 77,
        };
        let mut b = encode_entry(&e);
        assert_eq!(decode_entry(&b), Some(e));
        b[20] ^= 1;
        assert_eq!(decode_entry(&b), None);
    }

    #[test]
    fn headers_of_both_formats_are_told_apart() -> io::Result<()> {
        let g = Geometry {
            chunk_bytes: 4096,
            slots: 7,
            lower_bytes: 1 << 20,
        };
        assert_eq!(Geometry::decode(&g.encode())?, Found::Current(g));
        let mut v1 = g.encode();
        v1[..8].copy_from_slice(MAGIC_V1);
        v1[8..12].copy_from_slice(&VERSION_V1.to_le_bytes());
        let c = fnv64(&v1[..HEADER_SUMMED]);
        v1[HEADER_SUMMED..].copy_from_slice(&c.to_le_bytes());
        assert_eq!(Geometry::decode(&v1)?, Found::Format1(g));
        let mut torn = g.encode();
        torn[14] ^= 1;
        assert!(Geometry::decode(&torn).is_err());
        assert_eq!(Geometry::decode(&[0u8; 64])?, Found::Nothing);
        Ok(())
    }
}
