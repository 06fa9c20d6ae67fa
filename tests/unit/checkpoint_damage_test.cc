// Damage and resume: every kind of damage is detected on load with a message naming the file;
// `resume: latest` falls back to the newest intact checkpoint and says so; directories without
// a manifest (a save in progress or cut short by a crash) are never picked.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"
#include "common/file_io.h"

namespace forge {
namespace {

using namespace ckpt_test;

struct Saved {
  std::string root;
  std::string dir;  // step_20, world 2
  RunConfig cfg;
  ParamLayout layout;
};

Saved SaveOne(const std::string& name) {
  Saved s;
  s.root = FreshDir(name);
  s.cfg = SmallConfig();
  s.layout = MakeParamLayout(s.cfg.model);
  s.dir = SaveAll(s.root, s.cfg, s.layout, MakeState(s.layout, 20), 2, 20, 160);
  return s;
}

// Verify and a full load both fail with DataLoss whose message names `file` and says `what`.
void ExpectDamage(const Saved& s, const std::string& file, const std::string& what) {
  const Status v = VerifyCheckpoint(s.dir);
  ASSERT_FALSE(v.ok()) << "damage not detected: " << what;
  EXPECT_EQ(v.code(), Code::kDataLoss) << v.ToString();
  EXPECT_TRUE(Contains(v.message(), file)) << "message does not name " << file << ": "
                                            << v.ToString();
  EXPECT_TRUE(Contains(v.message(), what)) << v.ToString();
  auto l = LoadFullCheckpoint(s.dir);
  ASSERT_FALSE(l.ok());
  EXPECT_TRUE(Contains(l.status().message(), file)) << l.status().ToString();
}

TEST(CheckpointDamageTest, IntactCheckpointVerifies) {
  const Saved s = SaveOne("intact");
  EXPECT_TRUE(VerifyCheckpoint(s.dir).ok());
  EXPECT_TRUE(VerifyCheckpoint(s.dir + "/manifest.json").ok());
}

TEST(CheckpointDamageTest, FlippedPayloadByte) {
  const Saved s = SaveOne("flip_payload");
  const std::string f = ShardPath(s.dir, 1, 2);
  FlipByte(f, fs::file_size(f) / 2);
  ExpectDamage(s, f, "checksum mismatch");
}

TEST(CheckpointDamageTest, FlippedHeaderByte) {
  const Saved s = SaveOne("flip_header");
  const std::string f = ShardPath(s.dir, 0, 2);
  FlipByte(f, 13);  // rank field
  ExpectDamage(s, f, "header checksum mismatch");
}

TEST(CheckpointDamageTest, FlippedSectionTag) {
  const Saved s = SaveOne("flip_tag");
  const std::string f = ShardPath(s.dir, 0, 2);
  FlipByte(f, 64);  // first byte of the UNIT section's tag
  ExpectDamage(s, f, "expected section UNIT");
}

TEST(CheckpointDamageTest, TruncatedShard) {
  const Saved s = SaveOne("truncated");
  const std::string f = ShardPath(s.dir, 1, 2);
  fs::resize_file(f, fs::file_size(f) - 100);
  ExpectDamage(s, f, "truncated");
  fs::resize_file(f, 40);
  ExpectDamage(s, f, "truncated");
}

TEST(CheckpointDamageTest, MissingShard) {
  const Saved s = SaveOne("missing");
  const std::string f = ShardPath(s.dir, 1, 2);
  fs::remove(f);
  ExpectDamage(s, f, "missing");
}

TEST(CheckpointDamageTest, ManifestChecksumDoesNotMatchFile) {
  const Saved s = SaveOne("manifest_crc");
  auto j = nlohmann::json::parse(*ReadSmallFile(s.dir + "/manifest.json"));
  j["shards"][1]["crc32c"] = "0x00000000";
  ASSERT_TRUE(WriteFileAtomic(s.dir + "/manifest.json", j.dump()).ok());
  ExpectDamage(s, ShardPath(s.dir, 1, 2), "does not match the manifest");
}

TEST(CheckpointDamageTest, ManifestSizeDoesNotMatchFile) {
  const Saved s = SaveOne("manifest_size");
  auto j = nlohmann::json::parse(*ReadSmallFile(s.dir + "/manifest.json"));
  j["shards"][0]["size"] = j["shards"][0]["size"].get<uint64_t>() + 4;
  ASSERT_TRUE(WriteFileAtomic(s.dir + "/manifest.json", j.dump()).ok());
  ExpectDamage(s, ShardPath(s.dir, 0, 2), "size");
}

// A valid shard file that belongs to another checkpoint (copied over by mistake).
TEST(CheckpointDamageTest, ShardFromAnotherCheckpoint) {
  const Saved s = SaveOne("foreign_shard");
  const std::string other =
      SaveAll(s.root, s.cfg, s.layout, MakeState(s.layout, 21), 2, 30, 240);
  fs::copy_file(ShardPath(other, 1, 2), ShardPath(s.dir, 1, 2),
                fs::copy_options::overwrite_existing);
  ExpectDamage(s, ShardPath(s.dir, 1, 2), "does not match the manifest");
}

TEST(CheckpointDamageTest, ManifestNamesShardRangesThatDoNotTile) {
  const Saved s = SaveOne("manifest_tiling");
  auto j = nlohmann::json::parse(*ReadSmallFile(s.dir + "/manifest.json"));
  j["shards"][1]["ranges"][0][0] = j["shards"][1]["ranges"][0][0].get<int64_t>() + 1;
  ASSERT_TRUE(WriteFileAtomic(s.dir + "/manifest.json", j.dump()).ok());
  ExpectDamage(s, s.dir + "/manifest.json", "do not tile");
}

TEST(CheckpointDamageTest, CorruptManifest) {
  const Saved s = SaveOne("manifest_corrupt");
  ASSERT_TRUE(WriteFileAtomic(s.dir + "/manifest.json", "{\"format\": \"forge-check").ok());
  ExpectDamage(s, s.dir + "/manifest.json", "malformed");
}

// --- resume selection ----------------------------------------------------------------------

struct History {
  std::string root;
  RunConfig cfg;
  ParamLayout layout;
};

// Complete checkpoints at steps 10, 20 and 30 (world 2).
History MakeHistory(const std::string& name) {
  History h;
  h.root = FreshDir(name);
  h.cfg = SmallConfig();
  h.layout = MakeParamLayout(h.cfg.model);
  for (int64_t step : {10, 20, 30}) {
    SaveAll(h.root, h.cfg, h.layout, MakeState(h.layout, static_cast<uint32_t>(step)), 2, step,
            step * 8);
  }
  return h;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  return all;
}

TEST(CheckpointResumeTest, LatestPicksNewest) {
  const History h = MakeHistory("latest_newest");
  auto c = ResolveResume("latest", h.root);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->step, 30);
  EXPECT_EQ(c->dir, StepDir(h.root, 30));
  EXPECT_TRUE(c->warnings.empty()) << Joined(c->warnings);
}

TEST(CheckpointResumeTest, LatestFallsBackPastDamageAndSaysSo) {
  const History h = MakeHistory("latest_fallback");
  const std::string bad30 = ShardPath(StepDir(h.root, 30), 1, 2);
  FlipByte(bad30, fs::file_size(bad30) - 30);
  const std::string bad20 = ShardPath(StepDir(h.root, 20), 0, 2);
  fs::remove(bad20);

  auto c = ResolveResume("latest", h.root);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->step, 10);
  const std::string w = Joined(c->warnings);
  EXPECT_TRUE(Contains(w, bad30)) << w;
  EXPECT_TRUE(Contains(w, bad20)) << w;
  EXPECT_TRUE(Contains(w, "falling back to " + StepDir(h.root, 10))) << w;

