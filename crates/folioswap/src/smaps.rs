//! Reading `/proc/self/smaps`: how much of some ranges is resident, mapped as transparent
//! huge pages, or swapped out by the kernel.

use std::io;

/// AnonHugePages of the mappings overlapping `[addr, addr + len)`, in bytes. A mapping that
/// straddles the range counts in proportion to the overlap (smaps reports per mapping).
pub fn anon_huge_bytes(addr: usize, len: usize) -> io::Result<u64> {
    anon_huge_bytes_of(&[(addr, len)])
}

/// AnonHugePages of several ranges `(addr, len)`, sorted and disjoint, read from one pass
/// over `/proc/self/smaps`.
pub fn anon_huge_bytes_of(ranges: &[(usize, usize)]) -> io::Result<u64> {
    smaps_of(ranges).map(|m| m.anon_huge_bytes)
}

/// What `/proc/self/smaps` says of some ranges, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmapsSums {
    pub rss_bytes: u64,
    pub anon_huge_bytes: u64,
    pub swap_bytes: u64,
}

/// Rss, AnonHugePages and Swap of the mappings overlapping `ranges` (`(addr, len)`,
/// sorted and disjoint), from one pass over `/proc/self/smaps`. smaps reports per mapping:
/// one that straddles a range counts in proportion to the overlap.
pub fn smaps_of(ranges: &[(usize, usize)]) -> io::Result<SmapsSums> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    let mut sums = SmapsSums::default();
    // Of the current mapping: the bytes the ranges cover, and its size.
    let mut overlap: Option<(u64, u64)> = None;
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                    // The ranges inside this mapping: from the first that ends after its
                    // start, while they start before its end.
                    let first = ranges.partition_point(|&(a, l)| a + l <= lo);
                    let covered: usize =
                        ranges[first..].iter().take_while(|&&(a, _)| a < hi).map(|&(a, l)| hi.min(a + l) - lo.max(a)).sum();
                    overlap = (covered > 0).then_some((covered as u64, (hi - lo) as u64));
                    continue;
                }
            }
        }
        let Some((covered, size)) = overlap else { continue };
        for (key, sum) in [("Rss:", &mut sums.rss_bytes), ("AnonHugePages:", &mut sums.anon_huge_bytes), ("Swap:", &mut sums.swap_bytes)] {
            if let Some(rest) = line.strip_prefix(key) {
                let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                *sum += kb * 1024 * covered / size;
            }
        }
    }
    Ok(sums)
}
