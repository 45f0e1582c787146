//! The simulation's scheduler: one thread per simulated machine, exactly one of them running at a
//! time. A machine runs until it asks the server something or pauses; then the machine whose
//! virtual clock is earliest goes on. Every request is applied to the [`Server`] at that moment
//! (its linearization point), and the machine's clock moves on by the request's latency. The
//! seed decides latencies, faults and each machine's clock rate and offset, so a run replays
//! exactly from it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::server::Server;

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_F00D)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

/// The panic that ends a killed machine's thread (or every thread of a run stopped as endless).
pub struct Killed;

/// How often each kind of fault strikes a request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Answered 503 after the client's own retries gave up: not applied, an error.
    pub unavailable: f64,
    /// Applied, but the answer lost: an error, or (as a client trying again would see) the
    /// answer of the same request made again.
    pub lost: f64,
    /// The machine stops for 11-30 s after the request (longer than a lease lasts).
    pub stall: f64,
    /// The machine is killed at the request, before or after it is applied.
    pub kill: f64,
}

/// What became of a request.
pub enum Answer<R> {
    Done(R),
    /// Not applied.
    Unavailable,
    /// Applied; the answer did not arrive.
    Lost,
}

/// Request rates a server allows per second and prefix before it answers 503 SlowDown (S3's);
/// `None`: unlimited.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub reads: u64,
    pub writes: u64,
}

/// The kind of a request, for rates.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Class {
    Read,
    Write,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    /// Spawned, not yet at its first point.
    Arriving,
    Waiting,
    Running,
    Gone,
}

struct Machine {
    /// Global time at which it next acts.
    clock: Duration,
    status: Status,
    /// How fast its own clock runs against the server's.
    rate: f64,
    /// How far its wall clock is from the server's, in nanoseconds.
    offset: i64,
    rng: Rng,
    /// Calls of its wall clock so far (each later than the one before).
    walls: u64,
    /// Whether its clocks stop while it stalls (a VM paused), and how long they stood so far.
    pauses: bool,
    paused: Duration,
    /// The server's time at its newest answer: what the `Date` of that answer told.
    heard: Duration,
    /// Listings of the exchange it asked for.
    listings: u64,
    /// Told when the turn is its own (a condition of its own: a thousand machines are not all
    /// woken at every turn).
    turned: Arc<Condvar>,
}

/// Per-second request counts.
#[derive(Default)]
pub struct Rates {
    second: u64,
    this_second: [u64; 2],
    /// The most requests asked in any one second, reads and writes.
    pub peak: [u64; 2],
    /// Requests answered 503 SlowDown (and retried by the client after a pause).
    pub slow_downs: u64,
}

pub struct State {
    pub server: Server,
    /// Server time: when the latest request was applied.
    pub now: Duration,
    machines: Vec<Machine>,
    turn: Option<usize>,
    rng: Rng,
    pub faults: Faults,
    pub limits: Option<Limits>,
    pub rates: Rates,
    /// Past this server time the run is taken for endless and stopped.
    pub limit: Duration,
    pub endless: bool,
    /// The machine whose next shard PUT is put in doubt ([`Sim::in_doubt`]).
    pub doubt: Option<usize>,
    /// Scripted faults (review61): each rule with how many requests matched it so far.
    pub script: Vec<(Rule, usize)>,
    /// Server times each machine starts its commits at (review61; empty: as the config says).
    pub starts: Vec<Duration>,
    /// Per machine: the one entry its commits change, and whether they write it (false: remove
    /// it); `None` (or no entry): as the config draws.
    pub plan: Vec<Option<(u64, bool)>>,
    /// Server times at which a tool that knows nothing of the exchange (zarr-python straight to
    /// the bucket, a user's `rm` of the shard) deletes the watched shard, unconditionally
    /// (review-b5): applied before the first request at or after each.
    pub deletes: Vec<Duration>,
    /// When set, a scripted deletion deletes only a shard whose bytes this holds of (review-b5c:
    /// zarr-python deleting a shard whose chunks are all empty).
    pub delete_if: Option<fn(&[u8]) -> bool>,
}

