//! TLS for NBD (NBD_OPT_STARTTLS): the server's credentials (x509 certificates, or
//! pre-shared keys in psktool's `identity:hexkey` format) and the handshake. The
//! encrypted stream that follows, shared by a connection's reader and writer threads, is
//! `tls_stream.rs`.
//!
//! Library: OpenSSL (the `openssl` crate over the system's libssl 3). The clients are
//! GnuTLS-based (libnbd, qemu) and PSK must interoperate with them; rustls has no
//! external-PSK support. OpenSSL serves TLS 1.3 PSK through its compatibility path
//! (SSL_CTX_set_psk_server_callback, SHA-256 binders, which is what GnuTLS uses for
//! external keys) and TLS 1.2 PSK suites.
//!
//! Invariants:
//! - authorisation happens in the handshake, before any option after STARTTLS is read:
//!   with PSK, an identity not in the key file, or a wrong key, fails the handshake; with
//!   `verify_peer`, a client without a certificate chaining to `ca-cert.pem` (expired,
//!   from another CA, none at all) fails it. A failed handshake ends the connection;
//! - one SSL object per connection over a transport in memory (`tls_stream.rs`): the
//!   handshake, like the transmission after it, makes every system call itself with
//!   non-blocking calls and waits in `poll`, bounded by the negotiation's deadline;
//! - TLS 1.2 at least; no renegotiation; no session tickets or cache (nothing to resume,
//!   nothing kept per client).
//!
//! Crash semantics: none; this only moves bytes.

pub(crate) use crate::tls_stream::TlsStream;
use crate::tls_stream::{recv_into, send_all_by, Wire};
use crate::wait::poll_fd;
use crate::NbdError;
use openssl::pkey::PKey;
use openssl::ssl::{
    HandshakeError, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef,
    SslSessionCacheMode, SslVerifyMode, SslVersion,
};
use openssl::x509::X509Name;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// How clients authenticate, and with what the server proves itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsCredentials {
    /// A directory with `server-cert.pem` and `server-key.pem`, and `ca-cert.pem` when
    /// client certificates are verified (the layout nbdkit and qemu use).
    X509 { dir: PathBuf, verify_peer: bool },
    /// A file of `identity:hexkey` lines (what `psktool` writes): a client must know the
    /// key of one identity.
    Psk { file: PathBuf },
}

/// TLS for a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Refuse every option but STARTTLS before the handshake (`--tls require`); else
    /// plaintext clients are served too (`--tls on`).
    pub require: bool,
    pub credentials: TlsCredentials,
}

impl TlsConfig {
    /// Whether a client has to prove who it is (a key, or a verified certificate).
    pub fn authenticates_clients(&self) -> bool {
        match &self.credentials {
            TlsCredentials::X509 { verify_peer, .. } => *verify_peer,
            TlsCredentials::Psk { .. } => true,
        }
    }
}

/// Longest pre-shared key accepted (OpenSSL's PSK_MAX_PSK_LEN).
const PSK_KEY_BYTES_MAX: usize = 512;
/// Longest PSK identity (OpenSSL's PSK_MAX_IDENTITY_LEN).
const PSK_IDENTITY_BYTES_MAX: usize = 256;
/// TLS 1.2 suites offered with PSK (TLS 1.3 suites are OpenSSL's defaults). Forward
/// secret ones first; plain PSK last for clients that offer nothing else.
const PSK_TLS12_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA384:\
     ECDHE-PSK-AES128-CBC-SHA256:DHE-PSK-AES256-GCM-SHA384:DHE-PSK-AES128-GCM-SHA256:\
     PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256";

fn tls_err(what: &str, e: impl std::fmt::Display) -> NbdError {
    NbdError::Tls(format!("{what}: {e}"))
}

