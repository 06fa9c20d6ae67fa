#include "worker/train/spike_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace forge {
namespace {

// mean + sigma * max(stddev, 1% of |mean|) over `v`, in double and in order (the same bits
// on every rank and after a resume).
float Limit(const std::deque<float>& v, double sigma) {
  double sum = 0.0;
  for (float x : v) sum += x;
  const double mean = sum / double(v.size());
  double sq = 0.0;
  for (float x : v) sq += (double(x) - mean) * (double(x) - mean);
  const double sd = std::sqrt(sq / double(v.size()));
  return static_cast<float>(mean + sigma * std::max(sd, 0.01 * std::fabs(mean)));
}

std::string Hex(float x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", double(x));
  return buf;
}

bool ParseFloat(const std::string& s, float* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = static_cast<float>(v);
  return true;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

}  // namespace

SpikeGuard::SpikeGuard(double sigma, int window, int max_in_row)
    : sigma_(sigma), window_(std::max(2, window)), max_in_row_(std::max(1, max_in_row)) {}

SpikeLimits SpikeGuard::Limits() const {
  SpikeLimits l;
  if (!enabled() || int(loss_.size()) < window_) return l;
  l.loss = Limit(loss_, sigma_);
  l.grad_norm = Limit(norm_, sigma_);
  return l;
}

StepVerdict SpikeGuard::Observe(float loss, float grad_norm, const SpikeLimits& limits,
                                int64_t step, int64_t cursor) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return StepVerdict::kNonFinite;
  if (limits.Exceeded(loss, grad_norm)) {
    if (++in_row_ == 1) {
      row_step_ = step;
      row_cursor_ = cursor;
    }
    return StepVerdict::kSpike;
  }
  in_row_ = 0;
  if (!enabled()) return StepVerdict::kAccepted;
  loss_.push_back(loss);
  norm_.push_back(grad_norm);
  while (int(loss_.size()) > window_) {
    loss_.pop_front();
    norm_.pop_front();
  }
  return StepVerdict::kAccepted;
}

// "spike_guard v1 in_row N STEP CURSOR count K" then K lines "LOSS NORM" (hex floats), oldest
// first.
std::string SpikeGuard::Encode() const {
  std::string out = "spike_guard v1 in_row " + std::to_string(in_row_) + " " +
                    std::to_string(row_step_) + " " + std::to_string(row_cursor_) + " count " +
                    std::to_string(loss_.size()) + "\n";
  for (size_t i = 0; i < loss_.size(); ++i) out += Hex(loss_[i]) + " " + Hex(norm_[i]) + "\n";
  return out;
}

Status SpikeGuard::Decode(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string magic, version, k_row, row, row_step, row_cursor, k_count, count;
  if (!(in >> magic >> version >> k_row >> row >> row_step >> row_cursor >> k_count >> count) ||
      magic != "spike_guard" || version != "v1" || k_row != "in_row" || k_count != "count")
    return Status::Invalid("spike guard state: not a 'spike_guard v1' record");
  int64_t in_row = 0, n = 0, first_step = 0, from_cursor = 0;
  if (!ParseInt(row, &in_row) || in_row < 0 || !ParseInt(row_step, &first_step) ||
      !ParseInt(row_cursor, &from_cursor) || !ParseInt(count, &n) || n < 0 || n > 10000000)
    return Status::Invalid("spike guard state: bad in_row, first step, cursor or count");
  std::deque<float> losses, norms;
  for (int64_t i = 0; i < n; ++i) {
    std::string a, b;
    float l = 0, g = 0;
    if (!(in >> a >> b) || !ParseFloat(a, &l) || !ParseFloat(b, &g))
      return Status::Invalid("spike guard state: entry " + std::to_string(i) + " of " +
                             std::to_string(n) + " is missing or not a number");
    losses.push_back(l);
    norms.push_back(g);
  }
  while (int(losses.size()) > window_) {
    losses.pop_front();
    norms.pop_front();
  }
  loss_ = std::move(losses);
  norm_ = std::move(norms);
  in_row_ = int(in_row);
  row_step_ = first_step;
  row_cursor_ = from_cursor;
  return Status::Ok();
}

void DataSkips::Add(int64_t from, int64_t to) {
  if (to <= from) return;
  std::vector<Range> out;
  Range add{from, to};
  for (const Range& r : ranges_) {
    if (r.to < add.from || r.from > add.to) {
      out.push_back(r);
    } else {
      add.from = std::min(add.from, r.from);
      add.to = std::max(add.to, r.to);
    }
  }
  out.push_back(add);
  std::sort(out.begin(), out.end(), [](const Range& a, const Range& b) { return a.from < b.from; });
  ranges_ = std::move(out);
}

int64_t DataSkips::Apply(int64_t cursor) const {
  for (const Range& r : ranges_)
    if (cursor >= r.from && cursor < r.to) return r.to;  // disjoint, not touching: one jump
  return cursor;
}

// "data_skips v1 count K" then K lines "FROM TO".
std::string DataSkips::Encode() const {
  std::string out = "data_skips v1 count " + std::to_string(ranges_.size()) + "\n";
  for (const Range& r : ranges_) out += std::to_string(r.from) + " " + std::to_string(r.to) + "\n";
  return out;
}

Status DataSkips::Decode(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string magic, version, k_count, count;
  int64_t n = 0;
  if (!(in >> magic >> version >> k_count >> count) || magic != "data_skips" || version != "v1" ||
      k_count != "count" || !ParseInt(count, &n) || n < 0 || n > 10000000)
    return Status::Invalid("data skips: not a 'data_skips v1' record");
  DataSkips d;
  for (int64_t i = 0; i < n; ++i) {
    std::string a, b;
    int64_t from = 0, to = 0;
    if (!(in >> a >> b) || !ParseInt(a, &from) || !ParseInt(b, &to) || from < 0 || to <= from)
      return Status::Invalid("data skips: range " + std::to_string(i) + " of " +
                             std::to_string(n) + " is missing or empty");
    d.Add(from, to);
  }
  *this = std::move(d);
  return Status::Ok();
}

std::string EncodeSpikeState(const SpikeGuard& guard, const DataSkips& skips) {
  return guard.Encode() + skips.Encode();
}

Status DecodeSpikeState(std::string_view blob, SpikeGuard* guard, DataSkips* skips) {
  const size_t at = blob.find("data_skips v1");
  if (at == std::string_view::npos) return Status::Invalid("spike state: no data_skips record");
  SpikeGuard g = *guard;
  DataSkips d;
  FORGE_RETURN_IF_ERROR(g.Decode(blob.substr(0, at)));
  FORGE_RETURN_IF_ERROR(d.Decode(blob.substr(at)));
  *guard = std::move(g);
  *skips = std::move(d);
  return Status::Ok();
}

}  // namespace forge
