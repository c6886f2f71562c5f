// ReadLoad: closed-loop read clients against one server (a Target), for a fixed time: gets of
// single objects, or lists of every object of the bench resource. Measures throughput and
// per-read latency, and checks each answer (a get finds its object; a list returns at least the
// objects the run put there).
//
// Each client keeps one read in flight without a thread of its own (the next is sent from the
// previous one's callback). Reads that complete during the warm-up are not counted.
//
// Thread-compatible: call RunReadLoad from one thread at a time.
#ifndef SHARDCACHE_BENCH_READ_LOAD_H_
#define SHARDCACHE_BENCH_READ_LOAD_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/target.h"

namespace shardcache::bench {

struct ReadLoadOptions {
  enum class Operation { kGet, kList };
  Operation operation = Operation::kGet;
  // Concurrent clients; client i uses the target's slot i.
  int clients = 1;
  // kGet: the objects to read, in turn (client reads spread over all of them); must not be empty.
  std::vector<v1::ObjectMeta> keys;
  // kList: a list with fewer items than this counts as an error.
  int64_t min_items = 0;
  absl::Duration warmup = absl::Seconds(1);
  absl::Duration duration = absl::Seconds(10);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // The server's pid for CPU readings; -1 if unknown.
  pid_t server_pid = -1;
};

struct ReadLoadResult {
  int64_t ok = 0;      // reads answered correctly within the measured interval
  int64_t errors = 0;  // reads that failed, or answered wrongly, within it
  std::map<std::string, int64_t> error_samples;
  double seconds = 0;
  LatencySummary latency;
  int64_t items_per_list = 0;  // kList: items in the last list
  double server_cores = 0;
  double client_cores = 0;
  ProcStats server_end;
  bool clean_exit = true;  // every client ended within its deadline
};

ReadLoadResult RunReadLoad(const ReadLoadOptions& options, Target* target);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_READ_LOAD_H_
