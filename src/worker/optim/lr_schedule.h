// Learning-rate schedule: linear warmup to the peak, then cosine or linear decay to
// min_lr_ratio * peak at total_steps (constant keeps the peak). Steps are 1-based.
#pragma once

#include <cstdint>

#include "common/config.h"

namespace forge {

float LearningRate(const OptimizerConfig& opt, const ScheduleConfig& s, int64_t step);

}  // namespace forge
