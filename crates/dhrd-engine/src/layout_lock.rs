//! The layout lock: a reader-writer lock over an object's RAM mapping and chunk table,
//! sharded so that readers on different CPUs touch different cache lines, with writer
//! intent.
//!
//! Why the intent: the sharded lock is built on the standard library's, which clears its
//! "writer waiting" mark as it wakes the writer; a reader that asks again at once, before
//! the woken writer runs, gets in first. A thread that takes zero-copy views back to back
//! could starve a resize (`set_len`, growing the mapping) for minutes on two CPUs. Here a
//! writer announces itself before it waits, and new readers wait for every announced
//! writer to have had its turn before they take the lock.
//!
//! Invariants:
//! - A reader never takes the lock while a writer has announced itself and not yet got
//!   the lock (readers that hold it already keep it; the writer waits for them).
//! - A thread that holds a read guard must not ask for another one: with a writer waiting
//!   it would wait for itself (as it would with the standard lock, which prefers writers).
//!
//! No crash semantics: memory only.

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct LayoutLock<T> {
    lock: ShardedLock<T>,
    /// Writers that asked for the lock and do not have it yet.
    intent: AtomicUsize,
    waiting: Mutex<()>,
    turn: Condvar,
}

impl<T> LayoutLock<T> {
    pub(crate) fn new(v: T) -> Self {
        Self {
            lock: ShardedLock::new(v),
            intent: AtomicUsize::new(0),
            waiting: Mutex::new(()),
            turn: Condvar::new(),
        }
    }

    /// Shared access, after every writer that asked before.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        held::enter(self.id(), "a thread asked twice for the layout lock shared");
        held::check_allowed();
        if self.intent.load(Ordering::Acquire) != 0 {
            let mut g = self.waiting.lock();
            while self.intent.load(Ordering::Acquire) != 0 {
                self.turn.wait(&mut g);
            }
        }
        // A poisoned lock only means a thread panicked holding it; the data is still
        // consistent under the engine's own invariants, which do not rely on unwinding.
        ReadGuard {
            g: self.lock.read().unwrap_or_else(|e| e.into_inner()),
            id: self.id(),
        }
    }

    /// Which lock this is, for the debug check of the second invariant.
    fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Exclusive access; readers arriving meanwhile wait.
    pub(crate) fn write(&self) -> ShardedLockWriteGuard<'_, T> {
        // A thread holding the lock shared would wait for itself.
        held::check_free(self.id());
        held::check_allowed();
        self.intent.fetch_add(1, Ordering::AcqRel);
        let g = self.lock.write().unwrap_or_else(|e| e.into_inner());
        self.intent.fetch_sub(1, Ordering::AcqRel);
        // Under the mutex: a reader checks the intent under it before it waits.
        let _w = self.waiting.lock();
        self.turn.notify_all();
        g
    }
}

/// Runs `f` with every layout lock forbidden to this thread (debug builds assert it): for
/// the loader, which calls into its targets while holding its queue lock and must find
/// no layout lock taken under it (the lock order of `loader.rs`).
pub(crate) fn forbidden<R>(f: impl FnOnce() -> R) -> R {
    held::forbid(true);
    let r = f();
    held::forbid(false);
    r
}

/// Shared access to the value; released on drop.
pub(crate) struct ReadGuard<'a, T> {
    g: ShardedLockReadGuard<'a, T>,
    id: usize,
}

impl<T> std::ops::Deref for ReadGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        held::leave(self.id);
    }
}

/// Debug builds remember, per thread, which layout locks it holds shared, and assert the
/// header's second invariant (no second read guard of one lock on one thread). A guard
/// stays on its thread: `ShardedLockReadGuard` is not `Send`.
#[cfg(debug_assertions)]
mod held {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
        static FORBIDDEN: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) fn forbid(on: bool) {
        FORBIDDEN.set(on);
    }

    pub(super) fn check_allowed() {
        assert!(
            !FORBIDDEN.get(),
            "a layout lock taken under the loader's queue lock"
        );
    }

    pub(super) fn enter(id: usize, what: &str) {
        HELD.with_borrow_mut(|h| {
            assert!(!h.contains(&id), "{what}");
            h.push(id);
        });
    }

    pub(super) fn check_free(id: usize) {
        HELD.with_borrow(|h| {
            assert!(
                !h.contains(&id),
                "the layout lock is held shared by this thread"
            );
        });
    }

    pub(super) fn leave(id: usize) {
        HELD.with_borrow_mut(|h| {
            let i = h.iter().position(|x| *x == id);
            assert!(i.is_some(), "a layout read guard left twice");
            if let Some(i) = i {
                h.swap_remove(i);
            }
        });
    }
}

#[cfg(not(debug_assertions))]
mod held {
    #[inline]
    pub(super) fn forbid(_: bool) {}
    #[inline]
    pub(super) fn check_allowed() {}
    #[inline]
    pub(super) fn enter(_: usize, _: &str) {}
    #[inline]
    pub(super) fn check_free(_: usize) {}
    #[inline]
    pub(super) fn leave(_: usize) {}
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    /// Once a writer has asked (it waits for a reader that holds the lock), a new reader
    /// waits for the writer instead of joining the holder: back-to-back readers cannot
    /// keep a writer out (the engine's `races` test takes views back to back).
    #[test]
    fn a_new_reader_waits_for_a_writer_that_asked_before_it() {
        let l = Arc::new(LayoutLock::new(0u64));
        let held = l.read();
        let writer = {
            let l = l.clone();
            std::thread::spawn(move || *l.write() = 1)
        };
        while l.intent.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        let got = Arc::new(AtomicBool::new(false));
        let reader = {
            let (l, got) = (l.clone(), got.clone());
            std::thread::spawn(move || {
                let v = *l.read();
                got.store(true, Ordering::Release);
                v
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !got.load(Ordering::Acquire),
            "a reader got in ahead of the writer"
        );
        drop(held);
        writer.join().unwrap();
        assert_eq!(
            reader.join().unwrap(),
            1,
            "the reader saw the writer's change"
        );
    }
}
