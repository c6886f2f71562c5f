#!/usr/bin/env bash
# Installs what is missing (scripts/deps.sh), then configures (once) and builds shardcache in
# build/ as a Release build. Works from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/deps.sh
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j"$(nproc)"
