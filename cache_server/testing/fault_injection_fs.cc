#include "cache_server/testing/fault_injection_fs.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcache::testing {
namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

std::string WithoutTrailingSlash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// (directory, name) of a file's path.
std::pair<std::string, std::string> Split(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {WithoutTrailingSlash(path.substr(0, slash + 1)), path.substr(slash + 1)};
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The first `n` bytes of the file (all of it when it is shorter); nullopt when it cannot be read.
std::optional<std::string> ReadPrefix(const std::string& path, uint64_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string content;
  char buf[64 << 10];
  while (content.size() < n && in.read(buf, sizeof(buf)).gcount() > 0) {
    content.append(buf, static_cast<size_t>(std::min<uint64_t>(in.gcount(), n - content.size())));
  }
  return content;
}

}  // namespace

// A file being written: tells the file system what reached the file and what was synced.
class FaultInjectionFs::File : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(FaultInjectionFs* fs, std::string path, std::unique_ptr<rocksdb::FSWritableFile> target,
       uint64_t size)
      : FSWritableFileOwnerWrapper(std::move(target)),
        fs_(fs),
        path_(std::move(path)),
        size_(size) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    if (fs_->fail_writes()) return IOStatus::NoSpace("injected: no space left on device");
    IOStatus s = target()->Append(data, options, dbg);
    if (s.ok()) Grow(size_ + data.size());
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& options,
                  const rocksdb::DataVerificationInfo& info, IODebugContext* dbg) override {
    if (fs_->fail_writes()) return IOStatus::NoSpace("injected: no space left on device");
    IOStatus s = target()->Append(data, options, info, dbg);
    if (s.ok()) Grow(size_ + data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    if (fs_->fail_writes()) return IOStatus::NoSpace("injected: no space left on device");
    IOStatus s = target()->PositionedAppend(data, offset, options, dbg);
    if (s.ok()) Grow(std::max(size_, offset + data.size()));
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const rocksdb::DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    if (fs_->fail_writes()) return IOStatus::NoSpace("injected: no space left on device");
    IOStatus s = target()->PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) Grow(std::max(size_, offset + data.size()));
    return s;
  }
  IOStatus Truncate(uint64_t size, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = target()->Truncate(size, options, dbg);
    if (s.ok()) {
      size_ = size;
      fs_->Truncated(path_, size);
    }
    return s;
  }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    return SyncWith([&] { return target()->Sync(options, dbg); });
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    return SyncWith([&] { return target()->Fsync(options, dbg); });
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    if (fs_->fail_syncs()) return IOStatus::IOError("injected: sync_file_range failed");
    return target()->RangeSync(offset, nbytes, options, dbg);
  }

 private:
  void Grow(uint64_t end) {
    size_ = end;
    fs_->Appended(path_, end);
  }
  // A sync may run beside Append on another thread: only what was there when it began counts.
  template <typename SyncFn>
  IOStatus SyncWith(SyncFn sync) {
    if (fs_->fail_syncs()) return IOStatus::IOError("injected: fsync failed");
    uint64_t size = fs_->SizeBeforeSync(path_);
    IOStatus s = sync();
    if (s.ok()) fs_->Synced(path_, size);
    return s;
  }

  FaultInjectionFs* const fs_;
  const std::string path_;
  uint64_t size_;
};

// A directory: its fsync makes the names changed in it durable.
class FaultInjectionFs::Directory : public rocksdb::FSDirectoryWrapper {
 public:
  Directory(FaultInjectionFs* fs, std::string path, std::unique_ptr<rocksdb::FSDirectory> target)
      : FSDirectoryWrapper(std::move(target)), fs_(fs), path_(std::move(path)) {}

  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    if (fs_->fail_syncs()) return IOStatus::IOError("injected: directory fsync failed");
    IOStatus s = FSDirectoryWrapper::Fsync(options, dbg);
    if (s.ok()) fs_->DirectorySynced(path_);
    return s;
  }
  IOStatus FsyncWithDirOptions(const IOOptions& options, IODebugContext* dbg,
                               const rocksdb::DirFsyncOptions& dir_options) override {
    if (fs_->fail_syncs()) return IOStatus::IOError("injected: directory fsync failed");
    IOStatus s = FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_options);
    if (s.ok()) fs_->DirectorySynced(path_);
    return s;
  }

 private:
  FaultInjectionFs* const fs_;
  const std::string path_;
};

