#!/usr/bin/env bash
# Watch delivery to a Go (grpc-go) client, cache_server and etcd side by side.
#
# Builds bench/go/watchbench (GOPATH mode, Debian's Go packages, shardcache stubs generated from
# proto/ into the build directory), starts etcd and cache_server on 127.0.0.1 ports, runs the
# same load against each (etcd then cache_server, --rounds times) and prints one Markdown table
# per scenario with the ratio cache_server / etcd. See docs/BENCHMARKS.md, "Figure 10".
# The target rest (--targets=etcd,cache,rest) is cache_server with the same writes and its
# watchers on its Kubernetes view (--kube-api-listen) over HTTP/1.1, as client-go watches; its
# column and its ratio to etcd go beside cache_server's.
#
#   bench/go_watch_bench.sh --scenario=a,b,c --rounds=2 --cache-server=/tmp/cache_server.base
#   bench/go_watch_bench.sh --scenario=a,b --rounds=1 --targets=etcd,cache,rest
#   bench/go_watch_bench.sh --scenario=custom -- --watchers=200 --write-rate=1000
#
# Scenarios (the flags of watchbench they stand for; anything after -- is added to them):
#   a: --watchers=1000  --watchers-per-conn=16 --resources=1   --write-rate=100
#   b: --watchers=1000  --watchers-per-conn=16 --resources=1   --write-rate=500
#   c: --watchers=10000 --watchers-per-conn=16 --resources=100 --write-rate=10
#   custom: watchbench's defaults, changed by the flags after --
# The watchers ask for no periodic bookmarks (cache_server: allow_bookmarks unset; etcd: no
# progress_notify), as etcd's and most watchers do; `-- --bookmarks` makes both ask.
# `-- --writer-process` runs the writer in a process of its own: where the watchers saturate the
# client (scenario b; any rest run), the writes of a shared process fall behind its watchers'
# goroutines, and the write figures are the client's scheduler's rather than the server's.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COMMAND_LINE="$0 $*"

scenarios=a
rounds=2
duration=15s
cache_server="$REPO/build/cache_server/cache_server"
etcd=/usr/bin/etcd
build_dir="$REPO/build-gowatch"
out_dir=""
targets="etcd,cache"
cpuprofile=0
install=1
server_args=""
extra=()

usage() {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'
Options:
  --scenario=LIST       a, b, c or custom, comma-separated (default a)
  --rounds=N            rounds per scenario, each runs every target in --targets' order (default 2)
  --duration=D          how long each run writes (default 15s; scenario c: 30s unless given)
  --cache-server=PATH   the cache_server binary (default build/cache_server/cache_server)
  --server-args=ARGS    extra flags for cache_server
  --etcd=PATH           the etcd binary (default /usr/bin/etcd, Debian's etcd-server)
  --targets=LIST        which targets, in order: etcd, cache (cache_server's Store service),
                        rest (cache_server's writes, watches on its Kubernetes view) (default etcd,cache)
  --build-dir=DIR       where the Go program is built (default build-gowatch/)
  --out=DIR             where each run's output and JSON go (default BUILD_DIR/results/TIME)
  --cpuprofile          write a Go CPU profile of the client for each run into --out
  --no-install          do not install missing Debian packages
EOF
}

duration_given=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --scenario=*) scenarios=${1#*=} ;;
    --rounds=*) rounds=${1#*=} ;;
    --duration=*) duration=${1#*=}; duration_given=1 ;;
    --cache-server=*) cache_server=${1#*=} ;;
    --server-args=*) server_args=${1#*=} ;;
    --etcd=*) etcd=${1#*=} ;;
    --targets=*) targets=${1#*=} ;;
    --build-dir=*) build_dir=${1#*=} ;;
    --out=*) out_dir=${1#*=} ;;
    --cpuprofile) cpuprofile=1 ;;
    --no-install) install=0 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "go_watch_bench.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done

[[ -d "$cache_server" ]] && cache_server="$cache_server/cache_server"
cache_server=$(realpath -m "$cache_server")
build_dir=$(realpath -m "$build_dir")
[[ -n "$out_dir" ]] || out_dir="$build_dir/results/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out_dir"
out_dir=$(realpath "$out_dir")

# ---- Debian packages ----
packages=(golang-go golang-google-grpc-dev golang-goprotobuf-dev golang-etcd-server-dev
          protobuf-compiler libprotobuf-dev etcd-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $install -eq 0 ]]; then
    echo "go_watch_bench.sh: missing Debian packages: ${missing[*]}" >&2; exit 1
  fi
  echo "go_watch_bench.sh: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
