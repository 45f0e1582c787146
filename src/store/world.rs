//! The clock, pauses, randomness and threads that machines taking turns through an
//! [`super::exchange::Exchange`] live by. A real exchange lives in [`RealWorld`]; a simulation
//! gives each simulated machine a world of its own (a virtual clock that may run fast or slow, a
//! seeded generator, pauses that hand the turn to another machine, tasks run one after another),
//! so that a run of many machines over one store replays exactly from its seed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// What code that takes turns with other machines asks of the world it runs in.
pub trait World: Send + Sync {
    /// Time since an arbitrary start, never going back, counting the time the machine was
    /// suspended: for how long something lasted.
    fn now(&self) -> Duration;

    /// This machine's wall clock in nanoseconds since the Unix epoch, rising at every call (a
    /// name it makes sorts after those it made before); machines' clocks may disagree.
    fn wall_nanos(&self) -> u64;

    /// Waits `pause`.
    fn sleep(&self, pause: Duration);

    /// A random number.
    fn random(&self) -> u64;

    /// Runs `tasks`, each a round trip, and returns once all have: at once on threads of their
    /// own, or one after another where that makes a run repeatable.
    fn at_once<'a>(&self, tasks: Vec<Box<dyn FnOnce() + Send + 'a>>);

    /// A random pause before try `attempt + 1` of something that may succeed when tried again, up
    /// to 10 ms doubled per try (see [`super::backoff`]).
    fn backoff(&self, attempt: u32) -> Duration {
        Duration::from_millis(self.random() % (10u64 << attempt.min(6)))
    }
}

/// `f` of each of `items`, run by `world` a few at a time.
pub fn each_at_once<T: Sync, R: Send>(world: &dyn World, items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    for (items, results) in items.chunks(8).zip(results.chunks_mut(8)) {
        let f = &f;
        let tasks = items
            .iter()
            .zip(results.iter_mut())
            .map(|(item, result)| Box::new(move || *result = Some(f(item))) as Box<dyn FnOnce() + Send + '_>)
            .collect();
        world.at_once(tasks);
    }
    results.into_iter().map(|r| r.expect("every task ran")).collect()
}

/// `a` and `b` run by `world` at once: their results.
pub fn both<A: Send, B: Send>(world: &dyn World, a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    let (mut ra, mut rb) = (None, None);
    world.at_once(vec![Box::new(|| ra = Some(a())), Box::new(|| rb = Some(b()))]);
    (ra.expect("ran"), rb.expect("ran"))
}

/// The machine's own clocks and threads.
pub struct RealWorld;

impl World for RealWorld {
    fn now(&self) -> Duration {
        // CLOCK_BOOTTIME, not Instant's CLOCK_MONOTONIC: a holder suspended with its machine
        // must see that its lease may have been taken over meanwhile.
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec to the pointer given.
        let boot = match unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } {
            0 => Duration::new(now.tv_sec as u64, now.tv_nsec as u32),
            _ => Duration::ZERO,
        };
        static START: OnceLock<Duration> = OnceLock::new();
        boot.saturating_sub(*START.get_or_init(|| boot))
    }

    fn wall_nanos(&self) -> u64 {
        static LAST: AtomicU64 = AtomicU64::new(0);
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let previous = LAST.fetch_max(now, Ordering::Relaxed);
        if previous < now { now } else { LAST.fetch_add(1, Ordering::Relaxed) + 1 }
    }

    fn sleep(&self, pause: Duration) {
        std::thread::sleep(pause);
    }

    fn random(&self) -> u64 {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(self.wall_nanos())
    }

    fn at_once<'a>(&self, mut tasks: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        if tasks.len() == 1 {
            return tasks.pop().expect("one task")();
        }
        std::thread::scope(|scope| {
            let threads: Vec<_> = tasks.into_iter().map(|task| scope.spawn(task)).collect();
            for thread in threads {
                thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
        });
    }
}
