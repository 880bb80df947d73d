//! Cache mode (SPEC M1-M3): which chunks stay in RAM when the RAM budget is smaller than
//! the data, and which enter it after a miss.
//!
//! This is pure bookkeeping over chunk indices; the object (`object/evict.rs`) applies
//! its decisions under its locks, and the simulator ([`simulate`]) runs the very same code
//! over a trace, so the policy chosen by measurement is the one the engine runs.
//!
//! - **Admission** decides whether a read miss brings its chunk into RAM. M3 asks that a
//!   miss be served from the backing without polluting RAM: with [`Admission::SecondAccess`]
//!   a chunk enters only when it misses again while it is still in the miss history (a
//!   one-off read, or a scan, never does), or when it was evicted recently (the ghost).
//! - **Eviction** picks the chunk to drop when a load needs room. [`CachePolicy::Clock`]
//!   is the classic second-chance clock over the resident chunks. [`CachePolicy::S3Fifo`]
//!   (Yang et al., SOSP 2023) keeps a small FIFO for newcomers (a tenth of the resident
//!   chunks) and a main FIFO; a newcomer not hit again while in the small queue leaves
//!   (into the ghost), so one pass over cold data cannot flush the main queue.
//! - Hits are not seen here: the object sets an access counter per chunk (two bits,
//!   saturating at 3) with one relaxed store on its lock-free read path, and the policy
//!   reads and clears it through [`AccessBits`] when it looks for a victim. So a hit
//!   costs no lock.
//!
//! Invariants (under the owner's mutex): a chunk is in `entries` exactly when the owner
//! told `insert` and not yet `remove` or returned it from `victim`; each queue holds at most
//! one live record per chunk (records of chunks that moved or left are skipped by
//! sequence number and pruned when they outnumber the live ones); the miss history and
//! the ghost each hold at most their bound.
//!
//! Crash semantics: none; residency is volatile (RAM is never dirty in write-through).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::str::FromStr;

/// Saturation of the per-chunk access counter.
pub const ACCESS_COUNT_MAX: u8 = 3;
/// The small queue's share of the resident chunks in S3-FIFO (the paper's 10%).
pub const S3FIFO_SMALL_PERCENT: u64 = 10;
/// Most entries in the miss history and in the ghost, as a multiple of the chunks RAM
/// can hold (S3-FIFO sizes its ghost like the main queue; one multiple keeps a chunk's
/// second miss visible for about as long as a resident chunk would stay).
pub const HISTORY_PER_RESIDENT: u64 = 1;
/// Smallest miss history and ghost, so a tiny budget still recognises a second access.
pub const HISTORY_MIN: u64 = 64;

/// Which chunk leaves RAM when a load needs room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Never evict: RAM keeps whatever filled it first; the rest is served from the
    /// backing (the behaviour before cache mode; I11).
    Off,
    /// Second-chance clock.
    Clock,
    /// S3-FIFO: small and main FIFO queues with a ghost (scan resistant).
    #[default]
    S3Fifo,
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CachePolicy::Off => "off",
            CachePolicy::Clock => "clock",
            CachePolicy::S3Fifo => "s3fifo",
        })
    }
}

impl FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(CachePolicy::Off),
            "clock" => Ok(CachePolicy::Clock),
            "s3fifo" => Ok(CachePolicy::S3Fifo),
            _ => Err(format!("bad cache policy {s:?}: use off, clock or s3fifo")),
        }
    }
}

/// Whether a read miss brings its chunk into RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Every miss loads its chunk.
    Always,
    /// A chunk is loaded on its second miss within the history, or at once if it was
    /// evicted recently (M3: one-off reads bypass RAM).
    #[default]
    SecondAccess,
}

impl fmt::Display for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Admission::Always => "always",
            Admission::SecondAccess => "second",
        })
    }
}

impl FromStr for Admission {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Admission::Always),
            "second" => Ok(Admission::SecondAccess),
            _ => Err(format!("bad admission {s:?}: use always or second")),
        }
    }
}

