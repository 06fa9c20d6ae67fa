// Checkpoints in the training loop (one process, CPU backend, tiny model): a run interrupted
// and resumed is bitwise the uninterrupted one (weights, AdamW moments, losses, the checkpoint
// it writes), a stop request commits a checkpoint at the next step boundary, a damaged latest
// checkpoint makes resume fall back with a warning, retention keeps the right directories.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "checkpoint_test_util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using ckpt_test::Contains;
using ckpt_test::FreshDir;

RunConfig TinyConfig() {
  RunConfig c;
  c.seed = 11;
  c.model = test::TinyCpuModel(16);
  c.batch.micro_batch = 2;
  c.batch.global_batch = 4;  // two micro-steps of accumulation
  c.optimizer.lr = 1e-2f;
  c.optimizer.grad_clip = 0.5f;
  c.schedule.total_steps = 6;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 3;
  c.eval.batches = 2;
  c.train.log_every = 1;
  c.checkpoint.every_steps = 2;
  return c;
}

BatchProvider Data(const RunConfig& c) { return test::HashedTokenData(c, 12345u, 100000); }

using test::RunOutcome;

RunOutcome Train(const RunConfig& c, TrainOptions opt = {}) {
  auto backend = MakeCpuBackend(c);
  return test::TrainKeepingState(c, backend.get(), Data(c), std::move(opt));
}

bool SameBits(const UnitBuffers& a, const UnitBuffers& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u)
    if (!ckpt_test::SameBits(a[u], b[u])) return false;
  return true;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// The records of `got` equal those of `want` for steps first..last (loss, norm, lr, val loss).
void ExpectSameRecords(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want,
                       int64_t first, int64_t last = INT64_MAX) {
  std::vector<const StepRecord*> w;
  for (const auto& r : want)
    if (r.step >= first && r.step <= last) w.push_back(&r);
  ASSERT_EQ(got.size(), w.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(got[i].step));
    EXPECT_EQ(got[i].step, w[i]->step);
    EXPECT_TRUE(SameBits(got[i].loss, w[i]->loss)) << got[i].loss << " vs " << w[i]->loss;
    EXPECT_TRUE(SameBits(got[i].grad_norm, w[i]->grad_norm));
    EXPECT_TRUE(SameBits(got[i].lr, w[i]->lr));
    EXPECT_TRUE(SameBits(got[i].val_loss, w[i]->val_loss));
  }
}

void ExpectSameFinalState(const RunOutcome& got, const RunOutcome& want) {
  EXPECT_TRUE(SameBits(got.w, want.w)) << "weights differ";
  EXPECT_TRUE(SameBits(got.m, want.m)) << "first moments differ";
  EXPECT_TRUE(SameBits(got.v, want.v)) << "second moments differ";
}

std::vector<int64_t> Steps(const std::string& root) {
  std::vector<int64_t> out;
  for (const auto& e : ListCheckpoints(root)) out.push_back(e.step);
  return out;
}

// The uninterrupted 6-step run with checkpoints at 2, 4, 6, computed once.
const RunOutcome& Reference() {
  static const RunOutcome* ref = [] {
    RunConfig c = TinyConfig();
    c.checkpoint.dir = FreshDir("reference");
    return new RunOutcome(Train(c));
  }();
  return *ref;
}

