//! The command line: clap definitions turned into the typed configuration of each command, and
//! the mount(8) helper form (`shardfs STORE MOUNTPOINT -o OPTIONS`) turned into `shardfs mount`.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

use crate::format::icechunk::Version;
use crate::fs::WriteOptions;
use crate::fuse::MountSettings;
use crate::mount::{MountConfig, RepositoryOptions, StoreAddress};
use crate::store::bucket::Caching;
use crate::store::bucket::azure::AzureOptions;
use crate::store::bucket::disk_cache::DiskSettings;
use crate::store::bucket::gcs::GcsOptions;
use crate::store::bucket::s3::S3Options;
use crate::store::memory_budget::MemoryBudget;
use crate::write::pending::Policy;

pub mod generate;
pub mod progress;

/// Mount a sharded Zarr v3 store and see the equivalent unsharded store: one file per inner chunk.
#[derive(Debug, Parser)]
#[command(name = "shardfs", version, after_help = HELPER_FORM)]
pub struct Cli {
    /// More log output: -v info, -vv debug, -vvv trace (RUST_LOG overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// How mount(8), /etc/fstab and systemd reach shardfs, for `--help` and the man page.
const HELPER_FORM: &str = "\
As a mount(8) helper: `shardfs STORE MOUNTPOINT [-o OPTIONS]` is `shardfs mount`, and every flag of \
`shardfs mount` has an -o spelling (cache_size=64M, zarr_format=2, no_sign_request, foreground, \
shard_new=4:2 with colons for commas, ...), so that `mount -t fuse.shardfs STORE MOUNTPOINT -o ro` \
and the fstab line `STORE MOUNTPOINT fuse.shardfs ro,noauto 0 0` work. The options mount(8) and \
systemd pass along (defaults, auto, noauto, user, users, nofail, _netdev, x-systemd.*, ...) are \
ignored.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount STORE at MOUNTPOINT; returns once the mount is ready and serves from the background.
    Mount {
        #[command(flatten)]
        store: StoreArgs,
        /// An empty directory to show the unsharded view in.
        mountpoint: PathBuf,
        /// The Zarr version the view shows: 3 (the unsharded v3 store), or 2 (the same arrays as a
        /// Zarr v2 store, for v2-only readers).
        #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=3))]
        zarr_format: u8,
        /// Stay attached and serve until unmounted or interrupted.
        #[arg(short, long)]
        foreground: bool,
        /// Mount read-only: every change fails with EROFS, and the store is never written.
        #[arg(long)]
        read_only: bool,
        /// Mount options as for mount(8), comma-separated or repeated: allow_other, allow_root,
        /// default_permissions, auto_unmount, ro, nodev, nosuid, noexec, noatime, fsname=NAME
        /// (default: STORE), ..., and any flag of this command as NAME=VALUE (cache_size=1G).
        #[arg(short = 'o', value_delimiter = ',', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Worker threads serving the kernel's requests.
        #[arg(long, default_value_t = default_threads())]
        threads: usize,
        /// Take the kernel's requests over io_uring (FUSE over io_uring: Linux 6.14 and later,
        /// with the fuse module's enable_uring on), one ring per thread; /dev/fuse where the
        /// kernel does not offer it.
        #[arg(long)]
        io_uring: bool,
        /// Memory for decoded shard indexes, in bytes (suffixes K, M, G); default: a sixteenth of
        /// --memory-limit.
        #[arg(long, value_parser = parse_size, value_name = "BYTES")]
        cache_size: Option<usize>,
        /// Show an array unsharded only if one shard's index needs at most this many bytes of
        /// memory (K, M, G; at most the default, 2^24 entries); bigger ones are shown as stored.
        #[arg(long, value_parser = parse_size, default_value = "256M", value_name = "BYTES")]
        max_index_size: usize,
        /// On a local store, commit a shard's pending chunk writes once they reach this many bytes
        /// (K, M, G); on an object store a shard is committed whole, once all its chunks are
        /// written or it is left alone.
        #[arg(long, value_parser = parse_size, default_value = "64M", value_name = "BYTES")]
        commit_bytes: usize,
        /// Memory for chunk writes not yet committed (K, M, G): past it writers wait for commits;
        /// default: a quarter of --memory-limit.
        #[arg(long, value_parser = parse_size, value_name = "BYTES")]
        write_buffer_size: Option<usize>,
        /// Store arrays created through the view sharded, with K inner chunks per shard along
        /// each dimension (or one K per dimension: 2,2,8); without it they are stored as written.
        #[arg(long, value_delimiter = ',', value_name = "K")]
        shard_new: Option<Vec<u64>>,
        /// Commit a shard's pending chunk writes after this many milliseconds without a write
        /// (on an Icechunk branch, also the Icechunk commit of what was written).
        #[arg(long, default_value_t = 2000, value_name = "MS")]
        commit_idle_ms: u64,
        /// An Icechunk branch: the message of the commits this mount makes (default: one naming
        /// shardfs and what changed).
        #[arg(long, value_name = "TEXT")]
        message: Option<String>,
        /// Append log lines to this file (default: stderr in the foreground, syslog otherwise).
        #[arg(long, value_name = "PATH")]
        log_file: Option<PathBuf>,
        /// Serve the mount's metrics (store requests, bytes, cache hits, pending chunks, commits,
        /// errors) as Prometheus text at http://HOST:PORT/metrics; port 0 picks a free one
        /// (`shardfs status` finds it).
        #[arg(long, value_name = "HOST:PORT")]
        metrics_address: Option<String>,
    },
    /// The guard a daemon starts for itself (src/mount/guard.rs): aborts the daemon's FUSE
    /// connection once the daemon dies. Not for users.
    #[command(hide = true)]
    Guard {
        /// The daemon's process ID (the guard's parent).
        daemon: u32,
        /// The daemon's mount point.
        mountpoint: PathBuf,
        /// Append log lines to this file.
        #[arg(long, value_name = "PATH")]
        log_file: Option<PathBuf>,
        /// Send log lines to syslog (default: stderr).
        #[arg(long)]
        syslog: bool,
    },
    /// Unmount a shardfs mount (umount and fusermount3 -u work too).
    Unmount { mountpoint: PathBuf },
    /// Print the metrics of the shardfs mount at MOUNTPOINT (mounted with --metrics-address).
    Status { mountpoint: PathBuf },
    /// Verify every shard of STORE (checksums, bounds, overlaps, unfinished commits). Exit status
    /// 0: healthy, 1: damage remains, 2: the store could not be checked.
    Check {
        #[command(flatten)]
        store: StoreArgs,
        /// Settle unfinished commits from the journal (roll torn appends back) before checking.
        #[arg(long)]
        repair: bool,
        /// Also read and decode every stored inner chunk with its array's codecs (crc32c
        /// verified, gzip, zstd and blosc decompressed to the chunk's length).
        #[arg(long)]
        data: bool,
    },
    /// Rewrite the shards of STORE (or only of the arrays at the given paths) without unused
    /// space, atomically; safe beside a running mount.
    Compact {
        #[command(flatten)]
        store: StoreArgs,
        /// Array paths inside the store, e.g. `group/temperature`.
        arrays: Vec<String>,
    },
    /// Per sharded array of STORE: shards, chunks, live, unused and index bytes (with
    /// --zarr-format 2: which arrays a Zarr v2 view can show, and why not the others, and which
    /// groups' OME-Zarr 0.5 metadata it shows as 0.4).
    Info {
        #[command(flatten)]
        store: StoreArgs,
        /// With 2: per Zarr v3 array, whether a Zarr v2 view can show it, or why not; per group
        /// with OME-Zarr metadata, whether it is shown as OME-Zarr 0.4, or why not.
        #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=3))]
        zarr_format: u8,
    },
    /// Print a kerchunk reference file (version 1) of STORE's unsharded view, for readers without
    /// FUSE (fsspec's ReferenceFileSystem): metadata inline, each chunk as [shard URL, offset,
    /// length].
    Refs {
        #[command(flatten)]
        store: StoreArgs,
        /// The Zarr version of the view referenced: 3 (the unsharded v3 store) or 2.
        #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=3))]
        zarr_format: u8,
    },
    /// Write a small sharded sample store to DIR/store and mount it at DIR/view in the foreground.
    Demo {
        #[arg(default_value = "shardfs-demo")]
        dir: PathBuf,
    },
    /// Serve the Kubernetes CSI node plugin (driver shardfs.csi.zarr.dev): the Identity and Node
    /// services on a unix socket, each published volume a `shardfs mount` at the pod's target
    /// path (docs/kubernetes.md).
    Csi {
        /// The socket to serve, as the CSI sidecars name it: unix:///csi/csi.sock.
        #[arg(long, value_name = "URL")]
        endpoint: String,
        /// This node's name, as NodeGetInfo reports it (in Kubernetes: the pod's spec.nodeName).
        #[arg(long, value_name = "NAME")]
        node_id: String,
        /// Where the record of each published volume and its daemon's log are kept, so that a
        /// restarted driver finds its mounts; default: `volumes/` beside the socket.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Write the man pages (shardfs.1 and one per command) to DIR/man and shell completions for
    /// bash, zsh and fish to DIR/completions, as the Debian package installs them.
    Generate { dir: PathBuf },
}

/// Where the store is, and how to reach an object store.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// The sharded Zarr v3 store: a directory, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or
    /// az://CONTAINER/PREFIX, with zarr.json at its root; a database of Zarr keys as zarr-python 2
    /// writes them (an SQLite file, redis://HOST:PORT/DB); or https://HOST/PATH (http:// too) on a
    /// web server, shown read-only; a zip file of one (FILE.zip, FILE.ozx, or
    /// s3://BUCKET/PREFIX/FILE.ozx), shown read-only; or a directory of BLZ data (Bloscpack files,
    /// bcolz directories), shown read-only; an Icechunk repository (a directory or prefix), one
    /// version shown: a branch written through the mount (each sync point a commit; local or S3),
    /// a tag or snapshot read-only; or kerchunk references (FILE.json, or a parquet reference
    /// directory), shown read-only.
    pub store: PathBuf,
    /// The object store's endpoint: S3's (a local or S3-compatible server: http://127.0.0.1:9000;
    /// default: AWS, or AWS_ENDPOINT_URL), GCS's base URL (an emulator: http://127.0.0.1:4443) or
    /// the Azure account's blob endpoint (http://127.0.0.1:10000/devstoreaccount1 for Azurite).
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// The S3 region; default: AWS_REGION, AWS_DEFAULT_REGION, the profile's, or us-east-1.
    #[arg(long)]
    pub region: Option<String>,
    /// Send S3 requests unsigned (public buckets), without looking for credentials.
    #[arg(long)]
    pub no_sign_request: bool,
    /// How long an object store's listings and object versions are trusted before they are asked
    /// for again, in milliseconds: changes by others show within this long. Default: 1000.
    #[arg(long, value_name = "MS")]
    pub metadata_ttl: Option<u64>,
    /// The memory the caches may use altogether (K, M, G): each cache's size defaults to its
    /// share of it (docs/cli.md, "Memory"); the state of the inodes the kernel holds is apart.
    #[arg(long, value_parser = parse_size, default_value = "1G", value_name = "BYTES")]
    pub memory_limit: usize,
    /// Memory for an object store's fetched bytes, ahead of readers and shared between them, in
    /// bytes (K, M, G; 0: each read fetches just its own bytes, nothing is kept); default: a
    /// quarter of --memory-limit.
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    pub read_ahead_size: Option<usize>,
    /// GETs an object store mount has bringing bytes at once (reads and read-ahead together; a
    /// GET fetched ahead that waits for its reader keeps its connection but not its request).
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub max_requests: u16,
    /// Keep an object store's fetched bytes in DIR too (made if missing), found again by later
    /// mounts, which then ask the server only whether each object changed; DIR may be shared by
    /// several mounts. Not for local stores.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// The most bytes --cache DIR holds (K, M, G); default: a tenth of the free space there, at
    /// most 10G.
    #[arg(long, value_parser = parse_size, value_name = "BYTES", requires = "cache")]
    pub max_cache_size: Option<usize>,
    /// An Icechunk repository: show the tip of this branch (default: main), written through a
    /// writable mount, followed as it moves.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["tag", "snapshot"])]
    pub branch: Option<String>,
    /// An Icechunk repository: show this tag.
    #[arg(long, value_name = "NAME", conflicts_with = "snapshot")]
    pub tag: Option<String>,
    /// An Icechunk repository: show this snapshot (its ID, as `shardfs info` lists them).
    #[arg(long, value_name = "ID")]
    pub snapshot: Option<String>,
    /// An Icechunk repository: read virtual chunks whose URL starts with PREFIX (file:///data/,
    /// s3://bucket/nc/); others read as EIO. Repeatable.
    #[arg(long, value_name = "PREFIX")]
    pub allow_virtual: Vec<String>,
    /// A Redis database (redis://HOST:PORT/DB): the Zarr keys are the Redis keys PREFIX:KEY, as
    /// zarr-python 2's RedisStore names them.
    #[arg(long, value_name = "PREFIX", default_value = "zarr")]
    pub key_prefix: String,
    /// A PostgreSQL database (postgresql://USER@HOST:PORT/DB; the password from PGPASSWORD): the
    /// table of the Zarr keys, (key text PRIMARY KEY, value bytea); a writable mount creates it.
    #[arg(long, value_name = "NAME", default_value = "zarr")]
    pub table: String,
}

