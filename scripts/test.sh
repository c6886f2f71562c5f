#!/usr/bin/env bash
# Checks the layout of every C++ file (scripts/check.sh format: clang-format), installs what is
# missing, builds, and runs every test (unit and integration) with ctest; then scripts/check.sh
# asan tsan: the clang build with thread-safety analysis and -Werror whose unit tests run under
# ASan+UBSan, and the ThreadSanitizer run of the concurrency suites (README.md, "Testing").
# Exits non-zero at the first stage that fails; running no test at all is an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The layout first: it takes seconds, where the rest takes many minutes.
bash scripts/check.sh format
bash scripts/build.sh
ctest --test-dir build --output-on-failure --no-tests=error -j2 --timeout 300
exec bash scripts/check.sh asan tsan
