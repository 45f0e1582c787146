//! `shardfs mount` and `shardfs unmount`: checks that fail before anything is mounted, the
//! background daemon (the command returns once the mount is ready, as sshfs does), and a clean
//! unmount on SIGTERM, SIGINT or SIGHUP.
//!
//! - [`address`]: which store is at an address, opened as the kind it is.
//! - [`guard`]: the process that aborts the FUSE connection of a daemon that died, so that it ends.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

pub mod address;
pub mod guard;

pub use address::{RepositoryOptions, StoreAddress, check_zarr_format, open_store, repository_refs};

use crate::fs::{ShardFs, WriteOptions};
use crate::fuse::{self, MountSettings, Mounted};
use crate::logging::{self, LogTarget};
use crate::metrics;
use crate::store::Store;
use crate::view::index_cache::IndexCache;
use crate::view::presentation::{Presentation, ZarrV2, ZarrV3};
use crate::write::journal;

/// Everything `shardfs mount` needs, already parsed.
#[derive(Debug, Clone)]
pub struct MountConfig {
    pub store: StoreAddress,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub settings: MountSettings,
    pub cache_bytes: usize,
    /// `--max-index-size`: the largest index of one shard of an array shown unsharded.
    pub max_index_bytes: u64,
    /// How writes are stored (writable mounts).
    pub writes: WriteOptions,
    /// The Zarr version the view shows (`--zarr-format`): 3, or 2 (read-only for now).
    pub zarr_format: u8,
    pub verbosity: u8,
    pub log_file: Option<PathBuf>,
    /// `--metrics-address`: where the daemon serves its metrics.
    pub metrics_address: Option<String>,
}

/// Checks that `path` is an empty directory the mount can cover.
fn check_mountpoint(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let mut entries = std::fs::read_dir(path).map_err(|e| format!("{shown}: unusable mount point: {e}"))?;
    if entries.next().is_some() {
        return Err(format!("{shown}: mount point is not empty"));
    }
    Ok(())
}

fn check_fuse_device() -> Result<(), String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map(drop)
        .map_err(|e| format!("/dev/fuse: cannot open: {e} (is the fuse module loaded and the device accessible?)"))
}

/// Builds the filesystem for a store: read-only, or writable as `writes` says, after settling the
/// commits a crash left unfinished.
pub fn filesystem(store: Arc<dyn Store>, cache: IndexCache, writes: Option<WriteOptions>) -> Result<ShardFs, String> {
    filesystem_showing(store, Arc::new(ZarrV3), cache, writes)
}

/// [`filesystem`] showing the store as `presentation` does.
pub fn filesystem_showing(
    store: Arc<dyn Store>,
    presentation: Arc<dyn Presentation>,
    cache: IndexCache,
    writes: Option<WriteOptions>,
) -> Result<ShardFs, String> {
    if let Some(why) = presentation.cannot_show(&*crate::view::documents::source_of(&*store)) {
        return Err(format!("{}: {why}", store.describe("")));
    }
    let Some(options) = writes else { return Ok(ShardFs::read_only(store, presentation, cache)) };
    store.check_writes().map_err(|e| e.to_string())?;
    let recovered = journal::recover(&*store).map_err(|e| format!("{}: recovery failed: {e}", store.describe("")))?;
    for done in recovered {
        log::warn!("recovered an unfinished commit: {done:?}");
    }
    Ok(ShardFs::writable(store, presentation, cache, options))
}

/// `shardfs mount`: returns once the mount is ready (or, in the foreground, once it is gone).
/// Without `--foreground` everything is checked and the store opened in the daemon alone:
/// opening it in both processes (a store's threads do not survive fork) cost a remote store's
/// first requests twice. Its errors come back through the command that started it.
pub fn run(config: &MountConfig) -> Result<(), String> {
    give_large_blocks_back();
    if !config.foreground {
        return daemonize(config);
    }
    logging::init(&log_target(config), config.verbosity)?;
    let (store, config) = prepared(config)?;
    let tidy = tidied_at_unmount(&store, &config);
    let (mounted, guard) = mount_blocking_signals(store, &config)?;
    log::info!("{}: serving {}", config.mountpoint.display(), config.store.location.display());
    serve(mounted, tidy, guard)
}

/// Where the daemon's log lines go: `--log-file`, else stderr in the foreground and syslog in
/// the background, where the terminal may be gone.
fn log_target(config: &MountConfig) -> LogTarget {
    let default = if config.foreground { LogTarget::Stderr } else { LogTarget::Syslog };
    config.log_file.clone().map_or(default, LogTarget::File)
}

