// Loss-spike detection for the training loop (train.spike_sigma, spike_window,
// spike_max_in_row), and the data windows a rollback leaves out.
//
// Statistics. The loss and gradient norm of the last `window` accepted steps (global values,
// the same on every rank), oldest first. Once the window is full, the next step's limits are
// mean + sigma * max(stddev, 1% of |mean|) for each (the floor keeps a nearly constant window
// from calling ordinary noise a spike); before that, and with sigma 0, there are none. The
// trainer hands the limits to the backend (StepHyper::skip_above), which skips the update of
// a step above either exactly as it skips a non-finite one, then reports the step here:
// accepted steps enter the window, spikes and non-finite steps do not. max_in_row spikes in a
// row ask for a rollback (trainer.cc). Everything is a pure function of the reported values,
// so every rank decides alike; the state travels in each checkpoint (kSpikeGuardBlob), so a
// resumed run decides as the uninterrupted one would have.
//
// DataSkips. The global-cursor ranges [from, to) a rollback left out: a cursor that reaches
// one jumps to its end. Saved with the guard, so a resume past a rollback reads the same data.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/train/backend.h"

namespace forge {

// The checkpoint's trainer-state blob names (TrainerState::extra).
inline constexpr const char* kSpikeGuardBlob = "trainer.spike_guard";

enum class StepVerdict { kAccepted, kSpike, kNonFinite };

class SpikeGuard {
 public:
  SpikeGuard(double sigma, int window, int max_in_row);
  explicit SpikeGuard(const TrainConfig& t)
      : SpikeGuard(t.spike_sigma, t.spike_window, t.spike_max_in_row) {}

  bool enabled() const { return sigma_ > 0.0; }
  // The limits for the next step (infinite while off or warming up).
  SpikeLimits Limits() const;
  // Classifies step `step`, which read from global cursor `cursor` and ran with `limits` (the
  // same comparison the backend made), and updates the window and the run of spikes in a row.
  StepVerdict Observe(float loss, float grad_norm, const SpikeLimits& limits, int64_t step,
                      int64_t cursor);
  int in_row() const { return in_row_; }
  // The first step of the current run of spikes and the cursor it read from (valid while
  // in_row() > 0).
  int64_t row_first_step() const { return row_step_; }
  int64_t row_from_cursor() const { return row_cursor_; }
  bool RollbackDue() const { return enabled() && in_row_ >= max_in_row_; }
  int max_in_row() const { return max_in_row_; }
  int window() const { return window_; }
  double sigma() const { return sigma_; }
  // After a rollback: the statistics come back from the checkpoint (Decode), the run of
  // spikes starts over.
  void ClearRow() { in_row_ = 0; }
  size_t size() const { return loss_.size(); }

  // The window and the spikes in a row, exactly (hex floats).
  std::string Encode() const;
  // Replaces the state with an encoded one. A window longer than this guard's keeps its newest
  // entries (spike_window was lowered); an invalid text is an error and changes nothing.
  Status Decode(std::string_view text);

 private:
  double sigma_;
  int window_, max_in_row_;
  std::deque<float> loss_, norm_;
  int in_row_ = 0;
  int64_t row_step_ = 0, row_cursor_ = 0;
};

// Ranges of global cursors to leave out, sorted and disjoint.
class DataSkips {
 public:
  struct Range {
    int64_t from = 0, to = 0;  // [from, to)
  };
  // Adds [from, to) (merged with any range it touches).
  void Add(int64_t from, int64_t to);
  // The cursor to read at instead of `cursor`: the end of the range holding it, if any.
  int64_t Apply(int64_t cursor) const;
  const std::vector<Range>& ranges() const { return ranges_; }
  std::string Encode() const;
  Status Decode(std::string_view text);

 private:
  std::vector<Range> ranges_;
};

// Both in one blob: the guard's text, then the skips' (Encode/Decode of the pair).
std::string EncodeSpikeState(const SpikeGuard& guard, const DataSkips& skips);
Status DecodeSpikeState(std::string_view blob, SpikeGuard* guard, DataSkips* skips);

}  // namespace forge
