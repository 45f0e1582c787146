//! Where log lines go: stderr in the foreground, a file or syslog for a background daemon whose
//! terminal is gone. `RUST_LOG` overrides the level chosen with `-v`.

use std::ffi::CString;
use std::path::Path;

/// Where a process sends its log lines.
#[derive(Debug, Clone)]
pub enum LogTarget {
    Stderr,
    File(std::path::PathBuf),
    Syslog,
}

/// The default level for a `-v` count: warnings, then info, debug, trace.
fn level(verbosity: u8) -> log::LevelFilter {
    match verbosity {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        2 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    }
}

/// Installs the process's logger. Call once, after any fork.
pub fn init(target: &LogTarget, verbosity: u8) -> Result<(), String> {
    let mut builder = env_logger::Builder::new();
    // Milliseconds: a request's turns at cloud latency are tens of them apart.
    builder.filter_level(level(verbosity)).parse_default_env().format_timestamp_millis();
    match target {
        LogTarget::Stderr => {}
        LogTarget::File(path) => {
            builder.target(env_logger::Target::Pipe(Box::new(open_log(path)?)));
        }
        LogTarget::Syslog => {
            let filter = builder.build().filter();
            log::set_boxed_logger(Box::new(Syslog::new())).map_err(|e| e.to_string())?;
            log::set_max_level(filter);
            return Ok(());
        }
    }
    builder.try_init().map_err(|e| e.to_string())
}

fn open_log(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: cannot open log file: {e}", path.display()))
}

/// Sends log records to the system log as `shardfs[pid]`.
struct Syslog;

impl Syslog {
    fn new() -> Self {
        // SAFETY: the identifier is a static C string that outlives every syslog call.
        unsafe { libc::openlog(c"shardfs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        Syslog
    }
}

impl log::Log for Syslog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let priority = match record.level() {
            log::Level::Error => libc::LOG_ERR,
            log::Level::Warn => libc::LOG_WARNING,
            log::Level::Info => libc::LOG_INFO,
            log::Level::Debug | log::Level::Trace => libc::LOG_DEBUG,
        };
        let text = format!("{}", record.args()).replace('\0', " ");
        let message = CString::new(text).expect("NULs replaced");
        // SAFETY: "%s" with one valid C string argument.
        unsafe { libc::syslog(priority, c"%s".as_ptr(), message.as_ptr()) };
    }

    fn flush(&self) {}
}
