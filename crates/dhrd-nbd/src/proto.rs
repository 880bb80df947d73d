//! Wire format of the NBD protocol (fixed newstyle): constants and a codec for every
//! message this server reads or writes.
//!
//! Invariants:
//! - every integer on the wire is big-endian (network byte order);
//! - decoding never allocates and never trusts a length field: callers check lengths
//!   against the bounds in [`crate::limits`] before they allocate a payload buffer;
//! - encoders write into a caller-provided buffer so a reply header and its data can leave
//!   in one `write` call (no second copy of read data).
//!
//! Names follow the protocol document (`NBD_OPT_GO` becomes `OPT_GO`, and so on) so they
//! can be checked against it line by line.

// ---- handshake ----------------------------------------------------------------------

/// "NBDMAGIC": first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": second 8 bytes the server sends, and the magic of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic that starts every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flags the server sends.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

/// Client flags (answer to the handshake flags).
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;
/// Every client flag this server understands; any other bit set means the client expects
/// something we cannot provide, and the protocol says to close.
pub const CLIENT_FLAGS_KNOWN: u32 = CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES;

/// Length of the zero padding after the NBD_OPT_EXPORT_NAME reply (unless NO_ZEROES).
pub const EXPORT_NAME_PAD_BYTES: usize = 124;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR_BIT | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR_BIT | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR_BIT | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR_BIT | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR_BIT | 6;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR_BIT | 9;

// Information types in NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// ---- transmission -------------------------------------------------------------------

pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Size of a request header on the wire.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
/// Size of a structured reply chunk header.
pub const STRUCTURED_HEADER_BYTES: usize = 20;
/// Structured read reply: chunk header plus the 8-byte offset of NBD_REPLY_TYPE_OFFSET_DATA.
pub const STRUCTURED_READ_HEADER_BYTES: usize = STRUCTURED_HEADER_BYTES + 8;
/// Largest reply header this codec writes (see [`encode_reply_header`]).
pub const MAX_REPLY_HEADER_BYTES: usize = STRUCTURED_READ_HEADER_BYTES;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
/// Payload of an NBD_REPLY_TYPE_ERROR chunk without a message: u32 error + u16 length 0.
pub const REPLY_ERROR_PAYLOAD_BYTES: usize = 6;

// The `base:allocation` meta context.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
/// Flags of one `base:allocation` extent.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
/// Bytes of one block status descriptor: u32 length, u32 flags.
pub const BLOCK_STATUS_DESCRIPTOR_BYTES: usize = 8;

// Error values on the wire (the protocol fixes these numbers; they equal Linux errnos).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Maps a host errno to the subset of values the protocol allows on the wire; anything
/// without a protocol equivalent becomes EIO, which every client treats as a plain failure.
pub fn wire_errno(host_errno: i32) -> u32 {
    match host_errno {
        libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL | libc::EFBIG => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

// ---- byte helpers -------------------------------------------------------------------

fn be_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        a.copy_from_slice(s);
    }
    u16::from_be_bytes(a)
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_be_bytes(a)
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(d) = buf.get_mut(at..at + bytes.len()) {
        d.copy_from_slice(bytes);
    }
}

// ---- handshake codec ----------------------------------------------------------------

/// The 18-byte server greeting.
pub fn encode_greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    put(&mut b, 0, &NBDMAGIC.to_be_bytes());
    put(&mut b, 8, &IHAVEOPT.to_be_bytes());
    put(
        &mut b,
        16,
        &(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes(),
    );
    b
}

/// Header of one client option: magic, option, payload length.
pub const OPTION_HEADER_BYTES: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub magic: u64,
    pub option: u32,
    pub length: u32,
}

pub fn decode_option_header(b: &[u8; OPTION_HEADER_BYTES]) -> OptionHeader {
    OptionHeader {
        magic: be_u64(b, 0),
        option: be_u32(b, 8),
        length: be_u32(b, 12),
    }
}

/// Option reply header (20 bytes) followed by nothing; the caller appends `length` bytes.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;

pub fn encode_option_reply_header(
    option: u32,
    reply_type: u32,
    length: u32,
) -> [u8; OPTION_REPLY_HEADER_BYTES] {
    let mut b = [0u8; OPTION_REPLY_HEADER_BYTES];
    put(&mut b, 0, &REPLY_MAGIC.to_be_bytes());
    put(&mut b, 8, &option.to_be_bytes());
    put(&mut b, 12, &reply_type.to_be_bytes());
    put(&mut b, 16, &length.to_be_bytes());
    b
}

