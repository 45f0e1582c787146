//! One simulated machine as the commit code sees it: a [`Store`] and [`Exchange`] whose every
//! request goes through the scheduler to the shared [`Server`], and a [`World`] of virtual time,
//! seeded randomness and tasks run one after another. Faults reach the code as a real object
//! store's client reports them: an I/O error (a 503 its retries gave up on, an answer lost).

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use shardfs::store::exchange::{self, Exchange, Listed};
use shardfs::store::world::World;
use shardfs::store::{Attr, Error, Kind, Lock, Object, OpenFile, OpenHow, PutMode, Result, Space, Stamp, Store};

use super::scheduler::{Action, Answer, Class, Sim};
use super::server::{Condition, Server, Version};

#[derive(Clone)]
pub struct Machine {
    pub sim: Arc<Sim>,
    pub id: usize,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "machine {}", self.id)
    }
}

fn stamp(version: &Version) -> Stamp {
    Stamp::new([version.e_tag, version.bytes.len() as u64, 0, 0, 0])
}

fn tag(e_tag: u64) -> String {
    format!("{e_tag:016x}")
}

fn attr(version: &Version) -> Attr {
    let time = SystemTime::UNIX_EPOCH + version.stored;
    Attr {
        kind: Kind::File,
        size: version.bytes.len() as u64,
        perm: 0o644,
        uid: 0,
        gid: 0,
        nlink: 1,
        atime: time,
        mtime: time,
        ctime: time,
        stamp: stamp(version),
    }
}

fn unsupported(key: &str) -> Error {
    Error::Io { place: key.to_string(), source: io::Error::from(io::ErrorKind::Unsupported) }
}

#[derive(Debug)]
struct NoLock;
impl Lock for NoLock {}

impl Machine {
    /// A request of this machine; faults become the errors a client reports.
    fn ask<R>(&self, key: &str, class: Class, op: impl Fn(&mut Server, Duration) -> R) -> Result<R> {
        let action = self.sim.scripted(self.id, key, class);
        self.ask_scripted(key, class, op, action)
    }

    fn ask_scripted<R>(
        &self,
        key: &str,
        class: Class,
        op: impl Fn(&mut Server, Duration) -> R,
        action: Option<Action>,
    ) -> Result<R> {
        if let Some(Action::Kill) = action {
            self.sim.kill_at_request(self.id);
        }
        let before = self.sim.clock(self.id);
        let answer = self.sim.request(self.id, class, op);
        if let Some(Action::Stall(d)) = action {
            self.sim.stall(self.id, d);
        }
        if std::env::var_os("REVIEW61_TRACE").is_some() {
            let what = match &answer {
                Answer::Done(_) => "done",
                Answer::Lost => "LOST",
                Answer::Unavailable => "503",
            };
            let stalled = self.sim.clock(self.id).saturating_sub(before) > Duration::from_secs(5);
            eprintln!(
                "[{:>10.3}] m{} {class:?} {key} {what}{}",
                self.sim.state().now.as_secs_f64(),
                self.id,
                if stalled { " STALL" } else { "" }
            );
        }
        match answer {
            Answer::Done(done) => Ok(done),
            Answer::Unavailable => Err(Error::Io {
                place: self.describe(key),
                source: io::Error::other("503 Service Unavailable (simulated, after retries)"),
            }),
            Answer::Lost => Err(Error::Io {
                place: self.describe(key),
                source: io::Error::new(io::ErrorKind::TimedOut, "answer lost (simulated)"),
            }),
        }
    }

    fn version(&self, key: &str) -> Result<Option<Version>> {
        self.ask(key, Class::Read, |server, _| server.objects.get(key).cloned())
    }

    fn condition(&self, key: &str, mode: PutMode) -> Result<Condition> {
        Ok(match mode {
            PutMode::Overwrite => Condition::None,
            PutMode::Create => Condition::Absent,
            PutMode::Update(stamp) => Condition::At(self.e_tag_of(key, &stamp)?),
        })
    }

    /// The ETag a stamp was made of.
    fn e_tag_of(&self, _key: &str, stamp: &Stamp) -> Result<u64> {
        Ok(stamp.words()[0])
    }

