//! The watcher thread: every pass it asks [`ShardFs::stale`] which inodes the kernel holds
//! out-of-date answers for, and invalidates them (attributes and cached pages; the name too for
//! files), so that the kernel can keep everything else for the long [`super::CACHE_TTL`].
//!
//! The invalidations are written by a thread of their own, [`Notices`], with a file table of its
//! own that holds nothing but a clone of the session's /dev/fuse. Dropping a name takes its
//! directory's lock, and dropping pages a page's, which a call waiting on the daemon may hold:
//! the write then sleeps in the kernel, where no signal reaches it, until that call is answered.
//! Were the daemon killed then, a thread sharing the daemon's file table would keep the session's
//! /dev/fuse open, and the kernel would never end the calls the daemon was working on, so the
//! write would never return and the process never end (issue 61, hole 8). Apart, the notifying
//! thread holds only its clone: the daemon's other threads gone, the session's /dev/fuse closes,
//! which ends every call the daemon had been sent, which lets the write return, so the process
//! ends. A call still queued when the daemon died is not ended so; the daemon's guard
//! (`mount::guard`) aborts the connection for those.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier};

use crate::fs::{Dropped, ShardFs};

/// Time between two passes; a change underneath the mount is seen within about this long.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// A pass may use at most this share of a core (one in `PACE`), counted in the watcher thread's
/// own CPU time: a mount holding a great many files passes less often rather than keep a core
/// busy, while a pass that only waited (on a server at cloud latency, or one that is down) puts
/// the next one off no longer than [`INTERVAL`]. Paced by wall time, a pass that waited out an
/// outage put the next one off by minutes, and changes by others went unseen until the kernel's
/// own expiry.
const PACE: u32 = 20;

/// The running watcher; dropping it stops the thread.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching, writing invalidations through `device` (a clone of the session's
    /// /dev/fuse, see [`Notices`]) or, where that cannot be had, through `notifier`.
    pub fn start(fs: Arc<ShardFs>, device: Option<OwnedFd>, notifier: Notifier) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let notifier = match device.map(Notices::start) {
            Some(Ok(notices)) => Channel::Apart(notices),
            Some(Err(e)) => {
                log::warn!("invalidations written by a thread sharing the daemon's files: {e}");
                Channel::Shared(notifier)
            }
            None => Channel::Shared(notifier),
        };
        let thread = std::thread::Builder::new()
            .name("shardfs-watch".into())
            .spawn(move || {
                let mut pause = INTERVAL;
                while sleep_unless_stopped(&stopped, pause, || fs.document_stored()) {
                    let start = (Instant::now(), thread_cpu_time());
                    for stale in fs.stale(super::CACHE_TTL) {
                        if !invalidate(&notifier, &stale) {
                            return;
                        }
                    }
                    let used = match (start.1, thread_cpu_time()) {
                        (Some(before), Some(after)) => after.saturating_sub(before),
                        _ => start.0.elapsed(),
                    };
                    pause = pause_after(used);
                }
            })
            .expect("spawning the watcher thread");
        Watcher { stop, thread: Some(thread) }
    }
}

/// How long stopping the watcher waits for a pass under way to end. A pass waiting on a server that
/// does not answer (a listing's tries take up to 80 s) is not waited for: the daemon ends, and the
/// thread with it, as `shardfs unmount` waits for it. What a pass does is only looking and telling
/// the kernel, which an ended session no longer needs.
const STOP_WAIT: Duration = Duration::from_secs(2);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else { return };
        let deadline = Instant::now() + STOP_WAIT;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            log::info!("the watcher's pass is waiting on the store: not waited for");
        }
    }
}

/// The pause after a pass that used `cpu` of the watcher thread's time.
fn pause_after(cpu: Duration) -> Duration {
    INTERVAL.max(cpu * PACE)
}

/// The CPU time the calling thread has used; `None` where the clock is missing, and the caller
/// counts wall time instead.
fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return None;
    }
    Some(Duration::new(u64::try_from(now.tv_sec).ok()?, u32::try_from(now.tv_nsec).ok()?))
}

/// Sleeps `pause` in short steps, or until `due` says a pass is due; false once told to stop.
fn sleep_unless_stopped(stop: &AtomicBool, pause: Duration, due: impl Fn() -> bool) -> bool {
    let step = Duration::from_millis(20);
    let end = Instant::now() + pause;
    while Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        if due() {
            break;
        }
        std::thread::sleep(step.min(end - Instant::now()));
    }
    !stop.load(Ordering::Relaxed)
}

/// Where invalidations are written: the thread apart, or fuser's notifier on the session's own
/// /dev/fuse where no clone could be had.
enum Channel {
    Apart(Notices),
    Shared(Notifier),
}

/// One invalidation: of a name in a directory, or of an inode's attributes and pages.
enum Notice {
    Entry(INodeNo, OsString),
    Inode(INodeNo, i64, i64),
}

