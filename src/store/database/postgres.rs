//! A PostgreSQL table of Zarr keys, `NAME(key text PRIMARY KEY, value bytea)`, a row a key: the
//! relational store that many machines share (an SQLite file is one host's).
//!
//! Versions: a row's version is its `xmin` (the transaction that wrote this row version) with its
//! `ctid` (where that row version lies). PostgreSQL gives every row version its own, whoever
//! writes it (this mount, another mount, a plain `UPDATE` from psql), so nothing a writer might
//! forget to bump stands between a version and its bytes; and a conditional write is an `UPDATE
//! ... WHERE xmin = ... AND ctid = ...`, which PostgreSQL re-checks against the newest row version
//! when another transaction updated the row meanwhile, so two mounts writing one shard take turns
//! as they do on S3. A read of a range reads the length, the version and the bytes in one
//! statement, so from one row version.
//!
//! Each operation is one statement, so one transaction, committed durably as the server's
//! `synchronous_commit` says (on by default). A table this store creates keeps values uncompressed
//! out of line (`STORAGE EXTERNAL`): Zarr values are compressed already, and so a range is read
//! without reading the whole value. Keys are compared bytewise there (`COLLATE "C"`), so a prefix
//! is a range of the key's index.
//!
//! The client is tokio-postgres on a runtime of this store's own: the store's callers run on
//! another runtime's threads, where a blocking client could not wait. A connection lost fails
//! what needed it with EIO and is dropped; the next request connects again, so the mount recovers
//! when the server is back.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::{GetRange, PutPayload, Result};
use parking_lot::Mutex;
use tokio_postgres::{Client, Config, NoTls, Row};

use super::buffers::Buffer;
use super::{Admit, Condition, Database, Entry, Listing, changed, failed, resolve};

const STORE: &str = "PostgreSQL";

/// How long connecting may take before the request fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request may take before it fails (and its connection is dropped): a server that
/// stopped answering (SIGSTOP, a network gone) otherwise holds a FUSE request forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Connections kept for reuse: FUSE requests in parallel each take one.
const KEPT: usize = 8;

/// The table's name when `--table` is not given.
pub const DEFAULT_TABLE: &str = "zarr";

/// A table of Zarr keys in a PostgreSQL database.
pub struct Postgres {
    config: Config,
    /// The URL without its password, and the table, for messages.
    name: String,
    statements: Statements,
    idle: Arc<Mutex<Vec<Client>>>,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres").field("name", &self.name).finish()
    }
}

/// The statements of one table, its name quoted in each.
#[derive(Clone)]
struct Statements {
    entry: String,
    read: String,
    put: String,
    create: String,
    update: String,
    delete: String,
    files: String,
    dirs: String,
    all: String,
}

/// The server's history a row version belongs to: the cluster's identifier (new at each initdb)
/// and its timeline (new at each promotion of a standby and each point-in-time recovery; the one
/// WAL is written on now, as the last checkpoint's is the old one until the first checkpoint after
/// a promotion). A
/// server that lost its last transactions (a standby promoted before it received them, a backup
/// recovered) issues their transaction ids again, to other row versions at the same places.
macro_rules! origin {
    () => {
        "(SELECT system_identifier::text || '-' || CASE WHEN pg_is_in_recovery() \
           THEN (SELECT timeline_id::text FROM pg_control_checkpoint()) \
           ELSE left(pg_walfile_name(pg_current_wal_lsn()), 8) END FROM pg_control_system())"
    };
}

/// The columns that name a row's version, as `version_of` reads them.
const VERSION: &str = concat!(origin!(), ", xmin::text, ctid::text");