    fn put_with(&self, key: &str, pieces: &[&[u8]], mode: PutMode, note: &str) -> Result<Option<Stamp>> {
        let condition = self.condition(key, mode)?;
        let bytes = pieces.concat();
        let op = |server: &mut Server, now| {
            server.put(key, bytes.clone(), condition, note, now).map(|_| stamp(&server.objects[key]))
        };
        // A shard version (it carries a note) in doubt: stored, its answer lost, and the holder
        // stalled for a minute, past a lease's time-out.
        let action = self.sim.scripted(self.id, key, Class::Write);
        let put = match (!note.is_empty() && self.sim.take_doubt(self.id), action) {
            (true, _) => self.sim.in_doubt(self.id, Duration::from_secs(60), op),
            (false, Some(Action::Doubt(d))) => {
                if std::env::var_os("REVIEW61_TRACE").is_some() {
                    eprintln!(
                        "[{:>10.3}] m{} PUT {key} IN DOUBT note={note}",
                        self.sim.state().now.as_secs_f64(),
                        self.id
                    );
                }
                self.sim.in_doubt(self.id, d, op)
            }
            (false, Some(Action::LateDoubt(late, d))) => {
                self.sim.stall(self.id, late);
                self.sim.in_doubt(self.id, d, op)
            }
            (false, action) => self.ask_scripted(key, Class::Write, op, action)?,
        };
        match put {
            Some(stamp) => Ok(Some(stamp)),
            None => Err(Error::Changed(self.describe(key))),
        }
    }
}

/// One version of an object, opened: reads only of that version (S3's `If-Match`), the first of
/// them fetching all of it (as the bucket store's read-ahead would a small shard).
#[derive(Debug)]
struct Opened {
    machine: Machine,
    key: String,
    e_tag: u64,
    attr: Attr,
    fetched: std::sync::OnceLock<Arc<Vec<u8>>>,
}

impl Object for Opened {
    fn attr(&self) -> &Attr {
        &self.attr
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let (key, e_tag) = (&self.key, self.e_tag);
        let bytes = match self.fetched.get() {
            Some(bytes) => bytes.clone(),
            None => {
                let read = self.machine.ask(key, Class::Read, |server, _| {
                    server.objects.get(key).filter(|v| v.e_tag == e_tag).map(|v| v.bytes.clone())
                })?;
                let bytes = read.ok_or_else(|| Error::Changed(self.machine.describe(key)))?;
                self.fetched.get_or_init(|| bytes).clone()
            }
        };
        let start = (offset as usize).min(bytes.len());
        let n = buf.len().min(bytes.len() - start);
        buf[..n].copy_from_slice(&bytes[start..start + n]);
        Ok(n)
    }

    fn place(&self) -> String {
        self.machine.describe(&self.key)
    }
}

impl Store for Machine {
    fn describe(&self, key: &str) -> String {
        format!("sim://machine-{}/{key}", self.id)
    }

    fn url(&self, key: &str) -> String {
        format!("sim://bucket/{key}")
    }

    fn attr(&self, key: &str) -> Result<Attr> {
        self.version(key)?.map(|v| attr(&v)).ok_or_else(|| Error::NotFound(self.describe(key)))
    }

    fn list(&self, dir: &str) -> Result<(Vec<(String, Kind)>, Stamp)> {
        Err(unsupported(dir))
    }

    fn open(&self, key: &str) -> Result<Box<dyn Object>> {
        let version = self.version(key)?.ok_or_else(|| Error::NotFound(self.describe(key)))?;
        let (key, e_tag, attr) = (key.to_string(), version.e_tag, attr(&version));
        Ok(Box::new(Opened { machine: self.clone(), key, e_tag, attr, fetched: Default::default() }))
    }

    fn read_link(&self, key: &str) -> Result<std::path::PathBuf> {
        Err(unsupported(key))
    }

    fn space(&self) -> Result<Space> {
        Ok(Space::default())
    }

    fn put(&self, key: &str, pieces: &[&[u8]], mode: PutMode) -> Result<Option<Stamp>> {
        self.put_with(key, pieces, mode, "")
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.ask(key, Class::Write, |server, _| drop(server.objects.remove(key)))
    }

    /// As an object store's: its delete is unconditional, so nothing is removed.
    fn delete_version(&self, _key: &str, _stamp: &Stamp) -> Result<bool> {
        Ok(false)
    }

    fn rename(&self, from: &str, _to: &str) -> Result<()> {
        Err(unsupported(from))
    }

    fn make_dir(&self, key: &str, _mode: u32) -> Result<()> {
        Err(unsupported(key))
    }

    fn make_dirs(&self, _key: &str) -> Result<()> {
        Ok(())
    }

    fn remove_dir(&self, key: &str) -> Result<()> {
        Err(unsupported(key))
    }

    fn can_append(&self) -> bool {
        false
    }

    fn can_keep(&self, kept: u64) -> bool {
        self.sim.state().server.copies_from.is_some_and(|least| kept >= least)
    }

