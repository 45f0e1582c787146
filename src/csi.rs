//! `shardfs csi`: a Kubernetes CSI node plugin. It serves the CSI spec's Identity and Node
//! services (gRPC over a unix socket, as the kubelet and the node-driver-registrar sidecar speak
//! it) and publishes a statically provisioned volume by running `shardfs mount` at the pod's
//! target path, so that the daemons run on the node and the pods need no privilege.
//!
//! - [`proto`]: the spec's messages and services, generated from its own `proto/csi.proto`.
//! - [`identity`]: the driver's name, version and readiness.
//! - [`node`]: publish and unpublish, in CSI's error codes.
//! - [`volume`]: a publish request read into the `shardfs mount` it asks for.
//! - [`mounts`]: the mounts the driver made, found again from the kernel's mount table and the
//!   records it keeps, so that a restarted driver neither loses nor duplicates them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod identity;
pub mod mounts;
pub mod node;
pub mod proto;
pub mod volume;

use crate::logging::{self, LogTarget};

/// The driver's name: the `driver` of a PersistentVolume's `csi` source, the CSIDriver object's
/// name and the registrar's plugin directory. A domain of the project's, as the spec asks.
pub const DRIVER_NAME: &str = "shardfs.csi.zarr.dev";

/// Everything `shardfs csi` needs, already parsed.
#[derive(Debug, Clone)]
pub struct CsiConfig {
    /// `--endpoint`: `unix:///PATH` (or a plain path), the socket the sidecars and kubelet dial.
    pub endpoint: String,
    /// `--node-id`: the node's name, as NodeGetInfo reports it.
    pub node_id: String,
    /// `--state-dir`: the records of published volumes and the daemons' logs.
    pub state_dir: Option<PathBuf>,
    pub verbosity: u8,
}

/// The socket path of an endpoint: `unix:///PATH`, `unix:/PATH` or `/PATH`.
fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint.strip_prefix("unix://").or_else(|| endpoint.strip_prefix("unix:")).unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(format!("--endpoint {endpoint}: not a unix socket (unix:///PATH/csi.sock)"));
    }
    Ok(PathBuf::from(path))
}

/// A socket left by a driver that stopped: binding over it would fail. Nothing else is removed.
fn remove_stale_socket(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| format!("{}: cannot remove the old socket: {e}", path.display()))
        }
        Ok(_) => Err(format!("{}: exists and is not a socket", path.display())),
        Err(_) => Ok(()),
    }
}

/// `shardfs csi`: serves until killed. The mounts it made outlive it (each daemon is a session of
/// its own), and a driver started again finds them.
pub fn run(config: &CsiConfig) -> Result<(), String> {
    logging::init(&LogTarget::Stderr, config.verbosity.max(1))?;
    let socket = socket_path(&config.endpoint)?;
    let state_dir = match &config.state_dir {
        Some(dir) => dir.clone(),
        None => socket.parent().unwrap_or(Path::new("/")).join("volumes"),
    };
    let mounts = Arc::new(mounts::Mounts::open(&state_dir)?);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the shardfs binary: {e}"))?;
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    remove_stale_socket(&socket)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the gRPC runtime: {e}"))?;
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
        log::info!("{DRIVER_NAME} on node {}: serving {}", config.node_id, socket.display());
        tonic::transport::Server::builder()
            .add_service(proto::identity_server::IdentityServer::new(identity::Identity))
            .add_service(proto::node_server::NodeServer::new(Arc::new(node::Node::new(
                config.node_id.clone(),
                exe,
                mounts,
            ))))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .map_err(|e| format!("{}: {e}", socket.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(socket_path("unix:///csi/csi.sock"), Ok(PathBuf::from("/csi/csi.sock")));
        assert_eq!(socket_path("unix:/csi/csi.sock"), Ok(PathBuf::from("/csi/csi.sock")));
        assert_eq!(socket_path("/csi/csi.sock"), Ok(PathBuf::from("/csi/csi.sock")));
        assert!(socket_path("tcp://127.0.0.1:10000").is_err());
        assert!(socket_path("unix://relative.sock").is_err());
    }

    #[test]
    fn the_driver_name_is_one_the_spec_allows() {
        // GetPluginInfo: at most 63 characters, alphanumerics, '-', '.' and '_', starting and
        // ending with a letter or digit.
        assert!(DRIVER_NAME.len() <= 63);
        assert!(DRIVER_NAME.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)));
        assert!(DRIVER_NAME.starts_with(|c: char| c.is_ascii_alphanumeric()));
        assert!(DRIVER_NAME.ends_with(|c: char| c.is_ascii_alphanumeric()));
    }
}
