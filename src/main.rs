//! The `shardfs` binary: parse the command line, run one command, turn its error into one line
//! on stderr and a non-zero exit.

use clap::Parser;
use shardfs::cli::{Cli, Command};
use shardfs::{compact, demo, inspect, mount};

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Mount { .. } => mount::run(&cli.command.mount_config(cli.verbose).expect("a mount command")),
        Command::Unmount { mountpoint } => mount::unmount(mountpoint),
        Command::Demo { dir } => demo::run(dir, cli.verbose),
        Command::Check { store, repair } => {
            let healthy = mount::open_store(store.address())
                .and_then(|s| inspect::check_command(&*s, *repair).map_err(|e| e.to_string()));
            match healthy {
                Ok(true) => Ok(()),
                Ok(false) => std::process::exit(1),
                Err(message) => {
                    eprintln!("shardfs: {message}");
                    std::process::exit(2);
                }
            }
        }
        Command::Compact { store, arrays } => mount::open_store(store.address())
            .and_then(|s| compact::compact_command(&*s, arrays).map(drop).map_err(|e| e.to_string())),
        Command::Info { store } => {
            mount::open_store(store.address()).and_then(|s| inspect::info_command(&*s).map_err(|e| e.to_string()))
        }
    };
    if let Err(message) = result {
        eprintln!("shardfs: {message}");
        std::process::exit(1);
    }
}
