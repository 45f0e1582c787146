//! Requests to the object store, never trusted as they come. Networks and servers stall, reset
//! connections mid-body, answer 503 SlowDown, and proxies rewrite what passes; a FUSE reader
//! waits on each request, and a wrong byte served or committed is never acceptable. So:
//!
//! - every GET (ranged or whole) names the version it means with If-Match, and its reply must
//!   carry that version's ETag and be exactly as long as asked (a range) or as that version is
//!   (a whole object); anything else is tried again, then an error, never served;
//! - reads and HEADs get a time limit: a few seconds to the first byte plus time for the body at
//!   a slow rate, so that a stalled request is dropped and tried again long before a reader gives
//!   up, instead of holding its FUSE thread for the client's whole timeout;
//! - a conditional PUT whose answer was lost (its retry then meets the object it wrote itself,
//!   412) counts as done when the object holds exactly the bytes written: same size and an ETag
//!   that is their MD5 (S3's and GCS's ETag of a simple object; Azure's ETags never are), or, for
//!   small objects, the same bytes read back; a larger object whose ETag is no MD5 is not taken
//!   for the write (the commit then fails as changed, and is retried or reported, never lost).
//!
//! object_store retries 5xx and failed connections itself, with backoff; the tries here come on
//! top, for what it cannot see (a reply of the wrong length or version, a stall).

use std::future::Future;
use std::io;
use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use md5::{Digest, Md5};
use object_store::path::Path;
use object_store::{
    Attributes, GetOptions, GetRange, GetResult, ListResult, ObjectMeta, ObjectStore, ObjectStoreExt, PutOptions,
    PutPayload, PutResult,
};
use parking_lot::Mutex;

use super::fetch::ByteStream;
use super::metadata::{Head, bare_e_tag, modified_of, version_of};
use super::{BucketStore, TRIES, head_of, one_line};
use crate::store::{Error, Result, Store};

/// How long a read may wait for its first byte before it is dropped and tried again.
const FIRST_BYTE: Duration = Duration::from_secs(3);
/// The slowest body a read accepts: this long per MiB beyond the first byte.
const PER_MIB: Duration = Duration::from_millis(250);
/// How long a listing may take.
const LISTING: Duration = Duration::from_secs(10);
/// An object at most this large whose ETag is not the MD5 of its bytes is read back to tell
/// whether it holds what a lost PUT wrote.
const READ_BACK: u64 = 8 << 20;

/// How one try of a request ended, when not well.
enum Failed {
    /// The answer stands (no such object, another version, refused): trying again cannot help.
    Final(Error),
    /// A fault on the way (a stall, a reset, a reply of the wrong version or length).
    Again(Error),
}

/// How long a read of `len` bytes may take.
fn limit(len: u64) -> Duration {
    FIRST_BYTE + PER_MIB.mul_f64(len as f64 / (1 << 20) as f64)
}

