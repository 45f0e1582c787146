//! Writing shards without ever tearing one: every change to a shard is one [`commit`], under the
//! shard's lock, by one of three strategies chosen by what the store can do.
//!
//! - [`commit`]: one shard update under the shard's lock, tried again when another writer got there first.
//! - [`apply`]: changes applied over the shard version read, and the choice of strategy.
//! - [`append`]: new chunk bytes and a fresh index appended after the shard's end, journaled.
//! - [`extend`]: the old chunk bytes copied inside the store, new chunks and a fresh index sent,
//!   written atomically over the version read (object stores).
//! - [`rewrite`]: a whole new shard written atomically over the version read.
//! - [`shared_commit`]: commits into shards other machines write at once, taking turns through
//!   a lease and folding the others' [`delta`]s in.
//! - [`lease`]: the lease those commits take turns by, and the holders in doubt it passes on.
//! - [`journal`]: the records that let a torn append be rolled back, and recovery.
//! - [`document`]: storing a `zarr.json` written through the view, translated back to its sharding.
//! - [`pending`]: group commit: chunk writes waiting for their shard's next commit.
//! - [`own_commits`]: the shard versions this mount's commits replaced, and what each changed.
//! - [`shard`]: a shard as a commit sees it: changes, current version, outcome.
//! - [`error`]: why a commit, or the storing of a document, did not happen.
//!
//! Everything shardfs keeps for itself lives under [`crate::store::PRIVATE_DIR`] at the store root.

pub mod append;
pub mod apply;
pub mod commit;
pub mod delta;
pub mod document;
pub mod error;
pub mod extend;
pub mod journal;
pub mod lease;
pub mod own_commits;
pub mod pending;
pub mod rewrite;
pub mod shard;
pub mod shared_commit;
