//! Dropping values whose drop may block, on background threads.
//!
//! Why: closing the last descriptor or unmapping the last mapping of a deleted file
//! frees its inode, and a file system may do that synchronously: ext4 commits its journal
//! before it returns when the inode carries the sync flag, which is how the mount's
//! `sync` mode makes passthrough writes durable (2-3 ms on a journalled ext4 here). Done
//! on a request thread, under a lock, that commit held every other request behind it.
//! What is dropped here is already durable where it matters (the unlink was made durable
//! by its own sync; a crash before the inode is freed leaves an orphan that the file
//! system frees at its next mount).
//!
//! Invariants:
//! - Every value handed over is dropped exactly once: by a reaper thread, or at once on
//!   the caller's thread when `REAP_QUEUE_MAX` values are already waiting (the caller then
//!   pays, as it would without a reaper: the queue stays bounded).
//! - Several threads drop at once, so the synchronous commits of concurrent drops share
//!   journal commits instead of queueing one behind the other.
//! - When the last handle goes, the threads drop what is queued, then exit.
//!
//! Crash semantics: none of its own; see the callers.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

/// Threads that drop values.
pub const REAPER_THREADS: usize = 4;
/// Values waiting at most; beyond, the caller drops its value itself.
pub const REAP_QUEUE_MAX: usize = 4096;

type Item = Box<dyn Send>;

struct Inner {
    q: Mutex<(VecDeque<Item>, bool)>,
    cv: Condvar,
}

/// A handle on the reaper threads; clones share them. The threads exit once every handle
/// is gone and the queue is empty.
#[derive(Clone)]
pub struct Reaper {
    inner: Arc<Inner>,
    _stop: Arc<Stop>,
}

/// Tells the threads to finish when the last `Reaper` handle is dropped.
struct Stop(Arc<Inner>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.q.lock().1 = true;
        self.0.cv.notify_all();
    }
}

impl Reaper {
    /// Starts `threads` threads named `<name>-<i>`.
    pub fn new(threads: usize, name: &str) -> io::Result<Self> {
        let inner = Arc::new(Inner {
            q: Mutex::new((VecDeque::new(), false)),
            cv: Condvar::new(),
        });
        for i in 0..threads.max(1) {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || run(&inner))?;
        }
        Ok(Self {
            _stop: Arc::new(Stop(inner.clone())),
            inner,
        })
    }

    /// Drops `v` on a reaper thread (or here, if the queue is full).
    pub fn drop_later<T: Send + 'static>(&self, v: T) {
        let mut q = self.inner.q.lock();
        if q.0.len() >= REAP_QUEUE_MAX {
            drop(q);
            drop(v);
            return;
        }
        q.0.push_back(Box::new(v));
        drop(q);
        self.inner.cv.notify_one();
    }

    /// Runs `f` on a reaper thread (or here, if the queue is full): work that may block
    /// (a file's writeback) and that no request waits for.
    pub fn run_later<F: FnOnce() + Send + 'static>(&self, f: F) {
        self.drop_later(RunOnDrop(Some(f)));
    }

    /// Values waiting now.
    pub fn pending(&self) -> usize {
        self.inner.q.lock().0.len()
    }
}

/// Runs its function when dropped (`Reaper::run_later`).
struct RunOnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for RunOnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("pending", &self.pending())
            .finish()
    }
}

fn run(inner: &Inner) {
    loop {
        let item = {
            let mut q = inner.q.lock();
            loop {
                if let Some(v) = q.0.pop_front() {
                    break v;
                }
                if q.1 {
                    return;
                }
                inner.cv.wait(&mut q);
            }
        };
        drop(item);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Counts drops, and how many ran at once; fails (by never counting) if dropped on
    /// the thread that handed it over.
    struct Slow {
        dropped: Arc<AtomicUsize>,
        active: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        caller: std::thread::ThreadId,
    }
    impl Drop for Slow {
        fn drop(&mut self) {
            if std::thread::current().id() == self.caller {
                return;
            }
            let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            self.active.fetch_sub(1, Ordering::SeqCst);
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn values_are_dropped_off_the_caller_in_parallel_and_all_before_exit() {
        let (dropped, active, most) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let slow = || Slow {
            dropped: dropped.clone(),
            active: active.clone(),
            most: most.clone(),
            caller: std::thread::current().id(),
        };
        let wait_for = |n: usize| {
            let t = Instant::now();
            while dropped.load(Ordering::SeqCst) < n {
                assert!(t.elapsed() < Duration::from_secs(30), "values not dropped");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let r = Reaper::new(4, "test-reap").unwrap();
        for _ in 0..8 {
            r.drop_later(slow());
        }
        wait_for(8);
        assert!(most.load(Ordering::SeqCst) >= 2, "drops ran one at a time");
        // Queued values are still dropped after the last handle goes.
        let r2 = r.clone();
        drop(r);
        for _ in 0..3 {
            r2.drop_later(slow());
        }
        drop(r2);
        wait_for(11);
    }
}