impl Notice {
    fn send(self, notifier: &Notifier) -> std::io::Result<()> {
        match self {
            Notice::Entry(parent, name) => notifier.inval_entry(parent, &name),
            Notice::Inode(ino, offset, len) => notifier.inval_inode(ino, offset, len),
        }
    }
}

impl Channel {
    fn send(&self, notice: Notice) -> std::io::Result<()> {
        match self {
            Channel::Apart(notices) => notices.send(notice),
            Channel::Shared(notifier) => notice.send(notifier),
        }
    }
}

/// The thread that writes invalidations, with a file table holding only its clone of the
/// session's /dev/fuse. It must open nothing and log nothing: a
/// descriptor it opened would exist in its table alone, and the logger's (or syslog's, reopened
/// there) would then name nothing, or another file, in every other thread.
struct Notices {
    messages: Option<mpsc::Sender<Notice>>,
    answers: mpsc::Receiver<std::io::Result<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Notices {
    fn start(device: OwnedFd) -> std::io::Result<Notices> {
        let (messages, to_write) = mpsc::channel::<Notice>();
        let (answer, answers) = mpsc::channel();
        let raw = device.as_raw_fd();
        let thread = std::thread::Builder::new().name("shardfs-notify".into()).spawn(move || {
            let Ok(()) = answer.send(table_of_its_own(raw)) else { return };
            // SAFETY: `raw` is open in this thread's table alone, where nothing else owns it.
            let notifier = Notifier::from_device(unsafe { OwnedFd::from_raw_fd(raw) });
            for notice in to_write {
                if answer.send(notice.send(&notifier)).is_err() {
                    return;
                }
            }
        })?;
        let notices = Notices { messages: Some(messages), answers, thread: Some(thread) };
        let ready = notices.answers.recv().map_err(|_| std::io::Error::other("the notifying thread ended"))?;
        // Ready or not, the thread's table holds its own copy of the descriptor: this one goes.
        drop(device);
        ready.map(|()| notices)
    }

    fn send(&self, notice: Notice) -> std::io::Result<()> {
        let gone = || std::io::Error::from_raw_os_error(libc::ENODEV);
        self.messages.as_ref().ok_or_else(gone)?.send(notice).map_err(|_| gone())?;
        self.answers.recv().map_err(|_| gone())?
    }
}

impl Drop for Notices {
    fn drop(&mut self) {
        self.messages.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Gives the calling thread a file table of its own and closes in it every descriptor but `keep`:
/// the standard three too, which a daemon points at /dev/null only once mounted, and whose pipes
/// to the command that started it must close then.
fn table_of_its_own(keep: libc::c_int) -> std::io::Result<()> {
    // SAFETY: unshare of the file table affects this thread alone.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let keep = libc::c_uint::try_from(keep).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    let below = keep.checked_sub(1).map(|last| (0, last));
    for (first, last) in below.into_iter().chain([(keep + 1, libc::c_uint::MAX)]) {
        // SAFETY: close_range on this thread's own table, which no Rust value here refers to.
        if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Tells the kernel one inode is out of date; false when the connection is gone.
fn invalidate(notifier: &Channel, stale: &crate::fs::Stale) -> bool {
    let mut results = Vec::with_capacity(2);
    if let Some((parent, name)) = &stale.entry {
        results.push(notifier.send(Notice::Entry(INodeNo(*parent), name.into())));
    }
    match stale.content {
        Dropped::Nothing => {}
        // A negative offset: the attributes alone.
        Dropped::Attributes => results.push(notifier.send(Notice::Inode(INodeNo(stale.ino), -1, 0))),
        Dropped::Everything => results.push(notifier.send(Notice::Inode(INodeNo(stale.ino), 0, 0))),
    }
    results.into_iter().all(|r| match r {
        // The kernel no longer caches it: nothing to invalidate.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::EBADF)) => false,
        Err(e) => {
            log::warn!("invalidating inode {}: {e}", stale.ino);
            true
        }
        Ok(()) => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_only_waited_puts_the_next_off_no_longer_than_the_interval() {
        let before = thread_cpu_time().expect("a thread CPU clock");
        // As a pass does while a request waits out its time limit on a server that is down.
        std::thread::sleep(Duration::from_millis(300));
        let used = thread_cpu_time().unwrap().saturating_sub(before);
        assert_eq!(pause_after(used), INTERVAL, "{used:?} of CPU counted for 300 ms asleep");
    }

    #[test]
    fn a_pass_that_kept_the_core_busy_puts_the_next_off_by_twenty_times_its_cpu() {
        let before = thread_cpu_time().expect("a thread CPU clock");
        let mut spins = 0u64;
        while thread_cpu_time().unwrap().saturating_sub(before) < Duration::from_millis(200) {
            spins = std::hint::black_box(spins + 1);
        }
        let used = thread_cpu_time().unwrap().saturating_sub(before);
        assert!(pause_after(used) >= Duration::from_secs(4), "{used:?} of CPU gave {:?}", pause_after(used));
    }
}
