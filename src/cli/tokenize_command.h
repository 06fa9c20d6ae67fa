// `forge data tokenize`: text to ids and ids to text with any tokenizer (tokenizer/tokenizer.h).
#pragma once

namespace forge {

// argv[1] is "data", argv[2] "tokenize". Returns the process exit code.
int RunDataTokenize(int argc, char** argv);

}  // namespace forge
