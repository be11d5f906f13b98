#!/usr/bin/env bash
# The coordinator at scale, the full form (CI runs a 64-member slice as the
# coord_scale_slice test): perf/coord_scale against one coordinator and
# against a replicated one on a real three-node etcd cluster, runs
# alternating, ROUNDS of each per size; prints every run, then the medians
# and the median of the per-run ratios replicated / single (the table in
# docs/performance.md). --check holds in every run: every survivor is told
# of the death and a standby takes the dead rank.
#   scripts/coord_scale.sh [ROUNDS] [SIZES]     (default 3 and 256,1024,4096)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} sizes=${2:-256,1024,4096}
scripts/setup.sh
scripts/build.sh build >/dev/null
tmp=$(mktemp -d)
mkfifo "$tmp/etcd.in"
build/tests/etcd_cluster 3 <"$tmp/etcd.in" >"$tmp/etcd.out" 2>"$tmp/etcd.log" &
etcd_pid=$!
exec {hold}>"$tmp/etcd.in"
trap 'kill "$etcd_pid" 2>/dev/null; wait "$etcd_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 300); do grep -q '^ETCD_ENDPOINTS=' "$tmp/etcd.out" && break; sleep 0.1; done
endpoints=$(sed -n 's/^ETCD_ENDPOINTS=//p' "$tmp/etcd.out")
[ -n "$endpoints" ] || { echo "no etcd cluster"; cat "$tmp/etcd.log"; exit 1; }
for round in $(seq 1 "$rounds"); do
  for n in ${sizes//,/ }; do
    for mode in single replicated; do
      extra=()
      [ "$mode" = replicated ] && extra=(--etcd "$endpoints")
      line=$(build/perf/coord_scale --members "$n" --standbys 64 --steady-s 3 --check --json "${extra[@]}" | grep '^{')
      echo "$mode $line" | tee -a "$tmp/runs"
    done
  done
done
python3 - "$tmp/runs" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, text = line.split(" ", 1)
    r = json.loads(text)
    runs.setdefault((r["members"], mode), []).append(r)
keys = ["admit_ms", "coord_cpu_pct", "notice_p50_ms", "notice_max_ms", "replace_ms"]
print("\n# medians; replicated also as the median of per-run ratios replicated / single")
print("#  members        mode " + " ".join(f"{k:>14}" for k in keys))
for n in sorted({n for n, _ in runs}):
    single, repl = runs[(n, "single")], runs[(n, "replicated")]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    print(f"{n:10} {'single':>11} " + " ".join(f"{med(single, k):14.1f}" for k in keys))
    ratio = lambda k: statistics.median(b[k] / a[k] for a, b in zip(single, repl) if a[k])
    print(f"{n:10} {'replicated':>11} " + " ".join(f"{med(repl, k):8.1f} ({ratio(k):.2f}x)" for k in keys))
EOF
