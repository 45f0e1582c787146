//! The one connection whose reads Redis tracks (`CLIENT TRACKING`), and the versions of the
//! values read on it: a value's version is known without hashing it, because Redis says when the
//! value changes.
//!
//! Why a version given here names one value, whatever else happens meanwhile:
//!
//! - One connection, in RESP3, with `CLIENT TRACKING ON NOLOOP`. A read of a key on it (a
//!   read-only command, or a read in a script it runs) makes the server remember that this
//!   connection read the key; the next change of the key by any other connection (SET, DEL,
//!   APPEND, RENAME onto it, expiry, eviction, MOVE) puts an `invalidate` push message naming it
//!   into this connection's output at the moment of the change, and ends the tracking of the key;
//!   FLUSHDB and FLUSHALL put one naming no key (every key).
//! - Redis runs one command at a time and writes a connection's output in order, so the reply to
//!   a command that ran at time t comes after the invalidation of every change made before t to a
//!   key the connection was tracking then.
//! - The connection serves one request at a time (a mutex), and after each reply, before the reply
//!   is looked at, every push message read before it is applied (the redis crate hands them over,
//!   in the order read, before it returns the reply).
//! - A version is the server's `run_id`, this connection's client id and a count. A read that
//!   finds no version known for the key gives it the next count; an invalidation of the key
//!   forgets it. A read that finds one keeps it: the key has been tracked since the read that gave
//!   it (the first invalidation, which ends the tracking, would have forgotten it) and no
//!   invalidation came before this reply, so nothing changed the key between the two reads.
//! - An invalidation that comes late (for a change before the read that gave a version, announced
//!   because an earlier read tracked the key) forgets a version that was still right: the next
//!   read gives another, and a read at the old one fails as if the value had changed. Late never
//!   means wrong, only a read again.
//! - This connection's own writes are not announced to it (NOLOOP), and any write ends every
//!   connection's tracking of the key, so a write here forgets the key's version, and gives one
//!   only from a read of the key in the same transaction (MULTI: SET, STRLEN, EXEC).
//! - A conditional write at a version WATCHes the key and, once WATCH's reply is read (after the
//!   invalidation of every change before it), checks the version is still known; EXEC then fails
//!   if anything changed the key after WATCH. As exact as the SHA-1 compared in a script before.
//! - Invalidations lost: an error of any kind on the connection (the server gone, a timeout,
//!   `CLIENT KILL`) drops it, and every version it knew with it. The next connection has another
//!   client id (Redis never gives one twice while it runs; a restarted server has another
//!   `run_id`), so no version of the old one is taken for one of the new. A read whose connection
//!   was killed under it fails: its reply never comes. The server's tracking table, when full
//!   (`tracking-table-max-keys`), evicts keys with an invalidation each, so nothing is missed.
//! - Not announced: SWAPDB, which swaps a database's keys beneath every client without an
//!   invalidation (Redis 7.0, tried). So every request that gives or checks a version also asks,
//!   in the same transaction, how many SWAPDBs the server has run (`INFO commandstats`), and a
//!   count other than the one seen last forgets every version. It is a count since the statistics
//!   were last reset (`CONFIG RESETSTAT`): a reset followed by exactly as many SWAPDBs as were
//!   counted before, between two requests of this connection, goes unseen.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Connection, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisResult, Value};

/// Versions known at most: past it, all are forgotten (each read again gets another), so that a
/// mount reading millions of keys keeps bounded memory.
const KNOWN: usize = 1 << 20;

/// The tracked connection, made when first needed and again after one is dropped.
pub struct Tracking {
    client: redis::Client,
    timeout: Duration,
    session: Mutex<Option<Session>>,
}

/// One tracked connection and the versions of the values read on it.
pub struct Session {
    connection: Connection,
    pushes: Receiver<PushInfo>,
    /// `RUN_ID.CLIENT_ID`, which starts each of its versions.
    origin: String,
    /// The count of each key's version, for keys tracked since the read that gave it.
    known: HashMap<String, u64>,
    next: u64,
    /// The SWAPDBs the server had run at the last look.
    swaps: u64,
}

