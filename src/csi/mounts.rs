//! The mounts the driver made, found again after it restarts: the kernel's mount table
//! (`/proc/self/mountinfo`, a FUSE mount at the target) says what is mounted, and a
//! record per target in the state directory says which volume and settings it was published
//! with (no secrets: those live in the daemon's environment alone). One request at a time works
//! on a target.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use sha2::Digest;

use super::volume::Settings;

/// The filesystem types a shardfs mount shows in the mount table: `fuse` where root mounted it
/// directly (the kernel is told no subtype then), `fuse.shardfs` through fusermount3.
const FS_TYPES: [&str; 2] = ["fuse", "fuse.shardfs"];

pub struct Mounts {
    dir: PathBuf,
    busy: Mutex<HashSet<PathBuf>>,
}

/// A target claimed by a request until this is dropped.
pub struct Claim<'a> {
    mounts: &'a Mounts,
    target: PathBuf,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.mounts.busy.lock().remove(&self.target);
    }
}

/// A FUSE mount the mount table shows at a target: shardfs's, where the driver's record says so
/// or its source is the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    /// The mount's source: the store, as `shardfs mount` names it (`fsname=`).
    pub source: String,
    pub read_only: bool,
}

impl Mounts {
    /// The records in `dir` (made if missing), each logged with whether it is still mounted.
    pub fn open(dir: &Path) -> Result<Mounts, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: cannot make the state directory: {e}", dir.display()))?;
        let mounts = Mounts { dir: dir.to_path_buf(), busy: Mutex::new(HashSet::new()) };
        for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
            let Some((target, settings)) = read_record(&entry.path()) else { continue };
            let state = if mounted(&target).is_some() { "mounted" } else { "not mounted" };
            log::info!("volume {}: published before at {} ({state})", settings.volume_id, target.display());
        }
        Ok(mounts)
    }

    /// `target` for this request alone, or `None` while another request works on it.
    pub fn claim(&self, target: &Path) -> Option<Claim<'_>> {
        self.busy.lock().insert(target.to_path_buf()).then(|| Claim { mounts: self, target: target.to_path_buf() })
    }

    fn record_path(&self, target: &Path) -> PathBuf {
        self.dir.join(format!("{}.json", name_of(target)))
    }

    /// The mount daemon's log of the volume at `target`.
    pub fn log_path(&self, target: &Path) -> PathBuf {
        self.dir.join(format!("{}.log", name_of(target)))
    }

    /// The settings `target` was published with, if the driver published it.
    pub fn record(&self, target: &Path) -> Option<Settings> {
        read_record(&self.record_path(target)).map(|(_, settings)| settings)
    }

    /// Records `settings` as published at `target`: written whole, then renamed into place.
    pub fn save(&self, target: &Path, settings: &Settings) -> std::io::Result<()> {
        let record = Record { target: target.to_path_buf(), settings: settings.clone() };
        let path = self.record_path(target);
        let temporary = path.with_extension("tmp");
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temporary)?;
        file.write_all(&serde_json::to_vec(&record).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    }

    /// Forgets `target`'s record and its daemon's log.
    pub fn forget(&self, target: &Path) {
        for path in [self.record_path(target), self.log_path(target)] {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                log::warn!("{}: cannot remove: {e}", path.display());
            }
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    target: PathBuf,
    #[serde(flatten)]
    settings: Settings,
}

fn read_record(path: &Path) -> Option<(PathBuf, Settings)> {
    if path.extension().is_none_or(|e| e != "json") {
        return None;
    }
    let record: Record = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some((record.target, record.settings))
}

/// A file name for `target`: kubelet's target paths are long and nested.
fn name_of(target: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let digest = sha2::Sha256::digest(target.as_os_str().as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// `target` as the mount table shows it: its directory's links resolved. The target itself is
/// not resolved: a mount whose daemon is gone cannot even be looked at.
pub fn canonical(target: &Path) -> PathBuf {
    match (target.parent().and_then(|p| std::fs::canonicalize(p).ok()), target.file_name()) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => target.to_path_buf(),
    }
}

/// The FUSE mount at `target`, the topmost where several are stacked.
pub fn mounted(target: &Path) -> Option<Mounted> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fuse_mount_at(&table, target)
}

/// [`mounted`] in the text of a mountinfo file.
fn fuse_mount_at(table: &str, target: &Path) -> Option<Mounted> {
    let mut found = None;
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(separator) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(point), Some(options), Some(kind), Some(source)) =
            (fields.get(4), fields.get(5), fields.get(separator + 1), fields.get(separator + 2))
        else {
            continue;
        };
        if FS_TYPES.contains(kind) && Path::new(&unescape(point)) == target {
            let read_only = options.split(',').any(|o| o == "ro");
            found = Some(Mounted { source: unescape(source), read_only });
        }
    }
    found
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], digits) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8).wrapping_add(b - b'0')));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:50 / /var/lib/kubelet/pods/a/volumes/kubernetes.io~csi/pv\\0401/mount rw,nosuid,nodev,relatime shared:40 - fuse.shardfs s3://bucket/data\\040set.zarr rw,user_id=0,group_id=0,allow_other
91 22 0:51 / /mnt/other rw,relatime shared:41 - fuse.sshfs host:/x rw,user_id=0
92 22 0:52 / /mnt/ro ro,relatime shared:42 - fuse /data/store.zarr ro,user_id=0,group_id=0,default_permissions";

    #[test]
    fn the_mount_table_names_shardfs_mounts_at_targets() {
        let target = Path::new("/var/lib/kubelet/pods/a/volumes/kubernetes.io~csi/pv 1/mount");
        assert_eq!(
            fuse_mount_at(TABLE, target),
            Some(Mounted { source: "s3://bucket/data set.zarr".into(), read_only: false })
        );
        assert_eq!(
            fuse_mount_at(TABLE, Path::new("/mnt/ro")),
            Some(Mounted { source: "/data/store.zarr".into(), read_only: true })
        );
        assert_eq!(fuse_mount_at(TABLE, Path::new("/mnt/other")), None, "not a shardfs mount");
        assert_eq!(fuse_mount_at(TABLE, Path::new("/mnt")), None);
    }

    #[test]
    fn records_outlive_the_driver_and_hold_no_secrets() {
        let dir = std::env::temp_dir().join(format!("shardfs-csi-records-{}", std::process::id()));
        let target = Path::new("/var/lib/kubelet/pods/a/volumes/kubernetes.io~csi/pv/mount");
        let settings = Settings {
            volume_id: "v1".into(),
            store: "s3://b/p".into(),
            read_only: true,
            flags: vec!["zarr-format=2".into()],
        };
        let mounts = Mounts::open(&dir).unwrap();
        assert_eq!(mounts.record(target), None);
        mounts.save(target, &settings).unwrap();
        let again = Mounts::open(&dir).unwrap();
        assert_eq!(again.record(target), Some(settings));
        again.forget(target);
        assert_eq!(again.record(target), None);
        {
            let _first = again.claim(target).unwrap();
            assert!(again.claim(target).is_none(), "one request at a time");
        }
        assert!(again.claim(target).is_some(), "released when the request ends");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
