#include "common/client/thread_safe_store.h"

#include "absl/strings/str_cat.h"

namespace shardcache {

absl::Status ThreadSafeStore::AddIndex(const std::string& name, IndexFunc func) {
  absl::MutexLock l(&mu_);
  if (!objects_.empty()) {
    return absl::FailedPreconditionError("indexes must be added before any object");
  }
  if (!index_funcs_.emplace(name, std::move(func)).second) {
    return absl::AlreadyExistsError(absl::StrCat("index ", name, " exists"));
  }
  return absl::OkStatus();
}

void ThreadSafeStore::IndexLocked(const std::string& key, const v1::Object& o) {
  for (const auto& [name, func] : index_funcs_) {
    for (const std::string& v : func(o)) indexes_[name][v].insert(key);
  }
}

void ThreadSafeStore::UnindexLocked(const std::string& key, const v1::Object& o) {
  for (const auto& [name, func] : index_funcs_) {
    auto& by_value = indexes_[name];
    for (const std::string& v : func(o)) {
      auto it = by_value.find(v);
      if (it == by_value.end()) continue;
      it->second.erase(key);
      if (it->second.empty()) by_value.erase(it);
    }
  }
}

void ThreadSafeStore::Upsert(ObjectRef object) {
  std::string key = ObjectKey(object->metadata());
  absl::MutexLock l(&mu_);
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    UnindexLocked(key, *it->second);
    it->second = object;
  } else {
    objects_.emplace(key, object);
  }
  IndexLocked(key, *object);
}

void ThreadSafeStore::Delete(const std::string& key) {
  absl::MutexLock l(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  UnindexLocked(key, *it->second);
  objects_.erase(it);
}

void ThreadSafeStore::Replace(std::vector<ObjectRef> objects) {
  absl::MutexLock l(&mu_);
  objects_.clear();
  indexes_.clear();
  for (ObjectRef& o : objects) {
    std::string key = ObjectKey(o->metadata());
    IndexLocked(key, *o);
    objects_[key] = std::move(o);
  }
}

ObjectRef ThreadSafeStore::Get(const std::string& key) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectRef> ThreadSafeStore::List() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<ObjectRef> out;
  out.reserve(objects_.size());
  for (const auto& [k, o] : objects_) out.push_back(o);
  return out;
}

std::vector<std::string> ThreadSafeStore::Keys() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<std::string> out;
  out.reserve(objects_.size());
  for (const auto& [k, o] : objects_) out.push_back(k);
  return out;
}

size_t ThreadSafeStore::Size() const {
  absl::ReaderMutexLock l(&mu_);
  return objects_.size();
}

std::vector<ObjectRef> ThreadSafeStore::ByIndex(const std::string& name,
                                                const std::string& value) const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<ObjectRef> out;
  auto idx = indexes_.find(name);
  if (idx == indexes_.end()) return out;
  auto keys = idx->second.find(value);
  if (keys == idx->second.end()) return out;
  for (const std::string& k : keys->second) out.push_back(objects_.at(k));
  return out;
}

}  // namespace shardcache
