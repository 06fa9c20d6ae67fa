// The coordinator's pieces that need no network: the SQLite run store (survives reopening; a
// store of an older schema gains the new columns), placement, path confinement and the
// constant-time token compare.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sqlite3.h>

#include <filesystem>

#include "coordinator/run_paths.h"
#include "coordinator/run_store.h"
#include "coordinator/scheduler.h"
#include "rpc/auth.h"

namespace forge::coord {
namespace {

std::string TempDb(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/forge_store_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + ".db";
  std::filesystem::remove(path);
  return path;
}

TEST(RunStore, EverythingSurvivesReopening) {
  const std::string path = TempDb("reopen");
  {
    auto store = RunStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    RunRecord r;
    r.id = "a-1";
    r.name = "a";
    r.state = RunState::kRunning;
    r.spec_yaml = "name: a\n";
    r.workers = 2;
    r.attempt = 1;
    ASSERT_TRUE((*store)->InsertRun(&r).ok());
    r.step = 17;
    r.reason = "x";
    ASSERT_TRUE((*store)->UpdateRun(r).ok());
    EventRecord e{0, "a-1", 5, RunState::kRunning, "placed"};
    ASSERT_TRUE((*store)->AppendEvent(e).ok());
    MetricRecord m;
    m.run_id = "a-1";
    m.step = 3;
    m.loss = 2.5f;
    ASSERT_TRUE((*store)->PutMetrics(&m).ok());
    m.loss = 2.25f;  // the same step again (a restart redid it): replaces
    ASSERT_TRUE((*store)->PutMetrics(&m).ok());
    ASSERT_TRUE((*store)->PutCheckpoint({"a-1", 4, "/x/step_4", 2, 100, 9}).ok());
    ASSERT_TRUE((*store)->PutCheckpoint({"a-1", 8, "/x/step_8", 2, 100, 10, "{\"cursor\":64}"}).ok());
    ASSERT_TRUE((*store)->PutShardReport("a-1", 1, 8, 0, "{r0}").ok());
    WorkerRecord w;
    w.id = "w0";
    w.group_id = "g";
    w.group_size = 2;
    w.run_id = "a-1";
    w.attempt = 1;
    ASSERT_TRUE((*store)->PutWorker(w).ok());
  }
  auto store = RunStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto run = (*store)->GetRun("a-1");
  ASSERT_TRUE(run.ok() && run->has_value());
  EXPECT_EQ((*run)->step, 17);
  EXPECT_EQ((*run)->state, RunState::kRunning);
  EXPECT_EQ((*run)->workers, 2);
  EXPECT_EQ((*run)->reason, "x");
  auto events = (*store)->EventsAfter("a-1", 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].message, "placed");
  auto metrics = (*store)->MetricsAfter("a-1", 0);
  ASSERT_TRUE(metrics.ok());
  ASSERT_EQ(metrics->size(), 1u);
  EXPECT_EQ((*metrics)[0].loss, 2.25f);
  auto cks = (*store)->Checkpoints("a-1");
  ASSERT_TRUE(cks.ok());
  ASSERT_EQ(cks->size(), 2u);
  EXPECT_EQ((*cks)[0].dir, "/x/step_4");
  EXPECT_EQ((*cks)[0].data, "");  // no data record
  EXPECT_EQ((*cks)[1].data, "{\"cursor\":64}");
  auto reports = (*store)->ShardReports("a-1", 1, 8);
  ASSERT_TRUE(reports.ok());
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ((*reports)[0].second, "{r0}");
  auto workers = (*store)->Workers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].run_id, "a-1");
  EXPECT_FALSE((*store)->GetRun("nope")->has_value());
}

// A store written before checkpoints had data records gains the column; old rows read "".
TEST(RunStore, OldCheckpointsTableGainsTheDataColumn) {
  const std::string path = TempDb("old_checkpoints");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE checkpoints (run_id TEXT, step INTEGER, dir TEXT, "
                           "world INTEGER, bytes INTEGER, committed_ms INTEGER, "
                           "PRIMARY KEY(run_id, step));"
                           "INSERT INTO checkpoints VALUES ('o-1', 2, '/o/step_2', 1, 5, 6);",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = RunStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->PutCheckpoint({"o-1", 4, "/o/step_4", 1, 5, 7, "{}"}).ok());
  auto cks = (*store)->Checkpoints("o-1");
  ASSERT_TRUE(cks.ok()) << cks.status().ToString();
  ASSERT_EQ(cks->size(), 2u);
  EXPECT_EQ((*cks)[0].data, "");
  EXPECT_EQ((*cks)[1].data, "{}");
}

TEST(Scheduler, LaunchGroupsArePlacedWholeAndInRankOrder) {
  std::vector<PoolWorker> idle = {{"b1", "cpu", "g", 1, 2}, {"solo", "cpu", "", 0, 1},
                                  {"b0", "cpu", "g", 0, 2}};
  Placement p = PlaceRun(idle, 2);
  EXPECT_EQ(p.worker_ids, (std::vector<std::string>{"b0", "b1"}));
  EXPECT_FALSE(p.comm_id_from_coordinator);
  // A one-worker run takes the standalone worker, never half a group.
  EXPECT_EQ(PlaceRun(idle, 1).worker_ids, (std::vector<std::string>{"solo"}));
  // Half a group present: nothing for 2.
  EXPECT_TRUE(PlaceRun({{"b1", "cpu", "g", 1, 2}, {"solo", "cpu", "", 0, 1}}, 2).worker_ids.empty());
  // No group of 4.
  EXPECT_TRUE(PlaceRun(idle, 4).worker_ids.empty());
}

