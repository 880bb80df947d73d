//! The fast layer between the backing and the object, when there is one: NVM write-back
//! (SPEC M4, `dhrd_tier::writeback`) or the SSD cache tier (SPEC T1, `dhrd_tier::tiered`).
//!
//! Invariants: at most one fast layer; none under a read-only object (both take writes);
//! the NVM file is never on a file system held in RAM (tmpfs, ramfs), since DRAM is never
//! treated as non-volatile. dhrd cannot tell a DAX mount of real persistent memory from
//! one of emulated memory, so the caller declares the kind by asking for this layer.
//! Each layer checks its pairing with the backing itself when it opens
//! (`dhrd_tier::pairing`): a foreign or changed backing drops clean chunks and refuses
//! dirty ones unless adopted.

use crate::{timed, Error, FastLayer, Layer, Layers, Notice, NvmLayer, Result};
use dhrd_engine::Durability;
use dhrd_io::{Durable, FileBacking, FileOptions};
use dhrd_tier::{LowerIdentity, WriteBack};
use std::path::Path;
use std::sync::Arc;

/// `statfs` magic numbers of file systems held in RAM only.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Write-back threads of the NVM layer.
pub const NVM_WRITEBACK_THREADS: usize = dhrd_tier::writeback::WRITEBACK_THREADS_DEFAULT;

/// Puts `layer` (if any) over `backing`: the device the object is to open, and the layer.
pub(crate) fn open(
    layer: Option<&FastLayer>,
    backing: Arc<dyn Durable>,
    identity: LowerIdentity,
    chunk_bytes: u64,
    durability: Durability,
    read_only: bool,
    notices: &mut Vec<Notice>,
) -> Result<(Arc<dyn Durable>, Layers)> {
    let Some(layer) = layer else {
        return Ok((backing, Layers::default()));
    };
    if read_only {
        return Err(Error::ReadOnlyCache {
            layer: layer.kind().name(),
        });
    }
    match layer {
        FastLayer::Nvm { file, timing } => {
            let wb = open_nvm(file, *timing, backing, identity, chunk_bytes)?;
            let s = wb.stats();
            let distrust = wb.distrusted_at_open().map(|why| Notice::Distrusted {
                layer: Layer::Nvm,
                why: why.to_string(),
                dropped: s.chunks_dropped_at_open,
                adopted: s.chunks_adopted_dirty,
            });
            notices.extend(distrust);
            notices.extend(dirty_at_open(Layer::Nvm, s.chunks_dirty_at_open));
            let layers = Layers {
                writeback: Some(wb.clone()),
                tier: None,
            };
            Ok((wb, layers))
        }
        FastLayer::Ssd {
            file,
            bytes,
            mode,
            timing,
        } => {
            let t = dhrd_tier::open_ssd_file(
                backing,
                identity,
                file,
                *bytes,
                chunk_bytes,
                *mode,
                *timing,
            )
            .map_err(|source| cache_error(Layer::Ssd, file, source))?;
            // Outside `sync` durability a write need be durable only at FLUSH: the SSD's
            // last sync of a write waits for it too (docs/crash-model.md).
            if !matches!(durability, Durability::Sync) {
                t.set_slot_sync(dhrd_tier::SlotSync::AtFlush);
            }
            let t = Arc::new(t);
            let s = t.stats();
            let distrust = t.distrusted_at_open().map(|why| Notice::Distrusted {
                layer: Layer::Ssd,
                why: why.to_string(),
                dropped: s.dropped_at_open,
                adopted: s.adopted_dirty,
            });
            notices.extend(distrust);
            notices.extend(dirty_at_open(Layer::Ssd, s.dirty_at_open));
            if s.upgraded_dirty > 0 {
                notices.push(Notice::Upgraded {
                    chunks: s.upgraded_dirty,
                });
            }
            let layers = Layers {
                writeback: None,
                tier: Some(t.clone()),
            };
            Ok((t, layers))
        }
    }
}

fn dirty_at_open(layer: Layer, chunks: u64) -> Option<Notice> {
    (chunks > 0).then_some(Notice::DirtyAtOpen { layer, chunks })
}

fn cache_error(layer: Layer, file: &Path, source: std::io::Error) -> Error {
    Error::Cache {
        layer: layer.name(),
        path: file.display().to_string(),
        source,
    }
}

/// The NVM write-back layer in `file` in front of `backing`.
fn open_nvm(
    file: &Path,
    timing: Option<dhrd_io::DeviceProfile>,
    backing: Arc<dyn Durable>,
    identity: LowerIdentity,
    chunk_bytes: u64,
) -> Result<Arc<NvmLayer>> {
    check_non_volatile(file)?;
    // Absolute, so that the backing's cache mark names it from anywhere.
    let file = &std::path::absolute(file).map_err(|e| cache_error(Layer::Nvm, file, e))?;
    let opts = FileOptions {
        create: true,
        ..Default::default()
    };
    let fast = FileBacking::open(file, &opts).map_err(|e| cache_error(Layer::Nvm, file, e))?;
    let fast = timed(Arc::new(fast), timing);
    let wb = WriteBack::open(fast, backing, identity, chunk_bytes, NVM_WRITEBACK_THREADS)
        .map_err(|e| cache_error(Layer::Nvm, file, e))?;
    Ok(Arc::new(wb))
}

/// Refuses a file whose directory is on a RAM-only file system.
fn check_non_volatile(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let failed = |e| cache_error(Layer::Nvm, path, e);
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| {
        failed(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path contains a NUL byte",
        ))
    })?;
    // SAFETY: statfs is plain old data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed statfs the call fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    let magic = st.f_type as i64;
    if magic == TMPFS_MAGIC || magic == RAMFS_MAGIC {
        return Err(Error::Volatile {
            path: path.display().to_string(),
        });
    }
    Ok(())
}
