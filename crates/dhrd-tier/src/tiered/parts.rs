//! Which parts of a cache slot hold its chunk's bytes.
//!
//! A slot is divided into at most [`PARTS_MAX`] equal parts of at least
//! [`PART_BYTES_MIN`]. A write to a chunk the SSD does not hold takes a slot and fills only
//! the parts it touches, so it never waits for the slow lower tier to read the rest of the
//! chunk (a 4 KiB write would otherwise cost a whole-chunk read of the disk first). A slot's
//! entry names the parts it holds; the others are read from the lower tier, whose bytes there
//! are current because every write to a cached chunk lands in its slot.
//!
//! Invariants: a [`Parts`] never names a part at or past the chunk's part count (callers
//! build it only with [`Parts::range`] and [`Parts::all`] of counts `<= PARTS_MAX`).

/// Parts per slot at most: the entry's bitmap has this many bits.
pub const PARTS_MAX: u64 = 256;
/// The smallest part: a sector, the unit a block device writes atomically.
pub const PART_BYTES_MIN: u64 = 512;
/// Bytes of the bitmap in a slot's entry.
pub const PARTS_BYTES: usize = (PARTS_MAX / 8) as usize;

const WORDS: usize = (PARTS_MAX / 64) as usize;

/// A set of part indices of one slot.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Parts([u64; WORDS]);

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.runs().map(|(a, b)| a..b))
            .finish()
    }
}

impl Parts {
    pub const NONE: Parts = Parts([0; WORDS]);

    /// Parts `first..end`.
    pub fn range(first: u64, end: u64) -> Self {
        assert!(
            first <= end && end <= PARTS_MAX,
            "parts {first}..{end} of at most {PARTS_MAX}"
        );
        let mut p = Self::NONE;
        for i in first..end {
            p.0[(i / 64) as usize] |= 1 << (i % 64);
        }
        p
    }

    /// Parts `0..n`: a whole chunk of `n` parts.
    pub fn all(n: u64) -> Self {
        Self::range(0, n)
    }

    pub fn union(self, o: Self) -> Self {
        Self(std::array::from_fn(|w| self.0[w] | o.0[w]))
    }

    /// The parts of `self` that `o` does not have.
    pub fn minus(self, o: Self) -> Self {
        Self(std::array::from_fn(|w| self.0[w] & !o.0[w]))
    }

    pub fn is_empty(self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    pub fn contains(self, i: u64) -> bool {
        i < PARTS_MAX && self.0[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Maximal runs of consecutive parts, as `(first, end)`, in order.
    pub fn runs(self) -> impl Iterator<Item = (u64, u64)> {
        let mut i = 0;
        std::iter::from_fn(move || {
            while i < PARTS_MAX && !self.contains(i) {
                i += 1;
            }
            if i == PARTS_MAX {
                return None;
            }
            let first = i;
            while i < PARTS_MAX && self.contains(i) {
                i += 1;
            }
            Some((first, i))
        })
    }

    pub fn to_bytes(self) -> [u8; PARTS_BYTES] {
        let mut b = [0u8; PARTS_BYTES];
        for (w, chunk) in self.0.iter().zip(b.chunks_mut(8)) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8; PARTS_BYTES]) -> Self {
        Self(std::array::from_fn(|w| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[w * 8..w * 8 + 8]);
            u64::from_le_bytes(x)
        }))
    }
}

/// The part size of slots of `chunk_bytes` (a power of two `>= PART_BYTES_MIN`).
pub fn part_bytes(chunk_bytes: u64) -> u64 {
    (chunk_bytes / PARTS_MAX).max(PART_BYTES_MIN)
}

/// The parts a write of chunk-relative bytes `a..b` touches, and the partly covered edge
/// pieces it leaves (chunk-relative byte ranges of touched parts outside `a..b`, at most two),
/// in a chunk of `chunk_len` bytes (shorter than a slot for the device's last chunk).
pub fn touched(part_bytes: u64, chunk_len: u64, a: u64, b: u64) -> (Parts, Vec<(u64, u64)>) {
    assert!(
        a < b && b <= chunk_len,
        "bytes {a}..{b} of a {chunk_len}-byte chunk"
    );
    let first = a / part_bytes;
    let end = b.div_ceil(part_bytes);
    let mut edges = Vec::new();
    let head = first * part_bytes;
    if head < a {
        edges.push((head, a));
    }
    let tail = (end * part_bytes).min(chunk_len);
    if b < tail {
        edges.push((b, tail));
    }
    (Parts::range(first, end), edges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_runs_and_bytes_round_trip() {
        let p = Parts::range(3, 70).union(Parts::range(200, 256));
        assert_eq!(p.runs().collect::<Vec<_>>(), vec![(3, 70), (200, 256)]);
        assert_eq!(Parts::from_bytes(&p.to_bytes()), p);
        assert!(p.contains(69) && !p.contains(70) && p.contains(255));
        assert_eq!(p.minus(Parts::range(0, 100)), Parts::range(200, 256));
        assert!(Parts::range(5, 9).minus(p).is_empty());
        assert!(Parts::NONE.is_empty() && Parts::all(0).is_empty());
        assert_eq!(Parts::all(PARTS_MAX).runs().count(), 1);
        assert_eq!(Parts::NONE.runs().count(), 0);
    }

    #[test]
    fn part_sizes() {
        assert_eq!(part_bytes(512), 512);
        assert_eq!(part_bytes(64 << 10), 512);
        assert_eq!(part_bytes(1 << 20), 4096);
        assert_eq!(part_bytes(4 << 20), 16 << 10);
    }

    #[test]
    fn touched_parts_and_edges() {
        // Aligned: no edge.
        assert_eq!(touched(512, 4096, 512, 1536), (Parts::range(1, 3), vec![]));
        // Inside one part: both edges.
        assert_eq!(
            touched(512, 4096, 600, 700),
            (Parts::range(1, 2), vec![(512, 600), (700, 1024)])
        );
        // A short last chunk: the last part ends at the chunk's end.
        assert_eq!(
            touched(512, 1000, 10, 1000),
            (Parts::range(0, 2), vec![(0, 10)])
        );
        assert_eq!(
            touched(512, 1000, 600, 900),
            (Parts::range(1, 2), vec![(512, 600), (900, 1000)])
        );
    }
}
