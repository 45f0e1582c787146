//! `shardfs generate DIR`: the man pages and completions the Debian package installs, read back
//! the way users meet them: `man -l` renders each page, bash and fish complete real command lines
//! with the generated scripts, and zsh parses its script. zsh and fish come from scripts/setup.sh.

mod common;

use std::path::Path;
use std::process::Command;

use common::TempDir;

const COMMANDS: &[&str] =
    &["mount", "unmount", "status", "check", "compact", "info", "refs", "demo", "csi", "generate"];

fn generate() -> TempDir {
    let dir = TempDir::new("generate");
    let out = Command::new(env!("CARGO_BIN_EXE_shardfs")).arg("generate").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}

fn run(program: &str, args: &[&str], cwd: &Path) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env("MANWIDTH", "200")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/setup.sh installs zsh and fish)"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{program} {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn man_pages_for_shardfs_and_each_command_render() {
    let dir = generate();
    let man = dir.path().join("man");
    let mut names: Vec<String> =
        std::fs::read_dir(&man).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut expected: Vec<String> = COMMANDS.iter().map(|c| format!("shardfs-{c}.1")).collect();
    expected.push("shardfs.1".into());
    expected.sort();
    assert_eq!(names, expected);

    // man-db with groff's warnings on: a page with broken roff fails here.
    let top = run("man", &["--warnings", "-l", "shardfs.1"], &man);
    assert!(top.contains("shardfs - Mount a sharded Zarr v3 store"), "{top}");
    for command in COMMANDS {
        assert!(top.contains(&format!("shardfs-{command}(1)")), "shardfs.1 does not list {command}");
    }
    assert!(top.contains("mount -t fuse.shardfs"), "shardfs.1 lacks the mount(8) helper form");
    let mount = run("man", &["--warnings", "-l", "shardfs-mount.1"], &man);
    assert!(mount.contains("shardfs-mount - Mount STORE at MOUNTPOINT"), "{mount}");
    for flag in [
        "--memory-limit <BYTES> [default: 1G]",
        "--cache-size <BYTES>",
        "--zarr-format <N>",
        "--endpoint-url <URL>",
        "--foreground",
    ] {
        assert!(mount.contains(flag), "shardfs-mount.1 lacks {flag}:\n{mount}");
    }
    let check = run("man", &["--warnings", "-l", "shardfs-check.1"], &man);
    assert!(check.contains("--repair"), "{check}");
}

#[test]
fn bash_completes_commands_and_flags() {
    let dir = generate();
    let script = dir.path().join("completions/shardfs.bash");
    let complete = |words: &str| {
        let program = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _shardfs shardfs \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        run("bash", &["-c", &program], dir.path())
    };
    let top = complete("shardfs ''");
    for command in COMMANDS {
        assert!(top.lines().any(|l| l == *command), "no {command} in {top}");
    }
    assert_eq!(complete("shardfs mount --cache"), "--cache\n--cache-size\n");
    assert_eq!(complete("shardfs check --rep"), "--repair\n");
}

#[test]
fn fish_completes_commands_and_flags() {
    let dir = generate();
    let source = format!("source {}", dir.path().join("completions/shardfs.fish").display());
    let top = run("fish", &["-c", &format!("{source}; complete -C 'shardfs '")], dir.path());
    for command in COMMANDS {
        assert!(top.lines().any(|l| l.starts_with(&format!("{command}\t"))), "no {command} in {top}");
    }
    let flag = run("fish", &["-c", &format!("{source}; complete -C 'shardfs mount --zarr'")], dir.path());
    assert!(flag.starts_with("--zarr-format\t"), "{flag}");
}

#[test]
fn zsh_parses_its_completion() {
    let dir = generate();
    let script = dir.path().join("completions/_shardfs");
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.starts_with("#compdef shardfs"), "{text}");
    assert!(text.contains("--cache-size=") && text.contains("'mount:"), "{text}");
    run("zsh", &["-n", script.to_str().unwrap()], dir.path());
}
