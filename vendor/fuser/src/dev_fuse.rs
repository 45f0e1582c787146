use std::fs::File;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;

/// A newtype for `File` that represents the `/dev/fuse` device.
#[derive(Debug)]
pub(crate) struct DevFuse(pub(crate) File);

impl AsRawFd for DevFuse {
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for DevFuse {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl DevFuse {
    pub(crate) const PATH: &'static str = "/dev/fuse";

    #[allow(dead_code)] // Not used with every feature.
    pub(crate) fn open() -> io::Result<Self> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(Self::PATH)
            .map(Self)
    }

    /// A new descriptor of the connection `source` (a `/dev/fuse` descriptor) is of, by the
    /// `FUSE_DEV_IOC_CLONE` ioctl (Linux 4.5+).
    #[cfg(target_os = "linux")]
    pub(crate) fn clone_of(source: BorrowedFd<'_>) -> io::Result<Self> {
        let new_dev = Self::open()?;
        let mut source_fd = source.as_raw_fd() as u32;
        // SAFETY: fuse_dev_ioc_clone is a valid ioctl for /dev/fuse
        unsafe {
            crate::ll::ioctl::fuse_dev_ioc_clone(new_dev.as_raw_fd(), &mut source_fd)?;
        }
        Ok(new_dev)
    }
}
