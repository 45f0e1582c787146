//! Icechunk repositories (spec v1 and v2), as pure functions over the bytes of their files: which
//! snapshot a branch or tag names, the nodes of a snapshot (each group's and array's `zarr.json`,
//! an array's manifests), and a chunk's payload in a manifest (inline bytes, a range of a native
//! chunk object, or a virtual reference to a range of a file elsewhere). Parsing is the
//! `icechunk-format` crate's, Icechunk's own reader of its flatbuffers; this file adds the file
//! header and zstd frame every metadata file has, and the layout of the repository's objects.
//!
//! Layout: spec v2 keeps branches, tags and the snapshot list in one `repo` file; spec v1 keeps
//! each branch's tip in `refs/branch.NAME/ref.json` and each tag's in `refs/tag.NAME/ref.json`.
//! Both keep `snapshots/ID`, `manifests/ID` and `chunks/ID`, IDs in Crockford base32.

use std::io::Read;
use std::sync::Arc;

pub use icechunk_format::SnapshotId;
use icechunk_format::format_constants::{
    CompressionAlgorithmBin, FileTypeBin, ICECHUNK_FILE_HEADER_LEN, SpecVersionBin, parse_file_header,
};
use icechunk_format::manifest::{ChunkPayload, Manifest};
use icechunk_format::repo_info::RepoInfo;
use icechunk_format::snapshot::{NodeData, Snapshot};
use icechunk_format::{ChunkIndices, IcechunkFormatErrorKind, ManifestId, NodeId};

use super::foreign::caught;

pub use icechunk_format::manifest::{Checksum, ManifestExtents};

/// The file of a spec v2 repository's branches, tags and snapshots.
pub const REPO_FILE: &str = "repo";

/// The most a metadata file inflates to: a bigger one is refused, not held.
pub const MAX_INFLATED: u64 = 1 << 30;

/// Why a repository file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IcechunkError(pub String);

pub type Result<T> = std::result::Result<T, IcechunkError>;

fn bad(why: impl Into<String>) -> IcechunkError {
    IcechunkError(why.into())
}

/// Runs a parser of the `icechunk-format` crate, its panic an error of the file it was reading.
fn guarded<T>(what: &str, parse: impl FnOnce() -> Result<T>) -> Result<T> {
    caught(parse).unwrap_or_else(|| Err(bad(format!("{what}: the Icechunk reader failed on it"))))
}

/// The key of snapshot `id`'s file.
pub fn snapshot_key(id: &SnapshotId) -> String {
    format!("snapshots/{id}")
}

/// The key of manifest `id`'s file.
pub fn manifest_key(id: &ManifestId) -> String {
    format!("manifests/{id}")
}

/// The key of a spec v1 branch's or tag's reference file.
pub fn ref_key(version: &Version) -> Option<String> {
    match version {
        Version::Branch(name) => Some(format!("refs/branch.{name}/ref.json")),
        Version::Tag(name) => Some(format!("refs/tag.{name}/ref.json")),
        Version::Snapshot(_) => None,
    }
}

/// Which version of a repository is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    Branch(String),
    Tag(String),
    Snapshot(String),
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Version::Branch(name) => write!(f, "branch {name}"),
            Version::Tag(name) => write!(f, "tag {name}"),
            Version::Snapshot(id) => write!(f, "snapshot {id}"),
        }
    }
}

/// The body of a metadata file of type `kind`: its header checked, its zstd frame inflated.
pub fn body(bytes: &[u8], kind: FileTypeBin) -> Result<(SpecVersionBin, Vec<u8>)> {
    let head = bytes.get(..ICECHUNK_FILE_HEADER_LEN).ok_or_else(|| bad("shorter than an Icechunk file header"))?;
    let header = parse_file_header(head).map_err(|e| bad(format!("not an Icechunk file: {e}")))?;
    if header.file_type != kind {
        return Err(bad(format!("an Icechunk {:?} file, not a {kind:?} file", header.file_type)));
    }
    let rest = &bytes[ICECHUNK_FILE_HEADER_LEN..];
    let body = match header.compression {
        CompressionAlgorithmBin::None => rest.to_vec(),
        CompressionAlgorithmBin::Zstd => {
            let mut out = Vec::new();
            let decoder = zstd::stream::read::Decoder::new(rest).map_err(|e| bad(format!("zstd: {e}")))?;
            decoder.take(MAX_INFLATED + 1).read_to_end(&mut out).map_err(|e| bad(format!("zstd: {e}")))?;
            if out.len() as u64 > MAX_INFLATED {
                return Err(bad(format!("inflates to more than {MAX_INFLATED} bytes")));
            }
            out
        }
    };
    Ok((header.spec_version, body))
}

