//! `dhrd nbd`: argument parsing for the NBD frontend.

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct NbdArgs {
    /// Backing regular file (created or extended to --size) or block device.
    #[arg(long)]
    pub backing: PathBuf,
}

pub fn run(_a: NbdArgs) -> anyhow::Result<()> {
    anyhow::bail!("dhrd nbd is not implemented yet")
}
