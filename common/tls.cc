#include "common/tls.h"

#include <grpc/support/log.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/base/const_init.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"

namespace shardcache {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// OpenSSL's last error as text, and the error queue cleared.
std::string OpenSslError() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read \"", path, "\""));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

BioPtr MemBio(absl::string_view data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// The first certificate of a PEM text, or null.
X509Ptr FirstCertificate(absl::string_view pem) {
  BioPtr bio = MemBio(pem);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// The text values of `nid` in a certificate's subject, in order.
std::vector<std::string> SubjectValues(X509* cert, int nid) {
  std::vector<std::string> values;
  X509_NAME* name = X509_get_subject_name(cert);
  for (int i = X509_NAME_get_index_by_NID(name, nid, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(name, nid, i)) {
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    unsigned char* utf8 = nullptr;
    int len = ASN1_STRING_to_UTF8(&utf8, data);
    if (len < 0) continue;
    values.emplace_back(reinterpret_cast<char*>(utf8), static_cast<size_t>(len));
    OPENSSL_free(utf8);
  }
  return values;
}

std::atomic<prometheus::Counter*> g_handshake_failures{nullptr};

// Parsing a certificate costs OpenSSL 3 hundreds of microseconds, more than a write: the
// identities of the certificates seen lately are kept, keyed by the whole PEM text.
constexpr size_t kMaxCachedIdentities = 1024;
absl::Mutex g_identities_mu(absl::kConstInit);
absl::flat_hash_map<std::string, PeerIdentity>& g_identities ABSL_GUARDED_BY(g_identities_mu) =
    *new absl::flat_hash_map<std::string, PeerIdentity>();

void LogToSpdlog(gpr_log_func_args* args) {
  std::string message = args->message != nullptr ? args->message : "";
  if (absl::StrContains(message, "Handshake failed")) {
    if (prometheus::Counter* c = g_handshake_failures.load()) c->Increment();
    spdlog::info("grpc: TLS handshake failed: {}", message);
    return;
  }
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      spdlog::debug("grpc: {} ({}:{})", message, args->file, args->line);
      break;
    case GPR_LOG_SEVERITY_INFO:
      spdlog::info("grpc: {} ({}:{})", message, args->file, args->line);
      break;
    case GPR_LOG_SEVERITY_ERROR:
      spdlog::warn("grpc: {} ({}:{})", message, args->file, args->line);
      break;
  }
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files, absl::string_view cert_flag,
                           absl::string_view key_flag, absl::string_view ca_flag) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_flag, " and ", key_flag, ": give both or neither"));
  }
  if (files.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("the TLS reload interval must be at least 1s");
  }
  if (!files.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(cert_flag, files.cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(key_flag, files.key_file);
    if (!key.ok()) return key.status();
    X509Ptr leaf = FirstCertificate(*cert);
    if (leaf == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          cert_flag, ": \"", files.cert_file, "\" holds no PEM certificate: ", OpenSslError()));
    }
    BioPtr key_bio = MemBio(*key);
    PkeyPtr pkey(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    if (pkey == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          key_flag, ": \"", files.key_file, "\" holds no PEM private key: ", OpenSslError()));
    }
    if (X509_check_private_key(leaf.get(), pkey.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(key_flag, ": the key in \"", files.key_file,
                                                     "\" does not match the certificate in \"",
                                                     files.cert_file, "\""));
    }
  }
  if (!files.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(ca_flag, files.ca_file);
    if (!ca.ok()) return ca.status();
    if (FirstCertificate(*ca) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          ca_flag, ": \"", files.ca_file, "\" holds no PEM certificate: ", OpenSslError()));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsFiles& files) {
  if (!files.server_enabled()) return grpc::InsecureServerCredentials();
  auto interval = static_cast<unsigned int>(absl::ToInt64Seconds(files.reload_interval));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsFiles& files) {
  if (!files.client_enabled()) return grpc::InsecureChannelCredentials();
  auto interval = static_cast<unsigned int>(absl::ToInt64Seconds(files.reload_interval));
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_verify_server_certs(true);
  if (!files.cert_file.empty() || !files.ca_file.empty()) {
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            files.key_file, files.cert_file, files.ca_file, interval));
  }
  if (!files.ca_file.empty()) options.watch_root_certs();
  if (!files.cert_file.empty()) options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(options);
}

absl::StatusOr<PeerIdentity> IdentityFromPem(absl::string_view pem) {
  X509Ptr cert = FirstCertificate(pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("certificate: ", OpenSslError()));
  }
  std::vector<std::string> cn = SubjectValues(cert.get(), NID_commonName);
  if (cn.empty() || cn.front().empty()) {
    return absl::InvalidArgumentError("certificate: the subject has no CN");
  }
  return PeerIdentity{cn.front(), SubjectValues(cert.get(), NID_organizationName)};
}

