#include "integration_tests/invariant_checker.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/client/lease_lock.h"
#include "common/label_selector.h"

namespace shardcache::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr char kOriginalRv[] = "cache.shardcache.io/original-resource-version";
constexpr char kOriginalUid[] = "cache.shardcache.io/original-uid";
constexpr char kFinalizer[] = "cache.shardcache.io/replicator";

v1::GroupVersionResource MakeGvr(const std::string& g, const std::string& v, const std::string& r) {
  v1::GroupVersionResource gvr;
  gvr.set_group(g);
  gvr.set_version(v);
  gvr.set_resource(r);
  return gvr;
}

v1::GroupVersionResource CcrGvr() {
  return MakeGvr("cache.shardcache.io", "v1alpha1", "clustercachedresources");
}
v1::GroupVersionResource DefinitionGvr() {
  return MakeGvr("core.shardcache.io", "v1", "resourcedefinitions");
}

std::string GvrKey(const v1::GroupVersionResource& gvr) {
  return absl::StrCat(gvr.group(), "/", gvr.version(), "/", gvr.resource());
}

std::string ObjectKey(const std::string& gvr_key, const v1::Object& o) {
  const v1::ObjectMeta& m = o.metadata();
  return absl::StrCat(gvr_key, " ", m.cluster(), "/", m.namespace_(), "/", m.name());
}

std::string CcrName(const v1::Object& ccr) {
  return absl::StrCat(ccr.metadata().cluster(), "|", ccr.metadata().name());
}

const Value* Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}
std::string StringField(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_string_value() ? v->string_value() : "";
}
const Struct* StructField(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_struct_value() ? &v->struct_value() : nullptr;
}
// A number field; -1 when absent.
double NumberField(const Struct* s, const std::string& name) {
  if (s == nullptr) return -1;
  const Value* v = Field(*s, name);
  return v != nullptr && v->has_number_value() ? v->number_value() : -1;
}
// A field ("status", "reason") of condition `type` in a CCR's status; "" when absent.
std::string ConditionField(const Struct& status, const std::string& type,
                           const std::string& field) {
  const Value* conditions = Field(status, "conditions");
  if (conditions == nullptr || !conditions->has_list_value()) return "";
  for (const Value& c : conditions->list_value().values()) {
    if (c.has_struct_value() && StringField(c.struct_value(), "type") == type) {
      return StringField(c.struct_value(), field);
    }
  }
  return "";
}
// The status ("True"/"False", "" when absent) of condition `type` in a CCR's status.
std::string ConditionStatus(const Struct& status, const std::string& type) {
  return ConditionField(status, type, "status");
}

// "" when a status of term `epoch` is the current term's: `lease` names a holder and its
// leaseTransitions is `epoch`; otherwise what differs.
std::string EpochDifference(double epoch, const std::optional<v1::Object>& lease) {
  if (!lease.has_value()) return absl::StrCat("epoch ", epoch, ", but there is no lease");
  absl::StatusOr<LeaderElectionRecord> record = RecordFromSpec(lease->spec());
  if (!record.ok())
    return absl::StrCat("epoch ", epoch, ", lease unreadable: ", record.status().ToString());
  if (record->holder_identity.empty()) {
    return absl::StrCat("epoch ", epoch, ", but the lease names no holder (leaseTransitions ",
                        record->leader_transitions, ")");
  }
  if (epoch != static_cast<double>(record->leader_transitions)) {
    return absl::StrCat("epoch ", epoch, ", want the lease's leaseTransitions ",
                        record->leader_transitions, " (holder ", record->holder_identity, ")");
  }
  return "";
}

// A CCR's spec as the checker reads it.
struct CcrView {
  const v1::Object* object = nullptr;
  bool parsed = false;
  v1::GroupVersionResource gvr;
  LabelSelector selector;
};

CcrView ParseCcr(const v1::Object& ccr) {
  CcrView view;
  view.object = &ccr;
  const Struct& spec = ccr.spec();
  view.gvr = MakeGvr(StringField(spec, "group"), StringField(spec, "version"),
                     StringField(spec, "resource"));
  if (view.gvr.version().empty() || view.gvr.resource().empty()) return view;
  const Value* sel = Field(spec, "labelSelector");
  if (sel != nullptr && !sel->has_null_value()) {
    if (!sel->has_struct_value()) return view;
    absl::StatusOr<LabelSelector> parsed = LabelSelector::FromStruct(sel->struct_value());
    if (!parsed.ok()) return view;
    view.selector = *std::move(parsed);
  }
  view.parsed = true;
  return view;
}

