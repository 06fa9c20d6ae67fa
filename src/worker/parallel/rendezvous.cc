#include "worker/parallel/rendezvous.h"

#include "worker/parallel/comm.h"

#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

class MpiRendezvous final : public IdRendezvous {
 public:
  Status Exchange(int rank, int world, UniqueIdBytes* id) override {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) return Status::Precondition("MPI rendezvous: MPI is not initialised");
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != world)
      return Status::Invalid("MPI rendezvous: world " + std::to_string(world) +
                             " but MPI_COMM_WORLD has " + std::to_string(size) + " ranks");
    (void)rank;
    if (MPI_Bcast(id->data(), int(id->size()), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
      return Status::Unavailable("MPI rendezvous: MPI_Bcast of the unique id failed");
    return Status::Ok();
  }
};

// Protocol: the client sends {"FGR1", rank, world} (int32, host byte order), the server
// answers {"FGI1", 128 id bytes}, or {"FGX1", 128 zero bytes} to a rank it rejects.
constexpr char kHello[4] = {'F', 'G', 'R', '1'};
constexpr char kReply[4] = {'F', 'G', 'I', '1'};
constexpr char kReject[4] = {'F', 'G', 'X', '1'};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

double SecondsLeft(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Waits for `events` on fd until the deadline.
Status PollFor(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    const double left = SecondsLeft(deadline);
    if (left <= 0) return Status::Unavailable("TCP rendezvous: timed out " + what);
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR)
      return Status::IoError("TCP rendezvous: poll " + what + ": " + std::strerror(errno));
  }
}

Status SendAll(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    FORGE_RETURN_IF_ERROR(PollFor(fd, POLLOUT, deadline, "sending"));
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return Status::IoError(std::string("TCP rendezvous: send: ") + std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    FORGE_RETURN_IF_ERROR(PollFor(fd, POLLIN, deadline, "receiving"));
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Status::IoError("TCP rendezvous: peer closed the connection");
    if (r < 0) return Status::IoError(std::string("TCP rendezvous: recv: ") + std::strerror(errno));
    p += r;
    n -= size_t(r);
  }
  return Status::Ok();
}

class TcpRendezvous final : public IdRendezvous {
 public:
  explicit TcpRendezvous(TcpRendezvousOptions o) : o_(std::move(o)) {}

  Status Exchange(int rank, int world, UniqueIdBytes* id) override {
    if (world <= 1) return Status::Ok();
    const auto deadline = Clock::now() + std::chrono::microseconds(int64_t(o_.timeout_s * 1e6));
    const std::string where = o_.host + ":" + std::to_string(o_.port);
    return (rank == 0 ? Serve(world, *id, deadline) : Fetch(rank, world, id, deadline))
        .Annotate("rank " + std::to_string(rank) + " of " + std::to_string(world) + " at " + where);
  }

