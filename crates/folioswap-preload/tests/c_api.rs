//! The C API from C, built with cc against the libfolioswap.so this build produced:
//! - examples/c/map_example.c maps 4× its memory_high, verifies every word, checks an
//!   error path and prints the counters, which must show swapping;
//! - tests/c/misuse.c calls every function wrongly (NULL, non-UTF-8, bad names and
//!   values, zero and overflowing lengths, unmapping what was never mapped, unmapping
//!   twice), checking each error code and message, while a mostly swapped-out block
//!   must keep every word.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding this build's libfolioswap.so (target/<profile>).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps.parent().unwrap(), deps] {
        if dir.join("libfolioswap.so").is_file() {
            return dir.to_path_buf();
        }
    }
    panic!("libfolioswap.so not found near {}: run `cargo build -p folioswap-preload`", deps.display());
}

/// Compile `source` (relative to the repository root) with `cc -Wall -Wextra -Werror`
/// against include/folioswap.h and this build's libfolioswap.so, into
/// CARGO_TARGET_TMPDIR/`name`.
fn build_c(source: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = library_dir();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cc = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join(source))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lfolioswap", "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run cc (a C compiler is needed for this test): {e}"));
    assert!(cc.success(), "{source} did not build");
    out
}

/// Run `program` (linked, not preloaded, and configured by nothing from this
/// environment), which must succeed; its standard output.
fn run(program: &Path) -> String {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_PRELOAD");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FOLIOSWAP_") {
            cmd.env_remove(name);
        }
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{} failed: {}\n{stdout}\n{}", program.display(), out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The counters a program printed as one JSON line, which must show swapping out and in,
/// to the pool or (data that does not compress) to the swap file made on demand.
fn assert_swapped(stdout: &str) -> serde_json::Value {
    let json = stdout.lines().find(|l| l.starts_with('{')).expect("stats JSON line");
    let stats: serde_json::Value = serde_json::from_str(json).unwrap();
    let n = |k: &str| stats[k].as_u64().unwrap();
    assert!(n("zswpout") + n("pswpout") > 0 && n("zswpin") + n("pswpin") > 0, "no swapping: {json}");
    stats
}

#[test]
fn map_example_runs_and_swaps() {
    let stdout = run(&build_c("examples/c/map_example.c", "map_example"));
    assert!(stdout.contains("expected error: "), "the bad option was not refused:\n{stdout}");
    assert!(stdout.contains("verified "), "{stdout}");
    assert_swapped(&stdout);
}

#[test]
fn misuse_is_refused_and_loses_nothing() {
    let stdout = run(&build_c("crates/folioswap-preload/tests/c/misuse.c", "misuse"));
    // misuse.c stops at the first failed check, so this line means that all passed.
    let passed = stdout.lines().find_map(|l| l.strip_prefix("misuse: ")?.strip_suffix(" checks passed")?.parse::<u32>().ok());
    assert!(passed.is_some_and(|n| n > 0), "misuse.c did not finish its checks:\n{stdout}");
    // 64 MiB of words, mostly swapped out and back in while the misuse went on.
    assert!(stdout.contains(&format!("verified {} words", (64 << 20) / 8)), "{stdout}");
    let stats = assert_swapped(&stdout);
    // The refused settings displaced nothing: the engine ran on the valid ones.
    assert_eq!(stats["memory"]["memory_high"].as_u64(), Some(16 << 20), "{stats}");
    let sizes: Vec<&String> = stats["per_size"].as_object().unwrap().keys().collect();
    assert_eq!(sizes, ["64kB"], "{stats}");
}
