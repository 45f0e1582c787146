//! `mount-s3` as the benchmarks run it: AWS's Mountpoint for S3 (the `mountpoint-s3-fs` library,
//! version 0.11) behind the subset of mountpoint-s3 1.x's command line a user passes for a local
//! S3 server. Its own command line lives in a crate that is not published; this main makes the
//! same library calls its `run.rs` makes, with its defaults (16 FUSE threads, 8 MiB parts,
//! minimal metadata TTL, CRC32C upload checksums where the endpoint takes them), in the
//! foreground: the benchmark starts it in the background and unmounts it with `umount`.

use anyhow::Context as _;
use clap::Parser;
use mountpoint_s3_client::config::{AddressingStyle, S3ClientAuthConfig};
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::fs::{CacheConfig, TimeToLive, UploadChecksumAlgorithm};
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::memory::{CandidateSize, PagedPool};
use mountpoint_s3_fs::s3::config::{
    ClientConfig, MemoryLimitSetting, PartConfig, Region, TargetThroughputSetting,
};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig};

#[derive(Parser, Debug)]
#[command(about = "Mountpoint for Amazon S3 (mountpoint-s3-fs 0.11), mounted in the foreground")]
struct Args {
    /// The bucket.
    bucket: String,
    /// Where to mount it.
    mount_point: std::path::PathBuf,
    /// Only the keys under this prefix (ending in '/').
    #[arg(long, default_value = "")]
    prefix: String,
    /// The S3 endpoint, for example http://127.0.0.1:9000.
    #[arg(long)]
    endpoint_url: Option<String>,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Path-style addressing (http://host/bucket/key), as local servers need.
    #[arg(long)]
    force_path_style: bool,
    #[arg(long)]
    read_only: bool,
    /// Allow writes to replace objects that exist.
    #[arg(long)]
    allow_overwrite: bool,
    #[arg(long)]
    allow_delete: bool,
    /// Metadata time to live in seconds ("minimal" when left out, as mount-s3's default).
    #[arg(long)]
    metadata_ttl: Option<u64>,
    #[arg(long, default_value_t = 16)]
    max_threads: usize,
    #[arg(long, default_value_t = 8 << 20)]
    part_size: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // mount-s3's default memory target: 95% of the machine's memory.
    let total = std::fs::read_to_string("/proc/meminfo")?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix(" kB")?.parse::<usize>().ok())
        .context("no MemTotal in /proc/meminfo")?;
    let memory = MemoryLimitSetting::Default((total * 1024 / 20 * 19).max(mountpoint_s3_fs::memory::MINIMUM_MEM_LIMIT));
    let client_config = ClientConfig {
        region: Region::new_user_specified(args.region.clone()),
        endpoint_url: args.endpoint_url.clone(),
        addressing_style: if args.force_path_style { AddressingStyle::Path } else { AddressingStyle::Automatic },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: S3ClientAuthConfig::Default,
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: TargetThroughputSetting::Default,
        bind: None,
        part_config: PartConfig::with_part_size(args.part_size).validate(memory)?,
        user_agent: UserAgent::new(Some("shardfs-bench".to_string())),
        tls_config: None,
    };
    let pool = PagedPool::config()
        .with_candidate_sizes([
            CandidateSize::prunable(client_config.part_config.read_size_bytes),
            CandidateSize::new(client_config.part_config.write_size_bytes),
        ])
        .with_memory_limit(memory.bytes())
        .build();
    let s3_path = S3Path::new(Bucket::new(args.bucket.clone())?, Prefix::new(&args.prefix)?);
    let client = client_config.create_client(pool.clone(), Some(&s3_path)).context("creating the S3 client")?;
    let runtime = Runtime::new(client.event_loop_group());
    let personality = S3Personality::infer_from_bucket(&s3_path.bucket, &client.endpoint_config());

    let ttl = args.metadata_ttl.map_or(TimeToLive::Minimal, |s| TimeToLive::Duration(std::time::Duration::from_secs(s)));
    let filesystem = S3FilesystemConfig {
        cache_config: CacheConfig::new(ttl),
        allow_delete: args.allow_delete,
        allow_overwrite: args.allow_overwrite,
        s3_personality: personality,
        upload_checksum_algorithm: personality.supports_additional_checksums().then_some(UploadChecksumAlgorithm::Crc32c),
        read_only: args.read_only,
        ..Default::default()
    };
    let fuse = FuseSessionConfig::new(
        MountPoint::new(&args.mount_point).context("the mount point")?,
        FuseOptions { read_only: args.read_only, auto_unmount: false, allow_root: false, allow_other: false, clone_fd: false },
        args.max_threads,
    )?;
    let superblock = Superblock::new(
        client.clone(),
        s3_path,
        SuperblockConfig { cache_config: filesystem.cache_config.clone(), s3_personality: personality },
    );
    let session = MountpointConfig::new(fuse, filesystem, Default::default())?
        .create_fuse_session(superblock, client, runtime, pool)?;
    println!("{} is mounted at {}", args.bucket, args.mount_point.display());
    session.join().context("the FUSE session")
}
