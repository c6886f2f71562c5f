#include "cache_server/fan_out.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcache {

FanOut::FanOut(Options options, StoreMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {
  absl::Time now = options_.clock->Now();
  next_bookmark_ = now + options_.bookmark_interval / kBookmarkSlots;
  next_sweep_ = now + kSweepInterval;
}

FanOut::~FanOut() { metrics_->watchers_parked.Decrement(static_cast<double>(parked_.size())); }

void FanOut::Add(Watcher* watcher) {
  auto state = std::make_unique<State>();
  State* s = state.get();
  s->watcher = watcher;
  s->caught_up = watcher->spec().start_revision;
  s->last_sent = options_.clock->Now();  // its initial events
  if (watcher->spec().periodic_bookmarks) {
    s->bookmark_slot = static_cast<int>(bookmarked_added_++ % kBookmarkSlots);
    bookmark_slots_[s->bookmark_slot].insert(s);
  }
  states_.emplace(watcher, std::move(state));
  synced_[watcher->spec().group_resource].insert(s);
}

bool FanOut::Remove(Watcher* watcher) {
  auto it = states_.find(watcher);
  if (it == states_.end()) return false;
  State* s = it->second.get();
  if (s->parked) {
    parked_.erase(std::find(parked_.begin(), parked_.end(), s));
    metrics_->watchers_parked.Decrement();
  } else {
    auto r = synced_.find(watcher->spec().group_resource);
    r->second.erase(s);
    if (r->second.empty()) synced_.erase(r);
  }
  if (s->unflushed) unflushed_.erase(std::find(unflushed_.begin(), unflushed_.end(), s));
  if (watcher->spec().periodic_bookmarks) bookmark_slots_[s->bookmark_slot].erase(s);
  states_.erase(it);
  return true;
}

void FanOut::EndAndRemove(State* s, const absl::Status& status) {
  Watcher* w = s->watcher;
  if (options_.count_changed) options_.count_changed(-1);
  Remove(w);
  w->End(status);
}

bool FanOut::DeliverTo(State* s, EventForms& forms, v1::WatchEvent::Type type) {
  if (!s->watcher->Deliver(forms.Get(type, s->watcher->spec().encoding))) return false;
  if (!s->unflushed) {
    s->unflushed = true;
    unflushed_.push_back(s);
  }
  return true;
}

void FanOut::Park(State* s, int64_t caught_up) {
  auto r = synced_.find(s->watcher->spec().group_resource);
  r->second.erase(s);
  if (r->second.empty()) synced_.erase(r);
  s->parked = true;
  s->caught_up = std::max(caught_up, s->watcher->spec().start_revision);
  parked_.push_back(s);
  metrics_->watchers_parked.Increment();
}

void FanOut::Unpark(State* s) {
  parked_.erase(std::find(parked_.begin(), parked_.end(), s));
  metrics_->watchers_parked.Decrement();
  s->parked = false;
  synced_[s->watcher->spec().group_resource].insert(s);
}

void FanOut::Dispatch(EventForms& forms) {
  const Event& e = *forms.event();
  dispatched_ = std::max(dispatched_, e.revision);
  auto it = synced_.find(e.group_resource);
  if (it == synced_.end()) return;
  int64_t delivered = 0;
  std::vector<State*> refused;
  for (State* s : it->second) {
    const WatchSpec& spec = s->watcher->spec();
    if (e.revision <= spec.start_revision) continue;
    v1::WatchEvent::Type type = EffectiveType(e, spec.filter);
    if (type == v1::WatchEvent::TYPE_UNSPECIFIED) continue;
    if (DeliverTo(s, forms, type)) {
      ++delivered;
    } else {
      refused.push_back(s);
    }
  }
  // It has everything before this event; this one and the rest come from the history.
  for (State* s : refused) Park(s, e.revision - 1);
  if (delivered > 0) metrics_->events_dispatched.Increment(static_cast<double>(delivered));
}

void FanOut::ResourceGone(const std::string& group_resource, const std::string& version,
                          int64_t revision, const absl::Status& status) {
  auto applies = [&](State* s) {
    const WatchSpec& spec = s->watcher->spec();
    return spec.group_resource == group_resource && (version.empty() || spec.version == version) &&
           spec.start_revision < revision;
  };
  for (State* s : parked_) {
    if (applies(s) && !s->pending_end.has_value()) s->pending_end = Gone{revision, status};
  }
  auto it = synced_.find(group_resource);
  if (it == synced_.end()) return;
  std::vector<State*> ended;
  for (State* s : it->second) {
    if (applies(s)) ended.push_back(s);
  }
  for (State* s : ended) EndAndRemove(s, status);
}

void FanOut::Skip(int64_t revision) {
  if (revision <= dispatched_) return;
  std::vector<State*> all;
  for (auto& [gr, set] : synced_) all.insert(all.end(), set.begin(), set.end());
  for (State* s : all) Park(s, dispatched_);
  dispatched_ = revision;
}

void FanOut::Flush(absl::Time now) {
  for (State* s : unflushed_) {
    s->unflushed = false;
    s->last_sent = now;
    s->watcher->Flush();
  }
  unflushed_.clear();
}

absl::Time FanOut::Tick(absl::Time now) {
  if (now >= next_sweep_) {
    // A watcher may end itself in Sweep; it stays here until it is removed.
    for (auto& [w, s] : states_) w->Sweep(now);
    next_sweep_ = now + kSweepInterval;
  }
  if (now >= next_bookmark_) {
    const absl::Duration idle_for_bookmark = options_.bookmark_interval / 2;
    for (State* s : bookmark_slots_[slot_]) {
      if (s->parked || now - s->last_sent < idle_for_bookmark) continue;
      s->watcher->Bookmark(std::max(dispatched_, s->watcher->spec().start_revision));
      s->last_sent = now;
    }
    slot_ = (slot_ + 1) % kBookmarkSlots;
    next_bookmark_ = now + options_.bookmark_interval / kBookmarkSlots;
  }
  return std::min(next_sweep_, next_bookmark_);
}

void FanOut::EndAll(const absl::Status& status) {
  for (auto& [w, s] : states_) w->End(status);
}

bool FanOut::SettleIfCaughtUp(State* s) {
  if (s->pending_end.has_value() && s->caught_up >= s->pending_end->revision) {
    Gone gone = *s->pending_end;
    EndAndRemove(s, gone.status);
    return true;
  }
  if (!s->pending_end.has_value() && s->caught_up >= dispatched_) {
    Unpark(s);
    return true;
  }
  return false;
}

std::vector<FanOut::CatchUpRead> FanOut::PlanCatchUp() {
  std::vector<CatchUpRead> reads;
  std::vector<State*> parked = parked_;
  for (State* s : parked) {
    if (!s->watcher->HasRoom()) continue;
    if (SettleIfCaughtUp(s)) continue;
    int64_t target = s->pending_end.has_value() ? s->pending_end->revision : dispatched_;
    reads.push_back(CatchUpRead{
        s->watcher, s->watcher->spec().group_resource, s->caught_up, target, absl::OkStatus(), {}});
  }
  return reads;
}

void FanOut::ReadCatchUp(Source* source, std::vector<CatchUpRead>* reads) {
  std::vector<EventPtr> events;
  for (CatchUpRead& read : *reads) {
    events.clear();
    read.status =
        source->ReadHistory(read.group_resource, read.after, read.up_to, kCatchUpEvents, &events);
    for (const EventPtr& e : events) read.events.push_back(source->Forms(e));
  }
}

void FanOut::ApplyCatchUp(std::vector<CatchUpRead> reads) {
  int64_t delivered = 0;
  for (CatchUpRead& read : reads) {
    auto it = states_.find(read.watcher);
    if (it == states_.end() || !it->second->parked) continue;  // removed meanwhile
    State* s = it->second.get();
    if (s->caught_up != read.after) continue;  // read for an older position
    if (!read.status.ok()) {
      metrics_->watchers_too_old.Increment();
      EndAndRemove(s,
                   absl::OutOfRangeError(absl::StrCat(
                       "too old resource version: the watcher fell behind by more than the history "
                       "window (it has every event up to ",
                       s->caught_up,
                       ", and the next ones have been compacted); list again and "
                       "watch from the list's resourceVersion")));
      continue;
    }
    bool refused = false;
    for (const EventFormsPtr& forms : read.events) {
      const Event& e = *forms->event();
      if (e.revision <= s->caught_up) continue;
      v1::WatchEvent::Type type = EffectiveType(e, s->watcher->spec().filter);
      if (type != v1::WatchEvent::TYPE_UNSPECIFIED) {
        if (!DeliverTo(s, *forms, type)) {
          refused = true;
          break;
        }
        ++delivered;
      }
      s->caught_up = e.revision;
    }
    if (refused) continue;
    // Fewer events than asked for: nothing more of its resource up to the target.
    if (read.events.size() < kCatchUpEvents) s->caught_up = std::max(s->caught_up, read.up_to);
    SettleIfCaughtUp(s);
  }
  if (delivered > 0) {
    metrics_->events_dispatched.Increment(static_cast<double>(delivered));
    metrics_->watch_catch_up_events.Increment(static_cast<double>(delivered));
  }
}

}  // namespace shardcache
