// The TCP rendezvous that hands rank 0's NCCL unique id to the other ranks (used when there is
// no MPI): every rank gets the same bytes, late servers are waited for, and a missing or
// mismatched peer is an error, not a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "../common/port_reservation.h"
#include "worker/parallel/rendezvous.h"

namespace forge {
namespace {

// Options on a port held for this test (rank 0 binds it; see port_reservation.h).
TcpRendezvousOptions Options(double timeout_s, const test::PortReservation& port) {
  TcpRendezvousOptions o;
  o.host = "127.0.0.1";
  o.port = port.port();
  o.timeout_s = timeout_s;
  return o;
}

TEST(TcpRendezvous, EveryRankGetsRankZerosId) {
  const test::PortReservation port;
  const TcpRendezvousOptions o = Options(20, port);
  const int world = 4;
  std::vector<UniqueIdBytes> ids(world);
  for (int i = 0; i < 128; ++i) ids[0][i] = char(i * 7 + 1);
  std::vector<Status> st(world);
  std::vector<std::thread> threads;
  for (int r = world - 1; r >= 0; --r) {  // clients first: they must retry until rank 0 listens
    threads.emplace_back([&, r] { st[r] = MakeTcpRendezvous(o)->Exchange(r, world, &ids[r]); });
    if (r > 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
    EXPECT_EQ(ids[r], ids[0]) << "rank " << r;
  }
}

TEST(TcpRendezvous, NoServerTimesOutNamingRankAndAddress) {
  const test::PortReservation port;
  const TcpRendezvousOptions o = Options(0.3, port);
  UniqueIdBytes id{};
  const auto t0 = std::chrono::steady_clock::now();
  Status s = MakeTcpRendezvous(o)->Exchange(1, 2, &id);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("rank 1 of 2"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("127.0.0.1:" + std::to_string(o.port)), std::string::npos);
  EXPECT_LT(secs, 5.0);
}

TEST(TcpRendezvous, MissingClientTimesOutOnRankZero) {
  const test::PortReservation port;
  const TcpRendezvousOptions o = Options(0.3, port);
  UniqueIdBytes id{};
  Status s = MakeTcpRendezvous(o)->Exchange(0, 3, &id);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("waiting for 2 rank(s)"), std::string::npos) << s.ToString();
}

TEST(TcpRendezvous, WorldMismatchIsAnError) {
  const test::PortReservation port;
  const TcpRendezvousOptions o = Options(5, port);
  UniqueIdBytes id0{}, id1{};
  Status server, client;
  std::thread t([&] { server = MakeTcpRendezvous(o)->Exchange(0, 2, &id0); });
  client = MakeTcpRendezvous(o)->Exchange(1, 3, &id1);
  t.join();
  EXPECT_FALSE(server.ok());
  EXPECT_NE(server.message().find("expected world 2"), std::string::npos) << server.ToString();
  EXPECT_FALSE(client.ok());
}

TEST(TcpRendezvous, OneRankNeedsNoNetwork) {
  UniqueIdBytes id{};
  id[0] = 42;
  const test::PortReservation port;
  EXPECT_TRUE(MakeTcpRendezvous(Options(0.1, port))->Exchange(0, 1, &id).ok());
  EXPECT_EQ(id[0], 42);
}

TEST(TcpRendezvous, LaunchWithoutMpiUsesMasterAddrAndPort) {
  const test::PortReservation port;
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port.port()).c_str(), 1);
  LaunchInfo launch;
  launch.kind = LaunchKind::kTorchrun;
  launch.world = 2;
  UniqueIdBytes id0{}, id1{};
  id0[5] = 9;
  auto r0 = RendezvousForLaunch(launch, 10);
  auto r1 = RendezvousForLaunch(launch, 10);
  ASSERT_TRUE(r0.ok() && r1.ok());
  Status s0;
  std::thread t([&] { s0 = (*r0)->Exchange(0, 2, &id0); });
  Status s1 = (*r1)->Exchange(1, 2, &id1);
  t.join();
  EXPECT_TRUE(s0.ok()) << s0.ToString();
  EXPECT_TRUE(s1.ok()) << s1.ToString();
  EXPECT_EQ(id1[5], 9);
  ::setenv("MASTER_PORT", "not-a-port", 1);
  EXPECT_FALSE(RendezvousForLaunch(launch, 10).ok());
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace forge