/// A snapshot ID as written (`ref.json`, `--snapshot`).
pub fn snapshot_id(text: &str) -> Result<SnapshotId> {
    SnapshotId::try_from(text).map_err(|e| bad(format!("{text:?} is not a snapshot ID: {e}")))
}

/// What a spec v2 `repo` file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refs {
    pub branches: Vec<(String, SnapshotId)>,
    pub tags: Vec<(String, SnapshotId)>,
}

impl Refs {
    /// The snapshot `version` names, or why none.
    pub fn resolve(&self, version: &Version) -> Result<SnapshotId> {
        let (list, name, what) = match version {
            Version::Branch(name) => (&self.branches, name, "branch"),
            Version::Tag(name) => (&self.tags, name, "tag"),
            Version::Snapshot(id) => return snapshot_id(id),
        };
        list.iter().find(|(n, _)| n == name).map(|(_, id)| id.clone()).ok_or_else(|| bad(format!("no {what} {name}")))
    }
}

/// The branches and tags of a spec v2 `repo` file.
pub fn repo_refs(bytes: &[u8]) -> Result<Refs> {
    let (_, body) = body(bytes, FileTypeBin::RepoInfo)?;
    guarded("repo", || {
        let info = RepoInfo::from_buffer(body).map_err(|e| bad(format!("not a readable repo file: {e}")))?;
        let named = |it: Vec<(&str, SnapshotId)>| it.into_iter().map(|(n, id)| (n.to_string(), id)).collect();
        let branches = info.branches().map_err(|e| bad(e.to_string()))?.collect();
        let tags = info.tags().map_err(|e| bad(e.to_string()))?.collect();
        Ok(Refs { branches: named(branches), tags: named(tags) })
    })
}

/// The snapshot a spec v1 `ref.json` names.
pub fn ref_json(bytes: &[u8]) -> Result<SnapshotId> {
    let doc: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    snapshot_id(doc.get("snapshot").and_then(|s| s.as_str()).ok_or_else(|| bad("no \"snapshot\""))?)
}

/// One node of a snapshot.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its path in the hierarchy, without the leading `/` (`""`: the root).
    pub path: String,
    /// Its `zarr.json`, as Zarr wrote it.
    pub zarr_json: Arc<[u8]>,
    /// An array's chunks; a group has none.
    pub array: Option<ArrayChunks>,
}

/// Where an array's chunk references are.
#[derive(Debug, Clone)]
pub struct ArrayChunks {
    pub node: NodeId,
    /// Chunks along each dimension.
    pub grid: Vec<u32>,
    /// The manifests holding its references, and the chunk coordinates each covers.
    pub manifests: Vec<(ManifestId, ManifestExtents)>,
}

/// The nodes of a snapshot file.
pub fn snapshot_nodes(bytes: &[u8]) -> Result<Vec<Node>> {
    let (spec, body) = body(bytes, FileTypeBin::Snapshot)?;
    guarded("snapshot", || {
        let snapshot = Snapshot::from_buffer(spec, body).map_err(|e| bad(format!("not a readable snapshot: {e}")))?;
        let mut nodes = Vec::new();
        for node in snapshot.iter() {
            let node = node.map_err(|e| bad(format!("a node that cannot be read: {e}")))?;
            let path = node.path.to_string().trim_start_matches('/').to_string();
            let array = match node.node_data {
                NodeData::Group => None,
                NodeData::Array { shape, manifests, .. } => Some(ArrayChunks {
                    node: node.id,
                    grid: shape.num_chunks().collect(),
                    manifests: manifests.into_iter().map(|m| (m.object_id, m.extents)).collect(),
                }),
            };
            nodes.push(Node { path, zarr_json: node.user_data.to_vec().into(), array });
        }
        Ok(nodes)
    })
}

/// A manifest file, parsed.
#[derive(Debug)]
pub struct ManifestFile(Arc<Manifest>);

/// Where a chunk's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Inline(Arc<[u8]>),
    /// `length` bytes from `offset` of the native chunk object `chunks/ID`.
    Native {
        key: String,
        offset: u64,
        length: u64,
    },
    /// `length` bytes from `offset` of the file at `url`, as it was when `checksum` was taken.
    Virtual {
        url: String,
        offset: u64,
        length: u64,
        checksum: Option<Checksum>,
    },
}

impl ManifestFile {
    pub fn parse(bytes: &[u8]) -> Result<ManifestFile> {
        let (_, body) = body(bytes, FileTypeBin::Manifest)?;
        guarded("manifest", || {
            Manifest::from_buffer(body)
                .map(|m| ManifestFile(Arc::new(m)))
                .map_err(|e| bad(format!("not a readable manifest: {e}")))
        })
    }

