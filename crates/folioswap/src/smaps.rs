//! Reading `/proc/self/smaps`: how much of a range is mapped as transparent huge pages.

use std::io;

/// AnonHugePages of the mappings overlapping `[addr, addr + len)`, in bytes. A mapping that
/// straddles the range counts in proportion to the overlap (smaps reports per mapping).
pub fn anon_huge_bytes(addr: usize, len: usize) -> io::Result<u64> {
    anon_huge_bytes_of(&[(addr, len)])
}

/// AnonHugePages of several ranges `(addr, len)`, sorted and disjoint, read from one pass
/// over `/proc/self/smaps`.
pub fn anon_huge_bytes_of(ranges: &[(usize, usize)]) -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    let mut total = 0u64;
    let mut current: Option<(u64, u64)> = None;
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                    current = Some((lo, hi));
                    continue;
                }
            }
        }
        if let (Some((lo, hi)), Some(rest)) = (current, line.strip_prefix("AnonHugePages:")) {
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            if kb == 0 {
                continue;
            }
            // The ranges inside this mapping: those starting before its end, from the
            // first that ends after its start.
            let first = ranges.partition_point(|&(a, l)| (a + l) as u64 <= lo);
            for &(a, l) in ranges[first..].iter().take_while(|&&(a, _)| (a as u64) < hi) {
                let overlap = hi.min((a + l) as u64) - lo.max(a as u64);
                total += kb * 1024 * overlap / (hi - lo);
            }
        }
    }
    Ok(total)
}
