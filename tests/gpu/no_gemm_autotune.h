// Two backends in one test must pick the same GEMM algorithms to agree bitwise; with
// autotuning (kernels/cuda/gemm.cuh) the choice depends on timings, so tests that compare
// backends bit for bit hold one of these while they create them: FORGE_GEMM_AUTOTUNE=0,
// restored (or unset) on destruction.
#pragma once

#include <cstdlib>
#include <string>

namespace forge::test {

class NoGemmAutotune {
 public:
  NoGemmAutotune() {
    if (const char* v = std::getenv("FORGE_GEMM_AUTOTUNE")) old_ = v, had_ = true;
    setenv("FORGE_GEMM_AUTOTUNE", "0", 1);
  }
  ~NoGemmAutotune() {
    if (had_) setenv("FORGE_GEMM_AUTOTUNE", old_.c_str(), 1);
    else unsetenv("FORGE_GEMM_AUTOTUNE");
  }
  NoGemmAutotune(const NoGemmAutotune&) = delete;
  NoGemmAutotune& operator=(const NoGemmAutotune&) = delete;

 private:
  std::string old_;
  bool had_ = false;
};

}  // namespace forge::test
