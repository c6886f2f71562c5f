#!/usr/bin/env bash
# The default deployment on this machine, without Docker: installs what is missing, builds, and
# runs a cache server (cache role) and shard "a"'s store (shard role) on loopback, in the
# foreground. Ctrl-C or SIGTERM stops both (SIGTERM, then waits for them to drain and exit).
#
# Ports can be changed with SHARDCACHE_CACHE_PORT, SHARDCACHE_CACHE_HTTP_PORT,
# SHARDCACHE_SHARD_PORT and SHARDCACHE_SHARD_HTTP_PORT.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOST=127.0.0.1
CACHE_PORT="${SHARDCACHE_CACHE_PORT:-7070}"
CACHE_HTTP_PORT="${SHARDCACHE_CACHE_HTTP_PORT:-8070}"
SHARD_PORT="${SHARDCACHE_SHARD_PORT:-7071}"
SHARD_HTTP_PORT="${SHARDCACHE_SHARD_HTTP_PORT:-8071}"
RUN_DIR=.run
BINARY=build/cache_server/cache_server

CACHE_FLAGS=(--role=cache --listen="$HOST:$CACHE_PORT" --http-listen="$HOST:$CACHE_HTTP_PORT")
SHARD_FLAGS=(--role=shard --listen="$HOST:$SHARD_PORT" --http-listen="$HOST:$SHARD_HTTP_PORT")
# Each store keeps its data (RocksDB) here, across restarts.
CACHE_FLAGS+=(--data-dir="$RUN_DIR/cache")
SHARD_FLAGS+=(--data-dir="$RUN_DIR/shard-a")

CACHE_NAME="cache server (cache role)"
SHARD_NAME="shard store \"a\" (shard role)"

for port in "$CACHE_PORT" "$CACHE_HTTP_PORT" "$SHARD_PORT" "$SHARD_HTTP_PORT"; do
  if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    echo "run.sh: invalid port '$port' (check the SHARDCACHE_*_PORT variables)" >&2
    exit 2
  fi
done

if (($(printf '%s\n' "$CACHE_PORT" "$CACHE_HTTP_PORT" "$SHARD_PORT" "$SHARD_HTTP_PORT" | sort -u | wc -l) != 4)); then
  echo "run.sh: the four ports must differ: $CACHE_PORT $CACHE_HTTP_PORT $SHARD_PORT $SHARD_HTTP_PORT" >&2
  exit 2
fi

# listening PORT: true if something accepts TCP connections on HOST:PORT.
listening() {
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

bash scripts/build.sh cache_server

busy=()
for port in "$CACHE_PORT" "$CACHE_HTTP_PORT" "$SHARD_PORT" "$SHARD_HTTP_PORT"; do
  if listening "$port"; then busy+=("$HOST:$port"); fi
done
if ((${#busy[@]} > 0)); then
  echo "run.sh: already in use: ${busy[*]}. Stop what listens there (is another run.sh or" \
    "docker-compose running?) or choose other ports with SHARDCACHE_CACHE_PORT," \
    "SHARDCACHE_CACHE_HTTP_PORT, SHARDCACHE_SHARD_PORT, SHARDCACHE_SHARD_HTTP_PORT." >&2
  exit 1
fi

mkdir -p "$RUN_DIR"

pids=()
declare -A names=()

# wait_for_all_to_exit: reaps every server, even if a signal interrupts a wait.
wait_for_all_to_exit() {
  local pid
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" 2>/dev/null || true; done
  done
}

# stop_all STATUS: SIGTERM to every server, wait for them, exit with STATUS. A second Ctrl-C
# or SIGTERM while waiting kills them.
stop_all() {
  trap 'echo "run.sh: killing the servers" >&2; kill -KILL "${pids[@]}" 2>/dev/null || true' INT TERM
  if ((${#pids[@]} > 0)); then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait_for_all_to_exit
  fi
  exit "$1"
}
trap 'echo "run.sh: stopping (SIGTERM to the servers; Ctrl-C again to kill them)" >&2; stop_all 130' INT
trap 'echo "run.sh: stopping (SIGTERM to the servers)" >&2; stop_all 143' TERM

"$BINARY" "${CACHE_FLAGS[@]}" &
pids+=("$!")
names[$!]="$CACHE_NAME"
"$BINARY" "${SHARD_FLAGS[@]}" &
pids+=("$!")
names[$!]="$SHARD_NAME"

# Wait until each server accepts connections on both ports (or exits, which is a failure).
for i in 0 1; do
  pid="${pids[$i]}"
  if ((i == 0)); then ports=("$CACHE_PORT" "$CACHE_HTTP_PORT"); else ports=("$SHARD_PORT" "$SHARD_HTTP_PORT"); fi
  for port in "${ports[@]}"; do
    for ((tries = 0; ; tries++)); do
      if ! kill -0 "$pid" 2>/dev/null; then
        status=0
        wait "$pid" || status=$?
        echo "run.sh: ${names[$pid]} exited during startup (status $status)" >&2
        stop_all 1
      fi
      if listening "$port"; then break; fi
      if ((tries == 300)); then
        echo "run.sh: ${names[$pid]} is not listening on $HOST:$port after 30 s" >&2
        stop_all 1
      fi
      sleep 0.1
    done
  done
done

echo "$CACHE_NAME: grpcurl -plaintext $HOST:$CACHE_PORT list   metrics: http://$HOST:$CACHE_HTTP_PORT/metrics"
echo "$SHARD_NAME: grpcurl -plaintext $HOST:$SHARD_PORT list   metrics: http://$HOST:$SHARD_HTTP_PORT/metrics"
echo "run.sh: running; Ctrl-C stops both"

# Runs until a server exits on its own or a signal arrives (the traps above handle signals).
status=0
exited=""
wait -n -p exited "${pids[@]}" || status=$?
echo "run.sh: ${names[$exited]:-a server} exited (status $status); stopping the other" >&2
stop_all "$status"
