#include "worker/agent/restart_on_abort.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace forge::agent {
namespace {

std::atomic<pid_t> g_child{0};

void PassOn(int sig) {
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, sig);
}

}  // namespace

int RunRestartingOnAbort(const std::function<int()>& agent) {
  struct sigaction sa {};
  sa.sa_handler = PassOn;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  for (int replaced = 0;; ++replaced) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "forge-worker: fork: %s\n", std::strerror(errno));
      return 1;
    }
    if (pid == 0) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
      std::fflush(nullptr);
      ::_exit(agent());
    }
    g_child.store(pid);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    g_child.store(0);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    const int rc = WEXITSTATUS(status);
    if (rc != kAbortedExitCode) return rc;
    std::fprintf(stderr, "forge-worker: aborted by the coordinator: a fresh worker joins again "
                         "(%d so far)\n", replaced + 1);
  }
}

}  // namespace forge::agent
