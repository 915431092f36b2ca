# Shared by tests/cluster/failover_drill.sh and bench/cluster_failover_bench.sh: a work
# dir with its own HOME (empty model cache, no DSINFER_* settings), etcd on free loopback
# ports, `start NAME ARGS...` for dsinfer processes (waits for "listening on"), cleanup
# of every process on exit. Source it after setting `build` (the build dir).
# Sets: src, bin, work, pids, etcd_pid, ecp (etcd client port); defines start, fail.
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$build/apps/dsinfer/dsinfer"
work="$(mktemp -d "${TMPDIR:-/tmp}/dsi_cluster_XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.out "$work"/*.err; do [[ -s "$f" ]] && { echo "== $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
unset XDG_CACHE_HOME $(env | sed -n 's/^\(DSINFER_[A-Z_]*\)=.*/\1/p')
export HOME="$work/home"
mkdir -p "$HOME"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# etcd on loopback (Debian's etcd-server; scripts/setup.sh installs it).
ecp=$(free_port); epp=$(free_port)
etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$ecp" \
  --advertise-client-urls "http://127.0.0.1:$ecp" --listen-peer-urls "http://127.0.0.1:$epp" \
  --initial-advertise-peer-urls "http://127.0.0.1:$epp" \
  --initial-cluster "default=http://127.0.0.1:$epp" --log-level error \
  > "$work/etcd.out" 2> "$work/etcd.err" &
etcd_pid=$!
pids+=("$etcd_pid")
for _ in $(seq 100); do
  curl -sf -X POST "http://127.0.0.1:$ecp/v3/kv/range" -d '{"key":"AA=="}' > /dev/null && break
  sleep 0.1
done

start() {  # start NAME ARGS... -> sets last_pid, last_port; $START_PREFIX (e.g. "taskset -c 0") runs before the binary
  local name="$1"
  shift
  ${START_PREFIX:-} "$bin" "$@" --port 0 > "$work/$name.out" 2> "$work/$name.err" &
  last_pid=$!
  pids+=("$last_pid")
  last_port=""
  for _ in $(seq 900); do
    last_port="$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$name.out" 2>/dev/null || true)"
    [[ -n "$last_port" ]] && return 0
    kill -0 "$last_pid" 2>/dev/null || break
    sleep 0.2
  done
  fail "$name did not start"
}
