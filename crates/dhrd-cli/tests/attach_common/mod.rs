//! Helpers of the `dhrd attach` tests: a guard for a running attach that always detaches
//! (or kills and undoes) on drop, status in JSON, page cache and flag probes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crate::common::dhrd;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long an attach may take to answer.
pub const ATTACH_WAIT: Duration = Duration::from_secs(60);

/// A running `dhrd attach` in the foreground; detached on drop.
pub struct Attach {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub log: PathBuf,
}

impl Attach {
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::try_start_env(dir, extra, &[]).expect("attach")
    }

    pub fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::try_start_env(dir, extra, env).expect("attach")
    }

    /// Starts an attach and waits until it answers; Err with its output if it exits.
    pub fn try_start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        let log = dir.with_extension(format!("attach-{}.log", std::process::id()));
        let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(dhrd())
            .envs(env.iter().copied())
            .arg("attach")
            .arg(dir)
            .arg("--quiet")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut a = Attach {
            child: Some(child),
            dir: dir.to_path_buf(),
            log,
        };
        let t = Instant::now();
        loop {
            if let Some(st) = a.child.as_mut().expect("child").try_wait().expect("wait") {
                a.child = None;
                return Err(format!("attach exited ({st}): {}", a.log_text()));
            }
            if dhrd_attach::is_attached(dir) {
                return Ok(a);
            }
            assert!(
                t.elapsed() < ATTACH_WAIT,
                "attach did not answer: {}",
                a.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn status_json(&self) -> serde_json::Value {
        let out = dhrd_attach::request(&self.dir, "status-json").expect("status");
        serde_json::from_str(out.trim()).expect("json")
    }

    /// Waits until `f` holds of the status (`what` names it in the failure); returns it.
    pub fn wait_for(
        &self,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        crate::common::wait_for_status(what, ATTACH_WAIT, || self.status_json(), f)
    }

    /// `dhrd status DIR`, as text.
    pub fn status_text(&self) -> String {
        let o = Command::new(dhrd())
            .arg("status")
            .arg(&self.dir)
            .output()
            .expect("status");
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    /// Waits until the warm-up completed.
    pub fn wait_warm(&self) -> serde_json::Value {
        self.wait_for("warm-up did not complete", |s| {
            s["warmup"]["complete"].as_bool() == Some(true)
        })
    }

    /// `dhrd detach DIR`; returns its success and output, and waits for the daemon.
    pub fn detach(mut self) -> (bool, String) {
        let o = Command::new(dhrd())
            .arg("detach")
            .arg(&self.dir)
            .output()
            .expect("detach");
        let mut text = String::from_utf8_lossy(&o.stdout).to_string();
        text.push_str(&String::from_utf8_lossy(&o.stderr));
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        (o.status.success(), text)
    }

    /// SIGKILL of the daemon; what it changed stays. Its control socket, which a killed
    /// daemon leaves behind, is removed (the next attach would replace it; scratch
    /// directories never see one).
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Ok(p) = dhrd_attach::control::socket_path(&self.dir) {
            let _ = std::fs::remove_file(p);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new(dhrd()).arg("detach").arg(&self.dir).output();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
            if let Ok(p) = dhrd_attach::control::socket_path(&self.dir) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Dirty and under-writeback pages of a file (cachestat(2)); None without cachestat.
pub fn unwritten_pages(f: &std::fs::File) -> Option<u64> {
    let (c, src) = dhrd_pagecache::cachestat(f.as_fd(), 0, 0).expect("cachestat");
    (src == dhrd_pagecache::CacheStatSource::Cachestat).then_some(c.dirty_pages + c.writeback_pages)
}

/// The inode flags of a path.
pub fn flags_of(p: &Path) -> i32 {
    let f = std::fs::File::open(p).expect("open");
    dhrd_pagecache::inode_flags(f.as_fd()).expect("flags")
}

/// Whether a path carries the sync flag.
pub fn has_sync_flag(p: &Path) -> bool {
    flags_of(p) & dhrd_pagecache::FS_SYNC_FL != 0
}

/// The file system options of the mount at `mnt` (the fields after the " - " of
/// mountinfo's line whose mount point is `mnt`).
pub fn super_options(mnt: &Path) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.to_string_lossy().to_string();
    info.lines()
        .find(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|r| r.split(' ').nth(2))
        .unwrap_or("")
        .to_string()
}

/// dhrd's record on a directory, if any.
pub fn record_of(dir: &Path) -> Option<String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir).expect("open");
    let mut buf = vec![0u8; 4096];
    // SAFETY: fgetxattr writes at most buf.len() bytes into buf; the name is NUL-terminated.
    let n = unsafe {
        libc::fgetxattr(
            f.as_raw_fd(),
            c"trusted.dhrd.attach".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// Runs `dhrd attach ARGS` expecting a refusal; returns its message.
pub fn refused(args: &[&str]) -> String {
    let o = Command::new(dhrd())
        .arg("attach")
        .args(args)
        .arg("--quiet")
        .output()
        .expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !o.status.success(),
        "attach {args:?} was not refused: {text}"
    );
    text
}
