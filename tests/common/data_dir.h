// Where the tests find set-up's data (npm packages, tokenizer files, the prepared corpus):
// $FORGE_DATA_DIR, else the checkout's .forge-data, as setup.sh puts it.
#pragma once

#include <cstdlib>
#include <string>

namespace forge::test {

inline std::string DataDir() {
  const char* env = std::getenv("FORGE_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : std::string(FORGE_SOURCE_DIR) + "/.forge-data";
}

}  // namespace forge::test
