//! The `shardfs` binary: parse the command line, run one command, turn its error into one line
//! on stderr and a non-zero exit.

use clap::Parser;
use shardfs::cli::{Cli, Command};
use shardfs::{demo, mount};

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Mount { .. } => mount::run(&cli.command.mount_config(cli.verbose).expect("a mount command")),
        Command::Unmount { mountpoint } => mount::unmount(mountpoint),
        Command::Demo { dir } => demo::run(dir, cli.verbose),
    };
    if let Err(message) = result {
        eprintln!("shardfs: {message}");
        std::process::exit(1);
    }
}
