//! `gs://BUCKET/PREFIX` URLs and the Google Cloud settings, read as object_store reads them: a
//! service account file (GOOGLE_SERVICE_ACCOUNT, or GOOGLE_APPLICATION_CREDENTIALS, as gcloud
//! sets them) or key (GOOGLE_SERVICE_ACCOUNT_KEY), else the application default credentials
//! (`gcloud auth application-default login`), else the instance metadata server.
//! `--endpoint-url` names another base URL (an emulator: `http://127.0.0.1:4443`); requests to
//! an `http://` one carry no real credentials unless some are given, as emulators expect. A
//! service account file may name its own base URL (`gcs_base_url`) too.

use std::sync::Arc;

use object_store::ClientConfigKey;
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};

use super::{Abilities, BucketStore, Caching, Service};

const SERVICE: Service =
    Service { name: "GCS", bucket: "bucket", updates_name_generation: true, abilities: Abilities::ALL };

/// Settings given on the command line.
#[derive(Clone, Debug, Default)]
pub struct GcsOptions {
    pub endpoint_url: Option<String>,
}

/// The bucket and prefix of a `gs://` URL; `None` when `url` is not one.
pub fn parse_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("gs://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    (!bucket.is_empty()).then_some((bucket, prefix.trim_matches('/')))
}

/// Opens the store at `url` (`gs://BUCKET/PREFIX`); the error is one line naming the URL.
pub fn open(url: &str, options: &GcsOptions, caching: Caching) -> Result<BucketStore, String> {
    let (bucket, prefix) = parse_url(url).ok_or_else(|| format!("{url}: not a gs://BUCKET/PREFIX URL"))?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let keys_given = [
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ]
    .iter()
    .any(|name| env(name).is_some());
    let mut builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
    let local = options.endpoint_url.as_deref().is_some_and(|e| e.starts_with("http://"));
    if let Some(endpoint) = &options.endpoint_url {
        builder = builder
            .with_base_url(endpoint.trim_end_matches('/'))
            .with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), local.to_string());
    }
    if local && !keys_given {
        // Not skip_signature: object_store 0.14 still asks the metadata server for a token before
        // each PUT with it. A token nobody checks goes with every request instead.
        builder = builder.with_bearer_token("emulator");
    }
    // An emulator's buckets are not Google's: the disk cache tells them apart.
    let mut caching = caching;
    if let Some(disk) = caching.disk.as_mut() {
        disk.server = options.endpoint_url.clone().unwrap_or_else(|| "gcs".into());
    }
    let objects = builder
        .with_retry(super::retry())
        .with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), "30s")
        .with_config(GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout), "5s")
        .build()
        .map_err(|e| format!("{url}: {}", super::one_line(&e)))?;
    let store_url = format!("gs://{bucket}{}{prefix}", if prefix.is_empty() { "" } else { "/" });
    let store = BucketStore::of_service(SERVICE, Arc::new(objects), prefix, &store_url, caching)
        .map_err(|e| format!("{url}: {e}"))?;
    let keys_given = options.endpoint_url.as_deref().is_some_and(|e| e.starts_with("http://"))
        || [
            "GOOGLE_SERVICE_ACCOUNT",
            "GOOGLE_SERVICE_ACCOUNT_PATH",
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ]
        .iter()
        .any(|name| env(name).is_some());
    store
        .check_bucket()
        .map_err(|e| match keys_given {
            true => format!("{store_url}: {e}"),
            false => format!(
                "{store_url}: no Google credentials (no GOOGLE_APPLICATION_CREDENTIALS nor service account, and \
                 the application default credentials or instance metadata failed: {e})"
            ),
        })
        .map(|()| store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        assert_eq!(parse_url("gs://b/a/c/"), Some(("b", "a/c")));
        assert_eq!(parse_url("gs://b"), Some(("b", "")));
        assert_eq!(parse_url("gs://"), None);
        assert_eq!(parse_url("az://b/p"), None);
    }
}
