// MetricsServer under clients that do not behave: idle connections that never send a request,
// more of them than the server keeps open, and a client that sends half a head. Real sockets
// on loopback; a scrape must be answered at once whatever the others do.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <chrono>
#include <thread>
#include <vector>

#include "../common/http_get.h"
#include "metrics/metrics_server.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

// A connected loopback socket that sends `bytes` and then nothing.
int OpenIdle(int port, const std::string& bytes = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  if (!bytes.empty()) (void)::send(fd, bytes.data(), bytes.size(), 0);
  return fd;
}

// Whether the server closed `fd` (recv sees end of stream) within limit_ms.
bool ClosedByServer(int fd, int limit_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, limit_ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = MetricsServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus::BuildGauge().Name("forge_test_value").Help("test").Register(*registry_).Add({}).Set(42);
    server_->Register(registry_);
  }
  void TearDown() override {
    for (int fd : idle_) ::close(fd);
  }
  // One scrape: its status and how long it took.
  std::pair<int, double> TimedScrape() {
    const auto t0 = Clock::now();
    const test::HttpResponse r = test::HttpGet(server_->port(), "/metrics");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.status == 200) EXPECT_NE(r.body.find("forge_test_value 42"), std::string::npos) << r.body;
    return {r.status, s};
  }

  std::unique_ptr<MetricsServer> server_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<int> idle_;
};

TEST_F(MetricsServerTest, IdleConnectionsDoNotDelayAScrape) {
  // Eight that never send a request, and two that send half a head.
  for (int i = 0; i < 8; ++i) idle_.push_back(OpenIdle(server_->port()));
  for (int i = 0; i < 2; ++i) idle_.push_back(OpenIdle(server_->port(), "GET /metr"));
  for (int fd : idle_) ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    const auto [status, seconds] = TimedScrape();
    EXPECT_EQ(status, 200);
    EXPECT_LT(seconds, 0.5) << "scrape " << i << " waited behind idle connections";
  }
  // Each idle connection is closed once its time for a request head is up.
  for (int fd : idle_)
    EXPECT_TRUE(ClosedByServer(fd, MetricsServer::kHeadTimeoutMs + 1500))
        << "an idle connection was kept open past the head timeout";
}

TEST_F(MetricsServerTest, MoreIdleConnectionsThanTheLimitStillLetAScrapeIn) {
  for (int i = 0; i < MetricsServer::kMaxConnections + 20; ++i) {
    const int fd = OpenIdle(server_->port());
    ASSERT_GE(fd, 0);
    idle_.push_back(fd);
  }
  const auto [status, seconds] = TimedScrape();
  EXPECT_EQ(status, 200);
  EXPECT_LT(seconds, 0.5);
  // The oldest idle ones made room: closed long before their head timeout.
  EXPECT_TRUE(ClosedByServer(idle_.front(), 500));
}

TEST_F(MetricsServerTest, ConcurrentScrapesAllAnswered) {
  std::vector<std::thread> scrapers;
  std::vector<int> status(16, 0);
  for (int i = 0; i < 16; ++i)
    scrapers.emplace_back([&, i] { status[i] = test::HttpGet(server_->port(), "/metrics").status; });
  for (auto& t : scrapers) t.join();
  for (int s : status) EXPECT_EQ(s, 200);
  EXPECT_EQ(test::HttpGet(server_->port(), "/nope").status, 404);
}

}  // namespace
}  // namespace forge