[[ -x "$cache_server" ]] || { echo "go_watch_bench.sh: no cache_server at $cache_server (--cache-server=PATH)" >&2; exit 1; }
[[ -x "$etcd" ]] || { echo "go_watch_bench.sh: no etcd at $etcd (apt-get install etcd-server, or --etcd=PATH)" >&2; exit 1; }

# ---- Build, in GOPATH mode (Debian's Go libraries are in /usr/share/gocode) ----
gopath="$build_dir/gopath"
gen="$gopath/src/shardcache/gen/storev1"
mkdir -p "$gen" "$build_dir/protoc-out"
# protoc-gen-go 1.3 (plugins=grpc). The well-known types map to golang/protobuf 1.3's own, so
# that every message uses one protobuf runtime.
mapping="Mshardcache/v1/store.proto=shardcache/gen/storev1"
for wkt in struct any timestamp; do
  mapping+=",Mgoogle/protobuf/$wkt.proto=github.com/golang/protobuf/ptypes/$wkt"
done
protoc -I "$REPO/proto" -I /usr/include --go_out="plugins=grpc,$mapping:$build_dir/protoc-out" \
  "$REPO/proto/shardcache/v1/store.proto"
cp "$build_dir/protoc-out/shardcache/v1/store.pb.go" "$gen/store.pb.go"
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="$build_dir/gocache" GOFLAGS=
(cd "$REPO/bench/go/watchbench" && go build -o "$build_dir/watchbench" .)
wb="$build_dir/watchbench"

# ---- Servers ----
tmp=$(mktemp -d /tmp/go_watch_bench.XXXXXX)
etcd_pid=""
cache_pid=""
stop_servers() {
  local pid
  for pid in $cache_pid $etcd_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $cache_pid $etcd_pid; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  cache_pid=""; etcd_pid=""
}
trap 'stop_servers; rm -rf "$tmp"' EXIT

etcd_addr=""
cache_addr=""
rest_addr=""
start_servers() {  # $1: a name for this set of servers (fresh data directories)
  local dir="$tmp/$1" ports peer
  mkdir -p "$dir"
  if [[ ",$targets," == *,etcd,* ]]; then
    read -r -a ports <<<"$("$wb" --free-ports=2 | tr '\n' ' ')"
    etcd_addr="127.0.0.1:${ports[0]}"
    peer="http://127.0.0.1:${ports[1]}"
    "$etcd" --name=bench --data-dir="$dir/etcd" \
      --listen-client-urls="http://$etcd_addr" --advertise-client-urls="http://$etcd_addr" \
      --listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" \
      --initial-cluster="bench=$peer" --initial-cluster-state=new >"$dir/etcd.log" 2>&1 &
    etcd_pid=$!
    if ! "$wb" --target=etcd --addr="$etcd_addr" --probe=30s; then
      tail -20 "$dir/etcd.log" >&2; exit 1
    fi
  fi
  if [[ ",$targets," == *,cache,* || ",$targets," == *,rest,* ]]; then
    # The Kubernetes view only when a target watches through it: without it, cache_server runs
    # as it always did.
    local kube=()
    [[ ",$targets," == *,rest,* ]] && kube=(--kube-api-listen=127.0.0.1:0)
    # shellcheck disable=SC2086  # --server-args is a list of flags
    "$cache_server" --role=cache --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 "${kube[@]}" \
      --port-file="$dir/cache.ports" --data-dir="$dir/cache" $server_args >"$dir/cache.log" 2>&1 &
    cache_pid=$!
    for _ in $(seq 300); do
      [[ -s "$dir/cache.ports" ]] && break
      kill -0 "$cache_pid" 2>/dev/null || break
      sleep 0.1
    done
    if [[ ! -s "$dir/cache.ports" ]]; then
      echo "go_watch_bench.sh: cache_server did not start:" >&2; tail -20 "$dir/cache.log" >&2; exit 1
    fi
    cache_addr="127.0.0.1:$(sed -n 's/^grpc_port=//p' "$dir/cache.ports")"
    "$wb" --target=cache --addr="$cache_addr" --probe=30s
    if [[ ${#kube[@]} -gt 0 ]]; then
      local kube_port
      kube_port=$(sed -n 's/^kube_api_port=//p' "$dir/cache.ports")
      if [[ -z "$kube_port" ]]; then
        echo "go_watch_bench.sh: cache_server wrote no kube_api_port to its port file (does $cache_server have --kube-api-listen?)" >&2
        exit 1
      fi
      rest_addr="127.0.0.1:$kube_port"
      "$wb" --target=rest --addr="$cache_addr" --rest-addr="$rest_addr" --probe=30s
    fi
  fi
}

scenario_flags() {
  case "$1" in
    a) echo "--watchers=1000 --watchers-per-conn=16 --resources=1 --write-rate=100" ;;
    b) echo "--watchers=1000 --watchers-per-conn=16 --resources=1 --write-rate=500" ;;
    c) echo "--watchers=10000 --watchers-per-conn=16 --resources=100 --write-rate=10 --setup-timeout=180s" ;;
    custom) echo "" ;;
    *) echo "go_watch_bench.sh: unknown scenario $1 (a, b, c or custom)" >&2; exit 2 ;;
  esac
}

