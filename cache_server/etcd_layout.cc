#include "cache_server/etcd_layout.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cache_server/uuid.h"
#include "common/status_macros.h"

namespace shardcache {
namespace {

constexpr int kEpochDigits = 19;
// Keys read per Range page at start-up.
constexpr int64_t kLoadPageKeys = 1000;

}  // namespace

absl::Status ValidateEtcdPrefix(const std::string& prefix) {
  if (prefix.empty() || prefix[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd prefix \"", prefix, "\": must start with '/' (e.g. /shardcache)"));
  }
  if (prefix.size() > 1 && prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd prefix \"", prefix, "\": must not end with '/'"));
  }
  if (prefix == "/" || prefix.find("//") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd prefix \"", prefix, "\": must name a path with no empty segment"));
  }
  return absl::OkStatus();
}

std::string EtcdResourcePrefix(const std::string& prefix, const std::string& group_resource) {
  return absl::StrCat(prefix, "/o/", group_resource, "/");
}

std::string EtcdObjectKey(const std::string& prefix, const std::string& group_resource,
                          const v1::ObjectMeta& meta) {
  return absl::StrCat(EtcdResourcePrefix(prefix, group_resource), meta.shard(), "/", meta.cluster(),
                      "/", meta.namespace_(), "/", meta.name());
}

std::string EtcdEpochKey(const std::string& prefix, const std::string& shard) {
  return absl::StrCat(prefix, "/e/", shard);
}

std::string EtcdFormatKey(const std::string& prefix) { return absl::StrCat(prefix, "/m/format"); }

std::string EtcdStoreIdKey(const std::string& prefix) {
  return absl::StrCat(prefix, "/m/store-id");
}

std::string EtcdProgressKey(const std::string& prefix) {
  return absl::StrCat(prefix, "/m/progress");
}

std::string EtcdEpochValue(int64_t epoch) { return absl::StrFormat("%0*d", kEpochDigits, epoch); }

EtcdKey ParseEtcdKey(const std::string& prefix, const std::string& key) {
  EtcdKey out;
  if (key.compare(0, prefix.size(), prefix) != 0) return out;
  absl::string_view rest = absl::string_view(key).substr(prefix.size());
  if (absl::ConsumePrefix(&rest, "/e/")) {
    out.kind = EtcdKey::kEpoch;
    out.shard = std::string(rest);
    return out;
  }
  if (!absl::ConsumePrefix(&rest, "/o/")) return out;
  std::vector<std::string> parts = absl::StrSplit(rest, '/');
  if (parts.size() != 6) return out;
  out.kind = EtcdKey::kObject;
  out.group_resource = absl::StrCat(parts[0], "/", parts[1]);
  out.object_key = ObjectKey(parts[2], parts[3], parts[4], parts[5]);
  return out;
}

absl::StatusOr<ObjectRef> ParseEtcdObject(const std::string& value, int64_t mod_revision) {
  auto object = std::make_shared<v1::Object>();
  if (!object->ParseFromString(value)) {
    return absl::DataLossError("the value is not a shardcache.v1.Object");
  }
  object->mutable_metadata()->set_resource_version(absl::StrCat(mod_revision));
  return ObjectRef(std::move(object));
}

ObjectRef WithRevision(const ObjectRef& object, int64_t revision) {
  if (revision == 0 || object == nullptr) return object;
  auto copy = std::make_shared<v1::Object>(*object);
  copy->mutable_metadata()->set_resource_version(absl::StrCat(revision));
  return copy;
}

absl::StatusOr<int64_t> ParseEtcdEpoch(const std::string& value) {
  int64_t epoch = 0;
  if (!absl::SimpleAtoi(value, &epoch) || epoch < 0) {
    return absl::DataLossError(absl::StrCat("\"", value, "\" is not an epoch"));
  }
  return epoch;
}

