//! The remote tier against real Redis clusters on loopback ports (Debian's
//! `redis-server` and `redis-cli`, which `.ci/run` installs): `folioswap bench usemem`
//! swaps through a 3-master cluster and verifies every word; a 3+3 cluster loses a master
//! to SIGKILL mid-run and the run still verifies; a cluster that stops answering gives a
//! clear error, not a hang; and no key outlives its engine (deleted at exit, or left to
//! expire with its lease after a crash).

use serde_json::Value;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const FOLIOSWAP: &str = env!("CARGO_BIN_EXE_folioswap");
const TMP: &str = env!("CARGO_TARGET_TMPDIR");

/// The lease keys are written with (`folioswap::remote::LEASE`).
const LEASE_MS: i64 = 60_000;

fn require_redis() {
    for tool in ["redis-server", "redis-cli"] {
        let ok = Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        assert!(ok, "{tool} is missing: these tests start real Redis clusters (apt-get install redis-server redis-tools; .ci/run does)");
    }
}

/// One test at a time starts clusters (ports, and the two CPUs).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A Redis cluster of `masters` masters with `replicas` replicas each, on free loopback
/// ports; every server is killed when it is dropped.
struct Cluster {
    ports: Vec<u16>,
    servers: Vec<Option<Child>>,
    dir: PathBuf,
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The answer of `redis-cli -p PORT ARGS`, empty if it gave none within 10 s (a stopped
/// server accepts the connection and never answers).
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .args(["-s", "KILL", "10", "redis-cli", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("timeout(1) runs redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How long one folioswap command may run before the test stops it and fails.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// A command running in its own process group, its output piped; dropped (a test that
/// failed while it ran), the group is killed, so nothing outlives the test.
struct Run(Option<Child>);

impl Run {
    fn start(cmd: &mut Command) -> Run {
        Run(Some(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn().expect("the command starts")))
    }

    fn is_running(&mut self) -> bool {
        self.0.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    fn kill_group(child: &mut Child) {
        // SAFETY: kill(2) of the process group of a child this test started and has not
        // reaped (its group id is its pid: `process_group(0)`).
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    }

    /// Wait for the end, bounded: past `limit` the test prints the stacks of the
    /// command's threads, kills its group and fails, so that a hang is a failure that
    /// says where, never a test that runs until CI gives up.
    fn finish(mut self, limit: Duration) -> Output {
        fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut bytes);
                }
                bytes
            })
        }
        let mut child = self.0.take().unwrap();
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        let deadline = Instant::now() + limit;
        let (status, stacks) = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break (status, None);
            }
            if Instant::now() >= deadline {
                let stacks = stacks_of(child.id());
                Run::kill_group(&mut child);
                break (child.wait().unwrap(), Some(stacks));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() };
        if let Some(stacks) = stacks {
            panic!("the command did not end within {limit:?}; the test killed it. Its threads:\n{stacks}\n{}", describe(&out));
        }
        out
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            Run::kill_group(child);
            let _ = child.wait();
        }
    }
}

fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    Run::start(cmd).finish(limit)
}

/// For each process of the group `pgid` (the command and what it started): each thread's
/// name, state and kernel stack, then the user stacks from gdb where gdb is installed.
fn stacks_of(pgid: u32) -> String {
    let in_group = |pid: &str| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid pgrp ...: the comm may hold spaces, so count after ')'.
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<u32>().ok()) == Some(pgid)
    };
    let mut pids: Vec<String> = std::fs::read_dir("/proc")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|p| p.parse::<u32>().is_ok()).collect())
        .unwrap_or_default();
    pids.retain(|p| in_group(p));
    let mut text = String::new();
    for pid in pids {
        text += &format!(
            "=== process {pid}: {}\n",
            std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default().replace('\0', " ")
        );
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let path = task.path();
                let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default().trim().to_string();
                let state = read("status").lines().find(|l| l.starts_with("State:")).unwrap_or("").to_string();
                text += &format!("{} {} {state}\n{}\n", task.file_name().to_string_lossy(), read("comm"), read("stack"));
            }
        }
        let gdb = Command::new("timeout")
            .args(["-s", "KILL", "60", "gdb", "-p", &pid, "-batch", "-nx", "-ex", "thread apply all bt 30"])
            .output();
        match gdb {
            Ok(out) if out.status.success() => text += &String::from_utf8_lossy(&out.stdout),
            _ => text += "(no gdb backtrace: gdb is missing or failed)\n",
        }
    }
    text
}

