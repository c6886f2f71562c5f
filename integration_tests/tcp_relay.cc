#include "integration_tests/tcp_relay.h"

namespace shardcache::testing {

absl::StatusOr<std::unique_ptr<TcpRelay>> TcpRelay::Start(const std::string& target_host,
                                                          int target_port) {
  absl::StatusOr<std::unique_ptr<FaultProxy>> proxy = FaultProxy::Start(target_host, target_port);
  if (!proxy.ok()) return proxy.status();
  return std::unique_ptr<TcpRelay>(new TcpRelay(*std::move(proxy)));
}

void TcpRelay::Hold() { proxy_->Hold(); }
void TcpRelay::Release() { proxy_->Release(); }
size_t TcpRelay::held_bytes() const { return proxy_->held_bytes(); }
bool TcpRelay::HeldContains(std::string_view needle) const { return proxy_->HeldContains(needle); }
void TcpRelay::RecordServerToClient() { proxy_->RecordServerToClient(); }
bool TcpRelay::RecordedContains(std::string_view needle) const {
  return proxy_->RecordedContains(needle);
}
int TcpRelay::connections_accepted() const { return proxy_->connections_accepted(); }

}  // namespace shardcache::testing
