//! Writing shards without ever tearing one: every change to a shard is one [`commit`] that
//! appends new chunk bytes and a fresh index after the shard's end (or, for index-at-start
//! shards and new shards, writes a whole new shard beside the old one and renames it over).
//!
//! - [`lock`]: advisory locks that keep two processes (or threads) from committing to one shard
//!   at once.
//! - [`journal`]: the records that let a torn append be rolled back, and recovery.
//! - [`commit`]: one shard update.
//! - [`document`]: storing a `zarr.json` written through the view, translated back to its sharding.
//! - [`pending`]: group commit: chunk writes waiting for their shard's next commit.
//! - [`crash_point`]: the fault-injection hook that stops a commit at any byte, for crash tests.
//!
//! Everything shardfs keeps for itself lives under [`PRIVATE_DIR`] at the store root.

pub mod commit;
pub mod crash_point;
pub mod document;
pub mod journal;
pub mod lock;
pub mod pending;

pub use crate::store::PRIVATE_DIR;
