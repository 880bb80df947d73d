//! The FUSE protocol as far as the null server speaks it: the ABI's numbers and sizes,
//! little-endian field access, request parsing and reply encoding. Pure functions, no I/O.

use super::*;

pub(super) mod abi {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;

    pub const IN_HEADER_BYTES: usize = 40;
    pub const OUT_HEADER_BYTES: usize = 16;
    pub const ATTR_BYTES: usize = 88;
    pub const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
    pub const ATTR_OUT_BYTES: usize = 16 + ATTR_BYTES;
    pub const OPEN_OUT_BYTES: usize = 16;
    pub const WRITE_IN_BYTES: usize = 40;
    pub const WRITE_OUT_BYTES: usize = 8;
    pub const STATFS_OUT_BYTES: usize = 80;
    pub const INIT_OUT_BYTES: usize = 64;

    pub const KERNEL_MAJOR: u32 = 7;
    /// INIT flags (the low 32 bits; flags2 holds bits 32..63).
    pub const FLAG_MAX_PAGES: u32 = 1 << 22;
    pub const FLAG_INIT_EXT: u32 = 1 << 30;
    /// FUSE_OVER_IO_URING is bit 41 of the 64-bit flags, i.e. bit 9 of flags2.
    pub const FLAG2_OVER_IO_URING: u32 = 1 << (41 - 32);
    pub const FOPEN_DIRECT_IO: u32 = 1 << 0;

    /// _IOR(229, 0, uint32_t)
    pub const DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

    /// fuse_uring_req_header: in_out[128] op_in[128] ent_in_out{flags, commit_id,
    /// payload_sz, padding, reserved}.
    pub const RING_IN_OUT_OFF: usize = 0;
    pub const RING_OP_IN_OFF: usize = 128;
    pub const RING_OP_IN_BYTES: usize = 128;
    pub const RING_ENT_OFF: usize = 256;
    pub const RING_COMMIT_ID_OFF: usize = RING_ENT_OFF + 8;
    pub const RING_PAYLOAD_SZ_OFF: usize = RING_ENT_OFF + 16;
    pub const RING_HEADER_BYTES: usize = 288;
    /// The io_uring command numbers (sqe->cmd_op) and the iovec count REGISTER wants.
    pub const URING_CMD_REGISTER: u32 = 1;
    pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;
    pub const URING_IOV_SEGS: u32 = 2;
}

// ---------------------------------------------------------------------------------------
// Pure helpers: little-endian fields, request parsing, reply encoding
// ---------------------------------------------------------------------------------------

pub(super) fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

pub(super) fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

pub(super) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

pub(super) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub(super) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InHeader {
    pub(super) len: u32,
    pub(super) opcode: u32,
    pub(super) unique: u64,
    pub(super) nodeid: u64,
    pub(super) pid: u32,
}

pub(super) fn parse_in_header(b: &[u8]) -> Option<InHeader> {
    if b.len() < abi::IN_HEADER_BYTES {
        return None;
    }
    Some(InHeader {
        len: get_u32(b, 0),
        opcode: get_u32(b, 4),
        unique: get_u64(b, 8),
        nodeid: get_u64(b, 16),
        pid: get_u32(b, 32),
    })
}

pub(super) fn encode_out_header(b: &mut [u8], len: usize, error: i32, unique: u64) {
    put_u32(b, 0, len as u32);
    put_u32(b, 4, error as u32);
    put_u64(b, 8, unique);
}

pub(super) fn encode_attr(b: &mut [u8], ino: u64, size: u64) {
    b[..abi::ATTR_BYTES].fill(0);
    let (mode, nlink) = if ino == ROOT_INO {
        (libc::S_IFDIR | 0o755, 2)
    } else {
        (libc::S_IFREG | 0o644, 1)
    };
    put_u64(b, 0, ino);
    put_u64(b, 8, size);
    put_u64(b, 16, size.div_ceil(512));
    put_u32(b, 60, mode);
    put_u32(b, 64, nlink);
    put_u32(b, 80, 4096);
}

/// The name of a LOOKUP: the kernel may put it in op_in or in the payload (io_uring) or
/// both concatenated (/dev/fuse); it ends at the first NUL.
pub(super) fn lookup_name(first: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut v: Vec<u8> = first.iter().chain(rest.iter()).copied().collect();
    if let Some(p) = v.iter().position(|&c| c == 0) {
        v.truncate(p);
    }
    v
}

/// INIT reply; returns whether io_uring was accepted (offered by the kernel and wanted).
pub(super) fn encode_init_out(init_in: &[u8], want_uring: bool, out: &mut [u8]) -> (usize, bool) {
    let minor = get_u32(init_in, 4);
    let max_readahead = get_u32(init_in, 8);
    let flags = get_u32(init_in, 12);
    let flags2 = if flags & abi::FLAG_INIT_EXT != 0 {
        get_u32(init_in, 16)
    } else {
        0
    };
    let uring = want_uring && flags2 & abi::FLAG2_OVER_IO_URING != 0;
    out[..abi::INIT_OUT_BYTES].fill(0);
    put_u32(out, 0, abi::KERNEL_MAJOR);
    put_u32(out, 4, minor);
    put_u32(out, 8, max_readahead);
    put_u32(out, 12, flags & (abi::FLAG_INIT_EXT | abi::FLAG_MAX_PAGES));
    put_u16(out, 16, 16); // max_background
    put_u16(out, 18, 12); // congestion_threshold
    put_u32(out, 20, MAX_WRITE);
    put_u32(out, 24, 1); // time_gran
    put_u16(out, 28, MAX_PAGES);
    put_u32(out, 32, if uring { abi::FLAG2_OVER_IO_URING } else { 0 });
    (abi::INIT_OUT_BYTES, uring)
}

pub(super) fn opcode_name(op: u32) -> String {
    let n = match op {
        abi::LOOKUP => "LOOKUP",
        abi::FORGET => "FORGET",
        abi::GETATTR => "GETATTR",
        4 => "SETATTR",
        abi::OPEN => "OPEN",
        abi::READ => "READ",
        abi::WRITE => "WRITE",
        abi::STATFS => "STATFS",
        abi::RELEASE => "RELEASE",
        abi::FSYNC => "FSYNC",
        abi::GETXATTR => "GETXATTR",
        abi::LISTXATTR => "LISTXATTR",
        abi::FLUSH => "FLUSH",
        abi::INIT => "INIT",
        27 => "OPENDIR",
        28 => "READDIR",
        29 => "RELEASEDIR",
        34 => "ACCESS",
        35 => "CREATE",
        abi::INTERRUPT => "INTERRUPT",
        abi::DESTROY => "DESTROY",
        abi::BATCH_FORGET => "BATCH_FORGET",
        43 => "FALLOCATE",
        44 => "READDIRPLUS",
        46 => "LSEEK",
        52 => "STATX",
        _ => return format!("op{op}"),
    };
    n.to_string()
}
