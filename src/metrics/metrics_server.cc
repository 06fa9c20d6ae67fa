#include "metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>

namespace forge {
namespace {

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
  // A numeric IPv4 or IPv6 address (no name lookup) and the port, as the socket takes them.
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(bind_address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return Status::Invalid("metrics.bind_address: not an IPv4 or IPv6 address: " + bind_address);
  sockaddr_storage ss{};
  const socklen_t len = found->ai_addrlen;
  std::memcpy(&ss, found->ai_addr, len);
  ::freeaddrinfo(found);
  // Non-blocking: Serve() accepts until nothing is pending.
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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

struct MetricsServer::Connection {
  using Clock = std::chrono::steady_clock;
  int fd = -1;
  Clock::time_point opened;
  std::string in;   // the request head so far
  std::string out;  // the reply; empty while reading
  size_t sent = 0;
  bool finished = false;  // replied, refused or failed: close it
  bool replying() const { return !out.empty(); }
};

// Polls so that the destructor's stop flag is seen within 100 ms.
void MetricsServer::Serve() {
  using Clock = Connection::Clock;
  std::list<Connection> conns;  // oldest first
  auto close_conn = [&](std::list<Connection>::iterator it) {
    ::close(it->fd);
    return conns.erase(it);
  };
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> which;
  while (!stop_.load()) {
    fds.clear();
    which.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      fds.push_back({it->fd, short(it->replying() ? POLLOUT : POLLIN), 0});
      which.push_back(it);
    }
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) continue;
    const auto now = Clock::now();
    for (size_t i = 1; i < fds.size(); ++i) {
      Connection& c = *which[i - 1];
      if (fds[i].revents & (POLLERR | POLLNVAL)) {
        c.finished = true;
      } else if (c.replying() && (fds[i].revents & (POLLOUT | POLLHUP))) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) c.sent += size_t(n);
        c.finished = c.sent >= c.out.size() || (n < 0 && errno != EAGAIN && errno != EINTR);
      } else if (!c.replying() && (fds[i].revents & (POLLIN | POLLHUP))) {
        char buf[2048];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
          c.in.append(buf, size_t(n));
          const size_t end = c.in.find("\r\n\r\n");
          if (end != std::string::npos) c.out = Answer(c.in.substr(0, end + 4));
          else c.finished = c.in.size() >= 8192;  // a head that long is no scrape
        } else {
          c.finished = n == 0 || (errno != EAGAIN && errno != EINTR);
        }
      }
    }
    // Finished, or out of time.
    for (auto it = conns.begin(); it != conns.end();) {
      const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->opened);
      const bool late = age.count() >= (it->replying() ? kConnectionTimeoutMs : kHeadTimeoutMs);
      it = it->finished || late ? close_conn(it) : std::next(it);
    }
    if (!(fds[0].revents & POLLIN)) continue;
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      if (int(conns.size()) >= kMaxConnections) {
        // Full: the oldest connection still waiting for its head makes room; when every one
        // is replying, the new one is turned away.
        auto idle = std::find_if(conns.begin(), conns.end(),
                                 [](const Connection& c) { return !c.replying(); });
        if (idle == conns.end()) {
          ::close(fd);
          continue;
        }
        close_conn(idle);
      }
      Connection c;
      c.fd = fd;
      c.opened = Clock::now();
      conns.push_back(std::move(c));
    }
  }
  for (auto it = conns.begin(); it != conns.end();) it = close_conn(it);
}

// Answers GET /metrics (HEAD too), else 404/405; an unreadable request line gets 400.
std::string MetricsServer::Answer(const std::string& head) {
  const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos)
    return Response("400 Bad Request", "text/plain", "GET /metrics\n");
  const std::string method = head.substr(0, sp1), target = head.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string path = target.substr(0, target.find('?'));
  if (method != "GET" && method != "HEAD")
    return Response("405 Method Not Allowed", "text/plain", "GET /metrics\n");
  if (path != "/metrics" && path != "/metrics/")
    return Response("404 Not Found", "text/plain", "see /metrics\n");
  std::string r = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", Scrape());
  if (method == "HEAD") r.resize(r.find("\r\n\r\n") + 4);
  return r;
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
