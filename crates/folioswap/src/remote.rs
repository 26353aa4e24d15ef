//! The remote tier: folios written back or refused by the pool go to a Redis or Valkey
//! cluster, the memory of other machines, instead of the swap file (Infiniswap and
//! Fastswap did this with kernel patches and RDMA; we use a store people already run).
//!
//! It sits behind the same slot allocator as the swap file (`swapfile/`): a [`RemoteTier`]
//! is a [`SwapIo`] over a virtual address space of slots, so everything the file tier does
//! (whole-folio runs, fallback to pieces, checksums, partial swap-in, readahead) works
//! unchanged. What differs is where a run's bytes go:
//!
//! 1. **Write** (`write_at`, `write_batch`): one value per run of slots written together,
//!    under the key `fsw:{ENGINE-CLUSTER}:SLOT.WRITE`. The braces are Redis's hash tag:
//!    the runs of one 2 MiB cluster of slots share a hash slot (one WAIT covers a batch),
//!    and clusters spread over every master. WRITE, the run's write number, makes every
//!    key unique, so deleting an old run never hits a new one at the same slot. Each page
//!    is sealed (ChaCha20-Poly1305, `seal.rs`: its tag is the value's checksum, and the
//!    key is the associated data), and the value is stored with a lease (`PX`).
//! 2. **Durability**: where the masters have replicas, a write counts only once `WAIT`
//!    says a replica has it; otherwise the write fails and the folio stays where it was
//!    (memory or pool), as a failed file write does. When a master dies, the client
//!    (the `redis` crate: MOVED/ASK, slot refresh) follows the failover, and reads find
//!    the promoted replica's copy.
//! 3. **Read** (`read_at`, `read_batch`): `GETRANGE` of the pages wanted, so one page of a
//!    2 MiB run comes back alone; each page is opened and checked. Every request has a
//!    bounded time (`remote_timeout`); a read that still fails when it runs out fails the
//!    fault with a message naming the tier and the key (SIGBUS), never wrong data.
//! 4. **Release**: a run's key is deleted once its last page is freed (`discard`), by the
//!    lease thread in batches; every key left is deleted when the engine stops; and the
//!    lease thread renews every live key's lease, so that the keys of a process that
//!    crashed expire on their own within [`LEASE`].
//!
//! Locks: `pool` (the idle connections) and `keys` (live runs, runs to delete) are leaves,
//! never held across a request.

use crate::seal::{Sealer, TAG_LEN};
use crate::size::PAGE_SIZE;
use crate::stats::{Histogram, Latency, RemoteStat};
use crate::swapfile::io::{SwapIo, SwapIoStats};
use crate::swapfile::{zeroed_u32s, zeroed_u64s};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a key outlives its engine's last renewal: the keys of a process that died
/// are gone this long after. Renewed every third of it.
pub const LEASE: Duration = Duration::from_secs(60);

/// How long one WAIT lets the replicas take to acknowledge a write.
const WAIT_MS: u64 = 500;

/// A sealed page as stored: ciphertext and tag.
const SEALED_PAGE: usize = PAGE_SIZE + TAG_LEN;

/// Slots in a cluster of the allocator (2 MiB): the runs of one share a hash slot.
const CLUSTER_SLOTS: u64 = 512;

/// The virtual size of the tier: how much the engine may place on the cluster (the
/// cluster's own memory is the real bound; a full cluster refuses writes, and the folio
/// then stays where it was).
pub const REMOTE_SLOTS: u64 = 16 << 20; // 64 GiB

/// Where the cluster is and how long a request may take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RemoteSpec {
    /// `host:port` of one or more nodes; the client learns the rest from them.
    pub nodes: Vec<String>,
}

impl RemoteSpec {
    pub const ACCEPTED: &'static str = "redis://HOST:PORT[,HOST:PORT...] (nodes of a Redis or Valkey cluster), or none";

    /// The nodes as the redis crate takes them.
    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("redis://{n}")).collect()
    }
}

impl fmt::Display for RemoteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis://{}", self.nodes.join(","))
    }
}