/// Payload of NBD_REP_INFO / NBD_INFO_EXPORT.
pub fn encode_info_export(size: u64, tflags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    put(&mut b, 0, &INFO_EXPORT.to_be_bytes());
    put(&mut b, 2, &size.to_be_bytes());
    put(&mut b, 10, &tflags.to_be_bytes());
    b
}

/// Payload of NBD_REP_INFO / NBD_INFO_BLOCK_SIZE.
pub fn encode_info_block_size(min: u32, preferred: u32, max: u32) -> [u8; 14] {
    let mut b = [0u8; 14];
    put(&mut b, 0, &INFO_BLOCK_SIZE.to_be_bytes());
    put(&mut b, 2, &min.to_be_bytes());
    put(&mut b, 6, &preferred.to_be_bytes());
    put(&mut b, 10, &max.to_be_bytes());
    b
}

/// Payload of NBD_REP_INFO carrying a string (NBD_INFO_NAME or NBD_INFO_DESCRIPTION).
pub fn encode_info_string(info_type: u16, s: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + s.len());
    b.extend_from_slice(&info_type.to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    b
}

/// Payload of NBD_REP_SERVER for NBD_OPT_LIST: u32 name length, name, description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len() + description.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(description.as_bytes());
    b
}

/// Reply to NBD_OPT_EXPORT_NAME: size, transmission flags, optional zero padding.
pub fn encode_export_name_reply(size: u64, tflags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + EXPORT_NAME_PAD_BYTES);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&tflags.to_be_bytes());
    if !no_zeroes {
        b.resize(b.len() + EXPORT_NAME_PAD_BYTES, 0);
    }
    b
}

/// Parsed payload of NBD_OPT_INFO / NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: Vec<u8>,
    pub requests: Vec<u16>,
}

/// Parses the payload of NBD_OPT_INFO / NBD_OPT_GO: u32 name length, name, u16 count,
/// count × u16 information types. `None` when the lengths are inconsistent with the
/// payload (the server then replies NBD_REP_ERR_INVALID).
pub fn decode_info_request(p: &[u8]) -> Option<InfoRequest> {
    if p.len() < 6 {
        return None;
    }
    let name_len = be_u32(p, 0) as usize;
    let name_end = 4usize.checked_add(name_len)?;
    let name = p.get(4..name_end)?.to_vec();
    let n = be_u16(p, name_end) as usize;
    let reqs_start = name_end + 2;
    if p.len() != reqs_start.checked_add(n.checked_mul(2)?)? {
        return None;
    }
    let requests = (0..n).map(|i| be_u16(p, reqs_start + 2 * i)).collect();
    Some(InfoRequest { name, requests })
}

/// Parsed payload of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub name: Vec<u8>,
    pub queries: Vec<Vec<u8>>,
}

/// Parses the payload of the meta context options: u32 export name length, name, u32
/// query count, then each query as u32 length and bytes. `None` when the lengths do not
/// add up to the payload exactly (the server then replies NBD_REP_ERR_INVALID). The count
/// is not trusted for allocation: each query must fit in what is left of the payload.
pub fn decode_meta_context_request(p: &[u8]) -> Option<MetaContextRequest> {
    let name_len = be_u32(p, 0) as usize;
    let name_end = 4usize.checked_add(name_len)?;
    let name = p.get(4..name_end)?.to_vec();
    let count_end = name_end.checked_add(4)?;
    p.get(name_end..count_end)?;
    let count = be_u32(p, name_end);
    let mut at = count_end;
    let mut queries = Vec::new();
    for _ in 0..count {
        p.get(at..at.checked_add(4)?)?;
        let len = be_u32(p, at) as usize;
        let start = at + 4;
        let end = start.checked_add(len)?;
        queries.push(p.get(start..end)?.to_vec());
        at = end;
    }
    (at == p.len()).then_some(MetaContextRequest { name, queries })
}

/// Payload of NBD_REP_META_CONTEXT: u32 context id, then the context's name.
pub fn encode_rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

// ---- transmission codec -------------------------------------------------------------

