// Registering a catalog metric's family in a prometheus-cpp registry (name and help from
// metric_catalog.h, so no exporter spells a name of its own).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string_view>

namespace forge {

// Aborts (a programming error) when `name` is not in the catalog or has another type.
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r, std::string_view name);
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& r,
                                                       std::string_view name);
prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& r,
                                                           std::string_view name);

}  // namespace forge
