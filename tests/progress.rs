//! Progress of `check`, `info` and `compact`: the commands report every shard through the
//! `Progress` trait (counted here by a recorder), and the binary shows a bar with rate and ETA on
//! a terminal (a pseudo-terminal from script(1)) and nothing when its output is not one.

mod common;

use std::process::{Command, Output};
use std::sync::Mutex;

use common::{golden, sharded_copy};
use shardfs::compact::compact_command;
use shardfs::inspect::scan_reporting;
use shardfs::progress::Progress;
use shardfs::store::LocalStore;

const BIN: &str = env!("CARGO_BIN_EXE_shardfs");

/// Every call, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Progress for Recorder {
    fn start(&self, shards: u64) {
        self.0.lock().unwrap().push(format!("start {shards}"));
    }
    fn array(&self, dir: &str) {
        self.0.lock().unwrap().push(format!("array {dir}"));
    }
    fn shard_done(&self) {
        self.0.lock().unwrap().push("done".into());
    }
    fn finish(&self) {
        self.0.lock().unwrap().push("finish".into());
    }
}

impl Recorder {
    /// Checks the calls' shape: one start with the total, each array's shards after its name, the
    /// total reached, one finish at the end. Returns the arrays in order.
    fn arrays(&self, total: u64) -> Vec<String> {
        let calls = self.0.lock().unwrap().clone();
        assert_eq!(calls.first(), Some(&format!("start {total}")), "{calls:?}");
        assert_eq!(calls.last().map(String::as_str), Some("finish"), "{calls:?}");
        assert_eq!(calls.iter().filter(|c| *c == "done").count() as u64, total, "{calls:?}");
        assert_eq!(calls.iter().filter(|c| c.starts_with("start") || *c == "finish").count(), 2);
        assert_ne!(calls.get(1).map(String::as_str), Some("done"), "a shard before its array: {calls:?}");
        calls.iter().filter_map(|c| c.strip_prefix("array ").map(str::to_string)).collect()
    }
}

#[test]
fn check_and_info_report_every_shard() {
    let store = LocalStore::open(&golden().join("sharded")).unwrap();
    let recorder = Recorder::default();
    let report = scan_reporting(&store, &recorder).unwrap();
    let total: u64 = report.arrays.iter().map(|a| a.shards).sum();
    assert_eq!(total, 56);
    let dirs: Vec<String> = report.arrays.iter().map(|a| a.dir.clone()).collect();
    assert_eq!(recorder.arrays(total), dirs);
}

#[test]
fn compact_reports_every_shard_it_goes_through() {
    let copy = sharded_copy();
    let store = LocalStore::open(copy.path()).unwrap();
    let recorder = Recorder::default();
    let only = ["zp/raw_nocrc".to_string(), "zp/zstd_start".to_string()];
    let totals = compact_command(&store, &only, &recorder).unwrap();
    assert_eq!(totals.shards, 3 + 8);
    assert_eq!(recorder.arrays(totals.shards), ["zp/raw_nocrc", "zp/zstd_start"]);
}

/// `shardfs ARGS` on a pseudo-terminal: everything it wrote there, escape sequences included.
/// TERM names a real terminal: under the caller's TERM=dumb (CI runners, `env -i`) no bar is
/// drawn, rightly, since a dumb terminal cannot redraw a line.
fn on_terminal(args: &str) -> String {
    let out = Command::new("script")
        .args(["-qec", &format!("{BIN} {args}"), "/dev/null"])
        .env("TERM", "xterm-256color")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn piped(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    out
}

#[test]
fn a_terminal_shows_a_bar_with_rate_and_eta() {
    let store = golden().join("sharded");
    let copy = sharded_copy();
    // compact leaves the nested-sharding array's 2 shards out.
    for (args, verb, shards, report) in [
        (format!("check {}", store.display()), "checking", 56, "10 arrays checked"),
        (format!("info {}", store.display()), "scanning", 56, "zp/zstd_start"),
        (format!("compact {}", copy.path().display()), "compacting", 54, "54 shards, 0 rewritten"),
    ] {
        let shown = on_terminal(&args);
        let bar = format!("{verb} [");
        let count = format!("/{shards} shards, ");
        assert!(shown.contains(&bar) && shown.contains(&count), "{args}: no bar in {shown:?}");
        assert!(shown.contains("/s, ETA "), "{args}: no rate or ETA in {shown:?}");
        // The bar is cleared before the report, which is all that stays on the screen.
        let after_bar = &shown[shown.rfind("\x1b[2K").expect("the bar is cleared")..];
        assert!(!after_bar.contains(&bar) && after_bar.contains(report), "{args}: {after_bar:?}");
    }
}

#[test]
fn no_terminal_no_progress() {
    let store = golden().join("sharded");
    let copy = sharded_copy();
    let store = store.to_str().unwrap();
    for args in [&["check", store][..], &["info", store], &["compact", copy.path().to_str().unwrap()]] {
        let out = piped(args);
        assert!(out.stderr.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains('\x1b') && !stdout.contains('\r') && !stdout.contains("ETA"), "{args:?}: {stdout:?}");
    }
}
