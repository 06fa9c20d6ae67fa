// What end-to-end training tests compare: a run's metrics records without the fields that
// differ run to run, and a final checkpoint's weights; plus the `forge` command line they run.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "mpi_launch.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge::test {

// The metrics records without timings and without when a checkpoint's commit was reported.
inline std::vector<std::string> Records(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    for (const char* key : {",\"tokens_per_s\":", ",\"step_seconds\":"}) {
      const size_t a = line.find(key);
      if (a == std::string::npos) continue;
      const size_t b = line.find_first_of(",}", a + 1);
      line.erase(a, b - a);
    }
    const size_t c = line.find(",\"checkpoint_step\":");
    if (c != std::string::npos) line.erase(c, line.size() - 1 - c);
    out.push_back(line);
  }
  return out;
}

// `forge ARGS` in one process, bounded by a timeout.
inline std::string Forge(const std::string& args) {
  return "OPENBLAS_NUM_THREADS=1 timeout 120 " + Bin("forge") + " " + args;
}

// The master weights of a committed checkpoint, every unit concatenated.
inline std::vector<float> CheckpointWeights(const std::string& step_dir) {
  auto ck = LoadFullCheckpoint(step_dir);
  EXPECT_TRUE(ck.ok()) << ck.status().ToString();
  std::vector<float> all;
  if (!ck.ok()) return all;
  for (const auto& u : ck->master) all.insert(all.end(), u.begin(), u.end());
  return all;
}

}  // namespace forge::test
