// What the CUDA model tests share: Markov-chain token batches a tiny model learns quickly, the
// seed's initial parameters, a CUDA backend made with EXPECT on failure (and a CPU reference
// beside it), and the tensor-by-tensor gradient check against the CPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "gpu_test_util.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"
#include "worker/train/backend.h"
#include "worker/train/cuda_backend.h"

namespace forge::test {

// Token sequences from a fixed sparse Markov chain (each token has four likely successors, plus
// 10% uniform noise): text-like statistics a small model learns within a few dozen steps.
class MarkovTokens {
 public:
  MarkovTokens(int vocab, uint64_t seed) : vocab_(vocab), rng_(seed), succ_(vocab * 4) {
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int& s : succ_) s = tok(rng_);
  }
  struct Batch {
    std::vector<int32_t> inputs, targets;
  };
  Batch Next(int B, int T) {
    Batch b;
    b.inputs.resize(size_t(B) * T);
    b.targets.resize(size_t(B) * T);
    std::uniform_int_distribution<int> tok(0, vocab_ - 1);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int s = 0; s < B; ++s) {
      int cur = tok(rng_);
      for (int t = 0; t < T; ++t) {
        const float r = u(rng_);
        int next;
        if (r < 0.1f) next = tok(rng_);
        else if (r < 0.6f) next = succ_[cur * 4 + 0];
        else if (r < 0.8f) next = succ_[cur * 4 + 1];
        else if (r < 0.9f) next = succ_[cur * 4 + 2];
        else next = succ_[cur * 4 + 3];
        b.inputs[size_t(s) * T + t] = cur;
        b.targets[size_t(s) * T + t] = next;
        cur = next;
      }
    }
    return b;
  }

 private:
  int vocab_;
  std::mt19937_64 rng_;
  std::vector<int> succ_;
};

inline std::vector<MarkovTokens::Batch> MakeBatches(const RunConfig& c, int count, uint64_t seed) {
  MarkovTokens gen(c.model.vocab, seed);
  std::vector<MarkovTokens::Batch> out;
  for (int i = 0; i < count; ++i) out.push_back(gen.Next(c.batch.micro_batch, c.model.seq_len));
  return out;
}

inline std::vector<MicroBatch> Views(const std::vector<MarkovTokens::Batch>& batches, size_t first,
                              size_t count) {
  std::vector<MicroBatch> v;
  for (size_t i = first; i < first + count; ++i) {
    v.push_back({batches[i].inputs.data(), batches[i].targets.data()});
  }
  return v;
}

inline UnitBuffers InitialParams(const RunConfig& c) {
  UnitBuffers p;
  InitParams(c.model, MakeParamLayout(c.model), c.seed, &p);
  return p;
}

inline std::unique_ptr<CudaTrainBackend> MakeGpu(const RunConfig& c, CudaBackendOptions o = {}) {
  auto made = MakeCudaTrainBackend(c, o);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (!made.ok()) return nullptr;
  return std::move(made).value();
}


// A CPU reference and a CUDA backend of config c from the same initial weights.
struct CpuAndGpu {
  std::unique_ptr<TrainBackend> cpu;
  std::unique_ptr<CudaTrainBackend> gpu;  // null (and a failure recorded) if it cannot be made
};
inline CpuAndGpu MakeCpuAndGpu(const RunConfig& c, CudaBackendOptions o = {}) {
  CpuAndGpu b{MakeCpuBackend(c), MakeGpu(c, o)};
  if (b.gpu == nullptr) return b;
  const UnitBuffers params = InitialParams(c);
  const Status a = b.cpu->SetParams(params), g = b.gpu->SetParams(params);
  EXPECT_TRUE(a.ok() && g.ok()) << a.ToString() << " / " << g.ToString();
  return b;
}

// Gradients of the same init and `micro_steps` batches on both backends, tensor by tensor:
// the loss within loss_tol and each tensor's gradient within grad_tol, relative (Frobenius).
// errors, if given, receives each tensor's relative error by name.
inline void ExpectGradientsMatchCpu(const RunConfig& c, int micro_steps, CudaBackendOptions o = {},
                                    double loss_tol = 1e-2, double grad_tol = 5e-2,
                                    std::map<std::string, double>* errors = nullptr) {
  CpuAndGpu b = MakeCpuAndGpu(c, o);
  ASSERT_NE(b.gpu, nullptr);
  const auto batches = MakeBatches(c, micro_steps, 11);
  const auto micro = Views(batches, 0, micro_steps);

  UnitBuffers g_cpu, g_gpu;
  float l_cpu = 0.0f, l_gpu = 0.0f;
  const Status a = b.cpu->ComputeGradients(micro, &g_cpu, &l_cpu);
  const Status g = b.gpu->ComputeGradients(micro, &g_gpu, &l_gpu);
  ASSERT_TRUE(a.ok() && g.ok()) << a.ToString() << " / " << g.ToString();
  EXPECT_TRUE(std::isfinite(l_gpu));
  EXPECT_NEAR(l_gpu, l_cpu, loss_tol * std::fabs(l_cpu)) << "loss";

  const ParamLayout layout = MakeParamLayout(c.model);
  ASSERT_EQ(g_gpu.size(), layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    ASSERT_EQ(int64_t(g_gpu[u].size()), layout.units[u].numel);
    for (const TensorSlot& t : layout.units[u].tensors) {
      const float* got = g_gpu[u].data() + t.offset;
      const float* ref = g_cpu[u].data() + t.offset;
      bool finite = true;
      for (int64_t i = 0; i < t.numel; ++i) finite = finite && std::isfinite(got[i]);
      EXPECT_TRUE(finite) << t.name << ": non-finite gradient";
      const double rel = RelFrobenius(got, ref, t.numel);
      EXPECT_LT(rel, grad_tol) << t.name << ": relative Frobenius error of the gradient";
      std::printf("  %-28s rel err %.3e\n", t.name.c_str(), rel);
      if (errors != nullptr) (*errors)[t.name] = rel;
    }
  }
}

