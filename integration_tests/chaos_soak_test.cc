// The chaos soak: two shards (a shard store each), one cache, two shard_replicator replicas per
// shard, every replica talking to its shard store and to the cache through its own FaultProxy.
// A schedule of faults and of workload writes, generated from a seed, runs for a while (the faults
// that it started last are still in force at its end); then every fault is healed and the
// InvariantChecker is polled until it finds the cache and every CCR's status equal to the truth,
// within a bound. The soak reports the time to convergence; on failure it prints the seed, the
// schedule and the checker's differences.
//
// The schedule is a pure function of the seed (and the duration): replaying a seed replays the
// same steps in the same order, at the same offsets; the processes' timing is of course not.
//
// Faults: SIGKILL, SIGTERM, SIGSTOP/SIGCONT and restarts of every process (replicas, shard stores,
// the cache), cache restarts without its data, per-replica partitions from its shard store or
// from the cache (black hole, cut, delay, flapping connections), definition deletes and
// recreates, CCR deletes, creates and selector edits, and lease thefts (the lease rewritten to
// another holder). Workload: creates, spec and status updates, label changes and deletes of
// widgets in two logical clusters of each shard.
//
// Flags (after the gtest flags) or environment:
//   --seed=N          SHARDCACHE_SOAK_SEED       the schedule's seed (default: from the clock)
//   --duration=D      SHARDCACHE_SOAK_DURATION   how long faults run (default 2m)
//   --converge=D      SHARDCACHE_SOAK_CONVERGE   the bound on convergence after heal (default 60s)
//   --round=D         SHARDCACHE_SOAK_ROUND      a long soak runs in rounds of this length (default
//                                                5m), each ending with a heal and a check; round k
//                                                runs the schedule of seed + k
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/lease_lock.h"
#include "common/client/store_client.h"
#include "integration_tests/fault_proxy.h"
#include "integration_tests/invariant_checker.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

struct SoakOptions {
  uint64_t seed = 0;
  absl::Duration duration = absl::Minutes(2);
  absl::Duration converge = absl::Seconds(60);
  absl::Duration round = absl::Minutes(5);
};
SoakOptions g_options;

const std::vector<std::string> kShards = {"a", "b"};
const std::vector<std::string> kClusters = {"root:org", "root:team"};
constexpr int kReplicasPerShard = 2;
constexpr int kNames = 16;  // widgets w0..w15 in each shard and cluster
constexpr char kCcrName[] = "widgets";
const std::vector<std::string> kApps = {"web", "db", "api"};
const std::vector<std::string> kSelectors = {
    "",
    R"({"matchLabels":{"app":"web"}})",
    R"({"matchExpressions":[{"key":"app","operator":"In","values":["web","db"]}]})",
    R"({"matchExpressions":[{"key":"app","operator":"NotIn","values":["api"]}]})",
};
// How long one workload or fault call may take (a paused store must not hold the soak).
constexpr absl::Duration kCallTimeout = absl::Seconds(2);

// --- The schedule ---

enum class Action {
  // Workload: target "shard/cluster/name", value: the label or number.
  kCreateWidget,
  kUpdateSpec,
  kUpdateStatus,
  kRelabel,
  kDeleteWidget,
  // Processes: target a replica ("a-0") or a store ("a", "b", "cache").
  kKill,
  kTerminate,
  kPause,
  kResume,
  kStart,
  kWipeCache,  // SIGKILL the cache and delete its data directory
  // Proxies: target "a-0/store" or "a-0/cache".
  kBlackHole,
  kCut,
  kDelay,
  kFlap,  // reset every open connection
  kHeal,
  // Shard state: target "shard" or "shard/cluster".
  kDeleteDefinition,
  kCreateDefinition,
  kDeleteCcr,
  kCreateCcr,  // value: the selector's index
  kEditSelector,
  kStealLease,  // value: the thief's lease duration in seconds
};

const char* ActionName(Action a) {
  switch (a) {
    case Action::kCreateWidget:
      return "create-widget";
    case Action::kUpdateSpec:
      return "update-spec";
    case Action::kUpdateStatus:
      return "update-status";
    case Action::kRelabel:
      return "relabel";
    case Action::kDeleteWidget:
      return "delete-widget";
    case Action::kKill:
      return "SIGKILL";
    case Action::kTerminate:
      return "SIGTERM";
    case Action::kPause:
      return "SIGSTOP";
    case Action::kResume:
      return "SIGCONT";
    case Action::kStart:
      return "start";
    case Action::kWipeCache:
      return "kill-and-wipe";
    case Action::kBlackHole:
      return "black-hole";
    case Action::kCut:
      return "cut";
    case Action::kDelay:
      return "delay";
    case Action::kFlap:
      return "flap";
    case Action::kHeal:
      return "heal";
    case Action::kDeleteDefinition:
      return "delete-definition";
    case Action::kCreateDefinition:
      return "create-definition";
    case Action::kDeleteCcr:
      return "delete-ccr";
    case Action::kCreateCcr:
      return "create-ccr";
    case Action::kEditSelector:
      return "edit-selector";
    case Action::kStealLease:
      return "steal-lease";
  }
  return "?";
}

