#!/usr/bin/env bash
# The remote tier against the swap file (issue 16): usemem 2M and 64K, --limit 256M
# --max-pool 64M, 3 runs of each configuration, interleaved: the swap file made on demand,
# the same file with --encrypt, a 3-master Redis cluster, and 3 masters + 3 replicas (every
# write waits for a replica). Starts its clusters on loopback ports 7300-7302 and
# 7400-7405 (redis-server and redis-cli needed) and stops them at the end.
# Output: one JSON line per run in bench-results/remote-tier.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench-results/remote-tier.jsonl
dir=$(mktemp -d /tmp/folioswap-bench-redis.XXXXXX)

start_cluster() { # BASEPORT NODES REPLICAS
    local base=$1 n=$2 rep=$3 nodes=() i p
    for i in $(seq 0 $((n - 1))); do
        p=$((base + i)); mkdir -p "$dir/$p"; nodes+=("127.0.0.1:$p")
        redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 --repl-diskless-sync-delay 0 \
            --save '' --appendonly no --dir "$dir/$p" --logfile log --daemonize yes
    done
    sleep 0.5
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas "$rep" --cluster-yes >"$dir/create-$base.log"
    for _ in $(seq 100); do
        local down=0
        for i in $(seq 0 $((n - 1))); do
            redis-cli -p $((base + i)) cluster info | grep -q cluster_state:ok || down=1
            redis-cli -p $((base + i)) info replication | grep -q master_link_status:down && down=1
        done
        [ $down = 0 ] && return 0
        sleep 0.2
    done
    echo "cluster at $base did not come up (logs in $dir)" >&2; return 1
}
stop_clusters() {
    for p in 7300 7301 7302 7400 7401 7402 7403 7404 7405; do redis-cli -p $p shutdown nosave >/dev/null 2>&1 || true; done
    rm -rf "$dir"
}
trap stop_clusters EXIT
start_cluster 7300 3 0
start_cluster 7400 6 1

: >"$out"
for run in 1 2 3; do
    for folio in 2M 64K; do
        for cfg in file file-encrypt remote3 remote3x2; do
            case $cfg in
                file) extra=() ;;
                file-encrypt) extra=(--encrypt) ;;
                remote3) extra=(--remote-tier redis://127.0.0.1:7300) ;;
                remote3x2) extra=(--remote-tier redis://127.0.0.1:7400) ;;
            esac
            ./target/release/folioswap bench usemem --threads 2 --size 1G --limit 256M --max-pool 64M \
                --folio "$folio" --rounds 3 --json "${extra[@]}" >"$dir/run.json" 2>"$dir/run.err"
            python3 - "$cfg" "$folio" "$run" "$dir/run.json" >>"$out" <<'PY'
import json, sys
cfg, folio, run, path = sys.argv[1:]
r = json.load(open(path))
io = r["stats"].get("swap", {}).get("io", {})
rem = io.get("remote") or {}
print(json.dumps({"cfg": cfg, "folio": folio, "run": int(run), "mb_s": r["throughput_mb_s"], "verified": r["verified"],
    "pswpout": r["stats"]["pswpout"], "pswpin": r["stats"]["pswpin"], "read_latency": io.get("read_latency"),
    "fetch_latency": rem.get("fetch_latency"), "write_latency": io.get("write_latency"),
    "remote_errors": rem.get("remote_errors")}))
PY
            tail -n 1 "$out" | cut -c1-120
        done
    done
done
for p in 7300 7301 7302; do echo "keys left on $p: $(redis-cli -p $p dbsize)"; done
