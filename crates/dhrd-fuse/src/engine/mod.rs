//! The engine data path: each regular file is an engine `HybridObject` (a RAM copy in a
//! memfd, loaded in the background, written through to the backing file), kept in the
//! object cache of `objects.rs`. Every write goes through the daemon; reads go through the
//! daemon (`engine-direct`), the kernel's page cache of the mount (`engine-cached`), or the
//! kernel reading the memfd by passthrough (`engine-passthrough`, and `engine-auto` for
//! files without write permission bits).
//!
//! The mount runs on it when asked (`--read-path engine-*`), and when the page cache path
//! is not possible (kernel without passthrough, backing file system without the sync flag
//! in `sync` mode).
//!
//! Invariants: those of `objects.rs` (one object per inode, passthrough rules decided under
//! its lock) and of the engine (docs/design.md): a write is on the backing before it
//! reaches RAM and before the reply in `sync` mode.
//!
//! Crash semantics: the engine's (docs/crash-model.md); nothing of its own.

pub mod objects;

use crate::config::{FsConfig, ReadPath, COPY_STEP_BYTES, PASSTHROUGH_LOAD_WAIT};
use crate::engine::objects::{Obj, Objects, OpenKind, PassthroughChoice};
use crate::error::{FsError, Result};
use crate::kernel::{OpenReply, Register, ReplyFlags};
use crate::stats::FsStats;
use crate::sys;
use dhrd_engine::{Durability, RamBudget, Served};

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct EngineTier {
    /// One of the engine read paths.
    path: ReadPath,
    objects: Objects,
    /// The kernel offers passthrough (INIT): read-only opens may read the memfd.
    passthrough: bool,
}

impl EngineTier {
    pub fn new(
        cfg: &FsConfig,
        path: ReadPath,
        budget: Arc<RamBudget>,
        passthrough: bool,
    ) -> std::io::Result<Self> {
        assert!(path.is_engine(), "the engine tier runs an engine read path");
        let loader = dhrd_engine::Loader::new(dhrd_engine::LoaderConfig {
            threads: cfg.loader_threads,
            rate_bytes_per_s: cfg.load_rate,
            ..Default::default()
        })?;
        // periodic:N: the engine would start one flusher thread per object; with thousands
        // of files the daemon runs a single flusher over all objects instead (daemon/threads.rs)
        // and the objects themselves use `fsync` semantics.
        let object_durability = match cfg.durability {
            Durability::Periodic(_) => Durability::Fsync,
            d => d,
        };
        let mut base = dhrd_engine::ObjectConfig {
            durability: object_durability,
            budget: Some(budget),
            loader: Some(loader),
            // Small files are loaded by the open itself: the read that follows finds RAM,
            // and no loader thread is woken per file.
            inline_load_bytes_max: dhrd_engine::INLINE_LOAD_BYTES_MAX,
            ..Default::default()
        };
        if let Some(c) = cfg.chunk_bytes {
            base.chunk_bytes = c;
        }
        Ok(Self {
            path,
            objects: Objects::new(base, cfg.object_cache),
            passthrough,
        })
    }

    /// The engine read path the mount runs.
    pub fn path(&self) -> ReadPath {
        self.path
    }