impl std::str::FromStr for RemoteSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<RemoteSpec, String> {
        let rest = s.trim().strip_prefix("redis://").ok_or("it must start with redis://")?;
        let mut nodes = Vec::new();
        for node in rest.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let node = node.strip_prefix("redis://").unwrap_or(node);
            let (host, port) = node.rsplit_once(':').ok_or(format!("{node:?} has no :PORT"))?;
            if host.is_empty() {
                return Err(format!("{node:?} has no host"));
            }
            port.parse::<u16>().map_err(|_| format!("{port:?} in {node:?} is not a port"))?;
            nodes.push(node.to_string());
        }
        if nodes.is_empty() {
            return Err("it names no node".into());
        }
        Ok(RemoteSpec { nodes })
    }
}

/// Why the tier cannot start.
#[derive(Debug)]
pub struct RemoteError(pub String);

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the engine and its lease thread share.
struct Shared {
    spec: RemoteSpec,
    client: ClusterClient,
    /// Idle connections (a `ClusterConnection` serves one request at a time).
    pool: Mutex<Vec<ClusterConnection>>,
    sealer: Sealer,
    /// This engine's name in its keys: pid and 48 random bits.
    engine_id: String,
    timeout: Duration,
    wait_replicas: u32,
    masters: usize,
    /// Per slot: the first slot of the run that holds its page, plus one (0: none).
    run_of: Box<[AtomicU32]>,
    /// Per first slot of a run: its write number, and its pages not yet freed.
    write_of: Box<[AtomicU64]>,
    live: Box<[AtomicU32]>,
    keys: Mutex<Keys>,
    /// Held by whoever has taken freed runs' keys out of `keys.doomed` until it has
    /// deleted them: closing takes it too, so that it never returns (and the process
    /// exits, killing the lease thread) while the lease thread deletes a batch it took.
    /// Lock order: deleting -> keys.
    deleting: Mutex<()>,
    /// Wakes the lease thread (deletions queued, or stop).
    wake: Condvar,
    stop: AtomicBool,
    /// Writes on their way to the cluster: closing waits for them, so that none lands a
    /// key after the close has deleted the others (and the process has exited).
    writing: AtomicU32,
    swpout: AtomicU64,
    swpin: AtomicU64,
    errors: AtomicU64,
    deleted: AtomicU64,
    /// Writes stored on a master that had no replica left to wait for.
    unreplicated: AtomicU64,
    /// A write failed after its retries: the tier takes no writes (no slot is handed out)
    /// until the lease thread finds the cluster ok again. Holds the failure's message.
    down: Mutex<Option<String>>,
    is_down: AtomicBool,
    bytes: AtomicU64,
    /// Fetch latency by log2 of the pages fetched (4K … 2M).
    fetch_ns: [Histogram; 10],
    /// Write latency (a whole batch, WAIT included) by log2 of its first run's pages.
    store_ns: [Histogram; 10],
    write_ns: Histogram,
}

#[derive(Default)]
struct Keys {
    /// Live runs: first slot -> (write number, value bytes).
    live: HashMap<u32, (u64, u64)>,
    /// Keys of freed runs, to delete.
    doomed: Vec<String>,
}

/// The remote tier (see the module comment).
pub struct RemoteTier {
    shared: Arc<Shared>,
    lease_thread: Option<std::thread::JoinHandle<()>>,
}

