//! The guard: a small process of its own that aborts the daemon's FUSE connection once the daemon
//! dies, so that a daemon killed at any moment ends and its callers get ENOTCONN.
//!
//! Why a daemon can fail to end: telling the kernel to drop a name (the watcher's entry
//! invalidation) takes the lock of the name's directory, which a lookup in that directory holds
//! while it waits for the daemon's answer. Killed then (kill -9, the OOM killer), every thread of
//! the daemon dies but the one writing that invalidation, asleep in the kernel where no signal
//! reaches it; it keeps its /dev/fuse open, so the kernel never ends the connection, and a lookup
//! the daemon had not yet read is never answered, so the thread never wakes (one the daemon had
//! read ends as the session's own /dev/fuse closes: `fuse::watcher`). Dropping pages (the other
//! invalidation) waits the same way on a page a read in flight holds. Only a write to the
//! connection's `abort` file in fusectl ends it.
//!
//! So the daemon starts this process before it mounts, from a thread that lives as long as it
//! serves and exits only with the daemon: the process is that thread's child with a parent-death
//! signal, which the kernel sends as the thread exits (a pipe or pidfd would say nothing while one
//! thread of the daemon is stuck). Told the connection's number once mounted, the guard opens the
//! connection's `abort` and `waiting` files, which stay bound to that one connection: once it is
//! gone they do nothing, so a later mount that took the same device number is never touched. When
//! the daemon dies and has not ended 0.3 s later (its pidfd says so, silent while a thread is
//! stuck), the guard aborts the connection if it still exists; a clean exit stands the guard down
//! first. Where fusectl is not mounted, the guard mounts a private, detached instance (root
//! only); without it, a warning says the daemon is not guarded.

