// Launching the built binaries from integration tests: a shell command's exit code and output,
// the path of a binary in the build tree, and an mpirun prefix bounded by a timeout (so a
// deadlock fails the test instead of hanging CI). Needs FORGE_BINARY_DIR and FORGE_MPIEXEC
// (CMakeLists.txt defines both for forge_integration_tests).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

namespace forge::test {

struct ShellResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
  double seconds = 0;
};

inline ShellResult Shell(const std::string& cmd) {
  ShellResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
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
