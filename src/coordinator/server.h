// The coordinator's gRPC server: RunService (user token) and WorkerService (join secret) in
// front of a Coordinator, on one port, plaintext or TLS.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "coordinator/coordinator.h"

namespace forge::coord {

struct ServerOptions {
  std::string listen = "127.0.0.1:7070";  // host:port; port 0 picks a free one
  std::string user_token;                 // required on RunService calls
  std::string join_secret;                // required on WorkerService calls
  std::string tls_cert_file, tls_key_file;  // both set: serve TLS only
};

class CoordinatorServer {
 public:
  // Starts serving `coordinator` (not owned; must outlive the server).
  static StatusOr<std::unique_ptr<CoordinatorServer>> Start(const ServerOptions& options,
                                                            Coordinator* coordinator);
  ~CoordinatorServer();
  int port() const { return port_; }
  void Wait();      // until Shutdown
  void Shutdown();  // stops accepting, cancels streams

 private:
  struct Services;
  CoordinatorServer() = default;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace forge::coord