  // The fallback really loads.
  auto l = LoadCheckpoint(c->dir, 0, 1, &h.layout);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->state.trainer.step, 10);
  EXPECT_EQ(l->state.trainer.data_cursor, 80);

  // Asking for the damaged one by name is an error naming the file, no fallback.
  auto named = ResolveResume("step_30", h.root);
  ASSERT_FALSE(named.ok());
  EXPECT_TRUE(Contains(named.status().message(), bad30)) << named.status().ToString();
  auto by_path = ResolveResume(StepDir(h.root, 20) + "/manifest.json", h.root);
  ASSERT_FALSE(by_path.ok());
  EXPECT_TRUE(Contains(by_path.status().message(), bad20)) << by_path.status().ToString();
}

TEST(CheckpointResumeTest, AllDamagedIsAnError) {
  const History h = MakeHistory("all_damaged");
  for (int64_t step : {10, 20, 30}) fs::remove(ShardPath(StepDir(h.root, step), 0, 2));
  auto c = ResolveResume("latest", h.root);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kDataLoss);
  EXPECT_TRUE(Contains(c.status().message(), ShardPath(StepDir(h.root, 10), 0, 2)))
      << c.status().ToString();
}

TEST(CheckpointResumeTest, StepAndPathSpecs) {
  const History h = MakeHistory("specs");
  auto by_step = ResolveResume("step_20", h.root);
  ASSERT_TRUE(by_step.ok()) << by_step.status().ToString();
  EXPECT_EQ(by_step->step, 20);
  auto by_dir = ResolveResume(StepDir(h.root, 10), "/nonexistent");
  ASSERT_TRUE(by_dir.ok()) << by_dir.status().ToString();
  EXPECT_EQ(by_dir->step, 10);
  auto none = ResolveResume("", h.root);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->dir.empty());
  auto absent = ResolveResume("step_25", h.root);
  ASSERT_FALSE(absent.ok());
  EXPECT_TRUE(Contains(absent.status().message(), "step_25")) << absent.status().ToString();
}

