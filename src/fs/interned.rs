//! Numbers for values that many inodes share (an array's path, a shard version's stamp and
//! attributes, a store key), each kept once, with a count of its users, and dropped with the last:
//! an inode then keeps a 4-byte number instead of its own copy.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// Values by number, each with how many users hold its number.
#[derive(Debug)]
pub struct Interned<T: Eq + Hash + Clone> {
    values: HashMap<u32, (T, u32)>,
    numbers: HashMap<T, u32>,
    next: u32,
}

impl<T: Eq + Hash + Clone> Default for Interned<T> {
    fn default() -> Self {
        Interned { values: HashMap::new(), numbers: HashMap::new(), next: 1 }
    }
}

impl<T: Eq + Hash + Clone> Interned<T> {
    /// The number of `value`, for one more user.
    pub fn take(&mut self, value: &T) -> u32 {
        if let Some(&n) = self.numbers.get(value) {
            self.values.get_mut(&n).expect("numbered values are kept").1 += 1;
            return n;
        }
        self.insert(value.clone())
    }

    fn insert(&mut self, value: T) -> u32 {
        // 0 is no number; numbers still held are not given again (they wrap after 2^32).
        while self.next == 0 || self.values.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1);
        }
        let n = self.next;
        self.next = self.next.wrapping_add(1);
        self.numbers.insert(value.clone(), n);
        self.values.insert(n, (value, 1));
        n
    }

    /// One user of number `n` (0: none) is done with it.
    pub fn release(&mut self, n: u32) {
        let Some((value, users)) = self.values.get_mut(&n) else { return };
        *users -= 1;
        if *users == 0 {
            let value = value.clone();
            self.values.remove(&n);
            self.numbers.remove(&value);
        }
    }

    /// The value of number `n`, while it has users.
    pub fn get(&self, n: u32) -> Option<&T> {
        self.values.get(&n).map(|(value, _)| value)
    }

    /// True when no number is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl Interned<Arc<str>> {
    /// [`Interned::take`] of a string, copied only the first time.
    pub fn take_str(&mut self, value: &str) -> u32 {
        match self.numbers.get(value) {
            Some(&n) => {
                self.values.get_mut(&n).expect("numbered values are kept").1 += 1;
                n
            }
            None => self.insert(value.into()),
        }
    }

    /// The number `value` has, if it has users.
    pub fn number_of_str(&self, value: &str) -> Option<u32> {
        self.numbers.get(value).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_keeps_its_number_while_it_has_users_and_goes_with_the_last() {
        let mut keys = Interned::<Arc<str>>::default();
        let a = keys.take_str("a/c/0");
        assert_eq!(keys.take_str("a/c/0"), a);
        let b = keys.take_str("a/zarr.json");
        assert_ne!(a, b);
        keys.release(a);
        assert_eq!(keys.get(a).map(|k| &**k), Some("a/c/0"), "one user left");
        keys.release(a);
        assert_eq!(keys.get(a), None);
        assert_eq!(keys.number_of_str("a/c/0"), None);
        keys.release(b);
        assert!(keys.is_empty());
    }
}
