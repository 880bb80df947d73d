//! TLS (NBD_OPT_STARTTLS) with the real clients: libnbd's nbdinfo, nbdcopy and nbdsh,
//! qemu-img, fio's nbd engine; x509 certificates with client verification and
//! pre-shared keys, over Unix sockets and TCP. Clients that must be refused (a wrong key,
//! an unknown identity, an expired certificate, one from another CA, none, plaintext
//! under `require`) get nothing: the server's statistics show no request and the backing
//! is unchanged. Certificates are made by `common::pki` with certtool and psktool.

mod common;

use common::pki::Pki;
use common::*;
use dhrd_nbd::proto::*;
use dhrd_nbd::{ListenAddr, ServerConfig, ServerStats, TlsConfig, TlsCredentials};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 32 * MIB;

fn pki() -> (tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let p = common::pki::make(dir.path());
    (dir, p)
}

fn x509(p: &Pki, require: bool, verify_peer: bool) -> impl FnOnce(&mut ServerConfig) {
    let dir = p.server.clone();
    move |c| {
        c.tls = Some(TlsConfig {
            require,
            credentials: TlsCredentials::X509 { dir, verify_peer },
        })
    }
}

fn psk(p: &Pki) -> impl FnOnce(&mut ServerConfig) {
    let file = p.psk.clone();
    move |c| {
        c.tls = Some(TlsConfig {
            require: true,
            credentials: TlsCredentials::Psk { file },
        })
    }
}