TEST(CheckpointResumeTest, LatestWithNoCheckpointStartsFresh) {
  const std::string root = FreshDir("empty_root");
  auto c = ResolveResume("latest", root);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->dir.empty());
  auto missing_root = ResolveResume("latest", root + "/does_not_exist");
  ASSERT_TRUE(missing_root.ok());
  EXPECT_TRUE(missing_root->dir.empty());
}

// A crash after every rank renamed its shard but before the manifest: the directory holds
// complete, valid shard files, yet it is not a checkpoint.
TEST(CheckpointResumeTest, CrashBeforeManifestIsNotACheckpoint) {
  const History h = MakeHistory("crash");
  const FullState full = MakeState(h.layout, 40);
  const std::string dir = StepDir(h.root, 40);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WriteShard(dir, ShardStateFromFull(h.layout, r, 2, full.master, full.m, full.v,
                                                   MakeTrainer(40, 320, r)))
                    .ok());
  }
  // ... and a manifest write cut short before its rename.
  { std::ofstream(dir + "/manifest.json.tmp") << "{\"format\": \"forge-checkpoint\""; }
  // A manifest-less directory with a junk name too.
  fs::create_directories(h.root + "/step_50");

  const auto all = ListStepDirs(h.root);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_FALSE(all[3].complete);
  const auto list = ListCheckpoints(h.root);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list.back().step, 30);
  auto c = ResolveResume("latest", h.root);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step, 30);
  EXPECT_TRUE(c->warnings.empty()) << Joined(c->warnings);
  auto named = ResolveResume("step_40", h.root);
  ASSERT_FALSE(named.ok());
  EXPECT_TRUE(Contains(named.status().message(), "no manifest")) << named.status().ToString();
  EXPECT_FALSE(LoadCheckpoint(dir, 0, 2).ok());
}

TEST(CheckpointResumeTest, ListingIgnoresOtherNames) {
  const History h = MakeHistory("names");
  fs::create_directories(h.root + "/step_x1");
  fs::create_directories(h.root + "/tmp");
  { std::ofstream(h.root + "/step_99") << "a file, not a directory"; }
  const auto all = ListStepDirs(h.root);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 10);
  EXPECT_EQ(all[2].step, 30);
}

}  // namespace
}  // namespace forge