bool CreatedBefore(const v1::Object& a, const v1::Object& b) {
  const auto& ta = a.metadata().creation_timestamp();
  const auto& tb = b.metadata().creation_timestamp();
  return std::make_tuple(ta.seconds(), ta.nanos(), a.metadata().name()) <
         std::make_tuple(tb.seconds(), tb.nanos(), b.metadata().name());
}

// Whether `definitions` define `gvr` with that version served.
bool Served(const std::vector<v1::Object>& definitions, const v1::GroupVersionResource& gvr) {
  for (const v1::Object& d : definitions) {
    if (d.metadata().has_deletion_timestamp()) continue;
    const Struct& spec = d.spec();
    const Struct* names = StructField(spec, "names");
    if (StringField(spec, "group") != gvr.group() || names == nullptr ||
        StringField(*names, "plural") != gvr.resource()) {
      continue;
    }
    const Value* versions = Field(spec, "versions");
    if (versions == nullptr || !versions->has_list_value()) continue;
    for (const Value& v : versions->list_value().values()) {
      if (!v.has_struct_value()) continue;
      const Value* served = Field(v.struct_value(), "served");
      if (StringField(v.struct_value(), "name") == gvr.version() && served != nullptr &&
          served->bool_value()) {
        return true;
      }
    }
  }
  return false;
}

// The copy `origin` must have in the cache (its resourceVersion left empty).
v1::Object Projection(const v1::Object& origin, const std::string& shard) {
  v1::Object want;
  v1::ObjectMeta& m = *want.mutable_metadata();
  const v1::ObjectMeta& om = origin.metadata();
  m.set_shard(shard);
  m.set_cluster(om.cluster());
  m.set_namespace_(om.namespace_());
  m.set_name(om.name());
  m.set_uid(om.uid());
  if (om.has_creation_timestamp()) *m.mutable_creation_timestamp() = om.creation_timestamp();
  m.set_generation(om.generation());
  *m.mutable_labels() = om.labels();
  *m.mutable_annotations() = om.annotations();
  (*m.mutable_annotations())[kOriginalRv] = om.resource_version();
  (*m.mutable_annotations())[kOriginalUid] = om.uid();
  if (!origin.spec().fields().empty()) *want.mutable_spec() = origin.spec();
  if (!origin.status().fields().empty()) *want.mutable_status() = origin.status();
  return want;
}

// "" when `copy` equals `want` (everything but its own resourceVersion; an empty spec or status
// equals an absent one); else what differs.
std::string CopyDifference(const v1::Object& want, const v1::Object& copy) {
  v1::Object got = copy;
  got.mutable_metadata()->clear_resource_version();
  if (got.spec().fields().empty()) got.clear_spec();
  if (got.status().fields().empty()) got.clear_status();
  std::string report;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&report);
  if (differ.Compare(want, got)) return "";
  while (!report.empty() && report.back() == '\n') report.pop_back();
  for (char& c : report) {
    if (c == '\n') c = ';';
  }
  return report;
}

std::string Annotation(const v1::Object& o, const std::string& name) {
  auto it = o.metadata().annotations().find(name);
  return it == o.metadata().annotations().end() ? "(none)" : it->second;
}

// A copy's place in the cache: resource, shard, cluster, namespace, name.
using CopyKey = std::tuple<std::string, std::string, std::string, std::string, std::string>;
CopyKey KeyOf(const std::string& gvr_key, const v1::ObjectMeta& m) {
  return {gvr_key, m.shard(), m.cluster(), m.namespace_(), m.name()};
}

struct Expected {
  v1::Object copy;
  std::string ccr;  // who wants it ("" for a CCR's own copy)
  bool is_ccr = false;
};

