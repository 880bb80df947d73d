//! What `dhrd nbd` says about the fast layers `dhrd_stack` opens under the export, in the
//! words of its own flags:
//! - `--ram-file PATH --ram-kind nvm`: writes acknowledged once on non-volatile memory and
//!   written back to the backing in the background (SPEC M4, `dhrd_tier::writeback`);
//! - `--tier-ssd PATH --tier-ssd-size SIZE`: an SSD cache tier over a slow backing (SPEC
//!   T1, `dhrd_tier::tiered`).
//!
//! DRAM is never treated as non-volatile: the user declares the kind explicitly, because
//! dhrd cannot tell a DAX mount of real persistent memory from one of emulated memory, and
//! a file on tmpfs or ramfs is refused (`dhrd_stack`).

use dhrd_stack::{Drained, Layer, Notice, Released};
use dhrd_tier::{TierStats, WriteBackStats};
use std::time::Duration;

/// What the RAM tier's memory is: `dram` (volatile, write-through) or `nvm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RamKind {
    Dram,
    Nvm,
}

/// The flag that names a fast layer.
fn flag(layer: Layer) -> &'static str {
    match layer {
        Layer::Nvm => "--ram-file",
        Layer::Ssd => "--tier-ssd",
    }
}

/// Prints what happened while the stack opened.
pub fn say(n: &Notice) {
    let text = match n {
        Notice::LockTakenOver { image, from } => format!(
            "took over the lock of {image} from {from}, left by a dhrd of this host that is \
             no longer running (that client is now blocklisted)"
        ),
        Notice::NoDirectWrites { backing, why } => format!(
            "{backing}: no direct durable writes ({why}); each write is buffered and then \
             synced (two device operations)"
        ),
        Notice::LargerThanAsked {
            backing,
            len,
            asked,
        } => format!(
            "warning: {backing} is {len} bytes, larger than --size {asked}; exporting {len}"
        ),
        Notice::ServedDespiteMark { key, holder } => {
            format!("warning: serving {key} although it lacks data that {holder} holds")
        }
        Notice::MarkDropped { key, holder } => format!(
            "--drop-cache-mark: {key} is served without the data {holder} holds; its mark \
             is removed"
        ),
        Notice::Distrusted {
            layer,
            why,
            dropped,
            adopted,
        } => format!(
            "the {} was not trusted ({why}): {dropped} clean chunks dropped, {adopted} dirty \
             chunks adopted",
            flag(*layer)
        ),
        Notice::DirtyAtOpen { layer, chunks } => format!(
            "{chunks} chunks were dirty {} the {}: served from it and written back now",
            if *layer == Layer::Nvm { "in" } else { "on" },
            flag(*layer)
        ),
        Notice::Upgraded { chunks } => format!(
            "the --tier-ssd was in the first format: its {chunks} dirty chunks were written \
             to the lower tier and the SSD was formatted anew"
        ),
        other => format!("{other:?}"),
    };
    eprintln!("dhrd nbd: {text}");
}

pub fn describe(s: &WriteBackStats) -> String {
    format!(
        "{} of {} chunks dirty ({} dirty at start), {} written back, {} write-back failures, {} fills",
        s.chunks_dirty,
        s.chunks,
        s.chunks_dirty_at_open,
        s.chunks_written_back,
        s.writeback_failures,
        s.fills
    )
}

pub fn describe_tier(s: &TierStats) -> String {
    format!(
        "{} of {} slots used, {} dirty ({} at start); reads {} from the SSD, {} from the lower tier; \
         {} promoted, {} evicted, {} written back ({} failures), {} writes bypassed the SSD; \
         {} write misses filled only their parts, {} slots completed by the write-back",
        s.slots_used,
        s.slots,
        s.slots_dirty,
        s.dirty_at_open,
        s.reads_ssd,
        s.reads_lower,
        s.promotions,
        s.evictions,
        s.written_back,
        s.writeback_failures,
        s.writes_bypassed,
        s.partial_fills,
        s.completions
    )
}

/// At a clean stop: how the fast layer's write-back ended. Dirty data left behind is safe
/// in the layer and written back at the next start.
pub fn say_released(r: &Released, timeout: Duration) {
    if let Some(d) = &r.writeback {
        say_drained(d, timeout, Layer::Nvm, describe(&d.stats));
    }
    if let Some(d) = &r.tier {
        say_drained(d, timeout, Layer::Ssd, describe_tier(&d.stats));
    }
}

fn say_drained<S>(d: &Drained<S>, timeout: Duration, layer: Layer, stats: String) {
    let (done, left) = match layer {
        Layer::Nvm => ("write-back complete", "write-back not finished"),
        Layer::Ssd => ("SSD tier written back", "SSD tier write-back not finished"),
    };
    let place = match layer {
        Layer::Nvm => "in the --ram-file",
        Layer::Ssd => "on the SSD",
    };
    if let Some(why) = &d.failure {
        eprintln!("dhrd nbd: the {} failed: {why}", flag(layer));
    }
    if d.done {
        eprintln!("dhrd nbd: {done}: {stats}");
    } else {
        // A failed layer gives up at once; otherwise the drain timed out.
        let after = match d.failure {
            Some(_) => String::new(),
            None => format!(" after {} s", timeout.as_secs()),
        };
        eprintln!(
            "dhrd nbd: {left}{after}: {stats}; the dirty chunks are safe {place} and are \
             written back at the next start"
        );
    }
}
