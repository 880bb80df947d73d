//! Certificates and keys for the TLS tests, made with GnuTLS's certtool and psktool (the
//! commands docs/nbd.md shows): a CA, a server certificate, client certificates (good,
//! expired, from another CA), and PSK files. A missing tool fails the test with its
//! Debian package (`gnutls-bin`).

use super::run_ok;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn certtool() -> Command {
    Command::new(super::tool("certtool"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn privkey(path: &Path) {
    run_ok(
        certtool()
            .args(["--generate-privkey", "--key-type", "ecdsa", "--outfile"])
            .arg(path),
    );
}

/// A CA in `dir`: ca-key.pem and ca-cert.pem.
fn ca(dir: &Path, cn: &str) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    privkey(&dir.join("ca-key.pem"));
    write(
        &dir.join("ca.info"),
        &format!("cn = {cn}\nca\ncert_signing_key\nexpiration_days = 3650\n"),
    );
    run_ok(
        certtool()
            .arg("--generate-self-signed")
            .arg("--load-privkey")
            .arg(dir.join("ca-key.pem"))
            .arg("--template")
            .arg(dir.join("ca.info"))
            .arg("--outfile")
            .arg(dir.join("ca-cert.pem")),
    );
}

/// A certificate `name`-cert.pem with key `name`-key.pem in `out`, signed by the CA in
/// `ca_dir`, from the template lines `info`.
fn signed(ca_dir: &Path, out: &Path, name: &str, info: &str) {
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("{e}"));
    let key = out.join(format!("{name}-key.pem"));
    privkey(&key);
    let tmpl = out.join(format!("{name}.info"));
    write(&tmpl, info);
    run_ok(
        certtool()
            .arg("--generate-certificate")
            .arg("--load-ca-certificate")
            .arg(ca_dir.join("ca-cert.pem"))
            .arg("--load-ca-privkey")
            .arg(ca_dir.join("ca-key.pem"))
            .arg("--load-privkey")
            .arg(&key)
            .arg("--template")
            .arg(&tmpl)
            .arg("--outfile")
            .arg(out.join(format!("{name}-cert.pem"))),
    );
}

const CLIENT_INFO: &str = "cn = client\ntls_www_client\nencryption_key\nsigning_key\n";

/// Everything the TLS tests use, under one directory.
pub struct Pki {
    /// The server's --tls-certificates directory (ca-cert.pem, server-cert.pem,
    /// server-key.pem).
    pub server: PathBuf,
    /// libnbd client directories (ca-cert.pem, client-cert.pem, client-key.pem): a valid
    /// client, one whose certificate expired, one signed by another CA, and one with no
    /// certificate (it trusts the server's CA only).
    pub client: PathBuf,
    pub expired: PathBuf,
    pub other_ca: PathBuf,
    pub anonymous: PathBuf,
    /// PSK files: the server's (identity `alice`), and a client's with the wrong key.
    pub psk: PathBuf,
    pub psk_wrong: PathBuf,
    /// Alice's key, hex.
    pub psk_key: String,
}

pub fn make(dir: &Path) -> Pki {
    let ca_dir = dir.join("ca");
    ca(&ca_dir, "dhrd test CA");
    let other = dir.join("other-ca");
    ca(&other, "another CA");
    let server = dir.join("server");
    signed(
        &ca_dir,
        &server,
        "server",
        "organization = dhrd test\ncn = localhost\ndns_name = localhost\n\
         ip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\n\
         expiration_days = 365\n",
    );
    let copy_ca = |to: &Path| {
        std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{e}"));
        std::fs::copy(ca_dir.join("ca-cert.pem"), to.join("ca-cert.pem"))
            .unwrap_or_else(|e| panic!("{e}"));
    };
    copy_ca(&server);
    let client = dir.join("client");
    signed(
        &ca_dir,
        &client,
        "client",
        &format!("{CLIENT_INFO}expiration_days = 365\n"),
    );
    copy_ca(&client);
    let expired = dir.join("expired");
    signed(
        &ca_dir,
        &expired,
        "client",
        &format!(
            "{CLIENT_INFO}activation_date = \"2020-01-01 00:00:00 UTC\"\n\
             expiration_date = \"2020-01-02 00:00:00 UTC\"\n"
        ),
    );
    copy_ca(&expired);
    let other_ca = dir.join("other-client");
    signed(
        &other,
        &other_ca,
        "client",
        &format!("{CLIENT_INFO}expiration_days = 365\n"),
    );
    copy_ca(&other_ca);
    let anonymous = dir.join("anonymous");
    copy_ca(&anonymous);
    // psktool writes identity:hexkey lines; the wrong key is another one for alice.
    let psk = dir.join("keys.psk");
    run_ok(
        Command::new(super::tool("psktool"))
            .args(["-u", "alice", "-p"])
            .arg(&psk),
    );
    let psk_wrong = dir.join("wrong.psk");
    run_ok(
        Command::new(super::tool("psktool"))
            .args(["-u", "alice", "-p"])
            .arg(&psk_wrong),
    );
    let text = std::fs::read_to_string(&psk).unwrap_or_else(|e| panic!("{e}"));
    let psk_key = text
        .trim()
        .split_once(':')
        .map(|(_, k)| k.to_string())
        .unwrap_or_else(|| panic!("psktool wrote {text:?}"));
    Pki {
        server,
        client,
        expired,
        other_ca,
        anonymous,
        psk,
        psk_wrong,
        psk_key,
    }
}