void CompareStatus(const std::string& shard, const CcrView& view, bool valid, bool served,
                   int64_t selected, const std::optional<v1::Object>& lease,
                   std::vector<Difference>* out) {
  const v1::Object& ccr = *view.object;
  const Struct& status = ccr.status();
  std::vector<std::string> wrong;
  auto want = [&](bool ok, const std::string& what) {
    if (!ok) wrong.push_back(what);
  };
  std::string phase = StringField(status, "phase");
  double observed = NumberField(&status, "observedGeneration");
  want(observed == static_cast<double>(ccr.metadata().generation()),
       absl::StrCat("observedGeneration ", observed, ", want ", ccr.metadata().generation()));
  std::string valid_cond = ConditionStatus(status, "ResourceValid");
  std::string started = ConditionStatus(status, "ReplicationStarted");
  std::string synced = ConditionStatus(status, "Synced");
  std::string synced_reason = ConditionField(status, "Synced", "reason");
  std::string epoch = EpochDifference(NumberField(&status, "epoch"), lease);
  want(epoch.empty(), epoch);
  const Struct* counts = StructField(status, "resourceCounts");
  double local = NumberField(counts, "local");
  double cache = NumberField(counts, "cache");
  if (!valid) {
    want(valid_cond == "False", absl::StrCat("ResourceValid ", valid_cond, ", want False"));
    want(phase == "Initializing", absl::StrCat("phase ", phase, ", want Initializing"));
    want(synced != "True", "Synced True, want not True (invalid)");
  } else if (!served) {
    want(valid_cond == "True", absl::StrCat("ResourceValid ", valid_cond, ", want True"));
    want(phase == "Initializing",
         absl::StrCat("phase ", phase, ", want Initializing (not served)"));
    want(started == "False",
         absl::StrCat("ReplicationStarted ", started, ", want False (not served)"));
    want(cache <= 0, absl::StrCat("resourceCounts.cache ", cache, ", want 0 (not served)"));
    want(synced != "True", "Synced True, want not True (not served)");
  } else {
    want(valid_cond == "True", absl::StrCat("ResourceValid ", valid_cond, ", want True"));
    want(phase == "Ready", absl::StrCat("phase ", phase, ", want Ready"));
    want(started == "True", absl::StrCat("ReplicationStarted ", started, ", want True"));
    want(synced == "True" && synced_reason == "InSync",
         absl::StrCat("Synced ", synced, " (", synced_reason, "), want True (InSync)"));
    want(local == static_cast<double>(selected),
         absl::StrCat("resourceCounts.local ", local, ", want ", selected));
    want(cache == static_cast<double>(selected),
         absl::StrCat("resourceCounts.cache ", cache, ", want ", selected));
  }
  if (!wrong.empty()) {
    out->push_back({Difference::Kind::kWrongStatus, shard, CcrName(ccr),
                    ObjectKey(GvrKey(CcrGvr()), ccr), absl::StrJoin(wrong, "; ")});
  }
}

}  // namespace

const char* Difference::KindName(Kind kind) {
  switch (kind) {
    case Kind::kMissingCopy:
      return "missing-copy";
    case Kind::kExtraCopy:
      return "extra-copy";
    case Kind::kStaleCopy:
      return "stale-copy";
    case Kind::kWrongCopy:
      return "wrong-copy";
    case Kind::kMissingCcrCopy:
      return "missing-ccr-copy";
    case Kind::kStaleCcrCopy:
      return "stale-ccr-copy";
    case Kind::kWrongStatus:
      return "wrong-status";
    case Kind::kStuckDeleting:
      return "stuck-deleting";
    case Kind::kMissingFinalizer:
      return "missing-finalizer";
    case Kind::kLocalHasShard:
      return "local-has-shard";
  }
  return "?";
}

std::string Difference::ToString() const {
  return absl::StrCat(KindName(kind), " shard=", shard, ccr.empty() ? "" : " ccr=" + ccr,
                      " key=", key, detail.empty() ? "" : ": " + detail);
}

std::string Describe(const std::vector<Difference>& diffs) {
  if (diffs.empty()) return "none";
  std::vector<std::string> lines;
  for (const Difference& d : diffs) lines.push_back(d.ToString());
  return absl::StrJoin(lines, "\n");
}

