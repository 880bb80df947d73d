//! How the warm-up of the page cache path opens the files the walk found: confined,
//! read-only, without updating their access times where the daemon may, and only if the
//! path still names the inode the walk found.
//!
//! No state and no crash semantics: it only opens files for reading.

use crate::sys::{self, BackingDir};
use dhrd_pagecache::resident::{FileRef, Opener};
use rustix::fs::OFlags;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;

/// Opens walked files of one backing directory for the warm-up (`Opener`).
pub struct BackingOpener(Arc<BackingDir>);

impl BackingOpener {
    pub fn new(dir: Arc<BackingDir>) -> Self {
        Self(dir)
    }
}

impl Opener for BackingOpener {
    fn open(&self, f: &FileRef) -> io::Result<File> {
        let fd = dhrd_pagecache::sys::open_noatime(|noatime| {
            let noatime = OFlags::from_bits_retain(noatime as u32);
            self.0
                .open_rel(&f.path, OFlags::RDONLY | OFlags::NONBLOCK | noatime)
        })?;
        let st = sys::fstat(fd.as_fd())?;
        if st.st_ino != f.key || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        Ok(File::from(fd))
    }
}
