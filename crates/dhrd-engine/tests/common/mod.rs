//! Shared test helpers: a seeded workload generator, an oracle that knows, for every
//! byte, which values a crash may legally leave there, and a backing with slow reads.

#![allow(dead_code)]

use dhrd_engine::HybridObject;
use dhrd_io::{Durable, SimBacking, SplitMix64};
use parking_lot::Mutex;
use std::io;
use std::time::Duration;

/// A simulated backing whose reads take `delay` each and are counted while they run (the
/// loader's bulk reads too: they default to `read_at`).
pub struct SlowReads {
    inner: SimBacking,
    delay: Duration,
    /// Reads running now, and the most that ever ran at once.
    in_flight: Mutex<(usize, usize)>,
}

impl SlowReads {
    pub fn new(inner: SimBacking, delay: Duration) -> Self {
        Self {
            inner,
            delay,
            in_flight: Mutex::new((0, 0)),
        }
    }

    /// Reads running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().0
    }

    /// The most reads that ever ran at once.
    pub fn most_in_flight(&self) -> usize {
        self.in_flight.lock().1
    }
}

impl Durable for SlowReads {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        {
            let mut g = self.in_flight.lock();
            g.0 += 1;
            g.1 = g.1.max(g.0);
        }
        std::thread::sleep(self.delay);
        let r = self.inner.read_at(buf, offset);
        self.in_flight.lock().0 -= 1;
        r
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// One operation of a workload.
#[derive(Clone)]
pub enum Op {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    /// Zeroes keeping the backing allocated (`write_zeroes`).
    ZeroAlloc {
        offset: u64,
        len: u64,
    },
    SetLen(u64),
    Flush,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Write { offset, data } => write!(f, "Write({offset}, +{})", data.len()),
            Op::Zero { offset, len } => write!(f, "Zero({offset}, +{len})"),
            Op::ZeroAlloc { offset, len } => write!(f, "ZeroAlloc({offset}, +{len})"),
            Op::SetLen(l) => write!(f, "SetLen({l})"),
            Op::Flush => write!(f, "Flush"),
        }
    }
}

/// Performs `op` on the object.
pub fn apply<D: Durable>(o: &HybridObject<D>, op: &Op) -> dhrd_engine::Result<()> {
    match op {
        Op::Write { offset, data } => o.write_at(data, *offset),
        Op::Zero { offset, len } => o.zero_range(*offset, *len),
        Op::ZeroAlloc { offset, len } => o.write_zeroes(*offset, *len),
        Op::SetLen(l) => o.set_len(*l),
        Op::Flush => o.flush(),
    }
}

/// A deterministic mixed workload over an object of about `size` bytes with chunks of `cb`.
pub fn workload(seed: u64, n: usize, size: u64, cb: u64) -> Vec<Op> {
    let mut r = SplitMix64::new(seed);
    let mut ops = Vec::with_capacity(n);
    let mut len = size;
    for i in 0..n {
        let k = r.below(100);
        let op = if k < 65 {
            // Sizes from 1 byte to a few chunks, offsets anywhere incl. past the end.
            let l = match r.below(4) {
                0 => 1 + r.below(16),
                1 => 1 + r.below(cb),
                2 => cb,
                _ => 1 + r.below(3 * cb),
            };
            let off = if r.chance(1, 8) {
                len + r.below(cb)
            } else {
                r.below(len.max(1))
            };
            let mut data = vec![0u8; l as usize];
            r.fill(&mut data);
            // Make every write's bytes distinguishable from zeros and from other writes.
            for (j, b) in data.iter_mut().enumerate() {
                if *b == 0 {
                    *b = (i as u8).wrapping_add(j as u8) | 1;
                }
            }
            len = len.max(off + l);
            Op::Write { offset: off, data }
        } else if k < 75 {
            let off = r.below(len.max(1));
            Op::Zero {
                offset: off,
                len: 1 + r.below(2 * cb),
            }
        } else if k < 85 {
            let nl = r.below(size + size / 2);
            len = nl;
            Op::SetLen(nl)
        } else {
            Op::Flush
        };
        ops.push(op);
    }
    ops
}

/// Sequential model of the object's content.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub data: Vec<u8>,
}

