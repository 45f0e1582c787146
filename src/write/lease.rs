//! The lease of a shard that many machines commit into ([`super::shared_commit`]), and what its
//! body carries from holder to holder: the holders in doubt.
//!
//! A holder whose PUT was stored but whose answer was lost finds out afterwards, from the shard's
//! note, that it was stored: the note names the holders of the last few versions. Stalled long
//! enough that the lease was taken over and later holders pushed its name out of the note, it
//! could not tell, and would apply its changes again over newer writes. So a lease taken over
//! names, after its holder, the holder it was taken from and that one's own doubts. In each round,
//! its holder marks every holder in doubt that the note of the version it read names with a
//! `stored-<holder>` object (so the name may then leave the note), which settles that one (its
//! changes are stored; it makes no PUT after one stored). Once a round of its own stores a
//! version, the rest are settled too (a holder the note did not name can no longer store
//! anything: its PUT, even one still on its way, was over a version that is no longer there) and
//! the lease is given up as usual. A round that stores nothing settles none (a first PUT sent
//! late may yet land over the version it read), so a holder with doubts whose changes leave a
//! shard that is gone without chunks stores a shard of empty entries (every reader takes it for
//! none): before, such removals left the lease to expire, each commit after waiting out its
//! time-out, until one stored. A PUT refused over a version that the holder then reads replaced
//! settles them as well (whoever replaced it, the version a PUT in doubt went over is gone): the
//! holder's own PUT, stored with its answer lost and its retry refused, left the lease to expire
//! (found by review). A lease whose doubts are not settled is left to expire, so that the next
//! holder takes them over. A holder that finds its lease taken over removes its own marker, once
//! done.
//!
//! A create in doubt (over a shard that was gone) is stopped by a version stored only while that
//! version, or one after it, is there: were a tool that knows nothing of the exchange to delete
//! the shard (zarr-python deleting one whose chunks are all empty; a commit never does, it keeps
//! a shard emptied as one of empty entries), it would land late, and once
//! later holders pushed its name out of the note its holder would apply its changes again (found
//! by review). So before the PUT that settles holders in doubt, their holder stores a
//! `doubt-<holder>` marker for each: a holder that reads a note naming one marks it stored and
//! removes the marker. One no note named is swept once a delta's lifetime is past.
//!
//! A holder in doubt that finds neither its name in the note nor its marker, stalled past a
//! quarter of a delta's lifetime, fails (EIO) rather than guess. The stall is the longer of two
//! measures: its own clock (CLOCK_BOOTTIME, which counts a suspended machine's sleep) and the
//! server's, as the `Date` of its answers tells it (the newest seen before the PUT, and after the
//! looks), which also counts a VM paused with its clocks stopped. The stamps of what a round read
//! would not do: they bound the read from below only, so after a shard stood idle they take any
//! refused PUT for a long stall (found by review); a `Date` is the server's time at an answer.
//! Left: a VM paused between its last answer and its PUT may PUT its first changes after a
//! takeover without renewing its lease, unknowing (no clock tells a pause before a request).
//!
//! A lease is given up by removing it only where the server decides a DELETE's condition: a
//! removal made unconditionally by a stale holder could drop a later holder's lease, and with it
//! that holder's doubt. Elsewhere it is given up by replacing it, at the version its holder
//! stored, with an empty body: a **free** lease, which the next committer replaces at once.

use std::time::Duration;

use crate::store::exchange::Version;

/// The lease's name in a shard's exchange directory.
pub(super) const LEASE: &str = "lease";
/// How the names of holders start (in leases and in shard versions' notes).
pub(super) const HOLDER: &str = "holder-";
/// How the names of waiters that hold the lease to fold their own delta start: never in doubt
/// (their changes are in the delta, which the notes name).
pub(super) const WAITER: &str = "waiter-";
/// How the name of the marker of a holder in doubt whose PUT was stored starts (then its name).
pub(super) const STORED: &str = "stored-";
/// How the name of the marker of a holder in doubt that a lease no longer carries starts (then
/// its name): its create may yet land where an outside tool deleted the shard.
pub(super) const DOUBT: &str = "doubt-";

/// The body of a lease given up where leases are not removed (one of any length is held).
pub(super) const FREE: &[u8] = b"";

/// Whether a lease at `version` was given up (and may be taken at once).
pub(super) fn free(version: &Version) -> bool {
    version.len == FREE.len() as u64
}

/// The lease as its holder last stored it.
pub(super) struct Lease {
    pub tag: String,
    /// When, by [`crate::store::world::World::now`].
    pub renewed: Duration,
    /// Holders that held the lease before it was taken over, and whose last PUT may have been
    /// stored with its answer lost; empty once settled.
    pub doubts: Vec<String>,
}

/// The body of a lease held by `holder` with `doubts`; `nonce` makes each body (and so its
/// version tag) one of a kind, so that a lease renewed is never taken for one unchanged.
pub(super) fn body(holder: &str, nonce: u64, doubts: &[String]) -> Vec<u8> {
    let mut body = format!("{holder} nonce-{nonce:016x}");
    for doubt in doubts {
        body.push(' ');
        body.push_str(doubt);
    }
    body.into_bytes()
}

/// The doubts of a holder taking over the lease whose body is `body`: its holder, then that
/// one's doubts.
pub(super) fn inherited(body: &[u8]) -> Vec<String> {
    let mut doubts: Vec<String> = Vec::new();
    for name in String::from_utf8_lossy(body).split(' ').filter(|n| n.starts_with(HOLDER)) {
        if !doubts.iter().any(|d| d == name) {
            doubts.push(name.to_string());
        }
    }
    doubts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_taken_over_passes_on_its_holder_and_its_doubts() {
        let doubts = vec!["holder-1".to_string(), "holder-0".to_string()];
        let taken = body("holder-2", 7, &doubts);
        assert_eq!(inherited(&taken), ["holder-2", "holder-1", "holder-0"]);
        assert_ne!(body("holder-2", 7, &[]), body("holder-2", 8, &[]));
        assert_eq!(inherited(b"holder-3 nonce-00 holder-3"), ["holder-3"]);
        assert!(inherited(b"").is_empty());
    }
}
