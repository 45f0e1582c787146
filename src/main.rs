//! The `shardfs` binary: parse the command line, run one command, turn its error into one line
//! on stderr and a non-zero exit.

use shardfs::cli::progress::Bar;
use shardfs::cli::{Cli, Command, generate};
use shardfs::logging::{self, LogTarget};
use shardfs::{compact, csi, demo, inspect, mount};

fn main() {
    let cli = Cli::from_args();
    if matches!(
        cli.command,
        Command::Check { .. } | Command::Info { .. } | Command::Compact { .. } | Command::Refs { .. }
    ) {
        // Reports piped into `head` end quietly when the reader goes, as other tools' do. Not for
        // the daemon, whose sockets must not kill it.
        // SAFETY: restoring a signal's default disposition has no memory effects.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match &cli.command {
        Command::Mount { .. } => mount::run(&cli.command.mount_config(cli.verbose).expect("a mount command")),
        Command::Unmount { mountpoint } => mount::unmount(mountpoint),
        Command::Guard { daemon, mountpoint, log_file, syslog } => {
            let target = match (log_file, syslog) {
                (Some(path), _) => LogTarget::File(path.clone()),
                (None, true) => LogTarget::Syslog,
                (None, false) => LogTarget::Stderr,
            };
            // Its word goes to the daemon's log: the guard has no terminal to answer to.
            logging::init(&target, cli.verbose).map(|()| {
                if let Err(e) = mount::guard::run(*daemon, mountpoint) {
                    log::warn!("{e}");
                }
            })
        }
        Command::Status { mountpoint } => mount::status(mountpoint).map(|text| print!("{text}")),
        Command::Demo { dir } => demo::run(dir, cli.verbose),
        Command::Csi { endpoint, node_id, state_dir } => csi::run(&csi::CsiConfig {
            endpoint: endpoint.clone(),
            node_id: node_id.clone(),
            state_dir: state_dir.clone(),
            verbosity: cli.verbose,
        }),
        Command::Generate { dir } => generate::write_all(dir),
        Command::Check { store, repair, data } => {
            let depth = if *data { inspect::Depth::Data } else { inspect::Depth::Indexes };
            let healthy = mount::open_store(store.address()).and_then(|s| {
                inspect::check_command(&*s, *repair, depth, &Bar::new("checking")).map_err(|e| e.to_string())
            });
            match healthy {
                Ok(true) => Ok(()),
                Ok(false) => std::process::exit(1),
                Err(message) => {
                    eprintln!("shardfs: {message}");
                    std::process::exit(2);
                }
            }
        }
        Command::Compact { store, arrays } => mount::open_store(store.address()).and_then(|s| {
            compact::compact_command(&*s, arrays, &Bar::new("compacting")).map(drop).map_err(|e| e.to_string())
        }),
        Command::Refs { store, zarr_format } => {
            // The references are checked against the store once the walk is done: that check
            // must ask the store itself, not an object store's cached metadata.
            let mut address = store.address();
            address.caching.metadata_ttl = std::time::Duration::ZERO;
            mount::open_store(address)
                .and_then(|s| mount::check_zarr_format(&*s, *zarr_format).map(|()| s))
                .and_then(|s| inspect::refs::refs_command(s, *zarr_format, &mut std::io::stdout().lock()))
        }
        Command::Info { store, zarr_format } => mount::open_store(store.address()).and_then(|s| {
            mount::check_zarr_format(&*s, *zarr_format)?;
            if let Some(refs) = mount::repository_refs(&store.address())? {
                inspect::print_repository_refs(&refs);
            }
            let info = match zarr_format {
                2 => inspect::info_v2_command(&*s),
                _ => inspect::info_command(&*s, &Bar::new("scanning")),
            };
            info.map_err(|e| e.to_string())
        }),
    };
    if let Err(message) = result {
        eprintln!("shardfs: {message}");
        std::process::exit(1);
    }
}