/// The store `config` names, checked for the view asked for, and the config with the mount made
/// read-only where the store cannot be written (BLZ data, a zip file, a web server); then the
/// mount point, the FUSE device and the options, checked. The store comes first: of a mistyped
/// store and mount point, the store is named.
fn prepared(config: &MountConfig) -> Result<(Arc<dyn Store>, MountConfig), String> {
    let store = open_store(config.store.clone())?;
    check_zarr_format(&*store, config.zarr_format)?;
    let settings =
        MountSettings { read_only: config.settings.read_only || store.read_only(), ..config.settings.clone() };
    let config = MountConfig { settings, ..config.clone() };
    check_mountpoint(&config.mountpoint)?;
    check_fuse_device()?;
    fuse::check_options(&config.settings)?;
    if let Some(address) = &config.metrics_address {
        let serving = metrics::serve::start(address)?;
        log::info!("metrics at http://{serving}/metrics");
    }
    Ok((store, config))
}

/// Has glibc allocate blocks of 256 KiB and more (chunks being written, shard parts going up)
/// with mmap, and unmap them when freed. Left to itself glibc raises that threshold to the size
/// of the largest block freed, and every later 4 MiB chunk comes from heaps that keep what they
/// once held: writing 256 MiB through an object store mount peaked at 423 MiB resident with it,
/// 233 MiB with this.
///
/// Setting that threshold also fixes the trim threshold at its default, 128 KiB: each read's
/// reply (128 KiB, the kernel's usual read) freed at the top of a heap was given back to the
/// kernel and faulted in again at the next read, 70,000 page faults for 256 MiB read through a
/// mount of a GNU dbm file. Heaps keep up to [`HEAP_TOP_KEPT`] free at their tops instead.
fn give_large_blocks_back() {
    // SAFETY: mallopt only changes the allocator's settings; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_TOP_KEPT);
    }
}

/// Free bytes a heap keeps at its top before giving them back: room for a few blocks under the
/// mapping threshold (a reply to a read of up to 256 KiB), what glibc keeps on its own beside a
/// threshold of 256 KiB. Each heap keeps that much at most, one per allocating thread up to eight
/// per core: 8 MiB on 2 cores.
const HEAP_TOP_KEPT: libc::c_int = 512 << 10;

/// The store whose `__shardfs/` a clean unmount tidies: a writable mount's. A read-only mount
/// never creates it, and must not change the store, not even by removing what others left.
fn tidied_at_unmount(store: &Arc<dyn Store>, config: &MountConfig) -> Option<Arc<dyn Store>> {
    (!config.settings.is_read_only()).then(|| store.clone())
}

/// Mounts with termination signals blocked, so that every thread (the session's and the
/// committer) inherits the mask and [`serve`] alone receives them; with the mount's guard, told
/// the connection.
fn mount_blocking_signals(store: Arc<dyn Store>, config: &MountConfig) -> Result<(Mounted, guard::Guard), String> {
    block_termination_signals();
    // Started before the mount exists, so that the guard is sure to outlive it.
    let guard = guard::Guard::start(&config.mountpoint, &log_target(config), config.verbosity);
    let writes = (!config.settings.is_read_only()).then(|| config.writes.clone());
    let cache = IndexCache::new(config.cache_bytes).with_max_index_bytes(config.max_index_bytes);
    let presentation: Arc<dyn Presentation> = match config.zarr_format {
        2 => Arc::new(ZarrV2),
        _ => Arc::new(ZarrV3),
    };
    let fs = filesystem_showing(store, presentation, cache, writes)?;
    let mounted = fuse::mount(fs, &config.mountpoint, &config.settings)?;
    guard.mounted(&config.mountpoint);
    Ok((mounted, guard))
}

/// The signal the session's last thread sends [`serve`] once the session has ended.
const SESSION_ENDED: libc::c_int = libc::SIGUSR1;

