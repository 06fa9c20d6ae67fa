// `forge data ...`: the dataset commands of the local CLI (prepare, baseline).
#pragma once

namespace forge {

// argv[1] is "data"; argv[2] the subcommand. Returns the process exit code.
int RunDataCommand(int argc, char** argv);

}  // namespace forge