etcdserverpb::TxnRequest MakeEtcdTxn(const std::string& prefix, const EtcdWrite& write,
                                     bool* changes) {
  etcdserverpb::TxnRequest txn;
  bool ignored;
  if (changes == nullptr) changes = &ignored;
  *changes = false;
  if (write.has_change || write.check_only) {
    std::string key = EtcdObjectKey(prefix, write.group_resource, write.object->metadata());
    etcdserverpb::Compare* c = txn.add_compare();
    c->set_key(key);
    c->set_result(etcdserverpb::Compare::EQUAL);
    if (write.expected_mod_revision == 0) {
      c->set_target(etcdserverpb::Compare::CREATE);
      c->set_create_revision(0);
    } else {
      c->set_target(etcdserverpb::Compare::MOD);
      c->set_mod_revision(write.expected_mod_revision);
    }
    if (write.has_change && !write.definition_key.empty()) {
      etcdserverpb::Compare* d = txn.add_compare();
      d->set_key(write.definition_key);
      d->set_result(etcdserverpb::Compare::EQUAL);
      d->set_target(etcdserverpb::Compare::MOD);
      d->set_mod_revision(write.definition_mod_revision);
    }
    if (write.has_change && !write.purge_group_resource.empty()) {
      // Before the definition itself, so that its own deletion is the transaction's last event.
      std::string objects = EtcdResourcePrefix(prefix, write.purge_group_resource);
      etcdserverpb::DeleteRangeRequest* d = txn.add_success()->mutable_request_delete_range();
      d->set_key(objects);
      d->set_range_end(EtcdClient::PrefixEnd(objects));
    }
    if (write.has_change && write.is_delete) {
      txn.add_success()->mutable_request_delete_range()->set_key(key);
      *changes = true;
    } else if (write.has_change) {
      v1::Object stored = *write.object;
      stored.mutable_metadata()->clear_resource_version();
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(key);
      put->set_value(stored.SerializeAsString());
      *changes = true;
    }
  }
  if (!write.fence_shard.empty()) {
    std::string key = EtcdEpochKey(prefix, write.fence_shard);
    etcdserverpb::Compare* c = txn.add_compare();
    c->set_key(key);
    c->set_result(etcdserverpb::Compare::EQUAL);
    if (write.seen_epoch == 0) {
      c->set_target(etcdserverpb::Compare::CREATE);
      c->set_create_revision(0);
    } else {
      c->set_target(etcdserverpb::Compare::VALUE);
      c->set_value(EtcdEpochValue(write.seen_epoch));
    }
    if (write.fence_epoch > write.seen_epoch) {
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(key);
      put->set_value(EtcdEpochValue(write.fence_epoch));
      *changes = true;
    }
  }
  return txn;
}

namespace {

// Makes an empty prefix a store: the format marker and a new identity, only if the marker is
// still absent (another replica may be doing the same).
absl::Status CreateStore(EtcdClient* etcd, const std::string& prefix) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* c = txn.add_compare();
  c->set_key(EtcdFormatKey(prefix));
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_create_revision(0);
  etcdserverpb::PutRequest* format = txn.add_success()->mutable_request_put();
  format->set_key(EtcdFormatKey(prefix));
  format->set_value(kEtcdFormat);
  etcdserverpb::PutRequest* id = txn.add_success()->mutable_request_put();
  id->set_key(EtcdStoreIdKey(prefix));
  id->set_value(NewUuid());
  return etcd->Txn(txn).status();
}

}  // namespace

absl::StatusOr<PersistedState> LoadEtcdState(EtcdClient* etcd, const std::string& prefix) {
  RETURN_IF_ERROR(ValidateEtcdPrefix(prefix));
  const std::string all = prefix + "/";
  for (int attempt = 0;; ++attempt) {
    PersistedState state;
    std::string format;
    bool any = false;
    int64_t revision = 0;
    std::string from = all;
    while (true) {
      etcdserverpb::RangeRequest range;
      range.set_key(from);
      range.set_range_end(EtcdClient::PrefixEnd(all));
      range.set_limit(kLoadPageKeys);
      range.set_revision(revision);
      ASSIGN_OR_RETURN(etcdserverpb::RangeResponse page, etcd->Range(range));
      if (revision == 0) revision = page.header().revision();
      for (const mvccpb::KeyValue& kv : page.kvs()) {
        any = true;
        if (kv.key() == EtcdFormatKey(prefix)) {
          format = kv.value();
          continue;
        }
        if (kv.key() == EtcdStoreIdKey(prefix)) {
          state.store_id = kv.value();
          continue;
        }
        EtcdKey key = ParseEtcdKey(prefix, kv.key());
        if (key.kind == EtcdKey::kEpoch) {
          absl::StatusOr<int64_t> epoch = ParseEtcdEpoch(kv.value());
          if (!epoch.ok()) {
            return absl::DataLossError(
                absl::StrCat("etcd key ", kv.key(), ": ", epoch.status().message()));
          }
          state.epochs[key.shard] = *epoch;
        } else if (key.kind == EtcdKey::kObject) {
          absl::StatusOr<ObjectRef> object = ParseEtcdObject(kv.value(), kv.mod_revision());
          if (!object.ok()) {
            return absl::DataLossError(
                absl::StrCat("etcd key ", kv.key(), ": ", object.status().message()));
          }
          state.objects.emplace_back(key.group_resource, *std::move(object));
        }
      }
      if (!page.more() || page.kvs().empty()) break;
      from = page.kvs(page.kvs_size() - 1).key() + '\0';
    }
    if (!any && attempt == 0) {
      RETURN_IF_ERROR(CreateStore(etcd, prefix));
      continue;  // read it back, with whatever another replica may have written meanwhile
    }
    if (format.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("etcd prefix ", prefix, " holds keys but no ", EtcdFormatKey(prefix),
                       ": it is not a shardcache store's data (choose another --etcd-prefix)"));
    }
    if (format != kEtcdFormat) {
      return absl::FailedPreconditionError(
          absl::StrCat("etcd prefix ", prefix, " holds a store of format \"", format,
                       "\"; this cache_server reads \"", kEtcdFormat, "\""));
    }
    if (state.store_id.empty()) {
      return absl::DataLossError(
          absl::StrCat("etcd prefix ", prefix, ": ", EtcdStoreIdKey(prefix), " is missing"));
    }
    state.revision = revision;
    state.compacted_revision = revision;
    return state;
  }
}

}  // namespace shardcache
