//! The swap file tier (seeds 000, 003, 004): where folios go when the compressed pool is
//! full, refuses them, or writes back its coldest entries.
//!
//! - `cluster`: the slot allocator. The file is cut into 2 MiB clusters of 512 slots of
//!   4 KiB, each cluster with its own lock, free / non-full / per-order cluster lists as
//!   the kernel keeps them, and per-thread slot caches filled and drained in batches.
//! - `io`: the file itself: creation (unlinked, mode 0600), O_DIRECT where the filesystem
//!   allows it, whole-folio reads and writes, per-folio checksums, and a fault-injecting
//!   wrapper for the tests.

pub mod cluster;
pub mod io;
