//! The one-node Ceph cluster the RBD tests run against (shared by the test binaries of
//! dhrd-rbd and dhrd-cli through `#[path]`).
//!
//! `DHRD_CEPH_CONF=PATH` points the tests at a running cluster (the test script starts one
//! with scripts/ceph-single-node.sh before `cargo test`, so it starts once per run).
//! Without it, the first test that needs a cluster starts a private one under a temporary
//! directory and stops it when the test process exits. Tests that stop the OSD take the
//! cluster exclusively ([`exclusive`]); the others share it ([`shared`]).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub struct Cluster {
    pub conf: PathBuf,
    /// The cluster directory when this process started it (so it may stop the OSD).
    pub dir: Option<PathBuf>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap_or_else(|| panic!("no repository root above {}", env!("CARGO_MANIFEST_DIR")))
        .to_path_buf()
}

pub fn script() -> PathBuf {
    repo_root().join("scripts/ceph-single-node.sh")
}

extern "C" fn stop_private_cluster() {
    if let Some(Some(dir)) = PRIVATE_DIR.get() {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(dir)
            .status();
        let _ = std::fs::remove_dir_all(dir);
    }
}

static PRIVATE_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

pub fn cluster() -> &'static Cluster {
    static C: OnceLock<Cluster> = OnceLock::new();
    C.get_or_init(|| {
        if let Some(conf) = std::env::var_os("DHRD_CEPH_CONF") {
            let conf = PathBuf::from(conf);
            assert!(
                conf.is_file(),
                "DHRD_CEPH_CONF={} is not a file",
                conf.display()
            );
            let dir = conf.parent().map(Path::to_path_buf);
            return Cluster { conf, dir };
        }
        let dir = std::env::temp_dir().join(format!("dhrd-ceph-{}", std::process::id()));
        PRIVATE_DIR.get_or_init(|| Some(dir.clone()));
        // SAFETY: registers a plain extern "C" function to run at exit.
        unsafe { libc::atexit(stop_private_cluster) };
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script().display()));
        assert!(
            out.status.success(),
            "could not start a one-node Ceph cluster (scripts/ceph-single-node.sh; the \
             packages come from scripts/install-deps.sh):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster {
            conf: dir.join("ceph.conf"),
            dir: Some(dir),
        }
    })
}

static USE: RwLock<()> = RwLock::new(());

/// The cluster, shared with other tests that do not stop its daemons.
pub fn shared() -> (&'static Cluster, RwLockReadGuard<'static, ()>) {
    let c = cluster();
    (c, USE.read().unwrap_or_else(|e| e.into_inner()))
}

/// The cluster, with no other test using it (for stopping and starting the OSD).
pub fn exclusive() -> (&'static Cluster, RwLockWriteGuard<'static, ()>) {
    let c = cluster();
    (c, USE.write().unwrap_or_else(|e| e.into_inner()))
}

impl Cluster {
    /// Runs the `rbd` tool against this cluster; panics with its output on failure.
    pub fn rbd(&self, args: &[&str]) -> String {
        let out = Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("rbd: {e}"));
        assert!(
            out.status.success(),
            "rbd {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Removes image `name` of pool `rbd`; panics if it cannot.
    pub fn remove_image(&self, name: &str) {
        self.rbd(&["rm", "--no-progress", &format!("rbd/{name}")]);
    }

    /// The bytes of image `name` of pool `rbd` as the cluster has them (`rbd export`
    /// into `scratch`).
    pub fn export_image(&self, name: &str, scratch: &Path) -> Vec<u8> {
        self.rbd(&[
            "export",
            "--no-progress",
            &format!("rbd/{name}"),
            &scratch.to_string_lossy(),
        ]);
        std::fs::read(scratch).unwrap_or_else(|e| panic!("{}: {e}", scratch.display()))
    }

    /// A fresh image name unique to this process and call site.
    pub fn image_name(&self, tag: &str) -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "t{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn osd(&self, verb: &str) {
        let dir = self
            .dir
            .as_ref()
            .unwrap_or_else(|| panic!("no cluster directory"));
        let st = Command::new("bash")
            .arg(script())
            .arg(verb)
            .arg(dir)
            .status()
            .unwrap_or_else(|e| panic!("{verb}: {e}"));
        assert!(st.success(), "ceph-single-node.sh {verb} failed");
    }

    pub fn stop_osd(&self) {
        self.osd("stop-osd");
    }

    pub fn start_osd(&self) {
        self.osd("start-osd");
    }
}
