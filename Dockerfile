# shardcache images: a build stage that compiles the binaries with CMake, and a slim runtime
# stage with only the shared libraries they need. Both start from Debian 12 (bookworm). The
# stage `etcd` is an image of its own: Debian's etcd 3.4, for docker-compose.ha.yml.
#
#   docker-compose up --build -d     # see docker-compose.yml (SHARDCACHE_BUILD_JOBS: JOBS below)
#   docker build -t shardcache .     # the image alone
#   docker build --target etcd -t shardcache-etcd .   # the etcd image alone
#
# Build arguments: JOBS=N limits the compile's parallelism (default: every core); GIT_COMMIT
# names the commit that --version reports, for a build outside a git checkout (by default it is
# read from the checkout's .git, of which .dockerignore lets in HEAD and the refs only).

# etcd for the replicas of docker-compose.ha.yml: Debian 12's etcd-server (3.4.23) and
# etcd-client (etcdctl). First in the file, so that building this target alone builds nothing
# else; it needs nothing from the stages below.
FROM debian:bookworm-slim AS etcd
# A fixed uid, as the shardcache user below, made before the package (whose postinst then keeps
# it). policy-rc.d keeps the package from starting the daemon during the build.
RUN useradd --system --uid 998 --user-group --home-dir /var/lib/etcd --shell /usr/sbin/nologin etcd \
 && printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
 && mkdir -p -m 700 /var/lib/etcd && chown etcd:etcd /var/lib/etcd \
 && etcd --version
USER etcd
WORKDIR /var/lib/etcd
# Clients, peers. The members' flags are in docker-compose.ha.yml.
EXPOSE 2379 2380
ENTRYPOINT ["etcd"]

# The commit the sources come from, in a file of its own: a stage that the refs alone change, and
# whose output the build stage copies, so that an unchanged commit keeps the compile cached.
FROM debian:bookworm-slim AS commit
ARG GIT_COMMIT=
# CMakeLists.txt is there so that the COPY has a source when .git is absent (not a checkout).
COPY CMakeLists.txt .gi[t] /git/
# HEAD names a branch ("ref: refs/heads/main", its commit in that file or in packed-refs) or,
# detached, a commit. Anything else (no .git, a worktree's .git file): "unknown".
RUN set -eu; cd /git; commit="$GIT_COMMIT"; \
    if [ -z "$commit" ] && [ -f HEAD ]; then \
      head="$(cat HEAD)"; \
      case "$head" in \
        "ref: "*) ref="${head#ref: }"; \
                  if [ -f "$ref" ]; then commit="$(cat "$ref")"; \
                  elif [ -f packed-refs ]; then \
                    commit="$(awk -v r="$ref" '$2 == r { print $1 }' packed-refs)"; fi ;; \
        *) commit="$head" ;; \
      esac; \
      case "$commit" in *[!0-9a-f]*|"") commit="" ;; *) commit="$(echo "$commit" | cut -c1-12)" ;; esac; \
    fi; \
    echo "${commit:-unknown}" > /commit; echo "commit: $(cat /commit)"

FROM debian:bookworm-slim AS build
WORKDIR /src
# The build dependencies only (no test packages), from the list that scripts/build.sh uses.
# Copied on its own so that this layer is rebuilt only when the list changes. Among them is
# golang-etcd-server-dev, for etcd's protos, which the build compiles into cache_server (its etcd
# storage); the runtime stage needs nothing more for it.
COPY scripts/deps.sh scripts/deps.sh
RUN bash scripts/deps.sh --build && rm -rf /var/lib/apt/lists/*
# Only what building the two programs reads (CMake with SHARDCACHE_BUILD_TESTS=OFF adds no other
# folder), so that editing the tests, the scripts or the documentation keeps the compile cached.
COPY CMakeLists.txt ./
COPY proto proto
COPY common common
COPY cache_server cache_server
COPY shard_replicator shard_replicator
COPY --from=commit /commit /commit
# Declared here, not above: a build argument's value is part of the cache key of every RUN after
# it, and JOBS must not make the dependencies' layer install again.
ARG JOBS=
# Builds only the two programs: without the tests, GoogleTest is not needed. The build tree is
# removed in the same step, so that the layer holds the sources and the two binaries only.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDCACHE_BUILD_TESTS=OFF \
      -DSHARDCACHE_GIT_COMMIT="$(cat /commit)" \
 && cmake --build build -j"${JOBS:-$(nproc)}" --target cache_server shard_replicator \
 && mkdir -p /out \
 && cp build/cache_server/cache_server build/shard_replicator/shard_replicator /out/ \
 && strip /out/* \
 && rm -rf build

FROM debian:bookworm-slim AS runtime
# Runtime libraries of gRPC 1.51, Protobuf 3.21, abseil, spdlog, prometheus-cpp, cpp-httplib and
# RocksDB; curl for the health checks; openssl for make-certs.sh (docker-compose's certs service).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libspdlog1.10 libfmt9 \
      libprometheus-cpp-core1.0 libcpp-httplib0.11 librocksdb7.8 curl openssl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
COPY scripts/make-certs.sh /usr/local/bin/make-certs.sh
# Fails the build if a binary needs a library that the list above lacks.
RUN ! ldd /usr/local/bin/cache_server /usr/local/bin/shard_replicator | grep 'not found'
# A fixed uid, so that a bind-mounted data directory can be given to it (docs/operations.md,
# "Running as another user").
RUN useradd --system --uid 999 --home-dir /var/lib/shardcache shardcache \
 && mkdir -p /var/lib/shardcache && chown shardcache:shardcache /var/lib/shardcache
USER shardcache
WORKDIR /var/lib/shardcache
# gRPC and HTTP (/metrics, /healthz, /readyz) of a cache_server, and HTTP of a shard_replicator;
# each service picks its ports. The entry point is cache_server; a replicator's service sets
# `entrypoint: ["shard_replicator"]` (see docker-compose.yml).
EXPOSE 7070 8070 8080
ENTRYPOINT ["cache_server"]
