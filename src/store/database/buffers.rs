//! The memory database values are read into, used again once the last reader of a value lets go
//! of it. Read into fresh allocations, a value the size of a chunk (1 MiB) got pages that the
//! kernel faulted in and zeroed at every read: the allocator maps blocks of 256 KiB and more
//! afresh and unmaps them when freed (as the daemon asks it to, docs/semantics.md "Memory"), and
//! 256 MiB read through a GNU dbm mount took 74,000 page faults, one for every page read.

use bytes::Bytes;
use parking_lot::Mutex;

/// Values smaller than this are allocated as any other: the allocator keeps such sizes.
const SMALLEST: usize = 64 << 10;
/// Bytes of buffers kept for use again, at most (the fetcher reads ahead up to 16 values at once).
const KEPT_BYTES: usize = 32 << 20;

/// Buffers let go of, kept for use again up to a number of bytes.
struct Pool {
    /// The buffers, and the capacity they hold altogether.
    free: Mutex<(Vec<Vec<u8>>, usize)>,
    kept_bytes: usize,
}

/// The process's buffers: every database store's.
static POOL: Pool = Pool { free: Mutex::new((Vec::new(), 0)), kept_bytes: KEPT_BYTES };

impl Pool {
    fn buffer(&'static self, len: usize) -> Buffer {
        if len < SMALLEST {
            return Buffer(vec![0; len], self);
        }
        let found = {
            let mut free = self.free.lock();
            // Not one more than twice as large: a small value must not hold a large buffer.
            let fits = free.0.iter().position(|b| (len..=len.saturating_mul(2)).contains(&b.capacity()));
            fits.map(|at| {
                let buffer = free.0.swap_remove(at);
                free.1 -= buffer.capacity();
                buffer
            })
        };
        let buffer = match found {
            Some(mut buffer) => {
                buffer.truncate(len);
                buffer.resize(len, 0);
                buffer
            }
            // Fresh pages from the kernel, zeroed by it, not written here as well.
            None => vec![0; len],
        };
        Buffer(buffer, self)
    }

    fn give_back(&self, buffer: Vec<u8>) {
        let mut free = self.free.lock();
        if buffer.capacity() >= SMALLEST && free.1 + buffer.capacity() <= self.kept_bytes {
            free.1 += buffer.capacity();
            free.0.push(buffer);
        }
    }
}

/// Memory for a value of some length, filled by its reader, then handed out as [`Bytes`]; used
/// again once dropped, whether handed out or not.
pub struct Buffer(Vec<u8>, &'static Pool);

impl Buffer {
    /// A buffer of `len` bytes, whose contents are whatever it held before: its reader writes
    /// every byte, or gives up its value.
    pub fn of(len: usize) -> Buffer {
        POOL.buffer(len)
    }

    /// A copy of `bytes` in a buffer.
    pub fn copy(bytes: &[u8]) -> Bytes {
        let mut buffer = Buffer::of(bytes.len());
        buffer.copy_from_slice(bytes);
        buffer.into_bytes()
    }

    /// Keeps the first `len` bytes, the reader having written fewer than asked for.
    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    /// The value read, as bytes that give the buffer back once their last reader drops them.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.1.give_back(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(kept_bytes: usize) -> &'static Pool {
        Box::leak(Box::new(Pool { free: Mutex::new((Vec::new(), 0)), kept_bytes }))
    }

    #[test]
    fn a_buffer_let_go_of_is_used_again_for_a_value_it_fits() {
        let pool = pool(KEPT_BYTES);
        let len = 1 << 20;
        let mut first = pool.buffer(len);
        first.fill(7);
        let first = first.into_bytes();
        let at = first.as_ptr();
        let slice = first.slice(10..20);
        drop(first);
        let busy = pool.buffer(len);
        assert_ne!(busy.as_ptr(), at, "a slice still holds the first buffer");
        drop(slice);
        let again = pool.buffer(len - 1000);
        assert_eq!((again.as_ptr(), again.len()), (at, len - 1000), "let go of, it is used again");
        drop(again);
        assert_ne!(pool.buffer(len / 3).as_ptr(), at, "not for a value of less than half its size");
        assert_eq!(pool.buffer(len + 1).len(), len + 1);
        drop(busy);
    }

    #[test]
    fn the_buffers_kept_are_bounded() {
        let pool = pool(4 << 20);
        let held: Vec<Buffer> = (0..6).map(|_| pool.buffer(1 << 20)).collect();
        drop(held);
        assert_eq!(pool.free.lock().1, 4 << 20);
        drop(pool.buffer(100));
        assert_eq!(pool.free.lock().0.len(), 4, "small buffers are not kept");
    }
}
