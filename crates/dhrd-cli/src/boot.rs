//! Mounting at boot: the helpers that mount(8) and umount(8) run for file systems of type
//! `fuse.dhrd`, readiness for systemd, and the defaults file.
//!
//! mount(8) runs `/sbin/mount.fuse.dhrd BACKING MOUNTPOINT [-sfnv] [-o OPTIONS]` (the
//! helper is a link to the `dhrd` binary, which recognises its name) and waits for it to
//! exit; the helper therefore runs `dhrd mount ... --daemon`, which returns once the
//! mount answers. Without that link, mount(8) falls back to fuse3's `mount.fuse`, which
//! runs `dhrd BACKING MOUNTPOINT -o OPTIONS` from `PATH`; `dhrd` takes that form too.
//! Options are dhrd's own (`durability=`, `mem=`, ...), mount(8)'s and fstab's generic ones
//! (ignored: dhrd always mounts `nodev,nosuid`), and systemd's `x-*`. An option the helper
//! does not know is an error, not silently dropped (unless mount(8) was asked to be sloppy).
//!
//! umount(8) runs `/sbin/umount.fuse.dhrd MOUNTPOINT [-nlfvr]` when that link exists (and
//! so does systemd when it stops a mount unit): it is `dhrd umount`, which returns only
//! once every file is flushed and the daemon has exited. A plain unmount also flushes, but
//! after umount(2) has returned, which is too late for whatever comes next at shutdown.
//!
//! The defaults file (`/etc/dhrd/dhrd.conf`, or `--config PATH`) holds `KEY=VALUE` lines
//! with the same keys as the mount options; the command line and `-o` override it. The
//! format is also a valid systemd `EnvironmentFile`.

use anyhow::{bail, Context};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The defaults file read by every `dhrd mount` when it exists.
pub const CONFIG_PATH_DEFAULT: &str = "/etc/dhrd/dhrd.conf";
/// Name under which the binary acts as mount(8)'s helper (`mount -t fuse.dhrd`).
pub const MOUNT_HELPER_NAME: &str = "mount.fuse.dhrd";
/// Name under which the binary acts as umount(8)'s helper for `fuse.dhrd` mounts.
pub const UMOUNT_HELPER_NAME: &str = "umount.fuse.dhrd";
/// How the source of a dhrd mount begins in /proc/self/mountinfo (`dhrd:BACKING`).
const DHRD_SOURCE_PREFIX: &str = "dhrd:";
/// How often an unmount that fell back to umount(2) checks whether the daemon is gone.
const UMOUNT_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);
/// Exit status of a failed helper: libmount's MNT_EX_FAIL ("mount failure"), which
/// mount(8) and umount(8) pass on as their own.
pub const HELPER_EXIT_FAILURE: i32 = 32;
/// Where systemd names the socket for sd_notify(3) messages of a `Type=notify` service.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Generic options mount(8), fstab and systemd pass to every helper; they mean nothing
/// to dhrd (it always mounts read-write, `nodev`, `nosuid`).
const GENERIC_OPTIONS: &[&str] = &[
    "rw",
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "_netdev",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "async",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "nodiratime",
    "diratime",
];

/// A dhrd option as `dhrd mount` flags: `key=value` or a bare `key`.
fn option_flags(opt: &str) -> anyhow::Result<Vec<OsString>> {
    let (key, value) = match opt.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (opt, None),
    };
    let key = key.replace('-', "_");
    let valued = |flag: &str| -> anyhow::Result<Vec<OsString>> {
        match value {
            Some(v) if !v.is_empty() => Ok(vec![flag.into(), v.into()]),
            _ => bail!("mount option {key} needs a value ({key}=...)"),
        }
    };
    let switch = |flag: &str| -> anyhow::Result<Vec<OsString>> {
        match value {
            None | Some("yes" | "true" | "1") => Ok(vec![flag.into()]),
            Some("no" | "false" | "0") => Ok(Vec::new()),
            Some(v) => bail!("mount option {key}={v}: expected yes or no"),
        }
    };
    match key.as_str() {
        "durability" => valued("--durability"),
        "read_path" => valued("--read-path"),
        "mem" => valued("--mem"),
        "chunk" => valued("--chunk"),
        "loader_threads" => valued("--loader-threads"),
        "load_rate" => valued("--load-rate"),
        "threads" => valued("--threads"),
        "object_cache" => valued("--object-cache"),
        "readdirplus" => valued("--readdirplus"),
        "config" => valued("--config"),
        "allow_other" => switch("--allow-other"),
        "no_preload" => switch("--no-preload"),
        "no_pin" => switch("--no-pin"),
        "ro" => bail!("dhrd mounts are read-write; mount option ro is not supported"),
        // Named in an instance file of the systemd unit (dhrd@.service), which passes
        // them as operands; nothing to add here.
        "backing" | "mountpoint" => Ok(Vec::new()),
        k if GENERIC_OPTIONS.contains(&k) || k.starts_with("x_") || k == "comment" => {
            Ok(Vec::new())
        }
        _ => bail!("unknown mount option {opt:?}"),
    }
}

