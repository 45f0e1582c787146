//! Reading again what another writer replaced meanwhile: how often, and how long to wait first.
//!
//! A read that finds the version it was given gone is made again from the top at the new one.
//! On an object store that happens when a shard is rewritten between two requests. On a database
//! whose versions are epochs (SQLite, LMDB: a commit by another process renews every version) it
//! happens whenever another mount commits between the two, which many mounts writing at once do
//! every few milliseconds: trying again at once meets the next commit, so each try waits a little
//! longer than the last, with jitter, for a gap between two of them.

use std::time::{Duration, SystemTime};

/// Tries in all: the first at once, the others after 1, 2, 4, ... up to 64 ms (about 0.4 s).
const TRIES: u32 = 12;

/// The tries of one read.
#[derive(Debug, Default)]
pub struct Retries {
    made: u32,
}

impl Retries {
    /// Waits for the next try and returns true, or returns false once every try was made.
    pub fn again(&mut self) -> bool {
        self.made += 1;
        if self.made >= TRIES {
            return false;
        }
        let ceiling = 1u64 << (self.made - 1).min(6);
        // Mounts in other processes meeting the same commit spread out rather than try in step.
        let jitter =
            u64::from(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().subsec_micros());
        std::thread::sleep(Duration::from_micros(ceiling * 500 + jitter % (ceiling * 500 + 1)));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tries_end_within_half_a_second() {
        let started = std::time::Instant::now();
        let mut retries = Retries::default();
        let mut tries = 1;
        while retries.again() {
            tries += 1;
        }
        assert_eq!(tries, TRIES);
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
    }
}
