#!/usr/bin/env bash
# Installs what is missing (scripts/deps.sh), then configures (once) and builds shardcache in
# build/ as a Release build. Works from any directory.
#
#   scripts/build.sh                  everything, tests included
#   scripts/build.sh cache_server     only the named targets
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/deps.sh
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j"$(nproc)" "${targets[@]}"