impl Statements {
    fn of(table: &str) -> Statements {
        let t = table;
        Statements {
            entry: format!("SELECT octet_length(value), {VERSION} FROM {t} WHERE key = $1"),
            // $2: the first byte (1-based), $3: how many (NULL: to the end), $4: a suffix's length
            // (NULL: none); the length and version come from the same row version as the bytes.
            read: format!(
                "SELECT octet_length(value), {VERSION}, CASE \
                   WHEN $4::int4 IS NOT NULL THEN substring(value FROM greatest(octet_length(value) - $4, 0) + 1) \
                   WHEN $3::int4 IS NULL THEN substring(value FROM $2::int4) \
                   ELSE substring(value FROM $2::int4 FOR $3::int4) END \
                 FROM {t} WHERE key = $1"
            ),
            put: format!(
                "INSERT INTO {t} (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value RETURNING {VERSION}, octet_length(value)"
            ),
            create: format!(
                "INSERT INTO {t} (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING \
                 RETURNING {VERSION}, octet_length(value)"
            ),
            update: format!(
                "UPDATE {t} SET value = $2 WHERE key = $1 AND xmin::text = $3 AND ctid::text = $4 AND {} = $5 \
                 RETURNING {VERSION}, octet_length(value)",
                origin!()
            ),
            delete: format!("DELETE FROM {t} WHERE key = $1"),
            // $1: the directory as a LIKE pattern of its keys, $2: the directory itself, whose
            // length the server counts in its own encoding (SQL_ASCII counts bytes).
            files: format!(
                "SELECT key, octet_length(value), {VERSION} FROM {t} \
                 WHERE key LIKE $1 AND char_length(key) > char_length($2::text) \
                 AND strpos(substr(key, char_length($2::text) + 1), '/') = 0"
            ),
            dirs: format!(
                "SELECT DISTINCT split_part(substr(key, char_length($2::text) + 1), '/', 1) FROM {t} \
                 WHERE key LIKE $1 AND strpos(substr(key, char_length($2::text) + 1), '/') > 0"
            ),
            all: format!("SELECT key, octet_length(value), {VERSION} FROM {t} WHERE key LIKE $1"),
        }
    }
}

/// `name` quoted as an SQL identifier; `schema.table` quotes each part.
fn quote_table(name: &str) -> std::result::Result<String, String> {
    let parts: Vec<&str> = name.split('.').collect();
    if name.is_empty() || parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(format!("--table {name:?}: a table's name, or SCHEMA.TABLE"));
    }
    Ok(parts.iter().map(|p| format!("\"{}\"", p.replace('"', "\"\""))).collect::<Vec<_>>().join("."))
}

/// The version of the row whose origin, `xmin` and `ctid` are the columns `at` to `at + 2` of
/// `row`: `ORIGIN.XMIN.BLOCK.OFFSET`, as no separator of an ETag list is in it.
fn version_of(row: &Row, at: usize) -> std::result::Result<String, tokio_postgres::Error> {
    let origin: &str = row.try_get(at)?;
    let xmin: &str = row.try_get(at + 1)?;
    let ctid: &str = row.try_get(at + 2)?;
    let (block, offset) = ctid.trim_matches(|c| c == '(' || c == ')').split_once(',').unwrap_or((ctid, ""));
    Ok(format!("{origin}.{xmin}.{block}.{offset}"))
}

/// The origin, `xmin` and `ctid` a version names, as the statements compare them.
fn row_version(version: &str) -> Option<(String, String, String)> {
    let mut parts = version.splitn(4, '.');
    let (origin, xmin, block, offset) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some((origin.to_string(), xmin.to_string(), format!("({block},{offset})")))
}

/// The entry of the row whose length is column `at` of `row`, its version the two after it.
fn entry_of(row: &Row, at: usize) -> std::result::Result<Entry, tokio_postgres::Error> {
    let size: Option<i32> = row.try_get(at)?;
    Ok(Entry { size: size.unwrap_or(0).max(0) as u64, version: version_of(row, at + 1)? })
}

/// The entry of a row a write returned: its version, then its length.
fn entry_of_written(row: &Row) -> std::result::Result<Entry, tokio_postgres::Error> {
    let size: Option<i32> = row.try_get(3)?;
    Ok(Entry { size: size.unwrap_or(0).max(0) as u64, version: version_of(row, 0)? })
}

/// `prefix` as a LIKE pattern of the keys starting with it.
fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

