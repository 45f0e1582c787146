//! shardfs: mount a sharded Zarr v3 store and see the equivalent unsharded store.
//!
//! Layers, each depending only on those before it (`tests/layers.rs` checks it from the source):
//! [`format`] (pure Zarr formats) <- [`store`] (the backing store, behind the `Store` trait) <-
//! [`view`] (view paths <-> arrays, shards and inner chunks) <- [`write`] (commits, journal,
//! group commit) <- [`fs`] (filesystem operations as plain structs) <- [`fuse`] (the only code
//! that speaks FUSE) <- the commands: [`inspect`] and [`compact`] (which never use each other),
//! [`mount`], then [`demo`] and [`cli`], and last [`csi`] (the Kubernetes driver, which runs
//! `shardfs mount` and reads mount options as the command line does). [`logging`], [`metrics`] (what the daemon counts, served for
//! an operator) and [`progress`] (how the commands report their progress, shown by the command
//! line) stand apart.

pub mod cli;
pub mod compact;
pub mod csi;
pub mod demo;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod inspect;
pub mod logging;
pub mod metrics;
pub mod mount;
pub mod progress;
pub mod store;
pub mod view;
pub mod write;
