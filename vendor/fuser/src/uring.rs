//! FUSE over io_uring (Linux 6.14+, where the `fuse` module's `enable_uring` is on).
//!
//! Each worker has an io_uring of its own holding one ring entry: a header buffer and a payload
//! buffer registered with the kernel (`FUSE_IO_URING_CMD_REGISTER`). The kernel writes a request
//! into an entry and completes its command; the worker answers by writing the reply into the same
//! buffers and sending `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next request.
//! A request and its reply thus take one system call where `/dev/fuse` takes a read and a write,
//! and a worker replying in its own thread submits the commit with its next wait.
//!
//! The kernel keeps one queue per possible CPU, puts a request on the queue of the CPU its caller
//! runs on, and uses the rings only once every queue has an entry; worker `i` serves queue
//! `i % queues`. One entry per worker keeps the model of the `/dev/fuse` loop: a worker blocked in
//! a filesystem method holds its own entry only. FORGETs, INTERRUPTs and notifications still go
//! through `/dev/fuse`, so its loop runs beside the rings.

use std::fs::File;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::Operation;
use crate::read_buf::FuseReadBuf;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out[128]` (the `fuse_in_header` of a request, the
/// `fuse_out_header` of its reply), `op_in[128]` (the request's first argument), then
/// `struct fuse_uring_ent_in_out` (`flags`, `commit_id`, `payload_sz`, ...).
const HEADER_LEN: usize = 288;
const OP_IN: usize = 128;
const OP_IN_LEN: usize = 128;
const COMMIT_ID: usize = 256 + 8;
const PAYLOAD_SZ: usize = 256 + 16;
const IN_HEADER_LEN: usize = size_of::<ll::fuse_abi::fuse_in_header>();
const OUT_HEADER_LEN: usize = size_of::<ll::fuse_abi::fuse_out_header>();

/// The kernel's minimum payload buffer (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;

/// Completion tags: the ring entry's command, the poll of the stop descriptor, and the poll of
/// the ring's wake descriptor.
const ENTRY: u64 = 1;
const STOP: u64 = 2;
const WAKE: u64 = 3;

/// Each CPU's queue gets at least this many entries: a request waits for an entry of its caller's
/// CPU's queue even while other queues' entries are free, so one slow request (a GET of a far
/// object store) must not hold up every other call from that CPU.
const MIN_ENTRIES_PER_QUEUE: usize = 4;

/// The rings of a session, made before the INIT reply that turns them on: once the kernel is told
/// `FUSE_OVER_IO_URING`, its requests wait until every queue has an entry, so a ring that could
/// not be made then would hang the mount. Made first, a failure leaves `/dev/fuse` in use.
pub(crate) struct Rings {
    /// Each worker's entry, kept until every worker has ended: the kernel writes into them.
    pub(crate) rings: Vec<Arc<Ring>>,
    /// Each worker's io_uring, taken by the worker.
    pub(crate) urings: Vec<Uring>,
    /// An eventfd each ring polls, written to end the workers once `/dev/fuse` has ended.
    stop: File,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rings")
            .field("rings", &self.rings)
            .finish_non_exhaustive()
    }
}

/// An io_uring with room for 128-byte entries (`IORING_SETUP_SQE128`), as `URING_CMD` needs.
pub(crate) type Uring = IoUring<squeue::Entry128, cqueue::Entry>;

impl Rings {
    /// Rings for at least `workers` workers (at least `MIN_ENTRIES_PER_QUEUE` per queue), each
    /// with buffers for requests and replies of up to `max_payload` bytes beside their headers.
    pub(crate) fn prepare(
        device: &Channel,
        workers: usize,
        max_payload: usize,
    ) -> io::Result<Self> {
        let queues = possible_cpus()?;
        let stop = eventfd()?;
        let payload = max_payload.max(MIN_PAYLOAD);
        let workers = workers.max(queues * MIN_ENTRIES_PER_QUEUE);
        let mut rings = Vec::with_capacity(workers);
        let mut urings = Vec::with_capacity(workers);
        for i in 0..workers {
            // The entry's command and the two polls.
            urings.push(Uring::builder().build(4)?);
            rings.push(Arc::new(Ring::new(
                device.clone(),
                (i % queues) as u16,
                payload,
            )?));
        }
        Ok(Self {
            rings,
            urings,
            stop,
        })
    }

    /// Ends the workers still waiting on their rings.
    pub(crate) fn stop(&self) {
        signal(&self.stop);
    }

    pub(crate) fn stop_fd(&self) -> i32 {
        self.stop.as_raw_fd()
    }
}

fn eventfd() -> io::Result<File> {
    // SAFETY: eventfd takes no pointers; its result is checked before it is owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn signal(eventfd: &File) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a local to an open eventfd.
    unsafe { libc::write(eventfd.as_raw_fd(), (&raw const one).cast(), 8) };
}

fn drain(eventfd: &File) {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a local from an open eventfd (which has a count: its poll fired).
    unsafe { libc::read(eventfd.as_raw_fd(), (&raw mut count).cast(), 8) };
}

/// The number of queues the kernel makes: one per possible CPU (`num_possible_cpus()`).
fn possible_cpus() -> io::Result<usize> {
    let mask = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    count_cpus(mask.trim()).ok_or_else(|| {
        io::Error::other(format!(
            "/sys/devices/system/cpu/possible: cannot read {mask:?}"
        ))
    })
}

/// The CPUs in a list such as `0-3,8-11`.
fn count_cpus(list: &str) -> Option<usize> {
    list.split(',').try_fold(0, |n, range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
        Some(n + last.checked_sub(first)? + 1)
    })
}

/// Keeps the calling thread on `cpu`: the kernel queues a request on the queue of its caller's CPU,
/// so a worker of that queue on the same CPU runs where the caller just blocked, its caches warm.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity get valid pointers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            log::debug!(
                "FUSE over io_uring: cannot keep a worker on CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// A ring entry's buffers, at fixed addresses the kernel was given.
struct Buffers {
    header: Box<[u8; HEADER_LEN]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

// SAFETY: the iovecs point into the boxes beside them, which move with them.
unsafe impl Send for Buffers {}

/// One worker's ring entry, and what a reply from any thread needs to reach it. Only the worker
/// touches its io_uring: a reply from another thread is handed over (`replied`, then `wake`), so
/// that every command is submitted by the worker's task, in whose context the kernel later copies
/// the entry's next request (a command submitted by a thread that has since exited is cancelled).
pub(crate) struct Ring {
    buffers: Mutex<Buffers>,
    /// A reply is in the buffers, to be committed by the worker.
    replied: AtomicBool,
    /// Written by a reply from another thread than the worker, to wake it.
    wake: File,
    device: Channel,
    qid: u16,
    /// The request being answered (its unique id), or 0 before the first.
    commit_id: AtomicU64,
    worker: OnceLock<ThreadId>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("qid", &self.qid)
            .finish_non_exhaustive()
    }
}

impl Ring {
    fn new(device: Channel, qid: u16, payload: usize) -> io::Result<Self> {
        let mut header = Box::new([0u8; HEADER_LEN]);
        let mut payload = vec![0u8; payload].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Ok(Self {
            buffers: Mutex::new(Buffers {
                header,
                payload,
                iov,
            }),
            replied: AtomicBool::new(false),
            wake: eventfd()?,
            device,
            qid,
            commit_id: AtomicU64::new(0),
            worker: OnceLock::new(),
        })
    }

    /// Serves requests from this ring until the connection ends or `stop` is written; an error is
    /// a command the kernel refused, after which this entry serves nothing more.
    pub(crate) fn serve<FS: Filesystem>(
        self: &Arc<Self>,
        mut uring: Uring,
        se: &SessionEventLoop<FS>,
        stop: i32,
    ) -> io::Result<()> {
        let _ = self.worker.set(std::thread::current().id());
        pin_to_cpu(usize::from(self.qid));
        push(&mut uring, &poll(stop, STOP))?;
        push(&mut uring, &poll(self.wake.as_raw_fd(), WAKE))?;
        push(&mut uring, &self.command())?;
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();
        loop {
            match uring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            }
            let done: Vec<(u64, i32)> = uring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            let mut stopped = false;
            for (tag, result) in done {
                match (tag, -result) {
                    (STOP, _) => stopped = true,
                    (WAKE, _) => {
                        drain(&self.wake);
                        push(&mut uring, &poll(self.wake.as_raw_fd(), WAKE))?;
                    }
                    (_, 0) => self.handle(se, buf),
                    (_, libc::EAGAIN | libc::EINTR) => push(&mut uring, &self.command())?,
                    // The connection ended: unmounted or aborted.
                    (_, libc::ENOTCONN | libc::ENODEV | libc::ECONNABORTED) => return Ok(()),
                    (_, errno) => return Err(io::Error::from_raw_os_error(errno)),
                }
                if self.replied.swap(false, Ordering::AcqRel) {
                    push(&mut uring, &self.command())?;
                }
            }
            // After the batch, so that a request that came with the stop is still answered.
            if stopped {
                return Ok(());
            }
        }
    }

    /// The entry's next command: its registration, or the commit of the request it answered.
    fn command(&self) -> squeue::Entry128 {
        let commit_id = self.commit_id.load(Ordering::Acquire);
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let fd = types::Fd(self.device.as_fd().as_raw_fd());
        if commit_id == 0 {
            let iov = self.buffers.lock().iov.as_ptr() as u64;
            with_len(
                opcode::UringCmd80::new(fd, CMD_REGISTER)
                    .cmd(cmd)
                    .addr(Some(iov))
                    .build(),
                2,
            )
            .user_data(ENTRY)
        } else {
            opcode::UringCmd80::new(fd, CMD_COMMIT_AND_FETCH)
                .cmd(cmd)
                .build()
                .user_data(ENTRY)
        }
    }

    /// Dispatches the request in the entry, copied into `buf` as `/dev/fuse` would have read it.
    /// A filesystem method that panics has its request answered with EIO (its reply is dropped)
    /// and the worker goes on, as a thread reading `/dev/fuse` would leave others to.
    fn handle<FS: Filesystem>(self: &Arc<Self>, se: &SessionEventLoop<FS>, buf: &mut [u8]) {
        let assembled = assemble(&self.buffers.lock(), buf);
        let (unique, len) = assembled.unwrap_or_else(|(unique, e)| {
            error!("FUSE over io_uring: {e}");
            (unique, 0)
        });
        self.commit_id.store(unique, Ordering::Release);
        let sender = ReplySender::Uring(Slot { ring: self.clone() });
        let request = (len > 0)
            .then(|| RequestWithSender::new(sender.clone(), &buf[..len]))
            .flatten();
        let Some(req) = request else {
            return <ReplyRaw as Reply>::new(ll::RequestId(unique), sender).error(ll::Errno::EIO);
        };
        let dispatched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if matches!(req.request.operation(), Ok(Operation::Destroy(_))) {
                req.reply::<ReplyEmpty>().ok();
            } else {
                req.dispatch(se);
            }
        }));
        if dispatched.is_err() {
            error!("FUSE over io_uring: a filesystem method panicked; its request gets EIO");
        }
    }
}

fn poll(fd: i32, tag: u64) -> squeue::Entry128 {
    opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
        .build()
        .user_data(tag)
        .into()
}

/// Queues `entry`; the worker's next wait submits it.
fn push(uring: &mut Uring, entry: &squeue::Entry128) -> io::Result<()> {
    // SAFETY: what the entry points to (the registration's iovecs) lives as long as the ring.
    unsafe { uring.submission().push(entry) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))
}

/// Copies the request in an entry into `out` as one message (header, first argument, payload), as
/// fuser's parser takes it; returns its unique id and length, or the id and why it cannot be read.
fn assemble(b: &Buffers, out: &mut [u8]) -> Result<(u64, usize), (u64, String)> {
    let word = |at: usize| u32::from_ne_bytes(b.header[at..at + 4].try_into().expect("4 bytes"));
    let unique = u64::from_ne_bytes(
        b.header[COMMIT_ID..COMMIT_ID + 8]
            .try_into()
            .expect("8 bytes"),
    );
    let (len, payload) = (word(0) as usize, word(PAYLOAD_SZ) as usize);
    let op_in = len
        .checked_sub(IN_HEADER_LEN + payload)
        .filter(|n| *n <= OP_IN_LEN);
    let Some(op_in) = op_in.filter(|_| payload <= b.payload.len() && len <= out.len()) else {
        return Err((
            unique,
            format!("request of {len} bytes with a payload of {payload} does not fit its entry"),
        ));
    };
    out[..IN_HEADER_LEN].copy_from_slice(&b.header[..IN_HEADER_LEN]);
    out[IN_HEADER_LEN..IN_HEADER_LEN + op_in].copy_from_slice(&b.header[OP_IN..OP_IN + op_in]);
    out[IN_HEADER_LEN + op_in..len].copy_from_slice(&b.payload[..payload]);
    Ok((unique, len))
}

/// Where the reply to a request that came in a ring entry goes: into that entry, then committed
/// by the entry's worker.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    ring: Arc<Ring>,
}

impl Slot {
    /// The session's `/dev/fuse`, for what goes only through it (backing files).
    pub(crate) fn device(&self) -> ChannelSender {
        self.ring.device.sender()
    }

    /// Writes a reply (`fuse_out_header` and its arguments, as for `/dev/fuse`) into the entry and
    /// hands it to the worker to commit: at once if this is the worker, by waking it otherwise.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let written = write_reply(&mut self.ring.buffers.lock(), data);
        self.ring.replied.store(true, Ordering::Release);
        if self.ring.worker.get() != Some(&std::thread::current().id()) {
            signal(&self.ring.wake);
        }
        written
    }
}

/// Splits a reply between the entry's header (its `fuse_out_header`) and payload (the rest); one
/// too large for the payload is replaced by EIO.
fn write_reply(b: &mut Buffers, data: &[IoSlice<'_>]) -> io::Result<()> {
    let total: usize = data.iter().map(|d| d.len()).sum();
    let fits = total >= OUT_HEADER_LEN && total - OUT_HEADER_LEN <= b.payload.len();
    let mut at = 0;
    for part in data.iter().filter(|_| fits) {
        for (i, byte) in part.iter().enumerate() {
            let to = at + i;
            if to < OUT_HEADER_LEN {
                b.header[to] = *byte;
            } else {
                b.payload[to - OUT_HEADER_LEN] = *byte;
            }
        }
        at += part.len();
    }
    let payload = if fits { total - OUT_HEADER_LEN } else { 0 };
    b.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(payload as u32).to_ne_bytes());
    if fits {
        return Ok(());
    }
    b.header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    Err(io::Error::other(format!(
        "a reply of {total} bytes does not fit a ring entry"
    )))
}

/// `entry` with the io_uring_sqe's `len` set, which `UringCmd80` has no setter for (the kernel
/// wants the number of iovecs a registration's `addr` points to there).
fn with_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const { assert!(size_of::<squeue::Entry128>() == 128) };
    // SAFETY: `Entry128` is `repr(C)`: the kernel's 64-byte `io_uring_sqe`, whose `len` is the u32
    // at byte 24, then 64 bytes of command; every bit pattern of it is valid.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(bytes) }
}

#[cfg(test)]
mod test {
    use super::*;

    fn buffers(payload: usize) -> Buffers {
        let mut header = Box::new([0u8; HEADER_LEN]);
        let mut payload = vec![0u8; payload].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Buffers {
            header,
            payload,
            iov,
        }
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0-1"), Some(2));
        assert_eq!(count_cpus("0-3,8-11"), Some(8));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus(""), None);
    }

    #[test]
    fn a_request_is_assembled_as_dev_fuse_delivers_it() {
        // A WRITE: its `fuse_write_in` (40 bytes) in `op_in`, its data in the payload.
        let mut b = buffers(MIN_PAYLOAD);
        let len = (IN_HEADER_LEN + 40 + 5) as u32;
        b.header[..4].copy_from_slice(&len.to_ne_bytes());
        b.header[4..8].copy_from_slice(&16u32.to_ne_bytes());
        b.header[8..16].copy_from_slice(&77u64.to_ne_bytes());
        b.header[OP_IN..OP_IN + 40].fill(7);
        b.header[COMMIT_ID..COMMIT_ID + 8].copy_from_slice(&77u64.to_ne_bytes());
        b.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&5u32.to_ne_bytes());
        b.payload[..5].copy_from_slice(b"hello");
        let mut out = vec![0u8; 4096];
        assert_eq!(assemble(&b, &mut out), Ok((77, len as usize)));
        assert_eq!(&out[..IN_HEADER_LEN], &b.header[..IN_HEADER_LEN]);
        assert_eq!(&out[IN_HEADER_LEN..IN_HEADER_LEN + 40], &[7u8; 40]);
        assert_eq!(&out[IN_HEADER_LEN + 40..len as usize], b"hello");
    }

    #[test]
    fn a_request_that_cannot_fit_is_refused_with_its_id() {
        let mut b = buffers(MIN_PAYLOAD);
        // A first argument longer than `op_in` holds.
        b.header[..4].copy_from_slice(&((IN_HEADER_LEN + 200) as u32).to_ne_bytes());
        b.header[COMMIT_ID..COMMIT_ID + 8].copy_from_slice(&9u64.to_ne_bytes());
        assert!(matches!(assemble(&b, &mut [0u8; 4096]), Err((9, _))));
        // A payload larger than the entry's.
        b.header[PAYLOAD_SZ..PAYLOAD_SZ + 4]
            .copy_from_slice(&(MIN_PAYLOAD as u32 + 1).to_ne_bytes());
        b.header[..4].copy_from_slice(&((IN_HEADER_LEN + MIN_PAYLOAD + 1) as u32).to_ne_bytes());
        assert!(matches!(
            assemble(&b, &mut vec![0u8; 2 * MIN_PAYLOAD]),
            Err((9, _))
        ));
    }

    #[test]
    fn a_reply_is_split_between_header_and_payload() {
        let mut b = buffers(MIN_PAYLOAD);
        let header = [1u8; OUT_HEADER_LEN];
        // The header and the data may come in any slices.
        let parts = [
            IoSlice::new(&header[..10]),
            IoSlice::new(&header[10..]),
            IoSlice::new(b"abc"),
            IoSlice::new(b"de"),
        ];
        write_reply(&mut b, &parts).unwrap();
        assert_eq!(&b.header[..OUT_HEADER_LEN], &header);
        assert_eq!(&b.payload[..5], b"abcde");
        assert_eq!(b.header[PAYLOAD_SZ..PAYLOAD_SZ + 4], 5u32.to_ne_bytes());
    }

    #[test]
    fn a_reply_too_large_for_the_entry_becomes_eio() {
        let mut b = buffers(MIN_PAYLOAD);
        let header = [0u8; OUT_HEADER_LEN];
        let data = vec![2u8; MIN_PAYLOAD + 1];
        assert!(write_reply(&mut b, &[IoSlice::new(&header), IoSlice::new(&data)]).is_err());
        assert_eq!(b.header[4..8], (-libc::EIO).to_ne_bytes());
        assert_eq!(b.header[PAYLOAD_SZ..PAYLOAD_SZ + 4], 0u32.to_ne_bytes());
    }

    #[test]
    fn a_registration_names_its_two_iovecs() {
        let entry = with_len(
            opcode::UringCmd80::new(types::Fd(3), CMD_REGISTER)
                .addr(Some(0x1000))
                .build(),
            2,
        );
        // SAFETY: as in `with_len`.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
        assert_eq!(bytes[0], opcode::UringCmd80::CODE);
        assert_eq!(bytes[16..24], 0x1000u64.to_ne_bytes());
        assert_eq!(bytes[24..28], 2u32.to_ne_bytes());
    }
}
