//! Chunk directories a lookup took to be there without the exact answer: it waited too long for
//! a shard's index and took a shard file below for a chunk ([`super::namespace`]'s
//! `dir_exists`). Each is kept as there for as long as the kernel may keep the positive entry it
//! was told, so that no later answer contradicts it: `mkdir -p` met EEXIST from the guess, then
//! ENOENT from the exact answer of its `stat`, and failed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a guess holds: the kernel's entry time-out (`fuse::CACHE_TTL`).
pub const GUESS_HELD: Duration = Duration::from_secs(60);

/// The guessed directories, by view path, with when each was guessed.
#[derive(Debug, Default)]
pub struct DirGuesses(Mutex<HashMap<String, Instant>>);

impl DirGuesses {
    /// True while the directory at `path` is held as there.
    pub fn holds(&self, path: &str) -> bool {
        self.0.lock().get(path).is_some_and(|at| at.elapsed() < GUESS_HELD)
    }

    /// Holds the directory at `path` as there. Only stalls make guesses, so the map stays small:
    /// the expired ones go here.
    pub fn keep(&self, path: &str) {
        let mut guesses = self.0.lock();
        guesses.retain(|_, at| at.elapsed() < GUESS_HELD);
        guesses.insert(path.to_string(), Instant::now());
    }

    /// Forgets the guess at `path`: the directory was removed.
    pub fn forget(&self, path: &str) {
        self.0.lock().remove(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guess_holds_until_forgotten() {
        let guesses = DirGuesses::default();
        assert!(!guesses.holds("a/c/9"));
        guesses.keep("a/c/9");
        assert!(guesses.holds("a/c/9") && !guesses.holds("a/c/1"));
        guesses.forget("a/c/9");
        assert!(!guesses.holds("a/c/9"));
    }
}