/// `dhrd mount` flags from a defaults file: `KEY=VALUE` lines, `#` comments, blank lines.
pub fn config_flags(path: &Path) -> anyhow::Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut flags = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // Keys in either case (DURABILITY=sync reads as a systemd EnvironmentFile line).
        let opt = match line.split_once('=') {
            Some((k, v)) => format!("{}={}", k.trim().to_lowercase(), v.trim().trim_matches('"')),
            None => line.to_lowercase(),
        };
        flags.extend(
            option_flags(&opt).with_context(|| format!("{} line {}", path.display(), i + 1))?,
        );
    }
    Ok(flags)
}

/// The arguments of `dhrd` once the defaults file is applied: for `dhrd mount`, the
/// file's flags go first (the command line overrides them; `--config PATH` names another
/// file, and is taken out). Other commands are left alone.
pub fn with_config(args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    if args.get(1).map(|a| a != "mount").unwrap_or(true) {
        return Ok(args);
    }
    let mut rest = Vec::with_capacity(args.len());
    let mut config: Option<OsString> = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            config = Some(it.next().context("--config needs a file")?);
        } else if let Some(p) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            config = Some(p.into());
        } else {
            rest.push(a);
        }
    }
    let flags = match &config {
        Some(p) => config_flags(Path::new(p))?,
        None if Path::new(CONFIG_PATH_DEFAULT).exists() => {
            config_flags(Path::new(CONFIG_PATH_DEFAULT))?
        }
        None => Vec::new(),
    };
    let mut out: Vec<OsString> = rest.drain(..2).collect();
    out.extend(flags);
    out.extend(rest);
    Ok(out)
}

/// What mount(8) asked for: `dhrd` arguments for the mount, or None for a fake mount
/// (`-f`: do everything but mount). `argv[0]` is the helper's name (or `dhrd` when fuse3's
/// `mount.fuse` runs it); the operands and flags follow in any order.
pub fn helper_args(argv: &[OsString]) -> anyhow::Result<Option<Vec<OsString>>> {
    let mut positional: Vec<OsString> = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let (mut fake, mut sloppy) = (false, false);
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" => options.push(
                it.next()
                    .context("-o needs options")?
                    .to_string_lossy()
                    .into_owned(),
            ),
            o if o.starts_with("-o") => options.push(o["-o".len()..].to_owned()),
            // The type is known from the helper's name; mount(8) passes it when the
            // helper's name does not end with it (fuse3's mount.fuse, a fuse3.dhrd type).
            "-t" => {
                it.next().context("-t needs a type")?;
            }
            // No mtab, verbose: nothing to do.
            "-n" | "-v" => {}
            "-s" => sloppy = true,
            "-f" => fake = true,
            "-N" => bail!("mounting in another mount namespace (-N) is not supported"),
            f if f.starts_with('-') => bail!("unknown mount helper flag {f}"),
            _ => positional.push(a.clone()),
        }
    }
    let mut flags: Vec<OsString> = Vec::new();
    for opt in options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        match option_flags(opt) {
            Ok(f) => flags.extend(f),
            // Sloppy (mount -s): options meant for other file systems on a shared fstab
            // line are tolerated, as mount(8) promises; they are still named.
            Err(e) if sloppy => {
                eprintln!(
                    "{MOUNT_HELPER_NAME}: ignored: {}",
                    crate::report::chain_text(&e)
                )
            }
            Err(e) => return Err(e),
        }
    }
    let [backing, mountpoint] = <[OsString; 2]>::try_from(positional).map_err(|p| {
        anyhow::anyhow!(
            "usage: {MOUNT_HELPER_NAME} BACKING MOUNTPOINT [-o OPTIONS] (got {} operands)",
            p.len()
        )
    })?;
    if fake {
        return Ok(None);
    }
    let mut out: Vec<OsString> = vec!["dhrd".into(), "mount".into(), backing, mountpoint];
    out.extend(flags);
    out.push("--daemon".into());
    Ok(Some(out))
}

