// Checkpoint format: CRC combination, shard files and manifests round trip bitwise (W = 1 and
// W = 3), the commit protocol's checks, and shard reports as text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"
#include "checkpoint_test_util.h"
#include "common/crc32c_combine.h"
#include "worker/checkpoint/shard_file.h"

namespace forge {
namespace {

using namespace ckpt_test;

TEST(CheckpointFormatTest, Crc32cCombineMatchesDirect) {
  std::string data(5000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{2500}, size_t{4999},
                       size_t{5000}}) {
    const uint32_t a = Crc32c(data.data(), split);
    const uint32_t b = Crc32c(data.data() + split, data.size() - split);
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - split), Crc32c(data)) << "split " << split;
  }
}

TEST(CheckpointFormatTest, ShardFileRoundTripAndWholeFileCrc) {
  const std::string dir = FreshDir("shardfile");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 1);
  const ShardState s =
      ShardStateFromFull(layout, 1, 3, full.master, full.m, full.v, MakeTrainer(7, 70, 1));
  const std::string path = dir + "/x.shard";
  auto info = WriteShardFile(path, s);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size, fs::file_size(path));
  // The combined CRC equals a plain CRC over the file.
  auto bytes = ReadSmallFile(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(info->crc32c, Crc32c(*bytes));

  auto c = ReadShardFile(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->world, 3);
  EXPECT_EQ(c->step, 7);
  EXPECT_EQ(c->data_cursor, 70);
  EXPECT_EQ(c->rng, s.trainer.rng);
  EXPECT_EQ(c->extra, s.trainer.extra);
  EXPECT_EQ(c->info.crc32c, info->crc32c);
  ASSERT_EQ(c->ranges.size(), layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const ShardRange want = ShardOf(layout.units[u].numel, 1, 3);
    EXPECT_EQ(c->ranges[u].begin, want.begin);
    EXPECT_EQ(c->ranges[u].end, want.end);
    EXPECT_EQ(std::memcmp(c->master[u], full.master[u].data() + want.begin, 4 * want.size()), 0);
    EXPECT_EQ(std::memcmp(c->v[u], full.v[u].data() + want.begin, 4 * want.size()), 0);
  }
}

TEST(CheckpointFormatTest, SliceAndWholeUnitInputsWriteTheSameFile) {
  const std::string dir = FreshDir("slice_vs_whole");
  const ParamLayout layout = MakeParamLayout(SmallConfig().model);
  const FullState full = MakeState(layout, 2);
  ShardState whole =
      ShardStateFromFull(layout, 2, 4, full.master, full.m, full.v, MakeTrainer(1, 2, 2));
  ShardState slice = whole;
  for (UnitSlice& x : slice.units) {
    auto cut = [&](std::vector<float>& b) {
      b = std::vector<float>(b.begin() + x.begin, b.begin() + x.end);
    };
    cut(x.master);
    cut(x.m);
    cut(x.v);
  }
  auto a = WriteShardFile(dir + "/a", whole);
  auto b = WriteShardFile(dir + "/b", slice);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->crc32c, b->crc32c);
  EXPECT_EQ(*ReadSmallFile(dir + "/a"), *ReadSmallFile(dir + "/b"));
}

TEST(CheckpointFormatTest, RejectsInconsistentState) {
  const std::string dir = FreshDir("bad_state");
  const ParamLayout layout = MakeParamLayout(SmallConfig().model);
  const FullState full = MakeState(layout, 3);
  ShardState s = ShardStateFromFull(layout, 0, 2, full.master, full.m, full.v, {});
  s.units[1].m.pop_back();
  auto r = WriteShard(dir + "/step_1", s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "unit 1")) << r.status().ToString();
}

