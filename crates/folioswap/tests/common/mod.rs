//! Helpers shared by the integration tests: a verifiable fill pattern.
#![allow(dead_code)] // each test binary uses its own subset of these helpers

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

/// Fill `region` with incompressible words (xorshift), which no pool can shrink.
pub fn fill_incompressible(region: &mut Region) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for w in region.as_mut_slice().chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
}

/// Run the ignored test `name` of this test binary in a child process that must die of
/// SIGBUS; returns its stderr.
pub fn run_child_expecting_sigbus(name: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .env("FOLIOSWAP_TEST_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{name} should die of SIGBUS: {:?}\n{stderr}", out.status);
    stderr
}
