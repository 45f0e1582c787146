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

/// A pass may take at most this share of the time (one in `PACE`): a mount holding a great many
/// files passes less often rather than keep a core busy.
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
                    let start = Instant::now();
                    for stale in fs.stale(super::CACHE_TTL) {
                        if !invalidate(&notifier, &stale) {
                            return;
                        }
                    }
                    pause = INTERVAL.max(start.elapsed() * PACE);
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