/// One request header as read from the wire (not yet validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub magic: u32,
    pub flags: u16,
    pub cmd: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn decode_request(b: &[u8; REQUEST_HEADER_BYTES]) -> RequestHeader {
    RequestHeader {
        magic: be_u32(b, 0),
        flags: be_u16(b, 4),
        cmd: be_u16(b, 6),
        handle: be_u64(b, 8),
        offset: be_u64(b, 16),
        length: be_u32(b, 24),
    }
}

/// Encodes a request (used by the tests' raw client and the benchmark's client).
pub fn encode_request(
    flags: u16,
    cmd: u16,
    handle: u64,
    offset: u64,
    length: u32,
) -> [u8; REQUEST_HEADER_BYTES] {
    let mut b = [0u8; REQUEST_HEADER_BYTES];
    put(&mut b, 0, &REQUEST_MAGIC.to_be_bytes());
    put(&mut b, 4, &flags.to_be_bytes());
    put(&mut b, 6, &cmd.to_be_bytes());
    put(&mut b, 8, &handle.to_be_bytes());
    put(&mut b, 16, &offset.to_be_bytes());
    put(&mut b, 24, &length.to_be_bytes());
    b
}

/// Which reply framing a connection uses, fixed at the end of negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Simple,
    /// NBD_OPT_STRUCTURED_REPLY was negotiated: reads must be answered with structured
    /// chunks (the protocol forbids a simple reply to NBD_CMD_READ then).
    Structured,
}

/// Size of the header [`encode_reply_header`] writes for a reply carrying `data_len` bytes
/// of read data (`data_len > 0` only for successful reads).
pub fn reply_header_len(framing: Framing, is_read: bool, error: u32) -> usize {
    match (framing, is_read) {
        (Framing::Simple, _) | (Framing::Structured, false) => SIMPLE_REPLY_HEADER_BYTES,
        (Framing::Structured, true) if error != 0 => {
            STRUCTURED_HEADER_BYTES + REPLY_ERROR_PAYLOAD_BYTES
        }
        (Framing::Structured, true) => STRUCTURED_READ_HEADER_BYTES,
    }
}

