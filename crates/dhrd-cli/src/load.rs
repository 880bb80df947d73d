//! `dhrd load`: opens a backing file as a hybrid object and reports the load.

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct LoadArgs {
    pub backing: PathBuf,
}

pub fn run(_a: LoadArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
