//! Verification of replayed reads against a shadow of this run's writes, and the
//! ordering of overlapping requests that makes it exact at any queue depth (see the
//! invariants in the parent module's header).

use super::*;

pub(super) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The 8 bytes at the 8-aligned absolute offset `word` as written by request `writer`.
pub(super) fn pattern_word(writer: u64, word: u64) -> [u8; 8] {
    splitmix64(splitmix64(writer ^ PATTERN_SEED) ^ word).to_le_bytes()
}

/// Fills `buf` with what request `writer` writes at absolute offset `offset`.
pub fn fill_pattern(buf: &mut [u8], writer: u64, offset: u64) {
    let mut i = 0usize;
    let mut o = offset;
    while i < buf.len() {
        let word = o & !7;
        let bytes = pattern_word(writer, word);
        let k0 = (o - word) as usize;
        let n = (8 - k0).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&bytes[k0..k0 + n]);
        i += n;
        o += n as u64;
    }
}

/// Which request last wrote each byte range: disjoint `[start, end) -> writer` intervals.
#[derive(Debug, Default)]
pub struct WrittenMap {
    pub(super) ranges: BTreeMap<u64, (u64, u64)>,
}

impl WrittenMap {
    /// Intervals overlapping `[start, end)`, clipped to it, ascending: (start, end, writer).
    pub fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        // Disjoint intervals sorted by start are also sorted by end, so walking back from
        // the last one starting before `end` we can stop at the first that ends by `start`.
        let mut v: Vec<(u64, u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, w))| (s.max(start), e.min(end), w))
            .collect();
        v.reverse();
        v
    }

    /// Records that `writer` wrote `[start, end)`, replacing older writers there.
    pub fn insert(&mut self, start: u64, end: u64, writer: u64) {
        let old: Vec<(u64, u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, w))| (s, e, w))
            .collect();
        for (s, e, w) in old {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start, w));
            }
            if e > end {
                self.ranges.insert(end, (e, w));
            }
        }
        self.ranges.insert(start, (end, writer));
    }

    pub fn bytes(&self) -> u64 {
        self.ranges
            .values()
            .zip(self.ranges.keys())
            .map(|(&(e, _), &s)| e - s)
            .sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub request: usize,
    pub offset: u64,
    pub writer: u64,
    pub expected: u8,
    pub found: u8,
}

/// Checks `buf` (read at `offset`) against the writers recorded in `map`; returns the
/// first mismatching byte of each mismatching written interval, and the bytes checked.
pub fn check_read(
    map: &WrittenMap,
    buf: &[u8],
    offset: u64,
    request: usize,
) -> (Vec<Mismatch>, u64) {
    let mut out = Vec::new();
    let mut checked = 0u64;
    let mut expected = Vec::new();
    for (s, e, w) in map.overlapping(offset, offset + buf.len() as u64) {
        let got = &buf[(s - offset) as usize..(e - offset) as usize];
        expected.resize(got.len(), 0);
        fill_pattern(&mut expected, w, s);
        checked += got.len() as u64;
        if let Some(k) = got.iter().zip(&expected).position(|(a, b)| a != b) {
            out.push(Mismatch {
                request,
                offset: s + k as u64,
                writer: w,
                expected: expected[k],
                found: got[k],
            });
        }
    }
    (out, checked)
}

#[derive(Default)]
pub(super) struct Verifier {
    pub(super) map: Mutex<WrittenMap>,
    pub(super) mismatches: Mutex<Vec<Mismatch>>,
    pub(super) mismatch_count: AtomicU64,
    pub(super) checked_reads: AtomicU64,
    pub(super) checked_bytes: AtomicU64,
}

/// Ordered range locks: request `i` may run only when no earlier, still running request
/// overlaps it with a write on either side. Requests are registered strictly in trace
/// order (under the same lock that hands out indices), so "earlier and not registered"
/// cannot happen, and the lowest registered request never waits: no deadlock.
#[derive(Default)]
pub(super) struct RangeOrder {
    pub(super) state: Mutex<OrderState>,
    pub(super) cv: Condvar,
}

#[derive(Default)]
pub(super) struct OrderState {
    pub(super) next: usize,
    pub(super) in_flight: BTreeMap<usize, (u64, u64, bool)>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker that panicked cannot leave these structures half-updated in a way that
    // matters more than reporting the run, so keep going with the inner value.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RangeOrder {
    pub(super) fn entry(r: &Request) -> (u64, u64, bool) {
        (r.offset, r.offset + r.len, r.op == Op::Write)
    }

    /// Fast timing: hands out the next index and registers it atomically.
    pub(super) fn claim(&self, reqs: &[Request]) -> Option<usize> {
        let mut g = lock(&self.state);
        let i = g.next;
        let r = reqs.get(i)?;
        g.next += 1;
        g.in_flight.insert(i, Self::entry(r));
        Some(i)
    }

    /// Original timing: the single dispatcher registers requests in order.
    pub(super) fn register(&self, i: usize, r: &Request) {
        lock(&self.state).in_flight.insert(i, Self::entry(r));
    }

    pub(super) fn wait_clear(&self, i: usize, r: &Request) {
        let (s, e, w) = Self::entry(r);
        let mut g = lock(&self.state);
        while g
            .in_flight
            .range(..i)
            .any(|(_, &(s2, e2, w2))| s2 < e && s < e2 && (w || w2))
        {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(super) fn complete(&self, i: usize) {
        lock(&self.state).in_flight.remove(&i);
        self.cv.notify_all();
    }
}