// Each recompute mode (selective, full) reruns the same kernels on the same inputs, so two
// micro-steps' gradients are bitwise those of saved activations and the loss the same. bytes,
// if given, receives each backend's allocated_bytes().
struct RecomputeBytes {
  size_t saved = 0, selective = 0, full = 0;
};
inline void ExpectRecomputeMatchesSaved(const RunConfig& c, uint64_t batch_seed,
                                        RecomputeBytes* bytes = nullptr) {
  auto saved = MakeGpu(c);
  ASSERT_NE(saved, nullptr);
  const auto batches = MakeBatches(c, 2, batch_seed);
  UnitBuffers ga;
  float la = 0.0f;
  ASSERT_STATUS_OK(saved->ComputeGradients(Views(batches, 0, 2), &ga, &la));
  if (bytes != nullptr) bytes->saved = saved->allocated_bytes();
  for (const Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(mode));
    RunConfig r = c;
    r.train.activation_recompute = mode;
    auto recompute = MakeGpu(r);
    ASSERT_NE(recompute, nullptr);
    UnitBuffers gb;
    float lb = 0.0f;
    ASSERT_STATUS_OK(recompute->ComputeGradients(Views(batches, 0, 2), &gb, &lb));
    EXPECT_EQ(la, lb);
    ASSERT_EQ(ga.size(), gb.size());
    for (size_t u = 0; u < ga.size(); ++u) {
      EXPECT_TRUE(BitwiseEqual(ga[u], gb[u]))
          << "gradient of unit " << u << " (max rel err " << RelFrobenius(gb[u], ga[u]) << ")";
    }
    if (bytes != nullptr)
      (mode == Recompute::kFull ? bytes->full : bytes->selective) = recompute->allocated_bytes();
  }
}

// `steps` AdamW steps of the CPU reference and the CUDA backend from the same init on Markov
// batches: the loss within `tol` relative at every step (and the first step's gradient norm
// within 5%), and the GPU's mean loss over the last five steps below its first by `min_drop`.
// Returns the CUDA backend for further checks (null if it could not be made).
inline std::unique_ptr<CudaTrainBackend> ExpectTrainingTracksCpu(const RunConfig& c, int steps,
                                                                 double tol, float min_drop) {
  CpuAndGpu b = MakeCpuAndGpu(c);
  if (b.gpu == nullptr) return nullptr;
  const auto batches = MakeBatches(c, steps, 21);
  float first = 0.0f, last5 = 0.0f;
  for (int step = 1; step <= steps; ++step) {
    const auto micro = Views(batches, step - 1, 1);
    const StepHyper hyper{c.optimizer.lr, step};
    StepStats s_cpu, s_gpu;
    const Status a = b.cpu->TrainStep(micro, hyper, true, &s_cpu);
    const Status g = b.gpu->TrainStep(micro, hyper, true, &s_gpu);
    EXPECT_TRUE(a.ok() && g.ok()) << a.ToString() << " / " << g.ToString();
    if (!a.ok() || !g.ok()) return nullptr;
    EXPECT_TRUE(s_gpu.valid);
    EXPECT_TRUE(std::isfinite(s_gpu.loss)) << "step " << step;
    EXPECT_NEAR(s_gpu.loss, s_cpu.loss, tol * std::fabs(s_cpu.loss)) << "step " << step;
    if (step == 1) {
      EXPECT_NEAR(s_gpu.grad_norm, s_cpu.grad_norm, 5e-2 * s_cpu.grad_norm) << "grad norm";
      first = s_gpu.loss;
    }
    if (step > steps - 5) last5 += s_gpu.loss / 5.0f;
  }
  EXPECT_LT(last5, first - min_drop) << "the GPU backend did not learn";
  return std::move(b.gpu);
}

}  // namespace forge::test