/// Decodes a hex key; `None` when it is not whole bytes of hex digits.
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Reads a PSK file: one `identity:hexkey` per line (split at the first colon, as GnuTLS
/// does), blank lines ignored. Anything else is refused with its line number, never
/// skipped: a key the operator meant to add must not silently be missing.
pub fn read_psk_file(path: &Path) -> Result<HashMap<Vec<u8>, Vec<u8>>, NbdError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| NbdError::Config(format!("--tls-psk {}: {e}", path.display())))?;
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| {
            NbdError::Config(format!(
                "--tls-psk {} line {}: {why}",
                path.display(),
                i + 1
            ))
        };
        let (id, hex) = line
            .split_once(':')
            .ok_or_else(|| bad("not identity:hexkey"))?;
        if id.is_empty() || id.len() > PSK_IDENTITY_BYTES_MAX {
            return Err(bad("empty or overlong identity"));
        }
        let key = decode_hex(hex).ok_or_else(|| bad("the key is not hexadecimal bytes"))?;
        if key.len() > PSK_KEY_BYTES_MAX {
            return Err(bad("key longer than 512 bytes"));
        }
        if keys.insert(id.as_bytes().to_vec(), key).is_some() {
            return Err(bad("identity given twice"));
        }
    }
    if keys.is_empty() {
        return Err(NbdError::Config(format!(
            "--tls-psk {}: no keys",
            path.display()
        )));
    }
    Ok(keys)
}

/// The server's TLS context, made once at start so bad credentials fail the start.
pub(crate) struct TlsServer {
    ctx: SslContext,
}

impl TlsServer {
    pub(crate) fn new(creds: &TlsCredentials) -> Result<Self, NbdError> {
        let mut b =
            SslContextBuilder::new(SslMethod::tls_server()).map_err(|e| tls_err("context", e))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| tls_err("protocol versions", e))?;
        b.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::IGNORE_UNEXPECTED_EOF);
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_num_tickets(0).map_err(|e| tls_err("tickets", e))?;
        match creds {
            TlsCredentials::X509 { dir, verify_peer } => x509(&mut b, dir, *verify_peer)?,
            TlsCredentials::Psk { file } => psk(&mut b, file)?,
        }
        Ok(Self { ctx: b.build() })
    }

    /// Runs the server side of the handshake on `plain` by `deadline`. Returns the
    /// encrypted stream and a description of the session for the log.
    pub(crate) fn accept(
        &self,
        plain: OwnedFd,
        deadline: Instant,
    ) -> Result<(TlsStream, String), NbdError> {
        let fd = plain.as_raw_fd();
        let ssl = Ssl::new(&self.ctx).map_err(|e| tls_err("session", e))?;
        let mut step = ssl.accept(Wire::default());
        let s = loop {
            let mut mid = match step {
                Ok(mut s) => {
                    flush_handshake(fd, s.get_mut(), deadline)?;
                    break s;
                }
                Err(HandshakeError::WouldBlock(mid)) => mid,
                Err(HandshakeError::Failure(mut mid)) => {
                    // Best effort: the alert tells the client why.
                    let _ = flush_handshake(fd, mid.get_mut(), deadline);
                    return Err(handshake_failed(HandshakeError::Failure(mid)));
                }
                Err(e) => return Err(handshake_failed(e)),
            };
            flush_handshake(fd, mid.get_mut(), deadline)?;
            // The wire never blocks a write, so OpenSSL waits only for the client.
            let mut received = Vec::new();
            loop {
                match recv_into(fd, &mut received, false) {
                    Ok(0) => mid.get_mut().set_eof(),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        poll_fd(fd, libc::POLLIN, Some(deadline))
                            .map_err(|e| tls_err("handshake not finished in time", e))?;
                        continue;
                    }
                    Err(e) => return Err(tls_err("handshake", e)),
                }
                break;
            }
            mid.get_mut().feed(&mut received);
            step = mid.handshake();
        };
        let about = describe(s.ssl());
        Ok((TlsStream::new(s, plain), about))
    }
}

/// Sends what the handshake wrote, by `deadline`.
fn flush_handshake(fd: RawFd, wire: &mut Wire, deadline: Instant) -> Result<(), NbdError> {
    let mut out = Vec::new();
    wire.drain_to(&mut out);
    send_all_by(fd, &out, Some(deadline)).map_err(|e| tls_err("handshake not finished in time", e))
}

fn handshake_failed(e: HandshakeError<Wire>) -> NbdError {
    let why = match &e {
        HandshakeError::Failure(m) => match m.error().ssl_error() {
            Some(stack) => stack.to_string(),
            None => m.error().to_string(),
        },
        HandshakeError::SetupFailure(e) => e.to_string(),
        HandshakeError::WouldBlock(m) => m.error().to_string(),
    };
    NbdError::Tls(format!("handshake failed: {why}"))
}

