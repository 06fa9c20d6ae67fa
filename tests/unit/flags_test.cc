#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/closest_match.h"
#include "common/flags.h"

namespace forge {
namespace {

// argv from a list of words (the parser keeps pointers only while parsing).
struct Argv {
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (auto& s : words) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> words;
  std::vector<char*> ptrs;
};

FlagParser TrainFlags() {
  FlagParser f("forge train", "CONFIG", "Trains a model.");
  f.Value("--steps", "N", "optimizer steps");
  f.Bool("--direct", "no coordinator");
  f.List("--input", "PATH...", "inputs");
  f.Value("--out", "DIR", "output");
  f.Alias("-o", "--out");
  f.MaxPositional(1);
  return f;
}

TEST(FlagsTest, ParsesValuesBoolsListsAndPositionals) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "c.yaml", "--steps", "10", "--direct", "--input", "a", "b*",
          "--input=c", "-o", "x"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv(), 2).ok());
  EXPECT_EQ(f.positional(), std::vector<std::string>{"c.yaml"});
  int64_t steps = 0;
  ASSERT_TRUE(f.GetInt("--steps", &steps).ok());
  EXPECT_EQ(steps, 10);
  EXPECT_TRUE(f.Has("--direct"));
  EXPECT_EQ(f.GetAll("--input"), (std::vector<std::string>{"a", "b*", "c"}));
  EXPECT_EQ(f.Get("--out"), "x");
}

TEST(FlagsTest, UnknownFlagNamesItAndTheClosestKnownOne) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "c.yaml", "--stpes", "10"});
  const Status s = f.Parse(a.argc(), a.argv(), 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "unknown flag --stpes (did you mean --steps?)");
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--bogus", "1"});
  EXPECT_EQ(g.Parse(b.argc(), b.argv(), 2).message(), "unknown flag --bogus");
}

TEST(FlagsTest, MalformedValuesNameTheFlag) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "--steps", "ten"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv(), 2).ok());
  int64_t steps = 0;
  EXPECT_EQ(f.GetInt("--steps", &steps).message(), "--steps: expects an integer, got 'ten'");
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--steps"});
  EXPECT_EQ(g.Parse(b.argc(), b.argv(), 2).message(), "--steps: expects N");
  FlagParser h = TrainFlags();
  Argv c({"forge", "train", "a.yaml", "b.yaml"});
  EXPECT_FALSE(h.Parse(c.argc(), c.argv(), 2).ok());
}

TEST(FlagsTest, RequiredFlagsPositionalCountAndRangesAreCheckedAlike) {
  const auto plan_flags = [] {
    FlagParser f("forge plan", "CONFIG", "");
    f.Value("--gpus", "N", "GPUs");
    f.Require("--gpus");
    f.Positional(1);
    return f;
  };
  FlagParser f = plan_flags();
  Argv none({"forge", "plan", "--gpus", "4"});
  EXPECT_EQ(f.Parse(none.argc(), none.argv(), 2).message(), "expects CONFIG");
  FlagParser g = plan_flags();
  Argv missing({"forge", "plan", "c.yaml"});
  EXPECT_EQ(g.Parse(missing.argc(), missing.argv(), 2).message(), "--gpus is required");
  FlagParser h = plan_flags();
  Argv help({"forge", "plan", "--help"});  // --help needs neither
  EXPECT_TRUE(h.Parse(help.argc(), help.argv(), 2).ok());
  FlagParser k = plan_flags();
  Argv big({"forge", "plan", "c.yaml", "--gpus", "2000"});
  ASSERT_TRUE(k.Parse(big.argc(), big.argv(), 2).ok());
  int gpus = 1;
  EXPECT_EQ(k.GetInt("--gpus", &gpus, 1, 1024).message(),
            "--gpus: expects an integer in [1, 1024], got 2000");
  EXPECT_EQ(gpus, 1);
  FlagParser absent("forge plan", "", "");
  absent.Value("--gpus", "N", "GPUs");
  Argv empty({"forge", "plan"});
  ASSERT_TRUE(absent.Parse(empty.argc(), empty.argv(), 2).ok());
  EXPECT_TRUE(absent.GetInt("--gpus", &gpus, 1, 1024).ok());  // absent: *out untouched
  EXPECT_EQ(gpus, 1);
}

