// Certificates for process tests of TLS and authorization: made by the project's own
// scripts/make-certs.sh (openssl) into the test's temporary directory, and the flags and client
// credentials that use them.
//
// SecurityFromEnvironment() lets one test binary run its scenarios in plaintext or with TLS and
// authorization on (SHARDCACHE_TEST_SECURITY=tls), so that the same tests prove both.
//
// Thread-compatible: make and use a TestCertificates from one thread; credentials are
// thread-safe.
#ifndef SHARDCACHE_INTEGRATION_TESTS_SECURITY_CERTS_H_
#define SHARDCACHE_INTEGRATION_TESTS_SECURITY_CERTS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace shardcache::testing {

// Whether SHARDCACHE_TEST_SECURITY=tls: the stores serve TLS and require client certificates
// for the Store service (authorization on); clients present the admin's certificate, and
// replicators their shard's.
bool SecurityFromEnvironment();

// The TLS reload interval the tests' processes run with, in flag form.
inline constexpr char kTestTlsReloadInterval[] = "1s";

class TestCertificates {
 public:
  // Runs scripts/make-certs.sh into a new directory under the test temporary directory, for
  // `shards` (each gets replicator-<s>.crt); `days` < 0 makes expired leaf certificates.
  // `ca_from`: a directory whose ca.crt/ca.key to reuse (a second set from the same CA).
  static absl::StatusOr<TestCertificates> Make(const std::vector<std::string>& shards,
                                               int days = 30, const std::string& ca_from = "");
  // One set for the whole test process, for shards a, b and c (made on first use; fails the
  // test when it cannot be made).
  static const TestCertificates& Shared();

  const std::string& dir() const { return dir_; }
  // "<dir>/<name>", e.g. Path("ca.crt").
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // Makes every leaf certificate again (new keys), as an operator's rotation does.
  absl::Status Renew() const;

  // cache_server flags: --tls-cert-file, --tls-key-file, --client-ca-file, and a short
  // --tls-reload-interval.
  std::vector<std::string> ServerArgs() const;
  // The files of client `who` ("admin", "reader", "replicator-a", ...), or only the CA
  // (who = "") for a client without a certificate.
  TlsFiles Client(const std::string& who) const;
  std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& who) const;
  // shard_replicator flags that present replicator-<shard>'s certificate to both stores.
  std::vector<std::string> ReplicatorArgs(const std::string& shard) const;

 private:
  std::string dir_;
  std::vector<std::string> shards_;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_SECURITY_CERTS_H_