struct Step {
  absl::Duration at;
  Action action;
  std::string target;
  int64_t value = 0;
  std::string ToString() const {
    return absl::StrCat("+", absl::FormatDuration(absl::Trunc(at, absl::Milliseconds(1))), " ",
                        ActionName(action), " ", target,
                        value != 0 ? absl::StrCat(" ", value) : "");
  }
};

// Deterministic helpers over mt19937_64 (whose output the C++ standard fixes).
class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}
  int64_t Uniform(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Uniform(0, static_cast<int64_t>(v.size()) - 1))];
  }
  bool Chance(int percent) { return Uniform(1, 100) <= percent; }
  // An index into `weights`, each picked in proportion to its weight.
  int Weighted(const std::vector<int>& weights) {
    int total = 0;
    for (int w : weights) total += w;
    int64_t x = Uniform(1, total);
    for (size_t i = 0; i < weights.size(); ++i) {
      x -= weights[i];
      if (x <= 0) return static_cast<int>(i);
    }
    return 0;
  }

 private:
  std::mt19937_64 rng_;
};

std::vector<std::string> Replicas() {
  std::vector<std::string> out;
  for (const std::string& s : kShards) {
    for (int i = 0; i < kReplicasPerShard; ++i) out.push_back(absl::StrCat(s, "-", i));
  }
  return out;
}

std::vector<Step> MakeSchedule(uint64_t seed, absl::Duration duration) {
  Random r(seed);
  std::vector<Step> steps;
  const std::vector<std::string> replicas = Replicas();
  std::vector<std::string> stores = kShards;
  stores.push_back("cache");
  auto later = [&](absl::Duration at) { return at + absl::Milliseconds(r.Uniform(500, 8000)); };
  for (absl::Duration at = absl::Milliseconds(r.Uniform(50, 300)); at < duration;
       at += absl::Milliseconds(r.Uniform(50, 300))) {
    const std::string shard = r.Pick(kShards);
    const std::string cluster = r.Pick(kClusters);
    if (r.Chance(85)) {  // workload
      std::string target = absl::StrCat(shard, "/", cluster, "/w", r.Uniform(0, kNames - 1));
      Action a = r.Pick(std::vector<Action>{Action::kCreateWidget, Action::kCreateWidget,
                                            Action::kUpdateSpec, Action::kUpdateStatus,
                                            Action::kRelabel, Action::kDeleteWidget});
      steps.push_back({at, a, target, r.Uniform(1, 1000)});
      continue;
    }
    // Fault kinds, weighted: replica death 3, pause 2, store death 3, network 4, definition 1,
    // CCRs 2, lease theft 1, flapping 1.
    switch (r.Weighted({3, 2, 3, 4, 1, 2, 1, 1})) {
      case 0: {  // a replica dies and comes back
        std::string rep = r.Pick(replicas);
        steps.push_back({at, r.Chance(70) ? Action::kKill : Action::kTerminate, rep});
        steps.push_back({later(at), Action::kStart, rep});
        break;
      }
      case 1: {  // a process paused, then resumed
        std::string p = r.Chance(60) ? r.Pick(replicas) : r.Pick(stores);
        steps.push_back({at, Action::kPause, p});
        steps.push_back({later(at), Action::kResume, p});
        break;
      }
      case 2: {  // a store dies (the cache may lose its data) and comes back
        std::string s = r.Chance(60) ? std::string("cache") : r.Pick(kShards);
        Action a = s == "cache" && r.Chance(40) ? Action::kWipeCache
                   : r.Chance(80)               ? Action::kKill
                                                : Action::kTerminate;
        steps.push_back({at, a, s});
        steps.push_back({later(at), Action::kStart, s});
        break;
      }
      case 3: {  // a network fault between a replica and one of its servers
        std::string proxy = absl::StrCat(r.Pick(replicas), r.Chance(50) ? "/store" : "/cache");
        Action a = r.Pick(
            std::vector<Action>{Action::kBlackHole, Action::kCut, Action::kDelay, Action::kFlap});
        steps.push_back({at, a, proxy, a == Action::kDelay ? r.Uniform(20, 400) : 0});
        if (a != Action::kFlap) steps.push_back({later(at), Action::kHeal, proxy});
        break;
      }
      case 4: {  // the definition goes, and comes back
        steps.push_back({at, Action::kDeleteDefinition, shard});
        steps.push_back({later(at), Action::kCreateDefinition, shard});
        break;
      }
      case 5: {  // CCRs: deleted (and recreated later), created, their selector edited
        std::string target = absl::StrCat(shard, "/", cluster);
        int64_t selector = r.Uniform(1, static_cast<int64_t>(kSelectors.size()));
        int kind = static_cast<int>(r.Uniform(0, 2));
        if (kind == 0) {
          steps.push_back({at, Action::kDeleteCcr, target});
          steps.push_back({later(at), Action::kCreateCcr, target, selector});
        } else if (kind == 1) {
          steps.push_back({at, Action::kCreateCcr, target, selector});
        } else {
          steps.push_back({at, Action::kEditSelector, target, selector});
        }
        break;
      }
      case 6: {  // the lease taken by a holder that is not a replica
        steps.push_back({at, Action::kStealLease, shard, r.Uniform(1, 6)});
        break;
      }
      default: {  // flapping: several resets in a row
        std::string proxy = absl::StrCat(r.Pick(replicas), r.Chance(50) ? "/store" : "/cache");
        for (int i = 0; i < 4; ++i) {
          steps.push_back({at + absl::Milliseconds(300 * i), Action::kFlap, proxy});
        }
        break;
      }
    }
  }
  // A fault's end that falls after the schedule's end is left to the heal, so that the soak ends
  // with faults in force and its convergence is that of a real recovery.
  steps.erase(
      std::remove_if(steps.begin(), steps.end(), [&](const Step& s) { return s.at >= duration; }),
      steps.end());
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.at < b.at; });
  return steps;
}

