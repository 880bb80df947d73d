//! What `dhrd status` shows: text for people (`text`) and JSON with stable field names
//! for machines (`json`; `--json`, and the Prometheus text the CLI derives from it), from
//! the same facts (`facts`). Field names are documented in docs/fuse.md and only ever
//! added to.
//!
//! No state of its own and no crash semantics.

mod facts;
mod json;
mod text;

pub use facts::{human, load_totals, LoadTotals};
pub use json::status_json;
pub use text::status_text;
