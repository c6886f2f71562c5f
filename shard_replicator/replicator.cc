#include "shard_replicator/replicator.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/client/lease_lock.h"
#include "common/error_info.h"
#include "common/object_key.h"
#include "common/resources.h"
#include "common/status_macros.h"
#include "common/validation.h"

namespace shardcache {

// One leadership term: its epoch, the thread that starts it, and what runs while it lasts.
struct ShardReplicator::Term {
  int64_t epoch = 0;
  CancellationToken cancellation;
  std::thread starter;

  absl::Mutex mu;
  bool ending ABSL_GUARDED_BY(mu) = false;
  // Why the last attempt to claim the epoch at the cache failed; OK before one failed and once
  // one succeeded.
  absl::Status claim_error ABSL_GUARDED_BY(mu);
  std::unique_ptr<CacheWriter> writer ABSL_GUARDED_BY(mu);
  std::unique_ptr<CcrController> controller ABSL_GUARDED_BY(mu);

  explicit Term(LeadingContext context)
      : epoch(context.epoch), cancellation(std::move(context.cancellation)) {}
};

absl::StatusOr<std::unique_ptr<ShardReplicator>> ShardReplicator::Start(Options options) {
  RETURN_IF_ERROR(ValidateDNS1123Label("--shard", options.shard));
  if (options.shard_store.empty()) {
    return absl::InvalidArgumentError("--shard-store: Required value: the shard store's host:port");
  }
  if (options.cache.empty()) {
    return absl::InvalidArgumentError("--cache: Required value: the cache server's host:port");
  }
  if (options.identity.empty()) return absl::InvalidArgumentError("--identity: Required value");
  RETURN_IF_ERROR(ValidateClusterName("--lease-cluster", options.lease_cluster));
  RETURN_IF_ERROR(ValidateDNS1123Label("--lease-namespace", options.lease_namespace));
  RETURN_IF_ERROR(ValidateDNS1123Subdomain("--lease-name", options.lease_name));
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers: Invalid value: ", options.workers, ": must be at least 1"));
  }
  if (options.memory_trim_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory-trim-interval: Invalid value: ",
        absl::FormatDuration(options.memory_trim_interval), ": must not be negative (0: never)"));
  }
  if (options.worker_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--worker-threads: Invalid value: ", options.worker_threads, ": must be at least 1"));
  }
  if (options.resync_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--resync-period: Invalid value: must not be negative");
  }
  for (auto [flag, value] :
       {std::pair<const char*, absl::Duration>{"--keepalive-time", options.keepalive.time},
        {"--keepalive-timeout", options.keepalive.timeout}}) {
    if (value < absl::Milliseconds(1) || value > absl::Hours(24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": Invalid value: must be between 1ms and 24h"));
    }
  }
  if (options.watch_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--watch-idle-timeout: Invalid value: must not be negative");
  }
  if (options.registry == nullptr) return absl::InvalidArgumentError("no metrics registry");
  std::unique_ptr<ShardReplicator> r(new ShardReplicator(std::move(options)));
  RETURN_IF_ERROR(r->Init());
  return r;
}

ShardReplicator::ShardReplicator(Options options)
    : options_(std::move(options)), metrics_(options_.registry) {}

ShardReplicator::~ShardReplicator() { Stop(); }

