#include "cli/progress_line.h"

#include <cstdio>

#include "common/human_format.h"

namespace forge::cli {

const char* StateName(v1::RunState s) {
  const std::string& n = v1::RunState_Name(s);
  return n.empty() ? "UNKNOWN" : n.c_str();
}

std::string ProgressLine(const v1::Run& run) {
  char buf[256];
  const v1::StepMetrics& m = run.last_metrics();
  std::string line;
  std::snprintf(buf, sizeof buf, "step %ld/%ld", long(run.step()), long(run.total_steps()));
  line = buf;
  if (run.has_last_metrics() && m.step() > 0) {
    std::snprintf(buf, sizeof buf, " | loss %.4f", m.loss());
    line += buf;
    if (m.val_loss() >= 0) {
      std::snprintf(buf, sizeof buf, " | val %.4f", m.val_loss());
      line += buf;
    }
    line += " | " + FormatRate(m.tokens_per_second()) + " tok/s";
    if (m.mfu() > 0) {
      std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100.0 * m.mfu());
      line += buf;
    }
    if (m.step_seconds() > 0 && run.total_steps() > run.step())
      line += " | ETA " + FormatDuration(m.step_seconds() * double(run.total_steps() - run.step()));
  }
  line += std::string(" | ") + StateName(run.state());
  return line;
}

std::string EventLine(const v1::RunEvent& e) {
  return std::string("[") + StateName(e.state()) + "] " + e.message();
}

}  // namespace forge::cli