/// The hex MD5 of `pieces` back to back.
pub(super) fn md5_hex(pieces: &[&[u8]]) -> String {
    let mut hasher = Md5::new();
    for piece in pieces {
        hasher.update(piece);
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// True when object_store's error is the server's answer rather than a fault on the way.
pub(super) fn is_answer(e: &object_store::Error) -> bool {
    use object_store::Error::*;
    matches!(
        e,
        NotFound { .. }
            | Precondition { .. }
            | AlreadyExists { .. }
            | PermissionDenied { .. }
            | Unauthenticated { .. }
            | NotSupported { .. }
            | NotImplemented { .. }
            | InvalidPath { .. }
            | NotModified { .. }
    )
}

/// True when the server answered 416 (Range Not Satisfiable). object_store keeps the status in
/// an error type of its own it does not export: the error's sources are read for it.
fn is_unsatisfiable(e: &object_store::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(e) = source {
        if e.to_string().contains("status code: 416") {
            return true;
        }
        source = e.source();
    }
    false
}

impl BucketStore {
    fn timed_out(&self, key: &str, after: Duration) -> Error {
        let why = format!("no answer within {:.1} s", after.as_secs_f64());
        Error::Io { place: self.describe(key), source: io::Error::new(io::ErrorKind::TimedOut, why) }
    }

    /// Runs the request `make` makes, each try within `within`, up to [`TRIES`] times while it
    /// fails in a way another try may mend; the last failure is the error.
    fn tried<T, F: Future<Output = std::result::Result<T, Failed>>>(
        &self,
        key: &str,
        within: Duration,
        make: impl FnMut() -> F,
    ) -> Result<T> {
        self.block_on(self.tried_async(key, within, make))
    }

    /// [`BucketStore::tried`] on the runtime.
    async fn tried_async<T, F: Future<Output = std::result::Result<T, Failed>>>(
        &self,
        key: &str,
        within: Duration,
        mut make: impl FnMut() -> F,
    ) -> Result<T> {
        let mut last = None;
        for attempt in 1..=TRIES as u32 {
            if attempt > 1 {
                tokio::time::sleep(crate::store::backoff(attempt - 1)).await;
            }
            match tokio::time::timeout(within, make()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(Failed::Final(e))) => return Err(e),
                Ok(Err(Failed::Again(e))) => last = Some(e),
                Err(_) => last = Some(self.timed_out(key, within)),
            }
            log::debug!("try {attempt} of {TRIES}: {}", last.as_ref().expect("a failure"));
        }
        Err(last.expect("at least one try"))
    }

    /// The failure of one try, from object_store's error about `key`.
    fn failed(&self, key: &str, e: object_store::Error) -> Failed {
        if is_answer(&e) { Failed::Final(self.error(key, e)) } else { Failed::Again(self.error(key, e)) }
    }

    /// [`BucketStore::get_verified_async`] from a thread outside the runtime, counted among the
    /// GETs in flight.
    pub(super) fn get_verified(&self, key: &str, e_tag: &str, range: Option<Range<u64>>, len: u64) -> Result<Bytes> {
        self.block_on(async {
            let _permit = self.0.fetcher.permit().await;
            self.get_verified_async(key, e_tag, range, len).await
        })
    }

    /// The bytes of version `e_tag` of `key`: `range`, or the whole object when `None`, which
    /// must then be `len` bytes long (as that version's HEAD or listing says).
    pub(super) async fn get_verified_async(
        &self,
        key: &str,
        e_tag: &str,
        range: Option<Range<u64>>,
        len: u64,
    ) -> Result<Bytes> {
        let other = Mutex::new(None);
        self.tried_async(key, limit(len), || async {
            let bytes = self.get_of_version(key, e_tag, range.clone(), &other).await?.bytes().await;
            let bytes = bytes.map_err(|e| self.failed(key, e))?;
            if bytes.len() as u64 != len {
                let wrong = format!("the server sent {} bytes where {len} were due", bytes.len());
                let source = io::Error::new(io::ErrorKind::InvalidData, wrong);
                return Err(Failed::Again(Error::Io { place: self.describe(key), source }));
            }
            Ok(bytes)
        })
        .await
    }

    /// The bytes `range` of version `e_tag` of `key` as they arrive, once the reply's headers
    /// named that version and range: the reader counts them (a reply cut short or running long
    /// is its to tell) and times the gaps between them.
    pub(super) async fn stream_verified_async(&self, key: &str, e_tag: &str, range: Range<u64>) -> Result<ByteStream> {
        let other = Mutex::new(None);
        let reply =
            self.tried_async(key, FIRST_BYTE, || self.get_of_version(key, e_tag, Some(range.clone()), &other)).await?;
        let (store, key) = (self.clone(), key.to_string());
        Ok(reply.into_stream().map(move |piece| piece.map_err(|e| store.error(&key, e))).boxed())
    }

    /// The bytes `range` of `key`, whatever version is there, as they arrive: for objects that
    /// never change once written (an Icechunk repository's chunk objects, named by ID), read with
    /// no question of which version is there. An object that is not there is EIO: something
    /// that names it says it is.
    pub(super) async fn stream_range_async(&self, key: &str, range: Range<u64>) -> Result<ByteStream> {
        let reply = self
            .tried_async(key, FIRST_BYTE, || async {
                let options = GetOptions { range: Some(GetRange::Bounded(range.clone())), ..Default::default() };
                self.0.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match self.0.objects.get_opts(&self.path(key), options).await {
                    Ok(reply) => Ok(reply),
                    Err(object_store::Error::NotFound { .. }) => Err(Failed::Final(Error::Io {
                        place: self.describe(key),
                        source: io::Error::other("not there, though it is named as a file that never changes"),
                    })),
                    Err(e) => Err(self.failed(key, e)),
                }
            })
            .await?;
        let (store, key) = (self.clone(), key.to_string());
        Ok(reply.into_stream().map(move |piece| piece.map_err(|e| store.error(&key, e))).boxed())
    }

    /// The whole of `key`, whatever version is there, with no question of which ([`crate::store::Store::read_written_once`]).
    pub(super) fn read_any_version(&self, key: &str) -> Result<Vec<u8>> {
        self.tried(key, FIRST_BYTE, || async {
            self.0.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match self.0.objects.get(&self.path(key)).await {
                Ok(reply) => reply.bytes().await.map(|b| b.to_vec()).map_err(|e| self.failed(key, e)),
                Err(e) => Err(self.failed(key, e)),
            }
        })
    }

    /// One GET of `range` (the whole object when `None`) of version `e_tag` of `key`, its reply's
    /// headers checked: that version, or the version's absence or replacement as a final answer.
    /// `other`: the other version the try before was answered with, if it was.
    async fn get_of_version(
        &self,
        key: &str,
        e_tag: &str,
        range: Option<Range<u64>>,
        other: &Mutex<Option<String>>,
    ) -> std::result::Result<GetResult, Failed> {
        let pinned_by_time = modified_of(e_tag).is_some();
        let range = range.map(GetRange::Bounded);
        let options = match modified_of(e_tag) {
            Some(time) => GetOptions { if_unmodified_since: Some(time), range, ..Default::default() },
            None => GetOptions { if_match: Some(e_tag.to_string()), range, ..Default::default() },
        };
        let epoch = self.0.metadata.epoch();
        self.0.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reply = match self.0.objects.get_opts(&self.path(key), options).await {
            Ok(reply) => reply,
            // The version opened is gone: as much a change as a newer ETag.
            Err(object_store::Error::NotFound { .. }) => {
                self.0.metadata.forget(key);
                return Err(Failed::Final(Error::Changed(self.describe(key))));
            }
            // A named version's range the server will not serve: a server that looks at Range
            // before If-Match (MinIO did) answers so for a version replaced by a shorter one.
            Err(e) if is_unsatisfiable(&e) => {
                self.0.metadata.forget(key);
                return Err(Failed::Final(Error::Changed(self.describe(key))));
            }
            Err(e) => return Err(self.failed(key, e)),
        };
        // A version named by its time (a listing that gave no ETag) is compared by time, whatever
        // the GET's headers add.
        let meta = &reply.meta;
        let served =
            if pinned_by_time { version_of(&ObjectMeta { e_tag: None, ..meta.clone() }) } else { version_of(meta) };
        // A server that ignored If-Match, or a reply mangled on the way, must not pass another
        // version's bytes off as these. A mangled reply is asked for again; one naming the same
        // other version twice is a server serving what is there now, which the caller reads.
        if served.as_deref().map(bare_e_tag) != Some(bare_e_tag(e_tag)) {
            self.0.metadata.forget(key);
            let changed = Error::Changed(self.describe(key));
            let mut other = other.lock();
            return Err(match other.replace(served.unwrap_or_default()) == *other {
                true => Failed::Final(changed),
                false => Failed::Again(changed),
            });
        }
        self.0.metadata.confirm(key, e_tag, epoch);
        Ok(reply)
    }

    /// The HEAD of `key` from the server (`None`: no such object), within the time limit.
    pub(super) fn head_request(&self, key: &str) -> Result<Option<Head>> {
        let path = self.path(key);
        self.tried(key, FIRST_BYTE, || async {
            match self.0.objects.head(&path).await {
                Ok(meta) => Ok(Some(head_of(&meta))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.failed(key, e)),
            }
        })
    }

    /// The HEAD of `key` from the server with the object's attributes (its user metadata among
    /// them), within the time limit; `None`: no such object.
    pub(super) fn head_with_attributes(&self, key: &str) -> Result<Option<(Head, Attributes)>> {
        let path = self.path(key);
        self.tried(key, FIRST_BYTE, || async {
            match self.0.objects.get_opts(&path, GetOptions { head: true, ..Default::default() }).await {
                Ok(got) => Ok(Some((head_of(&got.meta), got.attributes))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.failed(key, e)),
            }
        })
    }

    /// Deletes `key` on the server, within the time limit, tried again while the answer is a
    /// fault on the way (a delete is idempotent: one applied whose answer was lost is done).
    pub(super) fn delete_request(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        self.tried(key, FIRST_BYTE, || async { self.0.objects.delete(&path).await.map_err(|e| self.failed(key, e)) })
    }

    /// The listing of directory `dir` (object path `prefix`) from the server, within the time
    /// limit (a listing cut short is an ill-formed document: tried again).
    pub(super) fn list_request(&self, dir: &str, prefix: Option<&Path>) -> Result<ListResult> {
        self.tried(dir, LISTING, || async {
            self.0.objects.list_with_delimiter(prefix).await.map_err(|e| self.failed(dir, e))
        })
    }

    /// The first listing, made before mounting to tell whether the bucket is there: tried again
    /// within the time limit while the answer is lost or mangled on the way.
    pub(super) fn probe_list(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let mut tries = 0;
        loop {
            tries += 1;
            let listed = self
                .block_on(async { tokio::time::timeout(LISTING, self.0.objects.list_with_delimiter(prefix)).await });
            match listed {
                Ok(Err(e)) if !is_answer(&e) && tries < TRIES => continue,
                Err(_) if tries < TRIES => continue,
                Ok(done) => return done,
                Err(_) => {
                    let source = format!("no answer within {} s", LISTING.as_secs()).into();
                    return Err(object_store::Error::Generic { store: self.0.service.name, source });
                }
            }
        }
    }

    /// One PUT of the conditional-write probe, tried again while the answer is lost on the way
    /// (more often than a request: a mount asks once, and a lost answer must not pass for the
    /// server's): the probe's refusals must be the server's own.
    pub(super) fn probe_put(&self, path: &Path, options: PutOptions) -> object_store::Result<PutResult> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.block_on(self.0.objects.put_opts(path, PutPayload::from_static(b"probe"), options.clone())) {
                Err(e) if !is_answer(&e) && tries < 2 * TRIES => {
                    std::thread::sleep(crate::store::backoff(tries as u32));
                }
                done => return done,
            }
        }
    }

    /// A server-side copy of `from` to `to`, tried again after faults on the way (a copy can be
    /// repeated). Not time-limited: the server takes as long as the object needs.
    pub(super) fn copy_request(&self, from: &str, to: &str) -> Result<()> {
        let (source, target) = (self.path(from), self.path(to));
        let mut last = None;
        for _ in 0..TRIES {
            match self.block_on(self.0.objects.copy(&source, &target)) {
                Ok(()) => return Ok(()),
                Err(e) if is_answer(&e) => return Err(self.error(from, e)),
                Err(e) => last = Some(self.error(from, e)),
            }
        }
        Err(last.expect("at least one try"))
    }

    /// Stores `payload` at `key` with `options`, trying again after faults on the way. A
    /// conditional PUT that meets an object holding exactly `payload` (its own earlier try whose
    /// answer was lost) has succeeded. The ETag and version stored, as far as the server tells.
    pub(super) fn put_verified(&self, key: &str, payload: PutPayload, options: PutOptions) -> Result<PutResult> {
        let conditional = !matches!(options.mode, object_store::PutMode::Overwrite);
        let path = self.path(key);
        let mut last = None;
        for _ in 0..TRIES {
            let put = self.block_on(self.0.objects.put_opts(&path, payload.clone(), options.clone()));
            let e = match put {
                Ok(put) => return Ok(put),
                Err(e) => e,
            };
            let refused =
                matches!(e, object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. });
            if conditional
                && (refused || !is_answer(&e))
                && let Some(head) = self.holds(key, &payload)?
            {
                return Ok(PutResult { e_tag: head.e_tag, version: head.version, extensions: Default::default() });
            }
            if is_answer(&e) {
                return Err(self.error(key, e));
            }
            log::info!("{}: PUT failed ({}), trying again", self.describe(key), one_line(&e));
            last = Some(self.error(key, e));
        }
        Err(last.expect("at least one try"))
    }

    /// The version of `key` if it holds exactly `payload`.
    fn holds(&self, key: &str, payload: &PutPayload) -> Result<Option<Head>> {
        self.0.metadata.forget(key);
        let Some(head) = self.head_request(key)? else { return Ok(None) };
        let size = payload.content_length() as u64;
        let Some(e_tag) = head.e_tag.clone().filter(|_| head.size == size) else { return Ok(None) };
        let pieces: Vec<&[u8]> = payload.iter().map(|b| b.as_ref()).collect();
        if bare_e_tag(&e_tag) == md5_hex(&pieces) {
            return Ok(Some(head));
        }
        if size > READ_BACK {
            return Ok(None);
        }
        let stored = match self.get_verified(key, &e_tag, None, size) {
            Ok(stored) => stored,
            Err(Error::Changed(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let same = stored.len() == size as usize && payload.iter().flat_map(|b| b.iter()).eq(stored.iter());
        Ok(same.then_some(head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_of_pieces_is_that_of_their_concatenation() {
        assert_eq!(md5_hex(&[b"ab", b"c"]), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(md5_hex(&[]), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn reads_get_time_for_their_bodies() {
        assert_eq!(limit(0), FIRST_BYTE);
        assert_eq!(limit(16 << 20), FIRST_BYTE + Duration::from_secs(4));
    }
}