fn tcp(c: &mut ServerConfig) {
    c.listen = ListenAddr::Tcp("127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()));
}

/// An `nbds://` URI of the server with x509 client credentials from `certs`.
fn uri_x509(srv: &TestServer, certs: &Path) -> String {
    match &srv.addr {
        ListenAddr::Unix(s) => format!(
            "nbds+unix:///?socket={}&tls-certificates={}",
            s.display(),
            certs.display()
        ),
        ListenAddr::Tcp(a) => format!("nbds://{a}/?tls-certificates={}", certs.display()),
    }
}

fn uri_psk(srv: &TestServer, user: &str, keys: &Path) -> String {
    format!(
        "nbds+unix://{user}@/?socket={}&tls-psk-file={}",
        srv.sock.display(),
        keys.display()
    )
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn try_run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn nbdinfo(uri: &str) -> Output {
    try_run(Command::new(tool("nbdinfo")).arg(uri))
}

/// nbdcopy of a random image into the export and back, compared byte for byte, and
/// against the backing file.
fn round_trip(e: &EngineExport, uri: &str) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data = pattern(SIZE as usize, 9);
    std::fs::write(&src, &data).unwrap_or_else(|e| panic!("{e}"));
    run_ok(
        Command::new(tool("nbdcopy"))
            .arg("--flush")
            .arg(&src)
            .arg(uri),
    );
    run_ok(Command::new(tool("nbdcopy")).arg(uri).arg(&back));
    assert!(
        std::fs::read(&back).ok() == Some(data.clone()),
        "read back differs"
    );
    assert!(
        std::fs::read(&e.backing).ok() == Some(data),
        "backing differs"
    );
}

#[test]
fn certificates_with_client_verification_over_unix_and_tcp() {
    let (_d, p) = pki();
    for listen_tcp in [false, true] {
        let e = engine_export_cfg(SIZE, &[], true, |c| {
            x509(&p, true, true)(c);
            if listen_tcp {
                tcp(c);
            }
        });
        let uri = uri_x509(&e.srv, &p.client);
        let o = nbdinfo(&uri);
        assert!(o.status.success(), "{}", out(&o));
        assert!(out(&o).contains("with TLS"), "{}", out(&o));
        round_trip(&e, &uri);
        let s = e.srv.handle().stats();
        assert!(s.tls_sessions >= 3, "{s:?}");
        assert_eq!((s.tls_failed, s.tls_required), (0, 0), "{s:?}");
    }
}

#[test]
fn psk_with_libnbd_and_qemu() {
    let (d, p) = pki();
    let e = engine_export_cfg(SIZE, &[], true, psk(&p));
    let uri = uri_psk(&e.srv, "alice", &p.psk);
    let o = nbdinfo(&uri);
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("with TLS"), "{}", out(&o));
    round_trip(&e, &uri);
    // qemu-img reads the same bytes over TLS-PSK (its own credentials object).
    let src = d.path().join("src.img");
    std::fs::write(&src, std::fs::read(&e.backing).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    let qemu_keys = d.path().join("qemu-psk");
    std::fs::create_dir_all(&qemu_keys).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(&p.psk, qemu_keys.join("keys.psk")).unwrap_or_else(|e| panic!("{e}"));
    let o = try_run(
        Command::new(tool("qemu-img"))
            .arg("compare")
            .arg("--object")
            .arg(format!(
                "tls-creds-psk,id=tls0,endpoint=client,username=alice,dir={}",
                qemu_keys.display()
            ))
            .arg("--image-opts")
            .arg(format!("driver=file,filename={}", src.display()))
            .arg(format!(
                "driver=nbd,server.type=unix,server.path={},tls-creds=tls0",
                e.srv.sock.display()
            )),
    );
    assert!(
        o.status.success(),
        "qemu-img compare over TLS-PSK: {}",
        out(&o)
    );
}

#[test]
fn qemu_img_compare_over_x509() {
    let (d, p) = pki();
    let e = engine_export_cfg(SIZE, &[(MIB, 3 * MIB)], true, |c| {
        x509(&p, true, true)(c);
        tcp(c);
    });
    let ListenAddr::Tcp(addr) = e.srv.addr.clone() else {
        panic!("not TCP")
    };
    let src = d.path().join("src.img");
    std::fs::write(&src, std::fs::read(&e.backing).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    let compare = |file: &Path| {
        try_run(
            Command::new(tool("qemu-img"))
                .arg("compare")
                .arg("--object")
                .arg(format!(
                    "tls-creds-x509,id=tls0,endpoint=client,dir={}",
                    p.client.display()
                ))
                .arg("--image-opts")
                .arg(format!("driver=file,filename={}", file.display()))
                .arg(format!(
                    "driver=nbd,server.type=inet,server.host={},server.port={},tls-creds=tls0",
                    addr.ip(),
                    addr.port()
                )),
        )
    };
    let o = compare(&src);
    assert!(o.status.success(), "{}", out(&o));
    // And it notices a difference.
    let mut other = std::fs::read(&src).unwrap_or_default();
    other[12345] ^= 1;
    let src2 = d.path().join("src2.img");
    std::fs::write(&src2, other).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compare(&src2).status.code(), Some(1));
}

/// The server got nothing from the refused clients: no negotiated connection, no
/// request, no byte read or written; the backing is as it was.
fn assert_nothing_served(e: &EngineExport, s: &ServerStats, before: &[u8]) {
    assert!(
        e.srv.wait_idle(Duration::from_secs(20)),
        "connections still open"
    );
    assert_eq!(s.negotiated, 0, "{s:?}");
    assert_eq!(
        (s.requests, s.bytes_read, s.bytes_written),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(
        std::fs::read(&e.backing).ok().as_deref() == Some(before),
        "the backing changed"
    );
    assert_eq!(e.obj.stats().writes, 0);
}

#[test]
fn clients_without_valid_credentials_are_refused_before_any_data() {
    let (d, p) = pki();
    let initial = [(0, MIB)];
    // x509 with client verification: expired, another CA's, no certificate, plaintext.
    let e = engine_export_cfg(4 * MIB, &initial, true, x509(&p, true, true));
    let before = std::fs::read(&e.backing).unwrap_or_default();
    let src = d.path().join("zeros.img");
    std::fs::write(&src, vec![0xee; 4 * MIB as usize]).unwrap_or_else(|e| panic!("{e}"));
    for certs in [&p.expired, &p.other_ca, &p.anonymous] {
        let uri = uri_x509(&e.srv, certs);
        let o = nbdinfo(&uri);
        assert!(
            !o.status.success(),
            "{} was served: {}",
            certs.display(),
            out(&o)
        );
        let o = try_run(Command::new(tool("nbdcopy")).arg(&src).arg(&uri));
        assert!(!o.status.success(), "{} could write", certs.display());
    }
    let plain = nbdinfo(&nbd_uri(&e.srv.sock));
    assert!(!plain.status.success(), "plaintext served: {}", out(&plain));
    assert!(
        out(&plain).to_lowercase().contains("tls"),
        "{}",
        out(&plain)
    );
    let s = e.srv.handle().stats();
    assert_eq!(s.tls_failed, 6, "{s:?}");
    assert!(s.tls_required >= 1, "{s:?}");
    assert_nothing_served(&e, &s, &before);

    // PSK: a wrong key, an unknown identity, plaintext.
    let e = engine_export_cfg(4 * MIB, &initial, true, psk(&p));
    let before = std::fs::read(&e.backing).unwrap_or_default();
    for uri in [
        uri_psk(&e.srv, "alice", &p.psk_wrong),
        uri_psk(&e.srv, "mallory", &p.psk),
    ] {
        let o = nbdinfo(&uri);
        assert!(!o.status.success(), "{uri} was served: {}", out(&o));
        let o = try_run(Command::new(tool("nbdcopy")).arg(&src).arg(&uri));
        assert!(!o.status.success(), "{uri} could write");
    }
    assert!(!nbdinfo(&nbd_uri(&e.srv.sock)).status.success());
    assert!(e.srv.wait_idle(Duration::from_secs(20)));
    let s = e.srv.handle().stats();
    assert_eq!(s.tls_failed, 4, "{s:?}");
    assert_nothing_served(&e, &s, &before);
}

#[test]
fn require_answers_only_starttls_in_plaintext() {
    let (_d, p) = pki();
    let e = engine_export_cfg(4 * MIB, &[], false, psk(&p));
    let mut c = RawClient::connect(&e.srv.sock);
    c.greet();
    for opt in [
        OPT_LIST,
        OPT_INFO,
        OPT_GO,
        OPT_STRUCTURED_REPLY,
        OPT_SET_META_CONTEXT,
    ] {
        let payload: &[u8] = if matches!(opt, OPT_INFO | OPT_GO) {
            &[0; 6]
        } else {
            &[]
        };
        c.option(opt, payload);
        let (o, t, p) = c.option_reply();
        assert_eq!((o, t), (opt, REP_ERR_TLS_REQD));
        assert!(p.is_empty(), "data before TLS");
    }
    // EXPORT_NAME cannot be refused with an error: the server closes.
    c.option(OPT_EXPORT_NAME, b"");
    assert!(c.closed_by_server());
    let s = e.srv.handle().stats();
    assert_eq!(s.tls_required, 5, "{s:?}");
    assert_eq!(s.negotiated, 0);
}

#[test]
fn plaintext_sent_after_starttls_is_never_read_as_encrypted() {
    let (_d, p) = pki();
    let e = engine_export_cfg(4 * MIB, &[], false, x509(&p, false, false));
    let mut c = RawClient::connect(&e.srv.sock);
    c.greet();
    // STARTTLS and, in the same write, an option that a man in the middle could have
    // added: it must not be taken as part of the encrypted session.
    let mut both = Vec::new();
    for (opt, payload) in [(OPT_STARTTLS, &[][..]), (OPT_GO, &[0u8; 6][..])] {
        both.extend_from_slice(&IHAVEOPT.to_be_bytes());
        both.extend_from_slice(&opt.to_be_bytes());
        both.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        both.extend_from_slice(payload);
    }
    c.send(&both);
    assert_eq!(c.option_reply().1, REP_ACK);
    assert!(c.closed_by_server());
    assert!(e.srv.wait_idle(Duration::from_secs(20)));
    let s = e.srv.handle().stats();
    assert_eq!((s.tls_failed, s.negotiated), (1, 0), "{s:?}");
}

#[test]
fn tls_on_serves_plaintext_and_tls_clients() {
    let (_d, p) = pki();
    let e = engine_export_cfg(4 * MIB, &[], true, x509(&p, false, false));
    let o = nbdinfo(&nbd_uri(&e.srv.sock));
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("without TLS"), "{}", out(&o));
    // Without --tls-verify-peer a client needs no certificate of its own.
    let o = nbdinfo(&uri_x509(&e.srv, &p.anonymous));
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("with TLS"), "{}", out(&o));
}

