#include "integration_tests/security_certs.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/server_process.h"

namespace shardcache::testing {
namespace {

absl::Status RunScript(const std::string& dir, const std::vector<std::string>& shards, int days,
                       bool renew) {
  std::string command = absl::StrCat(SHARDCACHE_SOURCE_DIR, "/scripts/make-certs.sh -o '", dir,
                                     "' -s '", absl::StrJoin(shards, " "), "' -d ", days,
                                     renew ? " --renew" : "", " >'", dir, "/.make-certs.log' 2>&1");
  int status = std::system(command.c_str());
  if (status != 0) {
    return absl::InternalError(absl::StrCat("make-certs.sh failed (", status, "): ", command));
  }
  return absl::OkStatus();
}

}  // namespace

bool SecurityFromEnvironment() {
  const char* mode = std::getenv("SHARDCACHE_TEST_SECURITY");
  return mode != nullptr && std::string(mode) == "tls";
}

absl::StatusOr<TestCertificates> TestCertificates::Make(const std::vector<std::string>& shards,
                                                        int days, const std::string& ca_from) {
  TestCertificates certs;
  certs.dir_ = MakeTempDir("certs");
  certs.shards_ = shards;
  if (certs.dir_.empty()) return absl::InternalError("cannot make a temporary directory");
  if (!ca_from.empty()) {
    for (const char* f : {"ca.crt", "ca.key"}) {
      std::error_code ec;
      std::filesystem::copy_file(ca_from + "/" + f, certs.dir_ + "/" + f, ec);
      if (ec) return absl::InternalError(absl::StrCat("copy ", f, ": ", ec.message()));
    }
  }
  absl::Status made = RunScript(certs.dir_, shards, days, /*renew=*/false);
  if (!made.ok()) return made;
  return certs;
}

const TestCertificates& TestCertificates::Shared() {
  static const TestCertificates* shared = [] {
    absl::StatusOr<TestCertificates> made = Make({"a", "b", "c"});
    if (!made.ok()) {
      ADD_FAILURE() << made.status();
      return new TestCertificates();
    }
    static std::string dir = made->dir();
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    });
    return new TestCertificates(*std::move(made));
  }();
  return *shared;
}

absl::Status TestCertificates::Renew() const {
  return RunScript(dir_, shards_, 30, /*renew=*/true);
}

std::vector<std::string> TestCertificates::ServerArgs() const {
  return {"--tls-cert-file=" + Path("server.crt"), "--tls-key-file=" + Path("server.key"),
          "--client-ca-file=" + Path("ca.crt"),
          absl::StrCat("--tls-reload-interval=", kTestTlsReloadInterval)};
}

TlsFiles TestCertificates::Client(const std::string& who) const {
  TlsFiles files;
  files.ca_file = Path("ca.crt");
  if (!who.empty()) {
    files.cert_file = Path(who + ".crt");
    files.key_file = Path(who + ".key");
  }
  files.reload_interval = absl::Seconds(1);
  return files;
}

std::shared_ptr<grpc::ChannelCredentials> TestCertificates::Credentials(
    const std::string& who) const {
  return MakeChannelCredentials(Client(who));
}

std::vector<std::string> TestCertificates::ReplicatorArgs(const std::string& shard) const {
  std::string who = "replicator-" + shard;
  std::vector<std::string> args;
  for (const char* store : {"cache", "shard-store"}) {
    args.push_back(absl::StrCat("--", store, "-ca-file=", Path("ca.crt")));
    args.push_back(absl::StrCat("--", store, "-cert-file=", Path(who + ".crt")));
    args.push_back(absl::StrCat("--", store, "-key-file=", Path(who + ".key")));
  }
  args.push_back(absl::StrCat("--tls-reload-interval=", kTestTlsReloadInterval));
  return args;
}

}  // namespace shardcache::testing
