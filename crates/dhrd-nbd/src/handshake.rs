//! Fixed-newstyle negotiation: greeting, client flags, option haggling, up to the start of
//! the transmission phase.
//!
//! Invariants:
//! - an option payload is read only after its length was checked against
//!   [`MAX_OPTION_BYTES`]; a larger one, a bad option magic or unknown client flags close
//!   the connection (the protocol allows it, and the stream cannot be trusted after them);
//! - every option other than EXPORT_NAME and ABORT gets exactly one final reply (ACK or an
//!   error), preceded by any NBD_REP_INFO / NBD_REP_SERVER replies;
//! - unknown options get NBD_REP_ERR_UNSUP and negotiation continues;
//! - the number of options per connection is bounded ([`MAX_OPTIONS_PER_HANDSHAKE`]),
//!   counted across a TLS upgrade;
//! - with [`TlsPolicy::Require`], nothing but NBD_OPT_STARTTLS and NBD_OPT_ABORT is
//!   answered before the TLS handshake: every other option gets NBD_REP_ERR_TLS_REQD, and
//!   NBD_OPT_EXPORT_NAME (which has no error reply) closes the connection. No export
//!   information, and no way into the transmission phase, without TLS;
//! - nothing negotiated before a STARTTLS survives it (structured replies, meta
//!   contexts), as the protocol requires: those options may have come from a man in the
//!   middle. The caller makes sure no plaintext byte sent after the STARTTLS is read as
//!   if it had come through TLS (`server.rs`);
//! - block status is offered only after NBD_OPT_SET_META_CONTEXT selected
//!   `base:allocation`, which requires structured replies first.

use crate::limits::{
    MAX_OPTIONS_PER_HANDSHAKE, MAX_OPTION_BYTES, MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES,
    PREFERRED_BLOCK_BYTES,
};
use crate::proto::*;
use crate::NbdError;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the server tells clients about its one export.
#[derive(Debug, Clone)]
pub struct ExportView {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub tflags: u16,
}

/// Whether a connection may or must upgrade to TLS (the protocol's NOTLS, SELECTIVETLS
/// with every export optional, and FORCEDTLS modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// STARTTLS is refused (NBD_REP_ERR_POLICY).
    Off,
    /// STARTTLS is accepted; plaintext clients are served too.
    On,
    /// Nothing but STARTTLS and ABORT is answered before the TLS handshake.
    Require,
}

/// Context id of `base:allocation` (any non-zero value; clients treat it as opaque).
pub const BASE_ALLOCATION_ID: u32 = 1;

/// What the transmission phase needs from the negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    pub framing: Framing,
    /// The context id of `base:allocation` when the client selected it (block status).
    pub block_status: Option<u32>,
}

/// How negotiation ended, or paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Enter the transmission phase.
    Transmission(Agreed),
    /// The client aborted or disconnected cleanly during negotiation.
    Closed,
    /// NBD_OPT_STARTTLS was acknowledged: the caller runs the TLS handshake on the socket,
    /// calls [`Negotiation::tls_started`] and continues with [`Negotiation::haggle`] over
    /// the encrypted stream.
    StartTls,
}

/// The state of one connection's option haggling, kept across the TLS upgrade.
#[derive(Debug)]
pub struct Negotiation {
    policy: TlsPolicy,
    tls: bool,
    no_zeroes: bool,
    framing: Framing,
    /// Export name of the last NBD_OPT_SET_META_CONTEXT that selected `base:allocation`.
    meta: Option<Vec<u8>>,
    options: usize,
    /// Options answered NBD_REP_ERR_TLS_REQD.
    pub tls_refusals: u64,
    /// Where the server counts them too, as they happen.
    refusal_counter: Option<Arc<AtomicU64>>,
}

/// Whether a client-supplied export name selects our export. The empty name is the
/// protocol's "default export".
fn name_matches(view: &ExportView, name: &[u8]) -> bool {
    name.is_empty() || name == view.name.as_bytes()
}

