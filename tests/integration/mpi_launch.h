// Launching the built binaries from integration tests: a shell command's exit code and output,
// the path of a binary in the build tree, and an mpirun prefix bounded by a timeout (so a
// deadlock fails the test instead of hanging CI). Needs FORGE_BINARY_DIR and FORGE_MPIEXEC
// (CMakeLists.txt defines both for forge_integration_tests).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "../common/run_command.h"

namespace forge::test {

struct ShellResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
  double seconds = 0;
};

inline ShellResult Shell(const std::string& cmd) {
  CommandResult c = RunCommand(cmd);
  return {c.exit_code, std::move(c.out), c.seconds};
}

// A Forge program beside the running test binary: the build puts every program in one bin/
// folder, and a packed copy for the GPU machine (../shared/device/pack) keeps them together too,
// where the build path compiled in does not exist.
inline std::string Bin(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(self.parent_path() / name)) {
    return (self.parent_path() / name).string();
  }
  return std::string(FORGE_BINARY_DIR) + "/bin/" + name;
}

// mpirun for `ranks` processes (oversubscribed: the test models are tiny), killed after limit_s.
inline std::string Mpirun(int ranks, int limit_s = 120) {
  return "timeout -k 5 " + std::to_string(limit_s) + " " + std::string(FORGE_MPIEXEC) +
         " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
         " -x OPENBLAS_NUM_THREADS=1 ";
}

inline bool HaveMpirun() {
  return std::string(FORGE_MPIEXEC).size() > 0 && std::filesystem::exists(FORGE_MPIEXEC);
}

}  // namespace forge::test

#define REQUIRE_MPIRUN()                 \
  if (!::forge::test::HaveMpirun())      \
  GTEST_SKIP() << "no mpirun (MPIEXEC_EXECUTABLE) found at configure time"
