//! A Redis database as zarr-python 2's `RedisStore` writes it: a string value a Zarr key, named
//! `PREFIX:KEY` (`zarr:` by default), listed with `SCAN`.
//!
//! Versions: Redis keeps none, and zarr-python's plain `SET`s leave no trace a version counter
//! could follow, so a value's version is the SHA-1 of its bytes, computed by the server in the
//! Lua script that reads or writes it (or here, for a value read whole): a read of a range is
//! checked against the version in the same atomic step, and a conditional write replaces the value only if its SHA-1 is still the one
//! read, so two mounts on two machines writing one shard take turns as they do on S3. The price
//! is a hash of the whole value at each look, paid by the server.
//!
//! A connection lost (the server restarted, a network fault) fails what needed it with EIO and is
//! dropped; the next request connects again, so the mount recovers when the server is back.

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;
use redis::{Connection, Script, Value};

use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

const STORE: &str = "Redis";

/// How long a connection or a reply may take before the request fails.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Connections kept for reuse: FUSE requests in parallel each take one.
const KEPT: usize = 8;

/// Keys of one `SCAN` step.
const SCAN_COUNT: usize = 1000;

/// The bytes one script call hashes at most (more only for a single larger value).
const HASHED: i64 = 16 << 20;

/// The length of each key's value (-1: none, or not a string): no value is read.
const SIZES: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'string' then out[i] = redis.call('STRLEN', key) else out[i] = -1 end
end
return out";