impl Cluster {
    fn start(masters: usize, replicas: usize) -> Cluster {
        require_redis();
        let n = masters * (1 + replicas);
        // A run of free ports whose cluster-bus ports (port + 10000) are free too.
        let mut base = 20000 + (std::process::id() % 500) as u16 * 16;
        while !(0..n as u16).all(|i| port_free(base + i) && port_free(base + i + 10000)) {
            base += n as u16;
        }
        let ports: Vec<u16> = (0..n as u16).map(|i| base + i).collect();
        let dir = PathBuf::from(TMP).join(format!("redis-{}-{base}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut servers = Vec::new();
        for &p in &ports {
            let d = dir.join(p.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &p.to_string(), "--bind", "127.0.0.1", "--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"])
                .args(["--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0"])
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(&d)
                .args(["--logfile", "log"])
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            servers.push(Some(child));
        }
        let cluster = Cluster { ports, servers, dir };
        cluster.wait_until(|| cluster.ports.iter().all(|&p| cli(p, &["ping"]).trim() == "PONG"), "every server answers PING");
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        create.args(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")));
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = run_bounded(&mut create, Duration::from_secs(60));
        assert!(out.status.success(), "creating the cluster failed: {}", String::from_utf8_lossy(&out.stdout));
        cluster.wait_until(
            || {
                cluster.ports.iter().all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
                    && cluster.ports.iter().all(|&p| !cli(p, &["info", "replication"]).contains("master_link_status:down"))
            },
            "the cluster is ok on every node and every replica is in sync",
        );
        cluster
    }

    fn wait_until(&self, mut ok: impl FnMut() -> bool, what: &str) {
        let start = Instant::now();
        while !ok() {
            assert!(start.elapsed() < Duration::from_secs(60), "waited 60 s for this, in vain: {what} (logs in {})", self.dir.display());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.ports[0])
    }

    /// Ports of the live masters.
    fn masters(&self) -> Vec<u16> {
        let live: Vec<u16> = self.live_ports();
        let nodes = cli(live[0], &["cluster", "nodes"]);
        nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| l.split_whitespace().nth(1)?.split(['@', ':']).nth(1)?.parse().ok())
            .filter(|p| live.contains(p))
            .collect()
    }

    fn live_ports(&self) -> Vec<u16> {
        self.ports.iter().zip(&self.servers).filter(|(_, s)| s.is_some()).map(|(&p, _)| p).collect()
    }

    /// Keys of folioswap engines on the live nodes.
    fn engine_keys(&self) -> Vec<(u16, String)> {
        let mut keys = Vec::new();
        for p in self.live_ports() {
            for k in cli(p, &["--scan", "--pattern", "fsw:*"]).lines().filter(|k| !k.is_empty()) {
                keys.push((p, k.to_string()));
            }
        }
        keys
    }

    fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        let mut child = self.servers[i].take().expect("a live server");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn signal_all(&self, signal: libc::c_int) {
        for child in self.servers.iter().flatten() {
            // SAFETY: kill(2) with the pid of a child this test started and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.signal_all(libc::SIGCONT);
        for child in self.servers.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn usemem(folio: &str, rounds: &str, url: &str) -> Command {
    let mut cmd = Command::new(FOLIOSWAP);
    cmd.args(["bench", "usemem", "--threads", "2", "--size", "96M", "--limit", "48M", "--max-pool", "8M", "--folio", folio]);
    cmd.args(["--rounds", rounds, "--json", "--remote-tier", url]);
    cmd
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr (last 3000 bytes)\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr).chars().rev().take(3000).collect::<String>().chars().rev().collect::<String>()
    )
}

/// The report of a run that must have succeeded and verified every word.
fn verified_report(out: &Output) -> Value {
    assert!(out.status.success(), "the run failed\n{}", describe(out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("the report is not JSON: {e}\n{}", describe(out)));
    assert_eq!(report["verified"], true, "{}", describe(out));
    assert_eq!(report["mismatches"], 0, "{}", describe(out));
    report
}

fn remote_stat(report: &Value) -> &Value {
    &report["stats"]["swap"]["io"]["remote"]
}

#[test]
fn three_masters_carry_2m_and_64k_folios_and_keep_no_key() {
    let _serial = serial();
    let cluster = Cluster::start(3, 0);
    for folio in ["2M", "64K"] {
        let out = run_bounded(&mut usemem(folio, "2", &cluster.url()), RUN_LIMIT);
        let report = verified_report(&out);
        let remote = remote_stat(&report);
        assert_eq!(remote["masters"], 3, "{remote}");
        assert_eq!(remote["wait_replicas"], 0, "no replicas, nothing to wait for: {remote}");
        let out_pages = remote["remote_swpout"].as_u64().unwrap();
        let in_pages = remote["remote_swpin"].as_u64().unwrap();
        assert!(out_pages > 0 && in_pages > 0, "{folio}: nothing went through the cluster: {remote}");
        assert_eq!(remote["remote_errors"], 0, "{remote}");
        assert!(report["stats"]["swap"]["io"]["encrypted"] == true, "{remote}");
        assert!(!remote["fetch_latency"].as_array().unwrap().is_empty(), "{remote}");
        assert_eq!(cluster.engine_keys(), vec![], "{folio}: keys left on the cluster after the engine exited");
    }
    // An unmodified program under `folioswap run`: its engine is never dropped, and the
    // keys go at exit all the same.
    let out = run_bounded(
        Command::new(FOLIOSWAP).args([
            "run",
            "--memory-high",
            "32M",
            "--max-pool",
            "4M",
            "--remote-tier",
            &cluster.url(),
            "--",
            "python3",
            "-c",
            PROGRAM,
        ]),
        RUN_LIMIT,
    );
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("verified"), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let pswpout: u64 = stderr.split("pswpout ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    assert!(pswpout > 0, "nothing went to the remote tier\n{}", describe(&out));
    assert_eq!(cluster.engine_keys(), vec![], "keys left on the cluster after `folioswap run` ended");
}

/// 96 MiB of random bytes (incompressible: they go past the pool to the tier), read back
/// page by page twice and compared with a copy of every page's first bytes.
const PROGRAM: &str = r#"
import os
n = 96 << 20
b = bytearray(os.urandom(n))
ref = [bytes(b[i:i + 16]) for i in range(0, n, 4096)]
for _ in range(2):
    for k, i in enumerate(range(0, n, 4096)):
        assert bytes(b[i:i + 16]) == ref[k], f"page {k} differs"
print("verified")
"#;

#[test]
fn a_master_killed_mid_run_loses_nothing() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, 1);
    let mut run = Run::start(&mut usemem("2M", "40", &cluster.url()));
    // Once the engine has keys on every master, kill one.
    cluster.wait_until(
        || {
            let keys = cluster.engine_keys();
            cluster.masters().iter().all(|m| keys.iter().any(|(p, _)| p == m))
        },
        "the run has keys on every master",
    );
    // The node the engine was told about: the client must not need it once it is gone.
    let victim = cluster.ports[0];
    assert!(cluster.masters().contains(&victim), "the first node is a master (redis-cli --cluster create makes the first ones masters)");
    assert!(run.is_running(), "the run ended before a master could be killed: give it more rounds");
    cluster.kill(victim);
    let out = run.finish(RUN_LIMIT);
    let report = verified_report(&out);
    let remote = remote_stat(&report);
    assert_eq!(remote["wait_replicas"], 1, "every master had a replica: writes wait for one: {remote}");
    assert!(remote["remote_swpin"].as_u64().unwrap() > 0, "{remote}");
    cluster.wait_until(|| cluster.masters().len() == 3, "a replica took the dead master's place");
    assert_eq!(cluster.engine_keys(), vec![], "keys left on the cluster after the engine exited");
}

#[test]
fn a_cluster_that_stops_answering_fails_clearly() {
    let _serial = serial();
    let cluster = Cluster::start(3, 0);
    // At start: the engine refuses to start, naming the tier.
    cluster.signal_all(libc::SIGSTOP);
    let start = Instant::now();
    let out = run_bounded(&mut usemem("2M", "1", &cluster.url()), RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(stderr.contains("remote tier") && stderr.contains("no node answered"), "{}", describe(&out));
    assert!(start.elapsed() < Duration::from_secs(60), "took {:?} to give up", start.elapsed());
    cluster.signal_all(libc::SIGCONT);

    // Mid-run: once data is on the cluster, it stops answering. The run must end (SIGBUS
    // with the tier and key named), not hang, and never verify wrong data as right.
    let run = Run::start(&mut usemem("64K", "400", &cluster.url()));
    cluster.wait_until(|| cluster.engine_keys().len() > 100, "the run has keys on the cluster");
    cluster.signal_all(libc::SIGSTOP);
    let stopped = Instant::now();
    let out = run.finish(RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(libc::SIGBUS), "{}", describe(&out));
    assert!(stderr.contains("the remote tier redis://") && stderr.contains("key fsw:"), "{}", describe(&out));
    assert!(stopped.elapsed() < Duration::from_secs(120), "took {:?} to fail", stopped.elapsed());
    // The crashed engine's keys are left, each with a lease that lets it expire.
    cluster.signal_all(libc::SIGCONT);
    let keys = cluster.engine_keys();
    assert!(!keys.is_empty(), "the crashed engine left no key: nothing tests the lease");
    for (port, key) in keys.iter().take(50) {
        let ttl: i64 = cli(*port, &["pttl", key]).trim().parse().unwrap();
        assert!(ttl > 0 && ttl <= LEASE_MS, "key {key} on {port} has PTTL {ttl}: it must expire within the lease");
    }
}
