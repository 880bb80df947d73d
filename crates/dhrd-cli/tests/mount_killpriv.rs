//! Set-user-ID / set-group-ID bits and file capabilities after writes, truncates, fallocate
//! and chown by a non-root user and by root, through the direct and the cached write path
//! and in `fsync` mode, compared with the same steps on a plain directory of the backing's
//! file system (real FUSE mounts; needs root, /dev/fuse and setpriv).
//!
//! Modes are read with statx(STATX_MODE) only: a full stat would refresh the kernel's
//! cached attributes because a write invalidates size and times, and so would hide a mode
//! the kernel still caches from before the daemon dropped the bits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
use common::*;
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const NOBODY: u32 = 65534;
/// A group `nobody` is not a member of (unless given with `--groups`).
const OTHER_GID: u32 = 100;
const CAP_XATTR: &str = "security.capability";

/// Permission and set-id bits as the kernel reports them for STATX_MODE alone.
fn statx_mode(p: &Path) -> String {
    let c = cpath(p);
    // SAFETY: valid NUL-terminated path and a zeroed statx buffer we own.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C path and a statx buffer we own.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MODE, &mut stx) };
    if r != 0 {
        return format!("errno {}", std::io::Error::last_os_error());
    }
    format!("{:o}", u32::from(stx.stx_mode) & 0o7777)
}

fn has_caps(p: &Path) -> bool {
    let (c, n) = (cpath(p), CString::new(CAP_XATTR).expect("name"));
    // SAFETY: valid NUL-terminated strings; a size query with no buffer.
    unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

/// Gives `p` the file capability cap_net_raw=ep (a VFS_CAP_REVISION_2 blob).
fn set_caps(p: &Path) {
    let mut blob = Vec::new();
    for w in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        blob.extend_from_slice(&w.to_le_bytes());
    }
    let (c, n) = (cpath(p), CString::new(CAP_XATTR).expect("name"));
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), blob.as_ptr().cast(), blob.len(), 0) };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// A file with 8 bytes, owner `uid:gid` and `mode`, created by root.
fn mk(root: &Path, name: &str, mode: u32, uid: u32, gid: u32) -> std::path::PathBuf {
    let p = root.join(name);
    fs::write(&p, b"abcdefgh").expect("create");
    std::os::unix::fs::chown(&p, Some(uid), Some(gid)).expect("chown");
    // chown drops set-id bits, so the mode comes last.
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
    p
}

