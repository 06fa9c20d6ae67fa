// Committed checkpoints compared bit for bit: how the recovery tests check a relaunched or
// elastic run against an unfailed `forge train` resumed from the same checkpoint (which
// carries the data cursor) on the same world size.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "control_plane_harness.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge::test {

// Every unit's master weights of the checkpoint in `dir`, concatenated (empty, with a test
// failure, when it does not load).
inline std::vector<float> CheckpointWeights(const std::string& dir) {
  auto ck = LoadFullCheckpoint(dir);
  EXPECT_TRUE(ck.ok()) << dir << ": " << ck.status().ToString();
  std::vector<float> all;
  if (!ck.ok()) return all;
  for (const auto& u : ck->master) all.insert(all.end(), u.begin(), u.end());
  return all;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The segment of a run from checkpoint step_`from` to step_`to` (both in `ckpts`) against an
// unfailed `mpirun -np world forge train spec` resumed from step_`from` up to step `to`, in
// `ref_dir`: whether step_`to` holds bitwise the same weights.
inline ::testing::AssertionResult SegmentMatchesResume(const std::string& spec,
                                                        const std::string& ckpts, int64_t from,
                                                        int64_t to, int world,
                                                        const std::string& ref_dir) {
  const std::string start = ckpts + "/step_" + std::to_string(from);
  ShellResult r = Shell(Mpirun(world) + Bin("forge") + " train " + spec + " --run-dir " +
                        ref_dir + " --resume " + start + " --steps " + std::to_string(to));
  if (r.exit_code != 0)
    return ::testing::AssertionFailure() << "the reference run failed: " << r.output;
  const std::string end = "/step_" + std::to_string(to);
  if (!SameBits(CheckpointWeights(ckpts + end), CheckpointWeights(ref_dir + "/checkpoints" + end)))
    return ::testing::AssertionFailure()
           << ckpts << end << " differs from a " << world << "-rank run resumed at " << start;
  return ::testing::AssertionSuccess();
}

// The newest step_N under run_dir/checkpoints with a manifest (committed); -1 when none.
inline int64_t LatestCommitted(const std::string& run_dir) {
  int64_t latest = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && std::filesystem::exists(e.path() / "manifest.json"))
      latest = std::max<int64_t>(latest, std::atoll(name.c_str() + 5));
  }
  return latest;
}

}  // namespace forge::test
