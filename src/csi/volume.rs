//! A NodePublishVolume request read into the `shardfs mount` it asks for: the store from the
//! volume's attributes, the mount capability's flags as `-o` options of `shardfs mount` (the
//! mount(8) helper's spellings, checked by the same parser the daemon will use), read-only from
//! the request or its access mode, and the secret's credentials as the daemon's environment.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::{Deserialize, Serialize};
use tonic::Status;

use super::proto::NodePublishVolumeRequest;
use super::proto::volume_capability::AccessType;
use super::proto::volume_capability::access_mode::Mode;
use crate::cli::{Cli, helper_form};

/// The attributes kubelet adds to a volume's own (`podInfoOnMount`, ephemeral volumes).
const KUBELET_ATTRIBUTES: &str = "csi.storage.k8s.io/";

/// What a publish mounts: two publishes of one target are the same when these are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub volume_id: String,
    /// A URL (`s3://bucket/prefix`) or a path on the node.
    pub store: String,
    pub read_only: bool,
    /// The `-o` options, as the mount capability gave them.
    pub flags: Vec<String>,
}

/// Credentials from the volume's secret, as environment variables of the mount daemon. Never
/// printed: `Debug` names the variables alone.
pub struct Secrets(Vec<(String, String)>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(name, _)| name)).finish()
    }
}

impl Secrets {
    pub fn variables(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(name, value)| (name.as_str(), value.as_str()))
    }
}

/// A publish request, checked.
#[derive(Debug)]
pub struct Publish {
    pub settings: Settings,
    pub target: PathBuf,
    pub secrets: Secrets,
}

impl Publish {
    /// Reads `request`; every error is InvalidArgument (or NotFound for a store path missing on
    /// the node), one line naming the volume and the cause.
    pub fn from_request(request: &NodePublishVolumeRequest) -> Result<Publish, Status> {
        let id = &request.volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("NodePublishVolume: no volume_id given"));
        }
        let invalid = |why: String| Status::invalid_argument(format!("volume {id}: {why}"));
        if request.target_path.is_empty() {
            return Err(invalid("no target_path given".into()));
        }
        let target = PathBuf::from(&request.target_path);
        if !target.is_absolute() {
            return Err(invalid(format!("target_path {} is not absolute", target.display())));
        }
        let Some(capability) = &request.volume_capability else {
            return Err(invalid("no volume_capability given".into()));
        };
        let flags = match &capability.access_type {
            Some(AccessType::Mount(mount)) => mount.mount_flags.iter().map(|f| option_of_flag(f)).collect(),
            Some(AccessType::Block(_)) => {
                return Err(invalid("a block volume was asked for; shardfs mounts a filesystem".into()));
            }
            None => return Err(invalid("the volume_capability has no access_type (mount)".into())),
        };
        let read_only_mode = capability.access_mode.is_some_and(|m| {
            matches!(Mode::try_from(m.mode), Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly))
        });
        let store = store_of(&request.volume_context).map_err(invalid)?;
        if !store.contains("://") && !Path::new(&store).exists() {
            return Err(Status::not_found(format!("volume {id}: store {store} does not exist on this node")));
        }
        let secrets = secrets_of(&request.secrets).map_err(invalid)?;
        let asked = Settings { volume_id: id.clone(), store, read_only: request.readonly || read_only_mode, flags };
        let settings = checked(asked, &target).map_err(invalid)?;
        Ok(Publish { settings, target, secrets })
    }
}

impl Settings {
    /// The arguments of `shardfs mount` for this volume at `target`, its log going to `log`.
    /// `allow_other`: the pod's processes are not the daemon's user.
    pub fn mount_arguments(&self, target: &Path, log: &Path) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["mount".into(), (&self.store).into(), target.into()];
        args.extend(["--log-file".into(), log.into(), "-o".into(), "allow_other".into()]);
        for flag in &self.flags {
            args.extend(["-o".into(), flag.into()]);
        }
        // Once: clap refuses a flag given twice, and the flags may hold `read-only` already.
        if self.read_only && !self.flags.iter().any(|f| f == "read-only" || f == "read_only") {
            args.push("--read-only".into());
        }
        args
    }
}

/// `settings` checked as the daemon will read them (the helper form's `-o` options become flags;
/// the rest must be FUSE options), with read-only set where the flags ask for it.
fn checked(settings: Settings, target: &Path) -> Result<Settings, String> {
    let args = settings.mount_arguments(target, Path::new("/dev/null"));
    let args = helper_form(std::iter::once(OsString::from("shardfs")).chain(args));
    let cli = Cli::try_parse_from(args).map_err(|e| {
        let text = e.to_string();
        let line = text.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string();
        format!("mount flags: {line}")
    })?;
    let Some(config) = cli.command.mount_config(0) else {
        return Err("mount flags: not a mount".into());
    };
    if config.foreground {
        return Err("mount flags: foreground is not for a volume (the driver runs the daemon)".into());
    }
    crate::fuse::check_options(&config.settings).map_err(|e| format!("mount flags: {e}"))?;
    Ok(Settings { read_only: config.settings.is_read_only(), ..settings })
}