impl StoreArgs {
    /// `--memory-limit`, to be shared between the caches.
    pub fn memory(&self) -> MemoryBudget {
        MemoryBudget { limit: self.memory_limit }
    }

    pub fn address(&self) -> StoreAddress {
        StoreAddress {
            location: self.store.clone(),
            s3: S3Options {
                endpoint_url: self.endpoint_url.clone(),
                region: self.region.clone(),
                no_sign_request: self.no_sign_request,
            },
            azure: AzureOptions { endpoint_url: self.endpoint_url.clone() },
            gcs: GcsOptions { endpoint_url: self.endpoint_url.clone() },
            caching: Caching {
                metadata_ttl: std::time::Duration::from_millis(self.metadata_ttl.unwrap_or(1000)),
                read_ahead_bytes: self.read_ahead_size.unwrap_or(self.memory().read_ahead()),
                max_requests: self.max_requests.into(),
                disk: self.cache.as_ref().map(|dir| DiskSettings {
                    dir: dir.clone(),
                    max_bytes: self.max_cache_size.map(|n| n as u64),
                    server: String::new(),
                }),
            },
            repository: RepositoryOptions {
                version: match (&self.branch, &self.tag, &self.snapshot) {
                    (_, Some(tag), _) => Some(Version::Tag(tag.clone())),
                    (_, _, Some(id)) => Some(Version::Snapshot(id.clone())),
                    (branch, _, _) => branch.clone().map(Version::Branch),
                },
                allow_virtual: self.allow_virtual.clone(),
                ..Default::default()
            },
            memory: self.memory(),
            key_prefix: self.key_prefix.clone(),
            table: self.table.clone(),
        }
    }
}

