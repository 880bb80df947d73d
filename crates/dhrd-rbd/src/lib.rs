//! A Ceph RBD image as the durable backing of a dhrd object (SPEC R1).
//!
//! [`RbdBacking`] implements [`dhrd_io::Durable`] over librbd, which this crate loads at run
//! time (see `ffi`), so nothing else in the workspace needs Ceph to build or run. The
//! engine sits on it exactly as on a file: reads of loaded chunks come from RAM and never
//! reach the network; a write is acknowledged by the engine only after librbd reported it
//! stored by the OSDs.
//!
//! Invariants and crash semantics:
//! - librbd's own write-back cache is switched off for our connection (`rbd_cache =
//!   false`): a completed `rbd_write` is then stored on every OSD of the placement group's
//!   acting set (the pool's replication), so [`dhrd_io::Durable::writes_are_durable`] is true and
//!   `sync` (`rbd_flush`) has nothing left to do but is still issued where the engine asks;
//! - a writable open takes the image's exclusive lock and never hands it over (librbd's
//!   "standard" lock policy once the lock is taken explicitly): a second dhrd, or any
//!   other librbd writer, is refused while this one lives. If this process dies, the lock
//!   is broken by the next client once the dead client's watch has expired on the OSDs
//!   (`osd_client_watch_timeout`, 30 s by default), or at once by a dhrd of the same host
//!   whose owner record proves the holder's process gone (`owner.rs`); either way the dead
//!   client is blocklisted, so it could not write even if it were only cut off;
//! - once this client learns that it lost the lock (blocklisted, a write refused for want
//!   of it, or another owner seen by the check it makes every second), RAM serves no read
//!   again ([`dhrd_io::Durable::reads_allowed`]); with a read lease, RAM serves reads only
//!   while the lock was confirmed within the lease period, which must fit under the watch
//!   timeout (`hold.rs`); without one, a dhrd cut off from the cluster serves what it
//!   loaded until it learns of the loss;
//! - the image size is cached: only the lock owner resizes the image, this process for
//!   itself or for another client that asks (`rbd resize`); a smaller image than this
//!   process made fails the backing and refuses reads (RAM past the end is gone from it);
//! - a read-only open (`read_only` or a snapshot) takes no lock; an image that another
//!   client changes under a read-only dhrd is served stale from RAM, which is why a
//!   snapshot (`rbd:POOL/IMAGE@SNAP`) is the safe way to export an image read-only.

mod backing;
mod ffi;
mod hold;
mod image;
mod owner;
mod reader;

pub use backing::{RbdBacking, MARK_METADATA_KEY};
pub use hold::lease_bound;
pub use reader::BulkReader;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// The prefix that marks a backing as an RBD image rather than a path.
pub const URI_PREFIX: &str = "rbd:";
/// How long connecting to the monitors may take before the open fails
/// (`client_mount_timeout`; Ceph's own default is 300 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a writable open waits for the exclusive lock held by another client. Longer
/// than Ceph's default `osd_client_watch_timeout` (30 s), so a restart after a crash of
/// the previous holder gets the lock as soon as the cluster lets it.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(45);
/// Bulk reads (the loader's) are split into pieces of at most this many bytes, all in
/// flight at once, so one chunk load keeps several OSD requests busy. Measured on a
/// one-node cluster, loading 1 GiB with 4 loader threads and 4 MiB chunks: 128 KiB pieces
/// 2.6-2.8 s, 256 KiB 2.0-2.2 s, 1 MiB 1.3-1.5 s, 2 MiB and 4 MiB 1.3-1.9 s (noisier).
pub const BULK_PIECE_BYTES: u64 = 1024 * 1024;
/// At most this many pieces of one bulk read are in flight at once.
pub const BULK_PIECES_IN_FLIGHT: usize = 16;

/// Which image: `rbd:POOL/IMAGE`, `rbd:POOL/NAMESPACE/IMAGE`, either with `@SNAP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub namespace: Option<String>,
    pub image: String,
    pub snapshot: Option<String>,
}