void ExpectRoundTrip(int world) {
  const std::string root = FreshDir("roundtrip_" + std::to_string(world));
  RunConfig cfg = SmallConfig(/*qk_norm=*/true);
  cfg.parallel.mode = ParallelMode::kZero1;
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 10 + world);
  const std::string dir = SaveAll(root, cfg, layout, full, world, 40, 1280);

  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(fs::exists(ShardPath(dir, r, world)));
    EXPECT_FALSE(fs::exists(ShardPath(dir, r, world) + ".tmp"));
  }
  for (int r = 0; r < world; ++r) {
    auto l = LoadCheckpoint(dir, r, world, &layout);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_TRUE(l->blobs_from_same_rank);
    EXPECT_EQ(l->state.rank, r);
    EXPECT_EQ(l->state.world, world);
    EXPECT_EQ(l->state.trainer.step, 40);
    EXPECT_EQ(l->state.trainer.data_cursor, 1280);
    EXPECT_EQ(l->state.trainer.rng, MakeTrainer(40, 1280, r).rng);
    EXPECT_EQ(l->state.trainer.extra, MakeTrainer(40, 1280, r).extra);
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const UnitSlice& x = l->state.units[u];
      const ShardRange want = ShardOf(layout.units[u].numel, r, world);
      ASSERT_EQ(x.begin, want.begin);
      ASSERT_EQ(x.end, want.end);
      auto slice = [&](const std::vector<float>& b) {
        return std::vector<float>(b.begin() + want.begin, b.begin() + want.end);
      };
      EXPECT_TRUE(SameBits(x.master, slice(full.master[u]))) << "rank " << r << " unit " << u;
      EXPECT_TRUE(SameBits(x.m, slice(full.m[u])));
      EXPECT_TRUE(SameBits(x.v, slice(full.v[u])));
    }
  }
  auto f = LoadFullCheckpoint(dir, &layout);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (size_t u = 0; u < layout.units.size(); ++u) {
    EXPECT_TRUE(SameBits(f->master[u], full.master[u])) << "unit " << u;
    EXPECT_TRUE(SameBits(f->m[u], full.m[u]));
    EXPECT_TRUE(SameBits(f->v[u], full.v[u]));
  }
  EXPECT_EQ(f->manifest.world_size, world);
  EXPECT_EQ(f->manifest.parallel_mode, "zero1");
}

TEST(CheckpointFormatTest, RoundTripOneRankBitwise) { ExpectRoundTrip(1); }
TEST(CheckpointFormatTest, RoundTripThreeRanksBitwise) { ExpectRoundTrip(3); }

TEST(CheckpointFormatTest, ManifestHoldsShapesLayoutChecksumsAndConfig) {
  const std::string root = FreshDir("manifest");
  RunConfig cfg = SmallConfig();
  cfg.name = "manifest-test";
  cfg.parallel.mode = ParallelMode::kFsdp;
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const std::string dir = SaveAll(root, cfg, layout, MakeState(layout, 4), 2, 12, 96);

  auto text = ReadSmallFile(dir + "/manifest.json");
  ASSERT_TRUE(text.ok());
  const auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["format"], "forge-checkpoint");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["step"], 12);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["parallel_mode"], "fsdp");
  EXPECT_EQ(j["trainer"]["data_cursor"], 96);
  EXPECT_FALSE(j["created"].get<std::string>().empty());
  EXPECT_EQ(j["units"].size(), layout.units.size());
  EXPECT_EQ(j["units"][1]["name"], "block.0");
  EXPECT_EQ(j["units"][1]["tensors"][1]["name"], "blocks.0.attn.wqkv");
  EXPECT_EQ(j["units"][1]["tensors"][1]["shape"], nlohmann::json({48, 16}));
  ASSERT_EQ(j["shards"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& s = j["shards"][r];
    EXPECT_EQ(s["rank"], r);
    EXPECT_EQ(s["file"], ShardFileName(r, 2));
    EXPECT_EQ(s["size"].get<uint64_t>(), fs::file_size(ShardPath(dir, r, 2)));
    EXPECT_EQ(s["crc32c"], Crc32cHex(Crc32c(*ReadSmallFile(ShardPath(dir, r, 2)))));
    const ShardRange want = ShardOf(layout.units[0].numel, r, 2);
    EXPECT_EQ(s["ranges"][0], nlohmann::json({want.begin, want.end}));
  }
  auto parsed = ParseRunConfig(j["config_yaml"].get<std::string>(), "manifest");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->name, "manifest-test");
  EXPECT_EQ(parsed->model.d_model, 16);
}

