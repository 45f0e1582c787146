//! Everything that speaks FUSE; nothing else in the crate imports `fuser`.
//!
//! - [`adapter`]: the filesystem callbacks, one call into `ShardFs` each, and the one place where
//!   an error becomes an errno.
//! - [`options`]: `-o` mount options.
//! - [`session`]: a live mount, unmounted when dropped.
//! - [`watcher`]: the thread that tells the kernel which of its cached answers went stale.

pub mod adapter;
pub mod options;
pub mod session;
mod watcher;

pub use adapter::{CACHE_TTL, Fuse, METRICS_ADDRESS_LEN, METRICS_IOCTL, PID_IOCTL, WATCH_INTERVAL, errno};
pub use options::{MountSettings, check_options};
pub use session::{Mounted, mount};
