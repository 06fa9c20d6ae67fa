#include "metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <prometheus/text_serializer.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace forge {
namespace {

// Writes all of `s` (a peer that stops reading just loses its response).
void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += size_t(n);
  }
}

std::string Response(const char* status, const char* type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind_address,
                                                              int port) {
  if (port < 0 || port > 65535)
    return Status::Invalid("metrics port must be in [0, 65535], got " + std::to_string(port));
  const bool v6 = bind_address.find(':') != std::string::npos;
  const std::string shown = (v6 ? "[" + bind_address + "]" : bind_address) + ":" + std::to_string(port);
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(uint16_t(port));
    if (inet_pton(AF_INET6, bind_address.c_str(), &a->sin6_addr) != 1)
      return Status::Invalid("metrics.bind_address: not an IPv6 address: " + bind_address);
    len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(uint16_t(port));
    if (inet_pton(AF_INET, bind_address.c_str(), &a->sin_addr) != 1)
      return Status::Invalid("metrics.bind_address: not an IPv4 address: " + bind_address);
    len = sizeof(sockaddr_in);
  }
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable("cannot serve /metrics on " + shown + ": socket: " + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 64) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    return Status::Unavailable("cannot serve /metrics on " + shown + ": " + err);
  }
  sockaddr_storage got{};
  socklen_t got_len = sizeof got;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&got), &got_len);
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->listen_fd_ = fd;
  s->bind_ = bind_address;
  s->port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                      : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void MetricsServer::Register(const std::shared_ptr<prometheus::Collectable>& c) {
  std::lock_guard<std::mutex> l(mu_);
  collectables_.push_back(c);
}

// Polls so that the destructor's stop flag is seen within 100 ms.
void MetricsServer::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Handle(fd);
    ::close(fd);
  }
}

// One request: read the head (2 s, 8 KiB at most), answer GET /metrics, else 404/405.
void MetricsServer::Handle(int fd) {
  std::string head;
  char buf[2048];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, int(left)) <= 0) return;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    head.append(buf, size_t(n));
  }
  const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) return;
  const std::string method = head.substr(0, sp1), target = head.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string path = target.substr(0, target.find('?'));
  if (method != "GET" && method != "HEAD") {
    WriteAll(fd, Response("405 Method Not Allowed", "text/plain", "GET /metrics\n"));
  } else if (path != "/metrics" && path != "/metrics/") {
    WriteAll(fd, Response("404 Not Found", "text/plain", "see /metrics\n"));
  } else {
    std::string r = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", Scrape());
    if (method == "HEAD") r.resize(r.find("\r\n\r\n") + 4);
    WriteAll(fd, r);
  }
}

std::string MetricsServer::Scrape() {
  std::vector<std::shared_ptr<prometheus::Collectable>> live;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = collectables_.begin(); it != collectables_.end();) {
      if (auto c = it->lock()) {
        live.push_back(std::move(c));
        ++it;
      } else {
        it = collectables_.erase(it);
      }
    }
  }
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : live) {
    auto f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace forge
