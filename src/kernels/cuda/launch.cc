#include "kernels/cuda/launch.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace forge::cuda {
namespace {

std::atomic<int>& PdlFlag() {
  static std::atomic<int> flag = [] {
    const char* env = std::getenv("FORGE_CUDA_PDL");
    return (env != nullptr && std::strcmp(env, "0") == 0) ? 0 : 1;
  }();
  return flag;
}

}  // namespace

bool PdlEnabled() { return PdlFlag().load(std::memory_order_relaxed) != 0; }
void SetPdlEnabled(bool on) { PdlFlag().store(on ? 1 : 0, std::memory_order_relaxed); }

}  // namespace forge::cuda