impl RbdSpec {
    /// Whether `s` names an RBD image (starts with [`URI_PREFIX`]) rather than a path.
    pub fn is_rbd(s: &str) -> bool {
        s.starts_with(URI_PREFIX)
    }

    /// Parses `rbd:POOL/IMAGE[@SNAP]` or `rbd:POOL/NAMESPACE/IMAGE[@SNAP]`.
    pub fn parse(s: &str) -> Result<RbdSpec, RbdError> {
        let bad = |why: &'static str| RbdError::Spec {
            spec: s.to_owned(),
            why,
        };
        let rest = s.strip_prefix(URI_PREFIX).ok_or(bad("no rbd: prefix"))?;
        let (path, snapshot) = match rest.split_once('@') {
            Some((p, snap)) => (p, Some(snap.to_owned())),
            None => (rest, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (pool, namespace, image) = match parts.as_slice() {
            [pool, image] => (*pool, None, *image),
            [pool, ns, image] => (*pool, Some((*ns).to_owned()), *image),
            _ => return Err(bad("expected POOL/IMAGE or POOL/NAMESPACE/IMAGE")),
        };
        let names = [
            Some(pool),
            namespace.as_deref(),
            Some(image),
            snapshot.as_deref(),
        ];
        if names.iter().flatten().any(|n| n.is_empty()) {
            return Err(bad("an empty name"));
        }
        if names
            .iter()
            .flatten()
            .any(|n| n.contains('\0') || n.contains('@'))
        {
            return Err(bad("a name with NUL or '@'"));
        }
        Ok(RbdSpec {
            pool: pool.to_owned(),
            namespace,
            image: image.to_owned(),
            snapshot,
        })
    }
}

impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{URI_PREFIX}{}/", self.pool)?;
        if let Some(ns) = &self.namespace {
            write!(f, "{ns}/")?;
        }
        write!(f, "{}", self.image)?;
        if let Some(s) = &self.snapshot {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

/// How to reach the cluster and open the image.
#[derive(Debug, Clone)]
pub struct RbdOptions {
    /// ceph.conf to read; `None` searches as the ceph tools do (`$CEPH_CONF`,
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// Client id without the `client.` prefix; `None` is `admin`.
    pub id: Option<String>,
    /// Create the image (of `min_len` bytes, which is then required) if it does not exist.
    pub create: bool,
    /// Grow the image to this size if it is smaller (never shrink).
    pub min_len: Option<u64>,
    pub read_only: bool,
    pub connect_timeout: Duration,
    /// Fail an OSD or monitor request that takes longer than this (`rados_osd_op_timeout`);
    /// `None` waits for the cluster however long it is away, as a disk that hangs would.
    pub op_timeout: Option<Duration>,
    pub lock_wait: Duration,
    /// Where to record this process as the lock's owner, so that a restart on this host
    /// after a crash breaks the dead process's lock at once instead of waiting for the
    /// cluster's watch timeout (see [`owner_record_in`], [`DEFAULT_OWNER_RECORD_DIR`]); `None`: no record.
    pub owner_record: Option<PathBuf>,
    /// Serve reads from RAM only while the lock was confirmed at the OSD within this
    /// period (a writable open only), where another host may take the image over after
    /// this one is cut off: then no read is served from RAM after another client could
    /// have written. It must be below `osd_client_watch_timeout` less
    /// `objecter_tick_interval` and a margin ([`lease_bound`]; 22 s with Ceph's defaults),
    /// as this client's configuration has them, else the open fails. The price: when the
    /// cluster is unreachable for longer than the period, reads fail too. `None`: RAM
    /// serves reads until this client learns that it lost the lock.
    pub read_lease: Option<Duration>,
}

/// The owner record of `spec` under `dir`: one file per image.
pub fn owner_record_in(dir: &std::path::Path, spec: &RbdSpec) -> PathBuf {
    let mut name = spec.pool.clone();
    if let Some(ns) = &spec.namespace {
        name.push('%');
        name.push_str(ns);
    }
    name.push('%');
    name.push_str(&spec.image);
    dir.join(format!("{name}.owner"))
}

/// Where dhrd records lock owners by default: `/run/dhrd/rbd` (cleared at boot, which is
/// right: no process of a previous boot runs).
pub const DEFAULT_OWNER_RECORD_DIR: &str = "/run/dhrd/rbd";

impl Default for RbdOptions {
    fn default() -> Self {
        RbdOptions {
            conf: None,
            id: None,
            create: false,
            min_len: None,
            read_only: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            op_timeout: None,
            lock_wait: DEFAULT_LOCK_WAIT,
            owner_record: None,
            read_lease: None,
        }
    }
}

/// Why an RBD backing could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RbdError {
    #[error(
        "bad RBD backing {spec:?}: {why} (expected rbd:POOL/IMAGE, rbd:POOL/NAMESPACE/IMAGE, \
         optionally with @SNAPSHOT)"
    )]
    Spec { spec: String, why: &'static str },
    #[error(
        "Ceph's client libraries are not available ({0}); install them (Debian: apt install \
         librbd1)"
    )]
    Library(String),
    #[error("{what}: {source}")]
    Ceph {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "image {image} lacks the exclusive-lock feature, so a second writer could not be kept \
         away; enable it with `rbd feature enable {image} exclusive-lock`"
    )]
    NoExclusiveLock { image: String },
    #[error(
        "image {image} is in use by another client ({owners}); waited {waited:?} for its \
         exclusive lock"
    )]
    Locked {
        image: String,
        owners: String,
        waited: Duration,
    },
    #[error(
        "a read lease of {lease:?} is longer than another client must wait to take the lock \
         over: the watch timeout (osd_client_watch_timeout, {watch:?} in this client's \
         configuration; set it where the OSDs read it too, e.g. [global]) less a ping \
         interval (objecter_tick_interval, {ping:?}) and a margin allows at most {bound:?}"
    )]
    LeaseTooLong {
        lease: Duration,
        bound: Duration,
        watch: Duration,
        ping: Duration,
    },
}