impl Postgres {
    /// Connects to the database at `url` (`postgresql://USER@HOST:PORT/DB`; a password not in it
    /// is taken from `PGPASSWORD`, so that it need be on no command line) for the table `table`,
    /// creating the table when `create` and there is none; fails, naming the server, the table
    /// and the cause, when it cannot be reached or the table is of another layout.
    pub fn open(url: &str, table: &str, create: bool) -> std::result::Result<Postgres, String> {
        let shown = without_password(url);
        let mut config: Config = url.parse().map_err(|e| format!("{shown}: {e}"))?;
        if config.get_password().is_none()
            && let Ok(password) = std::env::var("PGPASSWORD")
        {
            config.password(password);
        }
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .tcp_user_timeout(REQUEST_TIMEOUT)
            .application_name("shardfs");
        // Each statement is its own transaction and relies on READ COMMITTED's re-check of a row
        // another transaction updated meanwhile: a server or database defaulting to REPEATABLE
        // READ or SERIALIZABLE would fail such writes with serialization errors instead. And a
        // lock someone else holds (LOCK TABLE, SELECT ... FOR UPDATE in an open psql
        // transaction) must not hold a FUSE request forever.
        let options = format!(
            "{} -c default_transaction_isolation=read\\ committed -c lock_timeout={}s",
            config.get_options().unwrap_or_default(),
            REQUEST_TIMEOUT.as_secs() / 2
        );
        config.options(options.trim_start());
        let quoted = quote_table(table).map_err(|e| format!("{shown}: {e}"))?;
        let name = if table == DEFAULT_TABLE { shown.clone() } else { format!("{shown} (table {table})") };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("shardfs-postgres")
            .enable_all()
            .build()
            .map_err(|e| format!("{shown}: {e}"))?;
        let postgres = Postgres { config, name, statements: Statements::of(&quoted), idle: Arc::default(), runtime };
        let table = table.to_string();
        match postgres.run(move |client| layout(client, table, quoted, create)) {
            Ok(Ok(())) => Ok(postgres),
            Ok(Err(why)) => Err(format!("{}: {why}", postgres.name)),
            Err(e) => Err(format!("{}: {e}", postgres.name)),
        }
    }

    fn fail(&self, what: impl std::fmt::Display) -> object_store::Error {
        failed(STORE, format!("{}: {what}", self.name))
    }

    /// Runs `work` on a connection, on this store's runtime, and waits for it here; a connection
    /// that failed is not kept. The error is the cause, in words.
    fn run<T, F, W>(&self, work: W) -> std::result::Result<T, String>
    where
        T: Send + 'static,
        F: Future<Output = std::result::Result<T, tokio_postgres::Error>> + Send + 'static,
        W: FnOnce(Arc<Client>) -> F + Send + 'static,
    {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let (idle, config) = (self.idle.clone(), self.config.clone());
        self.runtime.spawn(async move {
            let kept = idle.lock().pop();
            let client = match kept {
                Some(client) if !client.is_closed() => client,
                _ => match config.connect(NoTls).await {
                    Ok((client, connection)) => {
                        tokio::spawn(async move {
                            if let Err(e) = connection.await {
                                log::debug!("a PostgreSQL connection ended: {e}");
                            }
                        });
                        client
                    }
                    Err(e) => {
                        let _ = sender.send(Err(format!("cannot reach the server: {}", cause(&e))));
                        return;
                    }
                },
            };
            let client = Arc::new(client);
            let done = match tokio::time::timeout(REQUEST_TIMEOUT, work(client.clone())).await {
                Ok(done) => done.map_err(|e| cause(&e)),
                Err(_) => {
                    // Whether a write committed is not known: the bucket store asks again.
                    let _ = sender.send(Err(format!("no answer in {} s", REQUEST_TIMEOUT.as_secs())));
                    return;
                }
            };
            if let Ok(client) = Arc::try_unwrap(client)
                && !client.is_closed()
            {
                let mut idle = idle.lock();
                if idle.len() < KEPT {
                    idle.push(client);
                }
            }
            let _ = sender.send(done);
        });
        receiver.recv().unwrap_or_else(|_| Err("the PostgreSQL client's runtime stopped".to_string()))
    }

    /// Runs the statement work `work` and makes its error this store's.
    fn query<T, F, W>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = std::result::Result<T, tokio_postgres::Error>> + Send + 'static,
        W: FnOnce(Arc<Client>) -> F + Send + 'static,
    {
        self.run(work).map_err(|e| self.fail(e))
    }

    /// The rows of the statement `sql` with the text parameters `texts` and int4 `ints` after them.
    fn rows(&self, sql: &str, texts: Vec<String>, ints: Vec<Option<i32>>) -> Result<Vec<Row>> {
        let sql = sql.to_string();
        self.query(move |client| async move {
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
            for text in &texts {
                params.push(text);
            }
            for int in &ints {
                params.push(int);
            }
            client.query(&sql, &params).await
        })
    }