/// Per-chunk access counters the policy reads when it looks for a victim.
pub trait AccessBits {
    /// The chunk's access count since it was inserted or last aged (0..=ACCESS_COUNT_MAX).
    fn count(&self, chunk: u64) -> u8;
    fn set_count(&self, chunk: u64, count: u8);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    queue: Queue,
    seq: u64,
}

/// A set with FIFO replacement: remembers the last `cap` chunks put in.
#[derive(Debug, Default)]
struct Recent {
    order: VecDeque<u64>,
    set: HashSet<u64>,
    cap: usize,
}

impl Recent {
    fn new(cap: usize) -> Self {
        Self {
            order: VecDeque::new(),
            set: HashSet::new(),
            cap: cap.max(1),
        }
    }

    fn contains(&self, c: u64) -> bool {
        self.set.contains(&c)
    }

    fn put(&mut self, c: u64) {
        if !self.set.insert(c) {
            return;
        }
        self.order.push_back(c);
        while self.set.len() > self.cap {
            match self.order.pop_front() {
                Some(old) => {
                    self.set.remove(&old);
                }
                None => break,
            }
        }
        // Taken-out entries leave stale records in `order`; bound them too.
        if self.order.len() > 2 * self.cap {
            let set = &self.set;
            let mut seen = HashSet::new();
            self.order.retain(|c| set.contains(c) && seen.insert(*c));
        }
        debug_assert!(
            self.set.len() <= self.cap && self.order.len() <= 2 * self.cap,
            "miss history or ghost over its bound"
        );
    }

    fn take(&mut self, c: u64) -> bool {
        self.set.remove(&c)
    }

    fn len(&self) -> usize {
        self.set.len()
    }
}

/// Residency bookkeeping of one object.
#[derive(Debug)]
pub struct Residency {
    policy: CachePolicy,
    admission: Admission,
    entries: HashMap<u64, Entry>,
    small: VecDeque<(u64, u64)>,
    main: VecDeque<(u64, u64)>,
    small_live: u64,
    next_seq: u64,
    /// Chunks that missed once and were not admitted (SecondAccess).
    missed: Recent,
    /// Chunks evicted recently.
    ghost: Recent,
}

/// What the admission check says about a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Load,
    /// Served from the backing only; remembered in the miss history.
    Bypass,
}

