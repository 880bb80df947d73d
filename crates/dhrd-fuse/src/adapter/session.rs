//! The FUSE session over /dev/fuse (fuser): mounting, its worker threads, and its
//! unmount. The daemon runs a mount through this and names no fuser type itself.
//!
//! Invariants: the mount is `nodev`, `nosuid` and checks permissions in the kernel
//! (`default_permissions`); the core's notices go through the FUSE session's own notifier.
//!
//! Crash semantics: none of its own.

use super::convert::Notices;
use super::filesystem::DhrdFs;
use crate::mount::Mount;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// How the session is mounted.
pub struct SessionOptions {
    /// The file system's name in the mount table.
    pub fs_name: String,
    /// Other users may use the mount (`allow_other`).
    pub allow_other: bool,
    /// Worker threads that take requests.
    pub threads: usize,
}

/// A mounted FUSE session serving `Mount`.
pub struct Session(fuser::Session<DhrdFs>);

/// Unmounts the session's mount from another thread.
pub struct Unmounter(fuser::SessionUnmounter);

impl Session {
    /// Mounts `m` on `mountpoint`.
    pub fn mount(m: Arc<Mount>, mountpoint: &Path, o: &SessionOptions) -> io::Result<Self> {
        let mut options = vec![
            fuser::MountOption::FSName(o.fs_name.clone()),
            fuser::MountOption::Subtype("dhrd".into()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
            fuser::MountOption::RW,
        ];
        let acl = if o.allow_other {
            options.push(fuser::MountOption::CUSTOM("allow_other".into()));
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        };
        let mut cfg = fuser::Config::default();
        cfg.mount_options = options;
        cfg.acl = acl;
        cfg.n_threads = Some(o.threads.max(1));
        cfg.clone_fd = true;
        let session =
            fuser::Session::new(DhrdFs::new(m.clone(), o.threads.max(1)), mountpoint, &cfg)?;
        m.set_notices(Box::new(Notices(session.notifier())));
        Ok(Session(session))
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.0.unmount_callable())
    }

    /// Serves requests until the mount goes.
    pub fn run(self) -> io::Result<()> {
        self.0.run()
    }
}

impl Unmounter {
    /// Unmounts; fuser gives up its mount at the first attempt, even a failed one, and
    /// reports every later attempt as done (the daemon unmounts by path to retry).
    pub fn unmount(&mut self) -> io::Result<()> {
        self.0.unmount()
    }
}
