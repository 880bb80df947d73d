use super::*;

fn header(opcode: u32, nodeid: u64, len: u32) -> [u8; abi::IN_HEADER_BYTES] {
    let mut h = [0u8; abi::IN_HEADER_BYTES];
    put_u32(&mut h, 0, len);
    put_u32(&mut h, 4, opcode);
    put_u64(&mut h, 8, 77);
    put_u64(&mut h, 16, nodeid);
    put_u32(&mut h, 32, 1234);
    h
}

#[test]
fn parses_in_header() {
    let h = header(abi::READ, FILE_INO, 80);
    let p = parse_in_header(&h);
    assert_eq!(
        p,
        Some(InHeader {
            len: 80,
            opcode: abi::READ,
            unique: 77,
            nodeid: FILE_INO,
            pid: 1234
        })
    );
    assert_eq!(parse_in_header(&h[..39]), None);
}

#[test]
fn init_reply_accepts_uring_only_when_offered() {
    let mut init_in = [0u8; 64];
    put_u32(&mut init_in, 0, 7);
    put_u32(&mut init_in, 4, 44);
    put_u32(
        &mut init_in,
        12,
        abi::FLAG_INIT_EXT | abi::FLAG_MAX_PAGES | 1,
    );
    let mut out = [0u8; 64];
    assert!(!encode_init_out(&init_in, true, &mut out).1);
    put_u32(&mut init_in, 16, abi::FLAG2_OVER_IO_URING);
    let (len, uring) = encode_init_out(&init_in, true, &mut out);
    assert!(uring && len == 64);
    assert_eq!(get_u32(&out, 4), 44);
    assert_eq!(get_u32(&out, 12), abi::FLAG_INIT_EXT | abi::FLAG_MAX_PAGES);
    assert_eq!(get_u32(&out, 20), MAX_WRITE);
    assert_eq!(get_u32(&out, 32), abi::FLAG2_OVER_IO_URING);
    assert!(!encode_init_out(&init_in, false, &mut out).1);
}

#[test]
fn lookup_name_from_either_place() {
    assert_eq!(lookup_name(b"data\0", b""), b"data");
    assert_eq!(lookup_name(b"", b"data\0junk"), b"data");
    assert_eq!(lookup_name(b"data", b"\0"), b"data");
}

#[test]
fn serves_lookup_read_write() -> anyhow::Result<()> {
    let fs = NullFs::new(MIB)?;
    let mut out = vec![0u8; PAYLOAD_BYTES];
    let h = parse_in_header(&header(abi::LOOKUP, ROOT_INO, 45))
        .ok_or_else(|| anyhow::anyhow!("hdr"))?;
    let Outcome::Reply { error: 0, len } = fs.handle(&h, Via::Dev, b"data\0", &mut out, 0) else {
        bail!("lookup failed");
    };
    assert_eq!(len, abi::ENTRY_OUT_BYTES);
    assert_eq!(get_u64(&out, 0), FILE_INO);
    assert_eq!(get_u64(&out, 40 + 8), MIB);

    // /dev/fuse layout: write_in followed by the data.
    let mut w = vec![0u8; abi::WRITE_IN_BYTES + 4];
    put_u64(&mut w, 8, 4096);
    put_u32(&mut w, 16, 4);
    w[abi::WRITE_IN_BYTES..].copy_from_slice(b"abcd");
    let h =
        parse_in_header(&header(abi::WRITE, FILE_INO, 84)).ok_or_else(|| anyhow::anyhow!("hdr"))?;
    let Outcome::Reply { error: 0, len: 8 } = fs.handle(&h, Via::Dev, &w, &mut out, 0) else {
        bail!("write failed");
    };
    assert_eq!(get_u32(&out, 0), 4);

    // io_uring layout: write_in in op_in, the data in the payload.
    out[..4].copy_from_slice(b"wxyz");
    put_u64(&mut w, 8, 4098);
    let Outcome::Reply { error: 0, len: 8 } =
        fs.handle(&h, Via::Ring, &w[..abi::WRITE_IN_BYTES], &mut out, 4)
    else {
        bail!("ring write failed");
    };

    let mut r = [0u8; 40];
    put_u64(&mut r, 8, 4096);
    put_u32(&mut r, 16, 6);
    let h =
        parse_in_header(&header(abi::READ, FILE_INO, 80)).ok_or_else(|| anyhow::anyhow!("hdr"))?;
    let Outcome::Reply { error: 0, len: 6 } = fs.handle(&h, Via::Ring, &r, &mut out, 0) else {
        bail!("read failed");
    };
    assert_eq!(&out[..6], b"abwxyz");

    // Reads past the end are short; unknown opcodes get ENOSYS; FORGET no reply.
    put_u64(&mut r, 8, MIB - 2);
    let Outcome::Reply { error: 0, len: 2 } = fs.handle(&h, Via::Dev, &r, &mut out, 0) else {
        bail!("short read failed");
    };
    let h = parse_in_header(&header(4, FILE_INO, 40)).ok_or_else(|| anyhow::anyhow!("hdr"))?;
    assert!(matches!(
        fs.handle(&h, Via::Dev, &[], &mut out, 0),
        Outcome::Reply { error, len: 0 } if error == -libc::ENOSYS
    ));
    let h = parse_in_header(&header(abi::FORGET, FILE_INO, 48))
        .ok_or_else(|| anyhow::anyhow!("hdr"))?;
    assert!(matches!(
        fs.handle(&h, Via::Dev, &[0; 8], &mut out, 0),
        Outcome::NoReply
    ));
    Ok(())
}

#[test]
fn register_sqe_carries_iovec_count() {
    let e = uring_cmd(3, abi::URING_CMD_REGISTER, 1, 0)
        .addr(Some(0x1000))
        .build();
    let e = with_sqe_len(e, abi::URING_IOV_SEGS);
    // SAFETY: same layout argument as in with_sqe_len.
    let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    assert_eq!(get_u32(&raw, 24), 2);
    assert_eq!(get_u64(&raw, 16), 0x1000);
    assert_eq!(get_u32(&raw, 4), 3); // fd
    assert_eq!(get_u32(&raw, 8), abi::URING_CMD_REGISTER); // cmd_op
    assert_eq!(get_u16(&raw, 48 + 16), 1); // qid in the command area
}

fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[test]
fn parses_sizes() {
    assert_eq!(parse_size("256M"), Ok(256 * MIB));
    assert!(parse_size("12345").is_err());
}