impl Residency {
    /// `resident_chunks_max`: about how many chunks RAM can hold (sizes the histories).
    pub fn new(policy: CachePolicy, admission: Admission, resident_chunks_max: u64) -> Self {
        let hist = (resident_chunks_max * HISTORY_PER_RESIDENT).max(HISTORY_MIN) as usize;
        Self {
            policy,
            admission,
            entries: HashMap::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_live: 0,
            next_seq: 0,
            missed: Recent::new(hist),
            ghost: Recent::new(hist),
        }
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    pub fn resident(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn contains(&self, c: u64) -> bool {
        self.entries.contains_key(&c)
    }

    /// A read missed chunk `c`: should it be loaded?
    pub fn on_miss(&mut self, c: u64) -> Admit {
        match self.admission {
            Admission::Always => Admit::Load,
            Admission::SecondAccess => {
                if self.ghost.contains(c) || self.missed.take(c) {
                    Admit::Load
                } else {
                    self.missed.put(c);
                    Admit::Bypass
                }
            }
        }
    }

    /// Chunk `c` became resident (loaded, read ahead, or written fresh).
    pub fn insert(&mut self, c: u64) {
        if self.entries.contains_key(&c) {
            return;
        }
        let queue = match self.policy {
            CachePolicy::S3Fifo if !self.ghost.take(c) => Queue::Small,
            _ => {
                self.ghost.take(c);
                Queue::Main
            }
        };
        self.missed.take(c);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(c, Entry { queue, seq });
        match queue {
            Queue::Small => {
                self.small.push_back((c, seq));
                self.small_live += 1;
            }
            Queue::Main => self.main.push_back((c, seq)),
        }
        self.prune();
        debug_assert!(
            self.small_live as usize <= self.entries.len(),
            "more live records in the small queue than resident chunks"
        );
    }

    /// Chunk `c` left RAM by another way than `victim` (invalidated, truncated).
    pub fn remove(&mut self, c: u64) {
        if let Some(e) = self.entries.remove(&c) {
            if e.queue == Queue::Small {
                debug_assert!(self.small_live > 0, "small queue count below its records");
                self.small_live -= 1;
            }
        }
    }

    /// Chooses a chunk to evict and forgets it (the caller evicts it, or calls `insert`
    /// again if it turns out not to be evictable). `None` when nothing is resident or the
    /// policy is `Off`.
    pub fn victim(&mut self, bits: &dyn AccessBits) -> Option<u64> {
        if self.policy == CachePolicy::Off {
            return None;
        }
        // Each resident chunk is passed over at most a few times (its counter drops on
        // each pass), so this terminates; the bound only guards against a broken counter.
        let mut rounds = 4 * (self.entries.len() as u64 + 1) * (ACCESS_COUNT_MAX as u64 + 1);
        while !self.entries.is_empty() && rounds > 0 {
            rounds -= 1;
            let from_small = self.policy == CachePolicy::S3Fifo
                && self.small_live > 0
                && (self.small_live * 100 >= self.entries.len() as u64 * S3FIFO_SMALL_PERCENT
                    || !self.has_live(Queue::Main));
            let (c, seq) = if from_small {
                self.small.pop_front()?
            } else {
                self.main.pop_front()?
            };
            let Some(e) = self.entries.get(&c).copied() else {
                continue;
            };
            if e.seq != seq {
                continue;
            }
            let n = bits.count(c);
            match (self.policy, e.queue) {
                (CachePolicy::S3Fifo, Queue::Small) => {
                    self.small_live -= 1;
                    if n > 0 {
                        // Hit while new: promote to the main queue.
                        bits.set_count(c, 0);
                        self.requeue(c, Queue::Main);
                    } else {
                        self.entries.remove(&c);
                        self.ghost.put(c);
                        return Some(c);
                    }
                }
                _ => {
                    if n > 0 {
                        // Second chance: age and go round again.
                        bits.set_count(
                            c,
                            if self.policy == CachePolicy::Clock {
                                0
                            } else {
                                n - 1
                            },
                        );
                        self.requeue(c, Queue::Main);
                    } else {
                        self.entries.remove(&c);
                        self.ghost.put(c);
                        return Some(c);
                    }
                }
            }
        }
        None
    }

    fn has_live(&self, q: Queue) -> bool {
        match q {
            Queue::Small => self.small_live > 0,
            Queue::Main => self.entries.len() as u64 > self.small_live,
        }
    }

    fn requeue(&mut self, c: u64, queue: Queue) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(c, Entry { queue, seq });
        match queue {
            Queue::Small => {
                self.small.push_back((c, seq));
                self.small_live += 1;
            }
            Queue::Main => self.main.push_back((c, seq)),
        }
    }

    /// Drops stale queue records once they outnumber the live ones.
    fn prune(&mut self) {
        let live = self.entries.len();
        if self.small.len() + self.main.len() <= 2 * live + 64 {
            return;
        }
        let entries = &self.entries;
        self.small
            .retain(|(c, s)| entries.get(c).is_some_and(|e| e.seq == *s));
        self.main
            .retain(|(c, s)| entries.get(c).is_some_and(|e| e.seq == *s));
    }

    /// Entries in the miss history and the ghost (for tests and status).
    pub fn history_len(&self) -> (usize, usize) {
        (self.missed.len(), self.ghost.len())
    }
}

/// Hits and misses of a policy over a trace of chunk indices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimResult {
    pub hits: u64,
    pub misses: u64,
    pub loads: u64,
    pub evictions: u64,
}

