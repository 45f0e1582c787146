//! The watcher thread: every pass it asks [`ShardFs::stale`] which inodes the kernel holds
//! out-of-date answers for, and invalidates them (attributes and cached pages; the name too for
//! files), so that the kernel can keep everything else for the long [`super::CACHE_TTL`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    pub fn start(fs: Arc<ShardFs>, notifier: Notifier) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
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

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
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

/// Tells the kernel one inode is out of date; false when the connection is gone.
fn invalidate(notifier: &Notifier, stale: &crate::fs::Stale) -> bool {
    let mut results = Vec::with_capacity(2);
    if let Some((parent, name)) = &stale.entry {
        results.push(notifier.inval_entry(INodeNo(*parent), name.as_ref()));
    }
    match stale.content {
        Dropped::Nothing => {}
        // A negative offset: the attributes alone.
        Dropped::Attributes => results.push(notifier.inval_inode(INodeNo(stale.ino), -1, 0)),
        Dropped::Everything => results.push(notifier.inval_inode(INodeNo(stale.ino), 0, 0)),
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
