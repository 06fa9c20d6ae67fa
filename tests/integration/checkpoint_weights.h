// Committed checkpoints compared bit for bit: how the recovery tests check a relaunched or
// elastic run against an unfailed `forge train` resumed from the same checkpoint (which
// carries the data cursor) on the same world size.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
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

// Where an elastic run (train.workers `full`, global batch `global_batch` of `micro_batch`
// sequences) shrank to `small` workers and grew back, from its event log (`forgectl watch
// --history`): attempt 2 placed on `small` from step_k keeping the global batch as more
// accumulation steps, then attempt 3 on `full` again from step_m > k. Test failures where the
// log says otherwise; {-1, -1} where an event is missing.
struct ShrinkAndGrow {
  int64_t shrunk_from = -1, grew_from = -1;
};

inline ShrinkAndGrow ExpectShrinkAndGrow(const std::string& log, int full, int small,
                                         int64_t global_batch, int micro_batch) {
  const std::string f = std::to_string(full), s = std::to_string(small);
  ShrinkAndGrow out;
  std::smatch shrink, grow;
  if (!std::regex_search(log, shrink,
                         std::regex("attempt 2 placed on " + s + " worker\\(s\\) .* from "
                                    "step_([0-9]+) \\(world " + f + " -> " + s + "; elastic: " +
                                    f + " requested, " + s + " available"))) {
    ADD_FAILURE() << "no shrink to " << s << " in\n" << log;
    return out;
  }
  EXPECT_TRUE(Contains(log, "global batch " + std::to_string(global_batch) + " kept as " +
                                std::to_string(global_batch / (int64_t{micro_batch} * small)) +
                                " accumulation step(s) of " + std::to_string(micro_batch)))
      << log;
  EXPECT_TRUE(Contains(log, f + " workers available again: world " + s)) << log;
  if (!std::regex_search(log, grow,
                         std::regex("attempt 3 placed on " + f + " worker\\(s\\) .* from "
                                    "step_([0-9]+) \\(world " + s + " -> " + f + "\\)"))) {
    ADD_FAILURE() << "no growth back to " << f << " in\n" << log;
    return out;
  }
  out.shrunk_from = std::atoll(shrink[1].str().c_str());
  out.grew_from = std::atoll(grow[1].str().c_str());
  EXPECT_GT(out.grew_from, out.shrunk_from);
  return out;
}

}  // namespace forge::test