impl RemoteTier {
    /// Connect to the cluster, learn its shape (masters, replicas), and start the lease
    /// thread. Fails, saying what is wrong, when no node answers within `timeout`.
    pub fn connect(spec: &RemoteSpec, timeout: Duration) -> Result<RemoteTier, RemoteError> {
        let fail = |what: String| RemoteError(format!("the remote tier {spec}: {what}"));
        let per_try = timeout.min(Duration::from_secs(1));
        let client = cluster_client(spec.urls(), per_try).map_err(|e| fail(format!("{e}")))?;
        let mut conn = client.get_connection().map_err(|e| fail(format!("no node answered within {} ms: {e}", per_try.as_millis())))?;
        let nodes: String = conn
            .route_command(redis::cmd("CLUSTER").arg("NODES"), RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
            .and_then(|v| redis::from_redis_value(v).map_err(Into::into))
            .map_err(|e| fail(format!("CLUSTER NODES failed: {e}")))?;
        let (masters, wait_replicas) = cluster_shape(&nodes);
        if masters == 0 {
            return Err(fail("the cluster has no master serving slots (is it created? `redis-cli --cluster create`)".into()));
        }
        // Every node as a seed, not only those named: a connection made after a failure
        // (the client's first step is to ask a seed for the slots) must not depend on the
        // one node named being the one still alive.
        let seeds: Vec<String> = spec.urls().into_iter().chain(node_addresses(&nodes).map(|a| format!("redis://{a}"))).collect();
        let client = cluster_client(seeds, per_try).map_err(|e| fail(format!("{e}")))?;
        let slots = REMOTE_SLOTS as usize;
        let mut id = [0u8; 6];
        // SAFETY: fills a live 6-byte buffer.
        unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
        let engine_id = format!("{}-{}", std::process::id(), id.iter().map(|b| format!("{b:02x}")).collect::<String>());
        let shared = Arc::new(Shared {
            spec: spec.clone(),
            client,
            pool: Mutex::new(vec![conn]),
            sealer: Sealer::new().map_err(|e| fail(format!("no random key: {e}")))?,
            engine_id,
            timeout,
            wait_replicas,
            masters,
            run_of: zeroed_u32s(slots),
            write_of: zeroed_u64s(slots),
            live: zeroed_u32s(slots),
            keys: Mutex::new(Keys::default()),
            deleting: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            writing: AtomicU32::new(0),
            swpout: AtomicU64::new(0),
            swpin: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
            unreplicated: AtomicU64::new(0),
            down: Mutex::new(None),
            is_down: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            fetch_ns: Default::default(),
            store_ns: Default::default(),
            write_ns: Histogram::default(),
        });
        let for_thread = shared.clone();
        let lease_thread = std::thread::Builder::new()
            .name("fsw-remote".into())
            .spawn(move || for_thread.lease_loop())
            .map_err(|e| fail(format!("no lease thread: {e}")))?;
        Ok(RemoteTier { shared, lease_thread: Some(lease_thread) })
    }
}

/// A cluster client over `seeds` whose every connection attempt and answer takes at most
/// `per_try`; the client retries a few times itself, following MOVED/ASK.
fn cluster_client(seeds: Vec<String>, per_try: Duration) -> redis::RedisResult<ClusterClient> {
    ClusterClient::builder(seeds)
        .connection_timeout(per_try)
        .response_timeout(per_try)
        .retries(3)
        .min_retry_wait(20)
        .max_retry_wait(250)
        .build()
}

/// Masters serving slots, and the replicas a write should wait for: 1 if every such
/// master has a replica, else 0. From `CLUSTER NODES` (id addr flags master-id ... slots).
fn cluster_shape(nodes: &str) -> (usize, u32) {
    let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split_whitespace().collect()).filter(|f: &Vec<&str>| f.len() >= 8).collect();
    let alive = |f: &Vec<&str>| !f[2].contains("fail") && !f[2].contains("noaddr");
    let masters: Vec<&str> = lines.iter().filter(|f| f[2].contains("master") && alive(f) && f.len() > 8).map(|f| f[0]).collect();
    let all_replicated =
        !masters.is_empty() && masters.iter().all(|m| lines.iter().any(|f| f[2].contains("slave") && alive(f) && f[3] == *m));
    (masters.len(), all_replicated as u32)
}

/// The `host:port` of every node that `CLUSTER NODES` lists as reachable.
fn node_addresses(nodes: &str) -> impl Iterator<Item = &str> {
    nodes.lines().filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let usable = f.len() >= 8 && !f[2].contains("fail") && !f[2].contains("noaddr");
        usable.then(|| f[1].split(['@', ',']).next()).flatten().filter(|a| !a.starts_with(':'))
    })
}

/// `connected_slaves` from `INFO replication`.
fn connected_replicas(info: &str) -> Option<u32> {
    info.lines().find_map(|l| l.trim().strip_prefix("connected_slaves:")).and_then(|n| n.trim().parse().ok())
}

impl Shared {
    fn key(&self, first: u64, write: u64) -> String {
        format!("fsw:{{{}-{}}}:{first}.{write}", self.engine_id, first / CLUSTER_SLOTS)
    }