/// What a scripted rule does to the request it matches (review61).
#[derive(Clone, Copy, Debug)]
pub enum Action {
    /// The machine stalls this long after the request (applied, answered).
    Stall(Duration),
    /// A shard PUT stored, its answer lost, retried (refused), then the machine stalls this long.
    Doubt(Duration),
    /// As `Doubt(.1)`, but the request is applied `.0` after the machine sent it (a slow upload,
    /// a request held in flight): the machine checked what it checks before sending, and the
    /// server applies it later.
    LateDoubt(Duration, Duration),
    /// The machine is killed at its turn to send the request, which is never applied.
    Kill,
}

/// A scripted fault (review61): the `nth` (1-based) request of `machine` of `class` whose key
/// ends with `key`.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub machine: usize,
    pub key: &'static str,
    pub class: Class,
    pub nth: usize,
    pub action: Action,
}

pub struct Sim {
    state: Mutex<State>,
}

impl State {
    /// How many machines were added.
    pub fn machine_count(&self) -> usize {
        self.machines.len()
    }
}

impl Sim {
    pub fn new(seed: u64, server: Server, faults: Faults) -> Sim {
        let state = State {
            server,
            now: Duration::ZERO,
            machines: Vec::new(),
            turn: None,
            rng: Rng::new(seed),
            faults,
            limits: None,
            rates: Rates::default(),
            limit: Duration::from_secs(6 * 3600),
            endless: false,
            doubt: None,
            script: Vec::new(),
            starts: Vec::new(),
            plan: Vec::new(),
            deletes: Vec::new(),
            delete_if: None,
        };
        Sim { state: Mutex::new(state) }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new machine, starting at the server's time; `skewed`: its clocks run 0.5-2x and sit up
    /// to two minutes off.
    pub fn add_machine(&self, skewed: bool) -> usize {
        let mut st = self.state();
        let id = st.machines.len();
        let mut rng = Rng::new(st.rng.next());
        let (rate, offset) = match skewed {
            true => (0.5 + rng.below(1500) as f64 / 1000.0, rng.below(240_000_000_000) as i64 - 120_000_000_000),
            false => (1.0, 0),
        };
        let clock = st.now;
        let turned = Arc::new(Condvar::new());
        st.machines.push(Machine {
            clock,
            status: Status::Arriving,
            rate,
            offset,
            rng,
            walls: 0,
            pauses: false,
            paused: Duration::ZERO,
            heard: Duration::ZERO,
            listings: 0,
            turned,
        });
        id
    }

    /// Machine `m`'s clock as it reads it: its time since the run began.
    pub fn local_now(&self, m: usize) -> Duration {
        let st = self.state();
        let machine = &st.machines[m];
        (machine.clock - machine.paused).mul_f64(machine.rate)
    }

    /// Machine `m` asks for a listing of the exchange.
    pub fn listing(&self, m: usize) {
        self.state().machines[m].listings += 1;
    }

    /// The listings of the exchange each machine asked for.
    pub fn listings(&self) -> Vec<u64> {
        self.state().machines.iter().map(|m| m.listings).collect()
    }

    /// The server's time as machine `m` last heard it (the `Date` of its newest answer).
    pub fn heard(&self, m: usize) -> Duration {
        self.state().machines[m].heard
    }

    /// The global time machine `m` has reached (for when its commits start and end).
    pub fn clock(&self, m: usize) -> Duration {
        self.state().machines[m].clock
    }

    /// Sets the global time machine `m` has reached: tasks it runs at once each start at the
    /// same time, one after another in the simulation.
    pub fn set_clock(&self, m: usize, clock: Duration) {
        self.state().machines[m].clock = clock;
    }

    pub fn wall_nanos(&self, m: usize) -> u64 {
        let mut st = self.state();
        let machine = &mut st.machines[m];
        machine.walls += 1;
        let local = (machine.clock - machine.paused).mul_f64(machine.rate).as_nanos() as i64;
        (1_800_000_000_000_000_000i64 + machine.offset + local) as u64 + machine.walls
    }

    pub fn random(&self, m: usize) -> u64 {
        self.state().machines[m].rng.next()
    }

    /// Machine `m` pauses `pause` by its own clock.
    pub fn sleep(&self, m: usize, pause: Duration) {
        let mut st = self.state();
        let rate = st.machines[m].rate;
        st.machines[m].clock += pause.div_f64(rate);
        drop(self.yield_turn(st, m));
    }

    /// Machine `m` moves its clock to the server's time `at` (a machine started later).
    pub fn wait_until(&self, m: usize, at: Duration) {
        let mut st = self.state();
        st.machines[m].clock = st.machines[m].clock.max(at);
        drop(self.yield_turn(st, m));
    }

    /// Machine `m`'s first point: it waits for its turn.
    pub fn arrive(&self, m: usize) {
        let st = self.state();
        drop(self.yield_turn(st, m));
    }

    /// Machine `m` is done (or was killed): the others go on.
    pub fn leave(&self, m: usize) {
        let mut st = self.state();
        st.machines[m].status = Status::Gone;
        if st.turn == Some(m) {
            st.turn = None;
        }
        self.pick(&mut st);
    }

    /// Machine `m` asks the server: `op` applied at its turn, unless a fault strikes.
    pub fn request<R>(&self, m: usize, class: Class, op: impl Fn(&mut Server, Duration) -> R) -> Answer<R> {
        let mut st = self.state();
        loop {
            st = self.yield_turn(st, m);
            if !self.slowed_down(&mut st, m, class) {
                break;
            }
        }
        Self::outside_deletes(&mut st);
        let faults = st.faults;
        if st.rng.chance(faults.kill) {
            if st.rng.chance(0.5) {
                let now = st.now;
                op(&mut st.server, now);
            }
            self.kill(st, m);
        }
        let now = st.now;
        let answer = if st.rng.chance(faults.unavailable) {
            Answer::Unavailable
        } else {
            let done = op(&mut st.server, now);
            match st.rng.chance(faults.lost) {
                false => Answer::Done(done),
                true if st.rng.chance(0.5) => Answer::Lost,
                true => Answer::Done(op(&mut st.server, now)),
            }
        };
        if !matches!(answer, Answer::Lost) {
            st.machines[m].heard = now;
        }
        let latency = match st.rng.chance(faults.stall) {
            true => st.rng.millis(11_000, 30_000),
            false => st.rng.millis(5, 40),
        };
        st.machines[m].clock += latency;
        answer
    }

    /// The scripted action for machine `m`'s request of `class` at `key`, if a rule matches it now.
    pub fn scripted(&self, m: usize, key: &str, class: Class) -> Option<Action> {
        let mut st = self.state();
        let mut found = None;
        for (rule, seen) in st.script.iter_mut() {
            if rule.machine == m && rule.class == class && key.ends_with(rule.key) {
                *seen += 1;
                if *seen == rule.nth {
                    found = Some(rule.action);
                }
            }
        }
        found
    }

    /// Machine `m` stalls `d` (review61).
    pub fn stall(&self, m: usize, d: Duration) {
        let mut st = self.state();
        let machine = &mut st.machines[m];
        machine.clock += d;
        if machine.pauses {
            machine.paused += d;
        }
    }

    /// Machine `m` is a VM whose stalls are pauses: its clocks stop meanwhile.
    pub fn pauses(&self, m: usize) {
        self.state().machines[m].pauses = true;
    }

    /// Sets machine `m`'s clock rate (review61).
    pub fn set_rate(&self, m: usize, rate: f64) {
        self.state().machines[m].rate = rate;
    }

    /// Whether machine `m`'s request is the one to put in doubt (true once).
    pub fn take_doubt(&self, m: usize) -> bool {
        let mut st = self.state();
        let doubted = st.doubt == Some(m);
        if doubted {
            st.doubt = None;
        }
        doubted
    }

    /// Machine `m`'s request in doubt: applied, its answer lost, and made again at once (that
    /// answer is the one the machine gets); then the machine stalls for `stall`.
    pub fn in_doubt<R>(&self, m: usize, stall: Duration, op: impl Fn(&mut Server, Duration) -> R) -> R {
        let mut st = self.state();
        st = self.yield_turn(st, m);
        Self::outside_deletes(&mut st);
        let now = st.now;
        op(&mut st.server, now);
        let again = op(&mut st.server, now);
        st.machines[m].heard = now;
        drop(st);
        self.stall(m, stall);
        again
    }

    /// The scripted deletions of the watched shard by an outside tool due by the server's time.
    fn outside_deletes(st: &mut State) {
        while st.deletes.first().is_some_and(|at| *at <= st.now) {
            st.deletes.remove(0);
            let key = st.server.watched.clone();
            if let Some(delete_if) = st.delete_if
                && !st.server.objects.get(&key).is_some_and(|v| delete_if(&v.bytes))
            {
                continue;
            }
            let gone = st.server.objects.remove(&key).is_some();
            if std::env::var_os("REVIEW61_TRACE").is_some() {
                eprintln!("[{:>10.3}] OUTSIDE DELETE {key} (was there: {gone})", st.now.as_secs_f64());
            }
        }
    }

    /// Counts a request at the server's time; true when it is over the limit, answered 503 and
    /// tried again by the client after a pause (object_store's back-off: 100 ms, doubling).
    fn slowed_down(&self, st: &mut State, m: usize, class: Class) -> bool {
        let second = st.now.as_secs();
        let rates = &mut st.rates;
        if rates.second != second {
            rates.second = second;
            rates.this_second = [0; 2];
        }
        let i = class as usize;
        rates.this_second[i] += 1;
        rates.peak[i] = rates.peak[i].max(rates.this_second[i]);
        let Some(limits) = st.limits else { return false };
        let allowed = if class == Class::Read { limits.reads } else { limits.writes };
        if rates.this_second[i] <= allowed {
            return false;
        }
        rates.slow_downs += 1;
        let pause = st.rng.millis(100, 1_000);
        st.machines[m].clock += pause;
        true
    }

    /// Machine `m` is killed at its turn to send a request (a scripted [`Action::Kill`]).
    pub fn kill_at_request(&self, m: usize) -> ! {
        let st = self.state();
        let st = self.yield_turn(st, m);
        self.kill(st, m)
    }

    fn kill(&self, mut st: MutexGuard<'_, State>, m: usize) -> ! {
        st.machines[m].status = Status::Gone;
        st.turn = None;
        self.pick(&mut st);
        drop(st);
        std::panic::panic_any(Killed)
    }

    /// Hands the turn on and waits until it is `m`'s again.
    fn yield_turn<'a>(&'a self, mut st: MutexGuard<'a, State>, m: usize) -> MutexGuard<'a, State> {
        st.machines[m].status = Status::Waiting;
        if st.turn == Some(m) {
            st.turn = None;
        }
        self.pick(&mut st);
        let turned = st.machines[m].turned.clone();
        while st.turn != Some(m) {
            if st.endless {
                drop(st);
                std::panic::panic_any(Killed);
            }
            st = turned.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.machines[m].status = Status::Running;
        st.now = st.now.max(st.machines[m].clock);
        st
    }

    /// Gives the turn to the waiting machine whose clock is earliest, once every machine waits.
    fn pick(&self, st: &mut State) {
        if st.turn.is_some() {
            return;
        }
        let busy = st.machines.iter().any(|m| matches!(m.status, Status::Arriving | Status::Running));
        if busy {
            return;
        }
        let next = (0..st.machines.len())
            .filter(|&i| st.machines[i].status == Status::Waiting)
            .min_by_key(|&i| (st.machines[i].clock, i));
        let Some(next) = next else { return };
        if st.machines[next].clock > st.limit {
            st.endless = true;
            st.machines.iter().for_each(|m| m.turned.notify_one());
        } else {
            st.turn = Some(next);
            st.machines[next].turned.notify_one();
        }
    }
}