/// A mount capability's flag as a `-o` option: PersistentVolume `mountOptions` are written as
/// mountpoint-s3's driver takes them (`zarr-format=2`, `--metadata-ttl=5000`, `region us-east-1`).
fn option_of_flag(flag: &str) -> String {
    let flag = flag.trim().trim_start_matches("--");
    match flag.split_once(char::is_whitespace) {
        Some((name, value)) if !name.contains('=') => format!("{name}={}", value.trim()),
        _ => flag.to_string(),
    }
}

/// The store a volume's attributes name; kubelet's own attributes are let through.
fn store_of(attributes: &std::collections::HashMap<String, String>) -> Result<String, String> {
    for (key, value) in attributes {
        if key == "csi.storage.k8s.io/ephemeral" && value == "true" {
            return Err("inline ephemeral volumes are not supported: use a PersistentVolume".into());
        }
        if key != "store" && !key.starts_with(KUBELET_ATTRIBUTES) {
            return Err(format!("unknown volume attribute {key:?} (the one known: store)"));
        }
    }
    let store = attributes.get("store").map(|s| s.trim()).unwrap_or_default();
    if store.is_empty() {
        return Err("no store in volumeAttributes (a URL like s3://bucket/data.zarr or a path on the node)".into());
    }
    if !store.contains("://") && !store.starts_with('/') {
        return Err(format!("store {store:?} is neither a URL nor an absolute path"));
    }
    Ok(store.to_string())
}

/// The environment variables a secret's keys name: the variables the object store clients read
/// (AWS_*, AZURE_*, GOOGLE_*), or mountpoint-s3's driver's names of the S3 keys. Nothing else
/// reaches the daemon's environment (no PATH, no LD_PRELOAD).
fn secrets_of(secrets: &std::collections::HashMap<String, String>) -> Result<Secrets, String> {
    let mut variables = Vec::new();
    for (key, value) in secrets {
        let name = match key.as_str() {
            "key_id" => "AWS_ACCESS_KEY_ID".to_string(),
            "access_key" => "AWS_SECRET_ACCESS_KEY".to_string(),
            "session_token" => "AWS_SESSION_TOKEN".to_string(),
            name if ["AWS_", "AZURE_", "GOOGLE_"].iter().any(|p| name.starts_with(p))
                && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
            {
                name.to_string()
            }
            _ => {
                return Err(format!(
                    "secret key {key:?} is not a credential variable (AWS_*, AZURE_*, GOOGLE_*, key_id, access_key, \
                     session_token)"
                ));
            }
        };
        variables.push((name, value.clone()));
    }
    variables.sort();
    Ok(Secrets(variables))
}