impl Tracking {
    /// Tracking of reads on connections to the server `info` names, each request failing after
    /// `timeout`.
    pub fn new(info: &ConnectionInfo, timeout: Duration) -> RedisResult<Tracking> {
        // Push messages on the connection that reads: RESP3, whatever the URL asked for.
        let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.clone().set_redis_settings(settings))?;
        Ok(Tracking { client, timeout, session: Mutex::default() })
    }

    /// Runs `work` on the session, connecting one when there is none; a session on which anything
    /// failed is dropped with every version it knew, since invalidations may have been lost.
    pub fn with<T>(&self, work: impl FnOnce(&mut Session) -> RedisResult<T>) -> RedisResult<T> {
        let mut current = self.session.lock();
        let session = match current.as_mut() {
            Some(session) => session,
            None => current.insert(self.start()?),
        };
        let done = work(session);
        if done.is_err() {
            *current = None;
        }
        done
    }

    /// [`Tracking::with`] for `work` that only reads, which is tried once more on a new connection
    /// when the one kept had been lost meanwhile (killed, the server restarted): the read is
    /// answered from the new connection's own versions, and a reader sees no error where one
    /// attempt suffices.
    pub fn reading<T>(&self, mut work: impl FnMut(&mut Session) -> RedisResult<T>) -> RedisResult<T> {
        let kept = self.session.lock().is_some();
        match self.with(&mut work) {
            Err(e) if kept && (e.is_connection_dropped() || e.is_io_error()) => self.with(work),
            done => done,
        }
    }

    fn start(&self) -> RedisResult<Session> {
        let mut connection = self.client.get_connection_with_timeout(self.timeout)?;
        connection.set_read_timeout(Some(self.timeout))?;
        connection.set_write_timeout(Some(self.timeout))?;
        let (sender, pushes) = channel();
        connection.set_push_sender(sender);
        redis::cmd("CLIENT").arg("TRACKING").arg("ON").arg("NOLOOP").query::<()>(&mut connection)?;
        let id: u64 = redis::cmd("CLIENT").arg("ID").query(&mut connection)?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut connection)?;
        let Some(run) = info.lines().find_map(|line| line.strip_prefix("run_id:")) else {
            return Err((redis::ErrorKind::Client, "INFO server names no run_id").into());
        };
        let origin = format!("{}.{id}", run.trim());
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut connection)?;
        Ok(Session { connection, pushes, origin, known: HashMap::new(), next: 0, swaps: swaps(&stats) })
    }
}

impl Session {
    /// Sends a request and reads its reply, then applies the push messages read before the reply.
    pub fn ask<T>(&mut self, request: impl FnOnce(&mut Connection) -> RedisResult<T>) -> RedisResult<T> {
        let reply = request(&mut self.connection);
        while let Ok(push) = self.pushes.try_recv() {
            self.apply(push);
        }
        reply
    }

    fn apply(&mut self, push: PushInfo) {
        match (push.kind, push.data.first()) {
            (PushKind::Invalidate, Some(Value::Array(keys))) => {
                for key in keys {
                    match key {
                        Value::BulkString(key) => {
                            // A key that is not UTF-8 was never given a version.
                            if let Ok(key) = std::str::from_utf8(key) {
                                self.known.remove(key);
                            }
                        }
                        _ => self.known.clear(),
                    }
                }
            }
            // No key (a flush), an invalidation of a shape not known, or the connection lost.
            (PushKind::Invalidate | PushKind::Disconnection, _) => self.known.clear(),
            _ => {}
        }
    }

    /// Takes in `stats`, the `INFO commandstats` of the reply just read (asked for with
    /// [`ask_swaps`]): every version is forgotten if a SWAPDB ran since the last look.
    pub fn saw(&mut self, stats: &str) {
        let now = swaps(stats);
        if now != self.swaps {
            self.known.clear();
            self.swaps = now;
        }
    }

    /// The version of the value at `key` (a whole Redis key), which the reply just asked for read,
    /// with [`Session::saw`] given the SWAPDBs counted in the same transaction.
    pub fn version(&mut self, key: &str) -> String {
        let count = match self.known.get(key) {
            Some(&count) => count,
            None => {
                if self.known.len() >= KNOWN {
                    self.known.clear();
                }
                let count = self.next;
                self.next += 1;
                self.known.insert(key.to_string(), count);
                count
            }
        };
        format!("{}.{count}", self.origin)
    }

    /// Forgets the version of `key`, which this connection changed or found gone.
    pub fn forget(&mut self, key: &str) {
        self.known.remove(key);
    }

    /// Whether `version` is the one known for `key`: the value has not changed since it was read.
    pub fn is_at(&self, key: &str, version: &str) -> bool {
        let Some(count) = version.strip_prefix(&self.origin).and_then(|rest| rest.strip_prefix('.')) else {
            return false;
        };
        self.known.get(key).is_some_and(|&known| count.parse() == Ok(known))
    }
}

/// Adds to `pipe` the question [`Session::saw`] takes the answer of.
pub fn ask_swaps(pipe: &mut redis::Pipeline) {
    pipe.cmd("INFO").arg("commandstats");
}

/// The SWAPDBs counted in `stats` (`INFO commandstats`; none listed: none run).
fn swaps(stats: &str) -> u64 {
    let calls = stats.lines().find_map(|line| line.strip_prefix("cmdstat_swapdb:calls="));
    calls.and_then(|rest| rest.split(',').next()?.parse().ok()).unwrap_or(0)
}
