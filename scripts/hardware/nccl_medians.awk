# Medians of nccl_net_perf's rows over alternating runs, per label (the
# "# nccl_net_perf (LABEL)" line), and eccl's plugin against NCCL's sockets.
function median(list,    n, a, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; i++)
    for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
  if (n == 0) return 0
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ sub(/^\[[0-9]+\] /, "") }
/^# nccl_net_perf \(/ { label = $3; gsub(/[():]/, "", label); labels[label] = 1 }
/^(allreduce|sendrecv) / {
  key = ($1 == "allreduce" ? 0 : 1e15) + $2
  op[key] = $1; size[key] = $2
  bus[label, key] = bus[label, key] " " $6
  runs[label, key]++
}
/^# creation/ { first[label] = first[label] " " $5; again[label] = again[label] " " $9 }
END {
  printf "%-10s %12s %14s %14s %8s %5s\n", "op", "size", "eccl-plugin", "nccl-socket", "ratio", "runs"
  n = 0
  for (k in op) keys[++n] = k + 0
  for (i = 2; i <= n; i++)
    for (j = i; j > 1 && keys[j - 1] > keys[j]; j--) { t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t }
  for (i = 1; i <= n; i++) {
    k = keys[i]
    a = median(bus["eccl-plugin", k]); b = median(bus["nccl-socket", k])
    printf "%-10s %12d %14.3f %14.3f %8.2f %5d\n", op[k], size[k], a, b, (b > 0 ? a / b : 0), runs["eccl-plugin", k]
  }
  for (l in labels) printf "creation (%s): first %.2f ms, re-created %.2f ms (medians)\n", l, median(first[l]), median(again[l])
}
