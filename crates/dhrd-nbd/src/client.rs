//! A minimal blocking NBD client over a Unix socket or TCP, optionally with TLS (a
//! pre-shared key, or x509 with an optional client certificate): fixed-newstyle
//! NBD_OPT_GO, simple replies, pipelined requests. For tests, crash-recovery checks and
//! the benchmark; production clients are qemu, the kernel, libnbd.
//!
//! Invariants:
//! - with TLS, STARTTLS is the first option and anything but its ACK is an error: the
//!   client never falls back to plaintext. The server's certificate is checked against
//!   the given CA, not against a host name (the client connects by path or address);
//! - the client remembers the length of every READ in flight, because a simple reply does
//!   not carry it; a reply for an unknown handle is a protocol error;
//! - a read reply's length is bounded by what the client itself asked for.

use crate::proto::*;
use crate::NbdError;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslStream, SslVerifyMode};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Buffer size of the client's reader and writer.
const CLIENT_BUFFER_BYTES: usize = 256 << 10;

/// Where the server listens.
#[derive(Debug, Clone)]
pub enum ClientAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// TLS credentials of the client.
#[derive(Debug, Clone)]
pub enum ClientTls {
    Psk {
        identity: String,
        key: Vec<u8>,
    },
    /// The CA that signed the server's certificate; the client's own certificate and key
    /// when the server verifies clients.
    X509 {
        ca_file: PathBuf,
        cert_and_key: Option<(PathBuf, PathBuf)>,
    },
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub addr: ClientAddr,
    pub tls: Option<ClientTls>,
}

#[derive(Debug)]
enum Plain {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Plain {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Plain::Unix(s) => s.read(buf),
            Plain::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Plain {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Plain::Unix(s) => s.write(buf),
            Plain::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Conn {
    Plain(Plain),
    Tls(Box<SslStream<Plain>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

fn tls_err(e: impl std::fmt::Display) -> NbdError {
    NbdError::Tls(e.to_string())
}

/// The TLS client side on `plain`, after the server acknowledged STARTTLS.
fn start_tls(plain: Plain, tls: &ClientTls) -> Result<SslStream<Plain>, NbdError> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(tls_err)?;
    match tls {
        ClientTls::Psk { identity, key } => {
            let (identity, key) = (identity.clone(), key.clone());
            b.set_verify(SslVerifyMode::NONE);
            b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
                let id = identity.as_bytes();
                if id.len() >= id_out.len() || key.len() > key_out.len() {
                    return Ok(0);
                }
                id_out[..id.len()].copy_from_slice(id);
                id_out[id.len()] = 0;
                key_out[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
        }
        ClientTls::X509 {
            ca_file,
            cert_and_key,
        } => {
            b.set_ca_file(ca_file).map_err(tls_err)?;
            if let Some((cert, key)) = cert_and_key {
                b.set_certificate_file(cert, SslFiletype::PEM)
                    .map_err(tls_err)?;
                b.set_private_key_file(key, SslFiletype::PEM)
                    .map_err(tls_err)?;
            }
        }
    }
    let cfg = b
        .build()
        .configure()
        .map_err(tls_err)?
        .verify_hostname(false)
        .use_server_name_indication(false);
    cfg.connect("", plain).map_err(tls_err)
}

pub struct Client {
    r: BufReader<Conn>,
    /// Requests not sent yet (see [`Client::flush_requests`]).
    w: Vec<u8>,
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
    /// Connects to a Unix socket and negotiates the default export with NBD_OPT_GO.
    pub fn connect(sock: &Path) -> Result<Self, NbdError> {
        Self::connect_with(&ClientOptions {
            addr: ClientAddr::Unix(sock.to_path_buf()),
            tls: None,
        })
    }

    /// Connects as `o` says: STARTTLS first when it has TLS credentials, then
    /// NBD_OPT_GO for the default export.
    pub fn connect_with(o: &ClientOptions) -> Result<Self, NbdError> {
        let plain = match &o.addr {
            ClientAddr::Unix(p) => Plain::Unix(UnixStream::connect(p)?),
            ClientAddr::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Plain::Tcp(s)
            }
        };
        let mut r = BufReader::with_capacity(CLIENT_BUFFER_BYTES, Conn::Plain(plain));
        let mut g = [0u8; 18];
        r.read_exact(&mut g)?;
        if g[..16] != encode_greeting()[..16] {
            return Err(NbdError::Protocol(
                "not an NBD fixed-newstyle server".into(),
            ));
        }
        let flags = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes();
        r.get_mut().write_all(&flags)?;
        if let Some(tls) = &o.tls {
            send_option(r.get_mut(), OPT_STARTTLS, &[])?;
            let (rtype, _) = option_reply(&mut r)?;
            if rtype != REP_ACK {
                return Err(NbdError::Tls(format!("STARTTLS refused: {rtype:#x}")));
            }
            let Conn::Plain(plain) = r.into_inner() else {
                return Err(NbdError::Protocol("TLS started twice".into()));
            };
            let s = start_tls(plain, tls)?;
            r = BufReader::with_capacity(CLIENT_BUFFER_BYTES, Conn::Tls(Box::new(s)));
        }
        // The default export, no info requests.
        send_option(r.get_mut(), OPT_GO, &[0u8; 6])?;
        let (mut size, mut tflags) = (None, 0u16);
        loop {
            let (rtype, p) = option_reply(&mut r)?;
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
            w: Vec::with_capacity(CLIENT_BUFFER_BYTES),
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
        if self.w.len() + payload.len() > CLIENT_BUFFER_BYTES {
            self.flush_requests()?;
        }
        self.w
            .extend_from_slice(&encode_request(flags, cmd, h, offset, len));
        self.w.extend_from_slice(payload);
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
        let conn = self.r.get_mut();
        conn.write_all(&self.w)?;
        conn.flush()?;
        self.w.clear();
        Ok(())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Waits for the next reply (any order).
    pub fn recv(&mut self) -> Result<Reply, NbdError> {
        self.flush_requests()?;
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
        self.flush_requests()
    }
}

fn send_option(w: &mut Conn, option: u32, payload: &[u8]) -> Result<(), NbdError> {
    let mut opt = Vec::with_capacity(16 + payload.len());
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&option.to_be_bytes());
    opt.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    opt.extend_from_slice(payload);
    w.write_all(&opt)?;
    w.flush()?;
    Ok(())
}

/// One option reply: its type and payload (bounded by the option limit).
fn option_reply(r: &mut BufReader<Conn>) -> Result<(u32, Vec<u8>), NbdError> {
    let mut h = [0u8; OPTION_REPLY_HEADER_BYTES];
    r.read_exact(&mut h)?;
    let rtype = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
    let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
    if len > crate::limits::MAX_OPTION_BYTES {
        return Err(NbdError::Protocol("oversized option reply".into()));
    }
    let mut p = vec![0u8; len as usize];
    r.read_exact(&mut p)?;
    Ok((rtype, p))
}