std::optional<PeerIdentity> PeerIdentityOf(const grpc::AuthContext& auth) {
  std::vector<grpc::string_ref> pem = auth.FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return std::nullopt;
  std::string key(pem[0].data(), pem[0].size());
  {
    absl::MutexLock l(&g_identities_mu);
    auto it = g_identities.find(key);
    if (it != g_identities.end()) return it->second;
  }
  absl::StatusOr<PeerIdentity> id = IdentityFromPem(key);
  if (!id.ok()) return std::nullopt;
  absl::MutexLock l(&g_identities_mu);
  if (g_identities.size() >= kMaxCachedIdentities) g_identities.clear();
  g_identities.emplace(std::move(key), *id);
  return *std::move(id);
}

struct ReloadingKeyPair::Pair {
  X509Ptr leaf;
  PkeyPtr key;
  std::vector<X509Ptr> chain;  // the intermediates after the leaf
};

namespace {

int64_t ModifiedNanos(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> ReloadingKeyPair::Load(const TlsFiles& files) {
  std::shared_ptr<ReloadingKeyPair> keys(new ReloadingKeyPair(files));
  {
    absl::MutexLock l(&keys->mu_);
    keys->next_check_ = absl::InfinitePast();  // the first Current reads the files
    keys->cert_mtime_ = keys->key_mtime_ = -2;
  }
  if (keys->Current() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot load the certificate \"", files.cert_file, "\" and key \"", files.key_file, "\""));
  }
  return keys;
}

ReloadingKeyPair::~ReloadingKeyPair() = default;

std::shared_ptr<const ReloadingKeyPair::Pair> ReloadingKeyPair::Current() {
  absl::MutexLock l(&mu_);
  absl::Time now = absl::Now();
  if (now < next_check_) return pair_;
  next_check_ = now + files_.reload_interval;
  int64_t cert_mtime = ModifiedNanos(files_.cert_file);
  int64_t key_mtime = ModifiedNanos(files_.key_file);
  if (cert_mtime == cert_mtime_ && key_mtime == key_mtime_) return pair_;
  // Files are small: read them under the lock (at most once per interval).
  absl::Status checked = CheckTlsFiles({files_.cert_file, files_.key_file, "", absl::Seconds(1)},
                                       "certificate", "key", "ca");
  absl::StatusOr<std::string> cert = ReadFile("certificate", files_.cert_file);
  absl::StatusOr<std::string> key = ReadFile("key", files_.key_file);
  if (!checked.ok() || !cert.ok() || !key.ok() || ModifiedNanos(files_.cert_file) != cert_mtime ||
      ModifiedNanos(files_.key_file) != key_mtime) {
    spdlog::warn("TLS: keeping the current certificate: the new one does not load yet: {}",
                 checked.ok() ? "the files changed while being read" : checked.ToString());
    return pair_;
  }
  auto pair = std::make_shared<Pair>();
  BioPtr cert_bio = MemBio(*cert);
  pair->leaf.reset(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  while (X509* next = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) {
    pair->chain.emplace_back(next);
  }
  ERR_clear_error();
  BioPtr key_bio = MemBio(*key);
  pair->key.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (pair->leaf == nullptr || pair->key == nullptr) return pair_;
  if (pair_ != nullptr) spdlog::info("TLS: loaded a new certificate from {}", files_.cert_file);
  pair_ = std::move(pair);
  cert_mtime_ = cert_mtime;
  key_mtime_ = key_mtime;
  return pair_;
}

void ReloadingKeyPair::Install(void* ssl_ctx) {
  SSL_CTX_set_cert_cb(
      static_cast<SSL_CTX*>(ssl_ctx),
      [](SSL* ssl, void* arg) -> int {
        std::shared_ptr<const Pair> pair = static_cast<ReloadingKeyPair*>(arg)->Current();
        if (pair == nullptr) return 0;
        STACK_OF(X509)* chain = sk_X509_new_null();
        for (const X509Ptr& c : pair->chain) sk_X509_push(chain, c.get());
        int ok = SSL_use_cert_and_key(ssl, pair->leaf.get(), pair->key.get(), chain, 1);
        sk_X509_free(chain);
        return ok == 1 ? 1 : 0;
      },
      this);
}

void InstallGrpcLogRouting(prometheus::Registry& registry) {
  auto& family = prometheus::BuildCounter()
                     .Name("shardcache_tls_handshake_failures_total")
                     .Help(
                         "TLS handshakes that failed (e.g. a client certificate from another CA, "
                         "an expired one, or plaintext sent to a TLS port); no call was served")
                     .Register(registry);
  g_handshake_failures = &family.Add({});
  gpr_set_log_function(LogToSpdlog);
}

}  // namespace shardcache