    /// Run `op` on a connection, retrying on a fresh one until it succeeds or `timeout`
    /// has passed (a failover takes the cluster's node timeout plus an election).
    fn with_conn<T>(
        &self,
        what: &dyn Fn() -> String,
        mut op: impl FnMut(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> io::Result<T> {
        let deadline = Instant::now() + self.timeout;
        let last = loop {
            let conn = self.pool.lock().unwrap().pop();
            let conn = match conn {
                Some(c) => Ok(c),
                None => self.client.get_connection(),
            };
            match conn.and_then(|mut c| op(&mut c).map(|v| (v, c))) {
                Ok((v, c)) => {
                    self.pool.lock().unwrap().push(c);
                    return Ok(v);
                }
                // The connection that failed is dropped: the next one learns the
                // cluster's topology afresh.
                Err(e) if Instant::now() >= deadline => break e.to_string(),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        self.errors.fetch_add(1, Ordering::Relaxed);
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the remote tier {}: {} failed within {} ms: {last}", self.spec, what(), self.timeout.as_millis()),
        ))
    }

    /// Store one run: sealed pages under a new key, acknowledged by a replica if the
    /// cluster has them.
    fn write_runs(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        // Counted before the stop is read, both SeqCst: either `close_once` sees this
        // write and waits for it, or this write sees the stop and sends nothing.
        self.writing.fetch_add(1, Ordering::SeqCst);
        struct Written<'a>(&'a AtomicU32);
        impl Drop for Written<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _written = Written(&self.writing);
        if self.stop.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("the remote tier {}: the engine has closed it", self.spec)));
        }
        let start = Instant::now();
        let mut values = Vec::with_capacity(ios.len());
        for &(first, data) in ios {
            let write = self.sealer.next_write();
            let key = self.key(first, write);
            let mut value = vec![0u8; data.len() / PAGE_SIZE * SEALED_PAGE];
            for (i, (page, out)) in data.chunks(PAGE_SIZE).zip(value.chunks_mut(SEALED_PAGE)).enumerate() {
                out[..PAGE_SIZE].copy_from_slice(page);
                let tag = self.sealer.seal(write, i as u32, key.as_bytes(), &mut out[..PAGE_SIZE]);
                out[PAGE_SIZE..].copy_from_slice(&tag);
            }
            values.push((first, write, key, value));
        }
        let lease_ms = LEASE.as_millis() as u64;
        let what = || format!("storing {} run(s) from key {}", values.len(), values[0].2);
        let stored = self.with_conn(&what, |conn| {
            let mut pipe = redis::cluster::cluster_pipe();
            for (_, _, key, value) in &values {
                pipe.cmd("SET").arg(key).arg(&value[..]).arg("PX").arg(lease_ms).ignore();
            }
            pipe.exec(conn)?;
            if self.wait_replicas > 0 {
                let mut waited: Vec<&str> = Vec::new();
                for (_, _, key, _) in &values {
                    let tag = &key[key.find('{').unwrap_or(0)..key.find('}').unwrap_or(0)];
                    if waited.contains(&tag) {
                        continue;
                    }
                    waited.push(tag);
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master)));
                    // A master promoted by a failover has no replica until one is added:
                    // its writes cannot wait for one (asking first saves a WAIT that could
                    // only time out). Say so once, count them, go on.
                    let info: String = redis::from_redis_value(conn.route_command(redis::cmd("INFO").arg("replication"), route.clone())?)?;
                    if connected_replicas(&info) == Some(0) {
                        if self.unreplicated.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!(
                                "folioswap: the remote tier {}: the master holding key {key} has no replica (after a failover?); \
                                 writes to it are not replicated until it has one again (remote_unreplicated counts them)",
                                self.spec
                            );
                        }
                        continue;
                    }
                    // Well within the client's response timeout, so a slow replica fails the
                    // attempt (which is retried) rather than the connection.
                    let wait = redis::cmd("WAIT").arg(self.wait_replicas).arg(WAIT_MS).clone();
                    let acked: i64 = redis::from_redis_value(conn.route_command(&wait, route)?)?;
                    if acked < self.wait_replicas as i64 {
                        return Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "no replica acknowledged the write",
                            format!("WAIT answered {acked} for key {key}"),
                        )));
                    }
                }
            }
            Ok(())
        });
        if let Err(e) = stored {
            self.set_down(&e);
            return Err(e);
        }
        let mut keys = self.keys.lock().unwrap();
        // The engine closed the tier while these were on their way (an eviction racing
        // the program's exit): `close_once` has deleted the keys it knew, so these go now.
        if self.stop.load(Ordering::Acquire) {
            drop(keys);
            self.delete(&values.into_iter().map(|(_, _, key, _)| key).collect::<Vec<_>>());
            return Err(io::Error::other(format!("the remote tier {}: the engine has closed it", self.spec)));
        }
        for ((first, write, _, value), &(_, data)) in values.iter().zip(ios) {
            let pages = (data.len() / PAGE_SIZE) as u64;
            for p in 0..pages {
                self.run_of[(first + p) as usize].store(*first as u32 + 1, Ordering::Relaxed);
            }
            self.write_of[*first as usize].store(*write, Ordering::Relaxed);
            self.live[*first as usize].store(pages as u32, Ordering::Relaxed);
            keys.live.insert(*first as u32, (*write, value.len() as u64));
            self.bytes.fetch_add(value.len() as u64, Ordering::Relaxed);
            self.swpout.fetch_add(pages, Ordering::Relaxed);
        }
        drop(keys);
        let ns = start.elapsed().as_nanos() as u64;
        self.write_ns.record(ns);
        self.store_ns[((ios[0].1.len() / PAGE_SIZE).trailing_zeros() as usize).min(9)].record(ns);
        Ok(())
    }

    /// Read the pages of the slots from `slot` into `dst`, a GETRANGE per run they lie in.
    fn read_pages(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        if self.stop.load(Ordering::Acquire) {
            return Err(io::Error::other(format!("the remote tier {}: the engine has closed it (its keys are deleted)", self.spec)));
        }
        let start = Instant::now();
        let pages = dst.len() / PAGE_SIZE;
        let mut done = 0;
        while done < pages {
            let at = slot + done as u64;
            let first = match self.run_of[at as usize].load(Ordering::Relaxed) {
                0 => {
                    return Err(io::Error::new(io::ErrorKind::NotFound, format!("the remote tier {}: slot {at} holds nothing", self.spec)))
                }
                f => (f - 1) as u64,
            };
            let mut n = 1;
            while done + n < pages && self.run_of[(at + n as u64) as usize].load(Ordering::Relaxed) as u64 == first + 1 {
                n += 1;
            }
            let write = self.write_of[first as usize].load(Ordering::Relaxed);
            let key = self.key(first, write);
            let index = at - first;
            let from = index as usize * SEALED_PAGE;
            let to = from + n * SEALED_PAGE - 1;
            let what = || format!("reading key {key}");
            let bytes: Vec<u8> = self.with_conn(&what, |conn| {
                let got: Vec<u8> = redis::cmd("GETRANGE").arg(&key).arg(from).arg(to).query(conn)?;
                if got.len() != n * SEALED_PAGE {
                    // Gone (expired, or lost with every copy): retrying cannot bring it back,
                    // but a failover in progress can answer empty for a moment.
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "the key is missing or short",
                        format!("{} of {} bytes", got.len(), n * SEALED_PAGE),
                    )));
                }
                Ok(got)
            })?;
            for i in 0..n {
                let sealed = &bytes[i * SEALED_PAGE..(i + 1) * SEALED_PAGE];
                let out = &mut dst[(done + i) * PAGE_SIZE..(done + i + 1) * PAGE_SIZE];
                out.copy_from_slice(&sealed[..PAGE_SIZE]);
                let tag: [u8; TAG_LEN] = sealed[PAGE_SIZE..].try_into().unwrap();
                if self.sealer.open(write, (index + i as u64) as u32, key.as_bytes(), out, &tag).is_err() {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the remote tier {}: page {} of key {key} fails authentication", self.spec, index + i as u64),
                    ));
                }
            }
            done += n;
        }
        self.swpin.fetch_add(pages as u64, Ordering::Relaxed);
        self.fetch_ns[(pages.trailing_zeros() as usize).min(9)].record(start.elapsed().as_nanos() as u64);
        Ok(())
    }

    /// The pages of a freed folio: a run whose last page goes has its key deleted.
    fn discard(&self, slot: u64, pages: u64) {
        for at in slot..slot + pages {
            let first = match self.run_of[at as usize].swap(0, Ordering::Relaxed) {
                0 => continue,
                f => f - 1,
            };
            if self.live[first as usize].fetch_sub(1, Ordering::Relaxed) == 1 {
                let mut keys = self.keys.lock().unwrap();
                if let Some((write, bytes)) = keys.live.remove(&first) {
                    self.bytes.fetch_sub(bytes, Ordering::Relaxed);
                    let key = self.key(first as u64, write);
                    keys.doomed.push(key);
                    if keys.doomed.len() >= 256 {
                        self.wake.notify_one();
                    }
                }
            }
        }
    }

    fn set_down(&self, err: &io::Error) {
        let mut down = self.down.lock().unwrap();
        if down.is_none() {
            eprintln!("folioswap: {err}; the remote tier takes no writes until its cluster is ok again");
        }
        *down = Some(err.to_string());
        self.is_down.store(true, Ordering::Release);
    }

    /// While down: whether the cluster is ok again (CLUSTER INFO of a node says so).
    fn check_up(&self) {
        let ok = self.client.get_connection().and_then(|mut c| {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c)?;
            Ok(info.contains("cluster_state:ok"))
        });
        if matches!(ok, Ok(true)) {
            *self.down.lock().unwrap() = None;
            self.is_down.store(false, Ordering::Release);
            eprintln!("folioswap: the remote tier {} is ok again and takes writes", self.spec);
        }
    }

    /// Delete `keys` (pipelined); they are counted whether or not each still existed.
    fn delete(&self, keys: &[String]) {
        for chunk in keys.chunks(512) {
            let what = || format!("deleting {} keys from {}", chunk.len(), chunk[0]);
            let done = self.with_conn(&what, |conn| {
                let mut pipe = redis::cluster::cluster_pipe();
                for key in chunk {
                    pipe.cmd("DEL").arg(key).ignore();
                }
                pipe.exec(conn)
            });
            match done {
                Ok(()) => {
                    self.deleted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Err(e) => eprintln!("folioswap: {e}; those keys expire with their lease"),
            }
        }
    }

    /// Renew the live keys' leases every third of [`LEASE`]; delete freed runs' keys as
    /// they pile up (at least every 200 ms).
    fn lease_loop(&self) {
        let mut renewed = Instant::now();
        loop {
            drop(self.wake.wait_timeout(self.keys.lock().unwrap(), Duration::from_millis(200)).unwrap());
            {
                let _deleting = self.deleting.lock().unwrap();
                if self.stop.load(Ordering::Acquire) {
                    // Closing deletes what is left.
                    return;
                }
                let doomed = std::mem::take(&mut self.keys.lock().unwrap().doomed);
                if !doomed.is_empty() {
                    self.delete(&doomed);
                }
            }
            if self.is_down.load(Ordering::Acquire) {
                self.check_up();
            }
            if renewed.elapsed() >= LEASE / 3 {
                renewed = Instant::now();
                let live: Vec<String> =
                    self.keys.lock().unwrap().live.iter().map(|(&first, &(write, _))| self.key(first as u64, write)).collect();
                for chunk in live.chunks(1024) {
                    let what = || format!("renewing the lease of {} keys from {}", chunk.len(), chunk[0]);
                    let renewed = self.with_conn(&what, |conn| {
                        let mut pipe = redis::cluster::cluster_pipe();
                        for key in chunk {
                            pipe.cmd("PEXPIRE").arg(key).arg(LEASE.as_millis() as u64).ignore();
                        }
                        pipe.exec(conn)
                    });
                    if let Err(e) = renewed {
                        eprintln!("folioswap: {e}");
                    }
                }
            }
        }
    }
}