    /// The objects of the files (objects.rs).
    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Decides how one open (counted by `Objects::acquire`) reaches its data and counts it
    /// under that kind: passthrough to the memfd where the read path allows it (see
    /// `Objects::choose_passthrough` for the kernel's rules), else the direct or cached
    /// path.
    pub fn choose_reply(
        &self,
        stats: &FsStats,
        key: u64,
        obj: &Obj,
        writable: bool,
        register: Register<'_>,
    ) -> (OpenKind, OpenReply) {
        if writable {
            return (
                OpenKind::Writer,
                OpenReply::Plain(self.data_open_flags(stats)),
            );
        }
        // auto: only files nobody is meant to write (no write permission bits), because a
        // later writable open of an inode with passthrough opens must be refused (see
        // objects.rs); passthrough: every read-only open of a loaded file.
        let mode = sys::fstat(obj.backing().file().as_fd())
            .map(|st| st.st_mode)
            .unwrap_or(0);
        let no_write_bits = mode & 0o222 == 0;
        let pure_ok = self.passthrough
            && match self.path {
                ReadPath::EngineAuto => no_write_bits && obj.is_fully_loaded(),
                ReadPath::EnginePassthrough => {
                    obj.is_fully_loaded() || obj.wait_loaded(Some(PASSTHROUGH_LOAD_WAIT))
                }
                _ => false,
            };
        let choice = self
            .objects
            .choose_passthrough(key, pure_ok, |o| register(o.ram_fd()));
        match choice {
            Ok(PassthroughChoice::Pure(id)) => {
                stats.opens_passthrough.fetch_add(1, Ordering::Relaxed);
                (
                    OpenKind::Passthrough,
                    OpenReply::Passthrough(ReplyFlags::empty(), id),
                )
            }
            Ok(PassthroughChoice::Joined(id)) => {
                stats.opens_direct.fetch_add(1, Ordering::Relaxed);
                (
                    OpenKind::Passthrough,
                    OpenReply::Passthrough(ReplyFlags::DIRECT_IO, id),
                )
            }
            Ok(PassthroughChoice::Plain) => (
                OpenKind::PlainReader,
                OpenReply::Plain(self.data_open_flags(stats)),
            ),
            Err(e) => {
                // Served on the direct path: correct, only slower.
                eprintln!("dhrd: passthrough registration failed ({e}); using the direct path");
                (
                    OpenKind::PlainReader,
                    OpenReply::Plain(self.data_open_flags(stats)),
                )
            }
        }
    }

    /// Open flags of an open served by the daemon (or the mount's page cache).
    pub fn data_open_flags(&self, stats: &FsStats) -> ReplyFlags {
        if self.path == ReadPath::EngineCached {
            stats.opens_cached.fetch_add(1, Ordering::Relaxed);
            ReplyFlags::KEEP_CACHE
        } else {
            stats.opens_direct.fetch_add(1, Ordering::Relaxed);
            ReplyFlags::DIRECT_IO | ReplyFlags::PARALLEL_DIRECT_WRITES
        }
    }

    pub fn read(obj: &Obj, offset: u64, size: u32) -> Result<(Vec<u8>, Served)> {
        // Sized to what the file can return: a whole-file read of a small file often asks
        // for far more (1 MiB and up), and zeroing that per request is pure waste.
        let want = u64::from(size).min(obj.len().saturating_sub(offset));
        let mut buf = vec![0u8; want as usize];
        let out = obj.read_at(&mut buf, offset)?;
        buf.truncate(out.bytes);
        Ok((buf, out.served))
    }

    pub fn fallocate(obj: &Obj, offset: u64, length: u64, mode: i32) -> Result<()> {
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let end = offset
            .checked_add(length)
            .ok_or(FsError::Errno(libc::EFBIG))?;
        let rest = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let supported = rest == 0
            || (rest == libc::FALLOC_FL_PUNCH_HOLE && keep)
            || rest == libc::FALLOC_FL_ZERO_RANGE;
        if !supported {
            return Err(FsError::Errno(libc::EOPNOTSUPP));
        }
        if rest == 0 {
            // Allocation: the RAM tier holds the data; only the size matters to readers.
            if !keep && end > obj.len() {
                obj.set_len(end)?;
            }
            return Ok(());
        }
        let len = obj.len();
        let stop = end.min(len);
        if stop > offset {
            obj.zero_range(offset, stop - offset)?;
        }
        if rest == libc::FALLOC_FL_ZERO_RANGE && !keep && end > len {
            obj.set_len(end)?;
        }
        Ok(())
    }

    /// The source bytes come from its RAM tier (or its backing where not loaded) and go
    /// through the destination's ordinary write path in steps of `COPY_STEP_BYTES`, so
    /// every durability mode keeps its meaning (in `sync` mode each step is durable
    /// before the next starts; a crash leaves a copied prefix, like a crash during `cp`).
    /// A failure after some bytes were copied returns the short count, as write(2) does.
    pub fn copy(src: &Obj, offset_in: u64, dst: &Obj, offset_out: u64, want: u64) -> Result<u64> {
        let mut buf = vec![0u8; want.min(COPY_STEP_BYTES) as usize];
        let mut done = 0u64;
        while done < want {
            let n = (want - done).min(buf.len() as u64) as usize;
            let step = src
                .read_at(&mut buf[..n], offset_in + done)
                .and_then(|out| {
                    dst.write_at(&buf[..out.bytes], offset_out + done)
                        .map(|()| out.bytes)
                })
                .map_err(FsError::from);
            match step {
                Ok(0) => break,
                Ok(got) => {
                    done += got as u64;
                    if got < n {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }
}