fn describe(ssl: &SslRef) -> String {
    let cipher = ssl.current_cipher().map_or("?", |c| c.name());
    let who = if let Some(id) = ssl.psk_identity() {
        format!("PSK identity {:?}", String::from_utf8_lossy(id))
    } else if let Some(cert) = ssl.peer_certificate() {
        let names: Vec<String> = cert
            .subject_name()
            .entries()
            .map(|e| String::from_utf8_lossy(e.data().as_slice()).into_owned())
            .collect();
        format!("client certificate {}", names.join(", "))
    } else {
        "no client authentication".to_string()
    };
    format!("{} {cipher}, {who}", ssl.version_str())
}

fn x509(b: &mut SslContextBuilder, dir: &Path, verify_peer: bool) -> Result<(), NbdError> {
    let file = |name: &str| -> Result<PathBuf, NbdError> {
        let p = dir.join(name);
        if !p.is_file() {
            return Err(NbdError::Config(format!(
                "--tls-certificates {}: {name} is missing",
                dir.display()
            )));
        }
        Ok(p)
    };
    let cert = file("server-cert.pem")?;
    let key = file("server-key.pem")?;
    b.set_certificate_chain_file(&cert)
        .map_err(|e| tls_err(&format!("{}", cert.display()), e))?;
    let pem = std::fs::read(&key).map_err(|e| tls_err(&format!("{}", key.display()), e))?;
    let pkey =
        PKey::private_key_from_pem(&pem).map_err(|e| tls_err(&format!("{}", key.display()), e))?;
    b.set_private_key(&pkey)
        .map_err(|e| tls_err(&format!("{}", key.display()), e))?;
    b.check_private_key()
        .map_err(|e| tls_err("server-key.pem does not match server-cert.pem", e))?;
    warn_if_readable_by_others(&key, "--tls-certificates server-key.pem");
    if verify_peer {
        let ca = file("ca-cert.pem")?;
        b.set_ca_file(&ca)
            .map_err(|e| tls_err(&format!("{}", ca.display()), e))?;
        let names = X509Name::load_client_ca_file(&ca)
            .map_err(|e| tls_err(&format!("{}", ca.display()), e))?;
        b.set_client_ca_list(names);
        // A client without a certificate fails the handshake, as one with a bad one.
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    } else {
        b.set_verify(SslVerifyMode::NONE);
    }
    Ok(())
}

fn psk(b: &mut SslContextBuilder, file: &Path) -> Result<(), NbdError> {
    let keys = Arc::new(read_psk_file(file)?);
    warn_if_readable_by_others(file, "--tls-psk");
    b.set_cipher_list(PSK_TLS12_CIPHERS)
        .map_err(|e| tls_err("PSK cipher suites", e))?;
    b.set_psk_server_callback(move |_ssl, identity, out| {
        // An unknown identity gets no key: the handshake then fails (there is no
        // certificate to fall back on).
        let key = identity.and_then(|id| keys.get(id));
        match key {
            Some(k) if k.len() <= out.len() => {
                out[..k.len()].copy_from_slice(k);
                Ok(k.len())
            }
            _ => Ok(0),
        }
    });
    Ok(())
}

fn warn_if_readable_by_others(path: &Path, what: &str) {
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            eprintln!(
                "dhrd nbd: warning: {what} {} can be read by other users (chmod 600 it)",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn psk_files_are_parsed_strictly() {
        let dir = std::env::temp_dir().join(format!("dhrd-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let f = dir.join("keys.psk");
        let write = |s: &str| std::fs::write(&f, s).unwrap_or_else(|e| panic!("{e}"));
        write("alice:00ff10\n\nbob:abcd\r\n");
        let keys = read_psk_file(&f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(keys.get(&b"alice"[..]), Some(&vec![0, 0xff, 0x10]));
        // Split at the first colon: the rest is the key, which must then be hex.
        write("bob:with:colon:abcd\n");
        assert!(read_psk_file(&f).is_err());
        for bad in [
            "alice\n",
            ":00\n",
            "a:0g\n",
            "a:abc\n",
            "a:\n",
            "a:00\na:11\n",
            "\n",
        ] {
            write(bad);
            let e = read_psk_file(&f);
            assert!(e.is_err(), "{bad:?} was accepted");
        }
        write("a:00\nb:zz\n");
        let e = read_psk_file(&f)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("line 2"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