/// Whether `dhrd` was started the way fuse3's `mount.fuse` starts a file system of type
/// `fuse.dhrd` when no `mount.fuse.dhrd` exists: `dhrd BACKING MOUNTPOINT -o OPTIONS`. The
/// first argument is then a path, never one of `subcommands`; a mistyped subcommand is a
/// bare word and still gets clap's message.
pub fn is_fuse3_helper_call(argv: &[OsString], subcommands: &[&str]) -> bool {
    let Some(first) = argv.get(1).map(|a| a.to_string_lossy()) else {
        return false;
    };
    argv.len() >= 3
        && !first.starts_with('-')
        && !subcommands.contains(&first.as_ref())
        && first.contains('/')
}

/// The backing directory of the dhrd daemon serving `mountpoint`, if one answers.
fn served_backing(mountpoint: &Path) -> Option<std::path::PathBuf> {
    let out = dhrd_fuse::control_request(mountpoint, "status-json").ok()?;
    let doc: serde_json::Value = serde_json::from_str(out.trim()).ok()?;
    doc.get("backing")?.as_str().map(std::path::PathBuf::from)
}

/// Runs as mount(8)'s helper: mounts in the background and returns once the mount is up.
pub fn run_mount_helper(argv: &[OsString]) -> anyhow::Result<()> {
    let Some(args) = helper_args(argv)? else {
        return Ok(());
    };
    // `mount -a` runs the helper again for a line already mounted: libmount compares
    // fstab's source with the mount's, and dhrd's source reads `dhrd:BACKING`. The same
    // backing served at the same place is that case, and is done already.
    let (backing, mountpoint) = (Path::new(&args[2]), Path::new(&args[3]));
    if let Some(served) = served_backing(mountpoint) {
        if backing.canonicalize().ok().as_deref() == Some(served.as_path()) {
            eprintln!(
                "{MOUNT_HELPER_NAME}: {} is already mounted on {}",
                backing.display(),
                mountpoint.display()
            );
            return Ok(());
        }
        bail!(
            "{} is already mounted from {}",
            mountpoint.display(),
            served.display()
        );
    }
    let exe = std::env::current_exe().context("locating the dhrd binary")?;
    let st = std::process::Command::new(exe)
        .args(&args[1..])
        .status()
        .context("running dhrd mount")?;
    if !st.success() {
        bail!("dhrd mount failed ({st})");
    }
    Ok(())
}

/// What umount(8) asked its helper for.
#[derive(Debug, PartialEq, Eq)]
pub struct UmountRequest {
    pub mountpoint: OsString,
    /// `-l`: detach now even if busy; the daemon flushes once the last user is gone.
    pub lazy: bool,
    /// `-f`: abort the FUSE connection if a clean unmount is refused.
    pub force: bool,
}

/// Parses `umount.fuse.dhrd MOUNTPOINT [-nlfvr] [-t TYPE] [-N NS]` (util-linux's helper
/// convention; the flags may come in any order).
pub fn umount_helper_args(argv: &[OsString]) -> anyhow::Result<UmountRequest> {
    let mut positional: Vec<OsString> = Vec::new();
    let (mut lazy, mut force) = (false, false);
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_string_lossy().as_ref() {
            "-l" => lazy = true,
            "-f" => force = true,
            // No mtab, verbose; -r (remount read-only if the unmount fails) has nothing to
            // do here: a dhrd mount is never read-only, and a failed unmount stays mounted.
            "-n" | "-v" | "-r" => {}
            "-t" => {
                it.next().context("-t needs a type")?;
            }
            "-N" => bail!("unmounting in another mount namespace (-N) is not supported"),
            f if f.starts_with('-') => bail!("unknown umount helper flag {f}"),
            _ => positional.push(a.clone()),
        }
    }
    let [mountpoint] = <[OsString; 1]>::try_from(positional).map_err(|p| {
        anyhow::anyhow!(
            "usage: {UMOUNT_HELPER_NAME} MOUNTPOINT [-l] [-f] (got {} operands)",
            p.len()
        )
    })?;
    Ok(UmountRequest {
        mountpoint,
        lazy,
        force,
    })
}

