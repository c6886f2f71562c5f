#!/usr/bin/env bash
# The default deployment on this machine, without Docker: installs what is missing, builds, and
# runs on loopback, in the foreground, a cache server (cache role), shard "a"'s store (shard
# role) and one shard_replicator for shard "a" that copies what shard "a"'s ClusterCachedResources
# select from its store into the cache. Ctrl-C or SIGTERM stops them all: SIGTERM to the
# replicator first (it releases its lease in the shard store), then to the two stores, waiting
# for each to drain and exit.
#
# Everything here is plaintext on loopback; docs/security.md shows the same
# deployment with TLS, client certificates and authorization (scripts/make-certs.sh).
#
# Ports can be changed with SHARDCACHE_CACHE_PORT, SHARDCACHE_CACHE_HTTP_PORT,
# SHARDCACHE_SHARD_PORT, SHARDCACHE_SHARD_HTTP_PORT and SHARDCACHE_REPLICATOR_HTTP_PORT.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOST=127.0.0.1
CACHE_PORT="${SHARDCACHE_CACHE_PORT:-7070}"
CACHE_HTTP_PORT="${SHARDCACHE_CACHE_HTTP_PORT:-8070}"
SHARD_PORT="${SHARDCACHE_SHARD_PORT:-7071}"
SHARD_HTTP_PORT="${SHARDCACHE_SHARD_HTTP_PORT:-8071}"
REPLICATOR_HTTP_PORT="${SHARDCACHE_REPLICATOR_HTTP_PORT:-8072}"
ALL_PORTS=("$CACHE_PORT" "$CACHE_HTTP_PORT" "$SHARD_PORT" "$SHARD_HTTP_PORT" "$REPLICATOR_HTTP_PORT")
RUN_DIR=.run
SERVER_BINARY=build/cache_server/cache_server
REPLICATOR_BINARY=build/shard_replicator/shard_replicator

CACHE_FLAGS=(--role=cache --listen="$HOST:$CACHE_PORT" --http-listen="$HOST:$CACHE_HTTP_PORT")
SHARD_FLAGS=(--role=shard --listen="$HOST:$SHARD_PORT" --http-listen="$HOST:$SHARD_HTTP_PORT")
# Each store keeps its data (RocksDB) here, across restarts.
CACHE_FLAGS+=(--data-dir="$RUN_DIR/cache")
SHARD_FLAGS+=(--data-dir="$RUN_DIR/shard-a")
# The replicator keeps nothing on disk: its lease lives in the shard store, its copies in the
# cache. Its identity defaults to the host name and a random suffix.
REPLICATOR_FLAGS=(--shard=a --shard-store="$HOST:$SHARD_PORT" --cache="$HOST:$CACHE_PORT"
  --http-listen="$HOST:$REPLICATOR_HTTP_PORT")

CACHE_NAME="cache server (cache role)"
SHARD_NAME="shard store \"a\" (shard role)"
REPLICATOR_NAME="shard_replicator for shard \"a\""

for port in "${ALL_PORTS[@]}"; do
  if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    echo "run.sh: invalid port '$port' (check the SHARDCACHE_*_PORT variables)" >&2
    exit 2
  fi
done