TEST(Scheduler, StandaloneWorkersCombineOnlyOnGpus) {
  std::vector<PoolWorker> cpus = {{"c0", "cpu", "", 0, 1}, {"c1", "cpu", "", 0, 1}};
  EXPECT_TRUE(PlaceRun(cpus, 2).worker_ids.empty());  // CPU data parallelism needs MPI
  std::vector<PoolWorker> gpus = {{"g0", "cuda:0", "", 0, 1, "h0"},
                                  {"g1", "cuda:0", "", 0, 1, "h1"},
                                  {"g2", "cuda:1", "", 0, 1, "h0"}};
  Placement p = PlaceRun(gpus, 2);
  EXPECT_EQ(p.worker_ids, (std::vector<std::string>{"g0", "g1"}));
  EXPECT_TRUE(p.comm_id_from_coordinator);
}

TEST(Scheduler, StandaloneGpuWorkersAreRankedByHostThenGpu) {
  // In join order: the first `world` joined are taken; their ranks follow host, then GPU index
  // (cuda:10 after cuda:2), so a relaunched run has rank r on the same GPU again.
  std::vector<PoolWorker> idle = {{"b-gpu1", "cuda:1", "", 0, 1, "b"},
                                  {"a-gpu10", "cuda:10", "", 0, 1, "a"},
                                  {"a-gpu2", "cuda:2", "", 0, 1, "a"},
                                  {"b-gpu0", "cuda:0", "", 0, 1, "b"},
                                  {"a-gpu0", "cuda:0", "", 0, 1, "a"}};
  EXPECT_EQ(PlaceRun(idle, 4).worker_ids,
            (std::vector<std::string>{"a-gpu2", "a-gpu10", "b-gpu0", "b-gpu1"}));
  EXPECT_EQ(PlaceRun(idle, 5).worker_ids,
            (std::vector<std::string>{"a-gpu0", "a-gpu2", "a-gpu10", "b-gpu0", "b-gpu1"}));
  EXPECT_EQ(PlaceRun(idle, 1).worker_ids, (std::vector<std::string>{"b-gpu1"}));
}

TEST(Scheduler, TwoStandaloneWorkersOnOneGpuAreNeverCombined) {
  // A worker relaunched on GPU 0 while the old one is still in the pool.
  std::vector<PoolWorker> idle = {{"old0", "cuda:0", "", 0, 1, "h"},
                                  {"new0", "cuda:0", "", 0, 1, "h"},
                                  {"w1", "cuda:1", "", 0, 1, "h"}};
  EXPECT_EQ(PlaceRun(idle, 2).worker_ids, (std::vector<std::string>{"old0", "w1"}));
  EXPECT_TRUE(PlaceRun(idle, 3).worker_ids.empty());
  EXPECT_EQ(PlaceRun(idle, 1).worker_ids, (std::vector<std::string>{"old0"}));
}

TEST(RunPaths, ConfinedToTheirRoot) {
  EXPECT_EQ(*ResolveInside("/r", "a/b.safetensors", "o"), "/r/a/b.safetensors");
  for (const char* bad : {"", "/etc/passwd", "..", "../x", "a/../../x", "a//b", "./a", "a/.",
                          "a\\..\\b"})
    EXPECT_EQ(ResolveInside("/r", bad, "o").status().code(), Code::kInvalidArgument) << bad;
  EXPECT_EQ(*ParseCheckpointName("", "c"), -1);
  EXPECT_EQ(*ParseCheckpointName("latest", "c"), -1);
  EXPECT_EQ(*ParseCheckpointName("step_42", "c"), 42);
  for (const char* bad : {"step_", "step_1/../x", "../step_1", "/abs/step_1", "step_x", "steps_1"})
    EXPECT_FALSE(ParseCheckpointName(bad, "c").ok()) << bad;
}

TEST(Auth, ConstantTimeEqualsAndSecrets) {
  EXPECT_TRUE(rpc::ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(rpc::ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(rpc::ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(rpc::ConstantTimeEquals("", "a"));
  const std::string s = rpc::RandomSecret();
  EXPECT_EQ(s.size(), 64u);
  EXPECT_NE(s, rpc::RandomSecret());
  ::unsetenv("FORGE_TEST_SECRET_UNSET");
  EXPECT_EQ(rpc::LoadSecret("", "FORGE_TEST_SECRET_UNSET", "t").status().code(),
            Code::kInvalidArgument);
  ::setenv("FORGE_TEST_SECRET_SET", "tok\n", 1);
  EXPECT_EQ(*rpc::LoadSecret("", "FORGE_TEST_SECRET_SET", "t"), "tok");
}

}  // namespace
}  // namespace forge::coord