impl SwapIo for RemoteTier {
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        self.shared.write_runs(&[(slot, data)])
    }
    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        if ios.is_empty() {
            return Ok(());
        }
        self.shared.write_runs(ios)
    }
    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        self.shared.read_pages(slot, dst)
    }
    fn slots(&self) -> u64 {
        REMOTE_SLOTS
    }
    fn discard(&self, slot: u64, pages: u64) {
        self.shared.discard(slot, pages)
    }
    fn is_remote(&self) -> bool {
        true
    }
    fn close(&self) {
        self.close_once()
    }
    fn down(&self) -> Option<String> {
        if !self.shared.is_down.load(Ordering::Acquire) {
            return None;
        }
        let why = self.shared.down.lock().unwrap().clone();
        why.map(|w| format!("{w} (the remote tier takes no writes until its cluster is ok again)"))
    }
    fn stats(&self) -> SwapIoStats {
        let s = &self.shared;
        let swpout = s.swpout.load(Ordering::Relaxed);
        let swpin = s.swpin.load(Ordering::Relaxed);
        let by_size = |hs: &[Histogram; 10]| -> Vec<(String, Latency)> {
            hs.iter()
                .enumerate()
                .filter_map(|(order, h)| h.summary().map(|l| (crate::size::format_bytes((PAGE_SIZE << order) as u64), l)))
                .collect()
        };
        let fetch_latency = by_size(&s.fetch_ns);
        let store_latency = by_size(&s.store_ns);
        SwapIoStats {
            reads: swpin,
            writes: swpout,
            bytes_read: swpin * PAGE_SIZE as u64,
            bytes_written: swpout * PAGE_SIZE as u64,
            errors: s.errors.load(Ordering::Relaxed),
            read_latency: None,
            write_latency: s.write_ns.summary(),
            encrypted: true,
            remote: Some(RemoteStat {
                nodes: s.spec.to_string(),
                masters: s.masters,
                wait_replicas: s.wait_replicas,
                key_prefix: format!("fsw:{{{}-", s.engine_id),
                keys: s.keys.lock().unwrap().live.len() as u64,
                bytes: s.bytes.load(Ordering::Relaxed),
                remote_swpout: swpout,
                remote_swpin: swpin,
                remote_errors: s.errors.load(Ordering::Relaxed),
                keys_deleted: s.deleted.load(Ordering::Relaxed),
                remote_unreplicated: s.unreplicated.load(Ordering::Relaxed),
                timeout_ms: s.timeout.as_millis() as u64,
                down: self.down(),
                lease_ms: LEASE.as_millis() as u64,
                fetch_latency,
                store_latency,
                write_latency: s.write_ns.summary(),
            }),
        }
    }
}