// The lengths of the rounds of a soak: `duration` cut into rounds of `round` (the last one
// shorter), at least one.
std::vector<absl::Duration> Rounds(absl::Duration duration, absl::Duration round) {
  std::vector<absl::Duration> out;
  for (absl::Duration left = duration; left > absl::ZeroDuration(); left -= round) {
    out.push_back(std::min(left, round));
  }
  if (out.empty()) out.push_back(duration);
  return out;
}

std::string Replay(uint64_t seed, absl::Duration duration, absl::Duration round) {
  std::string out = absl::StrCat("integration_tests/chaos_soak_test --seed=", seed,
                                 " --duration=", absl::FormatDuration(duration));
  if (duration > round) absl::StrAppend(&out, " --round=", absl::FormatDuration(round));
  return out;
}

// --- Running it ---

// What the soak did to a process.
enum class ProcState { kUp, kPaused, kDown };

struct Proc {
  std::unique_ptr<ServerProcess> process;
  ProcState state = ProcState::kUp;
};

class ChaosSoak : public ::testing::Test {
 protected:
  void TearDown() override {
    // Resume everything so that every process can be stopped.
    for (auto& [name, p] : replicas_) {
      if (p.state == ProcState::kPaused) p.process->Signal(SIGCONT);
    }
    for (auto& [name, p] : stores_) {
      if (p.state == ProcState::kPaused) p.process->Signal(SIGCONT);
    }
    replicas_.clear();
    proxies_.clear();
    stores_.clear();
  }

  v1::Store::Stub* Stub(const std::string& store) { return stubs_.at(store).get(); }

  void StartStores() {
    for (const std::string& s : kShards) {
      stores_[s].process = std::make_unique<ServerProcess>(
          BinaryPath("cache_server/cache_server"), std::vector<std::string>{"--role=shard"});
    }
    stores_["cache"].process = std::make_unique<ServerProcess>(
        BinaryPath("cache_server/cache_server"), std::vector<std::string>{"--role=cache"});
    for (auto& [name, p] : stores_) {
      absl::Status started = p.process->Start();
      ASSERT_TRUE(started.ok()) << name << ": " << started;
      ASSERT_NO_FATAL_FAILURE(Connect(name));
    }
  }

