// Running a shell command from a test: its exit code, its standard output and, apart or merged,
// its standard error. Header-only.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace forge::test {

struct CommandResult {
  int exit_code = -1;  // 128 + the signal when a signal ended it; -1 when it could not start
  std::string out;     // standard output (and standard error, unless it went to a file)
  std::string err;     // standard error, when it went to a file
  double seconds = 0;
};

enum class Stderr { kMerged, kInherited };

// Runs `cmd` under /bin/sh. With `stderr_file` set, standard error is written there and read
// back into `err`; otherwise it joins standard output (kMerged) or is left to the test's own
// (kInherited: where the test's own goes, unless the command redirects it).
inline CommandResult RunCommand(const std::string& cmd, const std::string& stderr_file = "",
                                Stderr other = Stderr::kMerged) {
  CommandResult r;
  const auto t0 = std::chrono::steady_clock::now();
  std::string line = cmd;
  if (!stderr_file.empty()) {
    line += " 2>" + stderr_file;
  } else if (other == Stderr::kMerged) {
    line += " 2>&1";
  }
  FILE* p = ::popen(line.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!stderr_file.empty()) {
    std::ifstream e(stderr_file);
    r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  }
  return r;
}

}  // namespace forge::test