fn send_reply<W: Write>(
    w: &mut W,
    option: u32,
    reply: u32,
    payload: &[u8],
) -> Result<(), NbdError> {
    let mut msg = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + payload.len());
    msg.extend_from_slice(&encode_option_reply_header(
        option,
        reply,
        payload.len() as u32,
    ));
    msg.extend_from_slice(payload);
    w.write_all(&msg)?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the stream ended before the first byte
/// (a clean disconnect between messages).
fn read_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<bool, NbdError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => {
                return Err(NbdError::Protocol(format!(
                    "stream ended after {done} of {} bytes",
                    buf.len()
                )))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Runs a whole negotiation without TLS on `r`/`w` (two halves of one connection).
pub fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    view: &ExportView,
) -> Result<Outcome, NbdError> {
    match Negotiation::greet(r, w, TlsPolicy::Off)? {
        Some(mut n) => n.haggle(r, w, view),
        None => Ok(Outcome::Closed),
    }
}

impl Negotiation {
    /// Sends the greeting and reads the client's flags; `None` if the client left.
    pub fn greet<R: Read, W: Write>(
        r: &mut R,
        w: &mut W,
        policy: TlsPolicy,
    ) -> Result<Option<Self>, NbdError> {
        w.write_all(&encode_greeting())?;
        w.flush()?;
        let mut cflags = [0u8; 4];
        if !read_or_eof(r, &mut cflags)? {
            return Ok(None);
        }
        let cflags = u32::from_be_bytes(cflags);
        if cflags & !CLIENT_FLAGS_KNOWN != 0 {
            return Err(NbdError::Protocol(format!(
                "unknown client flags {cflags:#x}"
            )));
        }
        Ok(Some(Self {
            policy,
            tls: false,
            no_zeroes: cflags & CLIENT_FLAG_NO_ZEROES != 0,
            framing: Framing::Simple,
            meta: None,
            options: 0,
            tls_refusals: 0,
            refusal_counter: None,
        }))
    }

    /// The TLS handshake after NBD_OPT_STARTTLS succeeded. The protocol says no option
    /// negotiated in plaintext survives it (a man in the middle may have sent them).
    pub fn tls_started(&mut self) {
        self.tls = true;
        self.framing = Framing::Simple;
        self.meta = None;
    }

    /// Counts every option refused for want of TLS in `counter` too, when it is refused
    /// (the server's statistics).
    pub fn count_refusals_in(&mut self, counter: Arc<AtomicU64>) {
        self.refusal_counter = Some(counter);
    }

    /// Whether the connection runs over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Haggles options until the transmission phase, a close or a STARTTLS. `w` is
    /// flushed before every read so buffered writers work too.
    pub fn haggle<R: Read, W: Write>(
        &mut self,
        r: &mut R,
        w: &mut W,
        view: &ExportView,
    ) -> Result<Outcome, NbdError> {
        while self.options < MAX_OPTIONS_PER_HANDSHAKE {
            self.options += 1;
            w.flush()?;
            let mut hdr = [0u8; OPTION_HEADER_BYTES];
            if !read_or_eof(r, &mut hdr)? {
                return Ok(Outcome::Closed);
            }
            let h = decode_option_header(&hdr);
            if h.magic != IHAVEOPT {
                return Err(NbdError::BadMagic {
                    expected: IHAVEOPT,
                    found: h.magic,
                });
            }
            if h.length > MAX_OPTION_BYTES {
                return Err(NbdError::PayloadTooLarge {
                    len: h.length.into(),
                    max: MAX_OPTION_BYTES.into(),
                });
            }
            let mut payload = vec![0u8; h.length as usize];
            if !read_or_eof(r, &mut payload)? && !payload.is_empty() {
                return Ok(Outcome::Closed);
            }
            if let Some(outcome) = self.option(w, view, h.option, &payload)? {
                if outcome != Outcome::StartTls {
                    w.flush()?;
                }
                return Ok(outcome);
            }
        }
        Err(NbdError::Protocol(format!(
            "more than {MAX_OPTIONS_PER_HANDSHAKE} options without NBD_OPT_GO"
        )))
    }

