// A child process for integration tests that must signal what they start (a server to stop,
// a run to SIGTERM): fork/exec with stdout+stderr in a log file, killed if still running when
// the Child goes away. Header-only.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace forge::test {

// A child process with stdout+stderr in a log file; killed (SIGKILL) if still running at the end.
struct Child {
  pid_t pid = -1;
  std::string log;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  bool Running() {
    if (pid <= 0) return false;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      pid = -1;
      exit_status = st;
      return false;
    }
    return true;
  }
  // Sends `sig`, then waits up to `seconds`; the exit code (-1: still running, or killed by a
  // signal).
  int Stop(int seconds, int sig = SIGTERM) {
    if (pid > 0) ::kill(pid, sig);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (Running() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (pid > 0) return -1;
    return WIFEXITED(exit_status) ? WEXITSTATUS(exit_status) : -1;
  }
  int exit_status = 0;
};

// argv[0] is looked up on PATH; `env` entries ("NAME=value") are added to the environment.
inline void Spawn(Child* c, const std::vector<std::string>& argv, const std::string& log,
                  const std::vector<std::string>& env = {}) {
  c->log = log;
  c->pid = ::fork();
  if (c->pid == 0) {
    std::FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    ::dup2(::fileno(stdout), 2);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::_Exit(127);
  }
}

// The last 3000 characters of a log, for failure messages.
inline std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > 3000 ? s.substr(s.size() - 3000) : s;
}

}  // namespace forge::test
