#include "metrics/metrics_server.h"

#include <dlfcn.h>
#include <prometheus/exposer.h>

#include <exception>

namespace forge {

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind_address,
                                                              int port) {
  if (port < 0 || port > 65535)
    return Status::Invalid("metrics port must be in [0, 65535], got " + std::to_string(port));
  // CivetWeb wants IPv6 addresses in brackets.
  const bool v6 = bind_address.find(':') != std::string::npos && bind_address.front() != '[';
  const std::string addr = (v6 ? "[" + bind_address + "]" : bind_address) + ":" + std::to_string(port);
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  try {
    s->exposer_ = std::make_unique<prometheus::Exposer>(addr, /*num_threads=*/1);
  } catch (const std::exception& e) {
    std::string hint;
    // CivetWeb dlopens OpenSSL by its unversioned names (provided by libssl-dev); without them
    // it refuses to start whatever the port (seen on a machine with runtime packages only).
    for (const char* lib : {"libssl.so", "libcrypto.so"}) {
      void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
      if (h == nullptr) h = dlopen(lib, RTLD_LAZY);
      if (h == nullptr) hint += std::string(hint.empty() ? "" : ", ") + lib;
      else dlclose(h);
    }
    if (!hint.empty())
      hint = " (" + hint + " not found: CivetWeb loads OpenSSL by these names; install libssl-dev "
             "or link them to libssl.so.3 / libcrypto.so.3)";
    return Status::Unavailable("cannot serve /metrics on " + addr + ": " + e.what() + hint);
  }
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  s->port_ = ports.empty() ? port : ports.front();
  s->bind_ = bind_address;
  return s;
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::Register(const std::shared_ptr<prometheus::Collectable>& c) {
  exposer_->RegisterCollectable(c);
}

}  // namespace forge