impl RbdError {
    /// The errno that stands for this error at a C boundary.
    pub fn errno(&self) -> i32 {
        match self {
            RbdError::Spec { .. } => libc::EINVAL,
            RbdError::Library(_) => libc::ENOSYS,
            RbdError::Ceph { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            RbdError::NoExclusiveLock { .. } => libc::EOPNOTSUPP,
            RbdError::Locked { .. } => libc::EBUSY,
            RbdError::LeaseTooLong { .. } => libc::EINVAL,
        }
    }
}

impl From<RbdError> for io::Error {
    fn from(e: RbdError) -> io::Error {
        io::Error::new(io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() -> Result<(), RbdError> {
        for s in [
            "rbd:rbd/disk",
            "rbd:pool/ns/disk",
            "rbd:p/i@snap",
            "rbd:p/n/i@s",
        ] {
            assert_eq!(RbdSpec::parse(s)?.to_string(), s);
        }
        let s = RbdSpec::parse("rbd:p/n/i@s")?;
        assert_eq!(
            (
                s.pool.as_str(),
                s.namespace.as_deref(),
                s.image.as_str(),
                s.snapshot.as_deref()
            ),
            ("p", Some("n"), "i", Some("s"))
        );
        Ok(())
    }

    #[test]
    fn bad_specs_say_why() {
        for s in [
            "rbd:",
            "rbd:pool",
            "rbd:/img",
            "rbd:p/",
            "rbd:a/b/c/d",
            "rbd:p/i@",
            "x:p/i",
            "rbd:p/i@a@b",
        ] {
            let e = RbdSpec::parse(s).err();
            assert!(matches!(e, Some(RbdError::Spec { .. })), "{s}: {e:?}");
        }
        assert!(RbdSpec::is_rbd("rbd:p/i"));
        assert!(!RbdSpec::is_rbd("./rbd:p/i"));
    }

    #[test]
    fn errors_map_to_errno() {
        let e = RbdError::Locked {
            image: "rbd:p/i".into(),
            owners: "client.1".into(),
            waited: Duration::from_secs(1),
        };
        assert_eq!(e.errno(), libc::EBUSY);
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::ResourceBusy);
    }
}