TEST(FlagsTest, UsageErrorNamesTheProgramAndPointsToHelp) {
  FlagParser f("forge-worker", "", "");
  ::testing::internal::CaptureStderr();
  const int rc = f.UsageError(Status::Invalid("no coordinator address"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "forge-worker: no coordinator address\n(see 'forge-worker --help')\n");
  EXPECT_EQ(rc, 2);
  // A program that reports errors its own way (a benchmark's JSON line) chooses the code.
  Argv a({"forge-bench", "--bogus"});
  int code = 0;
  EXPECT_TRUE(f.ParseOrExit(a.argc(), a.argv(), 1, &code, [](const Status& s) {
    EXPECT_EQ(s.message(), "unknown flag --bogus");
    return 1;
  }));
  EXPECT_EQ(code, 1);
}

TEST(FlagsTest, HelpAndVersionExitZero) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "--help"});
  int rc = -1;
  testing::internal::CaptureStdout();
  EXPECT_TRUE(f.ParseOrExit(a.argc(), a.argv(), 2, &rc));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("usage: forge train CONFIG [flags]"), std::string::npos);
  EXPECT_NE(out.find("-o, --out DIR"), std::string::npos);
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--version"});
  testing::internal::CaptureStdout();
  EXPECT_TRUE(g.ParseOrExit(b.argc(), b.argv(), 2, &rc));
  // A subcommand answers with its program's version.
  EXPECT_EQ(testing::internal::GetCapturedStdout(), VersionString("forge") + "\n");
  EXPECT_EQ(rc, 0);
}

TEST(FlagsTest, ClosestMatch) {
  EXPECT_EQ(ClosestMatch("--chekpoint", {"--checkpoint", "--config"}), "--checkpoint");
  EXPECT_EQ(ClosestMatch("--zzzzzz", {"--checkpoint", "--config"}), "");
}

TEST(FlagsTest, EditDistanceCountsASwapOfNeighboursAsOneEdit) {
  EXPECT_EQ(EditDistance("--stpes", "--steps"), 1u);
  EXPECT_EQ(EditDistance("prot", "port"), 1u);
  EXPECT_EQ(EditDistance("ab", "ba"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("ca", "abc"), 3u);  // no edit of a swapped pair again
}

FlagParser CoordinatorFlags() {
  FlagParser f("forge-coordinator", "", "");
  f.Value("--state-dir", "DIR", "");
  f.Value("--data-root", "DIR", "");
  f.Value("--metrics-port", "N", "");
  f.Value("--metrics-bind", "ADDR", "");
  f.Value("--tls-cert", "FILE", "");
  f.Value("--tls-key", "FILE", "");
  return f;
}

std::string ParseError(FlagParser f, std::vector<std::string> words) {
  Argv a(std::move(words));
  return f.Parse(a.argc(), a.argv(), 1).message();
}

TEST(FlagsTest, AMistypedWordOfALongerFlagNamesThatFlag) {
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--prot", "1"}),
            "unknown flag --prot (did you mean --metrics-port?)");
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--port", "1"}),
            "unknown flag --port (did you mean --metrics-port?)");
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--root", "d"}),
            "unknown flag --root (did you mean --data-root?)");
  // Two flags share the word, or the word is too short to tell: no guess.
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--metrics", "1"}), "unknown flag --metrics");
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--tls", "f"}), "unknown flag --tls");
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--ky", "f"}), "unknown flag --ky");
  // A near miss of the whole name wins over a word.
  EXPECT_EQ(ParseError(CoordinatorFlags(), {"c", "--stat-dir", "d"}),
            "unknown flag --stat-dir (did you mean --state-dir?)");
}

TEST(FlagsTest, ABoolFlagSetToFalseIsNotGiven) {
  FlagParser f = TrainFlags();
  Argv a({"forge", "train", "--direct", "--direct=false"});
  ASSERT_TRUE(f.Parse(a.argc(), a.argv(), 2).ok());
  EXPECT_FALSE(f.Has("--direct"));
  FlagParser g = TrainFlags();
  Argv b({"forge", "train", "--direct=true"});
  ASSERT_TRUE(g.Parse(b.argc(), b.argv(), 2).ok());
  EXPECT_TRUE(g.Has("--direct"));
  FlagParser h = TrainFlags();
  Argv c({"forge", "train", "--direct=yes"});
  EXPECT_EQ(h.Parse(c.argc(), c.argv(), 2).message(),
            "--direct: takes no value (or =true/=false), got 'yes'");
}

TEST(FlagsTest, UnknownCommandNamesTheClosestOne) {
  EXPECT_EQ(UnknownCommand("stauts", {"submit", "status", "stop"}).message(),
            "unknown command 'stauts' (did you mean 'status'?)");
  EXPECT_EQ(UnknownCommand("frobnicate", {"submit", "status"}).message(),
            "unknown command 'frobnicate'");
}

}  // namespace
}  // namespace forge
