// What the config tests share: parse a YAML text that must be valid, or check that it fails
// with the file:line: key-path prefix every config error carries. The text is parsed as
// "t.yaml".
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/config.h"

namespace forge::test {

inline RunConfig ParseOk(const std::string& yaml) {
  StatusOr<RunConfig> r = ParseRunConfig(yaml, "t.yaml");
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n--- yaml:\n" << yaml;
  return r.ok() ? r.value() : RunConfig{};
}

// Expects InvalidArgument with a message that starts "t.yaml:<line>: <path>: " (or "t.yaml: "
// when line is 0, and without the path when it is empty) and contains `what`.
inline ::testing::AssertionResult FailsWith(const std::string& yaml, int line,
                                            const std::string& path, const std::string& what) {
  StatusOr<RunConfig> r = ParseRunConfig(yaml, "t.yaml");
  if (r.ok()) return ::testing::AssertionFailure() << "parsed fine:\n" << yaml;
  const std::string& msg = r.status().message();
  std::string prefix = "t.yaml";
  if (line > 0) prefix += ":" + std::to_string(line);
  prefix += ": ";
  if (!path.empty()) prefix += path + ": ";
  if (r.status().code() != Code::kInvalidArgument) {
    return ::testing::AssertionFailure() << "wrong code: " << r.status().ToString();
  }
  if (msg.rfind(prefix, 0) != 0) {
    return ::testing::AssertionFailure() << "message '" << msg << "' does not start with '"
                                         << prefix << "'";
  }
  if (msg.find(what) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << msg << "' lacks '" << what << "'";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace forge::test
