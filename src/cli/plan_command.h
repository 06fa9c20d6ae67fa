// `forge plan CONFIG --gpus N`: what a config's training step would reach on N GPUs in each
// data-parallel mode (plan/plan_model.h), and which mode to run; a table, or JSON.
#pragma once

namespace forge {

// argv[1] is "plan"; returns the process exit code.
int RunPlanCommand(int argc, char** argv);

}  // namespace forge
