//! Which set-user-ID / set-group-ID bits a write, truncate, fallocate or chown of a regular
//! file must drop. The kernel leaves this to the FUSE server for `FOPEN_DIRECT_IO` writes
//! (always) and, once the server negotiates `FUSE_HANDLE_KILLPRIV_V2`, for cached writes,
//! size changes, chown and fallocate as well (see docs/fuse.md, "setuid/setgid").
//!
//! The rule is the VFS one (fs/attr.c, `setattr_should_drop_suidgid`), for a caller that
//! lacks CAP_FSETID: S_ISUID always; S_ISGID if S_IXGRP is set, or, without S_IXGRP, if the
//! caller is not a member of the file's group. A caller with CAP_FSETID keeps both.
//!
//! Where the caller's CAP_FSETID comes from:
//! - writes: the kernel sets `FUSE_WRITE_KILL_SUIDGID` exactly when the writer lacks it.
//! - size changes, chown: the kernel says so with `FATTR_KILL_SUIDGID` in the SETATTR valid
//!   mask, which fuser 0.18 does not pass on; fallocate has no such flag at all. So the
//!   daemon reads `/proc/<pid>/status` of the requesting thread: CapEff bit CAP_FSETID,
//!   and the thread must be in the initial user namespace (`capable()` checks that one).
//!   If the process is gone (or its pid is not visible, pid 0), it counts as having the
//!   capability only if its uid is 0.
//!
//! Group membership is the request's fsgid plus the supplementary groups of
//! `/proc/<pid>/status` (none if the process is gone).
//!
//! Cost: `/proc` is read only when the file has S_ISUID or S_ISGID (rare); the common case
//! is one mode test.
//!
//! Approximation: the capability is read after the fact, while the kernel decided when the
//! request was made; the caller is blocked in the system call meanwhile, so they differ only
//! if another thread of it changes its credentials, or it is killed and its pid is reused,
//! within that window.

use std::os::unix::fs::MetadataExt;

/// CAP_FSETID (include/uapi/linux/capability.h).
const CAP_FSETID: u32 = 4;
/// Inode number of the initial user namespace under /proc/*/ns (PROC_USER_INIT_INO, fixed
/// since Linux 3.8).
const PROC_USER_INIT_INO: u64 = 0xEFFF_FFFD;

/// The credentials the kernel sent with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// fsuid of the requesting thread.
    pub uid: u32,
    /// fsgid of the requesting thread.
    pub gid: u32,
    /// Thread id of the requester in the daemon's pid namespace, 0 if not visible there.
    pub pid: u32,
}

/// What is known about the caller's CAP_FSETID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsetid {
    /// The kernel said the caller lacks it (`FUSE_WRITE_KILL_SUIDGID`).
    Lacks,
    /// Look it up in /proc if the file has a set-id bit.
    LookUp,
}

/// What /proc says about a thread.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcCreds {
    cap_fsetid: bool,
    groups: Vec<u32>,
}

/// Parses `/proc/<pid>/status`; `user_ns` is the inode of `/proc/<pid>/ns/user` if readable
/// (without it the capability is judged by CapEff alone).
fn parse_status(text: &str, user_ns: Option<u64>) -> Option<ProcCreds> {
    let mut cap_eff = None;
    let mut groups = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("CapEff:") {
            cap_eff = u64::from_str_radix(v.trim(), 16).ok();
        } else if let Some(v) = line.strip_prefix("Groups:") {
            groups = v
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        }
    }
    let in_init_ns = !matches!(user_ns, Some(ino) if ino != PROC_USER_INIT_INO);
    Some(ProcCreds {
        cap_fsetid: in_init_ns && cap_eff? & (1 << CAP_FSETID) != 0,
        groups,
    })
}

fn read_proc(pid: u32) -> Option<ProcCreds> {
    if pid == 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/user"))
        .ok()
        .map(|m| m.ino());
    parse_status(&text, ns)
}

/// The set-id bits (`S_ISUID` | `S_ISGID`) to clear from a file of `mode` and group
/// `file_gid` before `caller` changes it; 0 in the common case, without reading /proc.
pub fn bits_to_drop(mode: u32, file_gid: u32, caller: &Caller, fsetid: Fsetid) -> u32 {
    if mode & libc::S_IFMT != libc::S_IFREG || mode & (libc::S_ISUID | libc::S_ISGID) == 0 {
        return 0;
    }
    let mut proc: Option<Option<ProcCreds>> = None;
    let mut creds = || proc.get_or_insert_with(|| read_proc(caller.pid)).clone();
    let lacks = match fsetid {
        Fsetid::Lacks => true,
        Fsetid::LookUp => match creds() {
            Some(c) => !c.cap_fsetid,
            None => caller.uid != 0,
        },
    };
    rule(mode, lacks, || {
        caller.gid == file_gid || creds().is_some_and(|c| c.groups.contains(&file_gid))
    })
}

