//! The registry written in the Prometheus text exposition format (version 0.0.4, which Prometheus,
//! VictoriaMetrics, the OpenTelemetry collector and OpenMetrics-aware scrapers all read): written
//! here rather than through a client crate, because the set of metrics is fixed and small, and the
//! format for counters, gauges and histograms is a few lines of `format!`.

use std::fmt::Write;

use super::{LATENCY_BUCKETS, Snapshot};

/// The Content-Type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `snapshot` as exposition text.
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    let s = snapshot;
    header(&mut out, "shardfs_store_requests_total", "counter", "Requests to the backing store, by kind and outcome.");
    for ((kind, outcome), n) in &s.requests {
        sample(&mut out, "shardfs_store_requests_total", &[("kind", kind), ("outcome", outcome)], *n as f64);
    }
    let name = "shardfs_store_request_duration_seconds";
    header(&mut out, name, "histogram", "Time from sending a request to the backing store to its answer.");
    for (kind, histogram) in &s.latency {
        let mut below = 0;
        for (bound, n) in LATENCY_BUCKETS.iter().zip(histogram.buckets) {
            below += n;
            sample(&mut out, &format!("{name}_bucket"), &[("kind", kind), ("le", &bound.to_string())], below as f64);
        }
        sample(&mut out, &format!("{name}_bucket"), &[("kind", kind), ("le", "+Inf")], histogram.count as f64);
        sample(&mut out, &format!("{name}_sum"), &[("kind", kind)], histogram.sum);
        sample(&mut out, &format!("{name}_count"), &[("kind", kind)], histogram.count as f64);
    }
    let counters = [
        ("shardfs_store_received_bytes_total", "Bytes read from the backing store.", s.bytes_received),
        ("shardfs_store_sent_bytes_total", "Bytes written to the backing store.", s.bytes_sent),
    ];
    for (name, help, value) in counters {
        header(&mut out, name, "counter", help);
        sample(&mut out, name, &[], value as f64);
    }
    for (name, hit, help) in [
        ("shardfs_cache_hits_total", true, "Lookups that found what they looked for, by cache."),
        ("shardfs_cache_misses_total", false, "Lookups that had to ask the store, by cache."),
    ] {
        header(&mut out, name, "counter", help);
        for ((cache, _), n) in s.caches.iter().filter(|((_, h), _)| *h == hit) {
            sample(&mut out, name, &[("cache", cache)], *n as f64);
        }
    }
    let gauges = [
        ("shardfs_chunks_pending", "Chunks written and not yet committed into their shards.", s.chunks_pending),
        ("shardfs_pending_bytes", "Bytes held by chunks written and not yet committed.", s.bytes_pending),
        (
            "shardfs_inodes",
            "Files and directories of the mount the kernel holds an inode of (about 1 KiB of its memory each).",
            s.inodes,
        ),
    ];
    for (name, help, value) in gauges {
        header(&mut out, name, "gauge", help);
        sample(&mut out, name, &[], value as f64);
    }
    header(&mut out, "shardfs_commits_total", "counter", "Shard commits, by outcome.");
    for (outcome, n) in &s.commits {
        sample(&mut out, "shardfs_commits_total", &[("outcome", outcome)], *n as f64);
    }
    let name = "shardfs_lease_waits_total";
    header(&mut out, name, "counter", "Commits that found another writer's lease on their shard, by how they waited.");
    for (how, n) in &s.lease_waits {
        sample(&mut out, name, &[("how", how)], *n as f64);
    }
    let name = "shardfs_lease_takeovers_total";
    header(&mut out, name, "counter", "Commit leases taken over from a holder that stopped renewing them.");
    sample(&mut out, name, &[], s.lease_takeovers as f64);
    header(&mut out, "shardfs_errors_total", "counter", "Errors given to callers (FUSE requests), by errno.");
    for (errno, n) in &s.errors {
        sample(&mut out, "shardfs_errors_total", &[("errno", &errno_name(*errno))], *n as f64);
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let _ = write!(out, "{{{}}}", labels.join(","));
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the format quotes it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The symbolic name of `errno` where it is one callers meet, else its number.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ENOTTY => "ENOTTY",
        libc::ERANGE => "ERANGE",
        _ => return errno.to_string(),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Histogram;

    #[test]
    fn buckets_are_cumulative_and_labels_quoted() {
        let mut histogram = Histogram::default();
        histogram.buckets[0] = 2;
        histogram.buckets[2] = 1;
        histogram.count = 4;
        histogram.sum = 9.5;
        let snapshot = Snapshot {
            requests: vec![(("get", "ok"), 3)],
            latency: vec![("get", histogram)],
            errors: vec![(libc::ENOENT, 1), (4095, 2)],
            ..Snapshot::default()
        };
        let text = render(&snapshot);
        assert!(text.contains("shardfs_store_requests_total{kind=\"get\",outcome=\"ok\"} 3\n"), "{text}");
        assert!(text.contains("_bucket{kind=\"get\",le=\"0.001\"} 2\n"), "{text}");
        assert!(text.contains("_bucket{kind=\"get\",le=\"0.0025\"} 3\n"), "{text}");
        assert!(text.contains("_bucket{kind=\"get\",le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("shardfs_store_request_duration_seconds_sum{kind=\"get\"} 9.5\n"), "{text}");
        assert!(text.contains("shardfs_errors_total{errno=\"ENOENT\"} 1\n"), "{text}");
        assert!(text.contains("shardfs_errors_total{errno=\"4095\"} 2\n"), "{text}");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
