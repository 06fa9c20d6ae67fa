#include "metrics/families.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "metrics/metric_catalog.h"

namespace forge {
namespace {

const MetricInfo& Lookup(std::string_view name, MetricType type) {
  const MetricInfo* m = FindMetric(name);
  if (m == nullptr || m->type != type) {
    std::fprintf(stderr, "forge: metric %.*s is not in the catalog with this type\n",
                 int(name.size()), name.data());
    std::abort();
  }
  return *m;
}

}  // namespace

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r, std::string_view name) {
  const MetricInfo& m = Lookup(name, MetricType::kGauge);
  return prometheus::BuildGauge().Name(std::string(m.name)).Help(std::string(m.help)).Register(r);
}

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& r,
                                                       std::string_view name) {
  const MetricInfo& m = Lookup(name, MetricType::kCounter);
  return prometheus::BuildCounter().Name(std::string(m.name)).Help(std::string(m.help)).Register(r);
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& r,
                                                           std::string_view name) {
  const MetricInfo& m = Lookup(name, MetricType::kHistogram);
  return prometheus::BuildHistogram()
      .Name(std::string(m.name))
      .Help(std::string(m.help))
      .Register(r);
}

}  // namespace forge
