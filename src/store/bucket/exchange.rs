//! The [`Exchange`] of an object store: conditional PUTs (If-None-Match: *, If-Match: ETag),
//! HEADs and listings sent to the server every time, and a version's note kept as the object's
//! user metadata (`x-amz-meta-*`, `x-ms-meta-*`), which a PUT stores with the bytes at once.
//! GCS names versions by generation where this names them by ETag: it has no exchange, and its
//! commits take turns by conditional PUTs of whole shards alone.

use object_store::{Attribute, Attributes, PutMode as ObjectPutMode, PutOptions, PutPayload, UpdateVersion};

use super::BucketStore;
use super::resend::Failed;
use crate::store::exchange::{Exchange, Listed, Noted, Version};
use crate::store::{Error, PutMode, Result, Stamp, Store};

/// The user-metadata name of a version's note (letters only: Azure's names must be identifiers,
/// S3's are lowercased).
pub const NOTE: &str = "shardfsnote";

pub fn note_attribute() -> Attribute {
    Attribute::Metadata(NOTE.into())
}

/// The note among an object's attributes (empty: none).
pub fn noted(attributes: &Attributes) -> String {
    attributes.get(&note_attribute()).map(|v| v.to_string()).unwrap_or_default()
}

impl BucketStore {
    /// The store's exchange, where its server can keep many machines' commits apart by ETag.
    pub(super) fn own_exchange(&self) -> Option<&dyn Exchange> {
        let service = &self.0.service;
        let keeps_notes = self.0.keeps_notes.load(std::sync::atomic::Ordering::Relaxed);
        (service.abilities.write && service.abilities.list && !service.updates_name_generation && keeps_notes)
            .then_some(self)
    }

    /// A PUT of a small exchange object in `mode`: its ETag, `None` when the condition failed.
    fn put_small(&self, key: &str, bytes: &[u8], mode: ObjectPutMode) -> Result<Option<String>> {
        let payload = PutPayload::from(bytes.to_vec());
        match self.put_verified(key, payload, PutOptions { mode, ..Default::default() }) {
            Ok(put) => put.e_tag.map(Some).ok_or_else(|| super::no_e_tag(&self.describe(key))),
            Err(Error::Changed(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Exchange for BucketStore {
    fn server_time(&self) -> Option<std::time::SystemTime> {
        self.0.server_clock.as_ref().and_then(|clock| clock.now())
    }

    fn create(&self, key: &str, bytes: &[u8]) -> Result<Option<String>> {
        self.put_small(key, bytes, ObjectPutMode::Create)
    }

    fn replace(&self, key: &str, bytes: &[u8], tag: &str) -> Result<Option<String>> {
        let version = UpdateVersion { e_tag: Some(tag.to_string()), version: None };
        self.put_small(key, bytes, ObjectPutMode::Update(version))
    }

    fn head(&self, key: &str) -> Result<Option<Version>> {
        let Some(head) = self.head_request(key)? else { return Ok(None) };
        let tag = head.e_tag.ok_or_else(|| super::no_e_tag(&self.describe(key)))?;
        Ok(Some(Version { tag, len: head.size }))
    }

    fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        // Removed between the HEAD and the GET (a delta folded by another holder meanwhile), the
        // GET layer says the version read is gone; so it does of a version replaced, or a reply
        // mangled on the way. Only what a HEAD finds missing is none: a marker taken for missing
        // would tell its waiter its delta was folded.
        let mut last = None;
        for _ in 0..super::VERSION_ROUNDS {
            let Some(head) = self.head_request(key)? else { return Ok(None) };
            let e_tag = head.e_tag.ok_or_else(|| super::no_e_tag(&self.describe(key)))?;
            match self.get_verified(key, &e_tag, None, head.size) {
                Ok(bytes) => return Ok(Some(bytes.to_vec())),
                Err(Error::NotFound(_)) => return Ok(None),
                Err(e @ Error::Changed(_)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Changed(self.describe(key))))
    }

    fn list(&self, dir: &str) -> Result<Vec<Listed>> {
        let prefix = self.path(dir);
        let found = self.list_request(dir, Some(&prefix))?;
        let listed = |meta: &object_store::ObjectMeta| {
            let name = meta.location.filename()?.to_string();
            Some(Listed { name, stored: meta.last_modified.into() })
        };
        Ok(found.objects.iter().filter_map(listed).collect())
    }

    fn remove(&self, key: &str) -> Result<()> {
        match self.delete_request(key) {
            Ok(()) | Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn removes_at(&self) -> bool {
        self.0.deletes_at.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn remove_at(&self, key: &str, tag: &str) -> Result<()> {
        let Some(deleter) = self.0.deleter.as_ref().filter(|_| self.removes_at()) else {
            let why = "the server does not decide a DELETE's If-Match";
            return Err(Error::Io { place: self.describe(key), source: std::io::Error::other(why) });
        };
        match self.block_on(deleter.delete_at(&self.path(key), tag)) {
            Ok(_) => Ok(()),
            Err(Failed::Refused) => Err(Error::Changed(self.describe(key))),
            Err(Failed::Other(why)) => Err(Error::Io { place: self.describe(key), source: std::io::Error::other(why) }),
        }
    }

    fn note(&self, key: &str) -> Result<Option<Noted>> {
        let noted = |(head, attributes): (super::metadata::Head, Attributes)| Noted {
            stamp: head.stamp(),
            note: noted(&attributes),
        };
        Ok(self.head_with_attributes(key)?.map(noted))
    }

    fn put_noted(&self, key: &str, pieces: &[&[u8]], mode: PutMode, note: &str) -> Result<Option<Stamp>> {
        self.put_with_note(key, pieces, mode, note)
    }

    fn forget(&self, key: &str) {
        self.0.metadata.forget(key);
    }
}
