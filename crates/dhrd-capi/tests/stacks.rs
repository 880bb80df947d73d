//! Every backing and fast layer the C API offers, from a C program (`examples/c/stacks.c`,
//! compiled with `cc`): a file, a block device (a loop device), NVM write-back and an SSD
//! tier over a file. The program writes, closes, reopens and reads back, and checks the
//! status document; here the bytes must also be in the backing itself after the close,
//! which writes the fast layer back. (RBD images: rbd.rs.)
#![allow(clippy::expect_used)] // tests fail loudly by design

mod cc;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// Every piece the program wrote is in `backing`'s bytes.
fn assert_written_back(backing: &[u8], what: &str) {
    for (at, piece) in cc::stacks_pieces() {
        let at = at as usize;
        assert!(
            backing[at..at + piece.len()] == piece[..],
            "{what}: the bytes written at {at} are not in the backing after the close"
        );
    }
}

fn run(exe: &Path, backing: &Path, fast: Option<(&str, &Path)>) -> String {
    let mut args = vec![backing.as_os_str()];
    if let Some((kind, file)) = fast {
        args.extend([OsStr::new(kind), file.as_os_str()]);
    }
    cc::run_ok(exe, &args)
}

#[test]
fn a_file_alone_and_under_each_fast_layer() {
    // On a disk: NVM write-back refuses a file on tmpfs.
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on a disk file system");
    let exe = cc::compile("stacks", dir.path());
    for (kind, layer) in [
        (None, None),
        (Some("nvm"), Some("\"writeback\":")),
        (Some("ssd"), Some("\"tier\":")),
    ] {
        let backing = dir
            .path()
            .join(format!("backing-{}", kind.unwrap_or("plain")));
        let fast_file = dir.path().join(format!("fast-{}", kind.unwrap_or("plain")));
        let fast = kind.map(|k| (k, fast_file.as_path()));
        let out = run(&exe, &backing, fast);
        if let Some(layer) = layer {
            assert!(out.contains(layer), "{kind:?}: {out}");
        }
        let bytes = std::fs::read(&backing).expect("backing");
        assert_written_back(&bytes, kind.unwrap_or("a file alone"));
    }
}

/// A loop device, detached when dropped.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn a_block_device_alone_and_under_an_ssd_tier() {
    // The suite runs as root with loop devices (README); without them this is a defect of
    // the setup, not a reason to pass.
    assert!(
        Path::new("/dev/loop-control").exists(),
        "no /dev/loop-control: the block device backing cannot be tested"
    );
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on a disk file system");
    let exe = cc::compile("stacks", dir.path());
    for fast in [None, Some("ssd")] {
        let img = dir
            .path()
            .join(format!("dev-{}.img", fast.unwrap_or("plain")));
        std::fs::write(&img, vec![0u8; 8 << 20]).expect("image");
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
            .expect("losetup");
        let out = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "losetup: {out}");
        let dev = Loop(String::from_utf8_lossy(&o.stdout).trim().to_string());
        let ssd = dir.path().join("ssd");
        let out = run(&exe, Path::new(&dev.0), fast.map(|k| (k, ssd.as_path())));
        assert_eq!(out.contains("\"tier\":"), fast.is_some(), "{out}");
        drop(dev);
        let what = format!("a block device ({fast:?})");
        assert_written_back(&std::fs::read(&img).expect("image"), &what);
    }
}
