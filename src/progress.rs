//! Progress of a store-wide run (`check`, `info`, `compact`): the commands report what they do
//! through [`Progress`], and the command line decides how to show it (a bar on a terminal,
//! nothing otherwise), so that no layer below it knows about terminals.

/// Receives the progress of a run over the shards of a store.
pub trait Progress {
    /// The run has `shards` shards to go through, in all arrays together.
    fn start(&self, shards: u64);
    /// The next shards are those of the array at `dir`.
    fn array(&self, dir: &str);
    /// One more shard is done.
    fn shard_done(&self);
    /// The run is over (also after an error); nothing more is reported.
    fn finish(&self);
}

/// Reports nothing: for library callers and tests.
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: u64) {}
    fn array(&self, _: &str) {}
    fn shard_done(&self) {}
    fn finish(&self) {}
}