impl Model {
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Write { offset, data } => {
                let end = *offset as usize + data.len();
                if self.data.len() < end {
                    self.data.resize(end, 0);
                }
                self.data[*offset as usize..end].copy_from_slice(data);
            }
            Op::Zero { offset, len } | Op::ZeroAlloc { offset, len } => {
                let s = (*offset as usize).min(self.data.len());
                let e = ((*offset + *len) as usize).min(self.data.len());
                self.data[s..e].fill(0);
            }
            Op::SetLen(l) => self.data.resize(*l as usize, 0),
            Op::Flush => {}
        }
    }
}

/// A set of byte values.
#[derive(Clone, Copy, Default)]
pub struct ByteSet([u64; 4]);

impl ByteSet {
    pub fn one(b: u8) -> Self {
        let mut s = Self::default();
        s.insert(b);
        s
    }
    pub fn insert(&mut self, b: u8) {
        self.0[(b >> 6) as usize] |= 1 << (b & 63);
    }
    pub fn contains(&self, b: u8) -> bool {
        self.0[(b >> 6) as usize] & (1 << (b & 63)) != 0
    }
    pub fn values(&self) -> Vec<u8> {
        (0..=255u8).filter(|b| self.contains(*b)).collect()
    }
}

/// Per-byte sets of values a crash may leave: the durable state plus anything written by
/// operations that were not yet durable.
pub struct CrashOracle {
    pub allowed: Vec<ByteSet>,
    pub len_min: u64,
    pub len_max: u64,
}

impl CrashOracle {
    /// `durable` is the content known durable; `uncertain` are the operations after it that
    /// may have reached the disk in whole, in part, or not at all.
    pub fn new(durable: &Model, uncertain: &[Op]) -> Self {
        let mut len_min = durable.data.len() as u64;
        let mut len_max = len_min;
        let mut cur = len_min;
        for op in uncertain {
            match op {
                Op::Write { offset, data } => {
                    cur = cur.max(offset + data.len() as u64);
                    len_max = len_max.max(cur);
                }
                Op::SetLen(l) => {
                    cur = *l;
                    len_min = len_min.min(*l);
                    len_max = len_max.max(*l);
                }
                _ => {}
            }
        }
        let mut allowed: Vec<ByteSet> = (0..len_max as usize)
            .map(|i| ByteSet::one(durable.data.get(i).copied().unwrap_or(0)))
            .collect();
        let mut shrunk_to = u64::MAX;
        for op in uncertain {
            match op {
                Op::Write { offset, data } => {
                    for (j, b) in data.iter().enumerate() {
                        allowed[*offset as usize + j].insert(*b);
                    }
                }
                Op::Zero { offset, len } | Op::ZeroAlloc { offset, len } => {
                    let e = ((offset + len) as usize).min(allowed.len());
                    for a in allowed.iter_mut().take(e).skip(*offset as usize) {
                        a.insert(0);
                    }
                }
                Op::SetLen(l) => shrunk_to = shrunk_to.min(*l),
                Op::Flush => {}
            }
        }
        // After a possible shrink, anything past it may have come back as zeros.
        for a in allowed.iter_mut().skip(shrunk_to.min(len_max) as usize) {
            a.insert(0);
        }
        Self {
            allowed,
            len_min,
            len_max,
        }
    }

    /// Describes the first violation, if any.
    pub fn check(&self, got: &[u8]) -> Result<(), String> {
        let l = got.len() as u64;
        if l < self.len_min || l > self.len_max {
            return Err(format!(
                "length {l} outside [{}, {}]",
                self.len_min, self.len_max
            ));
        }
        for (i, b) in got.iter().enumerate() {
            if !self.allowed[i].contains(*b) {
                return Err(format!(
                    "byte {i} is {b}, allowed {:?}",
                    self.allowed[i].values()
                ));
            }
        }
        Ok(())
    }
}

/// The simulation, crash and power-cut tests lean on the invariants the code checks with
/// `debug_assert!` on its hot paths, so they run only in a profile that keeps them (the
/// workspace's dev and test profiles say so in Cargo.toml; `--release` does not).
#[test]
#[allow(clippy::assertions_on_constants)] // the constant is the profile's: what is checked
fn debug_assertions_are_on() {
    assert!(
        cfg!(debug_assertions),
        "these tests need debug assertions: run them without --release"
    );
}