/// The length and SHA-1 of each key's value (-1 and "": none, or not a string).
const ENTRIES: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'string' then
    local v = redis.call('GET', key)
    out[#out + 1] = string.len(v)
    out[#out + 1] = redis.sha1hex(v)
  else
    out[#out + 1] = -1
    out[#out + 1] = ''
  end
end
return out";

/// Length, SHA-1, and the bytes ARGV[1]..ARGV[2] (0-based, end excluded, clipped to the value;
/// an end of -1: to the end).
/// When the range is all of the value, the SHA-1 is left empty: the reader hashes what it got,
/// which is as exact (the value came whole, in one atomic step) and spares the server.
const READ: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return false end
local v = redis.call('GET', KEYS[1])
local first, last = tonumber(ARGV[1]), tonumber(ARGV[2])
if first == 0 and (last == -1 or last >= string.len(v)) then return {string.len(v), '', v} end
return {string.len(v), redis.sha1hex(v), string.sub(v, first + 1, last)}";

/// Sets KEYS[1] to ARGV[3] if condition ARGV[1] holds: 'any'; 'absent', only where there is none;
/// 'at', only where the value's SHA-1 is ARGV[2]. Returns the new SHA-1, or 'exists' or 'changed'.
const WRITE: &str = r"
local condition = ARGV[1]
if condition == 'absent' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
elseif condition == 'at' then
  if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 'changed' end
  if redis.sha1hex(redis.call('GET', KEYS[1])) ~= ARGV[2] then return 'changed' end
end
redis.call('SET', KEYS[1], ARGV[3])
return redis.sha1hex(ARGV[3])";

/// Keys below a prefix of a Redis database.
pub struct Redis {
    client: redis::Client,
    /// The URL, and the prefix when it is not the default, for messages.
    name: String,
    /// `PREFIX:`, put before every Zarr key.
    prefix: String,
    idle: Mutex<Vec<Connection>>,
    sizes: Script,
    entries: Script,
    read: Script,
    write: Script,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").field("name", &self.name).field("prefix", &self.prefix).finish()
    }
}

impl Redis {
    /// Connects to the database at `url` (`redis://HOST:PORT/DB`), for keys named `prefix:KEY`;
    /// fails, naming the server and the cause, when it cannot be reached.
    pub fn open(url: &str, prefix: &str) -> std::result::Result<Redis, String> {
        let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
        let name = if prefix == "zarr" { url.to_string() } else { format!("{url} (keys {prefix}:*)") };
        let redis = Redis {
            client,
            name,
            prefix: format!("{prefix}:"),
            idle: Mutex::default(),
            sizes: Script::new(SIZES),
            entries: Script::new(ENTRIES),
            read: Script::new(READ),
            write: Script::new(WRITE),
        };
        let mut connection = redis.connect().map_err(|e| format!("{url}: cannot reach the server: {e}"))?;
        redis::cmd("PING").query::<()>(&mut connection).map_err(|e| format!("{url}: {e}"))?;
        redis.idle.lock().push(connection);
        Ok(redis)
    }

    fn connect(&self) -> redis::RedisResult<Connection> {
        let connection = self.client.get_connection_with_timeout(TIMEOUT)?;
        connection.set_read_timeout(Some(TIMEOUT))?;
        connection.set_write_timeout(Some(TIMEOUT))?;
        Ok(connection)
    }

    /// Runs `work` on a connection; one that failed is not kept.
    fn with<T>(&self, work: impl FnOnce(&mut Connection) -> redis::RedisResult<T>) -> Result<T> {
        let kept = self.idle.lock().pop();
        let mut connection = match kept {
            Some(connection) => connection,
            None => self.connect().map_err(|e| self.fail(e))?,
        };
        let done = work(&mut connection);
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

    /// The entries of `keys` (whole Redis keys), in one script; values gone meanwhile are left
    /// out.
    fn entries(&self, keys: Vec<String>) -> Result<Vec<(String, Entry)>> {
        let mut found = Vec::with_capacity(keys.len());
        for batch in keys.chunks(SCAN_COUNT) {
            // A script holds the server while it runs: each hashes at most HASHED bytes (or one
            // value), so that other clients wait milliseconds, not seconds.
            let sizes: Vec<i64> = self.with(|c| invoke(&self.sizes, batch, c))?;
            let mut start = 0;
            while start < batch.len() {
                let mut end = start + 1;
                let mut bytes = sizes.get(start).copied().unwrap_or(0).max(0);
                while end < batch.len() && bytes + sizes.get(end).copied().unwrap_or(0).max(0) <= HASHED {
                    bytes += sizes.get(end).copied().unwrap_or(0).max(0);
                    end += 1;
                }
                let group = &batch[start..end];
                let answers: Vec<Value> = self.with(|c| invoke(&self.entries, group, c))?;
                for (key, answer) in group.iter().zip(answers.chunks(2)) {
                    if let (Some(entry), Some(key)) = (entry_of(answer), key.strip_prefix(&self.prefix)) {
                        found.push((key.to_string(), entry));
                    }
                }
                start = end;
            }
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

/// Runs `script` with `keys` as its keys.
fn invoke<T: redis::FromRedisValue>(
    script: &Script,
    keys: &[String],
    connection: &mut Connection,
) -> redis::RedisResult<T> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    invocation.invoke(connection)
}

/// The entry a length and SHA-1 pair describes, if there is a value.
fn entry_of(answer: &[Value]) -> Option<Entry> {
    match answer {
        [Value::Int(size), sha] if *size >= 0 => {
            Some(Entry { size: *size as u64, version: redis::from_redis_value_ref::<String>(sha).ok()? })
        }
        _ => None,
    }
}

/// The SHA-1 of `bytes` in lowercase hexadecimal, as `redis.sha1hex` writes it.
fn sha1_hex(bytes: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
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
        let (start, end) = want.as_ref().map_or((0, -1), |r| (r.start as i64, r.end as i64));
        let answer: Value = self.with(|c| self.read.key(self.key(key)).arg(start).arg(end).invoke(c))?;
        let Value::Array(parts) = answer else { return Ok(None) };
        let (Some(mut entry), Some(Value::BulkString(bytes))) = (entry_of(&parts[..2.min(parts.len())]), parts.get(2))
        else {
            return Err(self.fail(format!("{key}: an answer of another shape: {parts:?}")));
        };
        if entry.version.is_empty() && bytes.len() as u64 == entry.size {
            entry.version = sha1_hex(bytes);
        }
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
        Ok(Some((entry, range, Bytes::copy_from_slice(bytes))))
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let (mode, version) = match condition {
            Condition::Any => ("any", ""),
            Condition::Absent => ("absent", ""),
            Condition::At(version) => ("at", version.as_str()),
        };
        let bytes: Vec<u8> = value.iter().flat_map(|piece| piece.iter().copied()).collect();
        let answer: String =
            self.with(|c| self.write.key(self.key(key)).arg(mode).arg(version).arg(&bytes).invoke(c))?;
        match answer.as_str() {
            "exists" => {
                let source = format!("{key} exists").into();
                Err(object_store::Error::AlreadyExists { path: key.to_string(), source })
            }
            "changed" => Err(changed(key, format!("not at {version}"))),
            _ => Ok(Entry { size: bytes.len() as u64, version: answer }),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.with(|c| redis::cmd("DEL").arg(self.key(key)).query::<()>(c))
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
