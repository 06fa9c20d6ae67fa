// Loss spikes in the training loop (one process, CPU backend, tiny model) on a learnable
// stream ("previous token + 1") with windows of sequences counting the other way, which the
// trained model gets badly wrong:
//   - one such step is skipped (weights and moments as before it) and counted;
//   - spike_max_in_row of them in a row roll the run back to its last committed checkpoint and
//     leave their data out: the run ends bitwise where a run on a stream without that window
//     ends (an independent reading of "skip the window");
//   - a run interrupted inside a row of spikes and resumed decides as the uninterrupted one.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "checkpoint_test_util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using ckpt_test::FreshDir;

RunConfig Config() {
  RunConfig c;
  c.seed = 5;
  c.model = test::TinyCpuModel(16);
  c.batch.micro_batch = 2;
  c.batch.global_batch = 4;  // step s reads cursors 4(s-1) .. 4s-1 (without skips)
  c.optimizer.lr = 1e-2f;
  c.optimizer.grad_clip = 1.0f;
  c.schedule.total_steps = 30;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 0;
  c.eval.batches = 1;
  c.train.log_every = 1;
  c.train.spike_sigma = 6.0;
  c.train.spike_window = 8;
  c.train.spike_max_in_row = 3;
  c.checkpoint.every_steps = 5;
  return c;
}

// Sequence q counts up from a hashed start; inside `bad` ranges it counts down. `shift`
// moves cursors at or past `shift_from` by `shift_by` (a stream with a window taken out).
struct Stream {
  std::vector<std::pair<int64_t, int64_t>> bad;
  int64_t shift_from = -1, shift_by = 0;
};

BatchProvider Data(const RunConfig& c, Stream s) {
  auto down = [bad = s.bad](int64_t q) {
    for (const auto& [from, to] : bad)
      if (q >= from && q < to) return true;
    return false;
  };
  auto shift = [s](int64_t cursor) {
    return s.shift_from >= 0 && cursor >= s.shift_from ? cursor + s.shift_by : cursor;
  };
  return test::CountingData(c, c.model.vocab, down, shift);
}

test::RunOutcome Train(const RunConfig& c, Stream s, TrainOptions opt = {}) {
  auto backend = MakeCpuBackend(c);
  return test::TrainKeepingState(c, backend.get(), Data(c, std::move(s)), std::move(opt));
}

bool SameBits(const UnitBuffers& a, const UnitBuffers& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() ||
        std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0)
      return false;
  return true;
}

const StepRecord* Record(const test::RunOutcome& r, int64_t step, int nth = 0) {
  for (const StepRecord& x : r.records)
    if (x.step == step && nth-- == 0) return &x;
  return nullptr;
}

TEST(TrainerSpikes, OneSpikeIsSkippedAndCounted) {
  RunConfig c = Config();
  c.checkpoint.dir = FreshDir("spike_one") + "/ckpt";
  const Stream s{{{4 * 19, 4 * 20}}};  // step 20 only
  const test::RunOutcome run = Train(c, s);
  EXPECT_EQ(run.result.steps, 30);
  EXPECT_EQ(run.result.loss_spikes, 1);
  EXPECT_EQ(run.result.skipped_steps, 1);
  EXPECT_EQ(run.result.spike_rollbacks, 0);
  const StepRecord* r20 = Record(run, 20);
  ASSERT_NE(r20, nullptr);
  EXPECT_TRUE(r20->loss_spike);
  EXPECT_EQ(r20->data_cursor, 76);
  EXPECT_EQ(r20->loss_spikes, 1);
  EXPECT_FALSE(r20->rollback);
  ASSERT_EQ(r20->events.size(), 1u);
  EXPECT_NE(r20->events[0].find("loss spike at step 20 (data cursor 76)"), std::string::npos)
      << r20->events[0];
  const StepRecord* r19 = Record(run, 19);
  ASSERT_NE(r19, nullptr);
  EXPECT_GT(r20->loss, 2.0f * r19->loss) << "the reversed window is no spike for this model";
  for (const StepRecord& x : run.records) EXPECT_EQ(x.loss_spike, x.step == 20) << x.step;

  // The skipped step changed nothing: stopping after it equals stopping before it.
  RunConfig c19 = c, c20 = c;
  c19.checkpoint.dir = FreshDir("spike_one_19") + "/ckpt";
  c20.checkpoint.dir = FreshDir("spike_one_20") + "/ckpt";
  TrainOptions o19, o20;
  o19.max_steps = 19;
  o20.max_steps = 20;
  const test::RunOutcome a = Train(c19, s, o19), b = Train(c20, s, o20);
  EXPECT_TRUE(SameBits(a.w, b.w));
  EXPECT_TRUE(SameBits(a.m, b.m) && SameBits(a.v, b.v));
}

