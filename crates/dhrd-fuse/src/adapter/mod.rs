//! The transport over /dev/fuse: fuser's session (`session`), its `Filesystem` adapter
//! (`filesystem`) and the conversions between fuser's types and the core's (`convert`).
//! The only module that names fuser; the mount's core (`mount`) takes requests and gives
//! replies in its own types (`kernel`), so another transport can sit beneath it.

mod convert;
mod filesystem;
mod session;

pub use session::{Session, SessionOptions, Unmounter};
