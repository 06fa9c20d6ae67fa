// Stragglers: which rank of a data-parallel run is persistently slower than the others.
//
// In a synchronous run every rank's step takes the same wall time (the fast ones wait for the
// slow one inside the gradient collectives), so the signal is each rank's busy time per step:
// its step time less its own wait in collectives (StepMetrics::comm_wait_seconds). A rank is
// slow in a report when its busy time exceeds `threshold` times the median of the other ranks'
// latest busy times (and by at least 1 ms, so microsecond noise is not a straggler). After
// `reports` slow reports in a row the rank is straggling; after as many reports in a row that
// are not slow it is not any more. Each change comes back as a StragglerChange (the
// coordinator records an event and sets forge_straggler{run_id,rank}).
//
// Pure bookkeeping: no clock, no locking (the coordinator calls it under its lock).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge::coord {

struct StragglerChange {
  int rank = 0;
  bool straggling = false;  // true: became a straggler; false: recovered
  std::string message;      // for the run's event log
};

class StragglerWatch {
 public:
  // One rank's step record: `step` (records of a step it already reported are ignored),
  // mean step wall time and mean wait in collectives per step over the record. threshold <= 0:
  // off (nothing is kept).
  std::vector<StragglerChange> Report(const std::string& run_id, int rank, int64_t step,
                                      double step_seconds, double comm_wait_seconds,
                                      double threshold, int reports);
  // The ranks straggling now, ascending.
  std::vector<int> Straggling(const std::string& run_id) const;
  // One line per straggling rank, for Run.warnings.
  std::vector<std::string> Warnings(const std::string& run_id) const;
  // A placement ended (restart, stop, end): its ranks start over.
  void ForgetRun(const std::string& run_id);

 private:
  struct Rank {
    int64_t step = -1;
    double busy = 0.0;
    int slow_in_row = 0, fine_in_row = 0;
    bool straggling = false;
    std::string warning;  // while straggling
  };
  std::map<std::string, std::map<int, Rank>> runs_;
};

}  // namespace forge::coord
