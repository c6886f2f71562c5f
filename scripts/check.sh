#!/usr/bin/env bash
# The checks that scripts/test.sh runs (and so CI): format before the Release build and its
# tests, asan and tsan after them.
#
#   format  every C++ file of the repository laid out as .clang-format says (clang-format
#         --dry-run -Werror); `clang-format -i FILE` fixes one.
#   asan  build-asan/: clang with -Wall -Wextra -Wthread-safety -Wthread-safety-beta -Werror, and
#         AddressSanitizer (with LeakSanitizer) + UndefinedBehaviorSanitizer. Builds everything
#         (bench and process tests too, for the warnings); runs every unit test
#         (ctest -LE "process|faults|soak|etcd": not the process, fault, soak and etcd suites),
#         with the cache_server they start built the same way.
#   tsan  build-tsan/: clang with ThreadSanitizer; builds and runs only the concurrency suites
#         (ctest label "concurrency": clock, callback lists, informers, reflector liveness, work
#         queue, worker pool, leader elector, watch cache, object store, write stream) and the
#         cache_server they start.
#
#   scripts/check.sh            every stage
#   scripts/check.sh tsan       only the named stages
#
# Each stage runs even if an earlier one failed, and the exit status is 1 if any failed; a build
# error stops at once. A sanitizer stops a process at its first report. Every report, from a test
# binary or from a server it started, is written to build-*/sanitizer-reports/ and fails the
# stage even if the test passed. Works from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

stages=("$@")
((${#stages[@]})) || stages=(format asan tsan)

bash scripts/deps.sh

# configure DIR SANITIZERS [CMAKE_ARGS...]: a clang build with -Werror and the sanitizers.
configure() {
  local dir="$1" sanitize="$2"
  shift 2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DSHARDCACHE_WERROR=ON -DSHARDCACHE_SANITIZE="$sanitize" \
    "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log" >&2; exit 1; }
}

# run_ctest DIR CTEST_ARGS...: runs the tests, then fails if any sanitizer wrote a report.
run_ctest() {
  local dir="$1" status=0
  shift
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j2 --timeout 600 "$@" || status=$?
  if compgen -G "$reports/*" >/dev/null; then
    for f in "$reports"/*; do
      echo "==== $f" >&2
      cat "$f" >&2
    done
    # Again, short, at the end, where a CI summary that keeps only the output's tail shows it:
    # each report's text with the top frames of each of its stacks (lines cut at 200 characters).
    for f in "$reports"/*; do
      echo "==== $f, top frames" >&2
      awk '/^ *#[0-9]+ / { if (frames++ < 6) { print substr($0, 1, 200); shown++ } }
           !/^ *#[0-9]+ / { frames = 0; print; shown++ }
           shown >= 60 { exit }' "$f" >&2
    done
    echo "check.sh: sanitizer reports in $reports" >&2
    status=1
  fi
  return "$status"
}

failed=()
for stage in "${stages[@]}"; do
  start=$SECONDS
  status=0
  case "$stage" in
    format)
      # The files git tracks (a clean clone's); outside a git work tree, the source folders'.
      files=()
      if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        while IFS= read -r -d '' f; do
          [[ -e "$f" ]] && files+=("$f")
        done < <(git ls-files -z -- '*.cc' '*.h')
      else
        for d in bench cache_server common integration_tests sanitizers shard_replicator; do
          [[ -d "$d" ]] || continue
          while IFS= read -r -d '' f; do files+=("$f"); done \
            < <(find "$d" \( -name '*.cc' -o -name '*.h' \) -print0)
        done
      fi
      if ((${#files[@]} == 0)); then
        echo "check.sh: format: no C++ file found" >&2
        status=1
      else
        clang-format --dry-run -Werror "${files[@]}" || status=$?
      fi
      ;;
    asan)
      dir=build-asan
      # Everything is built, so that -Werror covers all the code; the process tests do not run.
      configure "$dir" address,undefined -DSHARDCACHE_BUILD_BENCH=ON -DSHARDCACHE_BUILD_PROCESS_TESTS=ON
      cmake --build "$dir" -j"$(nproc)"
      reports="$root/$dir/sanitizer-reports"
      rm -rf "$reports" && mkdir -p "$reports"
      ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:strict_init_order=1:detect_stack_use_after_return=1" \
        UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1" \
        run_ctest "$dir" -LE "process|faults|soak|etcd" || status=$?
      ;;
    tsan)
      dir=build-tsan
      configure "$dir" thread -DSHARDCACHE_BUILD_BENCH=OFF -DSHARDCACHE_BUILD_PROCESS_TESTS=OFF
      # Only what the concurrency suites need: the tests and the server they start.
      targets=(cache_server write_stream_test shared_informer_test dynamic_informer_factory_test
        work_queue_test leader_elector_test watch_cache_test fan_out_test object_store_test clock_test
        reflector_liveness_test group_committer_test write_stream_reactor_test watch_call_test
        callback_queue_ticker_test callback_list_test worker_pool_test)
      cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
      reports="$root/$dir/sanitizer-reports"
      rm -rf "$reports" && mkdir -p "$reports"
      TSAN_OPTIONS="log_path=$reports/tsan" \
        run_ctest "$dir" -L concurrency || status=$?
      ;;
    *)
      echo "check.sh: unknown stage $stage (want format, asan or tsan)" >&2
      exit 2
      ;;
  esac
  if ((status == 0)); then
    echo "check.sh: $stage passed in $((SECONDS - start)) s"
  else
    echo "check.sh: $stage FAILED in $((SECONDS - start)) s" >&2
    failed+=("$stage")
  fi
done
if ((${#failed[@]})); then
  echo "check.sh: failed: ${failed[*]}" >&2
  exit 1
fi