use std::io::{BufRead, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::logging::LogTarget;

/// The parent-death signal; blocked in the guard from before its exec and taken with
/// sigwaitinfo, so that it is never lost nor kills the guard.
const DAEMON_DIED: libc::c_int = libc::SIGUSR2;

/// Where the system mounts fusectl.
const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// fusectl's superblock magic (statfs's f_type).
const FUSECTL_MAGIC: i64 = 0x6573_5543;

/// The daemon's end: the thread whose exit the guard watches for, and the way to tell it the
/// connection or stand it down. Dropping it stands the guard down (a clean end).
pub struct Guard {
    words: mpsc::Sender<Word>,
    thread: Option<JoinHandle<()>>,
}

enum Word {
    Connection(u64),
    StandDown,
}

impl Guard {
    /// Starts the guard of a daemon about to mount at `mountpoint`; its log lines go to `log`.
    /// Call it with the termination signals blocked: its thread keeps the mask.
    pub fn start(mountpoint: &Path, log: &LogTarget, verbosity: u8) -> Guard {
        let (words, heard) = mpsc::channel();
        let command = guard_command(mountpoint, log, verbosity);
        let thread = std::thread::Builder::new()
            .name("shardfs-guard".into())
            .spawn(move || keep(command, heard))
            .map_err(|e| log::warn!("not guarded against a kill at a bad moment: cannot start a thread: {e}"))
            .ok();
        Guard { words, thread }
    }

    /// Tells the guard which connection is the daemon's: that of the mount at `mountpoint`, just
    /// mounted.
    pub fn mounted(&self, mountpoint: &Path) {
        match std::fs::metadata(mountpoint) {
            Ok(meta) => {
                let _ = self.words.send(Word::Connection(std::os::unix::fs::MetadataExt::dev(&meta)));
            }
            Err(e) => log::warn!("not guarded against a kill at a bad moment: {}: {e}", mountpoint.display()),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.words.send(Word::StandDown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `shardfs guard` for the daemon being started: the same binary (/proc/self/exe, even if the
/// file was replaced since), logging where the daemon logs.
fn guard_command(mountpoint: &Path, log: &LogTarget, verbosity: u8) -> Command {
    let mut command = Command::new("/proc/self/exe");
    command.arg0("shardfs").arg("guard").arg(std::process::id().to_string());
    command.arg(std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf()));
    match log {
        LogTarget::File(path) => {
            command.arg("--log-file").arg(path);
        }
        LogTarget::Syslog => {
            command.arg("--syslog");
        }
        LogTarget::Stderr => {}
    }
    if verbosity > 0 {
        command.arg(format!("-{}", "v".repeat(verbosity.into())));
    }
    let stderr = if matches!(log, LogTarget::Stderr) { Stdio::inherit() } else { Stdio::null() };
    // Its own directory is no mount's, so that it keeps none busy; and none of the daemon's
    // environment, which may hold the store's credentials (a CSI volume's secret).
    command.current_dir("/").env_clear().stdin(Stdio::piped()).stdout(Stdio::null()).stderr(stderr);
    // SAFETY: between fork and exec only async-signal-safe calls (sigprocmask, setsid, prctl).
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, DAEMON_DIED);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            // Out of the daemon's session: a Ctrl-C meant for a foreground daemon does not end
            // its guard first.
            libc::setsid();
            if libc::prctl(libc::PR_SET_PDEATHSIG, DAEMON_DIED as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// The guarding thread: starts the guard, passes it the connection, and on a clean end stands it
/// down; otherwise it waits, and its exit with the daemon is the guard's signal.
fn keep(mut command: Command, heard: mpsc::Receiver<Word>) {
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            log::warn!("not guarded against a kill at a bad moment: cannot start the guard: {e}");
            return;
        }
    };
    while let Ok(Word::Connection(device)) = heard.recv() {
        if let Some(stdin) = child.stdin.as_mut() {
            use std::io::Write;
            let _ = writeln!(stdin, "{}:{}", libc::major(device), libc::minor(device));
        }
    }
    // Stood down: the session is over, there is nothing left to abort.
    let _ = child.kill();
    let _ = child.wait();
}

/// `shardfs guard DAEMON MOUNTPOINT`: the guard process. Reads the connection's device
/// (`MAJOR:MINOR`) from stdin, and aborts that connection when the daemon dies.
pub fn run(daemon: u32, mountpoint: &Path) -> Result<(), String> {
    // SAFETY: getppid has no preconditions.
    if u32::try_from(unsafe { libc::getppid() }).ok() != Some(daemon) {
        // The daemon died before the parent-death signal was set: it mounted nothing yet.
        return Ok(());
    }
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: ignoring a signal has no memory effects. A guard that a stop of the whole
        // service (SIGTERM to every process) ended first would leave its daemon unguarded for
        // the rest of its shutdown.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    // Opened while the daemon is surely this process's parent, before any pid could be reused.
    let process = pidfd(daemon);
    let connections = connections();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let Some((major, minor)) = line.trim().split_once(':').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
    else {
        // The daemon ended (or stood the guard down) before it mounted.
        return Ok(());
    };
    let unguarded = |why: String| format!("not guarded against a kill at a bad moment: {why}");
    let connections = connections.map_err(unguarded)?;
    let connection = Connection::open(&connections, major, minor).map_err(unguarded)?;
    // The files opened are bound to the connection they named when opened: the mount must still
    // be there with that device now, so that they are this daemon's and not a later mount's.
    if !mounted_as(mountpoint, major, minor) {
        return Err(unguarded(format!("{} is no longer mounted as {major}:{minor}", mountpoint.display())));
    }
    log::debug!("guarding FUSE connection {} of {}", connection.name, mountpoint.display());
    wait_for_death();
    // A daemon that can end does so at once, and the kernel then ends its connection itself:
    // the abort is for one that cannot, and the log says which it was.
    if process.as_ref().is_ok_and(|p| ended_within(p, ENDING)) {
        log::info!("daemon {daemon} of {} died; its FUSE connection ended with it", mountpoint.display());
        return Ok(());
    }
    if connection.live() {
        connection.abort();
        log::warn!(
            "daemon {daemon} of {} died but could not end (a thread of it waits in the kernel on a call to it): \
             aborted its FUSE connection {}, so that it ends and its callers get ENOTCONN",
            mountpoint.display(),
            connection.name
        );
    }
    Ok(())
}

/// How long a killed daemon is given to end by itself before its connection is aborted: its
/// threads exit within milliseconds, unless one cannot.
const ENDING: std::time::Duration = std::time::Duration::from_millis(300);

/// A pidfd of process `pid`, which says when every thread of it has exited.
fn pidfd(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open with a pid and no flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned here alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// True once the process of `pidfd` has ended, waiting at most `wait`.
fn ended_within(pidfd: &OwnedFd, wait: std::time::Duration) -> bool {
    let mut poll = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let millis = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, millis) == 1 }
}

/// A connection's files in fusectl.
struct Connection {
    name: String,
    abort: std::fs::File,
    waiting: std::fs::File,
}

impl Connection {
    fn open(connections: &OwnedFd, major: u32, minor: u32) -> Result<Connection, String> {
        // fusectl names a connection by the kernel's own device number.
        let name = ((u64::from(major) << 20) | u64::from(minor)).to_string();
        let open = |file: &str, flags: libc::c_int| {
            let path = std::ffi::CString::new(format!("{name}/{file}")).expect("no NUL in a number");
            // SAFETY: a valid directory descriptor and C string.
            let fd = unsafe { libc::openat(connections.as_raw_fd(), path.as_ptr(), flags | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(format!("{CONNECTIONS}/{name}/{file}: {}", std::io::Error::last_os_error()));
            }
            // SAFETY: a descriptor just opened and owned here alone.
            Ok(unsafe { std::fs::File::from_raw_fd(fd) })
        };
        Ok(Connection { abort: open("abort", libc::O_WRONLY)?, waiting: open("waiting", libc::O_RDONLY)?, name })
    }

    /// True while the connection exists: once it is gone, its files read as empty. Read once
    /// only (fusectl's files cannot seek, and pread fails).
    fn live(&self) -> bool {
        let mut buffer = [0u8; 32];
        (&self.waiting).read(&mut buffer).is_ok_and(|n| n > 0)
    }

    fn abort(&self) {
        use std::io::Write;
        if let Err(e) = (&self.abort).write_all(b"1") {
            log::error!("aborting FUSE connection {}: {e}", self.name);
        }
    }
}

/// A directory of fusectl: the system's, else a private instance mounted nowhere (which needs
/// CAP_SYS_ADMIN), so that the machine's mounts stay as they are.
fn connections() -> Result<OwnedFd, String> {
    let path = std::ffi::CString::new(CONNECTIONS).expect("no NUL");
    // SAFETY: a valid C string path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: a descriptor just opened and owned here alone.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: statfs is plain data, filled by fstatfs.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a statfs to fill.
        if unsafe { libc::fstatfs(dir.as_raw_fd(), &mut fs) } == 0 && fs.f_type as i64 == FUSECTL_MAGIC {
            return Ok(dir);
        }
    }
    private_fusectl().map_err(|e| format!("{CONNECTIONS} is not mounted, and fusectl cannot be mounted here: {e}"))
}

/// fusectl mounted with the new mount API into no namespace at all: the mount lives as long as
/// the descriptor.
fn private_fusectl() -> std::io::Result<OwnedFd> {
    let owned = |fd: libc::c_long| {
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just returned, owned here alone.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    };
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: fsopen with a valid C string and flags.
    let context = owned(unsafe { libc::syscall(libc::SYS_fsopen, c"fusectl".as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: fsconfig's create command takes no key or value.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fsmount of a created context, no attributes.
    owned(unsafe { libc::syscall(libc::SYS_fsmount, context.as_raw_fd(), FSMOUNT_CLOEXEC, 0) })
}

/// True while `mountpoint`'s top mount in this namespace has device `major:minor`.
fn mounted_as(mountpoint: &Path, major: u32, minor: u32) -> bool {
    let Ok(mut mounts) = std::fs::File::open("/proc/self/mountinfo") else { return false };
    let mut text = Vec::new();
    if mounts.read_to_end(&mut text).is_err() {
        return false;
    }
    let wanted = format!("{major}:{minor}");
    let target = mountpoint.as_os_str().as_bytes();
    let mut device = None;
    for line in text.split(|&b| b == b'\n') {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        if fields.len() > 4 && unescape(fields[4]) == target {
            device = Some(fields[2]);
        }
    }
    device == Some(wanted.as_bytes())
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal =
            field.get(i + 1..i + 4).filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(digits) => {
                out.push(digits.iter().fold(0u8, |n, d| n.wrapping_mul(8).wrapping_add(d - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Waits for the parent-death signal (blocked since before exec, so never missed).
fn wait_for_death() {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, DAEMON_DIED);
        set
    };
    // SAFETY: a valid signal set, blocked in this thread; no siginfo is asked for.
    while unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) } != DAEMON_DIED {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(br"/tmp/a\040b\134c"), b"/tmp/a b\\c");
        assert_eq!(unescape(br"/tmp/x\0"), br"/tmp/x\0");
    }
}
