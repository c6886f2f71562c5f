// TLS for shardcache's gRPC servers and clients, and the identity of a client certificate.
//
// Credentials are made from PEM files (a certificate chain, its private key, a CA bundle) through
// gRPC's FileWatcherCertificateProvider: gRPC reads the files again every `reload_interval` and
// uses what it read for every handshake after that, so a rotated certificate, key or CA is served
// without a restart, and connections already established (and their streams) go on untouched.
// The files are also read and checked once when the credentials are made (the certificate parses,
// the key matches it, the CA bundle holds a certificate), so that a process with a wrong file
// refuses to start instead of failing every handshake.
//
// Rotation: write the new files beside the old ones and rename them into place, key then
// certificate (scripts/make-certs.sh --renew does), so that no file is ever read half-written.
// gRPC reads the pair again when a file changed while it read them; but gRPC 1.51 does not check
// that the key matches the certificate, so a reload that falls between the two renames serves a
// mismatched pair, and fails handshakes, until the next reload (ReloadingKeyPair below checks,
// and keeps the old pair meanwhile).
//
// Identity (as Kubernetes' x509 authenticator): user = the certificate's subject CN, groups = its
// subject O values, in order.
//
// Handshake failures (a client with a certificate from another CA, an expired one, a wrong
// protocol) end before any call, so no service sees them: gRPC 1.51 logs each one and offers no
// other hook. InstallGrpcLogRouting routes gRPC's own log lines to spdlog and counts the failed
// handshakes among them.
//
// Thread-safety: free functions, safe from any thread; InstallGrpcLogRouting once from main.
#ifndef SHARDCACHE_COMMON_TLS_H_
#define SHARDCACHE_COMMON_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/registry.h"

namespace shardcache {

// Where a TLS endpoint finds its PEM files. An empty path means "none".
struct TlsFiles {
  // The certificate chain (leaf first) this side presents. Server: required for TLS.
  std::string cert_file;
  // The private key of cert_file's leaf certificate. Required with cert_file.
  std::string key_file;
  // Server: the CA bundle that client certificates must chain to (client certificates are then
  // requested and verified). Client: the CA bundle the server's certificate must chain to.
  std::string ca_file;
  // How often the files are read again for changes (at least 1 s; gRPC counts whole seconds).
  absl::Duration reload_interval = absl::Minutes(1);

  // Server: whether TLS is on (a certificate is given). Client: whether anything is given.
  bool server_enabled() const { return !cert_file.empty(); }
  bool client_enabled() const { return !cert_file.empty() || !ca_file.empty(); }
};

// Checks the files: both or neither of cert and key; each given file reads and parses; the key
// matches the certificate; the CA bundle holds at least one certificate. `flag_prefix` names the
// flags in messages, e.g. "--tls" ("--tls-cert-file: ...") or "--cache".
absl::Status CheckTlsFiles(const TlsFiles& files, absl::string_view cert_flag,
                           absl::string_view key_flag, absl::string_view ca_flag);

// Server credentials: insecure when !files.server_enabled(); else TLS with the watched cert and
// key, and, when files.ca_file is set, client certificates requested and verified against it
// (a client without one completes the handshake and is told UNAUTHENTICATED by the service; one
// with an unverifiable one fails the handshake). Call CheckTlsFiles first.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsFiles& files);

// Channel credentials: insecure when !files.client_enabled(); else TLS that verifies the server's
// certificate against files.ca_file (the system's roots when empty) and its name against the
// target's host, presenting files.cert_file when set. Call CheckTlsFiles first.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsFiles& files);

// The identity a verified client certificate carries.
struct PeerIdentity {
  std::string user;                 // subject CN
  std::vector<std::string> groups;  // subject O values
};

// The identity of a PEM certificate; InvalidArgument when it does not parse or has no CN.
absl::StatusOr<PeerIdentity> IdentityFromPem(absl::string_view pem);

// The identity of the peer of a call: its verified client certificate's, or nullopt when the
// call came over plaintext or without a client certificate.
std::optional<PeerIdentity> PeerIdentityOf(const grpc::AuthContext& auth);

// A certificate chain and its key for a TLS server that is not gRPC's (the HTTP endpoint, which
// cpp-httplib serves over OpenSSL), read again when the files change: each handshake asks for
// the current pair, and the files' modification times are compared at most once per
// `reload_interval`. A pair that does not load or whose key does not match its certificate (a
// rotation half done) is skipped with a warning; the last good one is served meanwhile.
//
// Thread-safe: handshakes on any thread call it concurrently.
class ReloadingKeyPair {
 public:
  // Loads files.cert_file and files.key_file (INVALID_ARGUMENT when they do not load).
  static absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> Load(const TlsFiles& files);
  ~ReloadingKeyPair();
  ReloadingKeyPair(const ReloadingKeyPair&) = delete;
  ReloadingKeyPair& operator=(const ReloadingKeyPair&) = delete;

  // Makes every handshake of `ctx` (an OpenSSL SSL_CTX*) use the current pair. The pair must
  // outlive `ctx`.
  void Install(void* ssl_ctx);

 private:
  struct Pair;
  explicit ReloadingKeyPair(TlsFiles files) : files_(std::move(files)) {}
  // The current pair, reloaded first when the files changed and the interval has passed.
  std::shared_ptr<const Pair> Current() ABSL_LOCKS_EXCLUDED(mu_);

  const TlsFiles files_;
  absl::Mutex mu_;
  std::shared_ptr<const Pair> pair_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_);
  // The files' modification times when pair_ was read (nanoseconds).
  int64_t cert_mtime_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t key_mtime_ ABSL_GUARDED_BY(mu_) = 0;
};

// Routes gRPC's log lines to spdlog (gRPC errors as warnings: gRPC logs transport failures, which
// clients retry, at its error level) and, from then on, counts failed server-side TLS handshakes
// in shardcache_tls_handshake_failures_total of `registry`. Call once, before the server starts.
void InstallGrpcLogRouting(prometheus::Registry& registry);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_TLS_H_
