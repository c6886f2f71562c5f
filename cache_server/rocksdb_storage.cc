#include "cache_server/rocksdb_storage.h"

#include <dirent.h>
#include <rocksdb/db.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache_server/object_filter.h"
#include "cache_server/uuid.h"
#include "common/error_info.h"
#include "shardcache/storage/v1/storage.pb.h"
#include "spdlog/spdlog.h"

namespace shardcache {
namespace {

constexpr char kFormat[] = "shardcache-store/1";
constexpr char kFormatKey[] = "m/format";
constexpr char kRevisionKey[] = "m/revision";
constexpr char kCompactedKey[] = "m/compacted";
constexpr char kStoreIdKey[] = "m/store-id";
constexpr char kObjectPrefix[] = "o/";
constexpr char kEventPrefix[] = "e/";
constexpr char kEpochPrefix[] = "f/";
// How old CheckSpace's answer may be.
constexpr absl::Duration kSpaceCheckInterval = absl::Seconds(1);

std::string EventKey(int64_t revision) {
  std::string key = kEventPrefix;
  for (int shift = 56; shift >= 0; shift -= 8) {
    key.push_back(static_cast<char>((static_cast<uint64_t>(revision) >> shift) & 0xff));
  }
  return key;
}

std::string ObjectStorageKey(const std::string& group_resource, const v1::ObjectMeta& m) {
  return absl::StrCat(kObjectPrefix, group_resource, std::string(1, '\0'), ObjectKey(m));
}

bool DirectoryIsEmptyOrAbsent(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return true;
  bool empty = true;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  closedir(d);
  return empty;
}

// Appends a length-delimited field (a message's serialized bytes) to a serialized message.
void AppendMessageField(int field, const std::string& bytes, std::string* out) {
  uint64_t v = (static_cast<uint64_t>(field) << 3) | 2;  // wire type 2: length-delimited
  for (uint64_t n : {v, static_cast<uint64_t>(bytes.size())}) {
    while (n >= 0x80) {
      out->push_back(static_cast<char>((n & 0x7f) | 0x80));
      n >>= 7;
    }
    out->push_back(static_cast<char>(n));
  }
  out->append(bytes);
}

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", s.ToString()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksDbStorage>> RocksDbStorage::Open(Options options) {
  bool fresh = DirectoryIsEmptyOrAbsent(options.data_dir);
  rocksdb::Options db_options;
  db_options.create_if_missing = fresh;
  db_options.error_if_exists = false;
  db_options.paranoid_checks = true;
  db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  db_options.IncreaseParallelism(2);
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.keep_log_file_num = 2;
  // Do not preallocate the write-ahead log (tens of MiB per store): many small stores, as in
  // tests, would take gigabytes of disk for nothing.
  db_options.allow_fallocate = false;
  // Every object is also in memory (the ObjectStore serves from there): the write buffer only
  // batches writes for the disk. RocksDB's default (64 MiB, two of them) would add up to 128 MiB
  // to the server's memory under a steady write load; 8 MiB ones flush about every 15,000 writes
  // of 500-byte objects.
  db_options.write_buffer_size = static_cast<size_t>(options.write_buffer_bytes);
  if (options.env != nullptr) db_options.env = options.env;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options.data_dir, &raw);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::UnavailableError(absl::StrCat("data directory ", options.data_dir,
                                                 " is in use by another process: ", s.ToString()));
    }
    return absl::DataLossError(absl::StrCat(
        "data directory ", options.data_dir, " cannot be opened: ", s.ToString(),
        fresh ? "" : " (it is damaged or not a shardcache store; move it aside to start empty)"));
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  if (fresh) {
    rocksdb::WriteBatch batch;
    batch.Put(kFormatKey, kFormat);
    batch.Put(kRevisionKey, "1");
    batch.Put(kCompactedKey, "1");
    batch.Put(kStoreIdKey, NewUuid());
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db->Write(wo, &batch);
    if (!s.ok()) return FromRocks(s, absl::StrCat("initializing ", options.data_dir));
  }
  return std::unique_ptr<RocksDbStorage>(new RocksDbStorage(std::move(options), std::move(db)));
}

RocksDbStorage::RocksDbStorage(Options options, std::unique_ptr<rocksdb::DB> db)
    : options_(std::move(options)), db_(std::move(db)) {}

RocksDbStorage::~RocksDbStorage() {
  if (db_ != nullptr) (void)db_->Close();
}

