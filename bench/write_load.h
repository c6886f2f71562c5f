// WriteLoad: closed-loop write clients against one server (a Target: cache_server, or etcd for
// unary creates), for a fixed time (or number of writes), measuring throughput and per-write
// latency.
//
// Each client keeps its writes going without a thread of its own (gRPC's callback client API):
// with kUnary, one Create call in flight at a time, the next sent when the previous answers; with
// kStream, one Write stream with up to `window` creates sent but not yet answered. Every write
// creates a new ~300-byte object (see MakeCreateRequest), or one padded to `object_bytes` (or,
// with `operation`, updates or deletes one). Writes that complete during the warm-up are not
// counted.
//
// With `total_writes`, the clients send exactly that many writes between them and the run ends
// when all are answered (or `duration` passes): a fill of the store, e.g. before a restart.
//
// Thread-compatible: call RunWriteLoad from one thread at a time.
#ifndef SHARDCACHE_BENCH_WRITE_LOAD_H_
#define SHARDCACHE_BENCH_WRITE_LOAD_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/target.h"

namespace shardcache::bench {

struct WriteLoadOptions {
  enum class Api { kUnary, kStream };
  // kUnary: Create calls; kStream: creates pipelined on Write streams.
  Api api = Api::kUnary;
  // Concurrent clients; client i uses channels[i % channels.size()].
  int clients = 1;
  // kStream only: writes sent but not yet answered, per client.
  int window = 64;
  // Writes completing in this first interval are not measured.
  absl::Duration warmup = absl::Seconds(1);
  // How long to measure for, after the warm-up.
  absl::Duration duration = absl::Seconds(10);
  // If positive: stop once this many writes have been measured (or `duration` passes).
  int64_t ops = 0;
  // If positive: send exactly this many writes in all, and end when every one is answered (or
  // `duration` passes). Use with a zero warm-up, so that every write is counted.
  int64_t total_writes = 0;
  // If positive: pad each object to about this many bytes (serialized, as sent; see PadObject).
  int64_t object_bytes = 0;
  // What each write does: create a new object; update one (unconditionally: no resourceVersion
  // given), with a new send time and new padding in its spec; or delete one. Updates and deletes
  // need Api::kStream, and name_by_index so that they find what an earlier create run (with the
  // same run_id) made.
  enum class Operation { kCreate, kUpdate, kDelete };
  Operation operation = Operation::kCreate;
  // Name each object after its write's index in the run (BenchObjectName(run_id, 0, index);
  // indexes run from 0 in the order writes are claimed, over all clients) rather than after its
  // client and that client's sequence number.
  bool name_by_index = false;
  // If set: the objects' logical cluster (else MakeCreateRequest's).
  std::string cluster;
  // If set: called once per answered write with its index in the run, when the answer came
  // (NowNanos) and its gRPC code. Runs on gRPC's threads: must be quick and thread-safe.
  std::function<void(int64_t index, int64_t answered_ns, int code)> on_answer;
  // Deadline of each unary call; a Write stream's deadline is the whole run plus this.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Names the run's objects, so that runs never collide.
  std::string run_id;
  // The server's pid for CPU readings; -1 if unknown.
  pid_t server_pid = -1;
  // If set: a path on the server's data disk, whose device's cache flushes are counted over the
  // measured interval.
  std::string disk_path;
};

struct WriteLoadResult {
  int64_t ok = 0;    // writes answered OK within the measured interval
  int64_t sent = 0;  // writes sent in all (warm-up included)
  // Writes answered with an error within the measured interval, plus Write streams that broke.
  int64_t errors = 0;
  // A few error messages with their counts ("CODE: message").
  std::map<std::string, int64_t> error_samples;
  double seconds = 0;  // the measured interval
  LatencySummary latency;
  double server_cores = 0;       // CPU cores the server used on average while measured
  double client_cores = 0;       // the same for this process
  BusiestThread server_busiest;  // the server thread that used the most CPU while measured
  ProcStats server_end;          // the server's threads and RSS at the end
  bool clean_exit = true;        // every client ended within its deadline
  // The data disk's flush counts at the start and end of the measured interval (!ok without
  // disk_path).
  DiskFlushes flushes_before;
  DiskFlushes flushes_after;
};

// Runs the load against `target` (client i uses slot i); blocks until it is over (at most warmup
// + duration + 2 * rpc_timeout). Api::kStream needs a cache_server target.
WriteLoadResult RunWriteLoad(const WriteLoadOptions& options, Target* target);

// The same against the cache_server that `channels` lead to.
WriteLoadResult RunWriteLoad(const WriteLoadOptions& options,
                             const std::vector<std::shared_ptr<grpc::Channel>>& channels);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_WRITE_LOAD_H_