if (($(printf '%s\n' "${ALL_PORTS[@]}" | sort -u | wc -l) != ${#ALL_PORTS[@]})); then
  echo "run.sh: the ${#ALL_PORTS[@]} ports must differ: ${ALL_PORTS[*]}" >&2
  exit 2
fi

# listening PORT: true if something accepts TCP connections on HOST:PORT.
listening() {
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# http_ok PORT PATH: true if GET http://HOST:PORT/PATH answers 200 (bash alone, no curl).
http_ok() {
  local status
  status="$(
    exec 2>/dev/null
    exec 3<>"/dev/tcp/$HOST/$1" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$HOST" >&3
    IFS= read -r -t 2 line <&3 && printf '%s' "$line"
  )" || return 1
  [[ "$status" == "HTTP/1."?" 200"* ]]
}

bash scripts/build.sh cache_server shard_replicator

busy=()
for port in "${ALL_PORTS[@]}"; do
  if listening "$port"; then busy+=("$HOST:$port"); fi
done
if ((${#busy[@]} > 0)); then
  echo "run.sh: already in use: ${busy[*]}. Stop what listens there (is another run.sh or" \
    "docker-compose running?) or choose other ports with SHARDCACHE_CACHE_PORT," \
    "SHARDCACHE_CACHE_HTTP_PORT, SHARDCACHE_SHARD_PORT, SHARDCACHE_SHARD_HTTP_PORT," \
    "SHARDCACHE_REPLICATOR_HTTP_PORT." >&2
  exit 1
fi

mkdir -p "$RUN_DIR"

# The processes, in the order they start; they are stopped in the reverse order.
pids=()
declare -A names=()

# stop_and_wait PID...: SIGTERM to each, then reaps them, even if a signal interrupts a wait.
stop_and_wait() {
  local pid
  kill -TERM "$@" 2>/dev/null || true
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" 2>/dev/null || true; done
  done
}

# stop_all STATUS: stops the replicator (if started), then the stores, and exits with STATUS.
# A second Ctrl-C or SIGTERM while waiting kills them all.
stop_all() {
  trap 'echo "run.sh: killing the servers" >&2; kill -KILL "${pids[@]}" 2>/dev/null || true' INT TERM
  if ((${#pids[@]} > 2)); then stop_and_wait "${pids[@]:2}"; fi
  if ((${#pids[@]} > 0)); then stop_and_wait "${pids[@]:0:2}"; fi
  exit "$1"
}
trap 'echo "run.sh: stopping (SIGTERM to each process; Ctrl-C again to kill them)" >&2; stop_all 130' INT
trap 'echo "run.sh: stopping (SIGTERM to each process)" >&2; stop_all 143' TERM

# wait_until PID WHAT COMMAND...: waits up to 30 s for COMMAND to succeed; stops everything if the
# process exits first or the time runs out.
wait_until() {
  local pid="$1" what="$2" tries status
  shift 2
  for ((tries = 0; ; tries++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      status=0
      wait "$pid" || status=$?
      echo "run.sh: ${names[$pid]} exited during startup (status $status)" >&2
      stop_all 1
    fi
    if "$@"; then return 0; fi
    if ((tries == 300)); then
      echo "run.sh: ${names[$pid]} is not $what after 30 s" >&2
      stop_all 1
    fi
    sleep 0.1
  done
}

"$SERVER_BINARY" "${CACHE_FLAGS[@]}" &
pids+=("$!")
names[$!]="$CACHE_NAME"
"$SERVER_BINARY" "${SHARD_FLAGS[@]}" &
pids+=("$!")
names[$!]="$SHARD_NAME"

# Each store must accept connections on both its ports before the replicator starts.
for port in "$CACHE_PORT" "$CACHE_HTTP_PORT"; do
  wait_until "${pids[0]}" "listening on $HOST:$port" listening "$port"
done
for port in "$SHARD_PORT" "$SHARD_HTTP_PORT"; do
  wait_until "${pids[1]}" "listening on $HOST:$port" listening "$port"
done

"$REPLICATOR_BINARY" "${REPLICATOR_FLAGS[@]}" &
pids+=("$!")
names[$!]="$REPLICATOR_NAME"
# Ready once its informers on both stores have synced.
wait_until "${pids[2]}" "ready (http://$HOST:$REPLICATOR_HTTP_PORT/readyz)" \
  http_ok "$REPLICATOR_HTTP_PORT" /readyz

echo "$CACHE_NAME: grpcurl -plaintext $HOST:$CACHE_PORT list   metrics: http://$HOST:$CACHE_HTTP_PORT/metrics"
echo "$SHARD_NAME: grpcurl -plaintext $HOST:$SHARD_PORT list   metrics: http://$HOST:$SHARD_HTTP_PORT/metrics"
echo "$REPLICATOR_NAME: metrics: http://$HOST:$REPLICATOR_HTTP_PORT/metrics"
echo "run.sh: running; Ctrl-C stops all three"

# Runs until a process exits on its own or a signal arrives (the traps above handle signals).
status=0
exited=""
wait -n -p exited "${pids[@]}" || status=$?
echo "run.sh: ${names[$exited]:-a process} exited (status $status); stopping the others" >&2
stop_all "$status"
