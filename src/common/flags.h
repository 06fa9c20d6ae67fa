// Command-line flags for every Forge program: one declaration per flag gives parsing, checking
// and the --help text. `--help` prints the usage on standard output (exit 0), `--version`
// the version of the program ("forgectl 0.4.0 (commit 1234abcd)"; a subcommand answers with its
// program's); an unknown flag is an error that names it and the closest known one
// ("unknown flag --stpes (did you mean --steps?)", "unknown flag --prot (did you mean
// --metrics-port?)"); a missing or malformed value names the flag. Programs of subcommands name
// an unknown command alike (UnknownCommand). Every usage error, the parser's and one a program
// finds in a value afterwards (UsageError), reads "PROGRAM: MESSAGE" and "(see 'PROGRAM --help')"
// on standard error and exits 2.
//
//   FlagParser flags("forge train", "CONFIG", "Trains the model CONFIG describes.");
//   flags.Value("--steps", "N", "stop after N optimizer steps");
//   flags.Bool("--direct", "train in this process, without a coordinator");
//   flags.List("--input", "PATH...", "files, directories or globs (repeatable)");
//   flags.Require("--out");
//   if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
//   int64_t steps = 0;
//   if (Status s = flags.GetInt("--steps", &steps, 1, 1 << 30); !s.ok())
//     return flags.UsageError(s);
//
// Values: "--flag value" or "--flag=value". A List flag takes every following argument up to
// the next one that starts with "-", and may repeat. "--" ends the flags; the rest is positional.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace forge {

// "forge 0.4.0 (commit 1234abcd)".
std::string VersionString(std::string_view program);

// "unknown command 'stauts' (did you mean 'status'?)": for a program of subcommands.
Status UnknownCommand(std::string_view command, const std::vector<std::string_view>& known);

// Prints "PROGRAM: MESSAGE" and "(see 'PROGRAM --help')" on standard error; returns 2, the exit
// code of every usage error.
int UsageError(std::string_view program, const Status& s);

class FlagParser {
 public:
  // `positional` describes the positional arguments for the usage line ("CONFIG"); a program
  // whose usage names none ("") takes none, unless MaxPositional says otherwise.
  FlagParser(std::string program, std::string positional, std::string description);

  void Value(std::string name, std::string value_name, std::string help);
  void Bool(std::string name, std::string help);
  void List(std::string name, std::string value_name, std::string help);
  // Aliases a short name ("-o") to a declared flag.
  void Alias(std::string alias, std::string name);
  // At most `max` positional arguments (default: any number where the usage names some).
  void MaxPositional(int max) { max_positional_ = max; }
  // Exactly `n`: fewer is the error "expects POSITIONAL".
  void Positional(int n) { min_positional_ = max_positional_ = n; }
  // `name` must be given ("--state-dir is required"), unless --help or --version is.
  void Require(std::string name) { required_.push_back(std::move(name)); }

  // Parses argv[first..argc). --help/--version set help_requested()/version_requested().
  Status Parse(int argc, char** argv, int first);
  // Parse, and handle what every program handles alike: --help (usage on stdout, rc 0),
  // --version (rc 0), an error (UsageError, or `on_error`'s exit code where a program reports
  // errors its own way: a benchmark's JSON line). Returns true when the caller should exit
  // with *rc.
  bool ParseOrExit(int argc, char** argv, int first, int* rc,
                   const std::function<int(const Status&)>& on_error = nullptr);
  // A usage error of this program found after parsing (a value out of range): UsageError.
  int UsageError(const Status& s) const;

  std::string Usage() const;
  bool help_requested() const { return help_; }
  bool version_requested() const { return version_; }

  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(std::string_view name) const;
  // The last value given, or `def`.
  std::string Get(std::string_view name, std::string def = "") const;
  // Every value of a List (or repeated Value) flag, in order.
  std::vector<std::string> GetAll(std::string_view name) const;
  // Typed getters: leave *out untouched when the flag is absent; a malformed value is
  // InvalidArgument naming the flag.
  Status GetInt(std::string_view name, int64_t* out) const;
  Status GetInt(std::string_view name, int* out) const;
  Status GetDouble(std::string_view name, double* out) const;
  // GetInt, and a value outside [lo, hi] is InvalidArgument naming the flag and the range.
  Status GetInt(std::string_view name, int* out, int lo, int hi) const;

 private:
  enum class Kind { kValue, kBool, kList };
  struct Spec {
    std::string name, value_name, help;
    Kind kind;
  };
  const Spec* Find(std::string_view name) const;
  // The known flag a mistyped one most likely meant, or "".
  std::string Suggest(std::string_view name) const;
  void Add(std::string name, std::string value_name, std::string help, Kind kind);

  std::string program_, positional_desc_, description_;
  std::vector<Spec> specs_;
  std::vector<std::pair<std::string, std::string>> aliases_;
  std::vector<std::pair<std::string, std::string>> values_;  // (flag, value) in order
  std::vector<std::string> positional_;
  std::vector<std::string> required_;
  int min_positional_ = 0, max_positional_ = -1;
  bool help_ = false, version_ = false;
};

}  // namespace forge
