//! The object-store backend against Azure Blob Storage's emulator (Azurite), which
//! scripts/test.sh starts (through tests/interop/object_stores.py), gives a container, and names
//! in SHARDFS_TEST_AZURE_ENDPOINT (the account's blob endpoint) and SHARDFS_TEST_AZURE_CONTAINER:
//! the store conformance checks
//! through `az://` URLs, cached and uncached; the conditional-write probe passes (Azurite refuses
//! If-None-Match: * on an existing blob and a stale If-Match), and creates and updates are refused
//! once the blob changed; a blob is extended by blocks copied from the version read (Azurite
//! patched by scripts/azurite.patch), and not over a version replaced. GCS's emulator here takes
//! no XML PUT, so the GCS store is tested
//! read-only by tests/interop/test_object_stores.py; its writes, matched on generations that
//! listings do not tell, are checked here against a model of that rule over object_store's
//! in-memory store (`Generations`): the conformance checks, and an update of a version known
//! from a listing only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode as Mode, PutOptions, PutPayload, PutResult};
use parking_lot::Mutex;
use shardfs::store::bucket::azure::{self, AzureOptions};
use shardfs::store::bucket::{Abilities, BucketStore, Caching, Service};
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

/// A commit in doubt measures its stall by the server's clock too: the `Date` of Azurite's answers
/// (the same machine's clock, here), none before the first.
#[test]
fn azurites_answers_tell_the_exchange_the_servers_time() {
    let Some((endpoint, container)) = azurite("the Azure server-clock check") else { return };
    let store = open(&endpoint, &format!("az://{container}/clock-{}", std::process::id()), Caching::default());
    let exchange = store.exchange().expect("Azure keeps notes");
    store.put("k", &[b"one"], PutMode::Create).unwrap();
    exchange.head("k").unwrap();
    let told = exchange.server_time().expect("a Date from Azurite");
    let now = std::time::SystemTime::now();
    let off = now.duration_since(told).unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(5), "Azurite's Date {told:?} is {off:?} from now");
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

#[test]
fn azurite_extends_a_blob_by_copying_its_first_bytes_and_only_the_version_read() {
    let Some((endpoint, container)) = azurite("the Azure extend checks") else { return };
    let store = open(&endpoint, &format!("az://{container}/extend-{}", std::process::id()), Caching::default());
    store.check_writes().unwrap();
    // The probe found that Azurite (patched: scripts/azurite.patch) copies blocks of the version
    // named and refuses others; below 5 MiB a shard is written whole.
    assert!(store.can_keep(5 << 20));
    assert!(!store.can_keep((5 << 20) - 1));
    let old: Vec<u8> = (0..6u32 << 20).map(|n| (n.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let first = store.put("k", &[&old], PutMode::Create).unwrap().unwrap();
    let kept = old.len() as u64 - 1000;
    let tail: Vec<u8> = (0..3000u32).map(|n| (n * 7) as u8).collect();
    let second = store.put_extending("k", &first, kept, &[&tail[..1000], &tail[1000..]], "noted").unwrap().unwrap();
    let mut want = old[..kept as usize].to_vec();
    want.extend_from_slice(&tail);
    assert_eq!(store.read("k").unwrap(), want);
    assert_eq!(store.exchange().unwrap().note("k").unwrap().map(|noted| noted.note).as_deref(), Some("noted"));
    // The version read replaced meanwhile: the copy is refused, and nothing changes.
    assert!(matches!(store.put_extending("k", &first, kept, &[b"lost"], ""), Err(Error::Changed(_))));
    assert_eq!(store.read("k").unwrap(), want);
    // No new bytes: the version is the old one's first bytes alone.
    let third = store.put_extending("k", &second, 5 << 20, &[], "").unwrap().unwrap();
    assert_eq!(store.read("k").unwrap(), want[..5 << 20]);
    assert_ne!(third, second);
}

/// GCS's rule for conditional writes over object_store's in-memory store: every object has a
/// generation, told by GETs, HEADs and PUTs but not by listings; a create matches generation 0
/// (none), an update must name the current generation (an ETag alone is refused, as
/// object_store's GCS client refuses an update without a version).
#[derive(Debug, Default)]
struct Generations {
    objects: InMemory,
    generations: Mutex<HashMap<Path, u64>>,
    next: Mutex<u64>,
}

impl std::fmt::Display for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "Generations")
    }
}

