//! `az://CONTAINER/PREFIX` URLs (and the `abfs[s]://`, `adl://`, `azure://` and
//! `https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX` forms object_store parses) and the
//! Azure settings, read as object_store reads them from the environment: the account
//! (AZURE_STORAGE_ACCOUNT_NAME) and one of its key (AZURE_STORAGE_ACCOUNT_KEY), a SAS token
//! (AZURE_STORAGE_SAS_TOKEN), a bearer token, a service principal (AZURE_CLIENT_ID,
//! AZURE_CLIENT_SECRET, AZURE_TENANT_ID), a workload identity, the Azure CLI
//! (AZURE_USE_AZURE_CLI=true) or, with none of these, the managed identity of the machine.
//! AZURE_STORAGE_USE_EMULATOR=true talks to Azurite with its well-known account.
//! `--endpoint-url` names the account's blob endpoint (a sovereign cloud, or an emulator:
//! `http://127.0.0.1:10000/devstoreaccount1`).

use std::sync::Arc;

use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::{ClientConfigKey, ObjectStoreScheme};

use super::azure_blocks::Blocks;
use super::server_clock::{DatedConnector, ServerClock};
use super::{Abilities, BucketStore, Caching, Service};

/// Azurite's account and its key, published by Microsoft for every emulator install.
const EMULATOR_ACCOUNT: &str = "devstoreaccount1";
const EMULATOR_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

const SERVICE: Service =
    Service { name: "Azure", bucket: "container", updates_name_generation: false, abilities: Abilities::ALL };

/// Settings given on the command line.
#[derive(Clone, Debug, Default)]
pub struct AzureOptions {
    pub endpoint_url: Option<String>,
}

/// True when `url` names an Azure Blob Storage container (any form object_store parses).
pub fn is_azure_url(url: &str) -> bool {
    parse_url(url).is_some()
}

/// The container and the prefix below it of an Azure URL; `None` when `url` is not one.
fn parse_url(url: &str) -> Option<(String, String)> {
    let parsed = url::Url::parse(url).ok()?;
    let (ObjectStoreScheme::MicrosoftAzure, path) = ObjectStoreScheme::parse(&parsed).ok()? else { return None };
    // As object_store's builder reads it: `abfs://FS@ACCOUNT.dfs...` names the container before
    // the `@`, `https://ACCOUNT.blob...` in the path, the short forms as the host.
    let container = match (parsed.scheme(), parsed.username()) {
        ("https", _) => parsed.path_segments()?.next()?.to_string(),
        (_, "") => parsed.host_str()?.to_string(),
        (_, user) => user.to_string(),
    };
    (!container.is_empty()).then(|| (container, path.as_ref().trim_matches('/').to_string()))
}

/// Opens the store at `url`; the error is one line naming the URL.
pub fn open(url: &str, options: &AzureOptions, caching: Caching) -> Result<BucketStore, String> {
    let (container, prefix) = parse_url(url).ok_or_else(|| format!("{url}: not an az://CONTAINER/PREFIX URL"))?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut builder = MicrosoftAzureBuilder::from_env().with_url(url);
    let emulator = env("AZURE_STORAGE_USE_EMULATOR").is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if let Some(endpoint) = &options.endpoint_url {
        // object_store's emulator mode reads its address from AZURITE_BLOB_STORAGE_URL only: with
        // an endpoint given, talk to it as to an account, Azurite's own unless others are named.
        if emulator {
            builder = builder.with_use_emulator(false);
            if env("AZURE_STORAGE_ACCOUNT_NAME").is_none() {
                builder = builder.with_account(EMULATOR_ACCOUNT);
            }
            if env("AZURE_STORAGE_ACCOUNT_KEY").is_none() && env("AZURE_STORAGE_SAS_TOKEN").is_none() {
                builder = builder.with_access_key(EMULATOR_KEY);
            }
        }
        builder = builder.with_allow_http(endpoint.starts_with("http://")).with_endpoint(endpoint.clone());
    }
    // Two accounts may hold containers of one name: the disk cache tells them apart.
    let mut caching = caching;
    if let Some(disk) = caching.disk.as_mut() {
        let account = builder.get_config_value(&AzureConfigKey::AccountName).unwrap_or_default();
        disk.server = format!("{account}@{}", options.endpoint_url.as_deref().unwrap_or("azure"));
    }
    let account_and_container = container_url(&builder, url, &container, options, emulator);
    let clock = Arc::new(ServerClock::default());
    let objects = builder
        .with_http_connector(DatedConnector { clock: clock.clone(), bucket: container.clone() })
        .with_retry(super::retry())
        .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), "30s")
        .with_config(AzureConfigKey::Client(ClientConfigKey::ConnectTimeout), "5s")
        .build()
        .map_err(|e| format!("{url}: {}", super::one_line(&e)))?;
    let store_url = format!("az://{container}{}{prefix}", if prefix.is_empty() { "" } else { "/" });
    let objects = Arc::new(objects);
    let mut store = BucketStore::of_service(SERVICE, objects.clone(), &prefix, &store_url, caching)
        .map_err(|e| format!("{url}: {e}"))?
        .with_server_clock(clock);
    if let Some((account, container_url)) = account_and_container {
        store = store.with_blocks(Blocks::new(objects, &account, &container_url).map_err(|e| format!("{url}: {e}"))?);
    }
    let keys_given = emulator
        || ["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_TOKEN"]
            .iter()
            .any(|name| env(name).is_some());
    store
        .check_bucket()
        .map_err(|e| match keys_given {
            true => format!("{store_url}: {e}"),
            false => format!(
                "{store_url}: no Azure credentials (no AZURE_STORAGE_ACCOUNT_KEY nor SAS token, and the managed \
             identity or Azure CLI failed: {e})"
            ),
        })
        .map(|()| store)
}

