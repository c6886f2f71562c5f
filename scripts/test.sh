#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit and integration) with ctest; then
# scripts/check.sh: the layout of every C++ file (clang-format), the clang build with
# thread-safety analysis and -Werror whose unit tests run under ASan+UBSan, and the
# ThreadSanitizer run of the concurrency suites (README.md, "Testing").
# Exits non-zero at the first stage that fails; running no test at all is an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/build.sh
ctest --test-dir build --output-on-failure --no-tests=error -j2 --timeout 300
exec bash scripts/check.sh