absl::Status RocksDbStorage::Damaged(const std::string& what) const {
  return absl::DataLossError(absl::StrCat("data directory ", options_.data_dir,
                                          " is damaged: ", what,
                                          "; move it aside to start empty, or restore a backup"));
}

absl::StatusOr<PersistedState> RocksDbStorage::Load() {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;
  std::string value;
  rocksdb::Status s = db_->Get(ro, kFormatKey, &value);
  if (s.IsNotFound())
    return Damaged("the format marker m/format is missing (not a shardcache store?)");
  if (!s.ok()) return Damaged(s.ToString());
  if (value != kFormat) {
    return Damaged(absl::StrCat("unknown format \"", value, "\" (want ", kFormat, ")"));
  }
  PersistedState state;
  for (auto [key, out] : {std::pair<const char*, int64_t*>{kRevisionKey, &state.revision},
                          {kCompactedKey, &state.compacted_revision}}) {
    s = db_->Get(ro, key, &value);
    if (!s.ok() || !absl::SimpleAtoi(value, out) || *out < 1) {
      return Damaged(absl::StrCat(key, " is missing or malformed",
                                  s.ok() ? "" : absl::StrCat(" (", s.ToString(), ")")));
    }
  }
  if (state.compacted_revision > state.revision) {
    return Damaged("the compacted revision is above the revision");
  }
  compacted_revision_ = state.compacted_revision;

  s = db_->Get(ro, kStoreIdKey, &state.store_id);
  if (s.IsNotFound()) {
    // Created before stores had an identity: give it one now, durably, and keep it.
    state.store_id = NewUuid();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db_->Put(wo, kStoreIdKey, state.store_id);
    if (!s.ok())
      return FromRocks(s, absl::StrCat("recording the store identity in ", options_.data_dir));
  } else if (!s.ok()) {
    return Damaged(s.ToString());
  } else if (state.store_id.empty()) {
    return Damaged(absl::StrCat(kStoreIdKey, " is empty"));
  }

  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  for (it->Seek(kObjectPrefix); it->Valid() && it->key().starts_with(kObjectPrefix); it->Next()) {
    rocksdb::Slice key = it->key();
    key.remove_prefix(sizeof(kObjectPrefix) - 1);
    std::string k = key.ToString();
    size_t nul = k.find('\0');
    auto obj = std::make_shared<v1::Object>();
    int64_t rv = 0;
    if (nul == std::string::npos || !obj->ParseFromArray(it->value().data(), it->value().size()) ||
        !absl::SimpleAtoi(obj->metadata().resource_version(), &rv) || rv > state.revision ||
        k.substr(nul + 1) != ObjectKey(obj->metadata())) {
      return Damaged(absl::StrCat("object record ", absl::CHexEscape(k), " is malformed"));
    }
    state.objects.emplace_back(k.substr(0, nul), std::move(obj));
  }
  if (!it->status().ok()) return Damaged(it->status().ToString());

  int64_t expected = state.compacted_revision + 1;
  for (it->Seek(kEventPrefix); it->Valid() && it->key().starts_with(kEventPrefix); it->Next()) {
    storage::v1::StoredEvent stored;
    if (!stored.ParseFromArray(it->value().data(), it->value().size()) ||
        it->key().ToString() != EventKey(stored.revision())) {
      return Damaged(
          absl::StrCat("event record ", absl::CHexEscape(it->key().ToString()), " is malformed"));
    }
    if (stored.revision() != expected) {
      return Damaged(absl::StrCat("the history has a gap: expected revision ", expected, ", found ",
                                  stored.revision()));
    }
    ++expected;
    auto e = std::make_shared<Event>();
    e->revision = stored.revision();
    e->type = static_cast<v1::WatchEvent::Type>(stored.type());
    e->group_resource = stored.group_resource();
    e->object = std::make_shared<const v1::Object>(std::move(*stored.mutable_object()));
    if (stored.has_prev()) {
      e->prev = std::make_shared<const v1::Object>(std::move(*stored.mutable_prev()));
    }
    e->time = absl::FromUnixNanos(stored.commit_time_unix_nanos());
    state.history.push_back(std::move(e));
  }
  if (!it->status().ok()) return Damaged(it->status().ToString());
  if (expected != state.revision + 1) {
    return Damaged(absl::StrCat("the history ends at revision ", expected - 1,
                                " but the store is at revision ", state.revision));
  }

  for (it->Seek(kEpochPrefix); it->Valid() && it->key().starts_with(kEpochPrefix); it->Next()) {
    int64_t epoch = 0;
    if (!absl::SimpleAtoi(it->value().ToString(), &epoch)) {
      return Damaged(absl::StrCat("epoch record ", it->key().ToString(), " is malformed"));
    }
    state.epochs[it->key().ToString().substr(sizeof(kEpochPrefix) - 1)] = epoch;
  }
  if (!it->status().ok()) return Damaged(it->status().ToString());
  return state;
}