/// The signals [`serve`] waits for: the termination signals, and [`SESSION_ENDED`].
fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, SESSION_ENDED] {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

fn block_termination_signals() {
    let set = termination_signals();
    // SAFETY: a valid signal set; blocking signals has no memory effects.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Serves until the mount goes away or a termination signal arrives, then unmounts cleanly,
/// stands `guard` down and, once the session's last commit is done, tidies `tidy`'s `__shardfs/`.
fn serve(mounted: Mounted, tidy: Option<Arc<dyn Store>>, guard: guard::Guard) -> Result<(), String> {
    let set = termination_signals();
    // Told at once when the session ends (`shardfs unmount` waits for this process to exit); the
    // flag tells that signal from a SIGUSR1 sent from outside.
    let session_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = session_ended.clone();
    // SAFETY: pthread_self has no preconditions.
    let serving = unsafe { libc::pthread_self() };
    mounted.when_ended(move || {
        told.store(true, std::sync::atomic::Ordering::SeqCst);
        // SAFETY: the thread serving waits for this signal, blocked in every thread.
        unsafe { libc::pthread_kill(serving, SESSION_ENDED) };
    });
    // A look now and then all the same, for a session whose last thread could not tell.
    let tick = libc::timespec { tv_sec: 1, tv_nsec: 0 };
    let ended = loop {
        if mounted.finished() || session_ended.load(std::sync::atomic::Ordering::SeqCst) {
            log::info!("unmounted");
            break mounted.join().map_err(|e| format!("session ended with an error: {e}"));
        }
        // SAFETY: valid signal set and timeout; no siginfo is requested.
        let signal = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &tick) };
        if signal == SESSION_ENDED {
            continue;
        }
        if signal > 0 {
            log::info!("signal {signal}: unmounting");
            break mounted.unmount().map_err(|e| format!("unmount failed: {e}"));
        }
    };
    // The session is over (or could not be unmounted, and this process's exit ends it).
    drop(guard);
    ended?;
    // What is left there is in use (a journal record, another mount's files): tidying removes
    // only what is empty, so a failure costs nothing but the trace.
    if let Some(store) = tidy
        && let Err(e) = store.tidy_private_dir()
    {
        log::warn!("{e}");
    }
    Ok(())
}

/// Forks a daemon that mounts and serves; the parent waits for its word that the mount is ready
/// (or why it failed) and returns.
fn daemonize(config: &MountConfig) -> Result<(), String> {
    let mut fds = [0; 2];
    // SAFETY: fds is a two-element array as pipe(2) requires.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("cannot create a pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned here alone.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is single-threaded here (no session or logger thread exists yet), so
    // the child may go on running Rust code.
    match unsafe { libc::fork() } {
        -1 => Err(format!("cannot fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(read_end);
            let code = daemon_child(config, std::fs::File::from(write_end));
            std::process::exit(code);
        }
        _ => {
            drop(write_end);
            let mut word = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut word);
            match word.strip_prefix("ready") {
                Some(_) => Ok(()),
                None if word.is_empty() => Err("the mount daemon exited before the mount was ready".into()),
                None => Err(word.trim_end().to_string()),
            }
        }
    }
}

fn daemon_child(config: &MountConfig, mut parent: std::fs::File) -> i32 {
    // SAFETY: setsid has no memory effects; it detaches the daemon from the terminal's session.
    unsafe { libc::setsid() };
    if let Err(e) = logging::init(&log_target(config), config.verbosity) {
        let _ = writeln!(parent, "{e}");
        return 1;
    }
    let opened = prepared(config).and_then(|(store, config)| {
        let tidy = tidied_at_unmount(&store, &config);
        mount_blocking_signals(store, &config).map(|(mounted, guard)| (mounted, tidy, guard))
    });
    let (mounted, tidy, guard) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            let _ = writeln!(parent, "{e}");
            return 1;
        }
    };
    log::info!("{}: serving {}", config.mountpoint.display(), config.store.location.display());
    detach_stdio();
    let _ = parent.write_all(b"ready\n");
    drop(parent);
    match serve(mounted, tidy, guard) {
        Ok(()) => 0,
        Err(e) => {
            log::error!("{e}");
            1
        }
    }
}

