//! `dhrd nbd`'s TLS flags, spelt as nbdkit spells them so that habits and scripts carry
//! over (`--tls off|on|require`, `--tls-certificates DIR`, `--tls-verify-peer`,
//! `--tls-psk FILE`), and what the status file says of who can connect.
//!
//! Invariants: a configuration that would not do what it says is refused at start
//! (credentials without `--tls`, `--tls` without credentials, both kinds of credentials,
//! `--tls-verify-peer` without certificates); an export other hosts can reach without
//! authenticating is warned about at start and in the status file.

use anyhow::bail;
use clap::Args;
use dhrd_nbd::{ServerConfig, ServerStats, TlsConfig, TlsCredentials};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    /// STARTTLS is refused.
    Off,
    /// Clients may upgrade to TLS; plaintext clients are served too.
    On,
    /// Nothing but STARTTLS is answered before the TLS handshake.
    Require,
}

#[derive(Args, Debug)]
pub struct TlsArgs {
    /// TLS (NBD_OPT_STARTTLS): off, on (optional for clients) or require. Needs
    /// --tls-certificates or --tls-psk.
    #[arg(long, value_enum, default_value = "off")]
    pub tls: TlsMode,
    /// Directory with server-cert.pem and server-key.pem, and ca-cert.pem for
    /// --tls-verify-peer (the layout of nbdkit and qemu).
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// Accept only clients whose certificate chains to ca-cert.pem (and is valid now).
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Pre-shared keys: a file of identity:hexkey lines (psktool's format); a client
    /// must know the key of one identity.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
}

impl TlsArgs {
    pub fn config(&self) -> anyhow::Result<Option<TlsConfig>> {
        if self.tls_verify_peer && self.tls_certificates.is_none() {
            bail!("--tls-verify-peer needs --tls-certificates DIR (with ca-cert.pem)");
        }
        let credentials = match (&self.tls_certificates, &self.tls_psk) {
            (Some(dir), None) => Some(TlsCredentials::X509 {
                dir: dir.clone(),
                verify_peer: self.tls_verify_peer,
            }),
            (None, Some(file)) => Some(TlsCredentials::Psk { file: file.clone() }),
            (None, None) => None,
            (Some(_), Some(_)) => bail!("give --tls-certificates or --tls-psk, not both"),
        };
        match (self.tls, credentials) {
            (TlsMode::Off, None) => Ok(None),
            (TlsMode::Off, Some(_)) => {
                bail!("TLS credentials were given but --tls is off: add --tls require (or on)")
            }
            (_, None) => bail!("--tls on|require needs --tls-certificates DIR or --tls-psk FILE"),
            (mode, Some(credentials)) => Ok(Some(TlsConfig {
                require: mode == TlsMode::Require,
                credentials,
            })),
        }
    }
}

/// Who may connect, as the start line and the status file tell it.
pub struct Security {
    pub mode: &'static str,
    pub auth: &'static str,
    pub warning: Option<String>,
}

impl Security {
    pub fn of(cfg: &ServerConfig) -> Self {
        let (mode, auth) = match &cfg.tls {
            None => ("off", "none"),
            Some(t) => (
                if t.require { "require" } else { "on" },
                match &t.credentials {
                    TlsCredentials::Psk { .. } => "psk",
                    TlsCredentials::X509 {
                        verify_peer: true, ..
                    } => "x509-verify-peer",
                    TlsCredentials::X509 { .. } => "none",
                },
            ),
        };
        Self {
            mode,
            auth,
            warning: cfg.security_warning(),
        }
    }

    /// For the start line's parenthesis.
    pub fn describe(&self) -> String {
        match self.mode {
            "off" => String::new(),
            m => format!(", TLS {m} (client authentication: {})", self.auth),
        }
    }

    /// The `tls` and `nbd` objects of the status file.
    pub fn status(&self, s: &ServerStats) -> [(&'static str, serde_json::Value); 2] {
        [
            (
                "tls",
                serde_json::json!({"mode": self.mode, "client_auth": self.auth,
                    "sessions": s.tls_sessions, "handshakes_failed": s.tls_failed,
                    "options_refused_without_tls": s.tls_required,
                    "warning": self.warning}),
            ),
            (
                "nbd",
                serde_json::json!({"connections_negotiated": s.negotiated,
                    "requests": s.requests, "bytes_read": s.bytes_read,
                    "bytes_written": s.bytes_written, "block_status": s.block_status,
                    "polls_caught": s.polls_caught, "polls_missed": s.polls_missed,
                    "quiet_handoffs": s.quiet_handoffs, "takeovers": s.takeovers}),
            ),
        ]
    }
}
