//! The Node service: NodePublishVolume runs `shardfs mount` at the target path (this same
//! binary), NodeUnpublishVolume runs `shardfs unmount` there (which commits every pending write
//! first), both idempotent; NodeGetInfo names the node. Staging, stats and expansion are not
//! offered (no capability says them): a shardfs volume has no device to stage and no size.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::mounts::{self, Mounts};
use super::proto::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeStageVolumeRequest, NodeStageVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest, NodeUnstageVolumeResponse,
    node_server,
};
use super::volume::Publish;

pub struct Node {
    node_id: String,
    /// The shardfs binary the daemons run: the driver's own.
    exe: PathBuf,
    mounts: Arc<Mounts>,
}

impl Node {
    pub fn new(node_id: String, exe: PathBuf, mounts: Arc<Mounts>) -> Node {
        Node { node_id, exe, mounts }
    }

    fn publish(&self, publish: Publish) -> Result<(), Status> {
        let settings = &publish.settings;
        let id = &settings.volume_id;
        // Its directory made first, so that the target is named as the mount table will name it
        // from the first request on (links resolved).
        if let Some(parent) = publish.target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Status::internal(format!("volume {id}: cannot make {}: {e}", parent.display())))?;
        }
        let target = mounts::canonical(&publish.target);
        let shown = target.display();
        let _claim = self.mounts.claim(&target).ok_or_else(|| busy(id, &target))?;
        if let Some(mounted) = mounts::mounted(&target) {
            if serving(&target) {
                let same = match self.mounts.record(&target) {
                    Some(record) => record == *settings,
                    None => mounted.source == settings.store && mounted.read_only == settings.read_only,
                };
                if !same {
                    return Err(Status::already_exists(format!(
                        "volume {id}: {shown} is already published with other settings (store, flags or read-only)"
                    )));
                }
                log::info!("volume {id}: already published at {shown}");
                return Ok(());
            }
            log::warn!("volume {id}: the daemon of the mount at {shown} is gone: mounting again");
            detach(&target);
        }
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("volume {id}: cannot make the target {shown}: {e}")))?;
        let out = Command::new(&self.exe)
            .args(settings.mount_arguments(&target, &self.mounts.log_path(&target)))
            .envs(publish.secrets.variables())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| Status::internal(format!("volume {id}: cannot run {}: {e}", self.exe.display())))?;
        if !out.status.success() {
            return Err(Status::internal(format!(
                "volume {id}: mounting {} at {shown} failed: {}",
                settings.store,
                first_line(&out.stderr)
            )));
        }
        if let Err(e) = self.mounts.save(&target, settings) {
            let _ = self.unmount(id, &target);
            return Err(Status::internal(format!("volume {id}: cannot record the mount at {shown}: {e}")));
        }
        let mode = if settings.read_only { "read-only" } else { "writable" };
        log::info!("volume {id}: published {} at {shown}, {mode}", settings.store);
        Ok(())
    }

    fn unpublish(&self, id: &str, target: &Path) -> Result<(), Status> {
        let target = mounts::canonical(target);
        let shown = target.display();
        let _claim = self.mounts.claim(&target).ok_or_else(|| busy(id, &target))?;
        if let Some(record) = self.mounts.record(&target)
            && record.volume_id != id
        {
            return Err(Status::not_found(format!(
                "volume {id}: not published at {shown} (volume {} is)",
                record.volume_id
            )));
        }
        self.unmount(id, &target)?;
        self.mounts.forget(&target);
        // The spec has the plugin remove the target it made; a directory left holding files was
        // never the driver's to remove.
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("volume {id}: {shown}: cannot remove the target: {e}"),
        }
        log::info!("volume {id}: unpublished from {shown}");
        Ok(())
    }

    /// Unmounts every shardfs mount at `target` (one, unless others stacked some there), each
    /// through `shardfs unmount` so that pending writes are committed first; a mount whose daemon
    /// is gone has nothing pending and is detached.
    fn unmount(&self, id: &str, target: &Path) -> Result<(), Status> {
        let shown = target.display();
        while mounts::mounted(target).is_some() {
            if !serving(target) {
                log::warn!("volume {id}: the daemon of the mount at {shown} is gone: detaching it");
                detach(target);
                continue;
            }
            let out = Command::new(&self.exe)
                .arg("unmount")
                .arg(target)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| Status::internal(format!("volume {id}: cannot run {}: {e}", self.exe.display())))?;
            if !out.status.success() {
                return Err(Status::internal(format!(
                    "volume {id}: unmounting {shown} failed: {}",
                    first_line(&out.stderr)
                )));
            }
        }
        Ok(())
    }
}

fn busy(id: &str, target: &Path) -> Status {
    Status::aborted(format!("volume {id}: another request is working on {} now", target.display()))
}

/// False when the mount at `target` answers ENOTCONN: its daemon is gone.
fn serving(target: &Path) -> bool {
    std::fs::metadata(target).err().and_then(|e| e.raw_os_error()) != Some(libc::ENOTCONN)
}

/// Detaches the mount at `target` (MNT_DETACH): the kernel lets go of it once nothing uses it.
fn detach(target: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(target.as_os_str().as_bytes()) else { return };
    // SAFETY: a valid C string path.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        log::warn!("{}: cannot detach: {}", target.display(), std::io::Error::last_os_error());
    }
}

/// The first line of a command's error output, without the `shardfs: ` every error starts with.
fn first_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("no error message");
    line.trim().trim_start_matches("shardfs: ").to_string()
}

/// Runs blocking work (a mount or unmount command) off the runtime's threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, Status> + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(work).await.map_err(|e| Status::internal(format!("the request's task failed: {e}")))?
}

#[tonic::async_trait]
impl node_server::Node for Arc<Node> {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let publish = Publish::from_request(request.get_ref())?;
        let node = self.clone();
        blocking(move || node.publish(publish)).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let NodeUnpublishVolumeRequest { volume_id, target_path } = request.into_inner();
        if volume_id.is_empty() {
            return Err(Status::invalid_argument("NodeUnpublishVolume: no volume_id given"));
        }
        if target_path.is_empty() {
            return Err(Status::invalid_argument(format!("volume {volume_id}: no target_path given")));
        }
        let node = self.clone();
        blocking(move || node.unpublish(&volume_id, Path::new(&target_path))).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }

    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("NodeStageVolume: not offered (no STAGE_UNSTAGE_VOLUME capability)"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("NodeUnstageVolume: not offered (no STAGE_UNSTAGE_VOLUME capability)"))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("NodeGetVolumeStats: not offered (no GET_VOLUME_STATS capability)"))
    }

    async fn node_expand_volume(
        &self,
        _: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("NodeExpandVolume: not offered (no EXPAND_VOLUME capability)"))
    }
}
