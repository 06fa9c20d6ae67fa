// The one-line run progress shown by `forgectl watch` and `forge train`:
//   step 120/300 | loss 3.1234 | 12.3k tok/s | MFU 41.2% | ETA 2m03s | RUNNING
#pragma once

#include <string>

#include "forge/v1/runs.pb.h"

namespace forge::cli {

std::string ProgressLine(const v1::Run& run);
// "a RunEvent" as one line: "[RESTARTING] worker x sent no heartbeat for 2.1 s; ..."
std::string EventLine(const v1::RunEvent& e);
const char* StateName(v1::RunState s);

}  // namespace forge::cli
