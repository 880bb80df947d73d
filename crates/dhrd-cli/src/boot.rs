//! Mounting at boot: the `mount.fuse.dhrd` helper that mount(8) and systemd's fstab
//! generator run for file systems of type `fuse.dhrd`, and the defaults file.
//!
//! mount(8) runs `/sbin/mount.fuse.dhrd BACKING MOUNTPOINT [-sfnv] [-o OPTIONS]` (the
//! helper is a link to the `dhrd` binary, which recognises its name) and waits for it to
//! exit; the helper therefore runs `dhrd mount ... --daemon`, which returns once the
//! mount answers. Options are dhrd's own (`durability=`, `mem=`, ...), mount(8)'s and
//! fstab's generic ones (ignored: dhrd always mounts `nodev,nosuid`), and systemd's
//! `x-*`. An option the helper does not know is an error, not silently dropped.
//!
//! The defaults file (`/etc/dhrd/dhrd.conf`, or `--config PATH`) holds `KEY=VALUE` lines
//! with the same keys as the mount options; the command line and `-o` override it. The
//! format is also a valid systemd `EnvironmentFile`.

use anyhow::{bail, Context};
use std::ffi::OsString;
use std::path::Path;

/// The defaults file read by every `dhrd mount` when it exists.
pub const CONFIG_PATH_DEFAULT: &str = "/etc/dhrd/dhrd.conf";
/// Name under which the binary acts as mount(8)'s helper (`mount -t fuse.dhrd`).
pub const MOUNT_HELPER_NAME: &str = "mount.fuse.dhrd";

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
/// (`-f`: do everything but mount).
pub fn helper_args(argv: &[OsString]) -> anyhow::Result<Option<Vec<OsString>>> {
    let mut positional: Vec<OsString> = Vec::new();
    let mut flags: Vec<OsString> = Vec::new();
    let mut fake = false;
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        let opts = if s == "-o" {
            Some(
                it.next()
                    .context("-o needs options")?
                    .to_string_lossy()
                    .into_owned(),
            )
        } else {
            s.strip_prefix("-o").map(str::to_owned)
        };
        match (opts, s.as_ref()) {
            (Some(o), _) => {
                for opt in o.split(',').filter(|o| !o.is_empty()) {
                    flags.extend(option_flags(opt)?);
                }
            }
            // sloppy, no mtab, verbose: nothing to do; fake: stop before mounting.
            (None, "-s" | "-n" | "-v") => {}
            (None, "-f") => fake = true,
            (None, f) if f.starts_with('-') => bail!("unknown mount helper flag {f}"),
            (None, _) => positional.push(a.clone()),
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

/// Runs as mount(8)'s helper: mounts in the background and returns once the mount is up.
pub fn run_mount_helper(argv: &[OsString]) -> anyhow::Result<()> {
    let Some(args) = helper_args(argv)? else {
        return Ok(());
    };
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