report="$out_dir/report.md"
{
  echo '```'
  echo "$COMMAND_LINE"
  echo '```'
  echo
  echo "cache_server: $cache_server ($(sha256sum "$cache_server" | cut -c1-12)); etcd: $("$etcd" --version 2>/dev/null | head -1)"
  echo "machine: $(nproc) cores; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$report"

IFS=',' read -r -a scenario_list <<<"$scenarios"
IFS=',' read -r -a target_list <<<"$targets"
for s in "${scenario_list[@]}"; do
  flags=$(scenario_flags "$s")
  d=$duration
  [[ $s == c && $duration_given -eq 0 ]] && d=30s
  start_servers "$s"
  jsons=()
  for r in $(seq "$rounds"); do
    for t in "${target_list[@]}"; do
      target_flags=()
      case "$t" in
        etcd) addr=$etcd_addr; pid=$etcd_pid ;;
        cache) addr=$cache_addr; pid=$cache_pid ;;
        rest) addr=$cache_addr; pid=$cache_pid; target_flags=(--rest-addr="$rest_addr") ;;
        *) echo "go_watch_bench.sh: unknown target $t (etcd, cache, rest)" >&2; exit 2 ;;
      esac
      base="$out_dir/$s-$t-r$r"
      prof=()
      [[ $cpuprofile -eq 1 ]] && prof=(--cpuprofile="$base.pprof")
      # shellcheck disable=SC2086,SC2206  # $flags is a list of flags
      cmd=("$wb" --target="$t" --addr="$addr" "${target_flags[@]}" --server-pid="$pid" --duration="$d" $flags
           "${extra[@]}" --json="$base.json" --label="scenario $s round $r" "${prof[@]}")
      echo "== scenario $s, round $r, $t: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
      # watchbench bounds itself; this is a second bound, should it hang anyway.
      if ! timeout -k 10 900 "${cmd[@]}" >"$base.txt" 2>&1; then
        echo "go_watch_bench.sh: scenario $s round $r on $t failed:" >&2
        tail -20 "$base.txt" >&2
      fi
      [[ -s "$base.json" ]] && jsons+=("$base.json")
    done
  done
  stop_servers
  {
    echo
    echo "### Scenario $s: $flags --duration=$d ${extra[*]}"
    echo
    if [[ ${#jsons[@]} -gt 0 ]]; then "$wb" --summarize "${jsons[@]}"; else echo "(no run finished)"; fi
  } | tee -a "$report"
done
echo >&2
echo "go_watch_bench.sh: each run's output and JSON are in $out_dir; the tables in $report" >&2
