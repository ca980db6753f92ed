//! `frugal plan`: not built yet; its issue replaces this module.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`frugal plan` is not built yet")
}