 private:
  Status Serve(int world, const UniqueIdBytes& id, Clock::time_point deadline) {
    Fd listener{::socket(AF_INET6, SOCK_STREAM, 0)};
    bool v6 = listener.fd >= 0;
    if (!v6) listener.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener.fd < 0) return Status::IoError(std::string("socket: ") + std::strerror(errno));
    const int one = 1, zero = 0;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      ::setsockopt(listener.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // v4 too
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(uint16_t(o_.port));
      rc = ::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(uint16_t(o_.port));
      rc = ::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0 || ::listen(listener.fd, world) != 0)
      return Status::IoError("cannot listen on port " + std::to_string(o_.port) + ": " +
                             std::strerror(errno));
    std::vector<bool> seen(world, false);
    for (int served = 1; served < world;) {
      FORGE_RETURN_IF_ERROR(
          PollFor(listener.fd, POLLIN, deadline,
                  "waiting for " + std::to_string(world - served) + " rank(s) to connect"));
      Fd c{::accept(listener.fd, nullptr, nullptr)};
      if (c.fd < 0) continue;
      char hello[12];
      if (!RecvAll(c.fd, hello, sizeof hello, deadline).ok()) continue;  // not one of ours
      int32_t peer_rank, peer_world;
      std::memcpy(&peer_rank, hello + 4, 4);
      std::memcpy(&peer_world, hello + 8, 4);
      if (std::memcmp(hello, kHello, 4) != 0) continue;
      if (peer_world != world || peer_rank <= 0 || peer_rank >= world) {
        char reject[4 + 128] = {};
        std::memcpy(reject, kReject, 4);
        (void)SendAll(c.fd, reject, sizeof reject, deadline);
        return Status::Invalid("rank " + std::to_string(peer_rank) + " connected with world " +
                               std::to_string(peer_world) + ", expected world " +
                               std::to_string(world));
      }
      char reply[4 + 128];
      std::memcpy(reply, kReply, 4);
      std::memcpy(reply + 4, id.data(), 128);
      FORGE_RETURN_IF_ERROR(SendAll(c.fd, reply, sizeof reply, deadline));
      if (!seen[peer_rank]) {
        seen[peer_rank] = true;
        ++served;
      }
    }
    return Status::Ok();
  }

  Status Fetch(int rank, int world, UniqueIdBytes* id, Clock::time_point deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(o_.port);
    for (int attempt = 0;; ++attempt) {
      addrinfo* res = nullptr;
      const int g = ::getaddrinfo(o_.host.c_str(), port.c_str(), &hints, &res);
      if (g != 0) return Status::Invalid("cannot resolve " + o_.host + ": " + gai_strerror(g));
      Fd s;
      for (addrinfo* a = res; a != nullptr && s.fd < 0; a = a->ai_next) {
        s.fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (s.fd >= 0 && ::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
          ::close(s.fd);
          s.fd = -1;
        }
      }
      ::freeaddrinfo(res);
      if (s.fd >= 0) {
        char hello[12];
        const int32_t r = rank, w = world;
        std::memcpy(hello, kHello, 4);
        std::memcpy(hello + 4, &r, 4);
        std::memcpy(hello + 8, &w, 4);
        char reply[4 + 128];
        Status st = SendAll(s.fd, hello, sizeof hello, deadline);
        if (st.ok()) st = RecvAll(s.fd, reply, sizeof reply, deadline);
        if (st.ok() && std::memcmp(reply, kReject, 4) == 0)
          st = Status::Invalid("rank 0 rejected this rank (world size or rank mismatch)");
        else if (st.ok() && std::memcmp(reply, kReply, 4) != 0)
          st = Status::DataLoss("unexpected reply from rank 0");
        if (st.ok()) {
          std::memcpy(id->data(), reply + 4, 128);
          return Status::Ok();
        }
        if (st.code() == Code::kInvalidArgument || st.code() == Code::kDataLoss) return st;
      }
      // Rank 0 is not listening yet (or went away mid-way): retry until the deadline.
      if (SecondsLeft(deadline) <= 0)
        return Status::Unavailable("timed out connecting to rank 0 (" +
                                   std::to_string(attempt + 1) + " attempts)");
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * (attempt + 1), 500)));
    }
  }

  TcpRendezvousOptions o_;
};

// Broadcast from rank 0 over a communicator the ranks already share (128 bytes as 64 bf16
// words: a bit-exact copy, no arithmetic).
class CommRendezvous final : public IdRendezvous {
 public:
  explicit CommRendezvous(Comm* comm) : comm_(comm) {}
  Status Exchange(int, int, UniqueIdBytes* id) override {
    return BroadcastBlocking(comm_, id->data(), int64_t(id->size() / 2), DType::kBF16, 0,
                             "NCCL id");
  }

 private:
  Comm* comm_;
};

}  // namespace

std::unique_ptr<IdRendezvous> MakeCommRendezvous(Comm* comm) {
  return std::make_unique<CommRendezvous>(comm);
}

std::unique_ptr<IdRendezvous> MakeMpiRendezvous() { return std::make_unique<MpiRendezvous>(); }

StatusOr<TcpRendezvousOptions> TcpRendezvousOptionsFromEnv() {
  TcpRendezvousOptions o;
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') o.host = a;
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') {
    char* end = nullptr;
    const long port = std::strtol(p, &end, 10);
    if (*end != '\0' || port <= 0 || port > 65535)
      return Status::Invalid(std::string("MASTER_PORT: expected a port number, got \"") + p + "\"");
    o.port = static_cast<int>(port);
  }
  return o;
}

std::unique_ptr<IdRendezvous> MakeTcpRendezvous(const TcpRendezvousOptions& options) {
  return std::make_unique<TcpRendezvous>(options);
}

StatusOr<std::unique_ptr<IdRendezvous>> RendezvousForLaunch(const LaunchInfo& launch,
                                                            double timeout_s) {
  if (launch.kind == LaunchKind::kMpi) return MakeMpiRendezvous();
  FORGE_ASSIGN_OR_RETURN(TcpRendezvousOptions o, TcpRendezvousOptionsFromEnv());
  o.timeout_s = timeout_s;
  return MakeTcpRendezvous(o);
}

}  // namespace forge
