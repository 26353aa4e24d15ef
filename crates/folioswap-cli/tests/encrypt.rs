//! `--encrypt`: the swap file sealed page by page. A run whose folios go to the file and
//! come back (a small pool, incompressible-enough data) verifies every word, and says the
//! file is encrypted. That the file holds ciphertext, and that an altered or misplaced
//! page fails to open, is checked on the file itself by `swapfile::sealed`'s unit test.

use serde_json::Value;
use std::process::Command;

const FOLIOSWAP: &str = env!("CARGO_BIN_EXE_folioswap");

#[test]
fn an_encrypted_swap_file_round_trips_every_word() {
    for folio in ["2M", "64K"] {
        let out = Command::new(FOLIOSWAP)
            .args(["bench", "usemem", "--threads", "2", "--size", "64M", "--limit", "32M", "--folio", folio, "--rounds", "2"])
            .args(["--swap-file", "/var/tmp:256M", "--max-pool", "0", "--encrypt", "--json"])
            .output()
            .unwrap();
        let describe =
            || format!("status {:?}\n{}\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{}", describe());
        let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON: {e}\n{}", describe()));
        assert_eq!(r["verified"], true, "{}", describe());
        let s = &r["stats"];
        assert_eq!(s["swap"]["io"]["encrypted"], true, "{}", describe());
        assert!(s["pswpout"].as_u64().unwrap() > 0 && s["pswpin"].as_u64().unwrap() > 0, "{folio}: the file was not used\n{}", describe());
        assert_eq!(s["swap_read_error"], 0, "{}", describe());
        assert_eq!(s["swap_checksum_error"], 0, "{}", describe());
    }
}