TEST(CheckpointFormatTest, ShardReportRoundTripsAsText) {
  ShardReport r;
  r.rank = 3;
  r.world = 4;
  r.step = 100;
  r.data_cursor = 3200;
  r.file = ShardFileName(3, 4);
  r.size = 123456789012ull;
  r.crc32c = 0xdeadbeef;
  r.ranges = {{0, 10}, {10, 10}, {5, 7}};
  auto back = DecodeShardReport(EncodeShardReport(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->world, 4);
  EXPECT_EQ(back->step, 100);
  EXPECT_EQ(back->data_cursor, 3200);
  EXPECT_EQ(back->file, r.file);
  EXPECT_EQ(back->size, r.size);
  EXPECT_EQ(back->crc32c, r.crc32c);
  ASSERT_EQ(back->ranges.size(), 3u);
  EXPECT_EQ(back->ranges[2].begin, 5);
  EXPECT_EQ(back->ranges[2].end, 7);
  EXPECT_FALSE(DecodeShardReport("{\"rank\": 1").ok());
}

TEST(CheckpointFormatTest, CommitChecksReports) {
  const std::string root = FreshDir("commit_checks");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 5);
  const std::string dir = StepDir(root, 8);
  std::vector<ShardReport> reps;
  for (int r = 0; r < 2; ++r) {
    auto rep = WriteShard(dir, ShardStateFromFull(layout, r, 2, full.master, full.m, full.v,
                                                  MakeTrainer(8, 64, r)));
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    reps.push_back(*rep);
  }
  // A missing rank, a duplicate, a disagreeing cursor, a wrong size: no manifest.
  auto missing = CommitCheckpoint(dir, cfg, layout, {reps[0]});
  EXPECT_FALSE(missing.ok());
  auto dup = CommitCheckpoint(dir, cfg, layout, {reps[0], reps[0]});
  EXPECT_FALSE(dup.ok());
  auto cursor = reps;
  cursor[1].data_cursor = 65;
  EXPECT_FALSE(CommitCheckpoint(dir, cfg, layout, cursor).ok());
  auto size = reps;
  size[1].size += 1;
  auto bad_size = CommitCheckpoint(dir, cfg, layout, size);
  ASSERT_FALSE(bad_size.ok());
  EXPECT_TRUE(Contains(bad_size.status().message(), ShardFileName(1, 2)))
      << bad_size.status().ToString();
  EXPECT_FALSE(fs::exists(dir + "/manifest.json"));
  EXPECT_TRUE(ListCheckpoints(root).empty());

  // Stale files of an earlier attempt are removed once the checkpoint is committed.
  { std::ofstream(dir + "/rank_0_of_4.shard") << "stale"; }
  { std::ofstream(dir + "/rank_1_of_2.shard.tmp") << "stale"; }
  auto ok = CommitCheckpoint(dir, cfg, layout, reps);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_FALSE(fs::exists(dir + "/rank_0_of_4.shard"));
  EXPECT_FALSE(fs::exists(dir + "/rank_1_of_2.shard.tmp"));
  EXPECT_TRUE(VerifyCheckpoint(dir).ok());

  // A committed checkpoint is never overwritten.
  auto again = WriteShard(dir, ShardStateFromFull(layout, 0, 2, full.master, full.m, full.v,
                                                  MakeTrainer(8, 64, 0)));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
}

TEST(CheckpointFormatTest, LoadRejectsAnotherModel) {
  const std::string root = FreshDir("other_model");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const std::string dir = SaveAll(root, cfg, layout, MakeState(layout, 6), 1, 1, 0);
  RunConfig other = cfg;
  other.model.ffn = 48;
  const ParamLayout other_layout = MakeParamLayout(other.model);
  auto l = LoadCheckpoint(dir, 0, 1, &other_layout);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(l.status().message(), "block.0")) << l.status().ToString();
}

}  // namespace
}  // namespace forge
