//! `folioswap stat` against a live `folioswap run`: it finds the run with no flag but the
//! run's pid (used here only to ignore runs of other tests), reads its counters while the
//! program swaps, and says clearly when there is nothing to watch. The program verifies
//! every byte it wrote, before and after being watched.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const FOLIOSWAP: &str = env!("CARGO_BIN_EXE_folioswap");
const TMP: &str = env!("CARGO_TARGET_TMPDIR");

/// Writes 64 MiB in 1 MiB chunks, pass after pass, until the stop file appears; before
/// rewriting a chunk it checks every byte of what the last pass left there. Prints
/// "pass N" after each pass and "verified N" at the end.
const PROGRAM: &str = r#"
import os, sys
MiB = 1 << 20
n = 64
b = bytearray(n * MiB)
def chunk(p, i):
    return (p * 131 + i).to_bytes(8, 'little') * (MiB // 8)
p = 0
while not os.path.exists(sys.argv[1]):
    for i in range(n):
        if p > 0 and b[i * MiB:(i + 1) * MiB] != chunk(p - 1, i):
            sys.exit(f"pass {p}: chunk {i} differs from what pass {p - 1} wrote")
        b[i * MiB:(i + 1) * MiB] = chunk(p, i)
    print("pass", p, flush=True)
    p += 1
for i in range(n):
    if b[i * MiB:(i + 1) * MiB] != chunk(p - 1, i):
        sys.exit(f"at the end: chunk {i} differs from what pass {p - 1} wrote")
print("verified", p, flush=True)
"#;

fn folioswap() -> &'static str {
    let lib = Path::new(FOLIOSWAP).with_file_name("libfolioswap.so");
    let in_deps = Path::new(FOLIOSWAP).with_file_name("deps").join("libfolioswap.so");
    assert!(
        lib.is_file() || in_deps.is_file(),
        "libfolioswap.so is missing beside {FOLIOSWAP}: build it with `cargo build -p folioswap-preload` (`cargo test --workspace` does)"
    );
    FOLIOSWAP
}

fn require_python() {
    let ok = Command::new("python3").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    assert!(ok, "python3 is missing: these tests run a Python program under `folioswap run` (install python3)");
}

/// A `folioswap run` of PROGRAM, stopped (stop file, then kill) when dropped.
struct Watched {
    child: Child,
    stop: PathBuf,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Watched {
    fn start(name: &str) -> Watched {
        require_python();
        let stop = Path::new(TMP).join(format!("stat-stop-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&stop);
        let mut child = Command::new(folioswap())
            .args(["run", "--memory-high", "16M", "--folio", "64K", "--quiet", "--", "python3", "-c", PROGRAM])
            .arg(&stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn folioswap run");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Watched { child, stop, lines }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait until the program has printed `line` (64 MiB through a 16M limit per pass:
    /// after two passes it has swapped out and in).
    fn wait_for(&mut self, line: &str) {
        for got in self.lines.by_ref() {
            let got = got.expect("read the program's output");
            if got == line {
                return;
            }
        }
        let status = self.child.wait().expect("wait");
        panic!("the program ended ({status}) before printing {line:?}");
    }

    /// Stop the program and check that it verified every byte.
    fn finish(mut self) {
        std::fs::write(&self.stop, b"").expect("create the stop file");
        let mut last = String::new();
        for got in self.lines.by_ref() {
            last = got.expect("read the program's output");
        }
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "the program failed ({status}), last line {last:?}");
        assert!(last.starts_with("verified "), "the program did not verify: last line {last:?}");
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, b"");
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.stop);
    }
}

fn stat(args: &[&str]) -> std::process::Output {
    Command::new(folioswap()).arg("stat").args(args).output().expect("run folioswap stat")
}

#[test]
fn stat_reads_a_running_program_live() {
    let mut run = Watched::start("json");
    run.wait_for("pass 1");
    let pid = run.pid().to_string();
    let out = stat(&["--run", &pid, "--interval", "0.2", "--count", "2", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "folioswap stat failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert_eq!(lines.len(), 2, "--count 2 printed:\n{stdout}");
    for line in &lines {
        assert_eq!(line["runs"], 1, "{line}");
        assert_eq!(line["processes"], 1, "{line}");
        let per_run = line["per_run"].as_array().expect("per_run");
        assert_eq!(per_run.len(), 1, "{line}");
        assert_eq!(per_run[0]["run"].as_u64().map(|r| r.to_string()), Some(pid.clone()), "{line}");
        assert!(per_run[0]["commands"][0].as_str().is_some_and(|c| c.contains("python3")), "{line}");
        // Two passes of 64 MiB under a 16M limit: it has swapped out and back in.
        assert!(line["total"]["zswpout"].as_u64().is_some_and(|n| n > 0), "{line}");
        assert!(line["total"]["zswpin"].as_u64().unwrap_or(0) + line["total"]["pswpin"].as_u64().unwrap_or(0) > 0, "{line}");
        for (name, rate) in line["per_s"].as_object().expect("per_s") {
            assert!(rate.as_f64().is_some_and(|r| r >= 0.0), "{name}: {rate} in {line}");
        }
        let resident = line["resident_bytes"].as_u64().expect("resident_bytes");
        assert!(resident <= 16 << 20, "resident {resident} over the 16M limit: {line}");
        assert!(line["interval_s"].as_f64().is_some_and(|s| s >= 0.2), "{line}");
    }
    // The table: a header and one line of the same columns.
    let out = stat(&["--run", &pid, "--interval", "0.2", "--count", "1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "folioswap stat failed ({}):\n{stdout}", out.status);
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 2, "a header and one line:\n{stdout}");
    assert!(rows[0].contains("zswpout/s") && rows[0].contains("p99us"), "{stdout}");
    assert_eq!(rows[1].split_whitespace().count(), rows[0].split_whitespace().count(), "{stdout}");
    run.finish();

    // The run has ended: nothing answers for it.
    let out = stat(&["--run", &pid, "--count", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("no process of run {pid} answers")), "{stderr}");
}

#[test]
fn stat_refuses_bad_arguments_clearly() {
    for (args, expected) in [
        (&["--interval", "0"][..], "--interval 0 is not valid"),
        (&["--interval", "nan"][..], "--interval NaN is not valid"),
        (&["--count", "0"][..], "--count 0 is not valid"),
    ] {
        let out = stat(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
