#include "cli/progress_line.h"

#include <cstdio>

namespace forge::cli {
namespace {

std::string Rate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", tokens_per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", tokens_per_s);
  return buf;
}

std::string Duration(double s) {
  char buf[32];
  const long t = long(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

}  // namespace

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
    line += " | " + Rate(m.tokens_per_second()) + " tok/s";
    if (m.mfu() > 0) {
      std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100.0 * m.mfu());
      line += buf;
    }
    if (m.step_seconds() > 0 && run.total_steps() > run.step())
      line += " | ETA " + Duration(m.step_seconds() * double(run.total_steps() - run.step()));
  }
  line += std::string(" | ") + StateName(run.state());
  return line;
}

std::string EventLine(const v1::RunEvent& e) {
  return std::string("[") + StateName(e.state()) + "] " + e.message();
}

}  // namespace forge::cli