/// Requests mostly wait on the store rather than compute, so more threads than cores pay off
/// when several clients read at once. At least 16: a thread waits out its GET, and zarr-python
/// and Icechunk's own reader keep 16 reads in flight (with 8, reading an Icechunk repository at
/// 20 ms took 1.20x Icechunk's reader; with 16, 1.05x). A thread's buffer costs memory only as
/// far as a request fills it.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(16, |n| (n.get() * 4).clamp(16, 64))
}

/// A byte count with an optional binary suffix: `4096`, `512K`, `64M`, `1G`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let n: usize = digits.parse().map_err(|_| format!("{text:?} is not a size like 4096, 512K, 64M or 1G"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

impl Cli {
    /// Parses the process's arguments, in the helper form too (see [`helper_form`]); exits with
    /// clap's message on an error.
    pub fn from_args() -> Cli {
        Cli::parse_from(helper_form(std::env::args_os()))
    }
}

/// The arguments as clap reads them. mount(8)'s helper form, `shardfs STORE MOUNTPOINT -o
/// OPTIONS` (what mount.fuse3 runs for `mount -t fuse.shardfs` and fstab lines), becomes
/// `shardfs mount STORE MOUNTPOINT ...`; in a mount command, each `-o` option that names a flag of
/// `shardfs mount` (`cache_size=64M`, `foreground`, `shard_new=4:2`) becomes that flag
/// (`--cache-size=64M`), so that every flag has an -o spelling without a second list of them, and
/// clap checks the values alike. The other `-o` options stay, for the FUSE layer to check.
pub fn helper_form(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    let mut command = Cli::command();
    command.build();
    let Some(first) = first_positional(&args) else { return args };
    let named = args[first].to_str().and_then(|name| command.find_subcommand(name)).map(|c| c.get_name().to_string());
    // The options before it go after `mount`, so that its `-o` options are read below.
    let command_at = match named.as_deref() {
        Some("mount") => first,
        Some(_) => return args,
        None => {
            args.insert(1, "mount".into());
            1
        }
    };
    let mount = command.find_subcommand("mount").expect("the mount command");
    let (head, tail) = args.split_at(command_at + 1);
    let mut out = head.to_vec();
    let mut rest = tail.iter();
    while let Some(arg) = rest.next() {
        let list = match arg.to_str() {
            Some("--") => {
                out.push(arg.clone());
                out.extend(rest.by_ref().cloned());
                break;
            }
            Some("-o") => match rest.next() {
                Some(list) => list.clone(),
                None => {
                    out.push(arg.clone());
                    break;
                }
            },
            Some(joined) if joined.starts_with("-o") => OsString::from(joined[2..].trim_start_matches('=')),
            _ => {
                out.push(arg.clone());
                continue;
            }
        };
        let Some(list) = list.to_str() else {
            out.extend(["-o".into(), list]);
            continue;
        };
        let mut kept = Vec::new();
        for option in list.split(',').filter(|o| !o.is_empty()) {
            match as_flag(mount, option) {
                Some(flag) => out.push(flag.into()),
                None => kept.push(option),
            }
        }
        if !kept.is_empty() {
            out.extend(["-o".into(), kept.join(",").into()]);
        }
    }
    out
}

