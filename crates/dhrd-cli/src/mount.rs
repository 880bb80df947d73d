//! `dhrd mount`, `dhrd umount`, `dhrd status`: argument parsing for the FUSE frontend.

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct MountArgs {
    /// Directory holding the durable copy of every file.
    pub backing_dir: PathBuf,
    /// Where the file system appears.
    pub mountpoint: PathBuf,
}

#[derive(Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
}

#[derive(Args)]
pub struct StatusArgs {
    pub mountpoint: PathBuf,
}

pub fn run_mount(_a: MountArgs) -> anyhow::Result<()> {
    anyhow::bail!("dhrd mount is not implemented yet")
}

pub fn run_umount(_a: UmountArgs) -> anyhow::Result<()> {
    anyhow::bail!("dhrd umount is not implemented yet")
}

pub fn run_status(_a: StatusArgs) -> anyhow::Result<()> {
    anyhow::bail!("dhrd status is not implemented yet")
}
