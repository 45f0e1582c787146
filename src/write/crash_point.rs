//! A fault-injection hook: every byte a commit writes (and every rename, unlink or truncate,
//! counted as one byte) goes through a [`CrashPoint`], which can stop the commit dead after a
//! given number of bytes, leaving the files exactly as a killed process would. Production code
//! uses [`CrashPoint::never`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Where a simulated crash happens.
#[derive(Debug, Clone)]
pub struct CrashPoint {
    remaining: Option<u64>,
}

/// What a step reports when the simulated crash happened in it.
#[derive(Debug)]
pub enum Step {
    Io(io::Error),
    Crashed,
}

impl From<io::Error> for Step {
    fn from(e: io::Error) -> Self {
        Step::Io(e)
    }
}

impl CrashPoint {
    /// No crash: every step runs.
    pub fn never() -> Self {
        CrashPoint { remaining: None }
    }

    /// Crash once `bytes` bytes (and steps) have gone through.
    pub fn after(bytes: u64) -> Self {
        CrashPoint { remaining: Some(bytes) }
    }

    /// Writes `buf` at `offset`, or as much of it as the crash point allows.
    pub fn write_at(&mut self, file: &File, buf: &[u8], offset: u64) -> Result<(), Step> {
        match self.remaining {
            None => Ok(file.write_all_at(buf, offset)?),
            Some(left) if left >= buf.len() as u64 && left > 0 => {
                self.remaining = Some(left - buf.len() as u64);
                Ok(file.write_all_at(buf, offset)?)
            }
            Some(left) => {
                file.write_all_at(&buf[..left as usize], offset)?;
                self.remaining = Some(0);
                Err(Step::Crashed)
            }
        }
    }

    /// Runs one indivisible step (a rename, an unlink, a truncate), unless the crash comes first.
    pub fn step<T>(&mut self, op: impl FnOnce() -> io::Result<T>) -> Result<T, Step> {
        match self.remaining {
            Some(0) => Err(Step::Crashed),
            Some(left) => {
                self.remaining = Some(left - 1);
                Ok(op()?)
            }
            None => Ok(op()?),
        }
    }
}
