// A loopback port held for a server that must be given its port number up front (a rendezvous
// whose clients know the port beforehand, as MASTER_PORT works): the reservation binds
// 127.0.0.1:0 with SO_REUSEADDR and never listens, so a server that also sets SO_REUSEADDR (the
// TCP rendezvous does) binds and listens on the port, while no other bind and no outgoing
// connection's ephemeral port can take it in between. A port merely found free and closed again
// can be taken by another process before the server binds it. Held until destroyed. Where the
// server can pick its own port and report it, prefer that (reported_port.h). Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace forge::test {

class PortReservation {
 public:
  PortReservation() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return;
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port_ = ntohs(a.sin_port);
  }
  ~PortReservation() {
    if (fd_ >= 0) ::close(fd_);
  }
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;

  int port() const { return port_; }  // 0 when nothing could be bound

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace forge::test
