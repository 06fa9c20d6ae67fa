// The training memory estimate: on the CPU backend it must agree with what the backend really
// allocates (measured with glibc's allocator statistics, not with the estimate's own formula),
// it must refuse configs whose dimensions fit an int but not any machine, naming the key, and
// it must accept the shipped presets on the hardware they are meant for.
#include "worker/train/memory_estimate.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>

#include "worker/train/backend.h"

namespace forge {
namespace {

RunConfig Small() {
  RunConfig c;
  c.model.n_layer = 3;
  c.model.d_model = 64;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn = 160;
  c.model.vocab = 300;
  c.model.seq_len = 48;
  c.batch.micro_batch = 3;
  c.batch.global_batch = 3;
  return c;
}

double AllocatedBytes() {
  const struct mallinfo2 mi = mallinfo2();
  return double(mi.uordblks) + double(mi.hblkhd);
}

TEST(MemoryEstimate, CpuEstimateMatchesWhatTheBackendAllocates) {
  for (bool qk_norm : {false, true}) {
    RunConfig c = Small();
    c.model.qk_norm = qk_norm;
    const double before = AllocatedBytes();
    std::unique_ptr<TrainBackend> backend = MakeCpuBackend(c);
    const double held = AllocatedBytes() - before;
    // Built: weights, moments and activations; the gradients come with the first step.
    const MemoryEstimate e = EstimateTrainingMemory(c, Backend::kCpu, 1);
    const double built = e.weights + e.moments + e.activations;
    EXPECT_NEAR(built, held, 0.03 * held) << "qk_norm " << qk_norm;
    // A lower bound (the allocator's count moves by a few hundred bytes of its own).
    EXPECT_LE(built, held * 1.002) << "qk_norm " << qk_norm;
  }
}

std::string Refusal(const RunConfig& c, Backend b, double available) {
  const Status s = CheckTrainingMemory(c, b, 1, available, "this host's available memory");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  return s.message();
}

TEST(MemoryEstimate, RefusesWhatFitsAnIntButNoMachineNamingTheKey) {
  const double host = 24.0 * (1 << 30);
  RunConfig layers = Small();
  layers.model.n_layer = 100000;
  layers.model.d_model = 768;
  layers.model.n_head = 12;
  layers.model.n_kv_head = 12;
  layers.model.ffn = 2048;
  std::string m = Refusal(layers, Backend::kCpu, host);
  EXPECT_NE(m.find("model.n_layer (100000)"), std::string::npos) << m;
  EXPECT_NE(m.find("24.0 GiB"), std::string::npos) << m;

  RunConfig wide = Small();
  wide.model.d_model = 1000000000;
  m = Refusal(wide, Backend::kCpu, host);
  EXPECT_NE(m.find("model.d_model (1000000000)"), std::string::npos) << m;
  m = Refusal(wide, Backend::kCuda, 80.0 * (1 << 30));
  EXPECT_NE(m.find("model.d_model (1000000000)"), std::string::npos) << m;

  RunConfig longer = Small();
  longer.model.seq_len = 2000000000;
  m = Refusal(longer, Backend::kCpu, host);
  EXPECT_NE(m.find("model.seq_len (2000000000)"), std::string::npos) << m;
  m = Refusal(longer, Backend::kCuda, 80.0 * (1 << 30));
  EXPECT_NE(m.find("model.seq_len (2000000000)"), std::string::npos) << m;

  // Products of such dimensions overflow 64-bit integers: the estimate stays finite.
  RunConfig all = wide;
  all.model.n_layer = 2000000000;
  all.model.seq_len = 2000000000;
  all.batch.micro_batch = 2000000000;
  EXPECT_TRUE(std::isfinite(EstimateTrainingMemory(all, Backend::kCpu, 1).total()));
  EXPECT_GT(EstimateTrainingMemory(all, Backend::kCpu, 1).total(), 1e30);
}

TEST(MemoryEstimate, ShippedPresetsFitTheirHardware) {
  RunConfig tiny;  // the CPU preset at the shipped config's batch
  ASSERT_TRUE(ApplyModelPreset("tiny", &tiny.model).ok());
  tiny.batch.micro_batch = 16;
  EXPECT_TRUE(CheckTrainingMemory(tiny, Backend::kCpu, 1, 2.0 * (1 << 30), "2 GiB").ok());
  for (const char* preset : {"gpt124m", "gpt350m"}) {
    RunConfig c;
    ASSERT_TRUE(ApplyModelPreset(preset, &c.model).ok());
    c.batch.micro_batch = 16;
    const Status s = CheckTrainingMemory(c, Backend::kCuda, 1, 80.0 * (1 << 30), "an H100");
    EXPECT_TRUE(s.ok()) << preset << ": " << s.ToString();
  }
  // Unknown available memory: no verdict.
  RunConfig huge = Small();
  huge.model.n_layer = 100000;
  EXPECT_TRUE(CheckTrainingMemory(huge, Backend::kCpu, 1, -1, "unknown").ok());
  EXPECT_GT(HostAvailableMemoryBytes(), 0);  // /proc/meminfo is there on Linux
}

TEST(MemoryEstimate, ShardedModesHoldLessPerRank) {
  RunConfig c = Small();
  const double ddp = EstimateTrainingMemory(c, Backend::kCuda, 4).moments;
  c.parallel.mode = ParallelMode::kZero1;
  EXPECT_NEAR(EstimateTrainingMemory(c, Backend::kCuda, 4).moments, ddp / 4, 1e-6 * ddp);
  c.parallel.mode = ParallelMode::kFsdp;
  EXPECT_LT(EstimateTrainingMemory(c, Backend::kCuda, 4).weights,
            EstimateTrainingMemory(c, Backend::kCuda, 1).weights);
}

// hsdp shards over its shard group only: on 8 ranks in groups of 2 a rank holds what fsdp on 2
// ranks holds; groups of 1 hold ddp's state, a group of the whole world fsdp's.
TEST(MemoryEstimate, HsdpHoldsItsShardGroupsShare) {
  RunConfig c = Small();
  for (Backend b : {Backend::kCuda, Backend::kCpu}) {
    RunConfig fsdp = c;
    fsdp.parallel.mode = ParallelMode::kFsdp;
    RunConfig ddp = c;
    RunConfig hsdp = c;
    hsdp.parallel.mode = ParallelMode::kHsdp;
    hsdp.parallel.shard_group_size = 2;
    EXPECT_EQ(EstimateTrainingMemory(hsdp, b, 8).total(),
              EstimateTrainingMemory(fsdp, b, 2).total());
    hsdp.parallel.shard_group_size = 1;
    EXPECT_EQ(EstimateTrainingMemory(hsdp, b, 8).moments,
              EstimateTrainingMemory(ddp, b, 8).moments);
    EXPECT_EQ(EstimateTrainingMemory(hsdp, b, 8).weights,
              EstimateTrainingMemory(ddp, b, 8).weights);
    hsdp.parallel.shard_group_size = 8;
    EXPECT_EQ(EstimateTrainingMemory(hsdp, b, 8).total(),
              EstimateTrainingMemory(fsdp, b, 8).total());
  }
}

}  // namespace
}  // namespace forge