#[test]
fn many_requests_in_flight_over_one_tls_connection() {
    // Several threads read requests and write replies on one session: the leader and
    // follower readers and the writer lock must share it soundly. 128 asynchronous
    // writes of mixed sizes to disjoint ranges (requests in flight together have no
    // order), then 128 reads of them in flight, verified; reads of 64 KiB and more take
    // the zero-copy path.
    let (_d, p) = pki();
    let e = engine_export_cfg(SIZE, &[], true, psk(&p));
    let script = r#"
import random
random.seed(5)
size = h.get_size()
slot = size // 128
ops = []
for i in range(128):
    n = random.choice([512, 4096, 65536, slot])
    off = i * slot + random.randrange(0, slot - n + 1)
    data = bytes([(i * 7 + 1) % 256]) * n
    ops.append((off, n, data))
for off, n, data in ops:
    h.aio_pwrite(data, off)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
bufs = []
for off, n, data in ops:
    b = nbd.Buffer(n)
    h.aio_pread(b, off)
    bufs.append((off, data, b))
while h.aio_in_flight() > 0:
    h.poll(-1)
for off, data, b in bufs:
    assert b.to_bytearray() == data, off
print("tls in flight ok")
"#;
    let uri = uri_psk(&e.srv, "alice", &p.psk);
    let o = try_run(
        nbdsh()
            .args(["-c", "h.set_uri_allow_local_file(True)"])
            .args(["-u", &uri, "-c", script]),
    );
    assert!(out(&o).contains("tls in flight ok"), "{}", out(&o));
}