/// Runs as umount(8)'s helper: see [`umount`].
pub fn run_umount_helper(argv: &[OsString]) -> anyhow::Result<()> {
    let req = umount_helper_args(argv)?;
    umount(Path::new(&req.mountpoint), req.lazy, req.force)
}

/// `dhrd umount` and umount(8)'s helper: the daemon flushes every file, unmounts and
/// exits, and this returns once it has. When the daemon cannot do it (the mount is busy,
/// or the daemon is gone and left a dead mount with nothing to flush), a dhrd mount is
/// unmounted with umount(2) and the caller's `lazy`/`force`, as umount(8) would do for
/// any file system. Nothing but a dhrd mount is ever unmounted here.
pub fn umount(mnt: &Path, lazy: bool, force: bool) -> anyhow::Result<()> {
    // Only a daemon that answers is asked: without one, `dhrd_fuse::umount` would fall
    // back to fusermount3, which unmounts whatever is mounted there.
    let daemon_err = if dhrd_fuse::control_request(mnt, "status").is_ok() {
        match dhrd_fuse::umount(mnt) {
            // The daemon can answer "ok" without having unmounted (a second request after
            // a busy refusal): believe the mount table, not the reply.
            Ok(()) if !is_dhrd_mount(mnt) => return Ok(()),
            Ok(()) => anyhow::anyhow!("the daemon reported {} unmounted", mnt.display()),
            Err(e) => anyhow::Error::from(e),
        }
    } else {
        anyhow::anyhow!("no dhrd daemon serves {}", mnt.display())
    };
    if !is_dhrd_mount(mnt) {
        return Err(daemon_err);
    }
    let mut flags = 0;
    if lazy {
        flags |= libc::MNT_DETACH;
    }
    if force {
        flags |= libc::MNT_FORCE;
    }
    let c = std::ffi::CString::new(mnt.as_os_str().as_bytes())
        .context("mountpoint contains a NUL byte")?;
    // SAFETY: umount2 reads the NUL-terminated path, which outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        let os_err = std::io::Error::last_os_error();
        bail!(
            "{}: {os_err} ({})",
            mnt.display(),
            crate::report::chain_text(&daemon_err)
        );
    }
    // The session has ended: the daemon flushes every file and exits. Wait for that, as
    // `dhrd umount` does, unless the caller asked to detach and go (the daemon flushes
    // only once the mount's last user is gone).
    if !lazy {
        let t = std::time::Instant::now();
        while dhrd_fuse::control_request(mnt, "status").is_ok()
            && t.elapsed() < dhrd_fuse::daemon::UMOUNT_EXIT_WAIT
        {
            std::thread::sleep(UMOUNT_POLL_INTERVAL);
        }
    }
    Ok(())
}

/// Whether a dhrd mount sits at `path`: a FUSE mount whose source reads `dhrd:BACKING`.
/// The path of a dead mount cannot be resolved; it is then taken as given, made absolute.
fn is_dhrd_mount(path: &Path) -> bool {
    let Ok(abs) = path.canonicalize().or_else(|_| std::path::absolute(path)) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (Some(head), Some(tail)) = (halves.next(), halves.next()) else {
            return false;
        };
        let target = head.split(' ').nth(4).map(unescape_mountinfo);
        let mut t = tail.split(' ');
        let (fstype, source) = (t.next().unwrap_or(""), t.next().unwrap_or(""));
        target.as_deref() == Some(abs.as_os_str())
            && (fstype == "fuse" || fstype == "fuse.dhrd")
            && source.starts_with(DHRD_SOURCE_PREFIX)
    })
}

