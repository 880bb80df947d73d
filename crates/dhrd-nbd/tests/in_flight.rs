//! How many durable writes of one connection reach the device at once, counted rather
//! than timed: a backing that holds every write at its door until as many as the client
//! sent are waiting there (or a liveness bound passes) records the high-water mark of
//! writes in flight. A client that keeps a queue of DEPTH writes must see DEPTH of them
//! at the device at once; anything that serialises them (too few threads per connection,
//! a lock held across the device write) shows up as a lower mark.
//!
//! The same tests assert what parallel execution must not change: every acknowledged
//! write is durable on the backing (SPEC C3) before its reply and after FLUSH; after a
//! backing I/O error among writes in flight, the export is read-only for good (C4), no
//! acknowledged write is lost, and RAM never differs from the backing.

mod common;

use common::*;
use dhrd_engine::{HybridObject, ObjectConfig};
use dhrd_io::{Durable, Extent, Fault, FaultKind, Persistence, SimBacking};
use dhrd_nbd::proto::*;
use dhrd_nbd::EngineTarget;
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: usize = 4 << 20;
const BLOCK: usize = 4096;
/// The deepest client queue the write benchmark uses (bench/nbd/writes.sh, fio QD 32).
const DEPTH: usize = 32;
/// How long the door waits for more writes before it lets everyone through. Only a
/// liveness bound: no assertion depends on it, a serialising server merely takes this
/// long to fail.
const DOOR_GIVES_UP_AFTER: Duration = Duration::from_secs(5);

#[derive(Default)]
struct DoorState {
    /// Writes the door waits for before it opens.
    want: usize,
    in_flight: usize,
    high_water: usize,
    /// Once set (enough writes arrived, or the liveness bound passed), writes go through.
    open: bool,
}

/// A backing whose durable writes wait at a door until `want` of them are in flight.
struct Door<D> {
    inner: D,
    st: Mutex<DoorState>,
    cv: Condvar,
}

impl<D: Durable> Door<D> {
    fn enter(&self) {
        let mut st = self.st.lock();
        st.in_flight += 1;
        st.high_water = st.high_water.max(st.in_flight);
        if st.in_flight >= st.want {
            st.open = true;
            self.cv.notify_all();
        }
        while !st.open {
            if self.cv.wait_for(&mut st, DOOR_GIVES_UP_AFTER).timed_out() {
                st.open = true;
                self.cv.notify_all();
            }
        }
    }

    fn leave(&self) {
        self.st.lock().in_flight -= 1;
    }

    fn high_water(&self) -> usize {
        self.st.lock().high_water
    }

    fn in_flight(&self) -> usize {
        self.st.lock().in_flight
    }

    /// Closes the door again until `want` writes wait at it; the high-water mark restarts.
    fn close_until(&self, want: usize) {
        let mut st = self.st.lock();
        *st = DoorState {
            want,
            ..DoorState::default()
        };
    }
}

