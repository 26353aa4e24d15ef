//! Swap file I/O: creation, O_DIRECT, whole-folio reads and writes, checksums (being written).