    /// Writes `value` at `key` with the statement `sql`, whose `$3` and `$4` are `more`: the new
    /// version, or `None` when the statement changed no row.
    fn store(&self, sql: &str, key: &str, value: &PutPayload, more: Vec<String>) -> Result<Option<Entry>> {
        let (sql, owned) = (sql.to_string(), key.to_string());
        let bytes: Vec<u8> = value.iter().flat_map(|piece| piece.iter().copied()).collect();
        let size = bytes.len() as u64;
        let row = self.query(move |client| async move {
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&owned, &bytes];
            for text in &more {
                params.push(text);
            }
            client.query_opt(&sql, &params).await
        })?;
        let Some(row) = row else { return Ok(None) };
        let entry = entry_of_written(&row).map_err(|e| self.fail(e))?;
        if entry.size != size {
            // Not the bytes written (a trigger's doing): their version must not be taken for them.
            return Err(self.fail(format!("{key}: {size} bytes written, {} stored", entry.size)));
        }
        Ok(Some(entry))
    }

    /// The keys and entries of `rows` (key, length, xmin, ctid), in the keys' byte order.
    fn listed(&self, rows: Vec<Row>) -> Result<Vec<(String, Entry)>> {
        let mut found = rows
            .iter()
            .map(|row| Ok((row.try_get::<_, String>(0)?, entry_of(row, 1)?)))
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.fail(e))?;
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }
}

/// The cause of `e`, with the server's own message where there is one.
fn cause(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

/// `url` with its password, if any, left out.
fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

/// Checks that `table` (quoted: `quoted`) has this store's layout, creating it when `create` and
/// it is missing: `Ok(Err(why))` when the table cannot be used.
async fn layout(
    client: Arc<Client>,
    table: String,
    quoted: String,
    create: bool,
) -> std::result::Result<std::result::Result<(), String>, tokio_postgres::Error> {
    let exists: Option<String> = client.query_one("SELECT to_regclass($1)::text", &[&quoted]).await?.try_get(0)?;
    if exists.is_none() {
        if !create {
            return Ok(Err(format!("no table {table} (a writable mount creates it)")));
        }
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {quoted} (key text COLLATE \"C\" PRIMARY KEY, value bytea NOT NULL); \
                 ALTER TABLE {quoted} ALTER COLUMN value SET STORAGE EXTERNAL"
            ))
            .await?;
        log::info!("created the table {table}");
    }
    let columns = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, NULL) FROM pg_attribute a \
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&quoted],
        )
        .await?;
    let columns: Vec<(String, String)> =
        columns.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect::<std::result::Result<_, _>>()?;
    let has = |name: &str, types: &[&str]| columns.iter().any(|(n, t)| n == name && types.contains(&t.as_str()));
    // ON CONFLICT (key) needs a unique index of the key alone.
    let unique = client
        .query_opt(
            "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = $1::text::regclass AND i.indisunique AND i.indnkeyatts = 1 AND a.attname = 'key'",
            &[&quoted],
        )
        .await?
        .is_some();
    let refused: Option<String> = client
        .query_opt(
            "SELECT 'its key''s collation ' || c.collname || ' is not deterministic' FROM pg_attribute a \
               JOIN pg_collation c ON c.oid = a.attcollation \
               WHERE a.attrelid = $1::text::regclass AND a.attname = 'key' AND NOT c.collisdeterministic \
             UNION ALL SELECT 'its trigger ' || tgname || ' may change what is written' FROM pg_trigger \
               WHERE tgrelid = $1::text::regclass AND NOT tgisinternal AND (tgtype & 3) = 3 AND (tgtype & 20) <> 0 \
             UNION ALL SELECT 'its rule ' || rulename || ' may change what is written' FROM pg_rewrite \
               WHERE ev_class = $1::text::regclass AND rulename <> '_RETURN' LIMIT 1",
            &[&quoted],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    if let Some(why) = refused {
        return Ok(Err(format!("the table {table} cannot be mounted: {why}")));
    }
    if !(has("key", &["text", "character varying"]) && has("value", &["bytea"]) && unique) {
        let found: Vec<String> = columns.iter().map(|(n, t)| format!("{n} {t}")).collect();
        return Ok(Err(format!(
            "the table {table} is not in this store's layout: ({}) where (key text PRIMARY KEY, value bytea) was expected",
            found.join(", ")
        )));
    }
    Ok(Ok(()))
}

