#include "metrics/rank_sample.h"

#include <algorithm>

#include "common/peak_flops.h"
#include "worker/train/trainer.h"

namespace forge {

RankStepSample RankSampleFromRecord(const StepRecord& r, int world, double flops_per_token,
                                    double peak_tflops) {
  RankStepSample s;
  s.step = r.step;
  s.tokens_per_s = r.tokens_per_s / std::max(1, world);
  s.step_seconds = r.step_seconds;
  if (peak_tflops > 0.0) s.mfu = ModelFlopsUtilization(s.tokens_per_s, flops_per_token, peak_tflops);
  return s;
}

}  // namespace forge
