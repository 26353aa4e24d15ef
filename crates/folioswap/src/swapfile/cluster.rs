//! Swap slot allocation: clusters, per-order lists, slot caches (being written).
