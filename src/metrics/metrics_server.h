// The /metrics HTTP endpoint: serves every registered collectable (registries,
// GpuHealthCollector) in Prometheus text format. Workers listen on metrics.port + local rank,
// the coordinator on its own port.
//
// Our own small HTTP/1.1 server rather than prometheus-cpp's Exposer: CivetWeb starts its threads with a fixed small stack, which glibc
// refuses once a library with a large static TLS block is loaded (libcublasLt: 94 KB), so in
// every CUDA build the Exposer failed with "null context when constructing CivetServer". A
// scrape endpoint needs none of CivetWeb's features.
//
// One thread serves every connection at once with non-blocking sockets and poll(): one request
// per connection, whose head must arrive within kHeadTimeoutMs and whose whole exchange ends
// within kConnectionTimeoutMs (a peer that stops reading loses its reply). At most
// kMaxConnections are open; a new one beyond that closes the oldest still waiting for its
// head, so idle or slow clients never keep a scraper out.
#pragma once

#include <prometheus/collectable.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

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

  static constexpr int kMaxConnections = 64;
  static constexpr int kHeadTimeoutMs = 2000;
  static constexpr int kConnectionTimeoutMs = 10000;

 private:
  struct Connection;
  MetricsServer() = default;
  void Serve();
  // The reply to a complete request head (its bytes up to the blank line).
  std::string Answer(const std::string& head);
  std::string Scrape();

  std::string bind_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;  // guards collectables_
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;
};

}  // namespace forge