FaultInjectionFs::FaultInjectionFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

void FaultInjectionFs::SetFreeSpace(std::optional<uint64_t> bytes) {
  absl::MutexLock l(&mu_);
  free_space_ = bytes;
}

IOStatus FaultInjectionFs::NewWritableFile(const std::string& fname,
                                           const rocksdb::FileOptions& options,
                                           std::unique_ptr<rocksdb::FSWritableFile>* result,
                                           IODebugContext* dbg) {
  if (fail_writes()) return IOStatus::NoSpace("injected: no space left on device");
  absl::MutexLock l(&mu_);
  if (!Exists(fname)) RememberNameLocked(fname);
  std::unique_ptr<rocksdb::FSWritableFile> file;
  IOStatus s = target()->NewWritableFile(fname, options, &file, dbg);
  if (!s.ok()) return s;
  written_[fname] = Written{};
  ++files_created_;
  *result = std::make_unique<File>(this, fname, std::move(file), 0);
  return s;
}

IOStatus FaultInjectionFs::ReopenWritableFile(const std::string& fname,
                                              const rocksdb::FileOptions& options,
                                              std::unique_ptr<rocksdb::FSWritableFile>* result,
                                              IODebugContext* dbg) {
  absl::MutexLock l(&mu_);
  if (!Exists(fname)) RememberNameLocked(fname);
  std::unique_ptr<rocksdb::FSWritableFile> file;
  IOStatus s = target()->ReopenWritableFile(fname, options, &file, dbg);
  if (!s.ok()) return s;
  uint64_t size = file->GetFileSize(IOOptions(), dbg);
  auto [it, added] = written_.try_emplace(fname, Written{size, size});
  if (!added) it->second.size = size;
  *result = std::make_unique<File>(this, fname, std::move(file), size);
  return s;
}

IOStatus FaultInjectionFs::ReuseWritableFile(const std::string&, const std::string&,
                                             const rocksdb::FileOptions&,
                                             std::unique_ptr<rocksdb::FSWritableFile>*,
                                             IODebugContext*) {
  return IOStatus::NotSupported("FaultInjectionFs: ReuseWritableFile (recycled logs)");
}

IOStatus FaultInjectionFs::NewRandomRWFile(const std::string&, const rocksdb::FileOptions&,
                                           std::unique_ptr<rocksdb::FSRandomRWFile>*,
                                           IODebugContext*) {
  return IOStatus::NotSupported("FaultInjectionFs: NewRandomRWFile");
}

IOStatus FaultInjectionFs::LinkFile(const std::string&, const std::string&, const IOOptions&,
                                    IODebugContext*) {
  return IOStatus::NotSupported("FaultInjectionFs: LinkFile");
}

IOStatus FaultInjectionFs::NewDirectory(const std::string& name, const IOOptions& options,
                                        std::unique_ptr<rocksdb::FSDirectory>* result,
                                        IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSDirectory> dir;
  IOStatus s = target()->NewDirectory(name, options, &dir, dbg);
  if (!s.ok()) return s;
  *result = std::make_unique<Directory>(this, WithoutTrailingSlash(name), std::move(dir));
  return s;
}

IOStatus FaultInjectionFs::RenameFile(const std::string& src, const std::string& dst,
                                      const IOOptions& options, IODebugContext* dbg) {
  absl::MutexLock l(&mu_);
  RememberNameLocked(src);
  RememberNameLocked(dst);
  IOStatus s = target()->RenameFile(src, dst, options, dbg);
  if (!s.ok()) return s;
  auto it = written_.find(src);
  if (it != written_.end()) {
    written_[dst] = it->second;
    written_.erase(it);
  } else {
    written_.erase(dst);
  }
  return s;
}

