//! Load generator for `scripts/bench.sh`: COUNT reads (open, read to the end, close) of chunk
//! files CHUNK_DIR/<n>, n drawn from a fixed pseudo-random sequence below TOTAL, split over
//! THREADS threads. Native threads, so that the file system and not the load generator is measured.
//!
//!     random_reads CHUNK_DIR COUNT THREADS TOTAL

use std::io::Read;
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, count, threads, total] = args.as_slice() else {
        eprintln!("usage: random_reads CHUNK_DIR COUNT THREADS TOTAL");
        std::process::exit(2);
    };
    let number = |s: &str| -> u64 {
        s.parse().unwrap_or_else(|_| {
            eprintln!("random_reads: {s}: not a number");
            std::process::exit(2)
        })
    };
    let (count, threads, total) = (number(count), number(threads).max(1), number(total).max(1));
    let chunks = PathBuf::from(dir);
    // A 64-bit LCG: the same sequence for every file system measured.
    let mut state: u64 = 42;
    let picks: Vec<u64> = (0..count)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % total
        })
        .collect();
    let read: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads as usize)
            .map(|t| {
                let (picks, chunks) = (&picks, &chunks);
                scope.spawn(move || {
                    let mut buf = Vec::new();
                    let mut bytes = 0;
                    for n in picks.iter().skip(t).step_by(threads as usize) {
                        let path = chunks.join(n.to_string());
                        let mut file = std::fs::File::open(&path).unwrap_or_else(|e| fail(&path, e));
                        buf.clear();
                        bytes += file.read_to_end(&mut buf).unwrap_or_else(|e| fail(&path, e)) as u64;
                    }
                    bytes
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("reader thread")).sum()
    });
    if count > 0 && read == 0 {
        eprintln!("random_reads: read nothing");
        std::process::exit(1);
    }
}

fn fail(path: &std::path::Path, e: std::io::Error) -> ! {
    eprintln!("random_reads: {}: {e}", path.display());
    std::process::exit(1)
}