impl SimResult {
    pub fn hit_ratio(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

/// Plain counters for the simulator (a stand-in for the slots' access bits).
struct SimBits(std::cell::RefCell<HashMap<u64, u8>>);

impl AccessBits for SimBits {
    fn count(&self, c: u64) -> u8 {
        self.0.borrow().get(&c).copied().unwrap_or(0)
    }
    fn set_count(&self, c: u64, n: u8) {
        self.0.borrow_mut().insert(c, n);
    }
}

/// Runs `policy` with `admission` over `trace` with room for `capacity` chunks, as the
/// engine would with instant loads: a hit bumps the access counter; a miss asks for
/// admission and, when admitted, evicts until there is room and inserts.
pub fn simulate(
    trace: &[u64],
    policy: CachePolicy,
    admission: Admission,
    capacity: u64,
) -> SimResult {
    simulate_each(trace, policy, admission, capacity, |_, _| {})
}

/// [`simulate`], telling `seen` whether each access (by index) hit.
pub fn simulate_each(
    trace: &[u64],
    policy: CachePolicy,
    admission: Admission,
    capacity: u64,
    mut seen: impl FnMut(usize, bool),
) -> SimResult {
    let mut r = Residency::new(policy, admission, capacity);
    let bits = SimBits(std::cell::RefCell::new(HashMap::new()));
    let mut out = SimResult::default();
    for (i, &c) in trace.iter().enumerate() {
        if r.contains(c) {
            out.hits += 1;
            seen(i, true);
            let n = bits.count(c);
            if n < ACCESS_COUNT_MAX {
                bits.set_count(c, n + 1);
            }
            continue;
        }
        out.misses += 1;
        seen(i, false);
        if r.on_miss(c) == Admit::Bypass {
            continue;
        }
        if r.resident() >= capacity {
            match r.victim(&bits) {
                Some(v) => {
                    bits.set_count(v, 0);
                    out.evictions += 1;
                }
                None => continue, // Off: full for good
            }
        }
        bits.set_count(c, 0);
        r.insert(c);
        out.loads += 1;
    }
    out
}

/// Belady's offline optimum over `trace` with room for `capacity` chunks: the hits of
/// demand caching that always evicts the chunk used farthest in the future
/// (`bypass == false`), and of the variant that may also decline to cache the missed
/// chunk when it is the one used farthest (`bypass == true`, the optimum for a cache that
/// can bypass, as ours can).
pub fn belady_hits(trace: &[u64], capacity: u64, bypass: bool) -> u64 {
    use std::collections::BTreeSet;
    let n = trace.len();
    // next[i]: index of the next access to trace[i] after i (n = never).
    let mut next = vec![n; n];
    let mut last: HashMap<u64, usize> = HashMap::new();
    for i in (0..n).rev() {
        if let Some(&j) = trace.get(i).and_then(|c| last.get(c)) {
            next[i] = j;
        }
        if let Some(&c) = trace.get(i) {
            last.insert(c, i);
        }
    }
    // Resident chunks ordered by next use; ties (never used again) by chunk.
    let mut by_next: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut resident: HashMap<u64, usize> = HashMap::new();
    let mut hits = 0u64;
    for (i, &c) in trace.iter().enumerate() {
        let nu = next[i];
        if let Some(old) = resident.get(&c).copied() {
            hits += 1;
            by_next.remove(&(old, c));
            by_next.insert((nu, c));
            resident.insert(c, nu);
            continue;
        }
        if capacity == 0 {
            continue;
        }
        if resident.len() as u64 >= capacity {
            let Some(&(far, v)) = by_next.iter().next_back() else {
                continue;
            };
            if bypass && nu >= far {
                continue;
            }
            by_next.remove(&(far, v));
            resident.remove(&v);
        }
        by_next.insert((nu, c));
        resident.insert(c, nu);
    }
    hits
}

#[cfg(test)]
mod tests;
