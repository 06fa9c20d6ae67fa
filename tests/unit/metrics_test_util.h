// Reading Prometheus text exposition in tests: the value of the series with a given name and
// labels, from a registry or a /metrics body.
#pragma once

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>

namespace forge::test {

inline std::string Exposition(const prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

// The value of the first series named `name` whose labels include every `labels` pair.
inline std::optional<double> SeriesValue(const std::string& text, const std::string& name,
                                         const std::map<std::string, std::string>& labels = {}) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end_name = line.find_first_of("{ ");
    if (line.substr(0, end_name) != name) continue;
    std::string label_text;
    size_t value_at = end_name;
    if (line[end_name] == '{') {
      const size_t close = line.find('}', end_name);
      label_text = line.substr(end_name + 1, close - end_name - 1);
      value_at = close + 1;
    }
    bool all = true;
    for (const auto& [k, v] : labels)
      all = all && label_text.find(k + "=\"" + v + "\"") != std::string::npos;
    if (!all) continue;
    return std::stod(line.substr(value_at));
  }
  return std::nullopt;
}

inline bool HasFamilyWithPrefix(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace forge::test
