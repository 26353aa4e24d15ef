//! Helpers shared by the integration tests: a verifiable fill pattern.

use folioswap::Region;

/// Write every word of `region` as its index mixed with `seed`.
pub fn fill(region: &mut Region, seed: u64) {
    for (j, w) in region.as_mut_slice().chunks_mut(8).enumerate() {
        w.copy_from_slice(&(j as u64 ^ (seed << 40)).to_le_bytes());
    }
}

/// Check every word `fill(region, seed)` wrote.
pub fn check(region: &Region, seed: u64) {
    for (j, w) in region.as_slice().chunks(8).enumerate() {
        let got = u64::from_le_bytes(w.try_into().unwrap());
        assert_eq!(got, j as u64 ^ (seed << 40), "word {j} of a {} region", region.folio_size());
    }
}
