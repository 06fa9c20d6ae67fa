// forge-worker --restart-on-abort: the worker agent runs in a child process, and a child that
// the coordinator aborted (exit code 3: its run lost another worker, and this one may sit in
// a collective that cannot be unwound) is replaced by a fresh one at once, which joins the
// pool again. Under a Kubernetes StatefulSet this keeps the kubelet's restart backoff
// (CrashLoopBackOff: 10 s doubling to 5 min) for real crashes; every other exit status ends
// the parent with it. SIGTERM, SIGINT and SIGHUP are passed on to the child.
#pragma once

#include <functional>

namespace forge::agent {

inline constexpr int kAbortedExitCode = 3;

// Runs `agent` in a child process until it ends otherwise than aborted; returns that exit
// code (128 + the signal for a child killed by one).
int RunRestartingOnAbort(const std::function<int()>& agent);

}  // namespace forge::agent
