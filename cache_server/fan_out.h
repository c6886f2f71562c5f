// FanOut: who gets which event, and what happens to a watcher that cannot take one: the watch
// policy of one dispatcher's watchers, with no thread, no lock and no network of its own, so
// that it can be tested alone (fan_out_test.cc, on fake watchers and a fake clock).
//
// The policy, after etcd's watchableStore (server/mvcc/watchable_store.go):
// - A watcher is *synced* or *parked*. A synced watcher is up to date: each event of its
//   resource that its filter sees (Dispatch) is handed to it at once. An update that makes an
//   object stop matching is delivered as DELETED, one that makes it start matching as ADDED (as
//   Kubernetes' watch cache does); events at or below the watcher's starting revision are
//   skipped (its initial events hold them).
// - A watcher whose queue is full refuses the event (Watcher::Deliver returns false). It is then
//   parked: it leaves the synced set, and remembers the last revision it has everything up to.
//   Nothing waits for it, and nothing is kept for it: the writers and the other watchers go on.
//   (etcd parks such a watcher as a "victim" and then moves it to its "unsynced" set; here both
//   are one state.)
// - A parked watcher whose queue has drained to half (Watcher::HasRoom) is caught up from the
//   store's history window (EventHistory), in revision order, with the same shared encodings
//   that synced watchers received: with no gap and no duplicate. When it has everything up to
//   the last event dispatched, it is synced again. If the events it needs have left the window,
//   it is ended with OUT_OF_RANGE ("too old resource version"), as a watch from a compacted
//   revision is, so that a client-go style reflector lists again.
// - A watcher that reads nothing at all is ended by itself (Watcher::Sweep, every
//   kSweepInterval) once its stall timeout has passed, with RESOURCE_EXHAUSTED.
// - Bookmarks, only for watchers that asked for them (WatchSpec::periodic_bookmarks, from
//   WatchRequest.allow_bookmarks), as Kubernetes sends them only with allowWatchBookmarks and
//   etcd only with progress_notify; the others are never looked at for one. Every
//   bookmark_interval / kBookmarkSlots the fan-out turns to the next of kBookmarkSlots slots and
//   bookmarks those synced watchers of the slot that have been sent nothing for half an
//   interval, at the last revision dispatched. So an idle watcher that asked gets one every
//   interval and never goes longer than about one and a half without a word, and thousands of
//   idle watchers do not all get theirs in the same instant. A parked watcher gets none (it has
//   not got everything up to that revision). (The bookmark that ends a watch's initial events is
//   not the fan-out's: it is among the initial events, which every watcher gets.)
// - A resource that stops being served (ResourceGone): its synced watchers that started before
//   the marker's revision are ended at once with the marker's status; its parked ones are caught
//   up to the marker's revision first, then ended.
// - The dispatcher's own lag (Skip): events that never reached the dispatcher are treated as
//   refused by every synced watcher: all are parked and caught up from the history.
//
// Catching up reads the store's history, which takes the store's lock; the dispatcher must not
// hold its own lock then (a watch starts under the store's lock and then takes the dispatcher's).
// So catching up is three steps: PlanCatchUp (under the dispatcher's lock), ReadCatchUp (with no
// lock), ApplyCatchUp (under the lock again).
//
// Thread-safety: none of its own. Every method is called under the dispatcher's watchers lock
// (ReadCatchUp under no lock), and all but Add and Remove from the dispatcher's thread.
#ifndef SHARDCACHE_CACHE_SERVER_FAN_OUT_H_
#define SHARDCACHE_CACHE_SERVER_FAN_OUT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache_server/event.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watcher.h"
#include "common/clock.h"

namespace shardcache {

class FanOut {
 public:
  // Where parked watchers are caught up from. Thread-safe.
  class Source {
   public:
    virtual ~Source() = default;
    // As EventHistory::ReadHistory.
    virtual absl::Status ReadHistory(const std::string& group_resource, int64_t after,
                                     int64_t up_to, size_t max_events,
                                     std::vector<EventPtr>* out) = 0;
    // The shared forms of a published event (new ones when they are no longer kept).
    virtual EventFormsPtr Forms(const EventPtr& event) = 0;
  };

  struct Options {
    // A synced watcher that has been sent nothing for about this long receives a bookmark.
    absl::Duration bookmark_interval = absl::Seconds(5);
    // The time of the bookmarks and sweeps. Not owned.
    const Clock* clock = RealClock::Get();
    // Called with -1 just before a watcher leaves the fan-out by itself (ended by a marker, or
    // too far behind), so that whoever sees the end sees the count without it; may be empty.
    std::function<void(int)> count_changed;
  };

