//! [`BulkReader`]: a plain librbd client that reads an image into memory, nothing else.
//! It is the fair baseline for dhrd's load (`dhrd-bench rbd-read`): the same library, the
//! same request size and number in flight, into memory of the caller's choosing, without
//! dhrd's engine, chunk states or loader threads.
//!
//! Invariants: the image is opened read-only, so it takes no part in the exclusive lock
//! and changes nothing; no buffer handed to an asynchronous read is released or reused
//! before its completion was waited for, on every path including errors; the handles are
//! destroyed once, by `Partial`'s Drop.

use crate::ffi::{self, CompletionT, ImageInfo, Lib};
use crate::image::{ceph, open_handles, os_err, Partial};
use crate::{RbdError, RbdOptions, RbdSpec};
use std::collections::VecDeque;
use std::io;

/// A read-only open of one image, for bulk reads.
pub struct BulkReader {
    lib: &'static Lib,
    handles: Partial,
    size_bytes: u64,
    object_bytes: u64,
}

impl BulkReader {
    /// Connects and opens `spec` read-only (librbd's cache off, as dhrd opens it).
    pub fn open(spec: &RbdSpec, opts: &RbdOptions) -> Result<BulkReader, RbdError> {
        let lib = ffi::lib().map_err(RbdError::Library)?;
        let handles = open_handles(lib, spec, opts, true)?;
        let mut info = ImageInfo {
            size: 0,
            obj_size: 0,
            num_objs: 0,
            order: 0,
            block_name_prefix: [0; 24],
            parent_pool: 0,
            parent_name: [0; 96],
        };
        // SAFETY: an open image; `info` is a writable rbd_image_info_t of the size passed.
        let r =
            unsafe { (lib.rbd_stat)(handles.image, &mut info, std::mem::size_of::<ImageInfo>()) };
        if r < 0 {
            return Err(ceph(format!("stat of image {spec}"), r.into()));
        }
        Ok(BulkReader {
            lib,
            handles,
            size_bytes: info.size,
            object_bytes: info.obj_size,
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The image's object size (dhrd's default chunk over an RBD image).
    pub fn object_bytes(&self) -> u64 {
        self.object_bytes
    }

    /// Fills `dst` from byte `offset` of the image with reads of `piece_bytes`, keeping
    /// up to `depth` in flight: a new one is sent as soon as the oldest has completed.
    pub fn read_window(
        &self,
        dst: &mut [u8],
        offset: u64,
        piece_bytes: usize,
        depth: usize,
    ) -> io::Result<()> {
        if piece_bytes == 0 || depth == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a read window needs pieces and a depth of at least one",
            ));
        }
        if offset + dst.len() as u64 > self.size_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes at {offset} pass the end of a {}-byte image",
                    dst.len(),
                    self.size_bytes
                ),
            ));
        }
        let mut pending: VecDeque<(CompletionT, usize)> = VecDeque::with_capacity(depth);
        let mut first_err: Option<io::Error> = None;
        for (i, part) in dst.chunks_mut(piece_bytes).enumerate() {
            if pending.len() == depth {
                self.wait_oldest(&mut pending, &mut first_err);
            }
            if first_err.is_some() {
                break;
            }
            let at = offset + (i * piece_bytes) as u64;
            match self.submit(part, at) {
                Ok(c) => pending.push_back((c, part.len())),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        while !pending.is_empty() {
            self.wait_oldest(&mut pending, &mut first_err);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Sends one asynchronous read into `part`, which the caller keeps borrowed until the
    /// completion is waited for.
    fn submit(&self, part: &mut [u8], at: u64) -> io::Result<CompletionT> {
        let mut c: CompletionT = std::ptr::null_mut();
        // SAFETY: out-pointer; no callback.
        let r = unsafe { (self.lib.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(os_err(r.into()));
        }
        // SAFETY: an open image; `part` outlives the completion (waited for by the caller
        // before `read_window` returns, on every path).
        let r = unsafe {
            (self.lib.rbd_aio_read)(
                self.handles.image,
                at,
                part.len(),
                part.as_mut_ptr().cast(),
                c,
            )
        };
        if r < 0 {
            // SAFETY: a completion never submitted.
            unsafe { (self.lib.rbd_aio_release)(c) };
            return Err(os_err(r.into()));
        }
        Ok(c)
    }

    fn wait_oldest(
        &self,
        pending: &mut VecDeque<(CompletionT, usize)>,
        first_err: &mut Option<io::Error>,
    ) {
        let Some((c, want)) = pending.pop_front() else {
            return;
        };
        // SAFETY: a submitted completion, waited for and released exactly once.
        let got = unsafe {
            (self.lib.rbd_aio_wait_for_complete)(c);
            let got = (self.lib.rbd_aio_get_return_value)(c);
            (self.lib.rbd_aio_release)(c);
            got
        };
        if got < 0 {
            first_err.get_or_insert(os_err(got as i64));
        } else if got as usize != want {
            first_err.get_or_insert(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("rbd read returned {got} of {want} bytes inside the image"),
            ));
        }
    }
}
