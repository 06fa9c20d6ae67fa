// A run's data plan (which sources, by what weights, from where in each) and the record of
// what each source has given, as checkpoints, the coordinator and `forgectl data` keep it.
//
// The plan. Sources s = 0..n-1 with weights, each with a shuffle stream (permutation.h: the
// source's epoch orders) and a base; an origin global cursor. From the origin on, the
// MixtureSchedule of the weights apportions global positions to sources, so at global cursor c
// source s has given
//     n_s(c) = base_s + CountsBefore(c - origin)[s]
// sequences, and its next sequence is its epoch n_s / S_s, position n_s % S_s. A run that keeps
// its sources has origin 0 and bases 0 for ever. When a run resumes with other sources or
// weights, the plan is rebased at the resume cursor (PlanForResume): the new weights apportion
// from there, each source kept continues from its own cursor and stream, a new source starts at
// 0 with a stream of its own.
//
// The record (DataUsage), taken at a global cursor: the plan plus, per source, sequences and
// tokens consumed, the epoch it is in and its sequences per epoch. Checkpoint manifests hold it
// (as JSON, under "data"), the coordinator stores it with every committed checkpoint, and a
// resumed run derives its plan from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace forge {

struct DataPlanSource {
  std::string dir;      // the dataset; "" = the default dataset, resolved where it is opened
  double weight = 1.0;
  int64_t stream = 0;   // shuffle stream (StreamSeed), fixed for the source's life in the run
  int64_t base = 0;     // sequences it gave before the plan's origin
};

struct DataPlan {
  int64_t origin = 0;   // global cursor from which the weights apportion the stream
  std::vector<DataPlanSource> sources;
};

struct SourceUsage {
  DataPlanSource source;
  int64_t sequences = 0;        // consumed since the run started
  int64_t tokens = 0;           // sequences * seq_len (the tokens trained on as inputs)
  int64_t epoch = 0;            // sequences / epoch_sequences: the epoch its next one is in
  int64_t epoch_sequences = 0;  // sequences in one epoch of its train split
};

struct DataUsage {
  int64_t cursor = 0;  // the global cursor the record was taken at
  int64_t origin = 0;  // the plan's
  std::vector<SourceUsage> sources;
};

bool operator==(const DataPlanSource& a, const DataPlanSource& b);
bool operator==(const DataPlan& a, const DataPlan& b);

// The plan a record was taken under.
DataPlan PlanOf(const DataUsage& usage);

// Compact JSON (one line) and back; `source` names the text in errors.
std::string EncodeDataUsage(const DataUsage& usage);
StatusOr<DataUsage> DecodeDataUsage(const std::string& json_text, const std::string& source);

// The plan of a run configured with `sources` (dirs resolved) that starts at global cursor
// `cursor` after `saved` (null: a fresh start, or a checkpoint from before data records, taken
// as having used `sources` from the start). Same sources and weights as saved (in order): the
// saved plan goes on. Otherwise the plan is rebased at `cursor` (see above) and `notes` says so.
// InvalidArgument when saved was taken at another cursor.
StatusOr<DataPlan> PlanForResume(const std::vector<DataSourceConfig>& sources,
                                 const DataUsage* saved, int64_t cursor,
                                 std::vector<std::string>* notes);

// The sources of a plan as config entries (dir, weight).
std::vector<DataSourceConfig> PlanSources(const DataPlan& plan);

}  // namespace forge