    /// Answers one option; `Some` when negotiation ends or pauses with it.
    fn option<W: Write>(
        &mut self,
        w: &mut W,
        view: &ExportView,
        option: u32,
        payload: &[u8],
    ) -> Result<Option<Outcome>, NbdError> {
        if self.policy == TlsPolicy::Require
            && !self.tls
            && !matches!(option, OPT_STARTTLS | OPT_ABORT)
        {
            if option == OPT_EXPORT_NAME {
                // It cannot be answered with an error: the protocol says to close.
                return Err(NbdError::Protocol(
                    "NBD_OPT_EXPORT_NAME without TLS, which this server requires".into(),
                ));
            }
            self.tls_refusals += 1;
            if let Some(c) = &self.refusal_counter {
                c.fetch_add(1, Ordering::Relaxed);
            }
            send_reply(w, option, REP_ERR_TLS_REQD, &[])?;
            return Ok(None);
        }
        match option {
            OPT_EXPORT_NAME => {
                if !name_matches(view, payload) {
                    // The protocol has no error reply for EXPORT_NAME: closing is the
                    // only way to refuse.
                    return Err(NbdError::Protocol("unknown export name".into()));
                }
                w.write_all(&encode_export_name_reply(
                    view.size,
                    view.tflags,
                    self.no_zeroes,
                ))?;
                return Ok(Some(Outcome::Transmission(self.agreed())));
            }
            OPT_ABORT => {
                // The client may already have closed; a failed ACK changes nothing.
                let _ = send_reply(w, option, REP_ACK, &[]).and_then(|_| Ok(w.flush()?));
                return Ok(Some(Outcome::Closed));
            }
            OPT_STARTTLS => return self.starttls(w, payload),
            OPT_LIST if !payload.is_empty() => send_reply(w, option, REP_ERR_INVALID, &[])?,
            OPT_LIST => {
                send_reply(
                    w,
                    option,
                    REP_SERVER,
                    &encode_rep_server(&view.name, &view.description),
                )?;
                send_reply(w, option, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                if self.info(w, view, option, payload)? && option == OPT_GO {
                    return Ok(Some(Outcome::Transmission(self.agreed())));
                }
            }
            OPT_STRUCTURED_REPLY if !payload.is_empty() => {
                send_reply(w, option, REP_ERR_INVALID, &[])?
            }
            OPT_STRUCTURED_REPLY => {
                self.framing = Framing::Structured;
                send_reply(w, option, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(w, view, option, payload)?
            }
            // Extended headers and anything unknown.
            _ => send_reply(w, option, REP_ERR_UNSUP, &[])?,
        }
        Ok(None)
    }

    fn agreed(&self) -> Agreed {
        Agreed {
            framing: self.framing,
            block_status: self.meta.as_ref().map(|_| BASE_ALLOCATION_ID),
        }
    }

    fn starttls<W: Write>(
        &mut self,
        w: &mut W,
        payload: &[u8],
    ) -> Result<Option<Outcome>, NbdError> {
        let reply = match self.policy {
            _ if !payload.is_empty() => REP_ERR_INVALID,
            // TLS is implemented but not configured for this server.
            TlsPolicy::Off => REP_ERR_POLICY,
            // The protocol's answer to a second STARTTLS.
            _ if self.tls => REP_ERR_INVALID,
            TlsPolicy::On | TlsPolicy::Require => {
                send_reply(w, OPT_STARTTLS, REP_ACK, &[])?;
                w.flush()?;
                return Ok(Some(Outcome::StartTls));
            }
        };
        send_reply(w, OPT_STARTTLS, reply, &[])?;
        Ok(None)
    }

    /// NBD_OPT_INFO / NBD_OPT_GO; true when it succeeded (ACK sent).
    fn info<W: Write>(
        &mut self,
        w: &mut W,
        view: &ExportView,
        option: u32,
        payload: &[u8],
    ) -> Result<bool, NbdError> {
        let Some(req) = decode_info_request(payload) else {
            send_reply(w, option, REP_ERR_INVALID, &[])?;
            return Ok(false);
        };
        if !name_matches(view, &req.name) {
            send_reply(w, option, REP_ERR_UNKNOWN, &[])?;
            return Ok(false);
        }
        send_reply(
            w,
            option,
            REP_INFO,
            &encode_info_export(view.size, view.tflags),
        )?;
        // Always sent: the protocol lets a server volunteer block sizes, and clients then
        // never send payloads above our maximum.
        send_reply(
            w,
            option,
            REP_INFO,
            &encode_info_block_size(MIN_BLOCK_BYTES, PREFERRED_BLOCK_BYTES, MAX_PAYLOAD_BYTES),
        )?;
        if req.requests.contains(&INFO_NAME) {
            send_reply(
                w,
                option,
                REP_INFO,
                &encode_info_string(INFO_NAME, &view.name),
            )?;
        }
        if req.requests.contains(&INFO_DESCRIPTION) && !view.description.is_empty() {
            send_reply(
                w,
                option,
                REP_INFO,
                &encode_info_string(INFO_DESCRIPTION, &view.description),
            )?;
        }
        send_reply(w, option, REP_ACK, &[])?;
        Ok(true)
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT. The one context offered is
    /// `base:allocation`; queries of other namespaces are ignored, as the protocol says.
    fn meta_context<W: Write>(
        &mut self,
        w: &mut W,
        view: &ExportView,
        option: u32,
        payload: &[u8],
    ) -> Result<(), NbdError> {
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            // A SET replaces the previous selection even when it fails.
            self.meta = None;
        }
        let req = decode_meta_context_request(payload);
        let Some(req) = req.filter(|_| !set || self.framing == Framing::Structured) else {
            // Malformed, or SET before structured replies (which block status needs).
            send_reply(w, option, REP_ERR_INVALID, &[])?;
            return Ok(());
        };
        if !name_matches(view, &req.name) {
            send_reply(w, option, REP_ERR_UNKNOWN, &[])?;
            return Ok(());
        }
        let base = META_BASE_ALLOCATION.as_bytes();
        let selected = req.queries.iter().any(|q| q == base)
            // Listing: no query lists everything, "base:" the whole namespace.
            || (!set && (req.queries.is_empty() || req.queries.iter().any(|q| q == b"base:")));
        if selected {
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            send_reply(
                w,
                option,
                REP_META_CONTEXT,
                &encode_rep_meta_context(id, META_BASE_ALLOCATION),
            )?;
            if set {
                self.meta = Some(req.name);
            }
        }
        send_reply(w, option, REP_ACK, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn view() -> ExportView {
        ExportView {
            name: "disk".into(),
            description: "test disk".into(),
            size: 1 << 20,
            tflags: TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH,
        }
    }

    fn opt(option: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&option.to_be_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn info_payload(name: &str, reqs: &[u16]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&(name.len() as u32).to_be_bytes());
        p.extend_from_slice(name.as_bytes());
        p.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            p.extend_from_slice(&r.to_be_bytes());
        }
        p
    }

    /// Splits the server's output after the greeting into (option, reply type, payload).
    fn replies(out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut at = 18;
        while at + OPTION_REPLY_HEADER_BYTES <= out.len() {
            let magic = u64::from_be_bytes(out[at..at + 8].try_into().unwrap_or_default());
            if magic != REPLY_MAGIC {
                break;
            }
            let o = u32::from_be_bytes(out[at + 8..at + 12].try_into().unwrap_or_default());
            let t = u32::from_be_bytes(out[at + 12..at + 16].try_into().unwrap_or_default());
            let l =
                u32::from_be_bytes(out[at + 16..at + 20].try_into().unwrap_or_default()) as usize;
            v.push((o, t, out[at + 20..at + 20 + l].to_vec()));
            at += 20 + l;
        }
        v
    }

    fn agreed(framing: Framing, block_status: Option<u32>) -> Agreed {
        Agreed {
            framing,
            block_status,
        }
    }

    fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&(name.len() as u32).to_be_bytes());
        p.extend_from_slice(name.as_bytes());
        p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            p.extend_from_slice(&(q.len() as u32).to_be_bytes());
            p.extend_from_slice(q.as_bytes());
        }
        p
    }

