//! The files that passed Berkeley DB's verifier, remembered between mounts, so that mounting an
//! unchanged file again skips the verifier's pass over every page (0.7 s of a 256 MiB file).
//!
//! A file is known by its stamp: device, inode, size, and the times of its last change of data
//! (`mtime`) and of inode (`ctime`, which nothing but the kernel sets). Any write to the file, by
//! any process, gives it another stamp, and it is verified again. As git does for its index, a
//! stamp is remembered only when the file's last change is older than [`SETTLED`]: within one
//! tick of the file system's clock, a write right after the stamp was taken could leave its
//! times as they were. What a stamp cannot see is damage that changes no time (a failing disk
//! rotting a page between mounts), nor times set back by hand where a file system lets a user
//! set `ctime` (some network and FUSE file systems, vfat volumes written elsewhere): the stamp
//! is as trustworthy as the file system's `ctime`, which on Linux's native file systems only the
//! kernel sets.
//!
//! The record is a text file of one stamp a line, in `$XDG_CACHE_HOME/shardfs` (else
//! `~/.cache/shardfs`), the newest [`KEPT`] stamps. Lines that do not parse are ignored, a
//! record that cannot be read or written costs a verification, never a mount.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long ago a file's last change must be for its stamp to be trusted.
const SETTLED: Duration = Duration::from_secs(2);
/// How many stamps the record keeps, the newest.
const KEPT: usize = 1000;

/// What identifies one content of one file, as long as nobody writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    /// The stamp of the open `file`, if its last change is settled.
    pub fn of(file: &std::fs::File) -> Option<Stamp> {
        let meta = file.metadata().ok()?;
        let nanos = |secs: i64, ns: i64| i128::from(secs) * 1_000_000_000 + i128::from(ns);
        let stamp = Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: nanos(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: nanos(meta.ctime(), meta.ctime_nsec()),
        };
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok()?.as_nanos() as i128;
        let settled = SETTLED.as_nanos() as i128;
        (now - stamp.mtime_ns.max(stamp.ctime_ns) > settled).then_some(stamp)
    }

    fn line(&self) -> String {
        format!("{} {} {} {} {}", self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns)
    }

    fn parse(line: &str) -> Option<Stamp> {
        let mut words = line.split(' ');
        let mut next = || words.next()?.parse::<i128>().ok();
        let stamp = Stamp {
            dev: next()?.try_into().ok()?,
            ino: next()?.try_into().ok()?,
            size: next()?.try_into().ok()?,
            mtime_ns: next()?,
            ctime_ns: next()?,
        };
        Some(stamp)
    }
}

/// The record of verified files, at one path.
pub struct Record(Option<PathBuf>);

impl Record {
    /// The user's record, if there is a cache directory to keep it in.
    pub fn of_user() -> Record {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| Path::new(d).is_absolute())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")));
        Record(base.map(|base| base.join("shardfs").join("berkeley-db-verified")))
    }

    #[cfg(test)]
    pub fn at(path: PathBuf) -> Record {
        Record(Some(path))
    }

    fn stamps(&self) -> Vec<Stamp> {
        let Some(path) = &self.0 else { return Vec::new() };
        std::fs::read_to_string(path).map(|text| text.lines().filter_map(Stamp::parse).collect()).unwrap_or_default()
    }

    /// True when a file of this stamp passed the verifier.
    pub fn holds(&self, stamp: &Stamp) -> bool {
        self.stamps().contains(stamp)
    }

    /// Remembers that a file of this stamp passed the verifier; a failure is logged and
    /// otherwise ignored (the file is verified again next time).
    pub fn remember(&self, stamp: Stamp) {
        let Some(path) = &self.0 else { return };
        let mut stamps = self.stamps();
        stamps.retain(|s| s != &stamp);
        stamps.push(stamp);
        let keep = &stamps[stamps.len().saturating_sub(KEPT)..];
        let text: String = keep.iter().map(|s| s.line() + "\n").collect();
        // Written aside and renamed over, so that a reader sees the old record or the new one.
        let written = (|| {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
            let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let aside = path.with_extension(format!("{}.{nanos}.tmp", std::process::id()));
            let mut file = std::fs::File::create(&aside)?;
            file.write_all(text.as_bytes())?;
            std::fs::rename(&aside, path)
        })();
        if let Err(e) = written {
            log::info!("{}: verified files not recorded: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settled_file_is_remembered_by_its_stamp_and_a_write_gives_it_another() {
        let dir = std::env::temp_dir().join(format!("shardfs-verified-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("file.db");
        std::fs::write(&path, b"pages").unwrap();
        // Just written: not settled, so not stamped.
        assert_eq!(Stamp::of(&std::fs::File::open(&path).unwrap()), None);
        std::thread::sleep(SETTLED + Duration::from_millis(200));
        let stamp = Stamp::of(&std::fs::File::open(&path).unwrap()).expect("settled");
        let record = Record::at(dir.join("cache").join("verified"));
        assert!(!record.holds(&stamp));
        record.remember(stamp);
        assert!(record.holds(&stamp));
        // Damaged lines are ignored, the rest still read.
        let recorded = std::fs::read_to_string(dir.join("cache").join("verified")).unwrap();
        std::fs::write(dir.join("cache").join("verified"), format!("junk\n1 2\n{recorded}")).unwrap();
        assert!(record.holds(&stamp));
        // Written again with the same size: another stamp, once settled; none before.
        std::fs::write(&path, b"PAGES").unwrap();
        assert_eq!(Stamp::of(&std::fs::File::open(&path).unwrap()), None);
        std::thread::sleep(SETTLED + Duration::from_millis(200));
        let after = Stamp::of(&std::fs::File::open(&path).unwrap()).expect("settled");
        assert_ne!(after, stamp);
        assert!(!record.holds(&after));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