/// Whether giving a regular file of group `file_gid` the set-id bits of `new_mode` is
/// unsafe while `writers` hold writable opens whose writes the daemon never sees
/// (passthrough): one of their writes would have to drop a bit, and nothing would.
pub fn unsafe_with_unseen_writers(new_mode: u32, file_gid: u32, writers: &[Caller]) -> bool {
    let mode = libc::S_IFREG | (new_mode & 0o7777);
    writers
        .iter()
        .any(|w| bits_to_drop(mode, file_gid, w, Fsetid::LookUp) != 0)
}

/// setattr_should_drop_suidgid for a regular file.
fn rule(mode: u32, lacks_fsetid: bool, in_group: impl FnOnce() -> bool) -> u32 {
    if !lacks_fsetid {
        return 0;
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group()) {
        kill |= libc::S_ISGID;
    }
    kill
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    const REG: u32 = libc::S_IFREG;

    #[test]
    fn a_setid_bit_is_unsafe_only_with_a_writer_whose_write_would_drop_it() {
        // pid 0: nothing to read in /proc; the uid decides the capability.
        let root = Caller {
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let nobody = Caller {
            uid: 65534,
            gid: 65534,
            pid: 0,
        };
        assert!(!unsafe_with_unseen_writers(0o4755, 0, &[]));
        assert!(!unsafe_with_unseen_writers(0o4755, 0, &[root]));
        assert!(unsafe_with_unseen_writers(0o4755, 0, &[root, nobody]));
        // Set-group-ID without group execute: kept for a member's writes.
        assert!(!unsafe_with_unseen_writers(0o2765, 65534, &[nobody]));
        assert!(unsafe_with_unseen_writers(0o2765, 0, &[nobody]));
        assert!(!unsafe_with_unseen_writers(0o0777, 0, &[nobody]));
    }

    #[test]
    fn rule_follows_the_vfs() {
        let member = || true;
        let stranger = || false;
        assert_eq!(rule(REG | 0o6777, true, member), 0o6000);
        assert_eq!(rule(REG | 0o6777, false, stranger), 0);
        assert_eq!(rule(REG | 0o4755, true, member), 0o4000);
        // Set-group-ID without group execute: kept for members, dropped for others.
        assert_eq!(rule(REG | 0o2767, true, member), 0);
        assert_eq!(rule(REG | 0o2767, true, stranger), 0o2000);
        assert_eq!(rule(REG | 0o6767, true, member), 0o4000);
        assert_eq!(rule(REG | 0o0777, true, stranger), 0);
    }

    #[test]
    fn common_case_reads_nothing() {
        // pid 0 would make any lookup fall back; uid 0 would then keep the bits.
        let c = Caller {
            uid: 1000,
            gid: 1000,
            pid: 0,
        };
        assert_eq!(bits_to_drop(REG | 0o777, 0, &c, Fsetid::LookUp), 0);
        assert_eq!(
            bits_to_drop(libc::S_IFDIR | 0o6777, 0, &c, Fsetid::Lacks),
            0
        );
        assert_eq!(bits_to_drop(REG | 0o6777, 0, &c, Fsetid::LookUp), 0o6000);
        let root = Caller { uid: 0, ..c };
        assert_eq!(bits_to_drop(REG | 0o6777, 0, &root, Fsetid::LookUp), 0);
        assert_eq!(bits_to_drop(REG | 0o6777, 0, &root, Fsetid::Lacks), 0o6000);
    }

    #[test]
    fn status_parsing() {
        let text = "Name:\tx\nUid:\t0\t0\t0\t0\nGroups:\t4 24 100 \nCapEff:\t000001ffffffffff\n";
        let c = parse_status(text, Some(PROC_USER_INIT_INO)).expect("parsed");
        assert!(c.cap_fsetid);
        assert_eq!(c.groups, vec![4, 24, 100]);
        // Full capabilities in another user namespace do not count.
        assert!(
            !parse_status(text, Some(4026532000))
                .expect("parsed")
                .cap_fsetid
        );
        let none = "Groups:\t\nCapEff:\t0000000000000000\n";
        let c = parse_status(none, None).expect("parsed");
        assert!(!c.cap_fsetid);
        assert!(c.groups.is_empty());
        assert_eq!(parse_status("Name:\tx\n", None), None);
    }

    #[test]
    fn proc_is_read_for_visible_pids_only() {
        assert!(read_proc(std::process::id()).is_some());
        assert!(read_proc(0).is_none());
    }
}
