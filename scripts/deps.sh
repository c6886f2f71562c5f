#!/usr/bin/env bash
# Installs the Debian 12 packages that building, running and testing shardcache need (clang, its
# sanitizer runtimes and llvm's symbolizer are for scripts/check.sh's builds; Docker's engine,
# docker-compose 1.29 and debootstrap for integration_tests/compose_test.py; kubectl, from
# kubernetes-client unless one is on PATH, for integration_tests/kube_api_test.py; etcd-server
# for the tests of cache_server's etcd storage (label "etcd") and store_bench's etcd target).
# golang-etcd-server-dev is a build package: cache_server's etcd client is generated from the
# protos it ships (proto/CMakeLists.txt; its Go sources come along, but no Go compiler).
#
#   scripts/deps.sh           everything: building, the tests, the sanitizer builds
#   scripts/deps.sh --build   only what building the two programs needs (cmake
#                             -DSHARDCACHE_BUILD_TESTS=OFF; the image's build stage)
#
# Idempotent and quick: it asks dpkg which packages are missing and runs apt-get only for those.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev prometheus-cpp-dev libcpp-httplib-dev librocksdb-dev libssl-dev grpc-proto
  golang-etcd-server-dev
)
case "${1:-}" in
  --build) ;;
  "")
    packages+=(
      ccache clang-format git openssl
      libgtest-dev libgmock-dev libnghttp2-dev
      python3 python3-grpcio python3-protobuf procps prometheus etcd-server
      clang libclang-rt-14-dev llvm
      docker.io docker-compose debootstrap
    )
    # kube_api_test runs the kubectl on PATH; where there is none, Debian's.
    if ! command -v kubectl >/dev/null 2>&1; then packages+=(kubernetes-client); fi
    ;;
  *)
    echo "deps.sh: unknown argument $1 (want nothing or --build)" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "deps.sh: nothing was missing (${#packages[@]} packages installed)"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "deps.sh: missing ${missing[*]}, and not root and no sudo to install them" >&2
    exit 1
  fi
fi

# Quiet apt: its progress goes to a log that is shown only when it fails.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { "${sudo[@]}" apt-get update -q &&
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "deps.sh: failed to install ${missing[*]}" >&2
  exit 1
fi
echo "deps.sh: installed ${missing[*]}"