std::vector<Difference> Compare(const ClusterState& state, bool check_status) {
  std::vector<Difference> out;
  std::map<CopyKey, Expected> expected;
  const std::string ccr_key = GvrKey(CcrGvr());

  for (const auto& [shard, s] : state.shards) {
    std::vector<CcrView> views;
    for (const v1::Object& ccr : s.ccrs) views.push_back(ParseCcr(ccr));
    for (const CcrView& view : views) {
      const v1::Object& ccr = *view.object;
      const bool deleting = ccr.metadata().has_deletion_timestamp();
      // The CCR's own copy.
      v1::Object ccr_copy = Projection(ccr, shard);
      CopyKey ccr_copy_key = KeyOf(ccr_key, ccr_copy.metadata());
      expected[ccr_copy_key] = {std::move(ccr_copy), CcrName(ccr), true};
      if (deleting) {
        out.push_back(
            {Difference::Kind::kStuckDeleting, shard, CcrName(ccr), ObjectKey(ccr_key, ccr),
             absl::StrCat("deletionTimestamp set, phase ", StringField(ccr.status(), "phase"),
                          ", finalizers [", absl::StrJoin(ccr.metadata().finalizers(), ","), "]")});
        continue;
      }
      const auto& f = ccr.metadata().finalizers();
      if (std::find(f.begin(), f.end(), kFinalizer) == f.end()) {
        out.push_back({Difference::Kind::kMissingFinalizer, shard, CcrName(ccr),
                       ObjectKey(ccr_key, ccr), ""});
      }
      // Valid: it parses and no CCR of its cluster created earlier names the same resource.
      bool valid = view.parsed;
      for (const CcrView& other : views) {
        if (!valid) break;
        if (other.object == view.object || !other.parsed ||
            other.object->metadata().cluster() != ccr.metadata().cluster() ||
            other.gvr.group() != view.gvr.group() || other.gvr.resource() != view.gvr.resource()) {
          continue;
        }
        if (CreatedBefore(*other.object, ccr)) valid = false;
      }
      bool served = valid && Served(s.definitions, view.gvr);
      int64_t selected = 0;
      if (served) {
        const std::string gvr_key = GvrKey(view.gvr);
        auto objects = s.objects.find(gvr_key);
        if (objects != s.objects.end()) {
          for (const v1::Object& o : objects->second) {
            if (o.metadata().cluster() != ccr.metadata().cluster()) continue;
            if (!view.selector.Matches(o.metadata().labels())) continue;
            ++selected;
            v1::Object want = Projection(o, shard);
            CopyKey key = KeyOf(gvr_key, want.metadata());
            expected[key] = {std::move(want), CcrName(ccr), false};
          }
        }
      }
      if (check_status) CompareStatus(shard, view, valid, served, selected, s.lease, &out);
    }
    for (const auto& [gvr_key, objects] : s.objects) {
      for (const v1::Object& o : objects) {
        if (!o.metadata().shard().empty()) {
          out.push_back({Difference::Kind::kLocalHasShard, shard, "", ObjectKey(gvr_key, o),
                         absl::StrCat("metadata.shard \"", o.metadata().shard(), "\"")});
        }
      }
    }
  }

  // What the cache holds, against what it must hold.
  std::set<CopyKey> seen;
  for (const auto& [gvr_key, copies] : state.cache) {
    for (const v1::Object& copy : copies) {
      const std::string& shard = copy.metadata().shard();
      if (state.shards.count(shard) == 0) continue;  // not a checked shard's copy
      CopyKey key = KeyOf(gvr_key, copy.metadata());
      seen.insert(key);
      auto it = expected.find(key);
      if (it == expected.end()) {
        out.push_back({Difference::Kind::kExtraCopy, shard, "", ObjectKey(gvr_key, copy),
                       absl::StrCat("nothing backs it (original-resource-version ",
                                    Annotation(copy, kOriginalRv), ", original-uid ",
                                    Annotation(copy, kOriginalUid), ")")});
        continue;
      }
      const Expected& e = it->second;
      std::string diff = CopyDifference(e.copy, copy);
      if (diff.empty()) continue;
      std::string want_rv = Annotation(e.copy, kOriginalRv);
      std::string got_rv = Annotation(copy, kOriginalRv);
      Difference::Kind kind = e.is_ccr            ? Difference::Kind::kStaleCcrCopy
                              : got_rv != want_rv ? Difference::Kind::kStaleCopy
                                                  : Difference::Kind::kWrongCopy;
      out.push_back(
          {kind, shard, e.ccr, ObjectKey(gvr_key, copy),
           absl::StrCat("original-resource-version ", got_rv, ", want ", want_rv, ": ", diff)});
    }
  }
  for (const auto& [key, e] : expected) {
    if (seen.count(key) > 0) continue;
    // A copy can be looked for only in what the cache was asked for.
    if (state.cache.count(std::get<0>(key)) == 0) continue;
    out.push_back(
        {e.is_ccr ? Difference::Kind::kMissingCcrCopy : Difference::Kind::kMissingCopy,
         std::get<1>(key), e.ccr, ObjectKey(std::get<0>(key), e.copy),
         absl::StrCat("want original-resource-version ", Annotation(e.copy, kOriginalRv))});
  }
  std::sort(out.begin(), out.end(), [](const Difference& a, const Difference& b) {
    return std::tie(a.kind, a.shard, a.key, a.ccr) < std::tie(b.kind, b.shard, b.key, b.ccr);
  });
  return out;
}