  // A new channel to a store for the soak's own calls, with the replicators' channel arguments
  // (they reach a restarted store within a second, not after gRPC's default reconnect backoff).
  void Connect(const std::string& store) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateStoreChannel(stores_.at(store).process->grpc_address());
    ASSERT_TRUE(channel.ok()) << channel.status();
    stubs_[store] = v1::Store::NewStub(*channel);
  }

  void StartReplicas() {
    for (const std::string& rep : Replicas()) {
      const std::string shard = rep.substr(0, rep.find('-'));
      for (const char* side : {"store", "cache"}) {
        const std::string server = std::string(side) == "store" ? shard : "cache";
        absl::StatusOr<std::unique_ptr<FaultProxy>> proxy =
            FaultProxy::Start("127.0.0.1", stores_.at(server).process->grpc_port());
        ASSERT_TRUE(proxy.ok()) << proxy.status();
        proxies_[absl::StrCat(rep, "/", side)] = *std::move(proxy);
      }
      std::vector<std::string> args = {
          "--shard=" + shard,
          "--shard-store=" + proxies_.at(rep + "/store")->address(),
          "--cache=" + proxies_.at(rep + "/cache")->address(),
          "--identity=" + rep,
          absl::StrCat("--lease-duration=", absl::FormatDuration(kLeaseDuration)),
          absl::StrCat("--renew-deadline=", absl::FormatDuration(kRenewDeadline)),
          absl::StrCat("--retry-period=", absl::FormatDuration(kRetryPeriod)),
      };
      replicas_[rep].process =
          std::make_unique<ServerProcess>(BinaryPath("shard_replicator/shard_replicator"), args);
      absl::Status started = replicas_[rep].process->Start();
      ASSERT_TRUE(started.ok()) << rep << ": " << started;
    }
  }

  // --- Calls that may fail (a fault is in the way): their outcome is logged, not asserted ---

  grpc::Status CreateIn(const std::string& store, const v1::GroupVersionResource& gvr,
                        const v1::Object& obj) {
    v1::CreateRequest req;
    *req.mutable_resource() = gvr;
    *req.mutable_object() = obj;
    v1::Object out;
    return Stub(store)->Create(Context(kCallTimeout).get(), req, &out);
  }

  grpc::Status DeleteIn(const std::string& store, const v1::GroupVersionResource& gvr,
                        const std::string& cluster, const std::string& ns,
                        const std::string& name) {
    v1::DeleteRequest req;
    *req.mutable_resource() = gvr;
    req.set_cluster(cluster);
    req.set_namespace_(ns);
    req.set_name(name);
    v1::DeleteResponse out;
    return Stub(store)->Delete(Context(kCallTimeout).get(), req, &out);
  }

  // Read-modify-write, retried a few times on conflict.
  grpc::Status ModifyIn(const std::string& store, const v1::GroupVersionResource& gvr,
                        const std::string& cluster, const std::string& ns, const std::string& name,
                        const std::function<void(v1::Object*)>& mutate, bool status = false) {
    grpc::Status s;
    for (int attempt = 0; attempt < 5; ++attempt) {
      v1::GetRequest get;
      *get.mutable_resource() = gvr;
      get.set_cluster(cluster);
      get.set_namespace_(ns);
      get.set_name(name);
      v1::Object obj;
      s = Stub(store)->Get(Context(kCallTimeout).get(), get, &obj);
      if (!s.ok()) return s;
      mutate(&obj);
      v1::UpdateRequest req;
      *req.mutable_resource() = gvr;
      *req.mutable_object() = obj;
      v1::Object out;
      s = status ? Stub(store)->UpdateStatus(Context(kCallTimeout).get(), req, &out)
                 : Stub(store)->Update(Context(kCallTimeout).get(), req, &out);
      if (s.error_code() != grpc::StatusCode::ABORTED) return s;
    }
    return s;
  }

  static v1::Object WidgetIn(const std::string& cluster, const std::string& name,
                             const std::string& app) {
    v1::Object w = Widget(name, absl::StrCat(R"({"app":")", app, R"("})"));
    w.mutable_metadata()->set_cluster(cluster);
    return w;
  }

  static v1::Object WidgetsDefinition() {
    return Definition("example.com", "widgets", "Namespaced", {"v1"}, true);
  }

  grpc::Status CreateCcr(const std::string& shard, const std::string& cluster, int64_t selector) {
    return CreateIn(shard, CcrGvr(),
                    Ccr(kCcrName, kSelectors[static_cast<size_t>(selector - 1)], cluster));
  }

  // --- Steps ---

  // Runs one step; returns what happened, for the log.
  std::string RunStep(const Step& step) {
    std::vector<std::string> parts = absl::StrSplit(step.target, '/');
    auto status_text = [](const grpc::Status& s) {
      return s.ok() ? std::string("ok") : absl::StrCat("code ", static_cast<int>(s.error_code()));
    };
    switch (step.action) {
      case Action::kCreateWidget:
        return status_text(
            CreateIn(parts[0], WidgetsGvr(), WidgetIn(parts[1], parts[2], kApps[step.value % 3])));
      case Action::kUpdateSpec:
      case Action::kUpdateStatus:
      case Action::kRelabel: {
        bool status = step.action == Action::kUpdateStatus;
        return status_text(ModifyIn(
            parts[0], WidgetsGvr(), parts[1], kNamespace, parts[2],
            [&](v1::Object* o) {
              if (step.action == Action::kRelabel) {
                (*o->mutable_metadata()->mutable_labels())["app"] = kApps[step.value % 3];
              } else {
                auto* fields = status ? o->mutable_status()->mutable_fields()
                                      : o->mutable_spec()->mutable_fields();
                (*fields)[status ? "observed" : "size"].set_number_value(
                    static_cast<double>(step.value));
              }
            },
            status));
      }
      case Action::kDeleteWidget:
        return status_text(DeleteIn(parts[0], WidgetsGvr(), parts[1], kNamespace, parts[2]));
      case Action::kKill:
      case Action::kTerminate:
      case Action::kWipeCache:
      case Action::kPause:
      case Action::kResume:
      case Action::kStart:
        return RunProcessStep(step);
      case Action::kBlackHole:
        proxies_.at(step.target)->BlackHole();
        return "ok";
      case Action::kCut:
        proxies_.at(step.target)->Cut();
        return "ok";
      case Action::kDelay:
        proxies_.at(step.target)->Delay(absl::Milliseconds(step.value));
        return "ok";
      case Action::kFlap:
        proxies_.at(step.target)->ResetAll();
        return "ok";
      case Action::kHeal:
        proxies_.at(step.target)->Heal();
        return "ok";
      case Action::kDeleteDefinition:
        return status_text(DeleteIn(parts[0], DefinitionGvr(), "", "", "widgets.example.com"));
      case Action::kCreateDefinition:
        return status_text(CreateIn(parts[0], DefinitionGvr(), WidgetsDefinition()));
      case Action::kDeleteCcr:
        return status_text(DeleteIn(parts[0], CcrGvr(), parts[1], "", kCcrName));
      case Action::kCreateCcr:
        return status_text(CreateCcr(parts[0], parts[1], step.value));
      case Action::kEditSelector: {
        std::string selector = kSelectors[static_cast<size_t>(step.value - 1)];
        return status_text(ModifyIn(parts[0], CcrGvr(), parts[1], "", kCcrName, [&](v1::Object* o) {
          auto& f = *o->mutable_spec()->mutable_fields();
          if (selector.empty()) {
            f.erase("labelSelector");
          } else {
            *f["labelSelector"].mutable_struct_value() =
                FromJson<google::protobuf::Struct>(selector);
          }
        }));
      }
      case Action::kStealLease:
        return status_text(ModifyIn(parts[0], LeaseGvr(), kLeaseCluster, kLeaseNamespace,
                                    kLeaseName, [&](v1::Object* lease) {
                                      absl::StatusOr<LeaderElectionRecord> record =
                                          RecordFromSpec(lease->spec());
                                      if (!record.ok()) return;
                                      record->holder_identity = "thief";
                                      record->leader_transitions += 1;
                                      record->acquire_time = absl::Now();
                                      record->renew_time = absl::Now();
                                      record->lease_duration = absl::Seconds(step.value);
                                      *lease->mutable_spec() = RecordToSpec(*record);
                                    }));
    }
    return "?";
  }

  std::string RunProcessStep(const Step& step) {
    bool is_replica = replicas_.count(step.target) > 0;
    Proc& p = is_replica ? replicas_.at(step.target) : stores_.at(step.target);
    switch (step.action) {
      case Action::kKill:
      case Action::kWipeCache:
        if (p.state == ProcState::kDown) return "already down";
        p.process->Signal(SIGKILL);
        p.process->Wait(absl::Seconds(10));
        p.state = ProcState::kDown;
        if (step.action == Action::kWipeCache) {
          std::error_code ignored;
          std::filesystem::remove_all(p.process->data_dir(), ignored);
        }
        return "ok";
      case Action::kTerminate: {
        if (p.state == ProcState::kDown) return "already down";
        int status = p.process->Stop(absl::Seconds(20));
        p.state = ProcState::kDown;
        if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          Finding(absl::StrCat(step.target, " did not exit 0 on SIGTERM (", status, ")"));
        }
        return "ok";
      }
      case Action::kPause:
        if (p.state != ProcState::kUp) return "not up";
        p.process->Pause();
        p.state = ProcState::kPaused;
        return "ok";
      case Action::kResume:
        if (p.state != ProcState::kPaused) return "not paused";
        p.process->Signal(SIGCONT);
        p.state = ProcState::kUp;
        return "ok";
      case Action::kStart: {
        if (p.state != ProcState::kDown) return "not down";
        absl::Status started = p.process->Start();
        if (!started.ok()) {
          Finding(absl::StrCat(step.target, " did not start: ", started.ToString()));
          return "failed";
        }
        p.state = ProcState::kUp;
        return "ok";
      }
      default:
        return "?";
    }
  }

  // Something wrong that is not a difference in the cache (a process that exited by itself).
  void Finding(const std::string& what) {
    std::cerr << "soak finding: " << what << "\n";
    findings_.push_back(what);
  }

  // Ends every fault: every process runs (one that exited by itself is a finding), every proxy
  // passes, every definition exists.
  void HealEverything() {
    for (auto* procs : {&stores_, &replicas_}) {
      for (auto& [name, p] : *procs) {
        if (p.state == ProcState::kPaused) p.process->Signal(SIGCONT);
        if (p.state != ProcState::kDown) {
          int status = p.process->Wait(absl::ZeroDuration());
          if (status != -1) {
            Finding(absl::StrCat(name, " exited by itself (status ", status, ")"));
            p.state = ProcState::kDown;
          }
        }
        if (p.state == ProcState::kDown) {
          absl::Status started = p.process->Start();
          if (!started.ok()) Finding(absl::StrCat(name, " did not restart: ", started.ToString()));
        }
        p.state = ProcState::kUp;
      }
    }
    for (auto& [name, proxy] : proxies_) proxy->Heal();
    // The heal's own calls go over new channels, as the checker's do. A channel of the soak to a
    // store that was down for a long time has been seen failing every call with the error of its
    // last attempt ("connection refused", "tcp handshaker shutdown") for 10 s and more after the
    // store was back and served everyone else; the heal is not the place to wait for it.
    for (auto& [name, p] : stores_) Connect(name);
    // Every definition exists, and every cluster has its CCR again (one deleted by the schedule
    // comes back selecting everything).
    auto ensure = [&](const std::string& what, const std::function<grpc::Status()>& create) {
      grpc::Status s;
      for (int attempt = 0; attempt < 40; ++attempt) {
        s = create();
        if (s.ok() || s.error_code() == grpc::StatusCode::ALREADY_EXISTS) return;
        absl::SleepFor(absl::Milliseconds(250));
      }
      Finding(absl::StrCat(what, " still failed 10 s after the heal: code ",
                           static_cast<int>(s.error_code()), ": ", s.error_message()));
    };
    for (const std::string& shard : kShards) {
      ensure("creating the definition in shard store " + shard,
             [&] { return CreateIn(shard, DefinitionGvr(), WidgetsDefinition()); });
      for (const std::string& cluster : kClusters) {
        ensure(absl::StrCat("creating CCR ", cluster, "|", kCcrName, " in shard store ", shard),
               [&] { return CreateCcr(shard, cluster, 1); });
      }
    }
  }

  // Polls the checker until it finds nothing; the time it took, or nullopt (with the last
  // differences in `last`).
  std::optional<absl::Duration> Converge(absl::Duration bound, std::string* last) {
    InvariantChecker::Options options;
    for (const std::string& s : kShards) options.shards[s] = stores_.at(s).process->grpc_address();
    options.cache = stores_.at("cache").process->grpc_address();
    options.resources = {WidgetsGvr()};
    absl::StatusOr<std::unique_ptr<InvariantChecker>> checker = InvariantChecker::Create(options);
    if (!checker.ok()) {
      *last = checker.status().ToString();
      return std::nullopt;
    }
    absl::Time start = absl::Now();
    while (true) {
      absl::StatusOr<ClusterState> state = (*checker)->Read();
      absl::StatusOr<std::vector<Difference>> diffs =
          state.ok() ? absl::StatusOr<std::vector<Difference>>(Compare(*state)) : state.status();
      if (diffs.ok() && diffs->empty()) {
        absl::Duration took = absl::Now() - start;
        // What was checked, so that a vacuous "nothing differs" shows.
        size_t ccrs = 0, copies = 0;
        for (const auto& [name, shard] : state->shards) ccrs += shard.ccrs.size();
        for (const auto& [gvr, items] : state->cache) copies += items.size();
        std::cerr << "chaos soak: checked " << ccrs << " CCRs and " << copies
                  << " objects in the cache\n";
        return took;
      }
      *last = diffs.ok() ? absl::StrCat(diffs->size(), " differences:\n", Describe(*diffs))
                         : diffs.status().ToString();
      if (absl::Now() - start > bound) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(500));
    }
  }

  // One round: the schedule of `seed` over `length`, then the heal, then the checker until it
  // finds nothing. `converged` gets the time from the start of the heal, or stays empty (the
  // failure, with the schedule as it ran, is reported).
  void RunRound(size_t k, uint64_t seed, absl::Duration length, absl::Duration bound,
                std::optional<absl::Duration>* converged) {
    const std::string replay = Replay(seed, length, length);
    const std::vector<Step> schedule = MakeSchedule(seed, length);
    std::cerr << "chaos soak: round " << k << ": seed " << seed << ", " << schedule.size()
              << " steps (replay alone: " << replay << ")\n";
    const size_t findings_before = findings_.size();
    const absl::Time start = absl::Now();
    std::vector<std::string> log;
    for (const Step& step : schedule) {
      absl::Duration wait = step.at - (absl::Now() - start);
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
      std::string outcome = RunStep(step);
      log.push_back(absl::StrCat(
          step.ToString(), " -> ", outcome, " (at +",
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))), ")"));
    }
    std::map<std::string, std::map<std::string, int>> outcomes;  // action -> outcome -> count
    for (size_t i = 0; i < schedule.size(); ++i) {
      ++outcomes[ActionName(schedule[i].action)][log[i].substr(
          log[i].find(" -> ") + 4, log[i].find(" (at") - log[i].find(" -> ") - 4)];
    }
    std::vector<std::string> summary;
    for (const auto& [action, by_outcome] : outcomes) {
      std::vector<std::string> parts;
      for (const auto& [outcome, n] : by_outcome) parts.push_back(absl::StrCat(outcome, " ", n));
      summary.push_back(absl::StrCat(action, " (", absl::StrJoin(parts, ", "), ")"));
    }
    std::cerr << "chaos soak: round " << k << ": schedule ran in " << absl::Now() - start << ": "
              << absl::StrJoin(summary, "; ") << "; healing\n";
    // Convergence is timed from the moment the faults end: the heal itself (restarting
    // processes, recreating definitions and CCRs) takes seconds, during which the replicas
    // already converge.
    const absl::Time heal_start = absl::Now();
    HealEverything();
    const absl::Duration healing = absl::Now() - heal_start;
    std::string last;
    std::optional<absl::Duration> checked = Converge(bound, &last);
    if (checked.has_value()) {
      *converged = healing + *checked;
      std::cerr << "chaos soak: round " << k << ": seed " << seed << " converged " << **converged
                << " after the heal began (healing took " << healing << ", then " << *checked
                << " until the checker found nothing)\n";
      std::cout << "[soak] round=" << k << " seed=" << seed
                << " converged_after_heal_ms=" << absl::ToInt64Milliseconds(**converged)
                << " healing_ms=" << absl::ToInt64Milliseconds(healing) << "\n";
    }
    EXPECT_TRUE(checked.has_value())
        << "round " << k << ", seed " << seed << ": not converged within " << bound
        << " after heal.\nreplay: " << replay << "\nschedule as run:\n  "
        << absl::StrJoin(log, "\n  ") << "\nlast check: " << last;
    const std::vector<std::string> found(findings_.begin() + findings_before, findings_.end());
    EXPECT_TRUE(found.empty()) << "round " << k << ", seed " << seed << ": "
                               << absl::StrJoin(found, "\n") << "\nreplay: " << replay
                               << "\nschedule as run:\n  " << absl::StrJoin(log, "\n  ");
  }

  std::map<std::string, Proc> stores_;  // "a", "b", "cache"
  std::map<std::string, std::unique_ptr<v1::Store::Stub>> stubs_;
  std::map<std::string, std::unique_ptr<FaultProxy>> proxies_;  // "a-0/store", "a-0/cache"
  std::map<std::string, Proc> replicas_;                        // "a-0"
  std::vector<std::string> findings_;
};

