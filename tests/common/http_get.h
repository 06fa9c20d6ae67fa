// A plain HTTP/1.0 GET over a loopback TCP socket, for tests that talk to a real server
// (/metrics endpoints, Prometheus's query API). Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>

namespace forge::test {

struct HttpResponse {
  int status = 0;     // 0: no connection / no valid reply
  std::string body;
};

inline HttpResponse HttpGet(int port, const std::string& path, const char* host = "127.0.0.1") {
  HttpResponse r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, host, &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
  if (::send(fd, req.data(), req.size(), 0) != ssize_t(req.size())) {
    ::close(fd);
    return r;
  }
  std::string raw;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, size_t(n));
  ::close(fd);
  int status = 0;
  if (std::sscanf(raw.c_str(), "HTTP/%*d.%*d %d", &status) != 1) return r;
  const size_t body = raw.find("\r\n\r\n");
  r.status = status;
  if (body != std::string::npos) r.body = raw.substr(body + 4);
  return r;
}

// Percent-encodes a query-string value.
inline std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace forge::test
