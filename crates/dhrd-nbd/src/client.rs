//! A minimal blocking NBD client over a Unix socket: fixed-newstyle NBD_OPT_GO, simple
//! replies, pipelined requests. For tests, crash-recovery checks and tools; production
//! clients are qemu, the kernel, libnbd.
//!
//! Invariants:
//! - the client remembers the length of every READ in flight, because a simple reply does
//!   not carry it; a reply for an unknown handle is a protocol error;
//! - a read reply's length is bounded by what the client itself asked for.

use crate::proto::*;
use crate::NbdError;
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Buffer size of the client's reader and writer.
const CLIENT_BUFFER_BYTES: usize = 256 << 10;

pub struct Client {
    r: BufReader<UnixStream>,
    w: BufWriter<UnixStream>,
    pub size: u64,
    pub tflags: u16,
    /// Handle -> length of each READ in flight (0 for other commands).
    in_flight: HashMap<u64, usize>,
    next_handle: u64,
}

/// One completed request.
#[derive(Debug)]
pub struct Reply {
    pub handle: u64,
    /// NBD error value (0 = success).
    pub error: u32,
    /// Data of a successful read.
    pub data: Vec<u8>,
}

impl Client {
    /// Connects and negotiates the default export with NBD_OPT_GO.
    pub fn connect(sock: &Path) -> Result<Self, NbdError> {
        let s = UnixStream::connect(sock)?;
        let mut r = BufReader::with_capacity(CLIENT_BUFFER_BYTES, s.try_clone()?);
        let mut w = BufWriter::with_capacity(CLIENT_BUFFER_BYTES, s);
        let mut g = [0u8; 18];
        r.read_exact(&mut g)?;
        if g[..16] != encode_greeting()[..16] {
            return Err(NbdError::Protocol(
                "not an NBD fixed-newstyle server".into(),
            ));
        }
        w.write_all(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes())?;
        let mut opt = Vec::new();
        opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
        opt.extend_from_slice(&OPT_GO.to_be_bytes());
        opt.extend_from_slice(&6u32.to_be_bytes());
        opt.extend_from_slice(&[0u8; 6]); // default export, no info requests
        w.write_all(&opt)?;
        w.flush()?;
        let (mut size, mut tflags) = (None, 0u16);
        loop {
            let mut h = [0u8; OPTION_REPLY_HEADER_BYTES];
            r.read_exact(&mut h)?;
            let rtype = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
            let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
            if len > crate::limits::MAX_OPTION_BYTES {
                return Err(NbdError::Protocol("oversized option reply".into()));
            }
            let mut p = vec![0u8; len as usize];
            r.read_exact(&mut p)?;
            match rtype {
                REP_ACK => break,
                REP_INFO if p.len() >= 12 && p[..2] == INFO_EXPORT.to_be_bytes() => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&p[2..10]);
                    size = Some(u64::from_be_bytes(b));
                    tflags = u16::from_be_bytes([p[10], p[11]]);
                }
                REP_INFO => {}
                t => return Err(NbdError::Protocol(format!("NBD_OPT_GO refused: {t:#x}"))),
            }
        }
        let size = size.ok_or_else(|| NbdError::Protocol("no NBD_INFO_EXPORT".into()))?;
        Ok(Self {
            r,
            w,
            size,
            tflags,
            in_flight: HashMap::new(),
            next_handle: 1,
        })
    }

    fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// Queues a request (buffered; call [`Client::flush_requests`] or receive to send).
    pub fn send(
        &mut self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Result<u64, NbdError> {
        let h = self.handle();
        self.w
            .write_all(&encode_request(flags, cmd, h, offset, len))?;
        self.w.write_all(payload)?;
        self.in_flight
            .insert(h, if cmd == CMD_READ { len as usize } else { 0 });
        Ok(h)
    }

    pub fn send_write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<u64, NbdError> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.send(CMD_WRITE, flags, offset, data.len() as u32, data)
    }

    pub fn send_read(&mut self, offset: u64, len: u32) -> Result<u64, NbdError> {
        self.send(CMD_READ, 0, offset, len, &[])
    }

    pub fn flush_requests(&mut self) -> Result<(), NbdError> {
        Ok(self.w.flush()?)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Waits for the next reply (any order).
    pub fn recv(&mut self) -> Result<Reply, NbdError> {
        self.w.flush()?;
        let mut b = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        self.r.read_exact(&mut b)?;
        let rep = decode_simple_reply(&b);
        if rep.magic != SIMPLE_REPLY_MAGIC {
            return Err(NbdError::BadMagic {
                expected: SIMPLE_REPLY_MAGIC.into(),
                found: rep.magic.into(),
            });
        }
        let len = self.in_flight.remove(&rep.handle).ok_or_else(|| {
            NbdError::Protocol(format!("reply for unknown handle {}", rep.handle))
        })?;
        let mut data = Vec::new();
        if rep.error == 0 && len > 0 {
            data = vec![0u8; len];
            self.r.read_exact(&mut data)?;
        }
        Ok(Reply {
            handle: rep.handle,
            error: rep.error,
            data,
        })
    }

    fn expect_ok(&mut self) -> Result<Reply, NbdError> {
        let r = self.recv()?;
        if r.error != 0 {
            return Err(NbdError::Errno(r.error as i32));
        }
        Ok(r)
    }

    /// Synchronous read.
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, NbdError> {
        self.send_read(offset, len)?;
        Ok(self.expect_ok()?.data)
    }

    /// Synchronous write.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), NbdError> {
        self.send_write(offset, data, fua)?;
        self.expect_ok().map(|_| ())
    }

    /// Synchronous NBD_CMD_FLUSH.
    pub fn flush(&mut self) -> Result<(), NbdError> {
        self.send(CMD_FLUSH, 0, 0, 0, &[])?;
        self.expect_ok().map(|_| ())
    }

    /// Sends NBD_CMD_DISC and closes.
    pub fn disconnect(mut self) -> Result<(), NbdError> {
        self.send(CMD_DISC, 0, 0, 0, &[])?;
        self.w.flush()?;
        Ok(())
    }
}
