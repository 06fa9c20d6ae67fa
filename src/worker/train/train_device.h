// Which CUDA device a rank trains on, as an ordinal among the devices the process sees
// (CUDA_VISIBLE_DEVICES): one rule, used by the NCCL group (process_run.cc) and by the metrics
// that describe that device (GPU health, the MFU peak), so they can never disagree.
#pragma once

namespace forge {

// world > 1: the local rank's device, modulo what is visible (under srun --gpus-per-task=1 each
// task sees one, its own). world 1: the current device, which nothing sets: 0.
// visible_devices < 1 gives 0 (the caller has no device to choose from anyway).
inline int TrainingDeviceOrdinal(int local_rank, int world, int visible_devices) {
  if (world <= 1 || visible_devices <= 1 || local_rank < 0) return 0;
  return local_rank % visible_devices;
}

}  // namespace forge