absl::Status ShardReplicator::Init() {
  ASSIGN_OR_RETURN(shard_channel_, CreateStoreChannel(options_.shard_store, options_.keepalive,
                                                      options_.shard_store_credentials));
  ASSIGN_OR_RETURN(cache_channel_, CreateStoreChannel(options_.cache, options_.keepalive,
                                                      options_.cache_credentials));
  shard_stub_ = v1::Store::NewStub(shard_channel_);
  cache_stub_ = v1::Store::NewStub(cache_channel_);
  // Calls made while leading must end well within the margin between the renew deadline and
  // the lease duration, so that a term's work stops before another replica can lead.
  StoreClient::Options client;
  client.timeout = std::max(absl::Seconds(1), options_.lease_duration - options_.renew_deadline);
  ASSIGN_OR_RETURN(shard_client_, StoreClient::Create(shard_channel_, client));
  ASSIGN_OR_RETURN(cache_client_, StoreClient::Create(cache_channel_, client));
  shard_writer_ = std::make_unique<StoreClientShardStoreWriter>(shard_client_.get());
  WorkerPool::Options pool;
  pool.threads = options_.worker_threads;
  pool.clock = options_.clock;
  ASSIGN_OR_RETURN(pool_, WorkerPool::Create(pool));
  if (options_.memory_trim_interval > absl::ZeroDuration()) {
    MemoryTrimmer::Options trim;
    trim.interval = options_.memory_trim_interval;
    trim.registry = options_.registry;
    trimmer_ = std::make_unique<MemoryTrimmer>(pool_.get(), trim);
  }

  // After an outage of a store, its informers relist or resume within a few seconds of its
  // return, however long the outage (the reflector's default backoff grows to 30 s, doubled by
  // jitter): resourceCounts and the restoring of copies changed by others follow at once.
  Backoff::Options relist;
  relist.max = absl::Seconds(2);
  relist.jitter = 0.5;
  auto factory_options = [&](bool follow_definitions) {
    DynamicInformerFactory::Options o;
    o.follow_definitions = follow_definitions;
    o.informer.clock = options_.clock;
    o.informer.pool = pool_.get();  // informers add no threads: reflectors and handlers run on it
    o.informer.reflector.backoff = relist;
    o.informer.reflector.watch_idle_timeout = options_.watch_idle_timeout;
    o.informer.reflector.registry = options_.registry;
    return o;
  };
  // The shard store serves what its ResourceDefinitions define; the cache serves any resource.
  DynamicInformerFactory::Options shard_factory = factory_options(true);
  shard_factory.name = "shard_store";
  shard_factory.registry = options_.registry;
  DynamicInformerFactory::Options cache_factory = factory_options(false);
  cache_factory.name = "cache";
  cache_factory.registry = options_.registry;
  ASSIGN_OR_RETURN(shard_informers_,
                   DynamicInformerFactory::Create(shard_stub_, std::move(shard_factory)));
  ASSIGN_OR_RETURN(cache_informers_,
                   DynamicInformerFactory::Create(cache_stub_, std::move(cache_factory)));
  ASSIGN_OR_RETURN(ccrs_, shard_informers_->ForResource(CcrResource()));
  ListWatchFilters mine;
  mine.shard = options_.shard;
  ASSIGN_OR_RETURN(cache_ccrs_, cache_informers_->ForResource(CcrResource(), mine));

  // Warm every CCR's informers now, leader or not, again when the CCR changes or a resource
  // becomes served or unserved, and let them go when the CCR is deleted.
  ResourceEventHandlerFuncs warm;
  warm.on_add = [this](const ObjectRef& o, bool) { Warm(ObjectKey(o->metadata())); };
  warm.on_update = [this](const ObjectRef&, const ObjectRef& o) { Warm(ObjectKey(o->metadata())); };
  warm.on_delete = [this](const ObjectRef& o) { Warm(ObjectKey(o->metadata())); };
  ASSIGN_OR_RETURN(warm_registration_, ccrs_->AddEventHandler(MakeHandler(std::move(warm))));
  warm_subscription_ = shard_informers_->Subscribe([this](const ResourceEvent&) {
    for (const ObjectRef& o : ccrs_->store().List()) Warm(ObjectKey(o->metadata()));
  });

  auto lock = std::make_shared<LeaseLock>(
      shard_stub_,
      LeaseLock::Options{options_.lease_cluster, options_.lease_namespace, options_.lease_name,
                         options_.identity, std::min(options_.retry_period, absl::Seconds(2))});
  LeaderElector::Config config;
  config.lock = lock;
  config.lease_duration = options_.lease_duration;
  config.renew_deadline = options_.renew_deadline;
  config.retry_period = options_.retry_period;
  config.clock = options_.clock;
  config.registry = options_.registry;
  config.callbacks.on_started_leading = [this](LeadingContext c) { StartedLeading(std::move(c)); };
  config.callbacks.on_stopped_leading = [this] { StoppedLeading(); };
  config.callbacks.on_new_leader = [this](const std::string& identity) {
    spdlog::info("the leader of shard {} is now {}", options_.shard,
                 identity.empty() ? "nobody (the lease is free)" : identity);
  };
  absl::StatusOr<std::unique_ptr<LeaderElector>> elector = LeaderElector::Create(config);
  if (!elector.ok()) {
    // Name the flags, not the fields.
    return absl::InvalidArgumentError(absl::StrCat(
        "--lease-duration, --renew-deadline, --retry-period: ", elector.status().message()));
  }
  elector_ = *std::move(elector);
  elector_->Run();
  spdlog::info("replicating shard {} from {} into {} as {} (lease {})", options_.shard,
               options_.shard_store, options_.cache, options_.identity, lock->Describe());
  return absl::OkStatus();
}