absl::Status RocksDbStorage::Commit(const CommitBatch& batch) {
  return WriteBatchOf(batch, options_.sync);
}

absl::Status RocksDbStorage::Write(const CommitBatch& batch) {
  return WriteBatchOf(batch, /*sync=*/false);
}

absl::Status RocksDbStorage::Sync() {
  if (!options_.sync) return absl::OkStatus();
  return FromRocks(db_->SyncWAL(), "syncing the data directory");
}

absl::Status RocksDbStorage::WriteBatchOf(const CommitBatch& batch, bool sync) {
  rocksdb::WriteBatch wb;
  storage::v1::StoredEvent stored;
  std::string object;
  std::string prev;
  std::string record;
  for (const EventPtr& e : batch.events) {
    std::string okey = ObjectStorageKey(e->group_resource, e->object->metadata());
    e->object->SerializeToString(&object);
    if (e->type == v1::WatchEvent::DELETED) {
      wb.Delete(okey);
    } else {
      wb.Put(okey, object);
    }
    // The event's scalar fields, then its objects as the bytes serialized once above (a parser
    // takes fields in any order): no copy of either object.
    stored.set_revision(e->revision);
    stored.set_type(e->type);
    stored.set_group_resource(e->group_resource);
    stored.set_commit_time_unix_nanos(absl::ToUnixNanos(e->time));
    stored.SerializeToString(&record);
    AppendMessageField(storage::v1::StoredEvent::kObjectFieldNumber, object, &record);
    if (e->prev != nullptr) {
      e->prev->SerializeToString(&prev);
      AppendMessageField(storage::v1::StoredEvent::kPrevFieldNumber, prev, &record);
    }
    wb.Put(EventKey(e->revision), record);
  }
  // Drop the events that have left the window since the last commit.
  for (int64_t rev = compacted_revision_ + 1; rev <= batch.compacted_revision; ++rev) {
    wb.Delete(EventKey(rev));
  }
  for (const auto& [shard, epoch] : batch.epochs) {
    wb.Put(absl::StrCat(kEpochPrefix, shard), absl::StrCat(epoch));
  }
  wb.Put(kRevisionKey, absl::StrCat(batch.revision));
  wb.Put(kCompactedKey, absl::StrCat(batch.compacted_revision));
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  absl::Status written = FromRocks(db_->Write(wo, &wb), "writing to the data directory");
  if (written.ok()) compacted_revision_ = batch.compacted_revision;
  return written;
}

absl::Status RocksDbStorage::CheckSpace() {
  if (options_.min_free_bytes <= 0) return absl::OkStatus();
  absl::MutexLock l(&space_mu_);
  const absl::Time now = options_.clock->Now();
  if (now < space_checked_ + kSpaceCheckInterval) return space_;
  space_checked_ = now;
  uint64_t free_bytes = 0;
  rocksdb::IOStatus s = db_->GetFileSystem()->GetFreeSpace(options_.data_dir, rocksdb::IOOptions(),
                                                           &free_bytes, nullptr);
  const uint64_t reserve = static_cast<uint64_t>(options_.min_free_bytes);
  absl::Status was = space_;
  if (!s.ok()) {
    // Not knowing is no reason to refuse: the commit itself still fails on a full disk.
    if (was.ok())
      spdlog::warn("cannot tell the free space of {}: {}", options_.data_dir, s.ToString());
    space_ = absl::OkStatus();
  } else if (free_bytes < reserve) {
    space_ = NoSpaceError(
        absl::StrCat("the disk of data directory ", options_.data_dir, " has ", free_bytes,
                     " bytes free, less than the ", reserve,
                     " kept in reserve (--min-free-disk-bytes): writes are refused until space "
                     "is freed; reads, watches and deletes go on"),
        free_bytes, reserve);
    if (was.ok()) spdlog::error("refusing writes: {}", std::string(space_.message()));
  } else {
    if (!was.ok()) {
      spdlog::info("accepting writes again: the disk of {} has {} bytes free", options_.data_dir,
                   free_bytes);
    }
    space_ = absl::OkStatus();
  }
  return space_;
}

}  // namespace shardcache
