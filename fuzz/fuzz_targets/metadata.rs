//! Any bytes as a `zarr.json` (v3 and the draft layout's `.array.json`): interpretation never
//! panics, and a document shown unsharded is itself valid JSON whose write-back is accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardfs::format::{draft, metadata, source};

fuzz_target!(|data: &[u8]| {
    for interpretation in [metadata::interpret(data), draft::interpret_array(data)] {
        if let source::Interpretation::ShardedArray { view, array } = interpretation {
            assert!(serde_json::from_slice::<serde_json::Value>(&view).is_ok(), "the view is not JSON");
            assert_eq!(array.shape.len(), array.sharding.shard_shape.len());
        }
    }
});
