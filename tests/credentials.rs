//! Where an S3 store looks for credentials when none are given, seen from outside: the `shardfs`
//! binary run with a bare environment (no keys, no profile) against a local listener standing in
//! for the instance metadata service (`AWS_METADATA_ENDPOINT`, which object_store reads), which
//! records every request and answers 404. Without `AWS_EC2_METADATA_DISABLED` the chain ends
//! there, as on an EC2 instance; with it `true`, as the AWS CLI and SDKs honour it, nothing is
//! asked of that address, and the command fails at once in one line naming the variable.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};

mod common;

use common::TempDir;

/// A listener on loopback that answers every request 404 and keeps its request lines.
fn metadata_service() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            seen.lock().unwrap().push(line.trim().to_string());
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (address, asked)
}

/// `shardfs info` of a bucket on a server that is never reached (credentials come first), with
/// only `extra` in the environment beside the metadata endpoint and an empty home.
fn info_without_credentials(home: &TempDir, metadata: &str, extra: &[(&str, &str)]) -> std::process::Output {
    let s3 = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", s3.local_addr().unwrap());
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardfs"));
    command
        .args(["info", "s3://bucket/data.zarr", "--endpoint-url", &endpoint])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_METADATA_ENDPOINT", metadata);
    for (name, value) in extra {
        command.env(name, value);
    }
    command.output().unwrap()
}

#[test]
fn instance_metadata_is_asked_only_where_it_is_not_disabled() {
    let home = TempDir::new("credentials");
    let (metadata, asked) = metadata_service();

    let out = info_without_credentials(&home, &metadata, &[]);
    assert!(!out.status.success());
    assert!(!asked.lock().unwrap().is_empty(), "the chain ends at instance metadata");

    asked.lock().unwrap().clear();
    for disabled in ["true", "TRUE"] {
        let out = info_without_credentials(&home, &metadata, &[("AWS_EC2_METADATA_DISABLED", disabled)]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(asked.lock().unwrap().as_slice(), [] as [String; 0], "{stderr}");
        assert!(stderr.contains("AWS_EC2_METADATA_DISABLED") && stderr.trim().lines().count() == 1, "{stderr}");
    }

    // Any other value leaves it on, as the AWS CLI reads it.
    let out = info_without_credentials(&home, &metadata, &[("AWS_EC2_METADATA_DISABLED", "false")]);
    assert!(!out.status.success());
    assert!(!asked.lock().unwrap().is_empty());
}