IOStatus FaultInjectionFs::DeleteFile(const std::string& fname, const IOOptions& options,
                                      IODebugContext* dbg) {
  absl::MutexLock l(&mu_);
  IOStatus s = target()->DeleteFile(fname, options, dbg);
  if (!s.ok()) return s;
  written_.erase(fname);
  auto [dir, name] = Split(fname);
  auto d = unsynced_names_.find(dir);
  if (d != unsynced_names_.end()) d->second.erase(name);
  return s;
}

IOStatus FaultInjectionFs::GetFreeSpace(const std::string& path, const IOOptions& options,
                                        uint64_t* diskfree, IODebugContext* dbg) {
  {
    absl::MutexLock l(&mu_);
    if (free_space_.has_value()) {
      *diskfree = *free_space_;
      return IOStatus::OK();
    }
  }
  return target()->GetFreeSpace(path, options, diskfree, dbg);
}

void FaultInjectionFs::Appended(const std::string& path, uint64_t end) {
  absl::MutexLock l(&mu_);
  auto it = written_.find(path);
  if (it != written_.end()) it->second.size = std::max(it->second.size, end);
}

void FaultInjectionFs::Truncated(const std::string& path, uint64_t size) {
  absl::MutexLock l(&mu_);
  auto it = written_.find(path);
  if (it == written_.end()) return;
  it->second.size = size;
  it->second.synced = std::min(it->second.synced, size);
}

uint64_t FaultInjectionFs::SizeBeforeSync(const std::string& path) {
  absl::MutexLock l(&mu_);
  auto it = written_.find(path);
  return it == written_.end() ? 0 : it->second.size;
}

void FaultInjectionFs::Synced(const std::string& path, uint64_t size) {
  absl::MutexLock l(&mu_);
  auto it = written_.find(path);
  if (it != written_.end()) it->second.synced = std::max(it->second.synced, size);
}

void FaultInjectionFs::DirectorySynced(const std::string& dir) {
  absl::MutexLock l(&mu_);
  unsynced_names_.erase(dir);
}

std::optional<std::string> FaultInjectionFs::DurableContentLocked(const std::string& path) const {
  if (!Exists(path)) return std::nullopt;
  auto it = written_.find(path);
  return ReadPrefix(path, it == written_.end() ? UINT64_MAX : it->second.synced);
}

void FaultInjectionFs::RememberNameLocked(const std::string& path) {
  auto [dir, name] = Split(path);
  std::map<std::string, std::optional<std::string>>& names = unsynced_names_[dir];
  if (names.count(name) == 0) names[name] = DurableContentLocked(path);
}

absl::Status FaultInjectionFs::PowerLossImage(const std::string& dir, const std::string& to) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::create_directories(to, ec) || ec) {
    return absl::InternalError(absl::StrCat("cannot create ", to, ": ", ec.message()));
  }
  const std::string from = WithoutTrailingSlash(dir);
  absl::MutexLock l(&mu_);
  std::map<std::string, std::optional<std::string>> image;
  for (const fs::directory_entry& e : fs::directory_iterator(from, ec)) {
    if (!e.is_regular_file()) continue;
    std::string name = e.path().filename().string();
    image[name] = DurableContentLocked(absl::StrCat(from, "/", name));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", from, ": ", ec.message()));
  auto pending = unsynced_names_.find(from);
  if (pending != unsynced_names_.end()) {
    for (const auto& [name, content] : pending->second) image[name] = content;
  }
  for (const auto& [name, content] : image) {
    if (!content.has_value()) continue;
    std::ofstream out(absl::StrCat(to, "/", name), std::ios::binary | std::ios::trunc);
    out.write(content->data(), static_cast<std::streamsize>(content->size()));
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", to, "/", name));
  }
  return absl::OkStatus();
}

}  // namespace shardcache::testing
