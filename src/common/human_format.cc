#include "common/human_format.h"

#include <cstdint>
#include <cstdio>
#include <ctime>

namespace forge {

std::string FormatRate(double per_second) {
  char buf[32];
  if (per_second >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", per_second / 1e6);
  else if (per_second >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", per_second / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", per_second);
  return buf;
}

std::string FormatDuration(double seconds) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(seconds + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(t / 3600), long(t / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", long(t / 60), long(t % 60));
  return buf;
}

std::string FormatUtcTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const std::time_t t = std::time_t(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

}  // namespace forge
