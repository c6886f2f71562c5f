#include "bench/sync_load.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace shardcache::bench {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

// Removes the file when the run ends, whatever the outcome.
class TempFile {
 public:
  TempFile() = default;
  ~TempFile() {
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  absl::Status Create(const std::string& dir) {
    std::string pattern = absl::StrCat(dir, "/store_bench-sync-XXXXXX");
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    fd_ = mkstemp(buf.data());
    if (fd_ < 0) return Errno(absl::StrCat("--fsync-dir: cannot create ", pattern));
    path_ = buf.data();
    return absl::OkStatus();
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace

absl::StatusOr<SyncLoadResult> RunSyncLoad(const SyncLoadOptions& options) {
  TempFile file;
  if (absl::Status s = file.Create(options.dir); !s.ok()) return s;
  const int fd = file.fd();
  // Not all zeros, in case the filesystem or device treats those specially.
  std::string block(static_cast<size_t>(options.block_bytes), 'x');
  auto sync = [&options, fd]() {
    return options.call == SyncLoadOptions::Call::kFsync ? fsync(fd) : fdatasync(fd);
  };
  if (!options.append) {
    // The block exists and is allocated before the first timed sync.
    if (pwrite(fd, block.data(), block.size(), 0) != static_cast<ssize_t>(block.size()) ||
        fsync(fd) != 0) {
      return Errno("preparing the file");
    }
  }

  SyncLoadResult r;
  std::vector<int64_t> sync_ns, write_ns;
  sync_ns.reserve(1 << 16);
  write_ns.reserve(1 << 16);
  int64_t offset = 0;
  r.flushes_before = ReadDiskFlushes(options.dir);
  int64_t start = NowNanos();
  int64_t end = start + absl::ToInt64Nanoseconds(options.duration);
  int64_t now = start;
  while (now < end) {
    if (options.append && offset + options.block_bytes > options.max_file_bytes) {
      if (ftruncate(fd, 0) != 0) return Errno("truncating the file");
      offset = 0;
    }
    int64_t t0 = NowNanos();
    if (pwrite(fd, block.data(), block.size(), offset) != static_cast<ssize_t>(block.size())) {
      return Errno("writing");
    }
    int64_t t1 = NowNanos();
    if (sync() != 0)
      return Errno(options.call == SyncLoadOptions::Call::kFsync ? "fsync" : "fdatasync");
    now = NowNanos();
    write_ns.push_back(t1 - t0);
    sync_ns.push_back(now - t1);
    if (options.append) offset += options.block_bytes;
  }
  r.flushes_after = ReadDiskFlushes(options.dir);
  r.seconds = static_cast<double>(now - start) / 1e9;
  r.syncs = static_cast<int64_t>(sync_ns.size());
  r.sync_latency = Summarize(&sync_ns);
  r.write_latency = Summarize(&write_ns);
  return r;
}

}  // namespace shardcache::bench