absl::StatusOr<std::unique_ptr<InvariantChecker>> InvariantChecker::Create(Options options) {
  if (options.cache.empty() || options.shards.empty()) {
    return absl::InvalidArgumentError("an invariant checker needs the cache and a shard");
  }
  std::unique_ptr<InvariantChecker> c(new InvariantChecker(std::move(options)));
  StoreClient::Options client_options;
  client_options.timeout = c->options_.timeout;
  client_options.max_attempts = 2;
  auto connect = [&](const std::string& address) {
    return StoreClient::Create(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()),
                               client_options);
  };
  for (const auto& [name, address] : c->options_.shards) {
    absl::StatusOr<std::unique_ptr<StoreClient>> client = connect(address);
    if (!client.ok()) return client.status();
    c->shard_clients_[name] = *std::move(client);
  }
  absl::StatusOr<std::unique_ptr<StoreClient>> cache = connect(c->options_.cache);
  if (!cache.ok()) return cache.status();
  c->cache_client_ = *std::move(cache);
  return c;
}

absl::StatusOr<ClusterState> InvariantChecker::Read() {
  ClusterState state;
  auto list = [](StoreClient* client, const v1::GroupVersionResource& gvr,
                 const std::string& where) -> absl::StatusOr<std::vector<v1::Object>> {
    v1::ListRequest req;
    *req.mutable_resource() = gvr;
    absl::StatusOr<StoreClient::ListResult> r = client->ListAll(req);
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat("listing ", GvrKey(gvr), " in ", where,
                                                          ": ", r.status().message()));
    }
    return std::move(r->items);
  };
  std::map<std::string, v1::GroupVersionResource> cache_resources;
  cache_resources[GvrKey(CcrGvr())] = CcrGvr();
  for (const v1::GroupVersionResource& gvr : options_.resources) cache_resources[GvrKey(gvr)] = gvr;
  for (const auto& [name, client] : shard_clients_) {
    ClusterState::Shard& s = state.shards[name];
    const std::string where = "shard store " + name;
    absl::StatusOr<std::vector<v1::Object>> defs = list(client.get(), DefinitionGvr(), where);
    if (!defs.ok()) return defs.status();
    s.definitions = *std::move(defs);
    absl::StatusOr<std::vector<v1::Object>> ccrs = list(client.get(), CcrGvr(), where);
    if (!ccrs.ok()) return ccrs.status();
    s.ccrs = *std::move(ccrs);
    v1::GetRequest get;
    get.mutable_resource()->set_group("coordination.shardcache.io");
    get.mutable_resource()->set_version("v1");
    get.mutable_resource()->set_resource("leases");
    get.set_cluster(options_.lease_cluster);
    get.set_namespace_(options_.lease_namespace);
    get.set_name(options_.lease_name);
    absl::StatusOr<v1::Object> lease = client->Get(get);
    if (lease.ok()) {
      s.lease = *std::move(lease);
    } else if (!absl::IsNotFound(lease.status())) {
      return absl::Status(lease.status().code(), absl::StrCat("reading the lease in ", where, ": ",
                                                              lease.status().message()));
    }
    for (const v1::Object& ccr : s.ccrs) {
      CcrView view = ParseCcr(ccr);
      if (!view.parsed) continue;
      cache_resources[GvrKey(view.gvr)] = view.gvr;
      if (s.objects.count(GvrKey(view.gvr)) > 0) continue;
      absl::StatusOr<std::vector<v1::Object>> objects = list(client.get(), view.gvr, where);
      if (absl::IsNotFound(objects.status())) continue;  // not served
      if (!objects.ok()) return objects.status();
      s.objects[GvrKey(view.gvr)] = *std::move(objects);
    }
  }
  for (const auto& [key, gvr] : cache_resources) {
    absl::StatusOr<std::vector<v1::Object>> copies = list(cache_client_.get(), gvr, "the cache");
    if (absl::IsNotFound(copies.status())) {
      state.cache[key];
      continue;
    }
    if (!copies.ok()) return copies.status();
    state.cache[key] = *std::move(copies);
  }
  return state;
}

absl::StatusOr<std::vector<Difference>> InvariantChecker::Check(bool check_status) {
  absl::StatusOr<ClusterState> state = Read();
  if (!state.ok()) return state.status();
  return Compare(*state, check_status);
}

}  // namespace shardcache::testing
