//! What an answer was read from: the store keys a computation read and the version of each
//! (`None`: it was not there), so that whoever keeps the answer (the kernel, through
//! `fs::freshness`) can tell when it is out of date.

use std::cell::RefCell;

use crate::store::Stamp;

/// The store files one computation read, in the versions it read.
#[derive(Debug, Default)]
pub struct Sources(RefCell<Vec<(String, Option<Stamp>)>>);

impl Sources {
    pub fn record(&self, key: &str, stamp: Option<Stamp>) {
        self.0.borrow_mut().push((key.to_string(), stamp));
    }

    pub fn into_vec(self) -> Vec<(String, Option<Stamp>)> {
        self.0.into_inner()
    }
}
