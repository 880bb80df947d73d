//! A device whose operations a test holds at chosen points, so that threads interleave as
//! the test says and not as the scheduler happens to; and a power switch shared by several
//! devices, so that a power cut takes their images at one instant.
//!
//! A [`Gates`] holds armed [`Point`]s. Every operation of a [`GatedDev`] passes its gates
//! before and after the inner operation; the first operation that matches an armed point
//! (thread name, operation, byte range, before or after), once its `skip` earlier matches
//! went by, is held until the test releases the gate. A gate holds one operation, once.
//!
//! Invariants: a held thread holds no lock of the wrapper (only whatever locks of the
//! layer above it held when it called the device); while the power is cut every operation
//! fails, and an image taken under the switch's write lock sees no operation
//! half-done.

use dhrd_io::Durable;
use parking_lot::{Condvar, Mutex, RwLock};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a test waits for a thread to reach a gate before it calls the run hung. Not a
/// timing assertion: a gate that is reached is reached within microseconds.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// What a device operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
    Sync,
}

/// Whether a gate holds an operation before it reaches the device or after it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    Before,
    After,
}

/// Which operation a gate holds.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    /// The calling thread's name starts with this ("" for any thread).
    pub thread: String,
    pub kind: Kind,
    /// The operation's bytes overlap this range (`None`: any; syncs have no bytes).
    pub range: Option<(u64, u64)>,
    pub when: When,
    /// Matching operations let through first.
    pub skip: u32,
}

impl Point {
    pub(crate) fn new(kind: Kind, when: When) -> Self {
        Self {
            thread: String::new(),
            kind,
            range: None,
            when,
            skip: 0,
        }
    }

    pub(crate) fn by(mut self, thread: &str) -> Self {
        self.thread = thread.into();
        self
    }

    pub(crate) fn bytes(mut self, start: u64, end: u64) -> Self {
        self.range = Some((start, end));
        self
    }

    pub(crate) fn skip(mut self, n: u32) -> Self {
        self.skip = n;
        self
    }

    fn matches(&self, kind: Kind, when: When, offset: u64, len: u64) -> bool {
        if self.kind != kind || self.when != when {
            return false;
        }
        let name = std::thread::current().name().unwrap_or("").to_string();
        if !name.starts_with(&self.thread) {
            return false;
        }
        match self.range {
            None => true,
            Some((a, b)) => kind != Kind::Sync && offset < b && a < offset + len.max(1),
        }
    }
}

/// An operation held at a gate.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub thread: String,
    pub kind: Kind,
    pub offset: u64,
    pub len: u64,
}

/// The number of an armed gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateId(u64);

struct Armed {
    id: GateId,
    point: Point,
    /// Matches still to let through.
    skip: u32,
    held: Option<Held>,
    released: bool,
}

#[derive(Default)]
struct State {
    armed: Vec<Armed>,
    next: u64,
}

/// The gates of one or more devices.
#[derive(Default)]
pub(crate) struct Gates {
    st: Mutex<State>,
    cv: Condvar,
}

impl Gates {
    pub(crate) fn arm(&self, point: Point) -> GateId {
        let mut st = self.st.lock();
        st.next += 1;
        let id = GateId(st.next);
        let skip = point.skip;
        st.armed.push(Armed {
            id,
            point,
            skip,
            held: None,
            released: false,
        });
        id
    }

    /// Waits until gate `id` holds an operation; panics after the hang guard.
    pub(crate) fn wait_held(&self, id: GateId) -> Held {
        let deadline = Instant::now() + HANG_GUARD;
        let mut st = self.st.lock();
        loop {
            match st.armed.iter().find(|a| a.id == id) {
                Some(Armed { held: Some(h), .. }) => return h.clone(),
                Some(_) => {}
                None => panic!("gate {id:?} was released before it held anything"),
            }
            assert!(
                !self.cv.wait_until(&mut st, deadline).timed_out(),
                "no operation reached gate {id:?}"
            );
        }
    }