/// Runs `cmd` as root (`groups` None) or as nobody with only `groups` as supplementary
/// groups (so without CAP_FSETID).
fn run(groups: Option<&str>, cmd: &[&str], cwd: &Path) {
    let mut c = match groups {
        None => Command::new(cmd[0]),
        Some(g) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={NOBODY}"))
                .arg(format!("--regid={NOBODY}"));
            if g.is_empty() {
                c.arg("--clear-groups");
            } else {
                c.arg(format!("--groups={g}"));
            }
            c.arg(cmd[0]);
            c
        }
    };
    let o = c.args(&cmd[1..]).current_dir(cwd).output().expect("spawn");
    assert!(
        o.status.success(),
        "{cmd:?} as {groups:?} in {}: {}",
        cwd.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

const NB: Option<&str> = Some("");
const ROOT: Option<&str> = None;
const WRITE: &[&str] = &[
    "dd",
    "if=/dev/zero",
    "bs=1",
    "count=1",
    "conv=notrunc",
    "status=none",
];

/// The steps, each on its own file; returns "name mode [caps]" per file.
fn scenario(root: &Path) -> Vec<String> {
    let other = format!("{NOBODY},{OTHER_GID}");
    let nb_other = Some(other.as_str());
    let write = |who: Option<&str>, name: &str| {
        let of = format!("of={name}");
        let mut cmd = WRITE.to_vec();
        cmd.push(&of);
        run(who, &cmd, root);
    };
    // Writes: S_ISUID always, S_ISGID with g+x, S_ISGID without g+x only for non-members.
    mk(root, "w_suid_sgid", 0o6777, NOBODY, NOBODY);
    write(NB, "w_suid_sgid");
    mk(root, "w_sgid_member", 0o2767, NOBODY, NOBODY);
    write(NB, "w_sgid_member");
    mk(root, "w_sgid_stranger", 0o2767, NOBODY, 0);
    write(NB, "w_sgid_stranger");
    mk(root, "w_sgid_supplementary", 0o2767, NOBODY, OTHER_GID);
    write(nb_other, "w_sgid_supplementary");
    mk(root, "w_plain", 0o777, NOBODY, NOBODY);
    write(NB, "w_plain");
    // Root has CAP_FSETID: nothing is dropped.
    mk(root, "w_root", 0o6777, NOBODY, NOBODY);
    write(ROOT, "w_root");
    // Size changes, including to the same size and by O_TRUNC.
    mk(root, "t_shrink", 0o6777, NOBODY, NOBODY);
    run(NB, &["truncate", "-s", "3", "t_shrink"], root);
    mk(root, "t_same", 0o6777, NOBODY, NOBODY);
    run(NB, &["truncate", "-s", "8", "t_same"], root);
    mk(root, "t_otrunc", 0o6777, NOBODY, NOBODY);
    run(NB, &["sh", "-c", ": > t_otrunc"], root);
    mk(root, "t_sgid_stranger", 0o2767, NOBODY, 0);
    run(NB, &["truncate", "-s", "3", "t_sgid_stranger"], root);
    mk(root, "t_sgid_member", 0o2767, NOBODY, OTHER_GID);
    run(nb_other, &["truncate", "-s", "3", "t_sgid_member"], root);
    mk(root, "t_root", 0o6777, NOBODY, NOBODY);
    run(ROOT, &["truncate", "-s", "3", "t_root"], root);
    // fallocate: the kernel sends no flag with it.
    mk(root, "f_extend", 0o6777, NOBODY, NOBODY);
    run(NB, &["fallocate", "-l", "8192", "f_extend"], root);
    mk(root, "f_keep", 0o6777, NOBODY, NOBODY);
    run(NB, &["fallocate", "-n", "-l", "4", "f_keep"], root);
    mk(root, "f_sgid_stranger", 0o2767, NOBODY, 0);
    run(NB, &["fallocate", "-l", "8192", "f_sgid_stranger"], root);
    mk(root, "f_root", 0o6777, NOBODY, NOBODY);
    run(ROOT, &["fallocate", "-l", "8192", "f_root"], root);
    // copy_file_range into the file (the daemon copies; the kernel sends no flag).
    mk(root, "x_src", 0o644, 0, 0);
    let copy_into = |who: Option<&str>, name: &str| {
        let prog = format!(
            "import os; s = os.open('x_src', os.O_RDONLY); d = os.open('{name}', os.O_WRONLY); \
             assert os.copy_file_range(s, d, 4, 0, 0) == 4"
        );
        run(who, &["/usr/bin/python3", "-c", &prog], root);
    };
    mk(root, "x_suid_sgid", 0o6777, NOBODY, NOBODY);
    copy_into(NB, "x_suid_sgid");
    mk(root, "x_sgid_stranger", 0o2767, NOBODY, 0);
    copy_into(NB, "x_sgid_stranger");
    mk(root, "x_root", 0o6777, NOBODY, NOBODY);
    copy_into(ROOT, "x_root");
    let p = mk(root, "x_cap_root", 0o755, NOBODY, NOBODY);
    set_caps(&p);
    copy_into(ROOT, "x_cap_root");
    // chown: S_ISUID goes even for root; S_ISGID without g+x depends on the caller.
    mk(root, "c_root", 0o6777, NOBODY, NOBODY);
    run(ROOT, &["chown", "0:0", "c_root"], root);
    mk(root, "c_root_sgid", 0o2767, NOBODY, NOBODY);
    run(ROOT, &["chown", "0:0", "c_root_sgid"], root);
    mk(root, "c_sgid_stranger", 0o2767, NOBODY, 0);
    run(
        nb_other,
        &["chgrp", &NOBODY.to_string(), "c_sgid_stranger"],
        root,
    );
    mk(root, "c_member", 0o6767, NOBODY, NOBODY);
    run(
        nb_other,
        &["chgrp", &OTHER_GID.to_string(), "c_member"],
        root,
    );
    // File capabilities go with any write, root's included.
    let p = mk(root, "cap_root", 0o755, NOBODY, NOBODY);
    set_caps(&p);
    write(ROOT, "cap_root");
    let p = mk(root, "cap_nobody", 0o777, NOBODY, NOBODY);
    set_caps(&p);
    write(NB, "cap_nobody");
    let p = mk(root, "cap_kept", 0o755, NOBODY, NOBODY);
    set_caps(&p);
    modes(root)
}

fn modes(root: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(root)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| {
            let p = root.join(n);
            let caps = if has_caps(&p) { " caps" } else { "" };
            format!("{} {}{caps}", n.to_string_lossy(), statx_mode(&p))
        })
        .collect()
}