  // How often Tick calls Watcher::Sweep.
  static constexpr absl::Duration kSweepInterval = absl::Milliseconds(250);
  static constexpr int kBookmarkSlots = 10;
  // The most events one watcher is given from the history in one catch-up step.
  static constexpr size_t kCatchUpEvents = 512;

  // `metrics` is not owned and outlives the fan-out.
  FanOut(Options options, StoreMetrics* metrics);
  // Parked watchers still here are counted out of the parked gauge.
  ~FanOut();
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // Adds a synced watcher, up to date at its spec's start_revision. REQUIRES: not added yet.
  void Add(Watcher* watcher);
  // Removes a watcher; returns false if it was not here (ended by the fan-out, or never added).
  bool Remove(Watcher* watcher);
  size_t size() const { return states_.size(); }
  size_t parked() const { return parked_.size(); }
  // The revision of the last event dispatched (or skipped).
  int64_t dispatched_revision() const { return dispatched_; }

  // The next event, in revision order.
  void Dispatch(EventForms& forms);
  // After the events dispatched so far, ends the watchers of `group_resource` (only those of
  // `version`, when it is not empty) that started before `revision`, with `status`.
  void ResourceGone(const std::string& group_resource, const std::string& version, int64_t revision,
                    const absl::Status& status);
  // The events after the last one dispatched and up to `revision` will not be dispatched: every
  // synced watcher is parked, to be caught up from the history.
  void Skip(int64_t revision);

  // Flushes the watchers delivered to since the last Flush, and notes that they were sent
  // something at `now`.
  void Flush(absl::Time now);
  // Sweeps and bookmarks that are due at `now`; returns when Tick is due next.
  absl::Time Tick(absl::Time now);
  // Ends every watcher with `status` (they stay until removed).
  void EndAll(const absl::Status& status);

  // One parked watcher's catch-up step.
  struct CatchUpRead {
    Watcher* watcher;
    std::string group_resource;
    int64_t after;  // it has everything up to here
    int64_t up_to;  // what it should have once caught up
    absl::Status status;
    std::vector<EventFormsPtr> events;
  };
  // The parked watchers that have room, and what each should read; watchers that need nothing
  // more are settled here (synced again, or ended by a resource's end).
  std::vector<CatchUpRead> PlanCatchUp();
  // Reads what `reads` ask for. Called under no lock.
  static void ReadCatchUp(Source* source, std::vector<CatchUpRead>* reads);
  // Delivers what was read, in order, as far as each watcher takes it.
  void ApplyCatchUp(std::vector<CatchUpRead> reads);

 private:
  struct Gone {
    int64_t revision;
    absl::Status status;
  };
  struct State {
    Watcher* watcher;
    bool parked = false;
    // Parked: it has every event of its resource up to here.
    int64_t caught_up = 0;
    bool unflushed = false;
    absl::Time last_sent;
    int bookmark_slot = 0;  // when it asked for periodic bookmarks
    // Parked when its resource stopped being served: ended once caught up to here.
    std::optional<Gone> pending_end;
  };

  void Park(State* s, int64_t caught_up);
  void Unpark(State* s);
  // Delivers one event to `s`; false when it refused.
  bool DeliverTo(State* s, EventForms& forms, v1::WatchEvent::Type type);
  // Ends and removes a watcher that leaves by the fan-out's decision.
  void EndAndRemove(State* s, const absl::Status& status);
  // A parked watcher that has everything up to dispatched_ (or to its pending end): syncs or
  // ends it. Returns whether it did.
  bool SettleIfCaughtUp(State* s);

  const Options options_;
  StoreMetrics* const metrics_;

  absl::flat_hash_map<Watcher*, std::unique_ptr<State>> states_;
  // Synced watchers, by resource.
  std::map<std::string, std::set<State*>> synced_;
  // The watchers that asked for periodic bookmarks (synced or parked), by bookmark slot.
  std::set<State*> bookmark_slots_[kBookmarkSlots];
  // Parked watchers, in the order they were parked (caught up in turn).
  std::vector<State*> parked_;
  std::vector<State*> unflushed_;
  int64_t dispatched_ = 0;
  uint64_t bookmarked_added_ = 0;  // deals the bookmark slots
  int slot_ = 0;
  absl::Time next_bookmark_ = absl::InfinitePast();
  absl::Time next_sweep_ = absl::InfinitePast();
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_FAN_OUT_H_