TEST(TrainerSpikes, SpikesInARowRollBackAndLeaveTheirDataOut) {
  RunConfig c = Config();
  const std::string dir = FreshDir("spike_row");
  c.checkpoint.dir = dir + "/ckpt";
  TrainOptions opt;
  opt.metrics_path = dir + "/metrics.jsonl";
  const test::RunOutcome run = Train(c, Stream{{{80, 92}}}, opt);  // steps 21, 22, 23
  EXPECT_EQ(run.result.steps, 30);
  EXPECT_EQ(run.result.loss_spikes, 3);
  EXPECT_EQ(run.result.spike_rollbacks, 1);
  const StepRecord* r23 = Record(run, 23);
  ASSERT_NE(r23, nullptr);
  EXPECT_TRUE(r23->loss_spike && r23->rollback);
  EXPECT_EQ(r23->rollback_to_step, 20);
  EXPECT_EQ(r23->skip_from, 80);
  EXPECT_EQ(r23->skip_to, 92);
  ASSERT_EQ(r23->events.size(), 2u);
  EXPECT_NE(r23->events[0].find("loss spike at step 23 (data cursor 88)"), std::string::npos)
      << r23->events[0];
  EXPECT_NE(r23->events[1].find("3 loss spikes in a row (steps 21-23): rolled back to checkpoint "
                                "step_20, leaving out data cursors [80, 92)"),
            std::string::npos)
      << r23->events[1];
  // After the rollback the records go on from step 21, reading past the window.
  const StepRecord* again = Record(run, 21, 1);
  ASSERT_NE(again, nullptr);
  EXPECT_FALSE(again->loss_spike);
  EXPECT_EQ(again->data_cursor, 92);

  // The independent reading: the same run on a stream that never had the window (cursors
  // from 80 on shifted by 12) ends bitwise the same.
  RunConfig rc = Config();
  rc.checkpoint.dir = FreshDir("spike_row_ref") + "/ckpt";
  const test::RunOutcome ref = Train(rc, Stream{{}, 80, 12});
  EXPECT_EQ(ref.result.loss_spikes, 0);
  EXPECT_TRUE(SameBits(run.w, ref.w)) << "weights differ from the run without the window";
  EXPECT_TRUE(SameBits(run.m, ref.m) && SameBits(run.v, ref.v));
  auto last = LoadFullCheckpoint(c.checkpoint.dir + "/step_30");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->trainer.data_cursor, 30 * 4 + 12);

  // metrics.jsonl: the three spikes, the rollback, then step 21 again.
  std::ifstream in(opt.metrics_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  size_t at = lines.size();
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].find("\"rollback_to_step\":20,\"skip_from\":80,\"skip_to\":92") !=
        std::string::npos)
      at = i;
  ASSERT_LT(at + 1, lines.size());
  EXPECT_EQ(lines[at].rfind("{\"step\":23,", 0), 0u) << lines[at];
  EXPECT_NE(lines[at].find("\"loss_spike\":true,\"data_cursor\":88"), std::string::npos);
  EXPECT_EQ(lines[at + 1].rfind("{\"step\":21,", 0), 0u) << lines[at + 1];
  EXPECT_EQ(lines.size(), 30u + 3u);
}

TEST(TrainerSpikes, ResumeInsideARowDecidesAsTheUninterruptedRun) {
  RunConfig c = Config();
  c.checkpoint.every_steps = 2;
  const Stream s{{{80, 92}}};
  c.checkpoint.dir = FreshDir("spike_whole") + "/ckpt";
  const test::RunOutcome whole = Train(c, s);
  EXPECT_EQ(whole.result.spike_rollbacks, 1);
  const StepRecord* r23 = Record(whole, 23);
  ASSERT_NE(r23, nullptr);
  EXPECT_EQ(r23->rollback_to_step, 22);  // saved inside the row: its weights are step 20's

  RunConfig p = c;
  p.checkpoint.dir = FreshDir("spike_parts") + "/ckpt";
  TrainOptions first;
  first.max_steps = 22;  // two spikes in, saved at step 22
  const test::RunOutcome a = Train(p, s, first);
  EXPECT_EQ(a.result.loss_spikes, 2);
  p.checkpoint.resume = "latest";
  const test::RunOutcome b = Train(p, s);
  EXPECT_EQ(b.result.loss_spikes, 1);
  EXPECT_EQ(b.result.spike_rollbacks, 1);
  const StepRecord* b23 = Record(b, 23);
  ASSERT_NE(b23, nullptr);
  EXPECT_TRUE(b23->rollback);
  EXPECT_EQ(b23->skip_from, 80);
  EXPECT_EQ(b23->skip_to, 92);
  EXPECT_TRUE(SameBits(b.w, whole.w)) << "the resumed run ends elsewhere";
  EXPECT_TRUE(SameBits(b.m, whole.m) && SameBits(b.v, whole.v));
}

}  // namespace
}  // namespace forge