impl RemoteTier {
    /// Stop renewing leases and delete every key this engine still has on the cluster;
    /// reads fail from then on. Once; dropping the tier does it too.
    fn close_once(&self) {
        let s = &self.shared;
        if s.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        s.wake.notify_all();
        // A write already on its way deletes its own keys when it finds the tier closed;
        // wait for it, or the process could exit with its key just stored. A write gives
        // up within the timeout.
        let until = Instant::now() + s.timeout + Duration::from_secs(1);
        while s.writing.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        // After any batch the lease thread took before the stop: it deletes that batch
        // before letting go, and takes no other.
        let _deleting = s.deleting.lock().unwrap();
        let mut keys = s.keys.lock().unwrap();
        let mut all = std::mem::take(&mut keys.doomed);
        all.extend(keys.live.drain().map(|(first, (write, _))| s.key(first as u64, write)));
        drop(keys);
        s.delete(&all);
    }
}

impl Drop for RemoteTier {
    fn drop(&mut self) {
        self.close_once();
        if let Some(t) = self.lease_thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_nodes_or_says_what_is_wrong() {
        let s: RemoteSpec = "redis://127.0.0.1:7000,10.0.0.2:7001".parse().unwrap();
        assert_eq!(s.nodes, vec!["127.0.0.1:7000", "10.0.0.2:7001"]);
        assert_eq!(s.to_string(), "redis://127.0.0.1:7000,10.0.0.2:7001");
        assert_eq!(s.to_string().parse::<RemoteSpec>().unwrap(), s);
        for (bad, why) in [
            ("127.0.0.1:7000", "redis://"),
            ("redis://", "no node"),
            ("redis://h", ":PORT"),
            ("redis://h:x", "not a port"),
            ("redis://:1", "no host"),
        ] {
            let err = bad.parse::<RemoteSpec>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn the_shape_of_a_cluster() {
        let three = "a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n\
                     c 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383\n";
        assert_eq!(cluster_shape(three), (3, 0));
        let six = format!(
            "{three}d 127.0.0.1:7003@17003 slave a 0 0 1 connected\ne 127.0.0.1:7004@17004 slave b 0 0 2 connected\n\
             f 127.0.0.1:7005@17005 slave c 0 0 3 connected\n"
        );
        assert_eq!(cluster_shape(&six), (3, 1));
        let one_lost = six.replace("slave c 0", "slave,fail c 0");
        assert_eq!(cluster_shape(&one_lost), (3, 0), "a master without a live replica: writes cannot wait for one");
        let seeds: Vec<&str> = node_addresses(&one_lost).collect();
        assert_eq!(seeds, ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003", "127.0.0.1:7004"]);
        assert_eq!(connected_replicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"), Some(0));
        assert_eq!(connected_replicas("role:master\nconnected_slaves:2\nslave0:ip=…"), Some(2));
    }
}
