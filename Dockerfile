# shardcache images: a build stage that compiles the binaries with CMake, and a slim runtime
# stage with only the shared libraries they need. Both start from Debian 12 (bookworm).
#
#   docker-compose up --build        # see docker-compose.yml
#   docker build -t shardcache .     # the image alone; JOBS=N limits the build's parallelism

FROM debian:bookworm-slim AS build
ARG JOBS=
WORKDIR /src
# The build dependencies only (no test packages), from the list that scripts/build.sh uses.
# Copied on its own so that this layer is rebuilt only when the list changes.
COPY scripts/deps.sh scripts/deps.sh
RUN bash scripts/deps.sh --build && rm -rf /var/lib/apt/lists/*
COPY . .
# Builds only the two programs: without the tests, GoogleTest is not needed.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDCACHE_BUILD_TESTS=OFF \
 && cmake --build build -j"${JOBS:-$(nproc)}" --target cache_server shard_replicator \
 && mkdir -p /out \
 && cp build/cache_server/cache_server build/shard_replicator/shard_replicator /out/ \
 && strip /out/*

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
# A fixed uid, so that a bind-mounted data directory can be given to it (README.md, "Running as
# another user").
RUN useradd --system --uid 999 --home-dir /var/lib/shardcache shardcache \
 && mkdir -p /var/lib/shardcache && chown shardcache:shardcache /var/lib/shardcache
USER shardcache
WORKDIR /var/lib/shardcache
# gRPC and HTTP (/metrics, /healthz, /readyz) of a cache_server, and HTTP of a shard_replicator;
# each service picks its ports. The entry point is cache_server; a replicator's service sets
# `entrypoint: ["shard_replicator"]` (see docker-compose.yml).
EXPOSE 7070 8070 8080
ENTRYPOINT ["cache_server"]
