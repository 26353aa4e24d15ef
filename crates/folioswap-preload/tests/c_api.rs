//! The C API from C: examples/c/map_example.c, built with cc against the libfolioswap.so
//! this build produced, maps 4× its memory_high, verifies every word, checks an error
//! path and prints the counters, which must show swapping.

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

#[test]
fn map_example_runs_and_swaps() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = library_dir();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("map_example");
    let cc = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/c/map_example.c"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lfolioswap", "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run cc (a C compiler is needed for this test): {e}"));
    assert!(cc.success(), "map_example.c did not build");

    let run = Command::new(&out).env_remove("LD_PRELOAD").output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "map_example failed: {}\n{stdout}\n{}", run.status, String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("expected error: "), "the bad option was not refused:\n{stdout}");
    assert!(stdout.contains("verified "), "{stdout}");
    let json = stdout.lines().find(|l| l.starts_with('{')).expect("stats JSON line");
    let stats: serde_json::Value = serde_json::from_str(json).unwrap();
    assert!(stats["zswpout"].as_u64().unwrap() > 0 && stats["zswpin"].as_u64().unwrap() > 0, "no swapping: {json}");
}
