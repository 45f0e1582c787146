//! A live mount: the fuser session with its watcher, unmounted when dropped, and the workaround
//! for fuser 0.18 unmounting by path when an ended session is dropped (fuser#703).

use std::sync::Arc;

use super::adapter::{Fuse, SessionEnd};
use super::options::{MountSettings, config};
use super::watcher;
use crate::fs::ShardFs;

/// A live mount. Dropping it unmounts, so a test or a daemon never leaves a mount behind.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    watcher: Option<watcher::Watcher>,
    fs: Arc<ShardFs>,
    ended: SessionEnd,
}

impl Mounted {
    /// The filesystem served (for what it holds: [`ShardFs::known_inodes`]).
    pub fn filesystem(&self) -> &ShardFs {
        &self.fs
    }

    /// Has `f` called once the session ends, from its last thread after its last commit, so that
    /// whoever waits for the end (the daemon, to exit as `shardfs unmount` waits for it) is told
    /// rather than looking now and then.
    pub fn when_ended(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.ended.set(Box::new(f));
    }

    /// True once the session ended (unmounted from outside, or the connection was aborted).
    pub fn finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts (unless that already happened from outside) and waits for the session's threads.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.watcher.take();
        self.session.take().map_or(Ok(()), end)
    }

    /// Waits for a session that already ended, without unmounting anything.
    pub fn join(mut self) -> std::io::Result<()> {
        self.watcher.take();
        self.session.take().map_or(Ok(()), join_ended)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.watcher.take();
        if let Some(session) = self.session.take()
            && let Err(e) = end(session)
        {
            log::warn!("unmount: {e}");
        }
    }
}

fn end(session: fuser::BackgroundSession) -> std::io::Result<()> {
    if session.guard.is_finished() { join_ended(session) } else { session.umount_and_join() }
}

/// Joins the thread of a session the kernel has ended (the mount was unmounted from outside or
/// its connection aborted). fuser 0.18 unmounts by path when a session's mount handle is dropped,
/// and its check that the mount is still there reads the device's POLLERR (gone) as "mounted", so
/// a daemon exiting after `umount` unmounted whatever had been mounted at that path since: a
/// second `shardfs mount` right after `fusermount3 -u` vanished about every other time (fixed
/// upstream in cberner/fuser#703, not in a release yet). So the handle is never dropped; it holds
/// only the ended connection's file descriptors.
fn join_ended(session: fuser::BackgroundSession) -> std::io::Result<()> {
    let session = std::mem::ManuallyDrop::new(session);
    // SAFETY: the thread handle is moved out exactly once, and `session` is never dropped, so
    // nothing is dropped twice.
    let thread = unsafe { std::ptr::read(&session.guard) };
    thread.join().map_err(|_| std::io::Error::other("the filesystem's session thread panicked"))?
}

/// Mounts `fs` at `mountpoint` and serves it from background threads until unmounted.
pub fn mount(fs: ShardFs, mountpoint: &std::path::Path, settings: &MountSettings) -> Result<Mounted, String> {
    let config = config(settings)?;
    let fs = Arc::new(fs);
    let ended = SessionEnd::default();
    let session = fuser::Session::new(Fuse(fs.clone(), false, ended.clone()), mountpoint, &config)
        .map_err(|e| format!("{}: cannot mount: {e}", mountpoint.display()))?;
    let device = session
        .clone_device()
        .map_err(|e| log::warn!("no clone of /dev/fuse for the watcher's invalidations: {e}"))
        .ok();
    let session = session.spawn().map_err(|e| format!("{}: cannot mount: {e}", mountpoint.display()))?;
    let watcher = watcher::Watcher::start(fs.clone(), device, session.notifier());
    Ok(Mounted { session: Some(session), watcher: Some(watcher), fs, ended })
}