TEST_F(ChaosSoak, ConvergesAfterEveryFaultIsHealed) {
  const SoakOptions o = g_options;
  const std::vector<absl::Duration> rounds = Rounds(o.duration, o.round);
  std::cerr << "chaos soak: seed " << o.seed << ", faults for " << o.duration << " in "
            << rounds.size() << " round(s), convergence bound " << o.converge
            << "\n  replay: " << Replay(o.seed, o.duration, o.round) << "\n";

  ASSERT_NO_FATAL_FAILURE(StartStores());
  for (const std::string& shard : kShards) {
    ASSERT_TRUE(Ok(CreateIn(shard, DefinitionGvr(), WidgetsDefinition())));
    for (const std::string& cluster : kClusters) {
      ASSERT_TRUE(Ok(CreateCcr(shard, cluster, 2)));
      for (int i = 0; i < kNames / 2; ++i) {
        ASSERT_TRUE(Ok(
            CreateIn(shard, WidgetsGvr(), WidgetIn(cluster, absl::StrCat("w", i), kApps[i % 3]))));
      }
    }
  }
  ASSERT_NO_FATAL_FAILURE(StartReplicas());
  std::string last;
  std::optional<absl::Duration> initial = Converge(o.converge, &last);
  ASSERT_TRUE(initial.has_value())
      << "seed " << o.seed << ": the initial state did not converge: " << last;
  std::cerr << "chaos soak: initial state converged in " << *initial << "\n";

  std::vector<absl::Duration> times;
  for (size_t k = 0; k < rounds.size(); ++k) {
    // Round k runs the schedule of seed + k: a round that fails replays alone (from a fresh
    // start rather than from the state the rounds before it left) with that seed and length.
    const uint64_t seed = o.seed + k;
    std::optional<absl::Duration> converged;
    ASSERT_NO_FATAL_FAILURE(RunRound(k, seed, rounds[k], o.converge, &converged));
    if (!converged.has_value()) break;
    times.push_back(*converged);
  }
  if (times.size() == rounds.size() && !times.empty()) {
    std::vector<absl::Duration> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const absl::Duration median =
        n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    std::cerr << "chaos soak: seed " << o.seed << ": " << times.size()
              << " round(s) converged; median " << median << ", worst " << sorted.back() << "\n";
    std::cout << "[soak] seed=" << o.seed << " rounds=" << times.size()
              << " median_ms=" << absl::ToInt64Milliseconds(median)
              << " worst_ms=" << absl::ToInt64Milliseconds(sorted.back()) << "\n";
  }
}