#[test]
fn fio_nbd_engine_over_tls() {
    // fio's nbd engine (fio 3.33, libnbd 1.14) passes a URI to libnbd without allowing
    // URIs that name local files (tls-certificates=, tls-psk-file= are refused), so it
    // can use neither a PSK file nor a chosen certificate directory. It gets its CA from
    // libnbd's default directory, $HOME/.pki/libnbd, and verifies the server; the client
    // certificate there was not presented (the server then refuses it, checked below),
    // so this runs against a server without --tls-verify-peer.
    let (d, p) = pki();
    let e = engine_export_cfg(SIZE, &[], true, x509(&p, true, false));
    let home = d.path().join("home");
    let pki_dir = home.join(".pki/libnbd");
    std::fs::create_dir_all(&pki_dir).unwrap_or_else(|e| panic!("{e}"));
    for f in ["ca-cert.pem", "client-cert.pem", "client-key.pem"] {
        std::fs::copy(p.client.join(f), pki_dir.join(f)).unwrap_or_else(|e| panic!("{e}"));
    }
    let uri = format!("nbds+unix:///?socket={}", e.srv.sock.display());
    let o = try_run(
        Command::new(tool("fio"))
            .env("HOME", &home)
            .args([
                "--name=tls",
                "--ioengine=nbd",
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=8",
                "--size=8M",
                "--io_size=4M",
                "--verify=crc32c",
                "--do_verify=1",
            ])
            .arg(format!("--uri={uri}")),
    );
    assert!(o.status.success(), "fio over TLS: {}", out(&o));
    let s = e.srv.handle().stats();
    assert!(s.tls_sessions >= 1 && s.bytes_written > 0, "{s:?}");
    // With client verification, fio gets nowhere (see above).
    let e = engine_export_cfg(SIZE, &[], true, x509(&p, true, true));
    let uri = format!("nbds+unix:///?socket={}", e.srv.sock.display());
    let o = try_run(
        Command::new(tool("fio"))
            .env("HOME", &home)
            .args(["--name=tls", "--ioengine=nbd", "--rw=read", "--size=1M"])
            .arg(format!("--uri={uri}")),
    );
    assert!(
        !o.status.success(),
        "fio without a client certificate was served"
    );
    assert_eq!(e.srv.handle().stats().tls_failed, 1);
}

#[test]
fn the_crate_client_speaks_tls_and_never_falls_back_to_plaintext() {
    use dhrd_nbd::client::{Client, ClientAddr, ClientOptions, ClientTls};
    let (_d, p) = pki();
    let key = (0..p.psk_key.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&p.psk_key[i..i + 2], 16).unwrap_or(0))
        .collect::<Vec<u8>>();
    let e = engine_export_cfg(4 * MIB, &[], true, |c| {
        psk(&p)(c);
        tcp(c);
    });
    let ListenAddr::Tcp(addr) = e.srv.addr.clone() else {
        panic!("not TCP")
    };
    let opts = |identity: &str, key: Vec<u8>| ClientOptions {
        addr: ClientAddr::Tcp(addr),
        tls: Some(ClientTls::Psk {
            identity: identity.into(),
            key,
        }),
    };
    let mut c = Client::connect_with(&opts("alice", key.clone())).unwrap_or_else(|e| panic!("{e}"));
    c.write(4096, &[3u8; 8192], true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.read(4096, 8192).ok(), Some(vec![3u8; 8192]));
    drop(c);
    let mut wrong = key.clone();
    wrong[0] ^= 1;
    assert!(Client::connect_with(&opts("alice", wrong)).is_err());
    assert!(Client::connect_with(&opts("bob", key)).is_err());
    // Against a server without TLS the client stops at the refused STARTTLS.
    let plain = engine_export_sparse(MIB, &[], false);
    let o = ClientOptions {
        addr: ClientAddr::Unix(plain.srv.sock.clone()),
        tls: Some(ClientTls::X509 {
            ca_file: p.client.join("ca-cert.pem"),
            cert_and_key: None,
        }),
    };
    let err = Client::connect_with(&o).err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("STARTTLS refused")),
        "{err:?}"
    );
    // x509 with a client certificate, over a Unix socket.
    let e = engine_export_cfg(MIB, &[], false, x509(&p, true, true));
    let o = ClientOptions {
        addr: ClientAddr::Unix(e.srv.sock.clone()),
        tls: Some(ClientTls::X509 {
            ca_file: p.client.join("ca-cert.pem"),
            cert_and_key: Some((
                p.client.join("client-cert.pem"),
                p.client.join("client-key.pem"),
            )),
        }),
    };
    let mut c = Client::connect_with(&o).unwrap_or_else(|e| panic!("{e}"));
    c.flush().unwrap_or_else(|e| panic!("{e}"));
}