    /// Runs a negotiation under `policy`; a STARTTLS is "completed" at once, as if the
    /// handshake had succeeded, and haggling goes on on the same bytes.
    fn run_tls(policy: TlsPolicy, client: Vec<u8>) -> (Result<Outcome, NbdError>, Vec<u8>, u64) {
        let mut r = Cursor::new(client);
        let mut w = Vec::new();
        let mut n = match Negotiation::greet(&mut r, &mut w, policy) {
            Ok(Some(n)) => n,
            Ok(None) => return (Ok(Outcome::Closed), w, 0),
            Err(e) => return (Err(e), w, 0),
        };
        loop {
            match n.haggle(&mut r, &mut w, &view()) {
                Ok(Outcome::StartTls) => n.tls_started(),
                res => return (res, w, n.tls_refusals),
            }
        }
    }

    fn run(client: Vec<u8>) -> (Result<Outcome, NbdError>, Vec<u8>) {
        let mut r = Cursor::new(client);
        let mut w = Vec::new();
        let res = negotiate(&mut r, &mut w, &view());
        (res, w)
    }

    fn flags(f: u32) -> Vec<u8> {
        f.to_be_bytes().to_vec()
    }

    #[test]
    fn go_with_structured_replies() {
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        c.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        c.extend(opt(OPT_SET_META_CONTEXT, b"whatever"));
        c.extend(opt(
            OPT_GO,
            &info_payload("disk", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]),
        ));
        let (res, out) = run(c);
        assert_eq!(
            res.ok(),
            Some(Outcome::Transmission(agreed(Framing::Structured, None)))
        );
        let r = replies(&out);
        let types: Vec<_> = r.iter().map(|x| (x.0, x.1)).collect();
        assert_eq!(
            types,
            vec![
                (OPT_STRUCTURED_REPLY, REP_ACK),
                (OPT_SET_META_CONTEXT, REP_ERR_INVALID),
                (OPT_GO, REP_INFO),
                (OPT_GO, REP_INFO),
                (OPT_GO, REP_INFO),
                (OPT_GO, REP_INFO),
                (OPT_GO, REP_ACK),
            ]
        );
        assert_eq!(r[2].2, encode_info_export(1 << 20, view().tflags).to_vec());
        assert_eq!(r[3].2, encode_info_block_size(1, 4096, 32 << 20).to_vec());
        assert_eq!(&r[4].2[2..], b"disk");
        assert_eq!(&r[5].2[2..], b"test disk");
    }

    #[test]
    fn info_list_then_export_name() {
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_LIST, &[]));
        c.extend(opt(OPT_INFO, &info_payload("nope", &[])));
        c.extend(opt(OPT_INFO, &info_payload("", &[])));
        c.extend(opt(OPT_INFO, &[1, 2, 3])); // malformed
        c.extend(opt(999, &[]));
        c.extend(opt(OPT_EXPORT_NAME, b"disk"));
        let (res, out) = run(c);
        assert_eq!(
            res.ok(),
            Some(Outcome::Transmission(agreed(Framing::Simple, None)))
        );
        let r = replies(&out);
        let types: Vec<_> = r.iter().map(|x| (x.0, x.1)).collect();
        assert_eq!(
            types,
            vec![
                (OPT_LIST, REP_SERVER),
                (OPT_LIST, REP_ACK),
                (OPT_INFO, REP_ERR_UNKNOWN),
                (OPT_INFO, REP_INFO),
                (OPT_INFO, REP_INFO),
                (OPT_INFO, REP_ACK),
                (OPT_INFO, REP_ERR_INVALID),
                (999, REP_ERR_UNSUP),
            ]
        );
        assert_eq!(r[0].2, encode_rep_server("disk", "test disk"));
        // EXPORT_NAME reply without NO_ZEROES: size, flags, 124 zero bytes.
        let tail = &out[out.len() - 134..];
        assert_eq!(&tail[..8], &(1u64 << 20).to_be_bytes());
        assert!(tail[10..].iter().all(|&b| b == 0));
    }

    #[test]
    fn abort_and_eof() {
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_ABORT, &[]));
        let (res, out) = run(c);
        assert_eq!(res.ok(), Some(Outcome::Closed));
        assert_eq!(replies(&out)[0].1, REP_ACK);
        let (res, _) = run(flags(CLIENT_FLAG_FIXED_NEWSTYLE));
        assert_eq!(res.ok(), Some(Outcome::Closed));
        let (res, _) = run(vec![]);
        assert_eq!(res.ok(), Some(Outcome::Closed));
    }

    #[test]
    fn meta_contexts_select_base_allocation() {
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        // SET before structured replies is invalid; LIST is answered anyway.
        c.extend(opt(
            OPT_SET_META_CONTEXT,
            &meta_payload("", &["base:allocation"]),
        ));
        c.extend(opt(OPT_LIST_META_CONTEXT, &meta_payload("disk", &[])));
        c.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        c.extend(opt(
            OPT_LIST_META_CONTEXT,
            &meta_payload("", &["base:", "x-other:y"]),
        ));
        c.extend(opt(
            OPT_SET_META_CONTEXT,
            &meta_payload("nope", &["base:allocation"]),
        ));
        c.extend(opt(
            OPT_SET_META_CONTEXT,
            &meta_payload("", &["base:", "qemu:x"]),
        ));
        c.extend(opt(
            OPT_SET_META_CONTEXT,
            &meta_payload("disk", &["base:allocation"]),
        ));
        c.extend(opt(OPT_GO, &info_payload("", &[])));
        let (res, out) = run(c);
        assert_eq!(
            res.ok(),
            Some(Outcome::Transmission(agreed(
                Framing::Structured,
                Some(BASE_ALLOCATION_ID)
            )))
        );
        let r = replies(&out);
        let types: Vec<_> = r.iter().map(|x| (x.0, x.1)).collect();
        assert_eq!(
            types[..10],
            [
                (OPT_SET_META_CONTEXT, REP_ERR_INVALID),
                (OPT_LIST_META_CONTEXT, REP_META_CONTEXT),
                (OPT_LIST_META_CONTEXT, REP_ACK),
                (OPT_STRUCTURED_REPLY, REP_ACK),
                (OPT_LIST_META_CONTEXT, REP_META_CONTEXT),
                (OPT_LIST_META_CONTEXT, REP_ACK),
                (OPT_SET_META_CONTEXT, REP_ERR_UNKNOWN),
                // "base:" selects nothing in SET; unknown namespaces are ignored.
                (OPT_SET_META_CONTEXT, REP_ACK),
                (OPT_SET_META_CONTEXT, REP_META_CONTEXT),
                (OPT_SET_META_CONTEXT, REP_ACK),
            ]
        );
        assert_eq!(r[1].2, encode_rep_meta_context(0, "base:allocation"));
        assert_eq!(
            r[8].2,
            encode_rep_meta_context(BASE_ALLOCATION_ID, "base:allocation")
        );
        // A later SET that selects nothing clears the selection.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        c.extend(opt(
            OPT_SET_META_CONTEXT,
            &meta_payload("", &["base:allocation"]),
        ));
        c.extend(opt(OPT_SET_META_CONTEXT, &meta_payload("", &[])));
        c.extend(opt(OPT_GO, &info_payload("", &[])));
        let (res, _) = run(c);
        assert_eq!(
            res.ok(),
            Some(Outcome::Transmission(agreed(Framing::Structured, None)))
        );
    }

    #[test]
    fn require_answers_nothing_but_starttls_before_tls() {
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_LIST, &[]));
        c.extend(opt(OPT_INFO, &info_payload("", &[])));
        c.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        c.extend(opt(OPT_GO, &info_payload("", &[])));
        c.extend(opt(0x7777, &[]));
        c.extend(opt(OPT_ABORT, &[]));
        let (res, out, refused) = run_tls(TlsPolicy::Require, c);
        assert_eq!(res.ok(), Some(Outcome::Closed));
        assert_eq!(refused, 5);
        let types: Vec<_> = replies(&out).iter().map(|x| x.1).collect();
        assert_eq!(
            types,
            [REP_ERR_TLS_REQD; 5]
                .iter()
                .copied()
                .chain([REP_ACK])
                .collect::<Vec<_>>()
        );
        // EXPORT_NAME cannot be refused with an error: the connection closes.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_EXPORT_NAME, b""));
        let (res, out, _) = run_tls(TlsPolicy::Require, c);
        assert!(res.is_err());
        assert!(replies(&out).is_empty(), "no export data before TLS");
        assert_eq!(out.len(), 18, "only the greeting was sent");
    }

    #[test]
    fn starttls_resets_what_was_negotiated_in_plaintext() {
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        c.extend(opt(
            OPT_SET_META_CONTEXT,
            &meta_payload("", &["base:allocation"]),
        ));
        c.extend(opt(OPT_STARTTLS, b"x")); // data with STARTTLS: invalid
        c.extend(opt(OPT_STARTTLS, &[]));
        c.extend(opt(OPT_STARTTLS, &[])); // a second upgrade: invalid
        c.extend(opt(OPT_GO, &info_payload("", &[])));
        let (res, out, refused) = run_tls(TlsPolicy::On, c);
        assert_eq!(
            res.ok(),
            Some(Outcome::Transmission(agreed(Framing::Simple, None)))
        );
        assert_eq!(refused, 0);
        let types: Vec<_> = replies(&out).iter().map(|x| (x.0, x.1)).collect();
        assert_eq!(
            types[3..6],
            [
                (OPT_STARTTLS, REP_ERR_INVALID),
                (OPT_STARTTLS, REP_ACK),
                (OPT_STARTTLS, REP_ERR_INVALID)
            ]
        );
        // Without TLS configured, STARTTLS is refused by policy and haggling goes on.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_STARTTLS, &[]));
        c.extend(opt(OPT_GO, &info_payload("", &[])));
        let (res, out, _) = run_tls(TlsPolicy::Off, c);
        assert_eq!(
            res.ok(),
            Some(Outcome::Transmission(agreed(Framing::Simple, None)))
        );
        assert_eq!(replies(&out)[0].1, REP_ERR_POLICY);
    }

    #[test]
    fn hostile_negotiation_closes() {
        // Unknown client flags.
        let (res, _) = run(flags(1 << 7));
        assert!(matches!(res, Err(NbdError::Protocol(_))));
        // Bad option magic.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        let mut bad = opt(OPT_LIST, &[]);
        bad[0] ^= 0xff;
        c.extend(bad);
        let (res, _) = run(c);
        assert!(matches!(res, Err(NbdError::BadMagic { .. })));
        // Oversized option payload: refused before allocating.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(&IHAVEOPT.to_be_bytes());
        c.extend(&OPT_GO.to_be_bytes());
        c.extend(&u32::MAX.to_be_bytes());
        let (res, _) = run(c);
        assert!(matches!(res, Err(NbdError::PayloadTooLarge { .. })));
        // Truncated option payload.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        let o = opt(OPT_GO, &info_payload("disk", &[]));
        c.extend(&o[..o.len() - 3]);
        let (res, _) = run(c);
        assert!(matches!(res, Err(NbdError::Protocol(_))));
        // Unknown export via EXPORT_NAME.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        c.extend(opt(OPT_EXPORT_NAME, b"other"));
        let (res, _) = run(c);
        assert!(res.is_err());
        // Endless options are bounded.
        let mut c = flags(CLIENT_FLAG_FIXED_NEWSTYLE);
        for _ in 0..=MAX_OPTIONS_PER_HANDSHAKE {
            c.extend(opt(OPT_LIST, &[]));
        }
        let (res, _) = run(c);
        assert!(matches!(res, Err(NbdError::Protocol(_))));
    }
}
