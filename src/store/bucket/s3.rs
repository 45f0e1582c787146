//! `s3://BUCKET/PREFIX` URLs and the AWS settings, read as the AWS CLI reads them: flags first,
//! then the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
//! AWS_DEFAULT_REGION, AWS_ENDPOINT_URL, ...), then the profile (AWS_PROFILE, default `default`)
//! in ~/.aws/credentials and ~/.aws/config (static keys, region, endpoint_url), then what
//! object_store's chain reads from the environment (a web identity token: AWS_WEB_IDENTITY_TOKEN_FILE
//! with AWS_ROLE_ARN, as EKS service accounts set them, exchanged at STS, AWS_ENDPOINT_URL_STS
//! if set; the ECS task role, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI; EKS Pod Identity,
//! AWS_CONTAINER_CREDENTIALS_FULL_URI with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE), and last the
//! instance metadata service, unless AWS_EC2_METADATA_DISABLED is `true`. An `http://` endpoint
//! (a local S3-compatible server) is allowed as it is; requests are path-style, which every
//! S3-compatible service accepts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsCredential};
use object_store::{ClientConfigKey, CredentialProvider};

use super::multipart::Multipart;
use super::server_clock::{DatedConnector, ServerClock};
use super::{BucketStore, Caching};

/// Settings given on the command line.
#[derive(Clone, Debug, Default)]
pub struct S3Options {
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    /// Send unsigned requests (public buckets).
    pub no_sign_request: bool,
}

/// The bucket and prefix of an `s3://` URL; `None` when `url` is not one.
pub fn parse_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    (!bucket.is_empty()).then_some((bucket, prefix.trim_matches('/')))
}

/// Where an `s3://` URL is and how to reach it, resolved from the flags, the environment and the
/// profile as the AWS CLI resolves them; for the stores opened here and for Icechunk's writer.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub bucket: String,
    pub prefix: String,
    pub region: String,
    pub endpoint: Option<String>,
    /// Static keys from the environment or the profile (id, secret, session token); `None`:
    /// whatever else the environment offers (a web identity token, a container's role, instance
    /// metadata).
    pub keys: Option<(String, String, Option<String>)>,
    pub anonymous: bool,
    /// A provider of temporary credentials is named in the environment (a web identity token and
    /// a role, or a container credentials URI): object_store's chain asks it before instance
    /// metadata.
    pub provided: bool,
    /// AWS_EC2_METADATA_DISABLED is `true`: the instance metadata service is never asked.
    pub metadata_disabled: bool,
}

/// The settings for `url` (`s3://BUCKET/PREFIX`); the error is one line naming the URL.
pub fn resolve(url: &str, options: &S3Options) -> Result<Resolved, String> {
    let (bucket, prefix) = parse_url(url).ok_or_else(|| format!("{url}: not an s3://BUCKET/PREFIX URL"))?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let profile = Profile::read(&env("AWS_PROFILE").unwrap_or_else(|| "default".into()));
    let keys = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => Some((id, secret, env("AWS_SESSION_TOKEN"))),
        (Some(_), None) => None,
        (None, _) => match (profile.get("aws_access_key_id"), profile.get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => Some((id.clone(), secret.clone(), profile.get("aws_session_token").cloned())),
            _ => None,
        },
    };
    let region = options.region.clone().or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION"));
    let region = region.or_else(|| profile.get("region").cloned()).unwrap_or_else(|| "us-east-1".into());
    let endpoint =
        options.endpoint_url.clone().or_else(|| env("AWS_ENDPOINT_URL_S3")).or_else(|| env("AWS_ENDPOINT_URL"));
    let endpoint = endpoint.or_else(|| profile.get("endpoint_url").cloned());
    let provided = (env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && env("AWS_ROLE_ARN").is_some())
        || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || (env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
            && env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").is_some());
    // As the AWS CLI reads it: `true` in any case disables, anything else does not.
    let metadata_disabled = env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    Ok(Resolved {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        region,
        endpoint,
        keys,
        anonymous: options.no_sign_request,
        provided,
        metadata_disabled,
    })
}

