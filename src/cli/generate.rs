//! `shardfs generate DIR`: the man pages and shell completions, made from
//! the same clap definitions as the command line so they cannot drift from it.

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use super::Cli;

/// Writes `DIR/man/shardfs.1` and one page per command (`shardfs-mount.1`, ...), and
/// `DIR/completions/` for bash (`shardfs.bash`), zsh (`_shardfs`) and fish (`shardfs.fish`).
pub fn write_all(dir: &Path) -> Result<(), String> {
    let failed = |what: &str, e: std::io::Error| format!("{}: cannot write {what}: {e}", dir.display());
    let man = dir.join("man");
    std::fs::create_dir_all(&man).map_err(|e| failed("man pages", e))?;
    clap_mangen::generate_to(Cli::command(), &man).map_err(|e| failed("man pages", e))?;
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions).map_err(|e| failed("completions", e))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut Cli::command(), "shardfs", &completions)
            .map_err(|e| failed("completions", e))?;
    }
    Ok(())
}
