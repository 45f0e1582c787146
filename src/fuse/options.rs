//! Mount options as mount(8) spells them (`-o allow_other,ro,...`), checked before anything is
//! mounted, and turned into fuser's configuration.

/// How to mount: `-o` options as mount(8) spells them, and the worker thread count.
#[derive(Debug, Clone)]
pub struct MountSettings {
    pub options: Vec<String>,
    pub threads: usize,
    /// Mount read-only (also set by `-o ro`).
    pub read_only: bool,
    /// Take the kernel's requests over io_uring where it offers that (`--io-uring`).
    pub io_uring: bool,
}

impl MountSettings {
    /// True when the mount must reject every write.
    pub fn is_read_only(&self) -> bool {
        self.read_only || self.options.iter().any(|o| o == "ro")
    }
}

/// Checks `-o` options without mounting, so that a typo fails before anything happens.
pub fn check_options(settings: &MountSettings) -> Result<(), String> {
    config(settings).map(|_| ())
}

pub(super) fn config(settings: &MountSettings) -> Result<fuser::Config, String> {
    use fuser::{MountOption as O, SessionACL};
    let mut config = fuser::Config::default();
    let access = if settings.is_read_only() { O::RO } else { O::RW };
    // default_permissions: the kernel checks every access against the mode, owner and group the
    // view reports (the backing files' own), as on any local filesystem.
    config.mount_options =
        vec![access, O::FSName("shardfs".into()), O::Subtype("shardfs".into()), O::DefaultPermissions];
    for option in settings.options.iter().filter(|o| !passed_along(o)) {
        let parsed = match option.as_str() {
            "ro" => O::RO,
            "rw" if settings.read_only => return Err("-o rw contradicts --read-only".into()),
            "rw" => O::RW,
            "allow_other" => {
                config.acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                config.acl = SessionACL::RootAndOwner;
                continue;
            }
            "default_permissions" => O::DefaultPermissions,
            "auto_unmount" => O::AutoUnmount,
            "dev" => O::Dev,
            "nodev" => O::NoDev,
            "suid" => O::Suid,
            "nosuid" => O::NoSuid,
            "exec" => O::Exec,
            "noexec" => O::NoExec,
            "atime" => O::Atime,
            "noatime" => O::NoAtime,
            "sync" => O::Sync,
            "async" => O::Async,
            "dirsync" => O::DirSync,
            s if s.starts_with("fsname=") => O::FSName(s["fsname=".len()..].into()),
            s if s.starts_with("subtype=") => O::Subtype(s["subtype=".len()..].into()),
            other => return Err(format!("-o {other}: unknown mount option")),
        };
        config.mount_options.retain(|o| std::mem::discriminant(o) != std::mem::discriminant(&parsed));
        config.mount_options.push(parsed);
    }
    if config.mount_options.contains(&O::AutoUnmount) && config.acl == SessionACL::Owner {
        return Err("-o auto_unmount needs -o allow_other or -o allow_root".into());
    }
    config.n_threads = Some(settings.threads.max(1));
    config.clone_fd = settings.threads > 1;
    config.io_uring = settings.io_uring;
    Ok(config)
}

/// Options that mount(8), fstab and systemd hand every helper (mount.fuse3 drops some of them,
/// mount(8) others, but not always both), which concern them rather than the filesystem: ignored,
/// as libfuse filesystems do. The atime variants and the like that fuser cannot pass to the kernel
/// are ignored too: a FUSE filesystem's atimes are the daemon's to report anyway.
fn passed_along(option: &str) -> bool {
    const IGNORED: &[&str] = &[
        "defaults",
        "auto",
        "noauto",
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "nofail",
        "_netdev",
        "netdev",
        "relatime",
        "norelatime",
        "strictatime",
        "nostrictatime",
        "diratime",
        "nodiratime",
        "lazytime",
        "nolazytime",
        "iversion",
        "noiversion",
        "mand",
        "nomand",
        "silent",
        "loud",
    ];
    const IGNORED_PREFIXES: &[&str] = &["x-", "comment=", "user="];
    IGNORED.contains(&option) || IGNORED_PREFIXES.iter().any(|p| option.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(options: &[&str]) -> MountSettings {
        MountSettings {
            options: options.iter().map(|s| s.to_string()).collect(),
            threads: 2,
            read_only: false,
            io_uring: false,
        }
    }

    #[test]
    fn accepts_what_mount_users_type() {
        let c = config(&settings(&["allow_other", "default_permissions", "fsname=data", "noatime"])).unwrap();
        assert_eq!(c.acl, fuser::SessionACL::All);
        assert!(c.mount_options.contains(&fuser::MountOption::FSName("data".into())));
        assert!(!c.mount_options.contains(&fuser::MountOption::FSName("shardfs".into())));
        assert!(c.mount_options.contains(&fuser::MountOption::RW));
        let ro = config(&settings(&["ro"])).unwrap();
        assert!(
            ro.mount_options.contains(&fuser::MountOption::RO) && !ro.mount_options.contains(&fuser::MountOption::RW)
        );
        assert_eq!(c.n_threads, Some(2));
    }

    #[test]
    fn ignores_what_mount_and_systemd_pass_along() {
        // What mount(8) and mount.fuse3 3.14 passed to a stand-in helper for an fstab line with
        // all of these (scripts/mount-helper-test.sh runs the real thing).
        let passed = ["rw", "noatime", "relatime", "nodiratime", "lazytime", "dev", "suid", "user=alice"];
        let others = ["defaults", "noauto", "auto", "users", "nofail", "_netdev", "x-systemd.automount", "comment=x"];
        let all: Vec<&str> = passed.iter().chain(&others).copied().collect();
        let c = config(&settings(&all)).unwrap();
        let plain = config(&settings(&["rw", "noatime", "dev", "suid"])).unwrap();
        assert_eq!(c.mount_options, plain.mount_options);
        assert_eq!(c.acl, plain.acl);
    }

    #[test]
    fn rejects_unknown_and_conflicting_options() {
        assert!(config(&settings(&["bogus"])).unwrap_err().contains("bogus"));
        assert!(config(&settings(&["auto_unmount"])).unwrap_err().contains("allow_other"));
        let read_only = MountSettings { read_only: true, ..settings(&["rw"]) };
        assert!(config(&read_only).is_err());
    }
}
