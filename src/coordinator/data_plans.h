// The data plans the coordinator schedules (forge.v1.DataPlan): built from a run's spec (its
// sources and weights) and the data records its workers report with every checkpoint
// (worker/data/data_plan.h), which the run store keeps with the checkpoint. A placement gets the
// plan of the checkpoint it resumes (Assignment.data_plan); `forgectl data` shows the latest.
#pragma once

#include <string>

#include "common/status.h"
#include "coordinator/run_store.h"
#include "forge/v1/runs.pb.h"

namespace forge::coord {

// The plan at the start of a run: the spec's sources (data.sources, or data.dataset_dir with
// weight 1, "" meaning the worker's default dataset), origin 0, nothing consumed.
StatusOr<v1::DataPlan> StartPlan(const std::string& run_id, const std::string& spec_yaml);

// The plan at committed checkpoint `c`: its data record. A checkpoint saved before data records
// existed has none; it gets the start plan (such runs had one source, which then stands at the
// checkpoint's cursor, read from its manifest).
StatusOr<v1::DataPlan> CheckpointPlan(const std::string& run_id, const std::string& spec_yaml,
                                      const CheckpointRecord& c);

}  // namespace forge::coord