/// `n` as an int4 parameter: a value holds at most 1 GiB, so a larger `n` means the same as the
/// largest.
fn int4(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Database for Postgres {
    fn name(&self) -> &str {
        &self.name
    }

    fn modified(&self) -> DateTime<Utc> {
        // A row keeps no time of its writing: the Unix epoch, the same for every version.
        DateTime::UNIX_EPOCH
    }

    fn entry(&self, key: &str) -> Result<Option<Entry>> {
        let rows = self.rows(&self.statements.entry, vec![key.to_string()], vec![])?;
        rows.first().map(|row| entry_of(row, 0)).transpose().map_err(|e| self.fail(e))
    }

    fn read(&self, key: &str, range: Option<&GetRange>, admit: Admit) -> Result<Option<(Entry, Range<u64>, Bytes)>> {
        let (first, count, suffix) = match range {
            None => (1, None, None),
            Some(GetRange::Bounded(r)) => (r.start.saturating_add(1), Some(int4(r.end.saturating_sub(r.start))), None),
            Some(GetRange::Offset(start)) => (start.saturating_add(1), None, None),
            Some(GetRange::Suffix(n)) => (1, None, Some(int4(*n))),
        };
        let rows = self.rows(&self.statements.read, vec![key.to_string()], vec![Some(int4(first)), count, suffix])?;
        let Some(row) = rows.first() else { return Ok(None) };
        let entry = entry_of(row, 0).map_err(|e| self.fail(e))?;
        admit(&entry)?;
        let range = resolve(STORE, range, entry.size)?;
        let bytes: Option<&[u8]> = row.try_get(4).map_err(|e| self.fail(e))?;
        let bytes = bytes.unwrap_or_default();
        if bytes.len() as u64 != range.end - range.start {
            return Err(self.fail(format!("{key}: {} bytes read of {range:?}", bytes.len())));
        }
        Ok(Some((entry, range, Buffer::copy(bytes))))
    }

    fn write(&self, key: &str, value: &PutPayload, condition: &Condition) -> Result<Entry> {
        let s = &self.statements;
        match condition {
            Condition::Any => {
                self.store(&s.put, key, value, vec![])?.ok_or_else(|| self.fail(format!("{key}: no row written")))
            }
            Condition::Absent => self.store(&s.create, key, value, vec![])?.ok_or_else(|| {
                let source = format!("{key} exists").into();
                object_store::Error::AlreadyExists { path: key.to_string(), source }
            }),
            Condition::At(version) => {
                let Some((origin, xmin, ctid)) = row_version(version) else {
                    return Err(changed(key, format!("{version} is no version of this store")));
                };
                self.store(&s.update, key, value, vec![xmin, ctid, origin])?
                    .ok_or_else(|| changed(key, format!("not at {version}")))
            }
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.rows(&self.statements.delete, vec![key.to_string()], vec![]).map(drop)
    }

    fn list_dir(&self, dir: &str) -> Result<Listing> {
        let files = self.rows(&self.statements.files, vec![like_prefix(dir), dir.to_string()], vec![])?;
        let dirs = self.rows(&self.statements.dirs, vec![like_prefix(dir), dir.to_string()], vec![])?;
        let mut dirs: Vec<String> =
            dirs.iter().map(|row| row.try_get(0)).collect::<std::result::Result<_, _>>().map_err(|e| self.fail(e))?;
        // A key with `//` in it would name a directory without a name.
        dirs.retain(|name| !name.is_empty());
        dirs.sort_unstable();
        Ok(Listing { files: self.listed(files)?, dirs })
    }

    fn list_all(&self, prefix: &str) -> Result<Vec<(String, Entry)>> {
        let rows = self.rows(&self.statements.all, vec![like_prefix(prefix)], vec![])?;
        self.listed(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::database::Objects;

    /// A PostgreSQL server of Debian's package in a fresh directory, stopped and removed when
    /// dropped; `None` (said loudly) where the package is missing, unless
    /// `SHARDFS_REQUIRE_POSTGRES=1` (`.ci/run`) makes that a failure.
    struct Server {
        dir: std::path::PathBuf,
        bin: std::path::PathBuf,
        url: String,
    }

    impl Server {
        fn start() -> Option<Server> {
            let bin = std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("bin"))
                .find(|bin| bin.join("initdb").exists());
            let Some(bin) = bin else {
                assert!(
                    std::env::var("SHARDFS_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                    "SHARDFS_REQUIRE_POSTGRES=1 but there is no PostgreSQL server (apt-get install postgresql)"
                );
                eprintln!("*** SKIPPED: no PostgreSQL server here (apt-get install postgresql) ***");
                return None;
            };
            let dir = std::env::temp_dir().join(format!("shardfs-pg-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let server = Server { url: format!("postgresql://postgres@127.0.0.1:{port}/postgres"), dir, bin };
            // The server refuses to run as root: as the package's user then.
            let root = unsafe { libc::geteuid() } == 0;
            if root {
                assert!(
                    std::process::Command::new("chown").arg("postgres").arg(&server.dir).status().unwrap().success()
                );
            }
            let run = |program: &str, args: &[&str]| {
                let mut command = if root {
                    let mut c = std::process::Command::new("runuser");
                    c.args(["-u", "postgres", "--"]).arg(server.bin.join(program));
                    c
                } else {
                    std::process::Command::new(server.bin.join(program))
                };
                let out = command.args(args).output().unwrap();
                assert!(out.status.success(), "{program}: {}", String::from_utf8_lossy(&out.stderr));
            };
            let data = server.dir.join("data");
            let (data, dir) = (data.to_str().unwrap(), server.dir.to_str().unwrap());
            run("initdb", &["-D", data, "-A", "trust", "-U", "postgres", "--no-sync"]);
            let options = format!("-p {port} -k {dir} -c listen_addresses=127.0.0.1");
            run("pg_ctl", &["-D", data, "-o", &options, "-w", "-l", &format!("{dir}/log"), "start"]);
            Some(server)
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let data = self.dir.join("data");
            let _ = std::process::Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"))
                .args(["-D", data.to_str().unwrap(), "-m", "immediate", "-w", "stop"])
                .output();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// One server for every check (each in a table of its own): starting one takes seconds.
    #[test]
    fn a_table_of_a_real_server_passes_the_checks_of_every_store() {
        let Some(server) = Server::start() else { return };
        let open = |table: &str| Postgres::open(&server.url, table, true).unwrap();

        let store = Objects::mount(open("conformance"), STORE, "test", false, Default::default()).unwrap();
        crate::store::conformance::check(&store);

        crate::store::database::check_listing(&open("listing"));

        // Versions change with every write, and a write at a stale version fails.
        let database = open("versions");
        let one = database.write("a", &PutPayload::from_static(b"one"), &Condition::Any).unwrap();
        database.write("b", &PutPayload::from_static(b"x"), &Condition::Any).unwrap();
        assert_eq!(database.entry("a").unwrap(), Some(one.clone()));
        let two = database.write("a", &PutPayload::from_static(b"two"), &Condition::At(one.version.clone())).unwrap();
        assert_ne!(one.version, two.version);
        let stale = database.write("a", &PutPayload::from_static(b"three"), &Condition::At(one.version.clone()));
        assert!(matches!(stale, Err(object_store::Error::Precondition { .. })));
        let again = database.write("a", &PutPayload::from_static(b"two"), &Condition::Absent);
        assert!(matches!(again, Err(object_store::Error::AlreadyExists { .. })));
        // Keys with LIKE's own characters list as themselves.
        database.write("x%/_y", &PutPayload::from_static(b"1"), &Condition::Any).unwrap();
        database.write("xa/by", &PutPayload::from_static(b"2"), &Condition::Any).unwrap();
        assert_eq!(database.list_all("x%/").unwrap().len(), 1);
        assert_eq!(database.list_dir("x%/").unwrap().files.len(), 1);

        // Writers racing on one version: exactly one of them wins each round.
        let database = Arc::new(open("race"));
        let mut version = database.write("shard", &PutPayload::from_static(b"0"), &Condition::Any).unwrap().version;
        for round in 0..20 {
            let wins: Vec<Entry> = std::thread::scope(|s| {
                let racers: Vec<_> = (0..4)
                    .map(|n| {
                        let (database, version) = (database.clone(), version.clone());
                        s.spawn(move || {
                            let value = PutPayload::from(format!("{round}-{n}"));
                            database.write("shard", &value, &Condition::At(version)).ok()
                        })
                    })
                    .collect();
                racers.into_iter().filter_map(|r| r.join().unwrap()).collect()
            });
            assert_eq!(wins.len(), 1, "round {round}: {wins:?}");
            version = wins[0].version.clone();
        }
    }

    #[test]
    fn a_table_name_is_quoted_and_a_version_is_read_back() {
        assert_eq!(quote_table("zarr").unwrap(), "\"zarr\"");
        assert_eq!(quote_table("data.my\"table").unwrap(), "\"data\".\"my\"\"table\"");
        assert!(quote_table("a.b.c").is_err() && quote_table("").is_err() && quote_table("a.").is_err());
        assert_eq!(row_version("1-1.7.0.12"), Some(("1-1".to_string(), "7".to_string(), "(0,12)".to_string())));
        assert_eq!(row_version("7.0.12"), None);
        assert_eq!(like_prefix("a_b%/"), "a\\_b\\%/%");
        assert_eq!(without_password("postgresql://u:pw@h:5/db"), "postgresql://u@h:5/db");
    }
}