impl Generations {
    fn refused(&self, location: &Path, why: &str) -> object_store::Error {
        object_store::Error::Precondition { path: location.to_string(), source: why.to_string().into() }
    }
}

#[async_trait::async_trait]
impl ObjectStore for Generations {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let generation = {
            let mut generations = self.generations.lock();
            let current = generations.get(location).copied().unwrap_or(0);
            match &opts.mode {
                Mode::Overwrite => {}
                Mode::Create if current != 0 => {
                    return Err(object_store::Error::AlreadyExists {
                        path: location.to_string(),
                        source: "generation match 0".into(),
                    });
                }
                Mode::Create => {}
                Mode::Update(v) => {
                    let Some(named) = &v.version else {
                        return Err(object_store::Error::Generic { store: "Generations", source: "no version".into() });
                    };
                    if named.parse::<u64>().ok() != Some(current) {
                        return Err(self.refused(location, "generation mismatch"));
                    }
                }
            }
            let mut next = self.next.lock();
            *next += 1;
            generations.insert(location.clone(), *next);
            *next
        };
        let put = self.objects.put_opts(location, payload, PutOptions::default()).await?;
        Ok(PutResult { e_tag: put.e_tag, version: Some(generation.to_string()), extensions: Default::default() })
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.objects.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        let mut got = self.objects.get_opts(location, options).await?;
        got.meta.version = self.generations.lock().get(location).map(u64::to_string);
        Ok(got)
    }
    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<Path>> {
        self.objects.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.objects.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<object_store::ListResult> {
        self.objects.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: object_store::CopyOptions) -> object_store::Result<()> {
        self.objects.copy_opts(from, to, options).await?;
        let mut next = self.next.lock();
        *next += 1;
        self.generations.lock().insert(to.clone(), *next);
        Ok(())
    }
}

const GCS_LIKE: Service =
    Service { name: "GCS", bucket: "bucket", updates_name_generation: true, abilities: Abilities::ALL };

fn generations_store(objects: &Arc<Generations>, caching: Caching) -> BucketStore {
    BucketStore::of_service(GCS_LIKE, objects.clone(), "p", "gs://model/p", caching).unwrap()
}

#[test]
fn generation_matched_writes_pass_the_store_conformance_checks() {
    conformance::check(&generations_store(&Arc::default(), Caching::default()));
    conformance::check(&generations_store(
        &Arc::default(),
        Caching { metadata_ttl: Duration::ZERO, read_ahead_bytes: 0, ..Caching::default() },
    ));
}

#[test]
fn an_update_of_a_version_seen_in_a_listing_names_its_generation() {
    let objects = Arc::default();
    generations_store(&objects, Caching::default()).put("d/k", &[b"one"], PutMode::Create).unwrap();
    let writer = generations_store(&objects, Caching::default());
    // Another store, whose only sight of the object is a listing (no generation in it).
    assert_eq!(writer.list("d").unwrap().0.len(), 1);
    let seen = writer.attr("d/k").unwrap().stamp;
    writer.put("d/k", &[b"two"], PutMode::Update(seen)).unwrap();
    assert!(matches!(writer.put("d/k", &[b"three"], PutMode::Update(seen)), Err(Error::Changed(_))));
    assert!(matches!(writer.put("d/k", &[b"three"], PutMode::Create), Err(Error::Changed(_))));
    assert_eq!(writer.read("d/k").unwrap(), b"two");
}
