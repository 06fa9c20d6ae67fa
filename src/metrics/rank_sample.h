// What one rank's step record says about throughput: the numbers a worker exports per rank and
// the coordinator aggregates per run (run_aggregates.h), computed in one place so both agree.
#pragma once

#include <cstdint>

namespace forge {

struct StepRecord;  // worker/train/trainer.h

struct RankStepSample {
  int64_t step = 0;
  double tokens_per_s = 0.0;  // this rank's share: the record's global tokens/s over world
  double mfu = -1.0;          // < 0: unknown (no peak for the device)
  double step_seconds = 0.0;  // mean wall time of the steps the record covers
};

// flops_per_token: TrainFlopsPerToken(cfg.model); peak_tflops <= 0 leaves mfu unknown.
// Every rank of a data-parallel run sees the same (global) record, so each rank's share is
// 1/world of it, and the ranks' shares sum to the run's throughput.
RankStepSample RankSampleFromRecord(const StepRecord& r, int world, double flops_per_token,
                                    double peak_tflops);

}  // namespace forge
