// The port a server under test bound itself and reported. Tests start servers on a port of
// their own choosing (forge-coordinator --metrics-port any, metrics.port any, Prometheus's
// --web.listen-address HOST:0) and read the number back: a port a test found free and then
// handed to another process could be taken by a third in between ("Address already in use").
// Each returns 0 while the port is not reported (yet). Header-only.
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

namespace forge::test {

inline std::string ReportedText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A "host:port" file (forge-coordinator --address-file, --metrics-address-file).
inline int PortInAddressFile(const std::string& path) {
  const std::string a = ReportedText(path);
  const size_t colon = a.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(a.c_str() + colon + 1);
}

// The /metrics port rank `rank` logged to `log_path` with metrics.port any
// ("forge: rank R serves /metrics on ADDR:PORT", train_metrics.cc).
inline int LoggedMetricsPort(const std::string& log_path, int rank) {
  const std::regex line("forge: rank " + std::to_string(rank) + " serves /metrics on [^ \n]*:([0-9]+)\n");
  std::smatch m;
  const std::string log = ReportedText(log_path);
  return std::regex_search(log, m, line) ? std::atoi(m[1].str().c_str()) : 0;
}

// The port Prometheus logged it listens on (msg="Listening on" address=HOST:PORT).
inline int LoggedPrometheusPort(const std::string& log_path) {
  const std::regex line("msg=\"Listening on\" address=[^ \n]*:([0-9]+)");
  std::smatch m;
  const std::string log = ReportedText(log_path);
  return std::regex_search(log, m, line) ? std::atoi(m[1].str().c_str()) : 0;
}

}  // namespace forge::test
