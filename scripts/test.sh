#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit and integration) with ctest.
# Exits with ctest's status; running no test at all is an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/build.sh
exec ctest --test-dir build --output-on-failure --no-tests=error -j2 --timeout 300
