// What the in-process coordinator tests share: a fresh state directory per test, a run as the
// coordinator reports it now, the messages of its events, and a search among them.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"

namespace forge::test {

// <gtest temp dir>/forge_<suite>_<pid>/<name>, emptied.
inline std::string FreshStateDir(const std::string& suite, const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/forge_" + suite + "_" +
                          std::to_string(::getpid()) + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

inline v1::Run GetRun(coord::Coordinator* c, const std::string& id) {
  v1::GetRunRequest g;
  g.set_run_id(id);
  v1::Run r;
  EXPECT_TRUE(c->GetRun(g, &r).ok());
  return r;
}

// The run's event messages, oldest first.
inline std::vector<std::string> RunEvents(coord::Coordinator* c, const std::string& id) {
  v1::GetRunHistoryRequest req;
  req.set_run_id(id);
  v1::RunHistory h;
  EXPECT_TRUE(c->GetRunHistory(req, &h).ok());
  std::vector<std::string> out;
  for (const v1::RunEvent& e : h.events()) out.push_back(e.message());
  return out;
}

inline bool AnyContains(const std::vector<std::string>& v, const std::string& part) {
  for (const std::string& s : v)
    if (s.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace forge::test
