// Pieces every benchmark program shares: strict integer flags, the step benchmarks'
// --precision and --recompute, and the JSON error line (a benchmark prints JSON, so a failure
// is one JSON object too, for scripts reading stdout).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/flags.h"

namespace forge::bench {

// Whole-string base-10 integer that fits T; false otherwise.
template <typename T>
bool ParseInt(const char* s, T* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE) return false;
  if (v < static_cast<long long>(std::numeric_limits<T>::min()) ||
      v > static_cast<long long>(std::numeric_limits<T>::max()))
    return false;
  *out = static_cast<T>(v);
  return true;
}

// Prints {"error": msg} on stdout (and "program: msg" on stderr when program is given);
// returns the exit code 1.
inline int FailJson(const char* program, const std::string& msg) {
  if (program) std::fprintf(stderr, "%s: %s\n", program, msg.c_str());
  std::printf("%s\n", nlohmann::ordered_json{{"error", msg}}.dump().c_str());
  return 1;
}

// Parses argv with `flags`; true when the program should exit now with *rc: after --help or
// --version (usage or version on stdout, rc 0) or a bad flag (the JSON error line, rc 1).
inline bool ParseFlagsOrExit(FlagParser& flags, const char* program, int argc, char** argv,
                             int* rc) {
  return flags.ParseOrExit(argc, argv, 1, rc,
                           [&](const Status& s) { return FailJson(program, s.message()); });
}

// "--flag: bad value 'v'", the error of a flag whose value a benchmark refuses.
inline std::string BadValue(const FlagParser& flags, const char* flag) {
  return std::string(flag) + ": bad value '" + flags.Get(flag) + "'";
}

// The value of an integer flag into *out when given; false when it is malformed or out of T.
template <typename T>
bool FlagInt(const FlagParser& flags, const char* name, T* out) {
  return !flags.Has(name) || ParseInt(flags.Get(name).c_str(), out);
}

// --precision bf16|fp8 into *out ("" when absent: the config's); false for another value.
inline bool FlagPrecision(const FlagParser& flags, std::string* out) {
  *out = flags.Get("--precision");
  return out->empty() || *out == "bf16" || *out == "fp8";
}

// --recompute none|selective|full into *out ("" when absent: the config's); false for another.
inline bool FlagRecompute(const FlagParser& flags, std::string* out) {
  *out = flags.Get("--recompute");
  return out->empty() || *out == "none" || *out == "selective" || *out == "full";
}

// The values FlagPrecision and FlagRecompute read, over the config's where given.
inline void ApplyPrecisionAndRecompute(const std::string& precision, const std::string& recompute,
                                       RunConfig* cfg) {
  if (!precision.empty())
    cfg->precision.compute = precision == "fp8" ? Precision::kFp8 : Precision::kBf16;
  if (!recompute.empty()) {
    cfg->train.activation_recompute = recompute == "full"        ? Recompute::kFull
                                      : recompute == "selective" ? Recompute::kSelective
                                                                 : Recompute::kNone;
  }
}

}  // namespace forge::bench
