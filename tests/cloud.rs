//! The object-store backend against Azure Blob Storage's emulator (Azurite), which
//! scripts/test.sh starts, gives a container, and names in SHARDFS_TEST_AZURE_ENDPOINT (the
//! account's blob endpoint) and SHARDFS_TEST_AZURE_CONTAINER: the store conformance checks
//! through `az://` URLs, cached and uncached; the conditional-write probe passes (Azurite refuses
//! If-None-Match: * on an existing blob and a stale If-Match), and creates and updates are refused
//! once the blob changed. (GCS's emulator here takes no XML PUT, so the GCS store is tested read-only, by
//! scripts/interop_s3.py --service gcs.)

use std::time::Duration;

use shardfs::store::bucket::Caching;
use shardfs::store::bucket::azure::{self, AzureOptions};
use shardfs::store::{Error, PutMode, Store, conformance};

/// Azurite's account and its well-known key.
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The emulator's endpoint and container, with its credentials in the environment; `None` (the
/// test skipped, loudly) when scripts/test.sh did not start one.
fn azurite(what: &str) -> Option<(String, String)> {
    let (Ok(endpoint), Ok(container)) =
        (std::env::var("SHARDFS_TEST_AZURE_ENDPOINT"), std::env::var("SHARDFS_TEST_AZURE_CONTAINER"))
    else {
        assert!(
            std::env::var("SHARDFS_REQUIRE_AZURE").is_err(),
            "SHARDFS_REQUIRE_AZURE is set but SHARDFS_TEST_AZURE_ENDPOINT or _CONTAINER is not"
        );
        eprintln!("*** SKIPPING {what}: no SHARDFS_TEST_AZURE_ENDPOINT (scripts/test.sh starts Azurite) ***");
        return None;
    };
    // SAFETY: every test that reads them sets the same values, and object_store reads them while
    // building a client, after this.
    unsafe {
        std::env::set_var("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT);
        std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", KEY);
    }
    Some((endpoint, container))
}

fn open(endpoint: &str, url: &str, caching: Caching) -> shardfs::store::bucket::BucketStore {
    azure::open(url, &AzureOptions { endpoint_url: Some(endpoint.to_string()) }, caching).unwrap()
}

#[test]
fn azurite_passes_the_store_conformance_checks() {
    let Some((endpoint, container)) = azurite("the Azure conformance checks") else { return };
    let run = std::process::id();
    for (prefix, caching) in [
        ("cached", Caching::default()),
        ("uncached", Caching { metadata_ttl: Duration::ZERO, read_ahead_bytes: 0, ..Caching::default() }),
    ] {
        let store = open(&endpoint, &format!("az://{container}/conformance-{run}/{prefix}"), caching);
        conformance::check(&store);
    }
}

#[test]
fn azurite_refuses_conditional_writes_that_do_not_hold() {
    let Some((endpoint, container)) = azurite("the Azure conditional-write checks") else { return };
    let store = open(&endpoint, &format!("az://{container}/conditions-{}", std::process::id()), Caching::default());
    store.check_writes().unwrap();
    store.put("k", &[b"one"], PutMode::Create).unwrap();
    assert!(matches!(store.put("k", &[b"two"], PutMode::Create), Err(Error::Changed(_))));
    let first = store.attr("k").unwrap().stamp;
    store.put("k", &[b"two"], PutMode::Update(first)).unwrap();
    assert!(matches!(store.put("k", &[b"three"], PutMode::Update(first)), Err(Error::Changed(_))));
    assert_eq!(store.read("k").unwrap(), b"two");
}