void ShardReplicator::Warm(const std::string& key) {
  Warmed dropped;  // let go of after warm_mu_ (a drop may release an informer)
  absl::MutexLock l(&warm_mu_);
  // From the store, not from the event: whatever thread calls, the newest state wins, and a CCR
  // deleted meanwhile (its on_delete follows, or has run) is not warmed again.
  ObjectRef ccr = ccrs_->store().Get(key);
  absl::StatusOr<CcrSpec> spec =
      ccr == nullptr ? absl::NotFoundError("deleted") : ParseCcrSpec(*ccr, nullptr);
  std::string need;
  if (spec.ok() && shard_informers_->IsServed(spec->resource)) {
    need = absl::StrCat(GvrKey(spec->resource), "|", ccr->metadata().cluster());
  }
  auto it = warm_.find(key);
  if (it != warm_.end()) {
    const Warmed& held = it->second;
    if (!need.empty() && held.need == need && held.local != nullptr && !held.local->IsStopped() &&
        held.copies != nullptr && !held.copies->IsStopped()) {
      return;  // what it needs, running
    }
    dropped = std::move(it->second);
    warm_.erase(it);
  }
  if (need.empty()) return;
  Warmed warmed;
  warmed.need = need;
  ListWatchFilters local;
  local.cluster = ccr->metadata().cluster();
  // An error (e.g. unserved meanwhile) leaves it null: the next event of the CCR or of the
  // resource warms it again.
  if (auto informer = shard_informers_->ForResource(spec->resource, local); informer.ok()) {
    warmed.local = *std::move(informer);
  }
  if (cache_informers_->ServeAlways(spec->resource).ok()) {
    ListWatchFilters copies;
    copies.shard = options_.shard;
    copies.cluster = ccr->metadata().cluster();
    if (auto informer = cache_informers_->ForResource(spec->resource, copies); informer.ok()) {
      warmed.copies = *std::move(informer);
    }
  }
  warm_[key] = std::move(warmed);
}

absl::Status ShardReplicator::Ready() const {
  if (!shard_informers_->HasSynced()) {
    return absl::UnavailableError("the shard store's resource definitions have not synced");
  }
  if (!ccrs_->HasSynced()) {
    return absl::UnavailableError("the shard store's clustercachedresources have not synced");
  }
  if (!cache_ccrs_->HasSynced()) {
    return absl::UnavailableError(
        "the cache's copies of this shard's clustercachedresources "
        "have not synced");
  }
  absl::MutexLock l(&term_mu_);
  if (term_ == nullptr) return absl::OkStatus();  // a standby, ready to take over
  absl::MutexLock tl(&term_->mu);
  if (term_->writer == nullptr) {
    if (term_->claim_error.ok()) return absl::OkStatus();  // the term is starting
    return absl::UnavailableError(absl::StrCat(
        "leading (epoch ", term_->epoch,
        ") but the epoch cannot be claimed at the cache: ", term_->claim_error.ToString()));
  }
  if (!term_->writer->Available()) {
    return absl::UnavailableError(
        absl::StrCat("leading (epoch ", term_->epoch, ") but unable to write to the cache since ",
                     absl::FormatTime(term_->writer->UnavailableSince(), absl::UTCTimeZone()),
                     "; writes wait and resume when it can"));
  }
  return absl::OkStatus();
}

void ShardReplicator::StartedLeading(LeadingContext context) {
  auto term = std::make_unique<Term>(std::move(context));
  Term* raw = term.get();
  metrics_.epoch.Set(static_cast<double>(raw->epoch));
  absl::MutexLock l(&term_mu_);
  term_ = std::move(term);
  raw->starter = std::thread([this, raw] { RunTerm(raw); });
}