// A seed replays: the same seed makes the same schedule, another seed another one, and every
// fault kind appears in a schedule of the default length.
TEST(ChaosSoakSchedule, IsAFunctionOfTheSeed) {
  auto text = [](const std::vector<Step>& steps) {
    std::vector<std::string> lines;
    for (const Step& s : steps) lines.push_back(s.ToString());
    return absl::StrJoin(lines, "\n");
  };
  const std::vector<Step> a = MakeSchedule(42, absl::Minutes(2));
  EXPECT_EQ(text(a), text(MakeSchedule(42, absl::Minutes(2))));
  EXPECT_NE(text(a), text(MakeSchedule(43, absl::Minutes(2))));
  std::set<Action> kinds;
  for (const Step& s : a) kinds.insert(s.action);
  EXPECT_EQ(kinds.size(), static_cast<size_t>(Action::kStealLease) + 1) << text(a);
}

// A long soak is cut into rounds; a short one is one round.
TEST(ChaosSoakSchedule, RoundsCoverTheDuration) {
  EXPECT_EQ(Rounds(absl::Minutes(2), absl::Minutes(5)),
            std::vector<absl::Duration>{absl::Minutes(2)});
  EXPECT_EQ(Rounds(absl::Hours(1), absl::Minutes(5)).size(), 12u);
  EXPECT_EQ(Rounds(absl::Minutes(11), absl::Minutes(5)),
            (std::vector<absl::Duration>{absl::Minutes(5), absl::Minutes(5), absl::Minutes(1)}));
}