/// Opens the store at `url` (`s3://BUCKET/PREFIX`); the error is one line naming the URL.
pub fn open(url: &str, options: &S3Options, caching: Caching) -> Result<BucketStore, String> {
    let resolved = resolve(url, options)?;
    let (bucket, prefix) = (resolved.bucket.as_str(), resolved.prefix.as_str());
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some((id, secret, token)) = &resolved.keys {
        builder = builder.with_access_key_id(id).with_secret_access_key(secret);
        if let Some(token) = token {
            builder = builder.with_token(token);
        }
    }
    // object_store's chain would end at instance metadata whatever the variable says: a request
    // to 169.254.169.254 that a pod or a laptop should not make, and that costs a timeout where
    // nothing answers.
    let no_credentials = resolved.keys.is_none() && !resolved.provided && !options.no_sign_request;
    if no_credentials && resolved.metadata_disabled {
        builder = builder.with_credentials(Arc::new(MetadataDisabled));
    }
    builder = builder.with_region(&resolved.region);
    let endpoint = resolved.endpoint.clone();
    // Two servers may hold buckets of one name: the disk cache tells them apart.
    let mut caching = caching;
    if let Some(disk) = caching.disk.as_mut() {
        disk.server = endpoint.clone().unwrap_or_else(|| "aws".into());
    }
    if let Some(endpoint) = endpoint {
        // Set both: from_env may have read AWS_ENDPOINT_URL_S3, which would win over the flag.
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_config(AmazonS3ConfigKey::S3Endpoint, &endpoint)
            .with_endpoint(endpoint);
    }
    if options.no_sign_request {
        builder = builder.with_skip_signature(true);
    }
    builder = builder.with_unsigned_payload(!signs_payload(resolved.endpoint.as_deref()));
    let bucket_url = bucket_url(&builder, bucket);
    let region = builder.get_config_value(&AmazonS3ConfigKey::Region).unwrap_or_default();
    let clock = Arc::new(ServerClock::default());
    let objects = builder
        .with_http_connector(DatedConnector { clock: clock.clone(), bucket: bucket.to_string() })
        .with_retry(super::retry())
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "30s")
        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), "5s")
        .build()
        .map_err(|e| format!("{url}: {}", super::one_line(&e)))?;
    let objects = Arc::new(objects);
    let multipart = Multipart::new(objects.clone(), bucket, &bucket_url, &region, !options.no_sign_request)
        .map_err(|e| format!("{url}: {e}"))?;
    let store_url = format!("s3://{bucket}{}{prefix}", if prefix.is_empty() { "" } else { "/" });
    let store = BucketStore::new(objects, prefix, &store_url, caching).map_err(|e| format!("{url}: {e}"))?;
    let store = store.with_multipart(multipart).with_server_clock(clock);
    store.check_bucket().map_err(|e| match (no_credentials, resolved.metadata_disabled) {
        (false, _) => format!("{store_url}: {e}"),
        (true, true) => format!(
            "{store_url}: no AWS credentials (none in AWS_ACCESS_KEY_ID, the profile, a web identity token or a \
             container's role, and instance metadata is not asked: AWS_EC2_METADATA_DISABLED=true); for a public \
             bucket use --no-sign-request"
        ),
        (true, false) => format!(
            "{store_url}: no AWS credentials (none in AWS_ACCESS_KEY_ID, the profile, a web identity token or a \
             container's role, and instance metadata failed: {e}); for a public bucket use --no-sign-request"
        ),
    })?;
    Ok(store)
}

/// The credentials of a store with none anywhere and instance metadata disabled: every request
/// fails before it is sent.
#[derive(Debug)]
struct MetadataDisabled;

#[async_trait]
impl CredentialProvider for MetadataDisabled {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        Err(object_store::Error::Generic {
            store: "S3",
            source: "no credentials, and instance metadata is disabled (AWS_EC2_METADATA_DISABLED=true)".into(),
        })
    }
}

/// Whether a request's signature covers its body (SigV4's SHA-256 of the payload): only over plain
/// HTTP, where nothing else would catch a body changed on the way. Over HTTPS, TLS authenticates
/// every byte already, and the body goes as `UNSIGNED-PAYLOAD`, as the AWS CLI and mountpoint-s3
/// send it: hashing it was a quarter of the daemon's CPU writing to S3.
fn signs_payload(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|endpoint| endpoint.starts_with("http://"))
}

/// The URL of `bucket` as object_store's requests name it: path-style below the endpoint (AWS's
/// regional one when none is set), or the endpoint itself for virtual-hosted requests.
fn bucket_url(builder: &AmazonS3Builder, bucket: &str) -> String {
    let setting = |key| builder.get_config_value(&key).filter(|v| !v.is_empty());
    let region = setting(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
    let virtual_hosted = setting(AmazonS3ConfigKey::VirtualHostedStyleRequest).is_some_and(|v| v == "true");
    match (setting(AmazonS3ConfigKey::Endpoint), virtual_hosted) {
        (Some(endpoint), true) => endpoint,
        (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
        (endpoint, false) => {
            let endpoint = endpoint.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
            format!("{}/{bucket}", endpoint.trim_end_matches('/'))
        }
    }
}

/// The settings of one profile from the shared credentials and config files.
#[derive(Debug, Default)]
struct Profile(HashMap<String, String>);

impl Profile {
    fn read(name: &str) -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        let file =
            |var: &str, default: &str| std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| home.join(default));
        let mut settings = HashMap::new();
        // The config file names profiles `[profile NAME]` (but `[default]`); credentials `[NAME]`.
        let config_section = if name == "default" { name.to_string() } else { format!("profile {name}") };
        for (path, section) in [
            (file("AWS_CONFIG_FILE", ".aws/config"), config_section),
            (file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), name.to_string()),
        ] {
            if let Ok(text) = std::fs::read_to_string(&path) {
                settings.extend(section_of(&text, &section));
            }
        }
        Profile(settings)
    }

    fn get(&self, key: &str) -> Option<&String> {
        self.0.get(key)
    }
}

/// The `key = value` lines of `[section]` in an INI file.
fn section_of(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
        } else if inside
            && let Some((key, value)) = line.split_once('=')
            && !line.starts_with(['#', ';'])
        {
            found.push((key.trim().to_lowercase(), value.trim().to_string()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        assert_eq!(parse_url("s3://b/a/c/"), Some(("b", "a/c")));
        assert_eq!(parse_url("s3://b"), Some(("b", "")));
        assert_eq!(parse_url("s3://"), None);
        assert_eq!(parse_url("/data/x"), None);
    }

    #[test]
    fn bodies_are_signed_only_where_no_tls_protects_them() {
        assert!(signs_payload(Some("http://127.0.0.1:9000")));
        assert!(!signs_payload(Some("https://minio.example.org")));
        assert!(!signs_payload(None), "AWS itself is reached over HTTPS");
    }

    #[test]
    fn profiles_are_read_from_their_section() {
        let text = "[default]\nregion = eu-west-1\n[profile other]\nregion=us-west-2\n# aws_access_key_id = no\n";
        assert_eq!(section_of(text, "profile other"), [("region".to_string(), "us-west-2".to_string())]);
        assert_eq!(section_of(text, "default"), [("region".to_string(), "eu-west-1".to_string())]);
    }
}