/// The index of the first argument that is neither an option nor the value of `-o` (the only
/// option before the command that takes one: `shardfs -o ro STORE MOUNTPOINT`).
fn first_positional(args: &[OsString]) -> Option<usize> {
    let is_option = |a: &OsStr| a.to_str().is_some_and(|a| a.starts_with('-') && a != "-");
    let mut i = 1;
    while i < args.len() && is_option(&args[i]) {
        i += if args[i] == "-o" { 2 } else { 1 };
    }
    (i < args.len()).then_some(i)
}

/// `-o NAME[=VALUE]` as the flag of `shardfs mount` it names (`--NAME[=VALUE]`, with `_` for
/// `-` in NAME, and `:` for `,` in the values of a list flag), or `None`.
fn as_flag(mount: &clap::Command, option: &str) -> Option<String> {
    let (name, value) = match option.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (option, None),
    };
    let long = name.replace('_', "-");
    let arg = mount.get_arguments().find(|a| a.get_long() == Some(long.as_str()))?;
    if matches!(long.as_str(), "help" | "version") {
        return None;
    }
    Some(match value {
        None => format!("--{long}"),
        Some(value) if arg.get_value_delimiter() == Some(',') => format!("--{long}={}", value.replace(':', ",")),
        Some(value) => format!("--{long}={value}"),
    })
}

