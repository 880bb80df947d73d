//! `dhrd --generate-dist DIR`: the files a package installs that are derived from the
//! command line's own definition, so that they cannot drift from it. DIR/man/ gets a man
//! page per command (`dhrd.1`, `dhrd-mount.1`, ...; clap_mangen), DIR/completions/ the
//! completions for bash, zsh and fish (clap_complete). `scripts/build-deb.sh` runs it; it
//! is not a user command, so it is in neither the pages nor the completions.
//!
//! Invariants: every visible subcommand has its page, and each file written is non-empty.
//! Crash semantics: none (it only writes files; an error exits 1 and may leave part of DIR
//! written).

use anyhow::{ensure, Context, Result};
use clap::Parser;
use clap_complete::Shell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The first argument that selects this instead of the user commands.
pub const FLAG: &str = "--generate-dist";

#[derive(Parser)]
#[command(
    name = "dhrd --generate-dist",
    about = "Write man pages and completions (packaging)"
)]
struct Args {
    /// Directory to write `man/` and `completions/` into (created if missing).
    out: PathBuf,
}

/// The shells completions are made for, and the file name each one looks for.
const SHELLS: [(Shell, &str); 3] = [
    (Shell::Bash, "dhrd"),
    (Shell::Zsh, "_dhrd"),
    (Shell::Fish, "dhrd.fish"),
];

/// `argv` starts with [`FLAG`]; `cli` is the user command line the files describe.
pub fn run(cli: clap::Command, argv: &[OsString]) -> Result<()> {
    let a = Args::parse_from(argv);
    let man = a.out.join("man");
    create_dir(&man)?;
    clap_mangen::generate_to(cli.clone(), &man)
        .with_context(|| format!("writing man pages into {}", man.display()))?;
    let mut pages = 0;
    for entry in std::fs::read_dir(&man)? {
        let path = entry?.path();
        ensure!(
            std::fs::metadata(&path)?.len() > 0,
            "{} is empty",
            path.display()
        );
        pages += 1;
    }
    let expected = 1 + cli.get_subcommands().filter(|c| !c.is_hide_set()).count();
    ensure!(
        pages == expected,
        "{pages} man pages written, expected {expected}"
    );
    let completions = a.out.join("completions");
    create_dir(&completions)?;
    for (shell, file) in SHELLS {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cli.clone(), "dhrd", &mut text);
        ensure!(!text.is_empty(), "no {shell} completion was generated");
        let path = completions.join(file);
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn pages_and_completions_cover_the_user_commands_only() {
        let dir = tempfile::tempdir().unwrap();
        let argv: Vec<OsString> = vec![FLAG.into(), dir.path().into()];
        run(crate::Cli::command(), &argv).unwrap();
        let mut pages: Vec<String> = std::fs::read_dir(dir.path().join("man"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        pages.sort();
        assert_eq!(
            pages,
            [
                "dhrd-attach.1",
                "dhrd-detach.1",
                "dhrd-load.1",
                "dhrd-mount.1",
                "dhrd-nbd.1",
                "dhrd-status.1",
                "dhrd-umount.1",
                "dhrd.1"
            ]
        );
        let mount = std::fs::read_to_string(dir.path().join("man/dhrd-mount.1")).unwrap();
        assert!(mount.contains("durability"), "{mount}");
        for (_, file) in SHELLS {
            let text = std::fs::read_to_string(dir.path().join("completions").join(file)).unwrap();
            assert!(text.contains("mount") && text.contains("nbd"), "{file}");
            assert!(
                !text.contains("generate-dist"),
                "{file} offers the packaging command"
            );
        }
    }
}