/// The account and the container's URL, as object_store's builder makes them (which it does not
/// tell): for the requests it has none of ([`Blocks`]). `None` where the account is not known
/// here; a URL made wrong here only fails the probe of [`Blocks`], and shards are written whole.
fn container_url(
    builder: &MicrosoftAzureBuilder,
    url: &str,
    container: &str,
    options: &AzureOptions,
    emulator: bool,
) -> Option<(String, String)> {
    // The URL's host names the account (`ACCOUNT.blob.core.windows.net`, `FS@ACCOUNT.dfs...`) over
    // any setting, as in object_store; the short forms' host is the container.
    let parsed = url::Url::parse(url).ok()?;
    let from_host = parsed.host_str().filter(|h| h.contains('.')).and_then(|h| h.split('.').next()).map(str::to_string);
    let setting = builder.get_config_value(&AzureConfigKey::AccountName);
    if let Some(endpoint) = &options.endpoint_url {
        let account = from_host.or(setting).unwrap_or_else(|| EMULATOR_ACCOUNT.to_string());
        return Some((account, format!("{}/{container}", endpoint.trim_end_matches('/'))));
    }
    if emulator {
        let account = setting.unwrap_or_else(|| EMULATOR_ACCOUNT.to_string());
        let server = std::env::var("AZURITE_BLOB_STORAGE_URL").unwrap_or_else(|_| "http://127.0.0.1:10000".into());
        return Some((account.clone(), format!("{}/{account}/{container}", server.trim_end_matches('/'))));
    }
    let account = from_host.or(setting)?;
    let fabric = builder.get_config_value(&AzureConfigKey::UseFabricEndpoint).is_some_and(|v| v == "true");
    let service = match builder.get_config_value(&AzureConfigKey::Endpoint) {
        Some(endpoint) => endpoint.trim_end_matches('/').to_string(),
        None if fabric => format!("https://{account}.blob.fabric.microsoft.com"),
        None => format!("https://{account}.blob.core.windows.net"),
    };
    Some((account, format!("{service}/{container}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_every_form_name_a_prefix() {
        let parts = |c: &str, p: &str| Some((c.to_string(), p.to_string()));
        assert_eq!(parse_url("az://c/a/b/"), parts("c", "a/b"));
        assert_eq!(parse_url("az://c"), parts("c", ""));
        assert_eq!(parse_url("abfs://c@acct.dfs.core.windows.net/p"), parts("c", "p"));
        assert_eq!(parse_url("https://acct.blob.core.windows.net/c/p/q"), parts("c", "p/q"));
        assert_eq!(parse_url("s3://b/p"), None);
        assert_eq!(parse_url("https://example.com/p"), None);
    }

    #[test]
    fn container_urls_are_made_as_object_store_makes_them() {
        let url = |builder: &MicrosoftAzureBuilder, store: &str, endpoint: Option<&str>, emulator| {
            let options = AzureOptions { endpoint_url: endpoint.map(str::to_string) };
            container_url(builder, store, "c", &options, emulator)
        };
        let bare = MicrosoftAzureBuilder::new();
        let named = MicrosoftAzureBuilder::new().with_account("acct");
        let pair = |a: &str, u: &str| Some((a.to_string(), u.to_string()));
        assert_eq!(url(&bare, "az://c/p", None, false), None);
        assert_eq!(url(&named, "az://c/p", None, false), pair("acct", "https://acct.blob.core.windows.net/c"));
        assert_eq!(
            url(&bare, "https://other.blob.core.windows.net/c/p", None, false),
            pair("other", "https://other.blob.core.windows.net/c")
        );
        assert_eq!(
            url(&bare, "az://c/p", Some("http://127.0.0.1:1/devstoreaccount1/"), true),
            pair("devstoreaccount1", "http://127.0.0.1:1/devstoreaccount1/c")
        );
        let endpoint = named.clone().with_endpoint("https://acct.blob.core.usgovcloudapi.net".into());
        assert_eq!(url(&endpoint, "az://c", None, false), pair("acct", "https://acct.blob.core.usgovcloudapi.net/c"));
    }
}