/// A mountinfo field with the kernel's octal escapes (`\040` for a space, ...) undone.
fn unescape_mountinfo(field: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (b[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

/// The systemd notification socket of a `Type=notify` service, taken out of the
/// environment so that no process started later (fusermount3, a shell) mistakes itself
/// for the service. Call before any thread exists.
pub fn take_notify_socket() -> Option<OsString> {
    let s = std::env::var_os(NOTIFY_SOCKET_ENV)?;
    std::env::remove_var(NOTIFY_SOCKET_ENV);
    (!s.is_empty()).then_some(s)
}

/// Sends one sd_notify(3) message (`READY=1`, ...) to systemd: a datagram on the unix
/// socket it named, where a leading `@` means the abstract namespace.
pub fn sd_notify(socket: &OsStr, msg: &str) -> std::io::Result<()> {
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = socket.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None => SocketAddr::from_pathname(Path::new(socket))?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(msg.as_bytes(), &addr)?;
    Ok(())
}

/// How a `--daemon` start waits for the background daemon it started.
pub struct Background<'a> {
    /// The user passed `--quiet` already (clap rejects it twice).
    pub quiet_given: bool,
    /// Where the daemon's output goes (next to its control socket).
    pub log_path: &'a Path,
    /// Longest wait for `ready`, and the pause between two asks.
    pub start_wait: std::time::Duration,
    pub poll_interval: std::time::Duration,
    /// What the daemon is to do, for the error: "attach", "answer".
    pub verb: &'a str,
}

/// `--daemon`: runs this same command without `--daemon` (and with `--quiet`: the
/// background daemon has no terminal for a progress line) in a new session, its output in
/// `b.log_path`, and returns its pid once `ready` holds. The background daemon is not the
/// process a Type=notify unit started: systemd would reject its messages, so it gets no
/// NOTIFY_SOCKET. A daemon that exits first fails the start with its log.
pub fn spawn_background(b: &Background<'_>, ready: impl Fn() -> bool) -> anyhow::Result<u32> {
    let exe = std::env::current_exe().context("locating the dhrd binary")?;
    // args_os: paths need not be UTF-8.
    let mut args: Vec<OsString> = std::env::args_os()
        .skip(1)
        .filter(|x| x != "--daemon")
        .collect();
    if !b.quiet_given {
        args.push("--quiet".into());
    }
    let log =
        std::fs::File::create(b.log_path).with_context(|| format!("{}", b.log_path.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .env_remove(NOTIFY_SOCKET_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the background daemon")?;
    let t = std::time::Instant::now();
    while t.elapsed() < b.start_wait {
        if let Some(st) = child.try_wait()? {
            let log = std::fs::read_to_string(b.log_path).unwrap_or_default();
            bail!("the daemon exited ({st}): {}", log.trim());
        }
        if ready() {
            return Ok(child.id());
        }
        std::thread::sleep(b.poll_interval);
    }
    bail!(
        "the daemon did not {} within {:?}; see {}",
        b.verb,
        b.start_wait,
        b.log_path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_options_become_flags_and_generic_ones_are_ignored() -> anyhow::Result<()> {
        let argv = os(&[
            "/sbin/mount.fuse.dhrd",
            "/b",
            "/m",
            "-o",
            "rw,nofail,durability=fsync,mem=4G,allow_other,x-systemd.requires-mounts-for=/b",
        ]);
        let got = helper_args(&argv)?.unwrap_or_default();
        let want = os(&[
            "dhrd",
            "mount",
            "/b",
            "/m",
            "--durability",
            "fsync",
            "--mem",
            "4G",
            "--allow-other",
            "--daemon",
        ]);
        assert_eq!(got, want);
        assert!(helper_args(&os(&["h", "/b", "/m", "-f"]))?.is_none());
        assert!(helper_args(&os(&["h", "/b", "/m", "-o", "bogus=1"])).is_err());
        assert!(helper_args(&os(&["h", "/b", "-o", "mem=1G"])).is_err());
        assert!(helper_args(&os(&["h", "/b", "/m", "-o", "ro"])).is_err());
        Ok(())
    }

    #[test]
    fn config_file_goes_first_and_the_command_line_wins() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("dhrd.conf");
        std::fs::write(
            &p,
            "# defaults\nDURABILITY=fsync\n mem = 2G \n\nallow_other=no\n",
        )?;
        let args = os(&[
            "dhrd",
            "mount",
            "/b",
            "/m",
            "--config",
            &p.to_string_lossy(),
            "--mem",
            "1G",
        ]);
        let got = with_config(args)?;
        assert_eq!(
            got,
            os(&[
                "dhrd",
                "mount",
                "--durability",
                "fsync",
                "--mem",
                "2G",
                "/b",
                "/m",
                "--mem",
                "1G"
            ])
        );
        std::fs::write(&p, "speed=fast\n")?;
        let args = os(&[
            "dhrd",
            "mount",
            "/b",
            "/m",
            "--config",
            &p.to_string_lossy(),
        ]);
        assert!(
            with_config(args).is_err(),
            "an unknown key must be an error"
        );
        // Other commands are left alone.
        let st = os(&["dhrd", "status", "/m"]);
        assert_eq!(with_config(st.clone())?, st);
        Ok(())
    }
}
