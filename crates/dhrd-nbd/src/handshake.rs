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
//! - the number of options per connection is bounded ([`MAX_OPTIONS_PER_HANDSHAKE`]).

use crate::limits::{
    MAX_OPTIONS_PER_HANDSHAKE, MAX_OPTION_BYTES, MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES,
    PREFERRED_BLOCK_BYTES,
};
use crate::proto::*;
use crate::NbdError;
use std::io::{Read, Write};

/// What the server tells clients about its one export.
#[derive(Debug, Clone)]
pub struct ExportView {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub tflags: u16,
}

/// How negotiation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Enter the transmission phase with this reply framing.
    Transmission(Framing),
    /// The client aborted or disconnected cleanly during negotiation.
    Closed,
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

/// Runs the negotiation on `r`/`w` (two halves of one connection). `w` is flushed before
/// every read so buffered writers work too.
pub fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    view: &ExportView,
) -> Result<Outcome, NbdError> {
    w.write_all(&encode_greeting())?;
    w.flush()?;
    let mut cflags = [0u8; 4];
    if !read_or_eof(r, &mut cflags)? {
        return Ok(Outcome::Closed);
    }
    let cflags = u32::from_be_bytes(cflags);
    if cflags & !CLIENT_FLAGS_KNOWN != 0 {
        return Err(NbdError::Protocol(format!(
            "unknown client flags {cflags:#x}"
        )));
    }
    let no_zeroes = cflags & CLIENT_FLAG_NO_ZEROES != 0;
    let mut framing = Framing::Simple;

    for _ in 0..MAX_OPTIONS_PER_HANDSHAKE {
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
        match h.option {
            OPT_EXPORT_NAME => {
                if !name_matches(view, &payload) {
                    // The protocol has no error reply for EXPORT_NAME: closing is the
                    // only way to refuse.
                    return Err(NbdError::Protocol("unknown export name".into()));
                }
                w.write_all(&encode_export_name_reply(view.size, view.tflags, no_zeroes))?;
                w.flush()?;
                return Ok(Outcome::Transmission(framing));
            }
            OPT_ABORT => {
                // The client may already have closed; a failed ACK changes nothing.
                let _ = send_reply(w, h.option, REP_ACK, &[]).and_then(|_| Ok(w.flush()?));
                return Ok(Outcome::Closed);
            }
            OPT_LIST => {
                if !payload.is_empty() {
                    send_reply(w, h.option, REP_ERR_INVALID, &[])?;
                    continue;
                }
                send_reply(
                    w,
                    h.option,
                    REP_SERVER,
                    &encode_rep_server(&view.name, &view.description),
                )?;
                send_reply(w, h.option, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let Some(req) = decode_info_request(&payload) else {
                    send_reply(w, h.option, REP_ERR_INVALID, &[])?;
                    continue;
                };
                if !name_matches(view, &req.name) {
                    send_reply(w, h.option, REP_ERR_UNKNOWN, &[])?;
                    continue;
                }
                send_reply(
                    w,
                    h.option,
                    REP_INFO,
                    &encode_info_export(view.size, view.tflags),
                )?;
                // Always sent: the protocol lets a server volunteer block sizes, and
                // clients then never send payloads above our maximum.
                send_reply(
                    w,
                    h.option,
                    REP_INFO,
                    &encode_info_block_size(
                        MIN_BLOCK_BYTES,
                        PREFERRED_BLOCK_BYTES,
                        MAX_PAYLOAD_BYTES,
                    ),
                )?;
                if req.requests.contains(&INFO_NAME) {
                    send_reply(
                        w,
                        h.option,
                        REP_INFO,
                        &encode_info_string(INFO_NAME, &view.name),
                    )?;
                }
                if req.requests.contains(&INFO_DESCRIPTION) && !view.description.is_empty() {
                    send_reply(
                        w,
                        h.option,
                        REP_INFO,
                        &encode_info_string(INFO_DESCRIPTION, &view.description),
                    )?;
                }
                send_reply(w, h.option, REP_ACK, &[])?;
                if h.option == OPT_GO {
                    w.flush()?;
                    return Ok(Outcome::Transmission(framing));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !payload.is_empty() {
                    send_reply(w, h.option, REP_ERR_INVALID, &[])?;
                    continue;
                }
                framing = Framing::Structured;
                send_reply(w, h.option, REP_ACK, &[])?;
            }
            // TLS is not offered (documented in docs/nbd.md); meta contexts (block
            // status) are not implemented. Both, like any unknown option, get ERR_UNSUP.
            _ => send_reply(w, h.option, REP_ERR_UNSUP, &[])?,
        }
    }
    Err(NbdError::Protocol(format!(
        "more than {MAX_OPTIONS_PER_HANDSHAKE} options without NBD_OPT_GO"
    )))
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
        assert_eq!(res.ok(), Some(Outcome::Transmission(Framing::Structured)));
        let r = replies(&out);
        let types: Vec<_> = r.iter().map(|x| (x.0, x.1)).collect();
        assert_eq!(
            types,
            vec![
                (OPT_STRUCTURED_REPLY, REP_ACK),
                (OPT_SET_META_CONTEXT, REP_ERR_UNSUP),
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
        assert_eq!(res.ok(), Some(Outcome::Transmission(Framing::Simple)));
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
