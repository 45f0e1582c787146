//! A Redis database as zarr-python 2's `RedisStore` writes it: a string value a Zarr key, named
//! `PREFIX:KEY` (`zarr:` by default), listed with `SCAN`.
//!
//! Versions: Redis keeps none, and zarr-python's plain `SET`s leave no trace a version counter
//! could follow, so reads, writes and looks go through one connection whose reads the server
//! tracks, and a value's version is known there until Redis announces a change of it
//! ([`tracking`], which says why that is exact). A read of a range returns the value's length in
//! the same atomic step; a conditional write replaces the value only if its version is still the
//! one read (WATCH, MULTI, EXEC), so two mounts on two machines writing one shard take turns as
//! they do on S3. No value is hashed, and a look at a value reads none of it.
//!
//! A connection lost (the server restarted, a network fault) fails what needed it with EIO and is
//! dropped, with the versions it knew; the next request connects again, so the mount recovers
//! when the server is back.

mod tracking;

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;
use redis::{Connection, Value};

use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};
use tracking::{Tracking, ask_swaps};

const STORE: &str = "Redis";

/// How long a connection or a reply may take before the request fails.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Connections kept for reuse by listings (`SCAN`), which read no value and so need no tracking.
const KEPT: usize = 8;

/// Keys of one `SCAN` step, and of one look at lengths.
const SCAN_COUNT: usize = 1000;

/// The length of each key's value (-1: none, or not a string): no value is read, and each key is
/// tracked from here on.
const SIZES: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'string' then out[i] = redis.call('STRLEN', key) else out[i] = -1 end
end
return out";

/// Keys below a prefix of a Redis database.
pub struct Redis {
    client: redis::Client,
    /// The URL, and the prefix when it is not the default, for messages.
    name: String,
    /// `PREFIX:`, put before every Zarr key.
    prefix: String,
    idle: Mutex<Vec<Connection>>,
    /// The connection every value is read, looked at and written through.
    tracking: Tracking,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").field("name", &self.name).field("prefix", &self.prefix).finish()
    }
}

/// What a write found.
enum Written {
    Done(String),
    Exists,
    Changed,
}

impl Redis {
    /// Connects to the database at `url` (`redis://HOST:PORT/DB`), for keys named `prefix:KEY`;
    /// fails, naming the server and the cause, when it cannot be reached or cannot track reads
    /// (before Redis 6).
    pub fn open(url: &str, prefix: &str) -> std::result::Result<Redis, String> {
        let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
        let tracking = Tracking::new(client.get_connection_info(), TIMEOUT).map_err(|e| format!("{url}: {e}"))?;
        let name = if prefix == "zarr" { url.to_string() } else { format!("{url} (keys {prefix}:*)") };
        let redis = Redis { client, name, prefix: format!("{prefix}:"), idle: Mutex::default(), tracking };
        let mut connection = redis.connect().map_err(|e| format!("{url}: cannot reach the server: {e}"))?;
        redis::cmd("PING").query::<()>(&mut connection).map_err(|e| format!("{url}: {e}"))?;
        redis.idle.lock().push(connection);
        redis
            .tracking
            .with(|_| Ok(()))
            .map_err(|e| format!("{url}: cannot track reads (CLIENT TRACKING, RESP3: Redis 6 or newer): {e}"))?;
        Ok(redis)
    }

    fn connect(&self) -> redis::RedisResult<Connection> {
        let connection = self.client.get_connection_with_timeout(TIMEOUT)?;
        connection.set_read_timeout(Some(TIMEOUT))?;
        connection.set_write_timeout(Some(TIMEOUT))?;
        Ok(connection)
    }