impl Command {
    /// The typed configuration of `shardfs mount`, or `None` for other commands.
    pub fn mount_config(&self, verbosity: u8) -> Option<MountConfig> {
        let Command::Mount {
            store,
            mountpoint,
            foreground,
            read_only,
            options,
            threads,
            io_uring,
            cache_size,
            max_index_size,
            commit_bytes,
            write_buffer_size,
            commit_idle_ms,
            message,
            shard_new,
            log_file,
            metrics_address,
            zarr_format,
        } = self
        else {
            return None;
        };
        let mut address = store.address();
        address.repository.writable = !*read_only;
        address.repository.message = message.clone();
        Some(MountConfig {
            store: address,
            mountpoint: mountpoint.clone(),
            foreground: *foreground,
            settings: MountSettings {
                options: with_source(options, &store.store),
                threads: *threads,
                read_only: *read_only,
                io_uring: *io_uring,
            },
            cache_bytes: cache_size.unwrap_or(store.memory().indexes()),
            max_index_bytes: *max_index_size as u64,
            writes: WriteOptions {
                policy: Policy {
                    shard_bytes: *commit_bytes,
                    idle: std::time::Duration::from_millis(*commit_idle_ms),
                    memory: write_buffer_size.unwrap_or(store.memory().write_buffer()),
                },
                shard_new: shard_new.clone(),
            },
            verbosity,
            log_file: log_file.clone(),
            metrics_address: metrics_address.clone(),
            zarr_format: *zarr_format,
        })
    }
}

