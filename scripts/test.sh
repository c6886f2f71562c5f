#!/usr/bin/env bash
# Checks the layout of every C++ file (scripts/check.sh format: clang-format), installs what is
# missing, builds, and runs every test (unit and integration) with ctest; then scripts/check.sh
# asan tsan: the clang build with thread-safety analysis and -Werror whose unit tests run under
# ASan+UBSan, and the ThreadSanitizer run of the concurrency suites (docs/testing.md); last,
# the docker-compose deployment, built and run as docs/operations.md runs it (integration_tests/
# compose_test.py: a stage of its own, not a ctest test, because the image's build compiles the
# project and would slow the timed tests that ctest runs beside it; about 12 minutes on a machine
# that never built the image (debootstrap 3, the build 7), 2 to 3 once its layers are cached).
# Exits non-zero at the first stage that fails; running no test at all is an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The layout first: it takes seconds, where the rest takes many minutes.
bash scripts/check.sh format
bash scripts/build.sh
ctest --test-dir build --output-on-failure --no-tests=error -j2 --timeout 300
bash scripts/check.sh asan tsan
exec /usr/bin/python3 integration_tests/compose_test.py