    /// Runs `work` on a connection of the listings; one that failed is not kept, and `work` (which
    /// only reads) is tried once more on a new one when a kept one had been lost meanwhile.
    fn with<T>(&self, mut work: impl FnMut(&mut Connection) -> redis::RedisResult<T>) -> Result<T> {
        let kept = self.idle.lock().pop();
        let was_kept = kept.is_some();
        let mut connection = match kept {
            Some(connection) => connection,
            None => self.connect().map_err(|e| self.fail(e))?,
        };
        let mut done = work(&mut connection);
        if was_kept && matches!(&done, Err(e) if e.is_connection_dropped() || e.is_io_error()) {
            connection = self.connect().map_err(|e| self.fail(e))?;
            done = work(&mut connection);
        }
        match &done {
            Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error() => {}
            _ => {
                let mut idle = self.idle.lock();
                if idle.len() < KEPT {
                    idle.push(connection);
                }
            }
        }
        done.map_err(|e| self.fail(e))
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(STORE, format!("{}: {what}", self.name))
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The entries of `keys` (whole Redis keys); values gone meanwhile are left out.
    fn entries(&self, keys: Vec<String>) -> Result<Vec<(String, Entry)>> {
        let mut found = Vec::with_capacity(keys.len());
        for batch in keys.chunks(SCAN_COUNT) {
            self.tracking
                .reading(|session| {
                    // EVAL rather than EVALSHA: in a transaction, a script the server does not
                    // hold yet could not be sent again.
                    let mut ask = redis::pipe();
                    ask.atomic().cmd("EVAL").arg(SIZES).arg(batch.len()).arg(batch);
                    ask_swaps(&mut ask);
                    let (sizes, stats): (Vec<i64>, String) = session.ask(|c| ask.query(c))?;
                    session.saw(&stats);
                    for (key, size) in batch.iter().zip(sizes) {
                        match (u64::try_from(size), key.strip_prefix(&self.prefix)) {
                            (Ok(size), Some(name)) => {
                                found.push((name.to_string(), Entry { size, version: session.version(key) }))
                            }
                            (Err(_), _) => session.forget(key),
                            (Ok(_), None) => {}
                        }
                    }
                    Ok(())
                })
                .map_err(|e| self.fail(e))?;
        }
        Ok(found)
    }

    /// Every Redis key starting with `PREFIX:start`.
    fn scan(&self, start: &str) -> Result<Vec<String>> {
        let pattern = format!("{}*", glob_escape(&self.key(start)));
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = self.with(|c| {
                redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(SCAN_COUNT).query(c)
            })?;
            for key in batch {
                match String::from_utf8(key) {
                    Ok(key) => keys.push(key),
                    Err(e) => log::warn!("{}: a key that is not UTF-8 left out: {:?}", self.name, e.as_bytes()),
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// `text` as a SCAN pattern that matches only itself.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl Database for Redis {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        // Redis keeps no time of a value's writing: the Unix epoch, the same for every version.
        DateTime::UNIX_EPOCH
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        Ok(self.entries(vec![self.key(key)])?.pop().map(|(_, entry)| entry))
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        // The range depends on the length, which the script learns: a bounded or whole range is
        // resolved there, a suffix or an offset after a look at the length.
        let want = match range {
            None => None,
            Some(GetRange::Bounded(r)) => Some(r.clone()),
            Some(other) => match self.entry(key)? {
                Some(entry) => Some(resolve(STORE, Some(other), entry.size)?),
                None => return Ok(None),
            },
        };
        let whole = self.key(key);
        // The type, length and bytes in one transaction, of native commands: a script would copy
        // the bytes into Lua and out again, which cost the server more than the read. GETRANGE's
        // end is inclusive, and clipped to the value; an empty range reads nothing.
        let mut ask = redis::pipe();
        ask.atomic().ignore_errors().cmd("TYPE").arg(&whole).cmd("STRLEN").arg(&whole);
        match &want {
            None => ask.cmd("GETRANGE").arg(&whole).arg(0).arg(-1),
            Some(r) if r.start < r.end => ask.cmd("GETRANGE").arg(&whole).arg(r.start).arg(r.end - 1),
            Some(_) => &mut ask,
        };
        ask_swaps(&mut ask);
        let (answer, version) = self
            .tracking
            .reading(|session| {
                let mut answer: Vec<Value> = session.ask(|c| ask.query(c))?;
                let stats: String = redis::from_redis_value(answer.pop().unwrap_or(Value::Nil))?;
                session.saw(&stats);
                let version = match answer.as_slice() {
                    [Value::SimpleString(kind), ..] if kind == "string" => Some(session.version(&whole)),
                    _ => {
                        session.forget(&whole);
                        None
                    }
                };
                Ok((answer, version))
            })
            .map_err(|e| self.fail(e))?;
        let (parts, Some(version)) = (answer, version) else { return Ok(None) };
        let mut parts = parts.into_iter().skip(1);
        let (size, bytes) = match (parts.next(), parts.next()) {
            (Some(Value::Int(size)), Some(Value::BulkString(bytes))) => (size, Bytes::from(bytes)),
            (Some(Value::Int(size)), None) => (size, Bytes::new()),
            other => return Err(self.fail(format!("{key}: an answer of another shape: {other:?}"))),
        };
        let entry = Entry { size: size as u64, version };
        admit(&entry)?;
        // An offset or a suffix was resolved against the length looked at before: a value of
        // another length since is another version, not the range asked for.
        if let Some(other @ (GetRange::Offset(_) | GetRange::Suffix(_))) = range
            && want.as_ref() != Some(&resolve(STORE, Some(other), entry.size)?)
        {
            return Err(changed(key, "its length changed while it was read"));
        }
        let range = resolve(STORE, want.map(GetRange::Bounded).as_ref(), entry.size)?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(self.fail(format!("{key}: {} bytes read of {range:?}", bytes.len())));
        }
        Ok(Some((entry, range, bytes)))
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let bytes: Vec<u8> = value.iter().flat_map(|piece| piece.iter().copied()).collect();
        let whole = self.key(key);
        let written = self
            .tracking
            .with(|session| {
                if let Condition::At(version) = condition {
                    // WATCH's reply comes after the invalidation of every change before it (and the
                    // SWAPDBs counted after it take in any before it): the version still known
                    // then is the value's, and EXEC fails on any change since.
                    let mut watch = redis::pipe();
                    watch.cmd("WATCH").arg(&whole).ignore();
                    ask_swaps(&mut watch);
                    let (stats,): (String,) = session.ask(|c| watch.query(c))?;
                    session.saw(&stats);
                    if !session.is_at(&whole, version) {
                        session.ask(|c| redis::cmd("UNWATCH").query::<()>(c))?;
                        return Ok(Written::Changed);
                    }
                }
                // This connection's writes are not announced to it, and end its tracking of the
                // key: the version of what it writes comes from the STRLEN after it, in the same
                // transaction, which tracks the key again.
                let mut set = redis::pipe();
                set.atomic().cmd("SET").arg(&whole).arg(&bytes);
                if *condition == Condition::Absent {
                    set.arg("NX");
                }
                set.cmd("STRLEN").arg(&whole);
                ask_swaps(&mut set);
                let done: Option<(Option<String>, u64, String)> = session.ask(|c| set.query(c))?;
                Ok(match done {
                    None => Written::Changed,
                    Some((None, _, _)) => Written::Exists,
                    Some((Some(_), _, stats)) => {
                        session.saw(&stats);
                        session.forget(&whole);
                        Written::Done(session.version(&whole))
                    }
                })
            })
            .map_err(|e| self.fail(e))?;
        match written {
            Written::Done(version) => Ok(Entry { size: bytes.len() as u64, version }),
            Written::Exists => {
                let source = format!("{key} exists").into();
                Err(object_store::Error::AlreadyExists { path: key.to_string(), source })
            }
            Written::Changed => Err(changed(key, format!("not as the write required ({condition:?})"))),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        let whole = self.key(key);
        self.tracking
            .with(|session| {
                session.ask(|c| redis::cmd("DEL").arg(&whole).query::<()>(c))?;
                session.forget(&whole);
                Ok(())
            })
            .map_err(|e| self.fail(e))
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        let mut listing = Listing::default();
        let mut files = Vec::new();
        for key in self.scan(dir)? {
            let Some(name) = key.strip_prefix(&self.prefix).and_then(|k| k.strip_prefix(dir)) else { continue };
            match name.split_once('/') {
                Some((sub, _)) => listing.dirs.push(sub.to_string()),
                None if !name.is_empty() => files.push(key),
                None => {}
            }
        }
        // Sorted keys: a directory's keys are next to each other.
        listing.dirs.dedup();
        listing.files = self.entries(files)?;
        Ok(listing)
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        let keys = self.scan(prefix)?;
        self.entries(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::Objects;
    use std::sync::Arc;

    /// A redis-server of Debian's package on a port of its own, in memory only, stopped when
    /// dropped; `None` (said loudly) where the package is missing, unless
    /// `SHARDFS_REQUIRE_REDIS=1` (`.ci/run`) makes that a failure.
    struct Server {
        process: std::process::Child,
        url: String,
    }

    impl Server {
        fn start() -> Option<Server> {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let started = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn();
            let Ok(process) = started else {
                assert!(
                    std::env::var("SHARDFS_REQUIRE_REDIS").as_deref() != Ok("1"),
                    "SHARDFS_REQUIRE_REDIS=1 but there is no redis-server (apt-get install redis-server)"
                );
                eprintln!("*** SKIPPED: no redis-server here (apt-get install redis-server) ***");
                return None;
            };
            let server = Server { process, url: format!("redis://127.0.0.1:{port}/0") };
            for _ in 0..500 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("redis-server did not listen on {port}");
        }

        /// A plain connection of another client, as zarr-python's RedisStore has.
        fn other(&self) -> Connection {
            redis::Client::open(self.url.as_str()).unwrap().get_connection().unwrap()
        }

        /// How many times the server ran `command` (in scripts too) since its statistics were reset.
        fn calls(&self, command: &str) -> u64 {
            let info: String = redis::cmd("INFO").arg("commandstats").query(&mut self.other()).unwrap();
            let line = info.lines().find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")));
            line.map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }

    fn put(database: &Redis, key: &str, value: &'static [u8], condition: &Condition) -> Result<Entry> {
        database.write(key, &PutPayload::from_static(value), condition)
    }

    fn read(database: &Redis, key: &str) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        database.read(key, None, &|_| Ok(()))
    }

    /// One server for the checks every store passes, each in a prefix of its own.
    #[test]
    fn a_real_server_passes_the_checks_of_every_store() {
        let Some(server) = Server::start() else { return };
        let open = |prefix: &str| Redis::open(&server.url, prefix).unwrap();
        let store = Objects::mount(open("conformance"), STORE, "test", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);
        crate::store::database::check_listing(&open("listing"));

        // Versions change with every write, and a write at a stale version fails.
        let database = open("versions");
        let one = put(&database, "a", b"one", &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = put(&database, "a", b"two", &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = put(&database, "a", b"three", &Condition::At(one.version.clone()));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        let again = put(&database, "a", b"two", &Condition::Absent);
        assert!(matches!(again, Err(object_store::Error::AlreadyExists { .. })));
        assert_eq!(read(&database, "a").unwrap().unwrap().2, &b"two"[..]);

        // Writers racing, two on each of two mounts, each at its mount's version of the value:
        // exactly one of them wins each round.
        let mounts = [Arc::new(open("race")), Arc::new(open("race"))];
        put(&mounts[0], "shard", b"0", &Condition::Any).unwrap();
        for round in 0..20 {
            let seen: Vec<String> = mounts.iter().map(|m| m.entry("shard").unwrap().unwrap().version).collect();
            let wins: Vec<Entry> = std::thread::scope(|s| {
                let racers: Vec<_> = (0..4)
                    .map(|n| {
                        let (database, version) = (mounts[n % 2].clone(), seen[n % 2].clone());
                        let value = PutPayload::from(format!("{round}-{n}"));
                        s.spawn(move || database.write("shard", &value, &Condition::At(version)).ok())
                    })
                    .collect();
                racers.into_iter().filter_map(|r| r.join().unwrap()).collect()
            });
            assert_eq!(wins.len(), 1, "round {round}: {wins:?}");
        }
    }

    /// What another client does to a key this store read is seen at the next look, never the
    /// value read before under its old version.
    #[test]
    fn another_clients_change_gives_a_new_version_at_once() {
        let Some(server) = Server::start() else { return };
        let database = Redis::open(&server.url, "zarr").unwrap();
        let mut other = server.other();
        for (i, change) in ["SET", "APPEND", "DEL", "FLUSHDB", "EXPIRE"].into_iter().enumerate() {
            let key = format!("k{i}");
            redis::cmd("SET").arg(format!("zarr:{key}")).arg("before").query::<()>(&mut other).unwrap();
            let (before, _, bytes) = read(&database, &key).unwrap().unwrap();
            assert_eq!(bytes, &b"before"[..]);
            assert_eq!(database.entry(&key).unwrap().unwrap(), before);
            let mut command = redis::cmd(change);
            match change {
                "SET" => command.arg(format!("zarr:{key}")).arg("after!"),
                "APPEND" => command.arg(format!("zarr:{key}")).arg("!"),
                "DEL" => command.arg(format!("zarr:{key}")),
                "FLUSHDB" => &mut command,
                _ => command.arg(format!("zarr:{key}")).arg(0),
            };
            command.query::<()>(&mut other).unwrap();
            let now = database.entry(&key).unwrap();
            assert_ne!(now.as_ref(), Some(&before), "{change}");
            // A read that must be of the version seen before fails rather than give other bytes.
            let admit = |entry: &Entry| if *entry == before { Ok(()) } else { Err(changed(&key, "moved on")) };
            let at_before = database.read(&key, None, &admit);
            assert!(matches!(at_before, Err(object_store::Error::Precondition { .. }) | Ok(None)), "{change}");
            let stale = put(&database, &key, b"mine", &Condition::At(before.version.clone()));
            assert!(matches!(stale, Err(object_store::Error::Precondition { .. })), "{change}");
        }
    }

    /// A key under the prefix that holds no string is no value, and costs the connection nothing:
    /// the versions it knows stay.
    #[test]
    fn a_key_of_another_type_is_no_value() {
        let Some(server) = Server::start() else { return };
        let database = Redis::open(&server.url, "zarr").unwrap();
        let known = put(&database, "a", b"one", &Condition::Any).unwrap();
        redis::cmd("HSET").arg("zarr:h").arg("f").arg("v").query::<()>(&mut server.other()).unwrap();
        assert_eq!(database.entry("h").unwrap(), None);
        assert!(read(&database, "h").unwrap().is_none());
        let ranged = database.read("h", Some(&GetRange::Bounded(0..1)), &|_| Ok(()));
        assert!(ranged.unwrap().is_none());
        assert_eq!(database.list_all("").unwrap(), vec![("a".to_string(), known.clone())]);
        assert_eq!(database.entry("a").unwrap(), Some(known));
    }

    /// SWAPDB changes every value of the database without a word to the clients tracking them: the
    /// SWAPDBs counted in each request forget every version.
    #[test]
    fn a_swapped_database_forgets_every_version() {
        let Some(server) = Server::start() else { return };
        let database = Redis::open(&server.url, "zarr").unwrap();
        let mut other = server.other();
        let zero = put(&database, "a", b"zero", &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(zero.clone()));
        redis::cmd("SELECT").arg(1).query::<()>(&mut other).unwrap();
        redis::cmd("SET").arg("zarr:a").arg("once").query::<()>(&mut other).unwrap();
        redis::cmd("SWAPDB").arg(0).arg(1).query::<()>(&mut other).unwrap();
        let (now, _, bytes) = read(&database, "a").unwrap().unwrap();
        assert_eq!(bytes, &b"once"[..]);
        assert_ne!(now.version, zero.version);
        let stale = put(&database, "a", b"mine", &Condition::At(zero.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        // Swapped back: what a look or a listing knew is forgotten too.
        redis::cmd("SWAPDB").arg(0).arg(1).query::<()>(&mut other).unwrap();
        let back = database.entry("a").unwrap().unwrap();
        assert_ne!(back.version, now.version);
        // And a write at a version known before a swap fails.
        redis::cmd("SWAPDB").arg(0).arg(1).query::<()>(&mut other).unwrap();
        let stale = put(&database, "a", b"mine", &Condition::At(back.version));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        assert_eq!(read(&database, "a").unwrap().unwrap().2, &b"once"[..]);
    }

    /// The tracked connection killed: the versions it knew are forgotten, what changed meanwhile
    /// (unannounced: the connection was gone) is read as it is, and the store goes on.
    #[test]
    fn a_killed_connection_forgets_every_version() {
        let Some(server) = Server::start() else { return };
        let database = Redis::open(&server.url, "zarr").unwrap();
        let mut other = server.other();
        let one = put(&database, "a", b"one", &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap().unwrap(), one);
        let killed: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut other)
            .unwrap();
        assert!(killed >= 1);
        redis::cmd("SET").arg("zarr:a").arg("two").query::<()>(&mut other).unwrap();
        let (now, _, bytes) = read(&database, "a").unwrap().unwrap();
        assert_eq!(bytes, &b"two"[..]);
        assert_ne!(now.version, one.version);
        let stale = put(&database, "a", b"three", &Condition::At(one.version.clone()));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        put(&database, "a", b"three", &Condition::At(now.version)).unwrap();
        assert_eq!(read(&database, "a").unwrap().unwrap().2, &b"three"[..]);
    }

    /// Looking at a value reads none of it, and its version is the same at each look: no value is
    /// read again to learn whether it changed.
    #[test]
    fn looks_at_a_value_read_none_of_it() {
        let Some(server) = Server::start() else { return };
        let database = Redis::open(&server.url, "zarr").unwrap();
        database.write("a/c/0", &PutPayload::from(vec![7; 1 << 20]), &Condition::Any).unwrap();
        redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut server.other()).unwrap();
        let first = database.entry("a/c/0").unwrap().unwrap();
        let (read_once, _, bytes) = read(&database, "a/c/0").unwrap().unwrap();
        assert_eq!(bytes.len(), 1 << 20);
        for _ in 0..3 {
            assert_eq!(database.entry("a/c/0").unwrap().unwrap(), first);
            assert_eq!(database.list_all("a/").unwrap(), vec![("a/c/0".to_string(), first.clone())]);
        }
        assert_eq!(read_once, first);
        assert_eq!((server.calls("get"), server.calls("getrange")), (0, 1));
    }
}
