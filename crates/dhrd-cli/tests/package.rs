//! The Debian package, built and installed as a user would: `scripts/build-deb.sh` makes
//! the package and its -dbgsym companion (cargo-deb, release build), `dpkg -i` installs
//! both into the real system (as CI does, on a machine it throws away), and the test checks
//! what was installed: `dhrd --version`, `man dhrd` and a subcommand's page, the mount
//! helpers, the completions, the defaults file as a conffile, `systemd-analyze verify` of
//! the installed unit, and the binary stripped with its debug information where gdb looks
//! for it (/usr/lib/debug/.build-id/). `dpkg -P` removes both again, also when a check
//! fails, and the test checks that nothing is left.
//!
//! Needs root, dpkg, man-db, binutils, systemd's tools and cargo-deb (all installed by
//! scripts/install-deps.sh). It refuses to run over a dhrd package that is installed
//! already: it would replace and then remove it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PACKAGES: [&str; 2] = ["dhrd", "dhrd-dbgsym"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Purges the packages when the test ends, however it ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").arg("--purge").args(PACKAGES).output();
    }
}

/// The ELF section names of `file`.
fn sections(file: &Path) -> String {
    stdout(
        Command::new("readelf")
            .args(["--section-headers", "--wide"])
            .arg(file),
    )
}

/// The GNU build id of `file`, in hex.
fn build_id(file: &Path) -> String {
    let notes = stdout(Command::new("readelf").arg("--notes").arg(file));
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build id:\n{notes}", file.display()))
        .trim()
        .to_string()
}

#[test]
fn the_package_installs_a_working_dhrd_and_removes_cleanly() {
    // SAFETY: getuid has no preconditions.
    assert_eq!(unsafe { libc::getuid() }, 0, "dpkg -i needs root");
    for p in PACKAGES {
        assert!(
            !installed(p),
            "a {p} package is installed already; remove it (dpkg -P {p}) so that this \
             test can install and remove its own"
        );
    }
    let out = tempfile::tempdir().unwrap();
    let built = stdout(
        Command::new("bash")
            .arg(workspace().join("scripts/build-deb.sh"))
            .arg(out.path()),
    );
    let deb = |suffix: &str| {
        built
            .lines()
            .map(str::trim)
            .find(|l| l.ends_with(suffix))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("no {suffix} in build-deb.sh's output:\n{built}"))
    };
    let (main, dbgsym) = (deb(".deb"), deb(".ddeb"));

    let _guard = Installed;
    run(Command::new("dpkg")
        .arg("--install")
        .arg(&main)
        .arg(&dbgsym));

    let version = stdout(Command::new("/usr/bin/dhrd").arg("--version"));
    assert_eq!(
        version.trim(),
        format!("dhrd {}", env!("CARGO_PKG_VERSION")),
        "dhrd --version"
    );

    // The pages are found by man(1) itself, as a user would find them.
    assert_eq!(
        stdout(Command::new("man").args(["-w", "dhrd"])).trim(),
        "/usr/share/man/man1/dhrd.1.gz"
    );
    let page = stdout(
        Command::new("man")
            .args(["-P", "cat", "dhrd"])
            .env("MANWIDTH", "80"),
    );
    for want in ["dhrd", "mount", "nbd", "status"] {
        assert!(page.contains(want), "man dhrd lacks {want:?}:\n{page}");
    }
    let mount_page = stdout(
        Command::new("man")
            .args(["-P", "cat", "dhrd-mount"])
            .env("MANWIDTH", "80"),
    );
    assert!(
        mount_page.contains("--durability"),
        "man dhrd-mount lacks --durability:\n{mount_page}"
    );
    assert!(
        !page.contains("generate-dist") && !mount_page.contains("generate-dist"),
        "the packaging command shows in the pages"
    );

    // mount(8) and umount(8) find their helpers, and they are dhrd.
    for helper in ["/sbin/mount.fuse.dhrd", "/sbin/umount.fuse.dhrd"] {
        let to = std::fs::canonicalize(helper).unwrap_or_else(|e| panic!("{helper}: {e}"));
        assert_eq!(to, Path::new("/usr/bin/dhrd"), "{helper}");
    }

    // Completions where each shell looks, and bash's loads.
    for file in [
        "/usr/share/zsh/vendor-completions/_dhrd",
        "/usr/share/fish/vendor_completions.d/dhrd.fish",
    ] {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains("durability"), "{file} lacks the options");
    }
    let bash = stdout(Command::new("bash").args([
        "-c",
        "source /usr/share/bash-completion/completions/dhrd && complete -p dhrd",
    ]));
    assert!(bash.contains("dhrd"), "bash completion: {bash}");

    // The defaults file is a conffile: an administrator's edits survive upgrades.
    let conffiles = stdout(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "dhrd"]));
    assert!(
        conffiles.contains("/etc/dhrd/dhrd.conf"),
        "conffiles: {conffiles}"
    );

    // The installed unit, as systemd would load it (an instance of the template).
    let unit = std::fs::read_to_string("/usr/lib/systemd/system/dhrd@.service").unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/dhrd mount"), "{unit}");
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "dhrd@pkgtest.service"])
        .output()
        .expect("systemd-analyze");
    let err = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && !err.lines().any(|l| l.contains("dhrd@")),
        "systemd-analyze verify dhrd@pkgtest.service: {}\n{err}",
        verify.status
    );

    // Stripped, with the debug information split off as Debian does: in the -dbgsym
    // package under the binary's build id, named by its .gnu_debuglink.
    let bin = Path::new("/usr/bin/dhrd");
    let bin_sections = sections(bin);
    assert!(
        !bin_sections.contains(".debug_info") && bin_sections.contains(".gnu_debuglink"),
        "/usr/bin/dhrd is not stripped with a debug link:\n{bin_sections}"
    );
    let id = build_id(bin);
    let debug = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    assert!(debug.is_file(), "{} is missing", debug.display());
    assert!(
        sections(&debug).contains(".debug_info"),
        "{} has no debug information",
        debug.display()
    );
    assert_eq!(build_id(&debug), id);
    let link = stdout(
        Command::new("readelf")
            .args(["--string-dump=.gnu_debuglink"])
            .arg(bin),
    );
    assert!(
        link.contains(&format!("{}.debug", &id[2..])),
        "the debug link does not name {}: {link}",
        debug.display()
    );

    // Removal: nothing of the package stays, the conffile goes with the purge.
    run(Command::new("dpkg").arg("--purge").args(PACKAGES));
    for p in PACKAGES {
        assert!(!installed(p), "{p} still installed after dpkg --purge");
    }
    for gone in [
        "/usr/bin/dhrd",
        "/sbin/mount.fuse.dhrd",
        "/usr/lib/systemd/system/dhrd@.service",
        "/etc/dhrd/dhrd.conf",
        "/usr/share/man/man1/dhrd.1.gz",
    ] {
        assert!(
            std::fs::symlink_metadata(gone).is_err(),
            "{gone} left after dpkg --purge"
        );
    }
    assert!(
        !debug.exists(),
        "{} left after dpkg --purge",
        debug.display()
    );
}