/// Writes the reply header for one request into `out` (which must be exactly
/// [`reply_header_len`] bytes). For a successful read of `data_len > 0` bytes the data
/// follows the header; for a structured read it is one NBD_REPLY_TYPE_OFFSET_DATA chunk
/// with the DONE flag (an OFFSET_DATA chunk must carry data, so the server rejects
/// zero-length requests before they get here). Errors on reads use NBD_REPLY_TYPE_ERROR.
pub fn encode_reply_header(
    out: &mut [u8],
    framing: Framing,
    is_read: bool,
    handle: u64,
    error: u32,
    offset: u64,
    data_len: u32,
) {
    match (framing, is_read) {
        (Framing::Simple, _) | (Framing::Structured, false) => {
            put(out, 0, &SIMPLE_REPLY_MAGIC.to_be_bytes());
            put(out, 4, &error.to_be_bytes());
            put(out, 8, &handle.to_be_bytes());
        }
        (Framing::Structured, true) => {
            put(out, 0, &STRUCTURED_REPLY_MAGIC.to_be_bytes());
            put(out, 4, &REPLY_FLAG_DONE.to_be_bytes());
            put(out, 8, &handle.to_be_bytes());
            if error != 0 {
                put(out, 6, &REPLY_TYPE_ERROR.to_be_bytes());
                put(out, 16, &(REPLY_ERROR_PAYLOAD_BYTES as u32).to_be_bytes());
                put(out, 20, &error.to_be_bytes());
                put(out, 24, &0u16.to_be_bytes());
            } else {
                put(out, 6, &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
                put(out, 16, &(8 + data_len).to_be_bytes());
                put(out, 20, &offset.to_be_bytes());
            }
        }
    }
}

/// A whole NBD_REPLY_TYPE_BLOCK_STATUS reply (one chunk, flag DONE) for one meta context:
/// `extents` as (length, flags) descriptors. The caller keeps lengths non-zero and their
/// count small enough for a reply (see `limits::MAX_BLOCK_STATUS_EXTENTS`).
pub fn encode_block_status_reply(handle: u64, context_id: u32, extents: &[(u32, u32)]) -> Vec<u8> {
    let payload = 4 + extents.len() * BLOCK_STATUS_DESCRIPTOR_BYTES;
    let mut b = vec![0u8; STRUCTURED_HEADER_BYTES];
    put(&mut b, 0, &STRUCTURED_REPLY_MAGIC.to_be_bytes());
    put(&mut b, 4, &REPLY_FLAG_DONE.to_be_bytes());
    put(&mut b, 6, &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
    put(&mut b, 8, &handle.to_be_bytes());
    put(&mut b, 16, &(payload as u32).to_be_bytes());
    b.reserve(payload);
    b.extend_from_slice(&context_id.to_be_bytes());
    for &(len, flags) in extents {
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
    }
    b
}

/// A decoded reply header as a client sees it (tests and the benchmark client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub magic: u32,
    pub error: u32,
    pub handle: u64,
}

pub fn decode_simple_reply(b: &[u8; SIMPLE_REPLY_HEADER_BYTES]) -> SimpleReply {
    SimpleReply {
        magic: be_u32(b, 0),
        error: be_u32(b, 4),
        handle: be_u64(b, 8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_bytes() {
        let g = encode_greeting();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
    }

    #[test]
    fn request_roundtrip() {
        let b = encode_request(CMD_FLAG_FUA, CMD_WRITE, 0xdead_beef_0102_0304, 4096, 512);
        let r = decode_request(&b);
        assert_eq!(r.magic, REQUEST_MAGIC);
        assert_eq!(r.flags, CMD_FLAG_FUA);
        assert_eq!(r.cmd, CMD_WRITE);
        assert_eq!(r.handle, 0xdead_beef_0102_0304);
        assert_eq!(r.offset, 4096);
        assert_eq!(r.length, 512);
        assert_eq!(&b[..4], &[0x25, 0x60, 0x95, 0x13]);
    }

    #[test]
    fn option_header_decode() {
        let mut b = [0u8; OPTION_HEADER_BYTES];
        b[..8].copy_from_slice(b"IHAVEOPT");
        b[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        b[12..].copy_from_slice(&9u32.to_be_bytes());
        let h = decode_option_header(&b);
        assert_eq!(h.magic, IHAVEOPT);
        assert_eq!(h.option, OPT_GO);
        assert_eq!(h.length, 9);
    }

    #[test]
    fn info_request_parse() {
        let mut p = Vec::new();
        p.extend_from_slice(&3u32.to_be_bytes());
        p.extend_from_slice(b"abc");
        p.extend_from_slice(&2u16.to_be_bytes());
        p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        p.extend_from_slice(&INFO_NAME.to_be_bytes());
        let r = decode_info_request(&p);
        assert_eq!(
            r,
            Some(InfoRequest {
                name: b"abc".to_vec(),
                requests: vec![INFO_BLOCK_SIZE, INFO_NAME]
            })
        );
        // Inconsistent lengths are rejected, never read out of bounds.
        assert_eq!(decode_info_request(&p[..p.len() - 1]), None);
        let mut long = p.clone();
        long.push(0);
        assert_eq!(decode_info_request(&long), None);
        let mut huge = p.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_info_request(&huge), None);
        assert_eq!(decode_info_request(&[0, 0]), None);
        // Empty name, no requests: the minimal valid payload.
        assert_eq!(
            decode_info_request(&[0, 0, 0, 0, 0, 0]),
            Some(InfoRequest {
                name: vec![],
                requests: vec![]
            })
        );
    }

    #[test]
    fn info_payloads() {
        let e = encode_info_export(1 << 30, TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH);
        assert_eq!(&e[..2], &[0, 0]);
        assert_eq!(&e[2..10], &(1u64 << 30).to_be_bytes());
        assert_eq!(&e[10..], &[0, 5]);
        let b = encode_info_block_size(1, 4096, 32 << 20);
        assert_eq!(&b[..2], &[0, 3]);
        assert_eq!(&b[2..6], &1u32.to_be_bytes());
        assert_eq!(&b[6..10], &4096u32.to_be_bytes());
        assert_eq!(&b[10..], &(32u32 << 20).to_be_bytes());
        let s = encode_rep_server("disk", "d");
        assert_eq!(s, [0, 0, 0, 4, b'd', b'i', b's', b'k', b'd']);
        assert_eq!(encode_export_name_reply(5, 1, true).len(), 10);
        assert_eq!(encode_export_name_reply(5, 1, false).len(), 134);
    }

    #[test]
    fn simple_reply_header() {
        let mut h = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        assert_eq!(
            reply_header_len(Framing::Simple, true, 0),
            SIMPLE_REPLY_HEADER_BYTES
        );
        encode_reply_header(&mut h, Framing::Simple, true, 7, EINVAL, 0, 0);
        let r = decode_simple_reply(&h);
        assert_eq!(r.magic, SIMPLE_REPLY_MAGIC);
        assert_eq!(r.error, EINVAL);
        assert_eq!(r.handle, 7);
    }

    #[test]
    fn structured_read_headers() {
        let n = reply_header_len(Framing::Structured, true, 0);
        assert_eq!(n, 28);
        let mut h = vec![0u8; n];
        encode_reply_header(&mut h, Framing::Structured, true, 9, 0, 4096, 512);
        assert_eq!(be_u32(&h, 0), STRUCTURED_REPLY_MAGIC);
        assert_eq!(be_u16(&h, 4), REPLY_FLAG_DONE);
        assert_eq!(be_u16(&h, 6), REPLY_TYPE_OFFSET_DATA);
        assert_eq!(be_u64(&h, 8), 9);
        assert_eq!(be_u32(&h, 16), 8 + 512);
        assert_eq!(be_u64(&h, 20), 4096);

        let n = reply_header_len(Framing::Structured, true, EIO);
        assert_eq!(n, 26);
        let mut h = vec![0u8; n];
        encode_reply_header(&mut h, Framing::Structured, true, 9, EIO, 0, 0);
        assert_eq!(be_u16(&h, 6), REPLY_TYPE_ERROR);
        assert_eq!(be_u32(&h, 16), 6);
        assert_eq!(be_u32(&h, 20), EIO);
        assert_eq!(be_u16(&h, 24), 0);

        // Non-read commands keep simple replies even when structured replies are on.
        assert_eq!(
            reply_header_len(Framing::Structured, false, 0),
            SIMPLE_REPLY_HEADER_BYTES
        );
    }

    #[test]
    fn meta_context_requests() {
        let mut p = Vec::new();
        p.extend_from_slice(&4u32.to_be_bytes());
        p.extend_from_slice(b"disk");
        p.extend_from_slice(&2u32.to_be_bytes());
        for q in [&b"base:allocation"[..], b"qemu:dirty-bitmap:x"] {
            p.extend_from_slice(&(q.len() as u32).to_be_bytes());
            p.extend_from_slice(q);
        }
        let r = decode_meta_context_request(&p);
        assert_eq!(
            r,
            Some(MetaContextRequest {
                name: b"disk".to_vec(),
                queries: vec![b"base:allocation".to_vec(), b"qemu:dirty-bitmap:x".to_vec()]
            })
        );
        assert_eq!(decode_meta_context_request(&p[..p.len() - 1]), None);
        let mut long = p.clone();
        long.push(0);
        assert_eq!(decode_meta_context_request(&long), None);
        // A huge count with no queries behind it is refused without allocating for it.
        let mut huge = p[..8].to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_meta_context_request(&huge), None);
        assert_eq!(decode_meta_context_request(&[0, 0, 0]), None);
        assert_eq!(
            decode_meta_context_request(&[0; 8]),
            Some(MetaContextRequest {
                name: vec![],
                queries: vec![]
            })
        );
    }

    #[test]
    fn block_status_reply() {
        let b = encode_block_status_reply(7, 1, &[(4096, STATE_HOLE | STATE_ZERO), (512, 0)]);
        assert_eq!(be_u32(&b, 0), STRUCTURED_REPLY_MAGIC);
        assert_eq!(be_u16(&b, 4), REPLY_FLAG_DONE);
        assert_eq!(be_u16(&b, 6), REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(be_u64(&b, 8), 7);
        assert_eq!(be_u32(&b, 16), 4 + 16);
        assert_eq!(b.len(), STRUCTURED_HEADER_BYTES + 20);
        assert_eq!(be_u32(&b, 20), 1);
        assert_eq!((be_u32(&b, 24), be_u32(&b, 28)), (4096, 3));
        assert_eq!((be_u32(&b, 32), be_u32(&b, 36)), (512, 0));
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(wire_errno(libc::EROFS), EPERM);
        assert_eq!(wire_errno(libc::ENOSPC), ENOSPC);
        assert_eq!(wire_errno(libc::EINVAL), EINVAL);
        assert_eq!(wire_errno(libc::EFBIG), EINVAL);
        assert_eq!(wire_errno(libc::EIO), EIO);
        assert_eq!(wire_errno(libc::ENXIO), EIO);
    }
}