/// The mount options with the store as the mount's source (`fsname=`) unless they name one, as
/// sshfs shows its `host:path`: `findmnt` and `df` then say what is mounted, and `mount -a` sees
/// that an fstab line is mounted already (it compares sources) instead of mounting it again.
fn with_source(options: &[String], store: &std::path::Path) -> Vec<String> {
    let named = options.iter().any(|o| o.starts_with("fsname="));
    let source = (!named).then(|| format!("fsname={}", store.display()));
    source.into_iter().chain(options.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::index_cache::DEFAULT_BUDGET;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn mount_options_split_on_commas() {
        let cli = Cli::try_parse_from(["shardfs", "mount", "s", "m", "-o", "allow_other,noatime", "-o", "ro"]).unwrap();
        let config = cli.command.mount_config(0).unwrap();
        assert_eq!(config.settings.options, ["fsname=s", "allow_other", "noatime", "ro"]);
        assert_eq!(config.cache_bytes, DEFAULT_BUDGET);
    }

    #[test]
    fn the_memory_limit_sizes_each_cache_unless_it_is_sized_itself() {
        let config = |args: &[&str]| Cli::try_parse_from(helper(args)).unwrap().command.mount_config(0).unwrap();
        let limited = config(&["shardfs", "s", "m", "-o", "memory_limit=512M"]);
        assert_eq!(limited.cache_bytes, 32 << 20);
        assert_eq!(limited.writes.policy.memory, 128 << 20);
        assert_eq!(limited.store.caching.read_ahead_bytes, 128 << 20);
        assert_eq!(limited.store.memory.manifests(), 128 << 20);
        let sized = config(&["shardfs", "s", "m", "-o", "memory_limit=512M,cache_size=1M,read_ahead_size=0"]);
        assert_eq!((sized.cache_bytes, sized.store.caching.read_ahead_bytes), (1 << 20, 0));
        assert_eq!(config(&["shardfs", "s", "m"]).writes.policy.memory, 256 << 20);
    }

    fn helper(args: &[&str]) -> Vec<String> {
        let args = helper_form(args.iter().map(OsString::from));
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn the_helper_form_is_a_mount() {
        // As mount.fuse3 runs it for `mount -t fuse.shardfs /data/store /mnt -o ro,zarr_format=2`.
        let args = helper(&["shardfs", "/data/store", "/mnt", "-o", "ro,zarr_format=2,dev,suid"]);
        assert_eq!(args, ["shardfs", "mount", "/data/store", "/mnt", "--zarr-format=2", "-o", "ro,dev,suid"]);
        let cli = Cli::try_parse_from(args).unwrap();
        let config = cli.command.mount_config(0).unwrap();
        assert_eq!(config.zarr_format, 2);
        assert_eq!(config.settings.options, ["fsname=/data/store", "ro", "dev", "suid"]);
        assert_eq!(helper(&["shardfs", "-v", "s", "m"]), ["shardfs", "mount", "-v", "s", "m"]);
        let options_first = helper(&["shardfs", "-o", "ro,threads=2", "s", "m"]);
        assert_eq!(options_first, ["shardfs", "mount", "--threads=2", "-o", "ro", "s", "m"]);
        let cli = Cli::try_parse_from(options_first).unwrap();
        assert_eq!(cli.command.mount_config(0).unwrap().settings.threads, 2);
    }

    #[test]
    fn every_mount_flag_has_an_o_spelling() {
        let options = "cache_size=1M,threads=3,zarr_format=2,endpoint_url=http://127.0.0.1:9000,region=eu-west-1,\
                       no_sign_request,metadata_ttl=5,read_ahead_size=0,max_requests=3,commit_bytes=2K,commit_idle_ms=7,\
                       write_buffer_size=3M,memory_limit=2G,\
                       shard_new=4:2,max_index_size=1M,log_file=/tmp/l,foreground,read_only,verbose,allow_other,\
                       cache=/var/cache/shardfs,max_cache_size=2G,branch=dev,allow_virtual=file:///d/,key_prefix=arrays,table=chunks,\
                       metrics_address=127.0.0.1:9100,io_uring,message=from a test";
        let cli = Cli::try_parse_from(helper(&["shardfs", "s3://b/p", "/mnt", "-o", options])).unwrap();
        assert_eq!(cli.verbose, 1);
        let config = cli.command.mount_config(cli.verbose).unwrap();
        assert_eq!(config.cache_bytes, 1 << 20);
        assert_eq!(config.settings.threads, 3);
        assert_eq!(config.zarr_format, 2);
        assert_eq!(config.store.s3.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(config.store.s3.region.as_deref(), Some("eu-west-1"));
        assert!(config.store.s3.no_sign_request);
        assert_eq!(config.metrics_address.as_deref(), Some("127.0.0.1:9100"));
        assert_eq!(config.store.caching.metadata_ttl, std::time::Duration::from_millis(5));
        assert_eq!(config.store.caching.read_ahead_bytes, 0);
        assert_eq!(config.store.caching.max_requests, 3);
        let disk = config.store.caching.disk.as_ref().unwrap();
        assert_eq!((disk.dir.to_str(), disk.max_bytes), (Some("/var/cache/shardfs"), Some(2 << 30)));
        assert_eq!(config.writes.policy.shard_bytes, 2048);
        assert_eq!(config.writes.policy.idle, std::time::Duration::from_millis(7));
        assert_eq!(config.writes.policy.memory, 3 << 20);
        assert_eq!(config.writes.shard_new, Some(vec![4, 2]));
        assert_eq!(config.max_index_bytes, 1 << 20);
        assert_eq!(config.store.memory.limit, 2 << 30);
        assert_eq!(config.log_file, Some(PathBuf::from("/tmp/l")));
        assert!(config.foreground && config.settings.read_only && config.settings.io_uring);
        assert_eq!(config.settings.options, ["fsname=s3://b/p", "allow_other"]);
        assert_eq!(config.store.repository.version, Some(Version::Branch("dev".into())));
        assert_eq!(config.store.repository.allow_virtual, ["file:///d/"]);
        assert_eq!(config.store.key_prefix, "arrays");
        assert_eq!(config.store.table, "chunks");
        assert_eq!(config.store.repository.message.as_deref(), Some("from a test"));
        assert!(!config.store.repository.writable, "read_only was given");
        // One version at a time: --tag and --snapshot each alone.
        for (option, version) in
            [("tag=v1", Version::Tag("v1".into())), ("snapshot=ID", Version::Snapshot("ID".into()))]
        {
            let cli = Cli::try_parse_from(helper(&["shardfs", "s", "m", "-o", option])).unwrap();
            assert_eq!(cli.command.mount_config(0).unwrap().store.repository.version, Some(version));
        }
        let options = format!("{options},tag,snapshot");
        let named = Cli::try_parse_from(helper(&["shardfs", "s", "m", "-o", "fsname=data"])).unwrap();
        assert_eq!(named.command.mount_config(0).unwrap().settings.options, ["fsname=data"]);
        // Every flag of `shardfs mount`, so that a new one cannot miss its -o spelling.
        let mut command = Cli::command();
        command.build();
        let mount = command.find_subcommand("mount").unwrap();
        for arg in mount.get_arguments().filter_map(|a| a.get_long()).filter(|l| !["help", "version"].contains(l)) {
            assert!(options.contains(&arg.replace('-', "_")), "no -o {arg} in this test");
        }
    }

    #[test]
    fn the_helper_form_leaves_other_commands_alone() {
        for args in [
            &["shardfs", "check", "s", "--repair"][..],
            &["shardfs", "info", "s"],
            &["shardfs", "unmount", "m"],
            &["shardfs", "--version"],
            &["shardfs"],
            &["shardfs", "help", "mount"],
        ] {
            assert_eq!(helper(args), args);
        }
        let args = ["shardfs", "mount", "s", "m", "-o", "ro", "-ocache_size=2M", "--", "-o"];
        assert_eq!(helper(&args), ["shardfs", "mount", "s", "m", "-o", "ro", "--cache-size=2M", "--", "-o"]);
    }

    #[test]
    fn bad_o_values_are_clap_errors() {
        let error = Cli::try_parse_from(helper(&["shardfs", "s", "m", "-o", "cache_size=lots"])).unwrap_err();
        assert!(error.to_string().contains("lots"), "{error}");
        assert!(Cli::try_parse_from(helper(&["shardfs", "s", "m", "-o", "zarr_format=4"])).is_err());
    }
}