TEST(TrainerCheckpoint, ResumedRunIsBitwiseTheUninterruptedOne) {
  const RunOutcome& ref = Reference();
  ASSERT_EQ(ref.result.steps, 6);
  EXPECT_EQ(ref.result.checkpoints, (std::vector<int64_t>{2, 4, 6}));
  // Every commit shows up in the records, with its cost. A save whose background write
  // outlasts the steps to the next save commits together with it and is folded into that
  // record (checkpoints_committed 2), so which steps appear depends on timing; the count does not.
  std::set<int64_t> reported;
  int committed = 0;
  for (const StepRecord& r : ref.records) {
    if (r.checkpoint_step < 0) continue;
    reported.insert(r.checkpoint_step);
    committed += r.checkpoints_committed;
    EXPECT_GE(r.checkpoints_committed, 1);
    EXPECT_GE(r.step, r.checkpoint_step);
    EXPECT_GT(r.checkpoint_bytes, 0u);
    EXPECT_GE(r.checkpoint_blocked_s, 0.0);
    EXPECT_GT(r.checkpoint_write_s, 0.0);
    EXPECT_GT(r.checkpoint_bytes_per_s, 0.0);
  }
  EXPECT_EQ(committed, 3);
  EXPECT_TRUE(reported.count(6));
  for (int64_t st : reported) EXPECT_TRUE(st == 2 || st == 4 || st == 6) << st;

  // Interrupted after step 3 (an end-of-run save off the every_steps grid), then resumed.
  RunConfig c = TinyConfig();
  const std::string dir = FreshDir("resume");
  c.checkpoint.dir = dir + "/ckpt";
  TrainOptions first;
  first.max_steps = 3;
  first.metrics_path = dir + "/metrics.jsonl";
  const RunOutcome a = Train(c, first);
  EXPECT_EQ(a.result.steps, 3);
  EXPECT_EQ(a.result.checkpoints, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a.records.size(), 3u);
  ExpectSameRecords(a.records, ref.records, 1, 3);
  // A crashed continuation had logged step 4 already: the resumed run drops that record.
  { std::ofstream(first.metrics_path, std::ios::app) << "{\"step\":4,\"loss\":9.0}\n"; }

  c.checkpoint.resume = "latest";
  TrainOptions second;
  second.metrics_path = first.metrics_path;
  const RunOutcome b = Train(c, second);
  EXPECT_EQ(b.result.resumed_step, 3);
  EXPECT_TRUE(Contains(b.result.resumed_from, "step_3"));
  EXPECT_LT(b.result.initial_val_loss, 0.0f);  // no evaluation before the first step
  EXPECT_EQ(b.result.steps, 6);
  EXPECT_EQ(b.result.checkpoints, (std::vector<int64_t>{4, 6}));
  ExpectSameRecords(b.records, ref.records, 4);
  ExpectSameFinalState(b, ref);
  EXPECT_TRUE(SameBits(b.result.final_val_loss, ref.result.final_val_loss));

  // The checkpoint the resumed run wrote at step 6 is the uninterrupted run's step_6, bitwise.
  const ParamLayout layout = MakeParamLayout(c.model);
  auto x = LoadFullCheckpoint(c.checkpoint.dir + "/step_6", &layout);
  auto y = LoadFullCheckpoint(ckpt_test::BaseDir() + "/reference/step_6", &layout);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_TRUE(SameBits(x->master, y->master) && SameBits(x->m, y->m) && SameBits(x->v, y->v));
  EXPECT_EQ(x->trainer.data_cursor, 6 * c.batch.global_batch);
  EXPECT_EQ(x->trainer.data_cursor, y->trainer.data_cursor);

  // The metrics file holds steps 1..6 once each, the same losses as the uninterrupted run.
  std::ifstream in(first.metrics_path);
  std::string line;
  std::vector<int64_t> steps;
  while (std::getline(in, line)) {
    steps.push_back(std::atoll(line.c_str() + std::strlen("{\"step\":")));
    char want[64];
    std::snprintf(want, sizeof want, "\"loss\":%.6f", ref.records[steps.size() - 1].loss);
    EXPECT_TRUE(Contains(line, want)) << line << " lacks " << want;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(TrainerCheckpoint, StopRequestCommitsACheckpointAtTheNextStepBoundary) {
  const RunOutcome& ref = Reference();
  RunConfig c = TinyConfig();
  c.checkpoint.every_steps = 0;  // only the stop saves
  c.checkpoint.dir = FreshDir("stop");
  std::atomic<bool> stop{false};
  TrainOptions opt;
  opt.stop_requested = &stop;
  opt.on_step = [&stop](const StepRecord& r) {
    if (r.step == 2) stop = true;  // arrives during step 2's record: seen after step 3
  };
  const RunOutcome a = Train(c, opt);
  EXPECT_TRUE(a.result.stopped);
  EXPECT_EQ(a.result.steps, 3);
  EXPECT_EQ(a.result.checkpoints, (std::vector<int64_t>{3}));
  EXPECT_EQ(Steps(c.checkpoint.dir), (std::vector<int64_t>{3}));
  ASSERT_EQ(a.records.size(), 3u);
  EXPECT_EQ(a.records.back().checkpoint_step, 3);

  // Continuing from it ends where the uninterrupted run does.
  c.checkpoint.resume = "latest";
  stop = false;
  TrainOptions cont;
  cont.stop_requested = &stop;
  const RunOutcome b = Train(c, cont);
  EXPECT_FALSE(b.result.stopped);
  EXPECT_EQ(b.result.resumed_step, 3);
  EXPECT_EQ(b.result.steps, 6);
  ExpectSameRecords(b.records, ref.records, 4);
  ExpectSameFinalState(b, ref);
  // every_steps 0: only a stop saves, so the finished run left step_3 alone.
  EXPECT_EQ(Steps(c.checkpoint.dir), (std::vector<int64_t>{3}));

  // A request before the first step: nothing trained, nothing saved.
  c.checkpoint.resume = "";
  c.checkpoint.dir = FreshDir("stop_early");
  stop = true;
  TrainOptions early;
  early.stop_requested = &stop;
  const RunOutcome e = Train(c, early);
  EXPECT_TRUE(e.result.stopped);
  EXPECT_EQ(e.result.steps, 0);
  EXPECT_TRUE(e.records.empty());
  EXPECT_TRUE(Steps(c.checkpoint.dir).empty());
}

TEST(TrainerCheckpoint, DamagedLatestCheckpointFallsBackWithAWarning) {
  const RunOutcome& ref = Reference();
  RunConfig c = TinyConfig();
  c.checkpoint.dir = FreshDir("damaged");
  TrainOptions opt;
  opt.max_steps = 4;
  Train(c, opt);
  ASSERT_EQ(Steps(c.checkpoint.dir), (std::vector<int64_t>{2, 4}));
  const std::string shard = ckpt_test::ShardPath(c.checkpoint.dir + "/step_4", 0, 1);
  ckpt_test::FlipByte(shard, std::filesystem::file_size(shard) / 2);

  // Asked for explicitly, the damaged checkpoint is an error naming the file.
  c.checkpoint.resume = "step_4";
  {
    auto backend = MakeCpuBackend(c);
    TrainOptions quiet;
    quiet.print_progress = false;
    auto r = RunTraining(c, backend.get(), Data(c), quiet);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(Contains(r.status().message(), "rank_0_of_1.shard")) << r.status().ToString();
  }

  // "latest" skips it, says so, and resumes from step_2; the damaged one is moved aside so this
  // run's own step_4 can be committed.
  c.checkpoint.resume = "latest";
  const RunOutcome b = Train(c);
  EXPECT_EQ(b.result.resumed_step, 2);
  std::string all;
  for (const auto& w : b.result.warnings) all += w + "\n";
  EXPECT_TRUE(Contains(all, "skipping damaged checkpoint")) << all;
  EXPECT_TRUE(Contains(all, "rank_0_of_1.shard")) << all;
  EXPECT_TRUE(Contains(all, "superseded")) << all;
  EXPECT_TRUE(std::filesystem::exists(c.checkpoint.dir + "/superseded/step_4/" +
                                      ShardFileName(0, 1)));
  EXPECT_EQ(Steps(c.checkpoint.dir), (std::vector<int64_t>{2, 4, 6}));
  ExpectSameRecords(b.records, ref.records, 3);
  ExpectSameFinalState(b, ref);
}

TEST(TrainerCheckpoint, RetentionKeepsTheLastAndEveryNth) {
  RunConfig c = TinyConfig();
  c.schedule.total_steps = 7;
  c.eval.every_steps = 0;
  c.checkpoint.every_steps = 1;
  c.checkpoint.keep_last = 2;
  c.checkpoint.keep_every = 3;
  c.checkpoint.dir = FreshDir("retention");
  const RunOutcome a = Train(c);
  EXPECT_EQ(a.result.checkpoints, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Steps(c.checkpoint.dir), (std::vector<int64_t>{3, 6, 7}));
  std::vector<int64_t> dirs;  // nothing incomplete left behind either
  for (const auto& e : ListStepDirs(c.checkpoint.dir)) dirs.push_back(e.step);
  EXPECT_EQ(dirs, (std::vector<int64_t>{3, 6, 7}));

  // A fresh run into a root holding another run's checkpoints refuses to start.
  auto backend = MakeCpuBackend(c);
  TrainOptions quiet;
  quiet.print_progress = false;
  auto r = RunTraining(c, backend.get(), Data(c), quiet);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status().message(), "--resume latest")) << r.status().ToString();

  // "latest" with nothing under the root starts fresh, with a note.
  c.checkpoint.dir = FreshDir("retention_empty");
  c.checkpoint.resume = "latest";
  c.checkpoint.every_steps = 0;
  const RunOutcome e = Train(c);
  EXPECT_TRUE(e.result.resumed_from.empty());
  EXPECT_EQ(e.result.steps, 7);
  ASSERT_EQ(e.result.warnings.size(), 1u);
  EXPECT_TRUE(Contains(e.result.warnings[0], "starting fresh"));
}

}  // namespace
}  // namespace forge