void ShardReplicator::RunTerm(Term* term) {
  // The epoch is claimed before anything is written, so that a former leader that still
  // believes it leads (paused, partitioned) has its writes rejected from now on.
  v1::ClaimEpochRequest claim;
  claim.mutable_fence()->set_shard(options_.shard);
  claim.mutable_fence()->set_epoch(term->epoch);
  while (true) {
    if (term->cancellation.Cancelled()) return;
    absl::StatusOr<v1::ClaimEpochResponse> claimed = cache_client_->ClaimEpoch(claim);
    {
      absl::MutexLock l(&term->mu);
      term->claim_error = claimed.status();
    }
    if (claimed.ok()) break;
    if (IsFenced(claimed.status())) {
      spdlog::error("the cache refused epoch {} for shard {}: {}; stopping leading", term->epoch,
                    options_.shard, claimed.status().ToString());
      metrics_.fenced.Increment();
      elector_->Resign(term->epoch, "the cache holds a newer epoch for this shard");
      return;
    }
    spdlog::warn("claiming epoch {} at the cache failed: {}; retrying", term->epoch,
                 claimed.status().ToString());
    term->cancellation.WaitForCancellation(absl::Now() + absl::Seconds(1));
  }
  spdlog::info("claimed epoch {} for shard {} at the cache; starting the controllers", term->epoch,
               options_.shard);

  absl::MutexLock l(&term->mu);
  if (term->ending) return;
  CacheWriter::Options writer;
  writer.shard = options_.shard;
  writer.epoch = term->epoch;
  writer.metrics = &metrics_;
  int64_t epoch = term->epoch;
  writer.on_fenced = [this, epoch](const absl::Status& status) {
    spdlog::error("the cache rejected a write as fenced: {}; stopping leading", status.ToString());
    elector_->Resign(epoch, "a write was rejected as fenced by a newer epoch");
  };
  term->writer = std::make_unique<CacheWriter>(cache_channel_, cache_stub_, std::move(writer));

  CcrController::Options c;
  c.shard = options_.shard;
  c.epoch = term->epoch;
  c.workers = options_.workers;
  c.pool = pool_.get();
  c.resync_period = options_.resync_period;
  c.clock = options_.clock;
  c.shard_writer = shard_writer_.get();
  c.shard_informers = shard_informers_.get();
  c.cache_informers = cache_informers_.get();
  c.writer = term->writer.get();
  c.metrics = &metrics_;
  c.ccrs = ccrs_;
  c.cache_ccrs = cache_ccrs_;
  c.registry = options_.registry;
  c.on_fenced = [this, epoch](const absl::Status& status) {
    metrics_.fenced.Increment();
    spdlog::error("the shard store rejected a write as fenced: {}; stopping leading",
                  status.ToString());
    elector_->Resign(epoch, "a write was rejected as fenced by a newer epoch");
  };
  absl::StatusOr<std::unique_ptr<CcrController>> controller = CcrController::Start(std::move(c));
  if (!controller.ok()) {
    spdlog::error("starting the controllers failed: {}; stopping leading",
                  controller.status().ToString());
    elector_->Resign(epoch, "the controllers could not start");
    return;
  }
  term->controller = *std::move(controller);
}

void ShardReplicator::StoppedLeading() {
  std::unique_ptr<Term> term;
  {
    absl::MutexLock l(&term_mu_);
    term = std::move(term_);
  }
  if (term == nullptr) return;
  std::unique_ptr<CacheWriter> writer;
  std::unique_ptr<CcrController> controller;
  {
    absl::MutexLock l(&term->mu);
    term->ending = true;
    writer = std::move(term->writer);
    controller = std::move(term->controller);
  }
  // First nothing more is written; then the controllers stop.
  if (writer != nullptr) writer->Stop();
  if (controller != nullptr) controller->Stop();
  controller.reset();
  writer.reset();
  if (term->starter.joinable()) term->starter.join();
  metrics_.epoch.Set(0);
  spdlog::info("controllers of epoch {} stopped", term->epoch);
}

void ShardReplicator::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (elector_ != nullptr) elector_->Stop();  // ends the term, then releases the lease
  warm_subscription_.Cancel();
  warm_registration_.reset();
  std::map<std::string, Warmed> warmed;
  {
    absl::MutexLock l(&warm_mu_);
    warmed.swap(warm_);
  }
}

}  // namespace shardcache