bool ParseFlag(const std::string& arg, const std::string& name, std::string* value) {
  std::string prefix = "--" + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *value = arg.substr(prefix.size());
  return true;
}

}  // namespace
}  // namespace shardcache::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using shardcache::testing::g_options;
  std::string seed, duration, converge, round;
  if (const char* e = std::getenv("SHARDCACHE_SOAK_SEED")) seed = e;
  if (const char* e = std::getenv("SHARDCACHE_SOAK_ROUND")) round = e;
  if (const char* e = std::getenv("SHARDCACHE_SOAK_DURATION")) duration = e;
  if (const char* e = std::getenv("SHARDCACHE_SOAK_CONVERGE")) converge = e;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!shardcache::testing::ParseFlag(arg, "seed", &seed) &&
        !shardcache::testing::ParseFlag(arg, "duration", &duration) &&
        !shardcache::testing::ParseFlag(arg, "converge", &converge) &&
        !shardcache::testing::ParseFlag(arg, "round", &round)) {
      std::cerr << "unknown flag " << arg
                << " (want --seed=N, --duration=D, --converge=D, --round=D)\n";
      return 2;
    }
  }
  if (seed.empty()) {
    g_options.seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) % 1000000007;
  } else if (!absl::SimpleAtoi(seed, &g_options.seed)) {
    std::cerr << "bad seed " << seed << "\n";
    return 2;
  }
  if (!duration.empty() && !absl::ParseDuration(duration, &g_options.duration)) {
    std::cerr << "bad duration " << duration << "\n";
    return 2;
  }
  if (!converge.empty() && !absl::ParseDuration(converge, &g_options.converge)) {
    std::cerr << "bad convergence bound " << converge << "\n";
    return 2;
  }
  if (!round.empty() &&
      (!absl::ParseDuration(round, &g_options.round) || g_options.round <= absl::ZeroDuration())) {
    std::cerr << "bad round length " << round << "\n";
    return 2;
  }
  return RUN_ALL_TESTS();
}
