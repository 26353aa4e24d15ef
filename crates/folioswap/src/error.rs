//! Errors that say what went wrong and what to do about it.

use std::fmt;
use std::io;

/// Everything the engine's public API can fail with.
#[derive(Debug)]
pub enum Error {
    /// A configuration value was not understood. `var` is the environment variable or
    /// builder method that carried it.
    Config { var: String, value: String, accepted: String },
    /// No userfaultfd could be opened.
    UserfaultfdUnavailable { errno: i32 },
    /// The kernel's userfaultfd lacks features the engine needs.
    KernelTooOld { missing: Vec<&'static str> },
    /// The address space could not hold a region of this size.
    Map { len: usize, errno: i32 },
    /// A region request that cannot work under this configuration.
    InvalidRegion(String),
    /// A system call the engine depends on failed.
    Sys { what: String, source: io::Error },
    /// The configured swap file could not be set up.
    SwapFile(crate::swapfile::io::SwapFileError),
    /// The remote tier could not start: no node answered, or the cluster is not usable.
    RemoteTier(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn config(var: &str, value: impl Into<String>, accepted: impl Into<String>) -> Error {
        Error::Config { var: var.to_string(), value: value.into(), accepted: accepted.into() }
    }

    pub(crate) fn sys(what: impl Into<String>, source: io::Error) -> Error {
        Error::Sys { what: what.into(), source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { var, value, accepted } => {
                write!(f, "{var}={value:?} is not valid: expected {accepted}")
            }
            Error::UserfaultfdUnavailable { errno } => {
                let err = io::Error::from_raw_os_error(*errno);
                match *errno {
                    libc::EPERM | libc::EACCES => write!(
                        f,
                        "userfaultfd is not permitted for this process ({err}). Run as root (or with \
                         CAP_SYS_PTRACE), give this user read-write access to /dev/userfaultfd, or allow \
                         unprivileged use with `sysctl vm.unprivileged_userfaultfd=1`"
                    ),
                    libc::ENOSYS | libc::ENOENT => write!(
                        f,
                        "this kernel has no userfaultfd ({err}): folioswap needs Linux built with \
                         CONFIG_USERFAULTFD, 6.8 or newer for UFFDIO_MOVE"
                    ),
                    _ => write!(f, "could not open a userfaultfd: {err}"),
                }
            }
            Error::KernelTooOld { missing } => write!(
                f,
                "this kernel's userfaultfd lacks {}: folioswap needs Linux 6.8 or newer \
                 (running {})",
                missing.join(", "),
                kernel_release()
            ),
            Error::Map { len, errno } => write!(
                f,
                "cannot reserve {} of address space for a region: {} (a region must fit the address \
                 space left to this process; check `ulimit -v` and vm.max_map_count)",
                crate::size::format_bytes(*len as u64),
                io::Error::from_raw_os_error(*errno)
            ),
            Error::InvalidRegion(reason) => f.write_str(reason),
            Error::Sys { what, source } => write!(f, "{what}: {source}"),
            Error::SwapFile(err) => write!(f, "swap file: {err}"),
            Error::RemoteTier(why) => {
                write!(f, "{why} (check that the nodes run in cluster mode and are reachable, or set FOLIOSWAP_REMOTE_TIER=none)")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Sys { source, .. } => Some(source),
            Error::SwapFile(err) => Some(err),
            _ => None,
        }
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_else(|_| "an unknown kernel".to_string())
}