impl<D: Durable> Durable for Door<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.enter();
        let r = self.inner.write_at(buf, offset);
        self.leave();
        r
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
    fn read_bulk_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_bulk_at(buf, offset)
    }
    fn drop_cache(&self, offset: u64, len: u64) {
        self.inner.drop_cache(offset, len)
    }
    fn is_zero_range(&self, offset: u64, len: u64) -> bool {
        self.inner.is_zero_range(offset, len)
    }
    fn extent_at(&self, offset: u64, max_len: u64) -> io::Result<Extent> {
        self.inner.extent_at(offset, max_len)
    }
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.zero_range(offset, len)
    }
    fn writes_are_durable(&self) -> bool {
        self.inner.writes_are_durable()
    }
    fn write_durably(&self, buf: &[u8], offset: u64) -> io::Result<Persistence> {
        self.enter();
        let r = self.inner.write_durably(buf, offset);
        self.leave();
        r
    }
    fn durable_write_block_bytes(&self) -> Option<u64> {
        self.inner.durable_write_block_bytes()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn reads_allowed(&self) -> io::Result<()> {
        self.inner.reads_allowed()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// A loaded `sync` export over a simulated disk whose aligned 4 KiB writes are durable in
/// one operation (O_DIRECT with RWF_DSYNC), behind a door that waits for `want` writes.
fn export(want: usize) -> (HybridObject<Arc<Door<SimBacking>>>, Arc<Door<SimBacking>>) {
    let sim = SimBacking::from_bytes(vec![0u8; SIZE], 7);
    sim.set_direct_dsync(Some(BLOCK as u64));
    let door = Arc::new(Door {
        inner: sim,
        st: Mutex::new(DoorState {
            want,
            ..DoorState::default()
        }),
        cv: Condvar::new(),
    });
    let obj = HybridObject::open(
        Arc::clone(&door),
        ObjectConfig {
            fixed_len: true,
            chunk_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("open: {e}"));
    assert!(obj.wait_loaded(Some(Duration::from_secs(20))));
    (obj, door)
}

/// Block `i`'s offset: every write its own block, spread over every chunk, so range locks
/// never make two of them wait for each other.
fn offset_of(i: usize) -> u64 {
    ((i * 37) % (SIZE / BLOCK) * BLOCK) as u64
}

/// Sends `n` writes back to back on one connection, then reads their `n` replies:
/// (handle, error) in the order they came.
fn pipelined_writes(c: &mut RawClient, n: usize, seed: u64) -> Vec<(u64, u32)> {
    for i in 0..n {
        c.request(0, CMD_WRITE, i as u64, offset_of(i), BLOCK as u32);
        c.send(&pattern(BLOCK, seed + i as u64));
    }
    (0..n)
        .map(|_| {
            let (err, h) = c.simple_reply().unwrap_or_else(|e| panic!("reply: {e}"));
            (h, err)
        })
        .collect()
}

/// Every write `i` of a queue of DEPTH (pattern `seed + i` at `offset_of(i)`) is on the
/// simulated device's durable image.
fn assert_queue_durable(door: &Door<SimBacking>, seed: u64) {
    let durable = door.inner.durable();
    for i in 0..DEPTH {
        let o = offset_of(i) as usize;
        assert!(
            durable[o..o + BLOCK] == pattern(BLOCK, seed + i as u64)[..],
            "acknowledged write {i} is not durable"
        );
    }
}

#[test]
fn a_full_queue_of_writes_from_one_connection_is_at_the_device_at_once() {
    let (obj, door) = export(DEPTH);
    let srv = TestServer::start(EngineTarget::new(obj.clone(), false));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    let replies = pipelined_writes(&mut c, DEPTH, 100);
    assert!(
        replies.iter().all(|&(_, err)| err == 0),
        "a write failed: {replies:?}"
    );
    assert_eq!(
        door.high_water(),
        DEPTH,
        "a client with {DEPTH} writes queued had at most {} of them at the device at once",
        door.high_water()
    );
    // C3: acknowledged means durable; a FLUSH after the replies changes nothing of that.
    assert_queue_durable(&door, 100);
    c.request(0, CMD_FLUSH, 999, 0, 0);
    assert_eq!(c.simple_reply().ok(), Some((0, 999)));
    // RAM holds what the backing holds.
    c.request(0, CMD_READ, 1000, 0, SIZE as u32);
    assert_eq!(c.simple_reply().ok(), Some((0, 1000)));
    let ram = c.read_n(SIZE).unwrap_or_default();
    assert!(ram == door.inner.durable(), "RAM and backing differ");
}

#[test]
fn a_backing_error_among_writes_in_flight_is_sticky_and_loses_no_acknowledged_write() {
    let (obj, door) = export(DEPTH);
    let srv = TestServer::start(EngineTarget::new(obj.clone(), false));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    // The eleventh device write from now, and every one after it, fails with EIO.
    let at = door.inner.stats().ops + 10;
    door.inner.inject(Fault {
        at_op: at,
        kind: FaultKind::Eio,
        persist: true,
        reads: false,
    });
    let replies = pipelined_writes(&mut c, DEPTH, 200);
    door.inner.clear_faults();
    let failed = replies.iter().filter(|&&(_, e)| e != 0).count();
    assert!(failed > 0, "no write failed: {replies:?}");
    assert!(
        door.high_water() == DEPTH,
        "the writes never reached the device together (high-water {})",
        door.high_water()
    );
    let durable = door.inner.durable();
    for &(h, err) in &replies {
        let o = offset_of(h as usize) as usize;
        if err == 0 {
            assert!(
                durable[o..o + BLOCK] == pattern(BLOCK, 200 + h)[..],
                "acknowledged write {h} is not durable"
            );
        } else {
            assert_eq!(err, EIO, "write {h}");
        }
    }
    // C4: sticky; nothing more is written.
    c.request(0, CMD_WRITE, 5000, 0, BLOCK as u32);
    c.send(&pattern(BLOCK, 1));
    let (err, h) = c.simple_reply().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h, 5000);
    assert_ne!(err, 0, "a write succeeded after a sticky backing failure");
    // Reads show exactly what was acknowledged: an acknowledged write's bytes, and the
    // old bytes (zeros) where a write failed. After a sticky failure the backing is no
    // longer the reference (a failed write may have left a torn prefix there, never
    // acknowledged), so RAM keeps serving the last acknowledged bytes: it may differ from
    // the backing only in the blocks of failed writes.
    c.request(0, CMD_READ, 5001, 0, SIZE as u32);
    assert_eq!(c.simple_reply().ok(), Some((0, 5001)));
    let seen = c.read_n(SIZE).unwrap_or_default();
    let mut want = vec![0u8; SIZE];
    for &(h, err) in &replies {
        let o = offset_of(h as usize) as usize;
        if err == 0 {
            want[o..o + BLOCK].copy_from_slice(&pattern(BLOCK, 200 + h));
        }
    }
    let differ = |a: &[u8], b: &[u8]| -> Vec<u64> {
        (0..SIZE / BLOCK)
            .filter(|i| a[i * BLOCK..(i + 1) * BLOCK] != b[i * BLOCK..(i + 1) * BLOCK])
            .map(|i| (i * BLOCK) as u64)
            .collect()
    };
    assert_eq!(
        differ(&seen, &want),
        Vec::<u64>::new(),
        "reads differ from what was acknowledged"
    );
    let failed_at: Vec<u64> = replies
        .iter()
        .filter(|&&(_, e)| e != 0)
        .map(|&(h, _)| offset_of(h as usize))
        .collect();
    for o in differ(&seen, &door.inner.volatile()) {
        assert!(
            failed_at.contains(&o),
            "RAM and backing differ at {o}, which no failed write touched"
        );
    }
    let (_c2, _, flags) = RawClient::handshake(&srv.sock);
    assert_ne!(flags & TFLAG_READ_ONLY, 0, "new connections are not told");
}

/// A client that has sent one write at a time for a while has its writes served without
/// waking a second thread (the connection is serial, `gate.rs`): the thread that read a
/// write executes it while the reader role stays vacant. When that client then fills a
/// queue while a write is still at the device, the queue must still reach the device at
/// once: the waiting thread takes the vacancy after its bound (or a thread just started
/// takes it sooner) and reading resumes in parallel. A gate that left the role vacant for
/// good would hold the queue behind the first write (and the door) and show a high-water
/// mark of 1.
#[test]
fn a_client_that_turns_from_one_write_at_a_time_to_a_full_queue_gets_the_queue_to_the_device() {
    const ONE_AT_A_TIME: usize = 64;
    let (obj, door) = export(1);
    let srv = TestServer::start(EngineTarget::new(obj.clone(), false));
    let (mut c, _, _) = RawClient::handshake(&srv.sock);
    for i in 0..ONE_AT_A_TIME {
        c.request(0, CMD_WRITE, i as u64, offset_of(i), BLOCK as u32);
        c.send(&pattern(BLOCK, 400 + i as u64));
        assert_eq!(c.simple_reply().ok(), Some((0, i as u64)), "write {i}");
    }
    let serial = srv.handle().stats();
    assert!(
        serial.quiet_handoffs > 0,
        "one write at a time never made the connection serial: {serial:?}"
    );
    door.close_until(DEPTH);
    // The first write of the queue alone, until it waits at the device: nothing else is
    // in the socket when it is read, so it leaves the reader role quietly.
    c.request(0, CMD_WRITE, 1000, offset_of(0), BLOCK as u32);
    c.send(&pattern(BLOCK, 1000));
    let since = Instant::now();
    while door.in_flight() == 0 {
        assert!(
            since.elapsed() < DOOR_GIVES_UP_AFTER,
            "the first write never came"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for i in 1..DEPTH {
        c.request(0, CMD_WRITE, 1000 + i as u64, offset_of(i), BLOCK as u32);
        c.send(&pattern(BLOCK, 1000 + i as u64));
    }
    let mut replies: Vec<(u64, u32)> = (0..DEPTH)
        .map(|_| {
            let (err, h) = c.simple_reply().unwrap_or_else(|e| panic!("reply: {e}"));
            (h, err)
        })
        .collect();
    replies.sort_unstable();
    let want: Vec<(u64, u32)> = (0..DEPTH).map(|i| (1000 + i as u64, 0)).collect();
    assert_eq!(replies, want);
    assert_eq!(
        door.high_water(),
        DEPTH,
        "after one write at a time, a queue of {DEPTH} had at most {} at the device at once",
        door.high_water()
    );
    // Who took the vacancy is not asserted: usually the waiting thread after its bound
    // (`takeovers`), but on a loaded machine a thread that comes to claim anew (one just
    // started) may get there first, which serves the queue as well (seen in a clean-clone
    // CI run, and in 9 and 10 of 60 runs beside three busy loops with the gate before and
    // after 3a5c0fc). The watcher's own takeover is `gate.rs`'s unit test.
    assert_queue_durable(&door, 1000);
}
