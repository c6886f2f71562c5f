// WatchLoad: many concurrent watches on one server (a Target: cache_server, or etcd), all
// receiving a steady, paced write load; checks that every watcher received every event and measures
// delivery latency and the server's threads and memory.
//
// The watchers are callback reactors (gRPC's callback client API), spread over a few channels:
// no thread per stream. They read each message's wire bytes for the few facts they check (see
// watch_wire.h), keep their per-event state to themselves (no lock, no allocation per event), and
// their samples are merged once the load is over. With `resources` N, watcher i watches bench
// resource i % N and the writer sends create seq to resource seq % N; each watcher is checked
// against the creates of its own resource. Each watches its resource from now and counts as open
// once the server says the watch is in place (cache_server: its initial-events-end bookmark; etcd:
// the created response). The writer then sends `write_rate` Creates a second (open loop: each is
// sent at its time whether or not earlier ones have been answered, up to `max_outstanding_writes`);
// each object's spec carries its send time, so a watcher knows how long the event took to reach it.
//
// Thread-compatible: call RunWatchLoad from one thread at a time.
#ifndef SHARDCACHE_BENCH_WATCH_LOAD_H_
#define SHARDCACHE_BENCH_WATCH_LOAD_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/target.h"

namespace shardcache::bench {

struct WatchLoadOptions {
  // Concurrent Watch streams; watcher i uses watch_channels[i % watch_channels.size()].
  int watchers = 1000;
  // Creates per second during the load.
  double write_rate = 200;
  // How long the write load lasts.
  absl::Duration duration = absl::Seconds(20);
  // How long all watchers may take to receive their initial bookmark.
  absl::Duration setup_timeout = absl::Seconds(60);
  // How long the watchers stay open and idle before the "idle" reading.
  absl::Duration idle = absl::Seconds(2);
  // After the last write is answered, how long the watchers may take to receive every event.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Deadline of each Create.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Creates sent but not yet answered; the writer waits (and falls behind its rate) beyond this.
  int max_outstanding_writes = 1000;
  // Names the run's objects; watchers count only this run's.
  std::string run_id;
  // The server's pid for thread, memory and CPU readings; -1 if unknown.
  pid_t server_pid = -1;
  // A watcher is late when any event reached it later than this after its write was sent.
  absl::Duration late_after = absl::Milliseconds(100);
  // cache_server: watches ask for batches (WatchRequest.batch_events).
  bool batch_events = true;
  // Bench resources (etcd: key prefixes) the watchers and the creates are spread over.
  int resources = 1;
};

struct WatchLoadResult {
  int watchers = 0;
  int synced = 0;           // watchers that received their initial bookmark in time
  double sync_seconds = 0;  // from opening the first stream to the last initial bookmark

  int64_t writes_planned = 0;
  int64_t writes_sent = 0;  // less than planned when the writer fell behind by the duration's end
  int64_t writes_ok = 0;
  int64_t writes_failed = 0;
  std::map<std::string, int64_t> write_errors;  // "CODE: message" -> count
  double write_seconds = 0;                     // first send to last answer
  // Events of creates that failed (or timed out) that watchers nonetheless received, summed over
  // the watchers: such a create was committed although its caller was told it failed.
  int64_t failed_writes_seen = 0;

  int64_t events_expected = 0;    // over the watchers, the creates of its resource answered OK
  int64_t events_received = 0;    // events of writes answered OK, counted once per watcher
  int64_t messages_received = 0;  // watch messages (a batch is one), over the watchers
  int64_t duplicates = 0;
  int64_t out_of_order = 0;   // events whose resourceVersion did not rise
  int64_t unexpected = 0;     // events other than this run's ADDED events, after the bookmark
  int watchers_complete = 0;  // received every event of every write answered OK
  int watchers_late = 0;      // received some event more than late_after after its send
  // Ended before the tool cancelled them (after the drain): the server ended them (the tool sets
  // no deadline), or the tool could not read a message (INTERNAL: "store_bench could not read").
  int watchers_ended_early = 0;
  std::map<std::string, int64_t> early_end_reasons;  // "CODE: message" -> watchers
  double delivery_seconds = 0;                       // first write sent to last event received
  double drain_seconds = 0;                          // last write answered to last event received
  LatencySummary send_to_receipt;                    // write sent -> event received by a watcher
  LatencySummary ack_to_receipt;  // write answered -> event received (negative: before the answer)
  LatencySummary write_ack;       // write sent -> write answered
  // The first create's, sent after the watchers' idle period (NAN: not answered OK): a server that
  // lets its threads sleep while idle answers it late.
  double first_write_ack_ms = NAN;

  ProcStats server_before;          // before any watcher
  ProcStats server_idle;            // all watchers open and idle
  ProcStats server_end;             // when the last write was answered
  int64_t server_peak_threads = 0;  // highest reading during the load and the drain
  int64_t server_peak_rss_kb = 0;
  ProcStats client_idle;
  ProcStats client_end;
  double server_cores = 0;  // CPU cores used on average from the first write to the last event
  double client_cores = 0;
  // The tool's CPU (all its threads: watchers, writer, polling) from the first write to the
  // drain's end, per event received: what reading the watches costs the client.
  double client_us_per_event = 0;
  BusiestThread server_busiest;  // the server thread that used the most CPU, same interval
  bool streams_ended = true;     // every stream ended when the load was over

  // True when every watcher received every event once, in order.
  bool Verified() const {
    return synced == watchers && watchers_complete == watchers && duplicates == 0 &&
           out_of_order == 0 && watchers_ended_early == 0;
  }
};

// Runs the load: watcher i watches through watch_target's slot i, and the writer writes through
// write_target's slot 0 (the two may be one target). Blocks until it is over (bounded by the
// options' timeouts).
WatchLoadResult RunWatchLoad(const WatchLoadOptions& options, Target* watch_target,
                             Target* write_target);

// The same against the cache_server that the channels lead to; with a `watch_client`, the
// watchers read through it instead of through watch_channels.
WatchLoadResult RunWatchLoad(const WatchLoadOptions& options,
                             const std::vector<std::shared_ptr<grpc::Channel>>& watch_channels,
                             const std::shared_ptr<grpc::Channel>& write_channel,
                             std::shared_ptr<H2Client> watch_client = nullptr);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_WATCH_LOAD_H_
