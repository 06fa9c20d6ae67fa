// Every metric Forge exports, in one table: name, type, labels and help text. The exporters
// (worker_metrics, gpu_health, run_aggregates) register their families from it, and the tests
// check the Grafana dashboard and the alert rules against it, so a query can only name a
// metric the code serves.
//
// Labels: worker-side series carry run_id and rank (global rank); GPU health adds gpu (the
// NVML index); coordinator aggregates carry run_id only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace forge {

enum class MetricType { kGauge, kCounter, kHistogram };

// Which process exports it.
enum class MetricSource { kWorker, kGpuHealth, kCoordinator };

struct MetricInfo {
  std::string_view name;
  MetricType type;
  MetricSource source;
  std::vector<std::string_view> labels;  // besides Prometheus's own job/instance
  std::string_view help;
};

const std::vector<MetricInfo>& MetricCatalog();
// The entry for `name` (a family name, not a histogram's _bucket/_sum/_count series); null if
// Forge exports no such metric.
const MetricInfo* FindMetric(std::string_view name);
// The family a series name belongs to: "forge_step_seconds_bucket" -> forge_step_seconds when
// that is a histogram; the name itself for every other exported metric; null otherwise.
const MetricInfo* FindSeries(std::string_view series_name);

// Values of the `state` label of forge_run_state (DESIGN.md's run states, lower case).
const std::vector<std::string_view>& RunStateNames();
bool IsRunStateName(std::string_view state);

// Bucket bounds (seconds) of forge_step_seconds: 1 ms .. 100 s, roughly 1-2.5-5 per decade.
const std::vector<double>& StepSecondsBuckets();

}  // namespace forge