    /// Waits until gate `id` holds an operation or `done()` says it never will (checked
    /// every millisecond, without the gates' lock: `done` may take the layer's locks, which
    /// a thread on its way to a gate may hold); the held operation, if any.
    pub(crate) fn wait_held_or(&self, id: GateId, done: impl Fn() -> bool) -> Option<Held> {
        let deadline = Instant::now() + HANG_GUARD;
        let held = |st: &State| {
            st.armed
                .iter()
                .find(|a| a.id == id)
                .and_then(|a| a.held.clone())
        };
        loop {
            if let Some(h) = held(&self.st.lock()) {
                return Some(h);
            }
            if done() {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "gate {id:?}: neither held nor done"
            );
            let mut st = self.st.lock();
            if held(&st).is_none() {
                self.cv.wait_for(&mut st, Duration::from_millis(1));
            }
        }
    }

    /// Lets the operation held at gate `id` go on, or disarms the gate if it held none.
    pub(crate) fn release(&self, id: GateId) {
        let mut st = self.st.lock();
        if let Some(i) = st.armed.iter().position(|a| a.id == id) {
            if st.armed[i].held.is_some() {
                st.armed[i].released = true;
            } else {
                st.armed.remove(i);
            }
        }
        self.cv.notify_all();
    }

    /// Releases every gate.
    pub(crate) fn release_all(&self) {
        let ids: Vec<GateId> = self.st.lock().armed.iter().map(|a| a.id).collect();
        for id in ids {
            self.release(id);
        }
    }

    /// Called by a device around each operation: holds it if an armed gate matches.
    fn pass(&self, kind: Kind, when: When, offset: u64, len: u64) {
        let mut st = self.st.lock();
        let Some(i) = st.armed.iter().position(|a| {
            a.held.is_none() && !a.released && a.point.matches(kind, when, offset, len)
        }) else {
            return;
        };
        if st.armed[i].skip > 0 {
            st.armed[i].skip -= 1;
            return;
        }
        let id = st.armed[i].id;
        st.armed[i].held = Some(Held {
            thread: std::thread::current().name().unwrap_or("").to_string(),
            kind,
            offset,
            len,
        });
        self.cv.notify_all();
        // Held until released; after the hang guard the operation goes on, so that a test
        // that failed before releasing it can still drop the device.
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            let a = st.armed.iter().position(|a| a.id == id);
            match a {
                Some(j) if st.armed[j].released || Instant::now() >= deadline => {
                    st.armed.remove(j);
                    break;
                }
                Some(_) => {
                    self.cv.wait_until(&mut st, deadline);
                }
                None => break,
            }
        }
        self.cv.notify_all();
    }
}

/// A power switch for several devices: cutting it waits for operations under way, then
/// every later operation fails.
pub(crate) struct Power {
    on: RwLock<bool>,
}

impl Default for Power {
    fn default() -> Self {
        Self {
            on: RwLock::new(true),
        }
    }
}

impl Power {
    /// Cuts the power and runs `image` (which takes the devices' crash images) while no
    /// device operation is under way.
    pub(crate) fn cut<T>(&self, image: impl FnOnce() -> T) -> T {
        let mut on = self.on.write();
        *on = false;
        image()
    }

    fn run<T>(&self, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let on = self.on.read();
        if !*on {
            return Err(io::Error::other("the power is cut"));
        }
        op()
    }
}

/// `inner` behind `gates` (and `power`).
pub(crate) struct GatedDev<D> {
    pub inner: D,
    pub gates: Arc<Gates>,
    pub power: Arc<Power>,
}

impl<D: Durable> GatedDev<D> {
    pub(crate) fn new(inner: D, gates: Arc<Gates>, power: Arc<Power>) -> Self {
        Self {
            inner,
            gates,
            power,
        }
    }

    fn op<T>(
        &self,
        kind: Kind,
        offset: u64,
        len: u64,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        self.gates.pass(kind, When::Before, offset, len);
        let r = self.power.run(f);
        self.gates.pass(kind, When::After, offset, len);
        r
    }
}

impl<D: Durable> Durable for GatedDev<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let len = buf.len() as u64;
        self.op(Kind::Read, offset, len, || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.op(Kind::Write, offset, buf.len() as u64, || {
            self.inner.write_at(buf, offset)
        })
    }
    fn sync(&self) -> io::Result<()> {
        self.op(Kind::Sync, 0, 0, || self.inner.sync())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.power.run(|| self.inner.set_len(len))
    }
    fn describe(&self) -> String {
        format!("gated {}", self.inner.describe())
    }
}