fn have_setpriv() -> bool {
    Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn compare(want: &[String], got: &[String], what: &str, log: &str) {
    for (w, g) in want.iter().zip(got) {
        assert_eq!(w, g, "{what} (plain vs dhrd); daemon log: {log}");
    }
    assert_eq!(want.len(), got.len(), "{what}");
}

#[test]
fn setid_bits_and_capabilities_match_a_plain_directory() {
    assert!(
        have_setpriv(),
        "setpriv is needed to act as a non-root user (Debian package util-linux, installed \
         by scripts/install-deps.sh)"
    );
    let s = Scratch::new("killpriv");
    // nobody must reach the files whatever the umask.
    let open_up =
        |p: &Path| fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod");
    open_up(&s.0);
    let plain = s.sub("plain");
    open_up(&plain);
    let want = scenario(&plain);
    // Guard against a vacuous comparison (e.g. setpriv not dropping privileges).
    for line in [
        "w_suid_sgid 777",
        "w_sgid_member 2767",
        "w_sgid_stranger 767",
        "w_root 6777",
        "t_shrink 777",
        "c_root 777",
        "cap_root 755",
        "cap_kept 755 caps",
    ] {
        assert!(
            want.iter().any(|w| w == line),
            "plain directory: {line:?} not in {want:?}"
        );
    }
    for (tag, args) in [
        ("direct", &["--read-path", "auto"][..]),
        ("cached", &["--read-path", "cached"][..]),
        ("fsync", &["--durability", "fsync"][..]),
    ] {
        let backing = s.sub(&format!("backing-{tag}"));
        let mnt = s.sub(&format!("mnt-{tag}"));
        open_up(&backing);
        open_up(&mnt);
        let mut a = vec!["--quiet", "--allow-other"];
        a.extend_from_slice(args);
        let m = Mount::start(&backing, &mnt, &a);
        let st = m.status();
        // Negotiated on kernels since 5.12; without it the cached path would not be
        // exercised the way it is in production.
        assert!(st.contains("killpriv_v2: yes"), "{st}");
        let got = scenario(&mnt);
        compare(
            &want,
            &got,
            &format!("{tag}: through the mount"),
            &m.log_text(),
        );
        let st = m.umount();
        assert!(st.success(), "daemon exit {st}");
        // What reached the backing (durable state), read without the daemon.
        compare(
            &want,
            &modes(&backing),
            &format!("{tag}: backing after unmount"),
            "",
        );
    }
}

/// Runs, as nobody, a shell that opens `name` for writing, waits until `go` exists, then
/// writes one byte through the descriptor it opened first; returns the child.
fn held_writer(dir: &Path, name: &str, go: &Path) -> std::process::Child {
    let script = format!(
        "exec 3<>{name}; echo opened; while [ ! -e {go} ]; do sleep 0.01; done; printf x >&3",
        go = go.display()
    );
    Command::new("setpriv")
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .args(["sh", "-c", &script])
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// A set-id bit given to a file while a writer without CAP_FSETID (not its owner) holds it
/// open for writing: the bit must not outlive that writer's next write. A plain directory
/// drops it at the write. Through the mount the open was passed through to the kernel (the
/// file had no set-id bit when opened), so its writes never reach the daemon, which drops
/// set-id bits for the kernel (KILLPRIV_V2): before, the bit stayed. Now the chmod is
/// refused with ETXTBSY while such a writer holds the file (docs/fuse.md).
#[test]
fn a_setid_bit_never_outlives_the_next_write_of_a_writer_holding_the_file() {
    assert!(
        have_setpriv(),
        "setpriv is needed to act as a non-root user (Debian package util-linux, installed \
         by scripts/install-deps.sh)"
    );
    let s = Scratch::new("killpriv-held");
    let open_up =
        |p: &Path| fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod");
    open_up(&s.0);
    // (chmod result, mode after the write)
    let check = |dir: &Path, tag: &str| -> (Option<i32>, String) {
        // Root's file, writable by everyone: nobody's writes drop both bits.
        let p = mk(dir, "f", 0o666, 0, 0);
        let go = s.0.join(format!("go-{tag}"));
        let mut child = held_writer(dir, "f", &go);
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("child");
        assert_eq!(
            line.trim(),
            "opened",
            "{tag}: the writer did not open the file"
        );
        let chmod = fs::set_permissions(&p, fs::Permissions::from_mode(0o6777))
            .err()
            .map(|e| e.raw_os_error().unwrap_or(0));
        fs::write(&go, b"").expect("go");
        assert!(
            child.wait().expect("wait").success(),
            "{tag}: the write failed"
        );
        (chmod, statx_mode(&p))
    };
    let plain = s.sub("plain");
    open_up(&plain);
    assert_eq!(
        check(&plain, "plain"),
        (None, "777".to_string()),
        "plain directory"
    );
    let backing = s.sub("backing");
    let mnt = s.sub("mnt");
    open_up(&backing);
    open_up(&mnt);
    let m = Mount::start(&backing, &mnt, &["--quiet", "--allow-other"]);
    let (chmod, mode) = check(&mnt, "mount");
    let log = m.log_text();
    let st = m.umount();
    assert!(st.success(), "daemon exit {st}");
    let ok = match chmod {
        None => mode == "777",
        Some(e) => e == libc::ETXTBSY && mode == "666",
    };
    assert!(
        ok,
        "through the mount: chmod {chmod:?}, mode after the write {mode}; daemon log: {log}"
    );
    assert_eq!(statx_mode(&backing.join("f")), mode, "on the backing");
}
