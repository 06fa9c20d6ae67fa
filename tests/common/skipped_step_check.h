// The overflow rule every backend keeps (backend.h StepStats::skipped_steps): a step whose loss
// and gradients are not finite leaves weights and moments exactly as they were and is counted;
// training goes on once the weights are sane again. Shared by the CPU unit test and the GPU
// tests (BF16 and FP8).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/config.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"
#include "worker/train/backend.h"

namespace forge::test {

inline bool SameBitsAll(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `batches`: three micro-batches of cfg's shape (one per step).
inline void ExpectNonFiniteStepSkipped(TrainBackend* backend, const RunConfig& cfg,
                                       const std::vector<MicroBatch>& batches) {
  ASSERT_EQ(batches.size(), 3u);
  UnitBuffers params;
  InitParams(cfg.model, MakeParamLayout(cfg.model), cfg.seed, &params);
  UnitBuffers poisoned = params;
  poisoned[0][0] = std::numeric_limits<float>::quiet_NaN();  // wte row 0: every logit row
  ASSERT_TRUE(backend->SetParams(poisoned).ok());
  StepStats s;
  const Status st = backend->TrainStep({batches[0]}, {cfg.optimizer.lr, 1}, true, &s);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(std::isfinite(s.loss));
  EXPECT_EQ(s.skipped_steps, 1);
  UnitBuffers after, m, v;
  ASSERT_TRUE(backend->GetParams(&after).ok());
  ASSERT_TRUE(backend->GetMoments(&m, &v).ok());
  for (size_t u = 0; u < after.size(); ++u) {
    EXPECT_TRUE(SameBitsAll(after[u], poisoned[u])) << "weights of unit " << u << " changed";
    for (float x : m[u]) ASSERT_EQ(x, 0.0f) << "first moment of unit " << u << " changed";
    for (float x : v[u]) ASSERT_EQ(x, 0.0f) << "second moment of unit " << u << " changed";
  }
  ASSERT_TRUE(backend->SetParams(params).ok());
  for (int step = 2; step <= 3; ++step) {
    ASSERT_TRUE(
        backend->TrainStep({batches[step - 1]}, {cfg.optimizer.lr, step}, true, &s).ok());
    EXPECT_TRUE(std::isfinite(s.loss)) << "step " << step;
  }
  EXPECT_EQ(s.skipped_steps, 1);
  ASSERT_TRUE(backend->GetParams(&after).ok());
  EXPECT_FALSE(SameBitsAll(after[1], params[1])) << "healthy steps did not update";
}

}  // namespace forge::test
