//! The mount a directory is on, from /proc/self/mountinfo: its file system type, whether
//! the directory is the root of its file system (then the whole file system is its tree),
//! and the file system's own options (`sync`).
//!
//! Invariants: the mount is found by the mount id of the open directory (statx
//! `STATX_MNT_ID`), not by matching paths, so overmounts and bind mounts cannot confuse it.
//! No state and no crash semantics.

use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u64,
    /// The directory of the file system shown at the mount point ("/" for its root).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// Per-mount options (`rw`, `nosuid`, ...).
    pub mount_opts: Vec<String>,
    /// The file system's options (`rw`, `sync`, `dirsync`, ...), shared by all its mounts.
    pub super_opts: Vec<String>,
}

impl MountEntry {
    /// Whether the file system's options include `opt`.
    pub fn has_super_opt(&self, opt: &str) -> bool {
        self.super_opts.iter().any(|o| o == opt)
    }

    /// Whether either option list says read-only.
    pub fn read_only(&self) -> bool {
        self.mount_opts.iter().any(|o| o == "ro") || self.has_super_opt("ro")
    }
}

/// The mount id of an open file.
pub fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let x = rustix::fs::statx(
        fd,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )?;
    Ok(x.stx_mnt_id)
}

/// The mountinfo entry of the mount `fd` is on.
pub fn mount_of(fd: BorrowedFd<'_>) -> io::Result<MountEntry> {
    let id = mount_id(fd)?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    text.lines()
        .filter_map(parse_line)
        .find(|m| m.id == id)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("mount {id} is not in /proc/self/mountinfo"),
            )
        })
}

/// Every mount of this mount namespace.
pub fn all_mounts() -> io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_line).collect())
}

/// The file systems mounted below `dir` (a canonical path), outermost first: their files
/// are not `dir`'s file system's, so attach neither warms nor keeps them durable.
pub fn mounts_inside(dir: &Path) -> io::Result<Vec<MountEntry>> {
    let mut v: Vec<MountEntry> = all_mounts()?
        .into_iter()
        .filter(|m| m.mount_point != dir && m.mount_point.starts_with(dir))
        .collect();
    v.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    Ok(v)
}

/// "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
fn parse_line(l: &str) -> Option<MountEntry> {
    let (left, right) = l.split_once(" - ")?;
    let f: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    let opts = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
    Some(MountEntry {
        id: f.first()?.parse().ok()?,
        root: unescape(f.get(3)?),
        mount_point: unescape(f.get(4)?),
        mount_opts: opts(f.get(5)?),
        fstype: (*r.first()?).to_owned(),
        source: String::from_utf8_lossy(unescape(r.get(1)?).as_os_str().as_bytes()).into_owned(),
        super_opts: opts(r.get(2).copied().unwrap_or("")),
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(d) = octal {
            let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn lines_are_parsed_with_escapes_and_both_option_lists() {
        let m = parse_line(
            "42 27 7:0 / /var/tmp/a\\040b rw,relatime shared:1 - ext4 /dev/loop0 rw,sync",
        )
        .expect("parse");
        assert_eq!(m.id, 42);
        assert_eq!(m.root, PathBuf::from("/"));
        assert_eq!(m.mount_point, PathBuf::from("/var/tmp/a b"));
        assert_eq!(m.fstype, "ext4");
        assert!(m.has_super_opt("sync") && !m.has_super_opt("dirsync"));
        assert!(!m.read_only());
        let f =
            parse_line("50 1 0:55 / /m rw,nosuid - fuse.dhrd dhrd:/b rw,user_id=0").expect("parse");
        assert_eq!(
            (f.fstype.as_str(), f.source.as_str()),
            ("fuse.dhrd", "dhrd:/b")
        );
        assert!(parse_line("garbage").is_none());
    }

    #[test]
    fn mounts_inside_a_directory_are_below_it_and_not_it() {
        let inside = mounts_inside(Path::new("/")).expect("mounts");
        assert!(inside.iter().all(|m| m.mount_point != Path::new("/")));
        assert!(
            inside.iter().any(|m| m.mount_point == Path::new("/proc")),
            "{inside:?}"
        );
        let none = mounts_inside(Path::new("/proc/self/fdinfo")).expect("mounts");
        assert!(none.is_empty(), "{none:?}");
    }

    #[test]
    fn the_mount_of_a_directory_is_found_by_its_id() {
        let d = std::fs::File::open("/").expect("root");
        let m = mount_of(d.as_fd()).expect("mount of /");
        assert_eq!(m.mount_point, PathBuf::from("/"));
    }
}