    /// The payload of chunk `coords` of array `node`; `None`: the manifest holds no such chunk.
    pub fn payload(&self, node: &NodeId, coords: &[u32]) -> Result<Option<Payload>> {
        guarded("manifest", || match self.0.get_chunk_payload(node, &ChunkIndices(coords.to_vec())) {
            Ok(payload) => Ok(Some(payload_of(payload)?)),
            Err(e) if matches!(e.kind(), IcechunkFormatErrorKind::ChunkCoordinatesNotFound { .. }) => Ok(None),
            Err(e) => Err(bad(format!("chunk {coords:?}: {e}"))),
        })
    }

    /// The coordinates of every chunk of array `node` it holds.
    pub fn chunks(&self, node: &NodeId) -> Result<Vec<Vec<u32>>> {
        guarded("manifest", || {
            let Ok(iter) = self.0.clone().iter(node.clone()) else { return Ok(Vec::new()) };
            iter.map(|found| found.map(|(coords, _)| coords.0).map_err(|e| bad(format!("a chunk reference: {e}"))))
                .collect()
        })
    }

    /// About how many bytes it holds in memory.
    pub fn size(&self) -> usize {
        self.0.bytes().len()
    }
}

fn payload_of(payload: ChunkPayload) -> Result<Payload> {
    Ok(match payload {
        ChunkPayload::Inline(bytes) => Payload::Inline(bytes.to_vec().into()),
        ChunkPayload::Ref(native) => {
            Payload::Native { key: format!("chunks/{}", native.id), offset: native.offset, length: native.length }
        }
        ChunkPayload::Virtual(virtual_ref) => Payload::Virtual {
            url: virtual_ref.location.url().to_string(),
            offset: virtual_ref.offset,
            length: virtual_ref.length,
            checksum: virtual_ref.checksum,
        },
        other => return Err(bad(format!("a chunk payload shardfs does not know: {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn repo(spec: u8) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/icechunk/spec{spec}"))
    }

    fn files(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect()
    }

    /// The test repositories: Python icechunk 2.3.0 wrote them (tests/data/icechunk/README.md).
    #[test]
    fn both_specs_name_their_versions_and_nodes() {
        let v2 = repo_refs(&std::fs::read(repo(2).join(REPO_FILE)).unwrap()).unwrap();
        assert_eq!(v2.branches.len(), 1);
        assert_eq!(v2.tags.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["v1.0"]);
        let v1 = ref_json(&std::fs::read(repo(1).join("refs/branch.main/ref.json")).unwrap()).unwrap();
        for (spec, tip) in [(1, v1), (2, v2.resolve(&Version::Branch("main".into())).unwrap())] {
            let nodes = snapshot_nodes(&std::fs::read(repo(spec).join(snapshot_key(&tip))).unwrap()).unwrap();
            let mut paths: Vec<&str> = nodes.iter().map(|n| n.path.as_str()).collect();
            paths.sort();
            assert_eq!(paths, ["", "grp", "grp/big", "sharded", "small", "virt"]);
            let small = nodes.iter().find(|n| n.path == "small").unwrap().array.clone().unwrap();
            let (id, _) = &small.manifests[0];
            let manifest = ManifestFile::parse(&std::fs::read(repo(spec).join(manifest_key(id))).unwrap()).unwrap();
            // The second commit wrote 42 over the first element of the inline chunk.
            let Some(Payload::Inline(bytes)) = manifest.payload(&small.node, &[0]).unwrap() else { panic!("inline") };
            assert!(!bytes.is_empty());
            assert_eq!(manifest.payload(&small.node, &[1]).unwrap(), None);
            assert_eq!(manifest.chunks(&small.node).unwrap(), vec![vec![0]]);
        }
    }

    /// Every file cut short or with a byte changed is an error or (where the change missed what
    /// is read) a value, never a panic.
    #[test]
    fn damaged_files_are_errors() {
        for spec in [1, 2] {
            let mut all = files(&repo(spec).join("snapshots"));
            all.extend(files(&repo(spec).join("manifests")));
            if spec == 2 {
                all.push(repo(2).join(REPO_FILE));
            }
            for path in all {
                let bytes = std::fs::read(&path).unwrap();
                let step = (bytes.len() / 40).max(1);
                let mut variants: Vec<Vec<u8>> = (0..bytes.len()).step_by(step).map(|n| bytes[..n].to_vec()).collect();
                for at in (0..bytes.len()).step_by(step) {
                    let mut flipped = bytes.clone();
                    flipped[at] ^= 0x5a;
                    variants.push(flipped);
                }
                for variant in variants {
                    let _ = snapshot_nodes(&variant);
                    let _ = repo_refs(&variant);
                    if let Ok(manifest) = ManifestFile::parse(&variant) {
                        for node in manifest.0.arrays().collect::<Vec<_>>() {
                            let _ = manifest.chunks(&node);
                            let _ = manifest.payload(&node, &[0, 0]);
                        }
                    }
                }
            }
        }
    }
}
