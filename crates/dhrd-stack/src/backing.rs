//! The bottom of the stack: a file or block device (`dhrd_io::FileBacking`, with its
//! single-writer lock and the write mode the durability asks for) or a Ceph RBD image
//! (`dhrd_rbd::RbdBacking`), with what the caches above record of it (`LowerIdentity`).
//!
//! Invariants: a backing that a cache marked as lacking its data is never served without
//! that cache: [`uncached_start`] refuses it, or with `drop_cache_mark` removes the mark
//! first (a read-only start only reports it, since it changes nothing); a snapshot lacks
//! nothing a cache holds, so its image's mark is not its own.

use crate::{BackingConfig, Error, Notice, Result};
use dhrd_engine::Durability;
use dhrd_io::{Durable, FileBacking, FileOptions};
use dhrd_rbd::{RbdBacking, RbdOptions, RbdSpec};
use dhrd_tier::LowerIdentity;
use std::sync::Arc;

/// An open backing, with what the stack needs to know of it.
pub(crate) struct Opened {
    pub backing: Arc<dyn Durable>,
    /// The chunk size that suits the backing, if it has one.
    pub preferred_chunk: Option<u64>,
    /// The same backing when it is an RBD image: closed explicitly, last, so that its
    /// exclusive lock is released at once (threads still holding the object would keep it
    /// until the cluster notices this process is gone).
    pub rbd: Option<Arc<RbdBacking>>,
    /// What a cache above records of the backing.
    pub identity: LowerIdentity,
}

/// Opens the backing `cfg` names: an RBD image for `rbd:...`, else a file or device.
pub(crate) fn open(
    cfg: &BackingConfig,
    durability: Durability,
    read_only: bool,
    notices: &mut Vec<Notice>,
) -> Result<Opened> {
    let name = cfg.name.to_string_lossy();
    if RbdSpec::is_rbd(&name) {
        let spec = RbdSpec::parse(&name).map_err(Error::RbdName)?;
        return open_rbd(&spec, cfg, read_only, notices);
    }
    open_file(cfg, durability, read_only, notices)
}

fn open_rbd(
    spec: &RbdSpec,
    cfg: &BackingConfig,
    read_only: bool,
    notices: &mut Vec<Notice>,
) -> Result<Opened> {
    let opts = RbdOptions {
        create: cfg.create && !read_only,
        min_len: cfg.min_len,
        read_only,
        ..cfg.rbd.clone()
    };
    let failed = |source| Error::Rbd {
        spec: spec.to_string(),
        source,
    };
    let b = Arc::new(RbdBacking::open(spec, &opts).map_err(failed)?);
    if let Some(dead) = b.broke_lock_of() {
        notices.push(Notice::LockTakenOver {
            image: spec.to_string(),
            from: dead.to_string(),
        });
    }
    // The image is stamped and marked through itself (a read-only start is refused over
    // a marked image, as over a marked file); a snapshot lacks nothing a cache holds,
    // whatever the image's mark says.
    let identity = match spec.snapshot {
        Some(_) => LowerIdentity::rbd_image(spec),
        None => LowerIdentity::of_rbd(&b),
    };
    Ok(Opened {
        backing: b.clone(),
        preferred_chunk: Some(b.preferred_chunk_bytes()),
        rbd: Some(b),
        identity,
    })
}

fn open_file(
    cfg: &BackingConfig,
    durability: Durability,
    read_only: bool,
    notices: &mut Vec<Notice>,
) -> Result<Opened> {
    let name = cfg.name.display().to_string();
    let failed = |what, source| Error::File {
        what,
        name: name.clone(),
        source,
    };
    let opts = FileOptions {
        create: cfg.create && !read_only,
        min_len: cfg.min_len,
        read_only,
        write_sync: cfg.write_sync.unwrap_or(durability.file_write_sync()),
        lock: cfg.file_lock,
        ..Default::default()
    };
    let b = FileBacking::open(&cfg.name, &opts).map_err(|e| failed("opening", e))?;
    if let Err(why) = b.direct_dsync() {
        notices.push(Notice::NoDirectWrites {
            backing: name.clone(),
            why: why.to_string(),
        });
    }
    if let Some(asked) = cfg.min_len {
        let len = b.len().map_err(|e| failed("sizing", e))?;
        if len > asked && !b.is_block_device() {
            notices.push(Notice::LargerThanAsked {
                backing: name.clone(),
                len,
                asked,
            });
        }
    }
    let identity = LowerIdentity::of_file(&b).map_err(|e| failed("identifying", e))?;
    Ok(Opened {
        backing: Arc::new(b),
        preferred_chunk: None,
        rbd: None,
        identity,
    })
}

/// A start without a cache over a backing a cache marked as lacking its data: refused, or
/// with `ignore_mark` the mark is removed (a read-only start only reports it).
pub(crate) fn uncached_start(
    identity: &LowerIdentity,
    read_only: bool,
    notices: &mut Vec<Notice>,
) -> Result<()> {
    if !identity.ignore_mark {
        return dhrd_tier::pairing::check_mark(identity, None).map_err(Error::Marked);
    }
    let Some(mark) = identity.mark.as_ref() else {
        return Ok(());
    };
    let Some(holder) = mark.get().map_err(Error::Marked)? else {
        return Ok(());
    };
    let key = identity.key.clone();
    if read_only {
        notices.push(Notice::ServedDespiteMark { key, holder });
        return Ok(());
    }
    dhrd_tier::pairing::clear_mark(identity).map_err(Error::Marked)?;
    notices.push(Notice::MarkDropped { key, holder });
    Ok(())
}
