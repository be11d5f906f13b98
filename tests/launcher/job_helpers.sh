# Sourced by the shell tests of jobs with replicated coordinators or standbys.
#
# start_etcd_cluster ETCD_CLUSTER DIR [HOST]: a three-node etcd cluster whose
# clients are served at HOST (default 127.0.0.1); sets `endpoints` and
# `etcd_pid`, fails if it did not come up in 30 s. It holds until its
# standard input (a fifo held open here) closes or it is signalled; stop it
# with `kill "$etcd_pid"; wait "$etcd_pid"` so it removes its nodes' data.
start_etcd_cluster() {
  local program=$1 dir=$2 host=${3:-127.0.0.1}
  mkfifo "$dir/etcd.in"
  "$program" 3 "$host" <"$dir/etcd.in" >"$dir/etcd.out" 2>"$dir/etcd.log" &
  etcd_pid=$!
  exec {etcd_hold}>"$dir/etcd.in"
  for _ in $(seq 300); do grep -q '^ETCD_ENDPOINTS=' "$dir/etcd.out" && break; sleep 0.1; done
  endpoints=$(sed -n 's/^ETCD_ENDPOINTS=//p' "$dir/etcd.out")
  [ -n "$endpoints" ]
}

# await_formed ECCLCOORD ID_FILE OUT: waits (30 s at most) until the job's
# status, kept in OUT, shows epoch 1 with 4 ranks and a standby.
await_formed() {
  for _ in $(seq 300); do
    "$1" status --id-file "$2" >"$3" 2>&1 && grep -q "standby:" "$3" && grep -q "epoch 1, 4 ranks" "$3" && return 0
    sleep 0.1
  done
  return 1
}
