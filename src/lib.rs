//! shardfs: mount a sharded Zarr v3 store and see the equivalent unsharded store.
//!
//! Layers, each depending only on those before it:
//! [`format`] (pure Zarr formats) <- [`store`] (the backing directory) <- [`view`] (view paths
//! <-> arrays, shards and inner chunks) <- [`fs`] (filesystem operations as plain structs) <-
//! [`fuse`] (the only code that speaks FUSE) <- [`mount`] and [`cli`].

pub mod cli;
pub mod compact;
pub mod demo;
pub mod error;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod inspect;
pub mod logging;
pub mod mount;
pub mod store;
pub mod view;
pub mod write;