    fn put_extending(&self, key: &str, over: &Stamp, kept: u64, tail: &[&[u8]], note: &str) -> Result<Option<Stamp>> {
        let over = self.e_tag_of(key, over)?;
        let tail = tail.concat();
        let op = |server: &mut Server, now| {
            server.extend(key, over, kept, &tail, note, now).map(|_| stamp(&server.objects[key]))
        };
        let action = self.sim.scripted(self.id, key, Class::Write);
        let put = match action {
            Some(Action::Doubt(d)) => self.sim.in_doubt(self.id, d, op),
            Some(Action::LateDoubt(late, d)) => {
                self.sim.stall(self.id, late);
                self.sim.in_doubt(self.id, d, op)
            }
            action => self.ask_scripted(key, Class::Write, op, action)?,
        };
        put.map(Some).ok_or_else(|| Error::Changed(self.describe(key)))
    }

    fn exchange(&self) -> Option<&dyn Exchange> {
        Some(self)
    }

    fn open_file(&self, key: &str, _how: OpenHow) -> Result<Box<dyn OpenFile>> {
        Err(unsupported(key))
    }

    fn lock(&self, _slot: u64) -> Result<Box<dyn Lock>> {
        Ok(Box::new(NoLock))
    }
}

impl Exchange for Machine {
    fn create(&self, key: &str, bytes: &[u8]) -> Result<Option<String>> {
        self.ask(key, Class::Write, |server, now| server.put(key, bytes.to_vec(), Condition::Absent, "", now).map(tag))
    }

    fn replace(&self, key: &str, bytes: &[u8], old: &str) -> Result<Option<String>> {
        let Ok(old) = u64::from_str_radix(old, 16) else { return Ok(None) };
        self.ask(key, Class::Write, |server, now| server.put(key, bytes.to_vec(), Condition::At(old), "", now).map(tag))
    }

    fn head(&self, key: &str) -> Result<Option<exchange::Version>> {
        Ok(self.version(key)?.map(|v| exchange::Version { tag: tag(v.e_tag), len: v.bytes.len() as u64 }))
    }

    fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.ask(key, Class::Read, |server, _| server.objects.get(key).map(|v| v.bytes.to_vec()))
    }

    fn list(&self, dir: &str) -> Result<Vec<Listed>> {
        self.sim.listing(self.id);
        let listed = self.ask(dir, Class::Read, |server, _| server.list(dir))?;
        Ok(listed.into_iter().map(|(name, stored)| Listed { name, stored: SystemTime::UNIX_EPOCH + stored }).collect())
    }

    fn remove(&self, key: &str) -> Result<()> {
        Store::delete(self, key)
    }

    fn removes_at(&self) -> bool {
        self.sim.state().server.deletes_at
    }

    fn remove_at(&self, key: &str, tag: &str) -> Result<()> {
        assert!(self.removes_at(), "a conditional DELETE asked of a server that has none");
        let Ok(at) = u64::from_str_radix(tag, 16) else { return Err(Error::Changed(self.describe(key))) };
        let removed = self.ask(key, Class::Write, |server, _| match server.objects.get(key) {
            Some(version) if version.e_tag != at => false,
            _ => {
                server.objects.remove(key);
                true
            }
        })?;
        if removed { Ok(()) } else { Err(Error::Changed(self.describe(key))) }
    }

    fn note(&self, key: &str) -> Result<Option<exchange::Noted>> {
        let noted = |v: Version| exchange::Noted { stamp: stamp(&v), note: v.note };
        Ok(self.version(key)?.map(noted))
    }

    fn put_noted(&self, key: &str, pieces: &[&[u8]], mode: PutMode, note: &str) -> Result<Option<Stamp>> {
        self.put_with(key, pieces, mode, note)
    }

    fn forget(&self, _key: &str) {}

    fn server_time(&self) -> Option<SystemTime> {
        Some(SystemTime::UNIX_EPOCH + self.sim.heard(self.id))
    }

    fn world(&self) -> &dyn World {
        self
    }
}

impl World for Machine {
    fn now(&self) -> Duration {
        self.sim.local_now(self.id)
    }

    fn wall_nanos(&self) -> u64 {
        self.sim.wall_nanos(self.id)
    }

    fn sleep(&self, pause: Duration) {
        self.sim.sleep(self.id, pause);
    }

    fn random(&self) -> u64 {
        self.sim.random(self.id)
    }

    /// One after another, in an order the seed picks, each from the same moment: the machine
    /// goes on when the last is done.
    fn at_once<'a>(&self, mut tasks: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        if self.random() % 2 == 1 {
            tasks.reverse();
        }
        let start = self.sim.clock(self.id);
        let mut end = start;
        for task in tasks {
            self.sim.set_clock(self.id, start);
            task();
            end = end.max(self.sim.clock(self.id));
        }
        self.sim.set_clock(self.id, end);
    }
}

/// A range's bytes of a version, for the checker.
pub fn slice(bytes: &[u8], range: Range<u64>) -> &[u8] {
    &bytes[range.start as usize..range.end as usize]
}