/// Points stdin, stdout and stderr at /dev/null: the terminal may be gone while the daemon runs.
fn detach_stdio() {
    if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors, which this process owns.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// `shardfs unmount`: first makes every pending write durable (an fsync of the mount's root
/// directory commits them all; if that fails, nothing is unmounted and the writes stay pending in
/// the daemon), then unmounts directly when allowed, else through fusermount3 (or fusermount).
pub fn unmount(mountpoint: &Path) -> Result<(), String> {
    let shown = mountpoint.display();
    // EINVAL: not a shardfs mount; ENOTCONN: its daemon is gone, and nothing pending is left.
    if let Ok(root) = std::fs::File::open(mountpoint)
        && let Err(e) = root.sync_all()
        && !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOTCONN))
    {
        return Err(format!("{shown}: pending writes could not be committed, not unmounting: {e}"));
    }
    let daemon = daemon_pid(mountpoint);
    let device = std::fs::metadata(mountpoint).map(|m| std::os::unix::fs::MetadataExt::dev(&m)).ok();
    unmount_now(mountpoint)?;
    if daemon == Some(0) {
        eprintln!(
            "shardfs: {shown}: unmounted; its daemon runs in another pid namespace (a container), so this did \
             not wait for it to end"
        );
    }
    let daemon = daemon.filter(|pid| *pid > 0);
    // The daemon finishes after the kernel lets go of the mount; wait for it, so that a mount made
    // right after this returns is not disturbed by the old daemon's last steps.
    if let Some(pid) = daemon {
        let start = std::time::Instant::now();
        let mut looked = start;
        while process_alive(pid) {
            // A mount namespace made after the mount (unshare -m, a container) holds a copy of
            // it: the kernel keeps the filesystem, and the daemon rightly serves it there.
            if looked.elapsed() >= std::time::Duration::from_millis(500) {
                looked = std::time::Instant::now();
                if let Some(holder) = device.and_then(mounted_elsewhere) {
                    eprintln!(
                        "shardfs: {shown}: unmounted here; daemon {pid} goes on serving the copy of this mount in \
                         the mount namespace of process {holder}, and commits its writes when that one is unmounted"
                    );
                    return Ok(());
                }
            }
            if start.elapsed() > std::time::Duration::from_secs(60) {
                return Err(format!("{shown}: unmounted, but daemon {pid} is still running after 60 s"));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    Ok(())
}

/// A process in whose mount namespace the filesystem of device `device` is still mounted.
fn mounted_elsewhere(device: u64) -> Option<u32> {
    let wanted = format!("{}:{}", libc::major(device), libc::minor(device));
    let mut seen = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        // One look per namespace: every process of it lists the same mounts.
        let Ok(namespace) = std::fs::read_link(entry.path().join("ns/mnt")) else { continue };
        if !seen.insert(namespace) {
            continue;
        }
        let Ok(mounts) = std::fs::read_to_string(entry.path().join("mountinfo")) else { continue };
        if mounts.lines().any(|line| line.split(' ').nth(2) == Some(wanted.as_str())) {
            return Some(pid);
        }
    }
    None
}

/// `shardfs status`: the metrics of the mount at `mountpoint`, as its daemon serves them.
pub fn status(mountpoint: &Path) -> Result<String, String> {
    use std::os::fd::AsRawFd;
    let shown = mountpoint.display();
    let root = std::fs::File::open(mountpoint).map_err(|e| format!("{shown}: {e}"))?;
    let mut answer = [0u8; fuse::METRICS_ADDRESS_LEN];
    // SAFETY: an open descriptor, and a request that writes METRICS_ADDRESS_LEN bytes to the
    // buffer given, which is that long.
    let rc = unsafe { libc::ioctl(root.as_raw_fd(), fuse::METRICS_IOCTL as _, answer.as_mut_ptr()) };
    if rc != 0 {
        return Err(match daemon_pid(mountpoint) {
            Some(0) => format!("{shown}: its daemon is older than `shardfs status`"),
            Some(pid) => format!("{shown}: its daemon (process {pid}) is older than `shardfs status`"),
            None => format!("{shown}: not a shardfs mount"),
        });
    }
    let text = String::from_utf8_lossy(&answer);
    let text = text.trim_end_matches('\0');
    if text.is_empty() {
        return Err(format!("{shown}: mounted without --metrics-address, so its daemon serves no metrics"));
    }
    let address = text.parse().map_err(|_| format!("{shown}: its daemon named no address but {text:?}"))?;
    let body = metrics::serve::scrape(address).map_err(|e| format!("{shown}: {e}"))?;
    Ok(format!("# {shown}: served at http://{address}/metrics\n{body}"))
}

/// The id of the process serving the shardfs mount at `mountpoint`, if it is one: 0 where that
/// process is in another pid namespace, whose numbers mean other processes here.
fn daemon_pid(mountpoint: &Path) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let root = std::fs::File::open(mountpoint).ok()?;
    let mut pid: u32 = 0;
    // SAFETY: an open descriptor, and a request that writes one u32 to the pointer given.
    let rc = unsafe { libc::ioctl(root.as_raw_fd(), fuse::PID_IOCTL as _, &mut pid as *mut u32) };
    let pid = i32::try_from(pid).ok()?;
    (rc == 0 && pid >= 0 && pid != std::process::id() as i32).then_some(pid)
}

/// True while a thread of process `pid` has not exited. The main thread is a zombie as soon as it
/// exits, while the others may still be ending (unmapping a database, syncing a file): the
/// process's files, and the locks on them, go only with the last.
fn process_alive(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X'])))
    })
}

/// Unmounts directly when allowed, else through fusermount3 (or fusermount).
fn unmount_now(mountpoint: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let shown = mountpoint.display();
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).map_err(|e| format!("{shown}: {e}"))?;
    // SAFETY: a valid C string path.
    if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let direct = std::io::Error::last_os_error();
    if direct.raw_os_error() == Some(libc::EINVAL) {
        return Err(format!("{shown}: not a mount point"));
    }
    for tool in ["fusermount3", "fusermount"] {
        match Command::new(tool).arg("-u").arg(mountpoint).output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                let why = String::from_utf8_lossy(&out.stderr);
                return Err(format!("{shown}: cannot unmount: {}", why.trim()));
            }
            Err(_) => continue,
        }
    }
    Err(format!("{shown}: cannot unmount: {direct}"))
}
