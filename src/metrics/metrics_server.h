// The /metrics HTTP endpoint (prometheus-cpp's Exposer, CivetWeb underneath): serves every
// registered collectable (registries, GpuHealthCollector) in Prometheus text format.
// Workers listen on metrics.port + local rank, the coordinator on its own port.
#pragma once

#include <prometheus/collectable.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace prometheus {
class Exposer;
}

namespace forge {

class MetricsServer {
 public:
  // Listens on bind_address:port (port 0: any free port; see port()). Unavailable with the
  // address when it cannot bind (port taken, bad address).
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& bind_address, int port);
  ~MetricsServer();

  // Serves `c` on /metrics for as long as it lives (the server holds a weak reference).
  void Register(const std::shared_ptr<prometheus::Collectable>& c);
  int port() const { return port_; }
  const std::string& bind_address() const { return bind_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bind_;
  int port_ = 0;
};

}  // namespace forge