#[cfg(test)]
mod tests {
    use super::super::proto::VolumeCapability;
    use super::super::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};
    use super::*;

    fn request(flags: &[&str], attributes: &[(&str, &str)]) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: "v1".into(),
            target_path: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount".into(),
            volume_capability: Some(VolumeCapability {
                access_mode: Some(AccessMode { mode: Mode::MultiNodeMultiWriter as i32 }),
                access_type: Some(AccessType::Mount(MountVolume {
                    mount_flags: flags.iter().map(|f| f.to_string()).collect(),
                    ..Default::default()
                })),
            }),
            volume_context: attributes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        }
    }

    fn code_and_message(request: &NodePublishVolumeRequest) -> (tonic::Code, String) {
        let status = Publish::from_request(request).unwrap_err();
        (status.code(), status.message().to_string())
    }

    #[test]
    fn flags_become_mount_options_as_the_helper_reads_them() {
        let publish = Publish::from_request(&request(
            &["zarr-format=2", "--metadata-ttl=5000", "region us-east-1", "noatime"],
            &[("store", "s3://bucket/data.zarr"), ("csi.storage.k8s.io/pod.name", "worker-0")],
        ))
        .unwrap();
        assert_eq!(publish.settings.flags, ["zarr-format=2", "metadata-ttl=5000", "region=us-east-1", "noatime"]);
        assert!(!publish.settings.read_only);
        let args = publish.settings.mount_arguments(&publish.target, Path::new("/log"));
        let config = Cli::try_parse_from(helper_form(std::iter::once(OsString::from("shardfs")).chain(args)))
            .unwrap()
            .command
            .mount_config(0)
            .unwrap();
        assert_eq!(config.zarr_format, 2);
        assert_eq!(config.store.caching.metadata_ttl, std::time::Duration::from_millis(5000));
        assert_eq!(config.store.s3.region.as_deref(), Some("us-east-1"));
        assert_eq!(config.log_file, Some(PathBuf::from("/log")));
        assert!(!config.foreground);
        assert!(config.settings.options.contains(&"allow_other".to_string()));
    }

    #[test]
    fn a_volume_serves_its_metrics_where_its_flags_say() {
        let publish =
            Publish::from_request(&request(&["metrics-address=0.0.0.0:9464"], &[("store", "s3://b/p")])).unwrap();
        let args = publish.settings.mount_arguments(&publish.target, Path::new("/log"));
        let config = Cli::try_parse_from(helper_form(std::iter::once(OsString::from("shardfs")).chain(args)))
            .unwrap()
            .command
            .mount_config(0)
            .unwrap();
        assert_eq!(config.metrics_address.as_deref(), Some("0.0.0.0:9464"));
        let unflagged = Publish::from_request(&request(&[], &[("store", "s3://b/p")])).unwrap();
        let args = unflagged.settings.mount_arguments(&unflagged.target, Path::new("/log"));
        let config = Cli::try_parse_from(helper_form(std::iter::once(OsString::from("shardfs")).chain(args)))
            .unwrap()
            .command
            .mount_config(0)
            .unwrap();
        assert_eq!(config.metrics_address, None);
    }

    #[test]
    fn read_only_comes_from_the_request_the_access_mode_or_the_flags() {
        let store = [("store", "s3://b/p")];
        let mut readonly = request(&[], &store);
        readonly.readonly = true;
        assert!(Publish::from_request(&readonly).unwrap().settings.read_only);
        let mut reader = request(&[], &store);
        reader.volume_capability.as_mut().unwrap().access_mode =
            Some(AccessMode { mode: Mode::MultiNodeReaderOnly as i32 });
        assert!(Publish::from_request(&reader).unwrap().settings.read_only);
        assert!(Publish::from_request(&request(&["read-only"], &store)).unwrap().settings.read_only);
        assert!(Publish::from_request(&request(&["ro"], &store)).unwrap().settings.read_only);
    }

    #[test]
    fn bad_requests_are_invalid_arguments_naming_the_volume() {
        let store = [("store", "s3://b/p")];
        for (request, cause) in [
            (request(&["zarr-format=4"], &store), "mount flags"),
            (request(&["cache-size=lots"], &store), "lots"),
            (request(&["foreground"], &store), "foreground"),
            (request(&["no-such-option"], &store), "no-such-option"),
            (request(&[], &[]), "no store"),
            (request(&[], &[("store", "relative/path")]), "neither a URL"),
            (request(&[], &[("store", "s3://b/p"), ("bucket", "b")]), "unknown volume attribute \"bucket\""),
            (request(&[], &[("store", "s3://b/p"), ("csi.storage.k8s.io/ephemeral", "true")]), "ephemeral"),
        ] {
            let (code, message) = code_and_message(&request);
            assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
            assert!(message.starts_with("volume v1: ") && message.contains(cause), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        let mut block = request(&[], &store);
        block.volume_capability.as_mut().unwrap().access_type = Some(AccessType::Block(BlockVolume {}));
        assert!(code_and_message(&block).1.contains("block"));
        let mut relative = request(&[], &store);
        relative.target_path = "mnt".into();
        assert_eq!(code_and_message(&relative).0, tonic::Code::InvalidArgument);
        let (code, message) = code_and_message(&request(&[], &[("store", "/no/such/store.zarr")]));
        assert_eq!(code, tonic::Code::NotFound);
        assert!(message.contains("/no/such/store.zarr"), "{message}");
    }

    #[test]
    fn secrets_become_credential_variables_and_are_never_shown() {
        let mut with_secret = request(&[], &[("store", "s3://b/p")]);
        with_secret.secrets = [("key_id", "AKIA"), ("access_key", "hunter2"), ("AZURE_STORAGE_ACCOUNT_KEY", "k")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let publish = Publish::from_request(&with_secret).unwrap();
        let variables: Vec<_> = publish.secrets.variables().collect();
        assert_eq!(
            variables,
            [("AWS_ACCESS_KEY_ID", "AKIA"), ("AWS_SECRET_ACCESS_KEY", "hunter2"), ("AZURE_STORAGE_ACCOUNT_KEY", "k")]
        );
        let shown = format!("{publish:?}");
        assert!(!shown.contains("hunter2") && shown.contains("AWS_SECRET_ACCESS_KEY"), "{shown}");
        with_secret.secrets.insert("LD_PRELOAD".into(), "/tmp/evil.so".into());
        let (code, message) = code_and_message(&with_secret);
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(message.contains("LD_PRELOAD") && !message.contains("evil") && !message.contains("hunter2"));
    }
}
